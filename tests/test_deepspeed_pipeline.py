"""DeepSpeed's own pipeline engine runs an emitted config: `deepspeed.initialize` with the package's
PipelineModule on the plan's uneven partition (`hetauto.partition`), 4 CPU processes over gloo, ZeRO-1 over
DP 2 (the plan's distributed optimizer; ZeRO-0 for the first model, a plan without it), gradient clipping.

Its losses must equal a single-process run of the same model written in plain torch (the same layers and
per-layer seeds, the whole global batch in one pass, torch's Adam and clip_grad_norm_), within 1e-5. And the
engine must reduce the DP gradients as the settings table's `deepspeed` row says and `simulate(engine="deepspeed")`
prices it: every DP gradient collective of the run is recorded with the pipeline instruction it ran in; all of
them run in ReduceGrads, after the stage's last backward (none during a BackwardPass), one all-reduce of the
stage's whole gradient per step, with ZeRO-0 and ZeRO-1 alike. Two
models cover the helper's layers: the LLaMA-style tiny preset (RoPE, SwiGLU, RMSNorm, GQA, separate output
layer) and a GPT-2-style variant (learned positions, GELU, LayerNorm, embeddings tied across the two stages).
"""
import json

import pytest
from helpers import mesh, record_calls, record_instructions

from hetauto_megatron.cost.memory import stage_params
from hetauto_megatron.emit.deepspeed import deepspeed_config, emit_deepspeed, stage_partition, unsupported_features
from hetauto_megatron.errors import InputError
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.plan.engines import as_run_by
from hetauto_megatron.plan.simulate import padded_model, plan_choices

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

STEPS, LR, DATA_SEED = 3, 1e-2, 7
# One vendor (cpu), TP 1 and DP 2 and micro-batch 1 everywhere, 5 + 3 layers, full recomputation in the
# second cluster: DeepSpeed can express it (its gap: the uneven split, which is what hetauto.partition carries).
PLAN = {"version": 2, "model": {"preset": "tiny"}, "global_batch_size": 8,
        "meshes": [mesh("a", 1, 2, 1, [5]), mesh("b", 1, 2, 1, [3], "full")]}
# The GPT-2-style model's vocabulary (250) is not a multiple of 128: its configs carry the plan's padded table (256
# rows), which the pipeline builds and the reference too.
MODELS = {"llama-style": {"preset": "tiny"},
          "gpt2-style-tied": {"preset": "tiny", "tie_embeddings": True, "position_embedding": "learned",
                              "gated_mlp": False, "vocab_size": 250}}
# The runs: (model, the plan's settings, overlap_comm written into the configs or None to keep the emitted one).
# ZeRO-0 (no distributed optimizer) and ZeRO-1 as emitted (overlap_comm false, the table's deepspeed row), and ZeRO-1
# with overlap_comm true, as a hand-edited config (or the configs before the table's engine row) would have it: the
# engine must still reduce after the last backward. (ZeRO-0 with the tied embedding clips by a norm that counts the
# tied weight on both stages: 1e-4 off the reference, so ZeRO-0 runs the LLaMA-style model.)
RUNS = {"llama-style": ("llama-style", {"distributed_optimizer": False}, None),
        "gpt2-style-tied": ("gpt2-style-tied", {}, None),
        "llama-style-overlap_comm": ("llama-style", {}, True)}
_COLLECTIVES = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_reduce_coalesced")


def _record_collectives(dist, where: list, log: list, group: list):
    """Wrap torch.distributed's reducing collectives (before DeepSpeed binds them) so that each call on the DP group
    is logged with the pipeline instruction running (`where[0]`) and its elements; the call itself is unchanged."""
    def entry(name, args, kwargs):
        tensor = kwargs.get("tensor", args[0] if args else None)
        if group and kwargs.get("group") is group[0] and hasattr(tensor, "numel"):
            log.append((where[0], name, tensor.numel()))

    record_calls(dist, _COLLECTIVES, entry)


def _indices(step, micro, dp_rank, dp, mbs, gbs):
    """The samples of one micro-batch of one DP rank: together the step's global batch, each sample once."""
    start = step * gbs + (micro * dp + dp_rank) * mbs
    return list(range(start, start + mbs))


def _rank(rank, world_size, model, configs):
    import torch.distributed as dist

    from hetauto_megatron.runtime import deepspeed_pipeline as dsp

    deepspeed = dsp.import_deepspeed()
    where, log, group = ["init"], [], []
    _record_collectives(dist, where, log, group)
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = dsp.config_for_rank(configs, rank)
    engine = dsp.initialize(model, cfg, lr=LR)
    group.append(engine.grid.get_data_parallel_group())
    record_instructions(engine, where)
    dp, mbs, gas = cfg["hetauto"]["data_parallel_size"], cfg["train_micro_batch_size_per_gpu"], \
        cfg["gradient_accumulation_steps"]
    dp_rank = engine.grid.get_data_parallel_rank()

    def batches():
        for step in range(STEPS):
            for micro in range(gas):
                yield dsp.synthetic_batch(model, _indices(step, micro, dp_rank, dp, mbs, cfg["train_batch_size"]),
                                          seed=DATA_SEED)

    it = batches()
    losses = [float(engine.train_batch(data_iter=it)) for _ in range(STEPS)]
    out = {"losses": losses, "parts": list(engine.module.parts), "stage": engine.stage_id,
           "local": [engine.module._local_start, engine.module._local_stop],
           "zero_stage": engine.zero_optimization_stage(), "overlap_comm": bool(engine.zero_overlap_comm()),
           "checkpoint_interval": engine.module.activation_checkpoint_interval,
           "engine": type(engine).__name__, "dp_collectives": log,
           "stage_parameters": sum(p.numel() for p in engine.module.parameters() if p.requires_grad),
           "table_rows": sorted({m.word.num_embeddings for m in engine.module.modules() if isinstance(m, dsp.Embedding)}
                                | {m.out.out_features for m in engine.module.modules() if isinstance(m, dsp.Head)})}
    dist.barrier()
    dist.destroy_process_group()
    return out


def _single_process_losses(model, gbs, padded_vocab_size):
    import torch

    from hetauto_megatron.runtime.deepspeed_pipeline import lm_loss, reference_layers, synthetic_batch

    layers = reference_layers(model.replace(vocab_size=padded_vocab_size))
    params = list({id(p): p for layer in layers if isinstance(layer, torch.nn.Module)
                   for p in layer.parameters()}.values())
    opt = torch.optim.Adam(params, lr=LR)
    losses = []
    for step in range(STEPS):
        tokens, labels = synthetic_batch(model, range(step * gbs, (step + 1) * gbs), seed=DATA_SEED)
        x = tokens
        for layer in layers:
            x = layer(x)
        loss = lm_loss(x, labels)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.fixture(scope="module", params=sorted(RUNS))
def pipeline_run(request, tmp_path_factory):
    from hetauto_megatron.runtime.deepspeed_pipeline import import_deepspeed
    from hetauto_megatron.runtime.launcher import free_port, launch

    model, settings, overlap_comm = RUNS[request.param]
    meshes = [dict(m, settings=settings) for m in PLAN["meshes"]]
    plan = plan_from_dict(dict(PLAN, model=MODELS[model], meshes=meshes))
    out = tmp_path_factory.mktemp("ds")
    configs = []
    for r in emit_deepspeed(plan):      # validated by DeepSpeed's parser; each cluster reads its own file
        if overlap_comm is not None:
            r["config"]["zero_optimization"]["overlap_comm"] = overlap_comm
        path = out / f"ds_config.{r['name']}.json"
        path.write_text(json.dumps(r["config"]))
        configs.append(json.loads(path.read_text()))
    import_deepspeed()                  # once, before the ranks are forked
    results = launch(_rank, plan.world_size, args=(plan.model, configs), timeout_s=300,
                     env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    return plan, configs, results, overlap_comm


def test_plan_is_one_deepspeed_can_express():
    plan = plan_from_dict(PLAN)
    gaps = unsupported_features(plan)
    assert any("uneven layer split" in g for g in gaps)
    assert not any(w in g for g in gaps for w in ("tensor-parallel", "data-parallel", "micro-batch", "vendor"))


def test_deepspeed_pipeline_engine_matches_single_process(pipeline_run):
    plan, configs, results, overlap_comm = pipeline_run
    partition = stage_partition(plan.stage_layers)
    assert partition == [0, 6, 10]                       # DeepSpeed's 'uniform' would give [0, 5, 10]
    for rank, r in enumerate(results):
        assert r["engine"] == "PipelineEngine"
        assert r["parts"] == partition, r
        assert r["local"] == partition[r["stage"]:r["stage"] + 2]
        # the plan's settings table reached the engine as its deepspeed row says: distributed optimizer -> ZeRO-1
        m = plan.meshes[0 if rank < 2 else 1]
        settings = as_run_by(m.settings, "deepspeed")
        assert r["checkpoint_interval"] == (1 if m.recompute == "full" else 0)
        assert r["zero_stage"] == (1 if settings.distributed_optimizer else 0)
        assert r["overlap_comm"] == (settings.overlap_grad_reduce if overlap_comm is None else overlap_comm)
        # the vocabulary tables every stage builds (the embedding, the tied copy or the output layer) have the
        # rows the cost model prices: the plan's padded vocabulary
        assert r["table_rows"] == [padded_model(plan.model, plan_choices(plan)).vocab_size], r
        # and the stage holds the parameters the memory model prices, no more: the tied table's two holders
        # each build only their own end (the first stage no final norm, the last no position table)
        first, last = r["stage"] == 0, r["stage"] == plan.pipeline_parallel_size - 1
        assert r["stage_parameters"] == stage_params(padded_model(plan.model, plan_choices(plan)), 1,
                                                     plan.stage_layers[r["stage"]], first, last), r
    reference = _single_process_losses(plan.model, plan.global_batch_size, plan.padded_vocab_size)
    for r in results:
        assert len(r["losses"]) == STEPS
        diff = max(abs(a - b) for a, b in zip(r["losses"], reference))
        assert diff <= 1e-5, (r["losses"], reference)
    assert abs(reference[-1] - reference[0]) > 1e-3, reference   # the updates moved the loss well past 1e-5


def test_dp_reduction_runs_after_the_last_backward(pipeline_run):
    """What the engine did, against the table's deepspeed row (and what simulate(engine="deepspeed") prices): the
    DP gradient reduction is not overlapped with the backward pass; it is one all-reduce of the stage's whole
    gradient per step, in ReduceGrads (ZeRO-1: not a reduce-scatter), whether overlap_comm is on or off."""
    plan, _, results, _ = pipeline_run
    for r in results:
        m = plan.meshes[0 if r["stage"] == 0 else 1]
        settings = as_run_by(m.settings, "deepspeed")
        assert not settings.overlap_grad_reduce and not settings.sharded_grad_reduce
        gradients = [(where, name, n) for where, name, n in r["dp_collectives"] if n > 1]   # not the norm's scalars
        assert gradients, r["dp_collectives"]
        assert {where for where, _, _ in gradients} == {"ReduceGrads"}, gradients
        assert {name for _, name, _ in gradients} == {"all_reduce"}, gradients
        per_step = sum(n for _, _, n in gradients) / STEPS
        # the whole gradient (every parameter of a stage has one; ZeRO pads its flat buffer)
        assert r["stage_parameters"] <= per_step <= 1.01 * r["stage_parameters"], (per_step, r["stage_parameters"])


def test_one_stage_plan_runs_the_recomputation_it_was_priced_with(tmp_path):
    """A plan of one stage with full recomputation (what `hetauto plan --engine deepspeed --max-pp 1` picks when the
    activations do not fit otherwise) runs DeepSpeed's engine with whole-layer checkpointing, as the memory model
    priced it; before, its config had no `pipeline` block and the engine ran without it. Losses as the reference."""
    from hetauto_megatron.runtime.deepspeed_pipeline import import_deepspeed
    from hetauto_megatron.runtime.launcher import free_port, launch

    plan = plan_from_dict({"version": 2, "model": {"preset": "tiny"}, "global_batch_size": 4,
                           "meshes": [mesh("a", 1, 2, 1, [8], "full")]})
    configs = [json.loads(json.dumps(r["config"])) for r in emit_deepspeed(plan)]
    import_deepspeed()
    results = launch(_rank, plan.world_size, args=(plan.model, configs), timeout_s=300,
                     env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    assert [r["checkpoint_interval"] for r in results] == [1, 1], results
    reference = _single_process_losses(plan.model, plan.global_batch_size, plan.padded_vocab_size)
    for r in results:
        assert max(abs(a - b) for a, b in zip(r["losses"], reference)) <= 1e-5, (r["losses"], reference)


def _zero_stage_refusals(rank, world_size, model, cfg):
    """What hetauto's initialize and DeepSpeed's own initialize (of the same one-stage PipelineModule) say of `cfg`."""
    import torch
    import torch.distributed as dist

    from hetauto_megatron.errors import InputError
    from hetauto_megatron.runtime import deepspeed_pipeline as dsp

    deepspeed = dsp.import_deepspeed()
    deepspeed.init_distributed(dist_backend="gloo")
    out = {"hetauto": None, "deepspeed": None}
    try:
        dsp.initialize(model, cfg, file="ds_config.a.json")
    except InputError as exc:
        out["hetauto"] = [exc.file, exc.field, exc.reason]
    module = dsp.pipeline_module(model, cfg)
    params = [p for p in module.parameters() if p.requires_grad]
    try:
        deepspeed.initialize(model=module, optimizer=torch.optim.Adam(params), model_parameters=params, config=cfg)
    except AssertionError as exc:
        out["deepspeed"] = str(exc)
    dist.destroy_process_group()
    return out


def test_zero_2_is_refused_by_the_engine_with_one_stage_and_by_initialize_before_it():
    """DeepSpeed's PipelineEngine refuses ZeRO-2 with a one-stage PipelineModule (its assert, measured here on the
    package), which every mesh runs as: a one-stage config edited to ZeRO-2 is refused by hetauto's `initialize`
    before any layer is built, naming the file and the field (before: it got as far as DeepSpeed's assert)."""
    from hetauto_megatron.runtime.launcher import free_port, launch

    plan = plan_from_dict({"version": 2, "model": {"preset": "tiny"}, "global_batch_size": 2,
                           "meshes": [mesh("a", 1, 1, 1, [8])]})
    cfg = json.loads(json.dumps(emit_deepspeed(plan)[0]["config"]))
    cfg["zero_optimization"]["stage"] = 2
    out = launch(_zero_stage_refusals, 1, args=(plan.model, cfg), timeout_s=300,
                 env={"MASTER_PORT": str(free_port())})[0]
    assert out["deepspeed"] == "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism", out
    assert out["hetauto"][:2] == ["ds_config.a.json", "zero_optimization.stage"], out
    assert out["hetauto"][2].startswith("ZeRO stage 2: DeepSpeed's pipeline engine refuses"), out


def _initialize_refusal(rank, world_size, model, configs):
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.runtime import deepspeed_pipeline as dsp

    dsp.import_deepspeed().init_distributed(dist_backend="gloo")
    try:
        dsp.initialize(model, dsp.config_for_rank(configs, rank))
    except InputError as exc:
        return [exc.field, exc.reason]
    except Exception as exc:        # DeepSpeed's own refusal, which came first before the check
        return [type(exc).__name__, str(exc)]
    return None


def test_meshes_of_different_dp_are_refused_before_deepspeed_builds_its_grid():
    """Meshes of DP 1 x micro-batch 2 and DP 2 x micro-batch 1 (a Megatron plan emitted for DeepSpeed) launch 3 ranks,
    which DeepSpeed's one grid of stages x DP cannot hold: every rank is refused by hetauto's check, naming the field,
    before DeepSpeed's PipelineModule stops on `num_stages (2) must divide distributed world size (3)`."""
    from hetauto_megatron.runtime.launcher import free_port, launch

    plan = plan_from_dict({"version": 2, "model": {"preset": "tiny"}, "global_batch_size": 8,
                           "meshes": [mesh("a", 1, 1, 2, [5]), mesh("b", 1, 2, 1, [3])]})
    with pytest.raises(InputError) as exc:      # the emit refuses the plan by the same rule, check_one_grid
        emit_deepspeed(plan)
    assert exc.value.field == "meshes[1].dp"
    # the configs as a hand assembly (or an older hetauto) would give them
    configs = [json.loads(json.dumps(deepspeed_config(plan, i))) for i in range(len(plan.meshes))]
    out = launch(_initialize_refusal, plan.world_size, args=(plan.model, configs), timeout_s=300,
                 env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    for r in out:
        assert r[0] == "hetauto.data_parallel_size" and r[1].startswith("the launch has 3 ranks"), out


# docs/deepspeed.md's script, as a rank of a torchrun launch runs it on CPU (gloo), with one batch of synthetic samples;
# an object held by sys says so on fd 1 if the interpreter is torn down (the clean end, os._exit, skips it)
DOCUMENTED_SCRIPT = r"""
import json, os, sys
from hetauto_megatron.megatron.script_guard import main_guard
from hetauto_megatron.plan.plan import load_plan
from hetauto_megatron.runtime import deepspeed_pipeline as dsp

class Teardown:
    def __del__(self, write=os.write):
        write(1, b"teardown\n")
sys.hetauto_teardown = Teardown()

def main():
    plan = load_plan(sys.argv[1])
    deepspeed = dsp.import_deepspeed()
    deepspeed.init_distributed(dist_backend="gloo")
    path = sys.argv[2]
    cfg = json.load(open(path))
    engine = dsp.initialize(plan.model, cfg, lr=3e-4, file=path)
    batches = iter([dsp.synthetic_batch(plan.model, [i]) for i in range(cfg["train_batch_size"])])
    print("loss", float(engine.train_batch(data_iter=batches)), flush=True)

main_guard(main)
print("went on after main_guard", flush=True)
"""


@pytest.mark.parametrize("zero_stage, code", [(0, 0), (2, 2)])
def test_the_documented_script_ends_as_a_megatron_rank_does(tmp_path, zero_stage, code):
    """docs/deepspeed.md's script on CPU: a finished run, and a refused config (ZeRO-2, one paragraph), end after
    main_guard without interpreter finalisation, with their exit status, as the --hetauto ranks end; before, both went
    on to Python's own teardown with gloo's groups and the store alive, where a gloo thread can abort the rank after
    its work (SIGABRT, pytorch#190489)."""
    import os
    import subprocess
    import sys

    import yaml

    from hetauto_megatron.runtime.launcher import free_port

    plan_dict = {"version": 2, "model": {"preset": "tiny"}, "global_batch_size": 2,
                 "meshes": [mesh("a", 1, 1, 1, [8])]}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan_dict))
    cfg = emit_deepspeed(plan_from_dict(plan_dict))[0]["config"]
    cfg["zero_optimization"]["stage"] = zero_stage
    (tmp_path / "ds_config.a.json").write_text(json.dumps(cfg))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), PYTHONPATH=root)
    r = subprocess.run([sys.executable, "-c", DOCUMENTED_SCRIPT, str(tmp_path / "plan.yaml"),
                        str(tmp_path / "ds_config.a.json")], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == code, r.stdout + r.stderr[-3000:]
    assert ("loss " in r.stdout) == (code == 0), r.stdout
    if code == 2:
        assert "hetauto: error: ds_config.a.json: field 'zero_optimization.stage'" in r.stderr.replace(
            str(tmp_path) + "/", ""), r.stderr[-3000:]
    assert "teardown" not in r.stdout and "went on after main_guard" not in r.stdout, r.stdout
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
