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
  - Megatron-LM's own bucket-size rule is the one it prices;
  - a later stage starts its reduction once its last send_backward has returned (recorded in a dry run's ranks):
    a blocking boundary's link is no part of the drain the tail hides it behind.
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

        def check(*a, _call=g.check_grads, **k):    # the norm each bucket's gradients are checked by
            issued["checked"] = issued.get("checked", 0) + 1
            return _call(*a, **k)
        g.check_grads = check
    forward_backward()
    scaled = sorted({b.gradient_scaling_factor for g in ddp.bucket_groups for b in g.buckets})
    return {"pp_rank": pp_rank, "bucket_size": ddp.bucket_size, "checked": issued.get("checked", 0),
            "bucket_groups": len(ddp.bucket_groups), "scaling_factors": scaled,
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


def test_the_passes_over_the_gradients_before_their_reduction_are_priced(ranks):
    """Before a bucket's reduction Megatron-Core's DDP, as the dry run builds it (the launches' settings:
    check_for_nan_in_grad from --check-for-nan-in-loss-and-grad), takes each bucket's norm once (a read of its
    gradients) and scales it by 1/DP in place (a read and a write; DP 2 here): recorded in its ranks, against the
    passes the tail prices at the device's memory rate (tail_costs.grad_buffer_passes); fp16's dynamic loss scaler
    turns the check off in Megatron-LM's validate_args, and so does the pricing."""
    import inspect

    from megatron.training import arguments

    from hetauto_megatron.cost.analytic import AnalyticCostModel
    from hetauto_megatron.plan import tail_costs
    from hetauto_megatron.plan.costing import stage_profile
    from hetauto_megatron.spec.inventory import inventory_from_dict

    inv = inventory_from_dict({"clusters": [{"name": "c", "device": "cpu", "nodes": 1, "devices_per_node": 4}]})
    mesh = PLAN.meshes[0]
    prof = stage_profile(MODEL, inv.cluster("c"), mesh.tp, mesh.dp, mesh.micro_batch_size, mesh.recompute,
                         AnalyticCostModel(), mesh.settings)
    for r in ranks:
        assert r["checked"] == r["bucket_groups"], r          # each bucket checked once in the iteration
        assert r["scaling_factors"] == [1 / mesh.dp], r        # and scaled in place by 1/DP
        assert tail_costs.grad_buffer_passes(prof) == 1 + 2
    # Megatron-LM's own rule, as its validate_args applies it to a launch without --loss-scale
    for precision in ("fp32", "bf16", "fp16"):
        args = arguments.parse_args(ignore_unknown_args=True)
        args.fp16, args.bf16, args.loss_scale = precision == "fp16", precision == "bf16", None
        source = inspect.getsource(arguments.validate_args)
        assert "if not args.loss_scale:\n            args.check_for_nan_in_loss_and_grad = False" in source
        assert args.check_for_nan_in_loss_and_grad and tail_costs.checks_gradients(precision) == (precision != "fp16")


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


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap_grad_reduce", "no_overlap_grad_reduce"])
def test_a_later_stage_reduces_once_its_last_gradient_send_returned(tmp_path, monkeypatch, overlap):
    """With overlap_grad_reduce Megatron-Core 0.19 calls `config.grad_sync_func` (which the runtime sets as
    Megatron-LM does) on a pipeline rank after the first only after the cool-down, once its last send_backward has
    returned (schedules.py forward_backward_pipelining_without_interleaving); without it, `finalize_model_grads`
    reduces the whole stage synchronously (DDP.finish_grad_sync) at the same point, right as the rank's own schedule
    ends, not when the pipeline's does. Recorded in the dry run's rank processes, two clusters of DP 2 joined by a
    blocking boundary over an emulated 40 ms link: on each second-stage rank the last backward, then the call that
    sends its gradient, held at least the link's 40 ms, then the reduction's start, nothing between. So the tail
    hides that reduction behind the first stage's last backward (drain), but not behind the link
    (plan/tail_costs.py tail_windows, the next tests)."""
    import json
    import os
    import time

    from helpers import mesh
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.pipeline_parallel import schedules

    from hetauto_megatron.plan.plan import plan_from_dict
    from hetauto_megatron.runtime import communicator
    from hetauto_megatron.runtime.dryrun import run_dryrun
    from hetauto_megatron.spec.model import PRESETS

    def log(*entry):
        with open(tmp_path / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps([*entry, time.perf_counter()]) + "\n")

    def recorded(original, before, after=None):
        def call(*a, **k):
            if before:
                log(*before(*a, **k))
            out = original(*a, **k)
            if after:
                log(after)
            return out
        return call

    communicate = communicator.HeteroP2PCommunicator._communicate
    monkeypatch.setattr(communicator.HeteroP2PCommunicator, "_communicate", recorded(
        communicate, lambda self, **k: ("call", self.ctx.coords.stage, k["tensor_send_prev"] is not None), "return"))
    monkeypatch.setattr(schedules, "backward_step", recorded(schedules.backward_step, None, "backward"))
    sync = "start_grad_sync" if overlap else "finish_grad_sync"   # (grad_sync_func, or finalize_model_grads's call)
    monkeypatch.setattr(DistributedDataParallel, sync, recorded(
        getattr(DistributedDataParallel, sync), lambda *a, **k: ("grad_sync",)))
    inv = {"clusters": [{"name": n, "device": "cpu", "nodes": 1, "devices_per_node": 2} for n in "ab"],
           "links": [{"between": ["a", "b"], "bandwidth_gbps": 100, "latency_ms": 40}]}
    plan = plan_from_dict({"version": 2, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 4,
                           "inventory": inv, "meshes": [
                               {**mesh("a", 1, 2, 1, [4]), "boundary": {"schedule": "blocking"}}, mesh("b", 1, 2, 1, [4])]
                           if overlap else [{**mesh(c, 1, 2, 1, [4]), **extra, "settings": {
                               "overlap_grad_reduce": False, "overlap_param_gather": False}}
                               for c, extra in (("a", {"boundary": {"schedule": "blocking"}}), ("b", {}))]})
    assert all(m.settings.overlap_grad_reduce == overlap for m in plan.meshes)
    r = run_dryrun(plan, steps=2, seed=7, tiny=True, reference=False, timeout_s=60, emulate_links=1.0)
    assert "error" not in r, r.get("error")
    logs = [[json.loads(line) for line in f.read_text().splitlines()] for f in tmp_path.glob("*.jsonl")]
    later = [log for log in logs if any(e[:2] == ["call", 1] for e in log)]
    assert len(later) == 2, logs                        # the second stage's two DP ranks
    for log in later:
        syncs = [i for i, e in enumerate(log) if e[0] == "grad_sync"]
        assert len(syncs) == 2, log                     # one per step
        for i in syncs:
            backward, call, returned = log[i - 3], log[i - 2], log[i - 1]
            assert [backward[0], call[:3], returned[0]] == ["backward", ["call", 1, True], "return"], log
            assert returned[-1] - backward[-1] >= 0.040, log


def test_the_tail_hides_a_later_stages_reduction_only_after_its_last_send():
    """The order above, by hand: stages of 1 + 2 s and 4 + 8 s (forward + backward), a 3 s link. The second stage's
    last backward ends at t; a blocking send holds it until t + 3, when its gradient reaches the first stage,
    whose last backward ends at t + 5, the pipeline's end. Its 10 s reduction, started at t + 3, sticks out 8 s
    (the tail priced 5 before, as if it started at t). Overlapped, the send returns at t: 5 s. And against the
    simulated timeline of three stages (plan/pipeline.py events): each later stage's reduction, started when its
    last send ends, hides behind what the tail's drain counts."""
    from hetauto_megatron.plan.pipeline import simulate_1f1b
    from hetauto_megatron.plan.tail_costs import tail_windows

    reduce = 10.0
    for blocking, exposed in (([True], 8.0), ([False], 5.0)):
        drain = list(tail_windows([1.0, 4.0], [2.0, 8.0], [3.0], blocking))[1][2]
        assert max(0.0, reduce - drain) == exposed, blocking
    f, b, x = [1.0, 1.5, 4.0], [2.0, 3.0, 8.0], [3.0, 2.5]
    for blocking in ([True, True], [False, True], [True, False]):
        sim = simulate_1f1b(f, b, x, 8, blocking=blocking, record=True)
        windows = list(tail_windows(f, b, x, blocking))
        for i in (1, 2):
            last_send = max(e.end for e in sim.events if e.resource == ("stage", i))   # its last B, or its send
            assert windows[i][2] == pytest.approx(sim.makespan - last_send), (blocking, i)


def test_without_overlap_a_later_stage_reduces_behind_the_drain_unless_the_tied_table_is_summed_first():
    """Without overlap_grad_reduce each rank reduces its whole stage once its own schedule has returned (recorded
    above in Megatron-Core's ranks), so a second stage's reduction runs while the first stage still runs its last
    backward: priced, its exposure is the whole reduction less that backward (the boundary blocks: its link holds
    the second stage's send, no part of the drain). DeepSpeed 0.19.8's TrainSchedule, read here from the library,
    ends every stage's last step with ReduceTiedGrads before ReduceGrads: with a tied table the last stage first
    sums it with the first stage, after that stage's last backward, so its reduction is exposed in full; untied,
    it hides behind that backward too. Two H800 clusters, one stage each, the whole gradient all-reduced in fp32
    in either engine (no distributed optimizer): the same collective, started at another time."""
    from deepspeed.runtime.pipe.schedule import TrainSchedule

    from hetauto_megatron.plan.simulate import simulate
    from hetauto_megatron.spec.inventory import inventory_from_dict
    from hetauto_megatron.spec.model import PRESETS

    for stage in (0, 1):
        last = [type(c).__name__ for c in list(TrainSchedule(micro_batches=4, stages=2, stage_id=stage).steps())[-1]]
        assert last.index("ReduceTiedGrads") < last.index("ReduceGrads"), last
    inv = inventory_from_dict({"clusters": [{"name": n, "device": "h800", "nodes": 2, "devices_per_node": 8,
                                             "inter_node": {"bandwidth_gbps": 100, "latency_us": 10}} for n in "ab"],
                               "links": [{"between": ["a", "b"], "bandwidth_gbps": 25, "latency_ms": 2}]})
    off = {"overlap_grad_reduce": False, "overlap_param_gather": False, "distributed_optimizer": False}
    rows = {}
    for tied in (True, False):
        model = PRESETS["llama2-7b"].replace(num_layers=16, tie_embeddings=tied)
        plan = Plan(model, 64, tuple(Mesh(c, "h800", 8, 2, 1, "selective", (8,), dict(off)) for c in "ab"))
        for engine in ("megatron", "deepspeed"):
            rows[tied, engine] = simulate(plan, inv, engine=engine).stages
    # the first stage's reduction is exposed whole in either engine (nothing runs after it); the second stage
    # holds as many parameters (8 layers and a table: embedding, or output layer)
    whole = {e: rows[True, e][0]["dp_reduce_s"] for e in ("megatron", "deepspeed")}
    assert rows[True, "deepspeed"][1]["dp_reduce_s"] == pytest.approx(whole["deepspeed"], abs=2e-6)  # after stage 0
    first_backward = {e: rows[True, e][0]["backward_s"] for e in ("megatron", "deepspeed")}
    for tied in (True, False):
        assert rows[tied, "megatron"][1]["dp_reduce_s"] == pytest.approx(whole["megatron"] - first_backward["megatron"],
                                                                         abs=2e-6)
    assert rows[False, "deepspeed"][1]["dp_reduce_s"] == pytest.approx(whole["deepspeed"] - first_backward["deepspeed"],
                                                                       abs=2e-6)
