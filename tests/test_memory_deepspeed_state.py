"""The memory model's weights, gradients and optimizer state against what DeepSpeed's pipeline engine holds, on CPU.

Plans of 2 stages x DP 2 (the tiny preset, 6 layers, 256-token vocabulary, a plain MLP of 255 units: odd parameter
counts, so the BF16 and ZeRO optimizers pad their flat buffers) are emitted (`hetauto emit deepspeed`)
at the settings that run in production: bf16 (an accelerator's mesh; DeepSpeed runs bf16 on CPU, not fp16) and fp32,
ZeRO-0 (distributed_optimizer false) and ZeRO-1 (true; gradients reduced in fp32, and in bf16 with
grad_reduce_dtype param), and one of 4 stages x DP 1 (ZeRO-1 reducing in bf16, where the optimizer's step holds more
than the micro-batches when the reduce bucket is left out). One launch of 4 gloo processes runs every config in turn
with DeepSpeed 0.19.8's engine (runtime/deepspeed_pipeline.py), two training steps each (Adam's state exists from the
first). Through the second step every rank reads, before every pipeline instruction, before every line of the step
of the optimizer DeepSpeed built (with that function's local tensors: memory_meter.at_every_line_of; the ZeRO
optimizer's flat gradient partition and its fp32 copy live there for one line) and when the wrapped torch
optimizer's step returns, every tensor the engine's module and optimizer reach (runtime/memory_meter.py
`deepspeed_state_storages`: the attributes of whatever optimizer DeepSpeed built, by unique storage). Storages
reached through the ZeRO optimizer's `ipg_buckets` are its reduce bucket.

Predicted, with the mesh's settings as DeepSpeed runs them (`as_run_by(..., "deepspeed")`): `stage_memory_bytes`'
weights + gradients + optimizer (the set held beside the activations) against the most held at an instruction
boundary outside the optimizer's step, its `state_at_step` (the step's set, a candidate for the peak once the
activations are gone) and that set against the most held at once; the larger of its per-parameter sets (through the
micro-batches, at the optimizer's step) times the stage's parameters against the most held outside the bucket; its
fixed bytes against the most in the bucket. Target: every stage within 10 %, each of the three; the BF16 and ZeRO
optimizers' totals to the byte but for 4-byte scalars (SCALAR_BYTES), the flat buffers' padding priced, and at
ZeRO's step (at DP 2) but for the part outside the rank's partition of a tensor straddling its boundary, which the
model prices as an upper bound (state_fixed_bytes_at_step). Before this check the model priced DeepSpeed's state
with Megatron's formula: +29 % at bf16 ZeRO-0, -14 % at bf16 and fp32 ZeRO-1, no reduce bucket; before the step
was read line by line, ZeRO's step at 2 + 16/d (the fp32 partition alone) where it holds 2 + 20/d: 18 % under in
bf16 at DP 1 and 2; before the step's set was priced apart from the micro-batches', the BF16 optimizer's fp32
gradient partition (4/d, bf16 accumulation: the ZeRO-0 case), which it makes in its step and frees there, was
priced as held beside the activations.

The gradient reduction after the last backward (the ReduceGrads instruction) allocates while it runs: from the start
of the second step's ReduceGrads, at every collective it issues (torch.distributed's, which DeepSpeed's comm layer
calls), every rank reads the storages the engine reaches plus every tensor Python holds that was not held when the
instruction began (memory_meter.held_storages: the flattened gradients, their fp32 copy, a second reduce bucket; no
activation remains then); the most held against `state_bytes_at_reduction`, the memory model's third candidate for
the stage's peak (target 10 %). Without it the model priced the state held through the micro-batches there: 20
bytes per parameter were held at fp32 ZeRO-0 against 16 priced, 16 against 12 at bf16 ZeRO-0, and ZeRO-1 held
two reduce buckets against one.
"""
import inspect
import json

import pytest
from helpers import mesh, record_calls

from hetauto_megatron.cost.deepspeed_state import deepspeed_optimizer
from hetauto_megatron.cost.deepspeed_state import largest_param_tensor, stage_param_tensors
from hetauto_megatron.cost.memory import stage_memory_bytes
from hetauto_megatron.cost.model_state import (state_bytes_at_reduction, state_bytes_at_step_per_param,
                                               state_bytes_per_param, state_fixed_bytes, state_fixed_bytes_at_step,
                                               state_padding_bytes)
from hetauto_megatron.emit.deepspeed import emit_deepspeed
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.plan.engines import as_run_by

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

TOLERANCE = 0.10
MBS, MICRO = 2, 4
# A plain MLP of 255 hidden units (with its biases, as Megatron builds a plain MLP): an odd parameter count per
# layer, so the BF16 and ZeRO optimizers pad every stage's flat buffer (to a multiple of 2 x DP: 3 elements at DP 2,
# 1 on the 4-stage run's one-layer stages)
MODEL = {"preset": "tiny", "num_layers": 6, "vocab_size": 256, "gated_mlp": False, "ffn_hidden_size": 255}
# What the BF16 and ZeRO optimizers hold beyond the state priced: 4-byte scalars (Adam's step count of the one
# flat partition it steps, the gradient norm, and inside their step a local copy of that norm); their totals are
# checked to the byte within it
SCALAR_BYTES = 12
# (precision, distributed_optimizer, grad_reduce_dtype, DP): the optimizer DeepSpeed builds differs in each; the ZeRO
# optimizer's step (its flat gradient partition and that partition's fp32 copy beside the partition's .grads) holds
# more than its micro-batches without the reduce bucket at DP 2, and at DP 1 (4 stages) 22 bytes against 16
CASES = [("bf16", False, "fp32", 2), ("bf16", True, "fp32", 2), ("bf16", True, "param", 2), ("fp32", False, "fp32", 2),
         ("fp32", True, "fp32", 2), ("bf16", True, "param", 1)]
WORLD = 4
# what DeepSpeed's reduction calls (deepspeed/comm/torch.py calls torch.distributed's functions at call time)
COLLECTIVES = ("all_reduce", "reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "all_gather")
BUILT = {"Adam": "torch", "BF16_Optimizer": "bf16", "DeepSpeedZeroOptimizer": "zero"}
IN_STEP = ("inside the optimizer's step", "the optimizer's step")     # _measure's reads inside the step


def _plan(precision, distributed_optimizer, grad_reduce_dtype, dp):
    settings = {"distributed_optimizer": distributed_optimizer, "grad_reduce_dtype": grad_reduce_dtype}
    stages = WORLD // dp
    layers = [MODEL["num_layers"] // stages + (i < MODEL["num_layers"] % stages) for i in range(stages)]
    return plan_from_dict({"version": 2, "model": MODEL, "global_batch_size": MBS * MICRO * dp, "precision": precision,
                           "meshes": [dict(mesh(f"c{i}", 1, dp, MBS, [n], device="a100"), settings=settings)
                                      for i, n in enumerate(layers)]})


def _measure(engine, model):
    """Two training steps; the most the engine's module and optimizer held at once during the second, and the
    most of it in the reduce bucket and outside it (which peak at different times: the bucket is gone when the
    optimizer steps)."""
    from hetauto_megatron.runtime import deepspeed_pipeline as dsp
    import torch

    from hetauto_megatron.runtime.memory_meter import (at_every_line_of, deepspeed_state_storages, frame_storages,
                                                       held_storages)

    best = {"total": 0, "bucket": 0, "rest": 0, "step": 0, "micro": 0}

    def read(where, local=None):
        if best["step"] < 2:
            return
        held = {**(local or {}), **deepspeed_state_storages(engine)}
        bucket = sum(n for n, path in held.values() if ".ipg_buckets" in path)
        total = sum(n for n, _ in held.values())
        if total > best["total"]:
            best.update(total=total, at=where)
        if where not in IN_STEP:        # the set the micro-batches' activations are held beside
            best["micro"] = max(best["micro"], total)
        if total - bucket > best["rest"]:
            best.update(rest=total - bucket, rest_at=where)
        best["bucket"] = max(best["bucket"], bucket)

    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    inner_step = inner.step

    def step(*args, **kwargs):
        out = inner_step(*args, **kwargs)
        read("the optimizer's step")
        return out

    inner.step = step

    # The gradient reduction after the last backward (ReduceGrads): at each collective it issues, the state the
    # engine reaches and every tensor allocated since the instruction began (the flattened gradients, a second
    # reduce bucket: whatever Python holds, held_storages; the activations are gone by then, the pipe buffers and
    # data were there before).
    reduction = {"before": None, "total": 0, "reads": 0}

    def read_reduction():
        if reduction["before"] is None:
            return
        state = {ptr: n for ptr, (n, _) in deepspeed_state_storages(engine).items()}
        new = {ptr: n for ptr, n in held_storages(set()).items() if ptr not in reduction["before"]}
        reduction["total"] = max(reduction["total"], sum({**new, **state}.values()))
        reduction["reads"] += 1

    gathers_in_step = [0]       # all-gathers the optimizer step instruction issues (of the updated weights)
    now = [None]

    def wrap(fn, name):
        def run(self, *args, **kwargs):
            read(name)
            now[0] = name
            if name == "ReduceGrads" and best["step"] == 2:
                reduction["before"] = set(held_storages(set()))
                read_reduction()
                try:
                    return fn(self, *args, **kwargs)
                finally:
                    reduction["before"] = None
            try:
                if name == "OptimizerStep":
                    # and before every line of the step of the optimizer DeepSpeed built, with its local tensors:
                    # ZeRO's flat gradient partition and its fp32 copy live there for one line
                    with at_every_line_of(inspect.unwrap(type(engine.optimizer).step),
                                          lambda frame: read("inside the optimizer's step", frame_storages(frame))):
                        return fn(self, *args, **kwargs)
                return fn(self, *args, **kwargs)
            finally:
                now[0] = None
        return run

    def collective(name, args, kwargs):
        read_reduction()
        if name.startswith("all_gather") and now[0] == "OptimizerStep" and best["step"] == 2:
            gathers_in_step[0] += 1

    engine._INSTRUCTION_MAP = {k: wrap(v, k.__name__) for k, v in type(engine)._INSTRUCTION_MAP.items()}
    collectives = {name: getattr(torch.distributed, name) for name in COLLECTIVES}     # restored below
    record_calls(torch.distributed, COLLECTIVES, collective)
    # DeepSpeed's comm backend binds torch.distributed.all_gather_into_tensor when it starts (comm/torch.py
    # get_all_gather_function): the weight gather of the optimizers' step goes through that binding
    from deepspeed.comm import comm as ds_comm
    bound_gather = ds_comm.cdb.all_gather_function          # restored below
    record_calls(ds_comm.cdb, ("all_gather_function",), collective)

    def batches():
        for i in range(MICRO):
            yield dsp.synthetic_batch(model, range(i * MBS, (i + 1) * MBS))

    try:
        for step_number in (1, 2):
            best["step"] = step_number
            engine.train_batch(data_iter=batches())
    finally:
        for name, fn in collectives.items():
            setattr(torch.distributed, name, fn)
        ds_comm.cdb.all_gather_function = bound_gather
    return {"stage": engine.stage_id, "params": sum(p.numel() for p in engine.module.parameters()),
            "built": type(engine.optimizer).__name__, "total": best["total"], "at": best["at"],
            "micro": best["micro"],
            "bucket": best["bucket"], "rest": best["rest"], "rest_at": best["rest_at"],
            "reduction": reduction["total"], "reduction_reads": reduction["reads"],
            "gathers_in_step": gathers_in_step[0]}


def _rank(rank, world_size, model, configs):
    import gc

    import torch.distributed as dist

    from hetauto_megatron.runtime import deepspeed_pipeline as dsp
    from hetauto_megatron.runtime.memory_meter import scan_only_what_comes_next

    deepspeed = dsp.import_deepspeed()
    deepspeed.init_distributed(dist_backend="gloo")
    scan_only_what_comes_next()      # the scans skip the imports' objects
    out = []
    for per_mesh in configs:
        engine = dsp.initialize(model, dsp.config_for_rank(per_mesh, rank))
        out.append(_measure(engine, model))
        engine.destroy()
        del engine
        gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def state_run(tmp_path_factory):
    from hetauto_megatron.runtime.deepspeed_pipeline import import_deepspeed
    from hetauto_megatron.runtime.launcher import free_port, launch

    plans = [_plan(*case) for case in CASES]
    out = tmp_path_factory.mktemp("dsstate")
    configs = []
    for k, plan in enumerate(plans):
        per_mesh = []
        for r in emit_deepspeed(plan):      # the files the emitter writes, as a job reads them
            path = out / f"ds_config.{k}.{r['name']}.json"
            path.write_text(json.dumps(r["config"]))
            per_mesh.append(json.loads(path.read_text()))
        configs.append(per_mesh)
    import_deepspeed()
    results = launch(_rank, WORLD, args=(plans[0].model, configs), timeout_s=400,
                     env={"MASTER_PORT": str(free_port())})
    return plans, results


def test_weights_gradients_optimizer_within_10_percent(state_run):
    plans, results = state_run
    rows = []
    for k, (case, plan) in enumerate(zip(CASES, plans)):
        for rank, per_rank in enumerate(results):
            got = per_rank[k]
            i, p = got["stage"], plan.pipeline_parallel_size
            settings = as_run_by(plan.meshes[i].settings, "deepspeed")
            E = 2 if case[0] == "bf16" else 4
            b = stage_memory_bytes(plan.model, layers=plan.stage_layers[i], tp=1, dp=plan.meshes[i].dp,
                                   micro_batch_size=MBS, recompute="none", in_flight=min(p - i, MICRO),
                                   first=i == 0, last=i == p - 1, settings=settings, dtype_bytes=E)
            assert got["params"] == b["params"]         # the stage the model prices is the stage that ran
            # the part that grows with the stage: the larger of the sets held through the micro-batches and at
            # the optimizer's step; the reduce bucket
            # (and the flat buffer's padding in each)
            dp = plan.meshes[i].dp
            # (ZeRO's step: with the whole .grads of the tensors straddling the rank's partition, an upper bound)
            straddling = sum(state_fixed_bytes_at_step(E, dp, settings, b["params"],
                                                       stage_param_tensors(plan.model, 1, i == 0, i == p - 1)).values())
            sets = [(state_bytes_per_param(E, dp, settings), state_padding_bytes(E, dp, settings, b["params"]), 0),
                    (state_bytes_at_step_per_param(E, dp, settings) or {},
                     state_padding_bytes(E, dp, settings, b["params"], at_step=True), straddling)]
            rest, bound = max((b["params"] * sum(per.values()) + sum(pad.values()) + fixed, fixed)
                              for per, pad, fixed in sets if per)
            # held while the gradient reduction after the last backward runs, its buffers included
            at_reduction = state_bytes_at_reduction(E, plan.meshes[i].dp, settings, b["params"],
                                                    largest_param_tensor(plan.model, 1, i == 0, i == p - 1))
            rows.append((case, rank, i, deepspeed_optimizer(case[0], settings),
                         (b["weights_grads_optimizer"], b["state_at_step"]),
                         (rest, bound), sum(state_fixed_bytes(E, settings).values()), at_reduction, got))
    for case, rank, i, kind, (micro, at_step), (rest, bound), fixed, at_reduction, got in rows:
        state = max(micro, at_step)
        print(f"{case} rank {rank} stage {i}: {got['built']}, {state:,.0f} / {got['total']:,} bytes "
              f"({state / got['total'] - 1:+.1%}, at {got['at']}); beside the activations {micro:,.0f} / "
              f"{got['micro']:,} ({micro / got['micro'] - 1:+.1%}); without the reduce bucket "
              f"{rest / got['params']:.2f} / {got['rest'] / got['params']:.2f} bytes per parameter "
              f"({rest / got['rest'] - 1:+.1%}, at {got['rest_at']}), reduce bucket {fixed:,.0f} / {got['bucket']:,}; "
              f"at the reduction {at_reduction:,.0f} / {got['reduction']:,} "
              f"({at_reduction / got['reduction'] - 1:+.1%}, {got['reduction_reads']} reads)")
    for case, rank, i, kind, (micro, at_step), (rest, bound), fixed, at_reduction, got in rows:
        assert BUILT[got["built"]] == kind, (case, got["built"])
        state = max(micro, at_step)     # the larger of the two sets: the most held at once
        assert got["total"] == pytest.approx(state, rel=TOLERANCE), (case, rank, state, got)
        assert got["micro"] == pytest.approx(micro, rel=TOLERANCE), (case, rank, micro, got)
        assert got["rest"] == pytest.approx(rest, rel=TOLERANCE), (case, rank, rest, got)
        assert got["bucket"] == pytest.approx(fixed, rel=TOLERANCE, abs=1024), (case, rank, fixed, got)
        assert got["reduction_reads"] >= 2, (case, rank, got)       # the instruction's start and a collective
        assert got["reduction"] == pytest.approx(at_reduction, rel=TOLERANCE), (case, rank, at_reduction, got)
        if kind in ("bf16", "zero"):    # to the byte, the flat buffer's padding priced (below 2 x DP elements)
            assert 0 <= got["total"] - state <= SCALAR_BYTES, (case, rank, state, got)
            assert 0 <= got["micro"] - micro <= SCALAR_BYTES, (case, rank, micro, got)
            # (at ZeRO's step, by at most the straddling tensors' .grads the busiest rank is priced: `bound`)
            assert -bound <= got["rest"] - rest <= SCALAR_BYTES, (case, rank, rest, bound, got)
            if kind == "bf16":      # (ZeRO's: an upper bound by the .grads moved into its bucket)
                assert 0 <= got["reduction"] - at_reduction <= SCALAR_BYTES, (case, rank, at_reduction, got)


def test_the_time_model_prices_the_weight_gather_where_the_optimizer_step_issues_one(state_run):
    """Where DeepSpeed's optimizer steps on a 1/DP partition it all-gathers the updated weights inside the step (the
    BF16 optimizer with ZeRO-0 too; not the torch optimizer): the time model prices that gather and the partition's
    step (plan/tail_costs.py optimizer_sharded) where the OptimizerStep instruction issues an all-gather, measured."""
    from helpers import small_inventory

    from hetauto_megatron.cost.analytic import AnalyticCostModel
    from hetauto_megatron.plan import tail_costs
    from hetauto_megatron.plan.costing import stage_profile

    plans, results = state_run
    checked = set()
    for k, (case, plan) in enumerate(zip(CASES, plans)):
        if plan.meshes[0].dp < 2:
            continue
        inventory = small_inventory([(m.cluster, "a100", 1, 2) for m in plan.meshes], []).with_precision(case[0])
        for per_rank in results:
            got, i = per_rank[k], per_rank[k]["stage"]
            m = plan.meshes[i]
            prof = stage_profile(plan.model, inventory.cluster(m.cluster), m.tp, m.dp, m.micro_batch_size, "none",
                                 AnalyticCostModel(), as_run_by(m.settings, "deepspeed"))
            gather = tail_costs.dp_sync_times(plan.model, prof, plan.stage_layers[i], i == 0,
                                              i == len(plan.meshes) - 1)[1]
            print(f"{case} stage {i}: {got['built']}, all-gathers in the step {got['gathers_in_step']}, "
                  f"gather priced {gather * 1e3:.3f} ms, partitioned step {tail_costs.optimizer_sharded(prof)}")
            assert (gather > 0) == (got["gathers_in_step"] > 0), (case, got)
            assert tail_costs.optimizer_sharded(prof) == (got["gathers_in_step"] > 0), (case, got)
            checked.add(got["gathers_in_step"] > 0)
    assert checked == {True, False}      # both kinds ran


def _optimizer_choices(rank, world_size, parsed_configs):
    """DeepSpeed's own choice of optimizer (`DeepSpeedEngine._do_optimizer_sanity_check`) for each parsed config,
    with the torch Adam the runtime passes, in a process whose DeepSpeed comm is initialised (the check asks for
    the rank): the engine's choice without building the engine, which fp16 could not on CPU."""
    import torch
    import torch.distributed as dist
    from deepspeed.runtime import engine as ds_engine

    from hetauto_megatron.runtime import deepspeed_pipeline as dsp

    dsp.import_deepspeed().init_distributed(dist_backend="gloo")
    kinds = {None: "torch", ds_engine.BFLOAT16: "bf16", ds_engine.FP16: "fp16", ds_engine.ZERO_OPTIMIZATION: "zero"}
    out = []
    for parsed in parsed_configs:
        engine = object.__new__(ds_engine.DeepSpeedEngine)
        engine._config = parsed
        engine.pipeline_parallelism, engine.global_rank = True, 0
        out.append(kinds[engine._do_optimizer_sanity_check(torch.optim.Adam([torch.nn.Parameter(torch.ones(2))]))])
    dist.destroy_process_group()
    return out


def test_the_optimizer_priced_is_the_one_deepspeed_builds_for_every_emitted_config():
    """For every precision (fp16 too, which DeepSpeed refuses to initialise on CPU), ZeRO stage and gradient type a
    plan can ask for, the emitted config parsed by DeepSpeed's own DeepSpeedConfig and given to the engine's own
    choice (`DeepSpeedEngine._do_optimizer_sanity_check`, engine.py:2294-2324, with the torch Adam the runtime
    passes; an fp16 result builds FP16_UnfusedOptimizer for it, engine.py:2555-2606) is the optimizer whose state
    the memory model prices and whose step and weight gather the time model prices (cost/deepspeed_state.py)."""
    from hetauto_megatron.cost.deepspeed_state import deepspeed_shards_optimizer
    from hetauto_megatron.emit.deepspeed import deepspeed_config, validate
    from hetauto_megatron.runtime.launcher import free_port, launch

    cases, parsed = [], []
    for precision in ("bf16", "fp16", "fp32"):
        for distributed_optimizer in (False, True):
            for grad_reduce_dtype in ("fp32", "param"):
                plan = _plan(precision, distributed_optimizer, grad_reduce_dtype, 2)
                parsed.append(validate(deepspeed_config(plan, 0), plan.meshes[0].dp))
                cases.append((precision, plan.settings_as_run(0, "deepspeed")))
    built = launch(_optimizer_choices, 1, args=(parsed,), timeout_s=120, env={"MASTER_PORT": str(free_port())})[0]
    for (precision, settings), kind in zip(cases, built):
        where = (precision, settings.distributed_optimizer, settings.grad_reduce_dtype, kind)
        print(where, "priced:", deepspeed_optimizer(precision, settings))
        assert deepspeed_optimizer(precision, settings) == kind, where
        assert deepspeed_shards_optimizer(precision, settings) == (kind in ("bf16", "zero")), where
    assert set(built) == {"torch", "bf16", "fp16", "zero"}
