"""What the iteration tail prices about DP overlap (plan/tail_costs.py) against Megatron-Core 0.19 itself.

A two-stage pipeline with two replicas per stage (4 CPU processes), built and wrapped as the dry run does it
(runtime/model.py, runtime/train.py ddp_settings: the production settings, distributed optimizer with both
overlaps), then one optimizer step and a zeroing of the gradients, as an iteration ends and the next begins:
  - the buckets each pipeline rank's DDP cut the stage into are the ones `ddp_buckets` counts (the later stage:
    one, whatever its size), and Megatron-LM's own bucket-size rule is the one it prices;
  - no parameter all-gather has been started by then: Megatron-Core 0.19 starts it in the next forward's
    pre-hook (so a later stage's gather waits until its input has arrived, and the tail adds it to the fill).
"""
import pytest

from hetauto_megatron.plan.plan import Mesh, Plan
from hetauto_megatron.runtime.launcher import launch
from hetauto_megatron.spec.model import ModelSpec

MODEL = ModelSpec(name="pin", num_layers=2, hidden_size=128, num_attention_heads=4, num_query_groups=2,
                  ffn_hidden_size=512, vocab_size=1000, seq_length=16)
PLAN = Plan(MODEL, 4, (Mesh("c", "cpu", 1, 2, 1, "none", (1, 1)),))


def _run(rank, world_size):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from hetauto_megatron.runtime.groups import build_groups, init_distributed, set_megatron_globals
    from hetauto_megatron.runtime.model import build_model, transformer_config
    from hetauto_megatron.runtime.train import ddp_settings

    init_distributed(PLAN, rank, world_size, timeout_s=60, dry_run=True)
    ctx = build_groups(PLAN, rank, world_size, timeout_s=60, dry_run=True)
    set_megatron_globals(ctx)
    config = transformer_config(PLAN, ctx, MODEL)
    model = build_model(ctx, MODEL, config, seed=1)
    settings = PLAN.meshes[0].settings
    ddp = DistributedDataParallel(config=config, module=model, pg_collection=ctx.pg,
                                  ddp_config=DistributedDataParallelConfig(**ddp_settings(settings)))
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, params_dtype=config.params_dtype,
                                                 use_distributed_optimizer=settings.distributed_optimizer),
                                 [ddp], pg_collection=ctx.pg, use_gloo_process_groups=False)
    for buf in ddp.buffers:
        buf.grad_data.fill_(1e-3)
    opt.step()
    opt.zero_grad()
    ddp.zero_grad_buffer()
    return {"pp_rank": ctx.pg.pp.rank(), "buckets": sum(len(g.buckets) for g in ddp.bucket_groups),
            "bucket_size": ddp.bucket_size, "overlap_param_gather": ddp.ddp_config.overlap_param_gather,
            "dispatched": any(g.param_gather_dispatched for g in ddp.bucket_groups),
            "params": sum(p.numel() for p in model.parameters())}


@pytest.fixture(scope="module")
def ranks():
    return launch(_run, 4, timeout_s=240)


def test_buckets_per_pipeline_rank_are_what_the_tail_prices(ranks):
    from hetauto_megatron.cost.analytic import AnalyticCostModel
    from hetauto_megatron.plan import tail_costs
    from hetauto_megatron.plan.costing import stage_profile
    from hetauto_megatron.spec.inventory import inventory_from_dict

    inv = inventory_from_dict({"clusters": [{"name": "c", "device": "cpu", "nodes": 1, "devices_per_node": 4}]})
    mesh = PLAN.meshes[0]
    prof = stage_profile(MODEL, inv.cluster("c"), mesh.tp, mesh.dp, mesh.micro_batch_size, mesh.recompute,
                         AnalyticCostModel(), mesh.settings)
    by_rank = {r["pp_rank"]: r for r in ranks}
    assert set(by_rank) == {0, 1} and all(r["overlap_param_gather"] for r in ranks)
    assert by_rank[1]["bucket_size"] is None                   # bucketing off after the first pipeline rank
    for pp, r in by_rank.items():
        assert r["buckets"] == tail_costs.ddp_buckets(MODEL, prof, 1, pp == 0, pp == 1, pp), r


def test_megatron_bucket_size_rule_is_the_priced_one(monkeypatch):
    import megatron.training.training as training
    from megatron.core.distributed import DistributedDataParallelConfig

    from hetauto_megatron.plan import tail_costs

    # resolve_ddp_bucket_size reads only the DP group's size (get_pg_size, which is 1 outside a distributed job)
    monkeypatch.setattr(training, "get_pg_size", lambda group: group)
    for dp in (1, 8, 40, 41, 256):
        got = training.resolve_ddp_bucket_size(DistributedDataParallelConfig(overlap_grad_reduce=True), dp, True,
                                               10 ** 9)
        assert got == max(tail_costs.DDP_BUCKET_PARAMS, tail_costs.DDP_BUCKET_PARAMS_PER_DP_RANK * dp), dp


def test_no_parameter_gather_starts_before_the_next_forward(ranks):
    """Megatron-Core 0.6-0.8 started the first bucket's gather in zero_grad (the engine row the published runs are
    priced with); 0.19 does not: every rank's gather is still to start when the step and the zeroing are done."""
    assert not any(r["dispatched"] for r in ranks)


def test_the_published_runs_engine_is_priced_only():
    """The published runs' Megatron-Core row prices those runs; a plan may not ask for it (nothing here runs it)."""
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.plan.settings import ENGINES, check_engine

    assert not ENGINES["megatron-core-0.8"].runs_here
    with pytest.raises(InputError, match="megatron, deepspeed"):
        check_engine("megatron-core-0.8", field="engine")
