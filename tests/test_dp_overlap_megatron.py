"""What the iteration tail prices about DP overlap (plan/tail_costs.py) against Megatron-Core 0.19 itself.

A two-stage pipeline with two replicas per stage (4 CPU processes) of a model with a tied embedding table, built
and wrapped as the dry run does it (runtime/model.py, runtime/train.py ddp_settings: the production settings,
distributed optimizer with both overlaps), then one optimizer step and a zeroing of the gradients, as an iteration
ends and the next begins:
  - no parameter all-gather has been started by then: Megatron-Core 0.19 starts it in the next forward's
    pre-hook (so a later stage's gather waits until its input has arrived, and the tail adds it to the fill);
  - then each stage runs a forward and a backward of its own (a second iteration: the first only learns which
    gradients a bucket waits for), and the buckets' all-gathers and reductions are recorded as Megatron issues
    them: their sizes, in that order, are the buckets `ddp_buckets` prices, reductions in its order and gathers
    in the reverse one. The bucket reduced last (exposed after the stage's backward) and gathered first (exposed
    in the next forward) is the first stage's tied table, a bucket of its own: before the exact layout was priced
    the first stage's buckets were taken as equal (the table's bucket priced as the whole stage, 2.9x the table);
    the last stage reduces its copy of the table first, behind its own backward;
  - Megatron-LM's own bucket-size rule is the one it prices.
"""
import pytest

from hetauto_megatron.plan.plan import Mesh, Plan
from hetauto_megatron.runtime.launcher import launch
from hetauto_megatron.spec.model import ModelSpec

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

MODEL = ModelSpec(name="pin", num_layers=2, hidden_size=128, num_attention_heads=4, num_query_groups=2,
                  ffn_hidden_size=512, vocab_size=1000, seq_length=16, tie_embeddings=True)
PLAN = Plan(MODEL, 4, (Mesh("c", "cpu", 1, 2, 1, "none", (1, 1)),))


def _run(rank, world_size):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from hetauto_megatron.runtime.groups import build_groups, set_megatron_globals
    from hetauto_megatron.runtime.model import build_model, transformer_config
    from hetauto_megatron.runtime.rendezvous import init_distributed
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
    import torch

    pp_rank = ctx.pg.pp.rank()
    seq = MODEL.seq_length
    tokens = torch.randint(0, MODEL.vocab_size, (1, seq))
    positions = torch.arange(seq).unsqueeze(0)
    causal = torch.tril(torch.ones(1, 1, seq, seq)) < 0.5

    def forward_backward():
        """One micro-batch through this stage alone: the input a previous stage would send, the gradient a later
        one would return (the buckets wait for this stage's own gradients only)."""
        if pp_rank == 0:
            out = ddp(tokens, positions, causal)
            out.backward(torch.ones_like(out))
        else:
            model.set_input_tensor(torch.randn(seq, 1, MODEL.hidden_size, requires_grad=True))
            ddp(tokens, positions, causal, labels=tokens).sum().backward()
        ddp.finish_grad_sync()

    ddp.zero_grad_buffer()
    forward_backward()
    opt.step()
    opt.zero_grad()
    ddp.zero_grad_buffer()
    dispatched = any(g.param_gather_dispatched for g in ddp.bucket_groups)
    issued = {"reduce": [], "gather": []}
    for g in ddp.bucket_groups:       # each bucket's collectives, recorded as Megatron issues them
        size = sum(b.grad_data.numel() for b in g.buckets)
        for kind, name in (("reduce", "start_grad_sync"), ("gather", "start_param_sync")):
            def issue(*a, _call=getattr(g, name), _kind=kind, _size=size, **k):
                issued[_kind].append(_size)
                return _call(*a, **k)
            setattr(g, name, issue)
    forward_backward()
    return {"pp_rank": pp_rank, "bucket_size": ddp.bucket_size,
            "overlap_param_gather": ddp.ddp_config.overlap_param_gather, "dispatched": dispatched,
            "reduce_order": issued["reduce"], "gather_order": issued["gather"],
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
    model = MODEL.replace(vocab_size=PLAN.padded_vocab_size)     # what runs: 1000 -> 1024
    table = model.vocab_size * model.hidden_size
    assert set(r["pp_rank"] for r in ranks) == {0, 1} and all(r["overlap_param_gather"] for r in ranks)
    for r in ranks:
        pp = r["pp_rank"]
        assert pp == 0 or r["bucket_size"] is None             # bucketing off after the first pipeline rank
        priced = [e for e, _ in tail_costs.ddp_buckets(model, prof, 1, pp == 0, pp == 1)]
        assert r["reduce_order"] == priced, r
        assert r["gather_order"] == priced[::-1], r
        # the first stage reduces its tied table last and gathers it first; the last stage reduces its copy first
        assert r["reduce_order"][-1 if pp == 0 else 0] == table, r


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
    from hetauto_megatron.plan.engines import ENGINES, check_engine

    assert not ENGINES["megatron-core-0.8"].runs_here
    with pytest.raises(InputError, match="megatron, deepspeed"):
        check_engine("megatron-core-0.8", field="engine")
