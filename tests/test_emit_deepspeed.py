"""`hetauto emit deepspeed`: every emitted config passes DeepSpeed's own parser for its mesh's DP size."""
import json
import os
import re

import pytest
from helpers import mesh

from hetauto_megatron.cli import main
from hetauto_megatron.emit.deepspeed import (deepspeed_config, emit_deepspeed, stage_partition,
                                             unsupported_features, validate)
from hetauto_megatron.errors import InputError
from hetauto_megatron.plan.plan import load_plan, plan_from_dict
from hetauto_megatron.plan.engines import as_run_by

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN_736 = os.path.join(ROOT, "examples", "llama", "plans", "llama2-70b-736.yaml")
PLANS_FILE_TWO = os.path.join(ROOT, "examples", "llama", "plans", "cpu-small-pp2.yaml")     # site-a, site-b


def plan(meshes, gbs=16, precision="bf16"):
    return plan_from_dict({"version": 2, "model": {"preset": "tiny"}, "global_batch_size": gbs, "meshes": meshes,
                           "precision": precision})


def with_settings(m, **settings):
    return dict(m, settings=settings)


PLANS = {
    # one DP size (else no DeepSpeed job: test_plan_of_different_dp_is_refused), and every other gap
    "mixed": lambda: plan([mesh("h", 2, 2, 2, [0, 4], "selective", "h800"),
                           mesh("n", 1, 2, 2, [3, 1], "full", "ascend-910b")]),
    "recompute_none_one_stage": lambda: plan([mesh("a", 2, 4, 1, [8])], gbs=8),
    "recompute_full_one_stage": lambda: plan([mesh("a", 1, 2, 1, [8], "full")], gbs=8),
    "dp1_uneven": lambda: plan([mesh("a", 1, 1, 4, [5, 1]), mesh("b", 1, 1, 4, [2], "full")], gbs=12),
    # per-mesh overrides of the settings table: no distributed optimizer; reduction in the training precision
    "overrides": lambda: plan([with_settings(mesh("h", 2, 2, 2, [4], device="h800"), distributed_optimizer=False,
                                             overlap_param_gather=False, grad_reduce_dtype="param"),
                               with_settings(mesh("g", 2, 2, 2, [4], device="h800"), overlap_grad_reduce=False)]),
    "fp16_param_reduce": lambda: plan([with_settings(mesh("v", 1, 2, 2, [8], device="h800"), grad_reduce_dtype="param")],
                                      precision="fp16"),
    "fp32": lambda: plan([mesh("h", 1, 2, 2, [4], device="h800"), mesh("c", 1, 2, 2, [4])], precision="fp32"),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_config_passes_deepspeeds_parser(name):
    p = PLANS[name]()
    results = emit_deepspeed(p)
    assert [r["mesh"] for r in results] == list(range(len(p.meshes)))
    for r in results:
        m = p.meshes[r["mesh"]]
        cfg = r["config"]
        # what DeepSpeed's parser derived, for this mesh's data-parallel size
        assert r["parsed"]["train_batch_size"] == p.global_batch_size
        assert r["parsed"]["train_micro_batch_size_per_gpu"] == m.micro_batch_size
        assert r["parsed"]["gradient_accumulation_steps"] == p.num_micro_batches
        assert m.micro_batch_size * p.num_micro_batches * m.dp == p.global_batch_size
        # the mesh's runtime settings (plan/settings.py), as DeepSpeed's parser read them
        # (their row for DeepSpeed's engine: what that engine runs of them)
        s, precision = as_run_by(m.settings, "deepspeed"), p.mesh_precision(r["mesh"])
        assert precision == ("fp32" if m.device_type == "cpu" else p.precision)
        assert r["parsed"]["zero_stage"] == (1 if s.distributed_optimizer else 0)
        assert r["parsed"]["overlap_comm"] is False     # the pipeline engine reduces after the last backward
        low = {"bf16": "bfloat16", "fp16": "float16"}.get(precision)
        reduce = low if low and s.grad_reduce_dtype == "param" else "float32"
        assert r["parsed"]["communication_data_type"] == reduce
        assert r["parsed"]["bf16"] == (precision == "bf16") and cfg["fp16"]["enabled"] == (precision == "fp16")
        assert cfg["hetauto"]["settings"] == s.to_dict()
        # one stage too: DeepSpeed's engine reads the interval whatever the stage count (tests/test_deepspeed_pipeline.py)
        assert cfg["pipeline"]["activation_checkpoint_interval"] == (0 if m.recompute == "none" else 1)
        # the partitioned transfers simulate(engine="deepspeed") prices (tests/test_deepspeed_transfers.py)
        assert cfg["pipeline"]["pipe_partitioned"] is cfg["pipeline"]["grad_partitioned"] is True
        assert cfg["hetauto"]["partition"] == stage_partition(p.stage_layers)
        # the same config is rejected by DeepSpeed for any other DP size: the DP size really reached the parser
        with pytest.raises(InputError, match="rejected by DeepSpeed's parser"):
            validate(cfg, m.dp + 1)


def test_partition_boundaries():
    # layer list [embedding, 6 transformer layers, head]: stage 0 = emb + 3 layers, stage 1 = 2 layers, last = 1 + head
    assert stage_partition([3, 2, 1]) == [0, 4, 6, 8]
    assert stage_partition([0, 6]) == [0, 1, 8]


@pytest.mark.parametrize("change, words", [
    (lambda c: c.update(train_batch_size=15), "rejected by DeepSpeed's parser"),
    (lambda c: c.update(fp16={"enabled": True}), "rejected by DeepSpeed's parser"),
    (lambda c: c["zero_optimization"].update(stgae=1), "rejected by DeepSpeed's parser"),
    (lambda c: c["zero_optimization"].update(stage=2), "ZeRO stage 2: DeepSpeed's pipeline engine refuses"),
    (lambda c: c.update(pipline={}), "unknown top-level key(s) pipline"),
    (lambda c: c["activation_checkpointing"].update(partitioned=True), "unknown activation_checkpointing key"),
    (lambda c: c["pipeline"].update(partition=[0, 3, 6]), "pipeline key(s) partition that DeepSpeed's engine never reads"),
])
def test_validation_catches(change, words):
    p = PLANS["mixed"]()
    cfg = deepspeed_config(p, 0)
    change(cfg)
    with pytest.raises(InputError) as exc:
        validate(cfg, p.meshes[0].dp)
    assert words in str(exc.value)


# The keys DeepSpeed 0.19.8's parser reads under data_types (runtime/config.py, DeepSpeedConfig._initialize_params,
# read from the installed package); any other is ignored there without a word.
DATA_TYPES_KEYS = "buffer_dtype, grad_accum_dtype, keep_in_fp32_modules, param_dtype"


@pytest.mark.parametrize("change, field, words", [
    # a misspelt grad_accum_dtype: DeepSpeed would accumulate in its default, not the fp32 the memory model priced
    (lambda d: d.update(grad_accum_dtyp=d.pop("grad_accum_dtype")), "data_types.grad_accum_dtyp", "grad_accum_dtyp:"),
    (lambda d: d.update(accum="fp32", dtype="bf16"), "data_types", "accum, dtype:"),
])
def test_hand_edited_data_types_keys_are_refused(tmp_path, change, field, words):
    """A data_types key DeepSpeed does not read (before: accepted, and ignored by DeepSpeed) is refused with the
    file, the field and DeepSpeed's own keys; the keys it reads pass."""
    p = plan([mesh("a", 2, 4, 1, [8], device="h800")], gbs=8)
    cfg = deepspeed_config(p, 0)
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"} and cfg["bf16"]["enabled"]   # bf16, ZeRO-1: fp32 sums
    change(cfg["data_types"])
    path = str(tmp_path / "ds_config.a.json")
    with pytest.raises(InputError) as exc:
        validate(cfg, p.meshes[0].dp, file=path)
    assert (exc.value.file, exc.value.field, exc.value.exit_code) == (path, field, 2)
    assert words in exc.value.reason and exc.value.fix.startswith(f"use the keys DeepSpeed 0.19.8 reads there: "
                                                                   f"{DATA_TYPES_KEYS} ")
    known = deepspeed_config(p, 0)
    known["data_types"].update(param_dtype="bf16", buffer_dtype=None, keep_in_fp32_modules="auto")
    assert validate(known, p.meshes[0].dp).grad_accum_dtype == "fp32"


@pytest.mark.parametrize("stage", [2, "2", 3])
def test_hand_edited_zero_2_or_3_is_refused_with_one_pipeline_stage_too(stage):
    """DeepSpeed's PipelineEngine asserts ZeRO stage < 2 whatever the stage count (runtime/pipe/engine.py; measured in
    tests/test_deepspeed_pipeline.py), and every mesh runs as a PipelineModule: a one-stage config edited to ZeRO-2
    or 3 was accepted before (only more than one pipeline stage was refused), and a string stage at any depth."""
    p = PLANS["recompute_none_one_stage"]()
    assert p.pipeline_parallel_size == 1
    cfg = deepspeed_config(p, 0)
    assert validate(cfg, p.meshes[0].dp).zero_optimization_stage == 1     # as emitted: ZeRO-1 passes
    cfg["zero_optimization"]["stage"] = stage
    with pytest.raises(InputError) as exc:
        validate(cfg, p.meshes[0].dp, file="ds_config.a.json")
    assert (exc.value.file, exc.value.field) == ("ds_config.a.json", "zero_optimization.stage")
    assert exc.value.reason.startswith(f"ZeRO stage {int(stage)}: DeepSpeed's pipeline engine refuses")
    assert exc.value.fix.startswith("set it to 1 (the distributed optimizer) or 0")
    cfg["zero_optimization"]["stage"] = 0
    assert validate(cfg, p.meshes[0].dp).zero_optimization_stage == 0


def test_unsupported_features_only_those_that_apply():
    no_param_gather_overlap = {"overlap_grad_reduce": False, "overlap_param_gather": False}
    assert unsupported_features(plan([with_settings(mesh("a", 2, 4, 1, [8]), **no_param_gather_overlap)],
                                     gbs=8)) == ["sequence parallelism: not a DeepSpeed setting; the model's own "
                                                 "tensor-parallel layers (e.g. Megatron's, through the mpu) must "
                                                 "split the sequence"]
    same = plan([with_settings(mesh("a", 1, 2, 2, [4]), **no_param_gather_overlap),
                 with_settings(mesh("b", 1, 2, 2, [4]), **no_param_gather_overlap)])
    assert unsupported_features(same) == []
    assert [("overlap_grad_reduce" in line, "overlap_param_gather" in line) for line in
            unsupported_features(plan([mesh("a", 1, 2, 2, [4]), mesh("b", 1, 2, 2, [4])]))] == [(True, False),
                                                                                                 (False, True)]
    fp32_accumulation = plan([with_settings(mesh("a", 1, 2, 2, [4], device="h800"), distributed_optimizer=False,
                                            overlap_grad_reduce=False, overlap_param_gather=False)] * 2)
    assert ["fp32 gradient accumulation" in line for line in unsupported_features(fp32_accumulation)] == [True]
    text = "\n".join(unsupported_features(PLANS["mixed"]()))
    for w in ("tensor-parallel sizes", "cross-vendor", "selective", "uneven layer split"):
        assert w in text
    assert "data-parallel sizes" not in text and "micro-batch sizes" not in text     # refused, not listed
    # DP 1 everywhere: no DP collective to overlap, so no overlap lost
    assert not any("overlap" in line for line in unsupported_features(PLANS["dp1_uneven"]()))
    # a tied embedding across stages: ZeRO-0's clipping counts the table's gradient on both ends (DeepSpeed's
    # clip_grad_norm_; measured 1e-4 off the reference, tests/test_deepspeed_pipeline.py), ZeRO-1's once
    tied = {"version": 2, "model": {"preset": "tiny", "tie_embeddings": True}, "global_batch_size": 8,
            "meshes": [mesh("a", 1, 2, 1, [4]), mesh("b", 1, 2, 1, [4])]}
    assert not any("tied" in line for line in unsupported_features(plan_from_dict(tied)))
    tied["meshes"] = [with_settings(m, distributed_optimizer=False) for m in tied["meshes"]]
    assert sum("tied" in line for line in unsupported_features(plan_from_dict(tied))) == 1
    # on GPUs in bf16 DeepSpeed builds BF16_Optimizer there (its _do_optimizer_sanity_check), whose norm skips the
    # copy marked ds_pipe_replicated: no line (it said the table counts twice); fp16's optimizers count it twice
    for precision, said in (("bf16", 0), ("fp16", 1)):
        gpu = dict(tied, precision=precision, meshes=[with_settings(mesh(c, 1, 2, 1, [4], device="h800"),
                                                                    distributed_optimizer=False,
                                                                    grad_reduce_dtype="param") for c in "ab"])
        assert sum("tied" in line for line in unsupported_features(plan_from_dict(gpu))) == said, precision
    # an overlapped cross-cluster boundary: the engine blocks on every transfer (its price: simulate --engine)
    a, b = (with_settings(mesh(c, 1, 2, 2, [4]), **no_param_gather_overlap) for c in "ab")
    lines = unsupported_features(plan([dict(a, boundary={"schedule": "overlapped", "depth": 1}), b]))
    assert len(lines) == 1 and "overlapped cross-cluster boundary after a" in lines[0] and "blocks" in lines[0]


def test_cli_writes_files_and_json(tmp_path, capsys):
    """A plan of one DP size whose other gaps DeepSpeed runs without (TP per mesh, two vendors, selective
    recomputation run as full, the uneven split): configs written, the gaps listed as notes, exit 0."""
    path = tmp_path / "mixed.yaml"
    path.write_text(json.dumps({"version": 2, "model": {"preset": "tiny"}, "global_batch_size": 16, "meshes": [
        mesh("h", 2, 2, 2, [0, 4], "selective", "h800"), mesh("n", 1, 2, 2, [3, 1], "full", "ascend-910b")]}))
    out = tmp_path / "ds"
    assert main(["emit", "deepspeed", "--plan", str(path), "-o", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert sorted(os.listdir(out)) == ["deepspeed-unsupported.txt", "ds_config.h.json", "ds_config.n.json"]
    on_disk = json.loads((out / "ds_config.n.json").read_text())
    assert on_disk == result["configs"][1]["config"] and on_disk["train_micro_batch_size_per_gpu"] == 2
    assert "cross-vendor" in (out / "deepspeed-unsupported.txt").read_text()
    assert main(["emit", "deepspeed", "--plan", str(path), "--cluster", "n"]) == 0
    printed = capsys.readouterr().out
    assert "# ds_config for n " in printed and "ds_config for h " not in printed


def test_plan_of_different_dp_is_refused(tmp_path, capsys):
    """The 736-device example's meshes have DP 4, 4, 4 and 8: DeepSpeed's one grid has one DP size, and the launch of
    such configs is refused (runtime/deepspeed_pipeline.py, by the same check_one_grid). Emitting them exits 2 naming
    the plan, the meshes' DP and the fix, and writes nothing (before: exit 0, the configs written and the problem in
    deepspeed-unsupported.txt, so 'emit && deepspeed' went on to a launch that cannot run). 'hetauto plan --emit',
    which writes Megatron-LM's scripts beside, leaves the DeepSpeed configs out with a note instead."""
    from hetauto_megatron.commands.plan import emitted_files

    out = tmp_path / "ds"
    for extra in ([], ["--json"], ["--cluster", "ascend"]):
        assert main(["emit", "deepspeed", "--plan", PLAN_736, "-o", str(out), *extra]) == 2
        captured = capsys.readouterr()
        err = json.loads(captured.out)["error"]["message"] if extra == ["--json"] else captured.err
        assert f"{PLAN_736}: field 'meshes[3].dp'" in err and "Traceback" not in err, err
        assert "(h800) DP 4" in err and "(mi300x) DP 8" in err and "one DP size for every stage" in err
        assert "Fix:" in err and "hetauto plan --engine deepspeed" in err and "hetauto emit megatron" in err
        assert not out.exists()
    with pytest.raises(InputError) as exc:
        emit_deepspeed(load_plan(PLAN_736))
    assert exc.value.field == "meshes[3].dp"
    files, note = emitted_files(load_plan(PLAN_736), PLAN_736)
    names = [name for name, _, _ in files]
    assert "h800.sh" in names and "summary.txt" in names and not any(n.startswith("ds_config.") for n in names)
    assert not any("unsupported" in n for n in names)
    assert note.startswith("no DeepSpeed configs written: the meshes have different data-parallel sizes"), note


def test_cli_bad_plan_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("version: 1\nmodel: {preset: tiny}\nglobal_batch_size: 8\nmeshes:\n"
                    "  - {cluster: a, device_type: cpu, tp: 1, dp: 2, micro_batch_size: 1, stage_layers: [4]}\n"
                    "  - {cluster: b, device_type: cpu, tp: 1, dp: 1, micro_batch_size: 1, stage_layers: [4]}\n")
    assert main(["emit", "deepspeed", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "dp * micro_batch_size must be equal" in err and "Fix:" in err


def test_cluster_named_like_a_generated_file_is_refused(tmp_path, capsys):
    """Cluster `a` runs two meshes, so its configs are ds_config.a.mesh0/.mesh1.json; a cluster named `a.mesh1`
    would write over one of them (before: exit 0, one mesh left without a config)."""
    path = tmp_path / "collide.yaml"
    path.write_text(json.dumps({"version": 2, "model": {"preset": "tiny"}, "global_batch_size": 8, "meshes": [
        mesh("a", 1, 1, 2, [2]), mesh("a", 1, 1, 2, [2], "full"), mesh("a.mesh1", 1, 1, 2, [4])]}))
    assert main(["emit", "deepspeed", "--plan", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "'meshes[2].cluster'" in err and "rename cluster 'a.mesh1'" in err and "Traceback" not in err
    assert not list(tmp_path.glob("out/*"))
    # clusters `a` and `A`: a.sh and A.sh are one file where scripts are often written (macOS, Windows)
    path.write_text(json.dumps({"version": 2, "model": {"preset": "tiny"}, "global_batch_size": 8, "meshes": [
        mesh("a", 1, 1, 2, [4]), mesh("A", 1, 1, 2, [4])]}))
    for target in ("megatron", "deepspeed"):
        assert main(["emit", target, "--plan", str(path), "-o", str(tmp_path / target)]) == 2
        err = capsys.readouterr().err
        assert "'meshes[1].cluster'" in err and "differ only in case" in err and "Traceback" not in err, err


@pytest.mark.parametrize("change, field", [
    (lambda ms: ms[1].update(tp=2), "meshes[1].tp"),
    (lambda ms: ms[1].update(dp=1, micro_batch_size=2), "meshes[1].dp"),
    (lambda ms: ms[0].update(recompute="selective"), "meshes[0].recompute"),
    (lambda ms: ms[1].update(device_type="h800"), "meshes[1].device_type"),
    (lambda ms: ms[0].update(boundary={"schedule": "overlapped", "depth": 1}), "meshes[0].boundary.schedule"),
    (lambda ms: ms[0].update(settings={"overlap_grad_reduce": True}), "meshes[0].settings.overlap_grad_reduce"),
    (lambda ms: ms[1].update(settings={"overlap_param_gather": True}), "meshes[1].settings.overlap_param_gather"),
])
def test_plan_recorded_for_deepspeed_is_one_it_runs(change, field):
    """`engine: deepspeed` in a file is a job DeepSpeed's engine runs (one TP, DP and micro-batch size, one vendor,
    whole-layer checkpointing, blocking transfers: what `hetauto plan --engine deepspeed` plans); a hand-edited file
    that asks for more is refused naming the field, not priced and emitted as if it ran."""
    meshes = [mesh("a", 1, 2, 1, [4]), mesh("b", 1, 2, 1, [4], "full")]
    data = {"version": 4, "model": {"preset": "tiny"}, "global_batch_size": 8, "engine": "deepspeed", "meshes": meshes}
    assert plan_from_dict(data).engine == "deepspeed"          # the uniform plan reads
    change(meshes)
    with pytest.raises(InputError) as exc:
        plan_from_dict(data, file="p.yaml")
    assert exc.value.field == field and exc.value.file == "p.yaml" and exc.value.fix
    del data["engine"]                                         # the same meshes are a Megatron plan
    assert plan_from_dict(data).engine == "megatron"


def test_plan_recorded_for_deepspeed_reads_left_out_settings_as_it_runs_them_and_refuses_fp8():
    """A file with `engine: deepspeed` whose meshes leave their settings out (a hand-written one) reads them as
    that engine runs them (no overlaps, no sequence parallelism), not as Megatron's defaults, which were then
    emitted as --overlap-grad-reduce and --sequence-parallel while the engine's pricing assumed neither; fp8,
    which DeepSpeed's config has no setting for (`hetauto plan --engine deepspeed` refuses it), is refused."""
    meshes = [mesh("a", 2, 1, 1, [4]), mesh("b", 2, 1, 1, [4])]
    data = {"version": 4, "model": {"preset": "tiny"}, "global_batch_size": 8, "engine": "deepspeed", "meshes": meshes}
    for m in plan_from_dict(data).meshes:
        assert not (m.settings.sequence_parallel or m.settings.overlap_grad_reduce or m.settings.overlap_param_gather)
        assert m.settings.distributed_optimizer                # what the engine runs too (ZeRO-1)
    meshes[1]["settings"] = {"sequence_parallel": True}
    with pytest.raises(InputError) as exc:
        plan_from_dict(data, file="p.yaml")
    assert exc.value.field == "meshes[1].settings.sequence_parallel" and "write false" in exc.value.fix
    del meshes[1]["settings"]
    with pytest.raises(InputError) as exc:
        plan_from_dict({**data, "precision": "fp8"}, file="p.yaml")
    assert exc.value.field == "precision" and exc.value.file == "p.yaml"


def test_fp16_starts_from_megatrons_loss_scale(monkeypatch):
    """An fp16 plan's DeepSpeed config, as DeepSpeed's parser reads it, runs the dynamic loss scaler Megatron-LM's
    parser sets up for the same plan's launch (no loss-scale flag): the same initial scale (2**32), window,
    hysteresis and floor, so the two engines skip the same first overflowing steps. Before: DeepSpeed's own
    default, 2**16."""
    from helpers import parse_emitted

    p = PLANS["fp16_param_reduce"]()
    _, args = parse_emitted(monkeypatch, p, [])
    assert args.fp16 and args.loss_scale is None          # Megatron: dynamic loss scaling from its defaults
    for r in emit_deepspeed(p):
        parsed = validate(r["config"], r["data_parallel_size"])
        fp16 = parsed.float16_config
        assert fp16.enabled and fp16.loss_scale == 0                            # dynamic
        assert fp16.initial_dynamic_scale() == args.initial_loss_scale == 2 ** 32
        assert (fp16.loss_scale_window, fp16.hysteresis, fp16.min_loss_scale) == \
            (args.loss_scale_window, args.hysteresis, args.min_loss_scale)
    bf16 = deepspeed_config(PLANS["recompute_full_one_stage"](), 0)
    assert bf16["fp16"] == {"enabled": False}


def test_a_refused_emit_creates_no_output_directory(tmp_path, capsys):
    """`emit deepspeed -o DIR` of a plan of two pipelines (refused, exit 2) left an empty DIR (and its parents)."""
    two = os.path.join(os.path.dirname(__file__), "..", "examples", "llama", "plans", "tiny-2pipelines-cpu.yaml")
    out = tmp_path / "new" / "sub"
    assert main(["emit", "deepspeed", "--plan", two, "-o", str(out)]) == 2
    assert "pipelines" in capsys.readouterr().err and not (tmp_path / "new").exists()
    assert main(["emit", "summary", "--plan", two, "-o", str(out)]) == 0 and (out / "summary.txt").exists()


def test_configs_of_a_megatron_plan_that_does_not_fit_under_deepspeed_say_so(tmp_path, capsys):
    """LLaMA-2-13B planned for Megatron's engine on the 64 H800 fits (its overlaps and sequence parallelism); as
    DeepSpeed's engine runs the emitted configs (no sequence parallelism, no overlaps) a stage exceeds its device,
    which `simulate --engine deepspeed` says: emit wrote the configs with exit 0 and no word of it."""
    plan = str(tmp_path / "p13.yaml")
    inv = os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")
    assert main(["plan", "--model", "llama2-13b", "--inventory", inv, "--exclude-clusters", "ascend",
                 "--global-batch-size", "256", "--shapes", "simple", "-o", plan, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["simulate", "--plan", plan, "--engine", "deepspeed", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    over = [i for i, st in enumerate(sim["stages"]) if st["memory_gib"] > st["memory_cap_gib"]]
    assert over and not sim["fits"], sim["memory_gib"]
    assert main(["emit", "deepspeed", "--plan", plan, "-o", str(tmp_path / "ds")]) == 0
    err = capsys.readouterr().err
    assert f"stage {over[0]} needs {sim['stages'][over[0]]['memory_gib']:.1f} GiB" in err and "does not fit" in err, err
    # one cluster's configs again into the same folder: the other cluster's file is this plan's, not stale
    assert main(["emit", "deepspeed", "--plan", PLANS_FILE_TWO, "-o", str(tmp_path / "two")]) == 0
    assert main(["emit", "deepspeed", "--plan", PLANS_FILE_TWO, "--cluster", "site-b", "-o", str(tmp_path / "two")]) == 0
    assert "still holds" not in capsys.readouterr().err


FP8_PLAN = """version: 4
model: {name: llama2-7b, num_layers: 32, hidden_size: 4096, num_attention_heads: 32, ffn_hidden_size: 11008,
  vocab_size: 32000, seq_length: 4096, num_query_groups: 32, gated_mlp: true, tie_embeddings: false,
  position_embedding: rope, max_position_embeddings: 4096}
global_batch_size: 64
precision: fp8
meshes:
- {cluster: h100, device_type: h100-sxm, tp: 1, dp: 8, micro_batch_size: 1, recompute: none, stage_layers: [32]}
inventory:
  clusters:
  - {name: h100, device: h100-sxm, nodes: 1, devices_per_node: 8}
  links: []
"""


def test_the_configs_of_an_fp8_plan_are_priced_in_the_precision_they_say(tmp_path, capsys):
    """DeepSpeed's configs have no fp8 setting: an fp8 Megatron plan's configs say bf16. The note on a plan that does
    not fit as DeepSpeed runs it priced fp8 (97.1 GiB where bf16 needs 85.0) and named a command that refused the
    plan ('engine deepspeed has no fp8 setting', exit 2). It now prices what the configs say, and its command runs
    and gives the same figure."""
    plan = tmp_path / "fp8.yaml"
    plan.write_text(FP8_PLAN)
    assert main(["emit", "deepspeed", "--plan", str(plan), "-o", str(tmp_path / "ds")]) == 0
    err = capsys.readouterr().err
    with open(tmp_path / "ds" / "ds_config.h100.json") as fh:
        assert json.load(fh)["bf16"]["enabled"] is True
    found = re.search(r"stage 0 needs ([\d.]+) GiB of 80: it does not fit \('hetauto (simulate [^']+)'\)", err)
    assert found, err
    assert main([*found.group(2).split(), "--json"]) == 0, capsys.readouterr().err
    sim = json.loads(capsys.readouterr().out)
    assert f"{sim['stages'][0]['memory_gib']:.1f}" == found.group(1), sim["stages"][0]
