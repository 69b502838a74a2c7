"""`hetauto plan --engine deepspeed`: plans for DeepSpeed's pipeline engine (uniform layouts, blocking boundaries,
its TrainSchedule, the DP reduction after the last backward). Such a plan, priced by the event simulation of
DeepSpeed's schedule (plan/deepspeed_schedule.py simulate_deepspeed: every instruction played, a different code
path than the search's closed form), must be no slower than the default plan priced the same way; the plan file
records the engine, and simulate uses it by default."""
import json

import pytest
from helpers import run_hetauto
from helpers import small_inventory as _inv

from hetauto_megatron.emit.deepspeed import unsupported_features
from hetauto_megatron.errors import InputError
from hetauto_megatron.plan.layout_pricing import layout_to_plan
from hetauto_megatron.plan.plan import load_plan, plan_from_dict
from hetauto_megatron.plan.search import SearchConfig, search
from hetauto_megatron.plan.engines import as_run_by
from hetauto_megatron.plan.simulate import simulate
from hetauto_megatron.spec.model import PRESETS

INSTANCES = {
    # fp16 (the V100 has no bf16); the default plan gives the two meshes different TP
    "a100+v100/llama2-7b": (_inv([("a", "a100-80gb", 2, 8), ("v", "v100", 1, 8)], [("a", "v", 25, 2)])
                            .with_precision("fp16"), "llama2-7b", 64),
    # the default plan is one DeepSpeed can run (TP 4 x DP 4 on both): the two searches price the same layouts
    "a100-40+h20/llama2-13b": (_inv([("a", "a100-40gb", 2, 8), ("h", "h20", 2, 8)], [("a", "h", 50, 1)]),
                               "llama2-13b", 128),
    # a slow link: overlapped transfers hide it, DeepSpeed's blocking ones do not
    "h100+l40s-10g/llama3-8b": (_inv([("h", "h100-sxm", 1, 8), ("l", "l40s", 2, 8)], [("h", "l", 10, 5)]),
                                "llama3-8b", 128),
}


def _plan(model, inv, gbs, engine):
    r = search(model, inv, gbs, config=SearchConfig(method="exhaustive", engine=engine))
    return layout_to_plan(model, gbs, r.choices, r.stage_layers, inv, boundaries=r.boundaries).for_engine(engine)


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_deepspeed_plan_is_no_slower_on_deepspeeds_engine(name):
    inv, model, gbs = INSTANCES[name]
    model = PRESETS[model]
    ours = _plan(model, inv, gbs, "deepspeed")
    default = _plan(model, inv, gbs, "megatron")
    t_ours = simulate(ours, inv, engine="deepspeed")
    t_default = simulate(default, inv, engine="deepspeed")
    assert t_ours.fits
    assert t_ours.iteration_time_s <= t_default.iteration_time_s * (1 + 1e-9), (name, ours.meshes, default.meshes)
    # a plan DeepSpeed's engine runs: no gap but the uneven split (which PlanPipelineModule runs), its settings
    # those the engine runs, every boundary blocking, the engine recorded
    gaps = unsupported_features(ours)
    assert all("uneven layer split" in g for g in gaps), gaps
    assert all(m.settings.to_dict() == as_run_by(m.settings, "deepspeed").to_dict() for m in ours.meshes)
    assert all(m.boundary_schedule == "blocking" for m in ours.meshes)
    assert plan_from_dict(ours.to_dict()).engine == "deepspeed"


def test_plan_file_records_the_engine_and_simulate_uses_it(tmp_path):
    out = tmp_path / "plan.yaml"
    r = run_hetauto("plan", "--model", "llama2-7b", "--inventory", "examples/llama/inventory-2clusters.yaml",
                    "--global-batch-size", "64", "--engine", "deepspeed", "--quiet", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)
    plan = load_plan(str(out))
    assert plan.engine == "deepspeed" and plan.is_simple
    # the file records what was searched (the engine's one pipeline, blocking boundaries), not the flags' defaults
    search = plan.estimate["search"]
    assert search["shapes"]["setting"] == "simple" and search["boundary_schedule"] == "blocking", search
    # ... which a Megatron re-plan of it does not keep: its engine forced them
    again = tmp_path / "megatron.yaml"
    r = run_hetauto("plan", "--from", str(out), "--engine", "megatron", "--model", "llama2-7b", "--inventory",
                    "examples/llama/inventory-2clusters.yaml", "--quiet", "-o", str(again))
    assert r.returncode == 0, r.stderr
    search = load_plan(str(again)).estimate["search"]
    assert search["shapes"]["setting"] == "all" and search["boundary_schedule"] == "overlapped", search
    args = ("simulate", "--model", "llama2-7b", "--inventory", "examples/llama/inventory-2clusters.yaml",
            "--plan", str(out), "--json")
    recorded, told = run_hetauto(*args), run_hetauto(*args, "--engine", "deepspeed")
    megatron = run_hetauto(*args, "--engine", "megatron")
    assert recorded.returncode == told.returncode == megatron.returncode == 0, recorded.stderr
    t = [json.loads(x.stdout)["iteration_time_s"] for x in (recorded, told, megatron)]
    assert t[0] == t[1] == pytest.approx(planned["iteration_time_s"], rel=1e-6)
    assert t[2] != t[0]
    assert [json.loads(x.stdout)["engine"] for x in (recorded, told, megatron)] == ["deepspeed"] * 2 + ["megatron"]
    # Megatron-LM's loop checks each step's results: one more scalar around the world's ring, as the norm (both
    # latency-bound, the same ring); DeepSpeed's pipeline engine has no such check
    est = [json.loads(x.stdout) for x in (recorded, megatron)]
    assert est[0]["result_check_s"] == 0 and est[0]["grad_norm_s"] > 1e-3
    assert est[1]["result_check_s"] == pytest.approx(est[1]["grad_norm_s"], rel=1e-6)


def test_simulate_with_another_engine_shows_what_that_engine_runs(tmp_path):
    """A Megatron plan with selective recomputation, simulated as DeepSpeed's engine runs it: the table and the
    settings line show that engine's full recomputation (what tests/test_memory_deepspeed.py measures it running)
    and its settings, not the file's."""
    out = tmp_path / "plan.yaml"
    inv = tmp_path / "inventory.yaml"
    inv.write_text("clusters:\n  - {name: a, device: a100-80gb, nodes: 2, devices_per_node: 8}\n")
    r = run_hetauto("plan", "--model", "llama2-7b", "--inventory", str(inv), "--global-batch-size", "64", "--quiet",
                    "--recompute", "a=selective", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert [m.recompute for m in load_plan(str(out)).meshes] == ["selective"]
    args = ("simulate", "--model", "llama2-7b", "--inventory", str(inv), "--plan", str(out))
    as_planned, deepspeed = run_hetauto(*args), run_hetauto(*args, "--engine", "deepspeed")
    assert as_planned.returncode == 0 and deepspeed.returncode == 0, deepspeed.stderr
    assert " selective " in as_planned.stdout and " selective " not in deepspeed.stdout
    assert " full " in deepspeed.stdout and "as deepspeed's pipeline engine runs them" in deepspeed.stdout


def test_old_files_read_as_megatron_and_deepspeed_needs_one_pipeline():
    data = {"version": 3, "model": {"preset": "tiny"}, "global_batch_size": 8,
            "meshes": [{"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 2, "micro_batch_size": 1,
                        "stage_layers": [8]}]}
    assert plan_from_dict(data).engine == "megatron" and "engine" not in plan_from_dict(data).to_dict()
    with pytest.raises(InputError, match="engine"):
        plan_from_dict(dict(data, engine="torchtitan"))
    two = dict(data, engine="deepspeed", pipelines=[{"samples": 4}, {"samples": 4}],
               meshes=[dict(data["meshes"][0], dp=1), dict(data["meshes"][0], dp=1, pipeline=1)])
    with pytest.raises(InputError, match="one pipeline of single meshes"):
        plan_from_dict(two)


def test_search_closed_form_screens_deepspeeds_schedule_within_its_published_margin():
    """The search's cached closed form for DeepSpeed's engine (plan/evaluator.py: Megatron's blocking 1F1B with
    each link doubled) against the event simulation of DeepSpeed's TrainSchedule, every instruction played
    (deepspeed_schedule.simulate_deepspeed, which tests/test_deepspeed_schedule.py checks against hand
    computations from DeepSpeed's rules), on the same layouts: never below it and at most 10 % above, the margin docs/search.md
    publishes for this screen (worst +9.7 % on 400 random pipelines of 32-128 micro-batches; here 32 and 64)."""
    import itertools

    from hetauto_megatron.cost.analytic import AnalyticCostModel
    from hetauto_megatron.plan.evaluator import LayoutEvaluator
    from hetauto_megatron.plan.simulate import MeshChoice
    inv, model, gbs = INSTANCES["h100+l40s-10g/llama3-8b"]
    model, cm = PRESETS[model], AnalyticCostModel()
    ev = LayoutEvaluator(model, inv, gbs, cm, "overlapped", "deepspeed")
    priced = 0
    for tp, dp, s1, s2, rc in itertools.product([1, 2], [2, 4], [1, 2], [1, 2], ["none", "full"]):
        t, cur = ev.resolve((MeshChoice("h", tp, dp, 1, rc, s1), MeshChoice("l", tp, dp, 1, rc, s2)))
        if t == float("inf"):
            continue                    # does not fit
        played = ev.exact(cur).iteration_time_s
        assert played * (1 - 1e-9) <= t <= played * 1.10, (cur, t, played)
        priced += 1
    assert priced >= 20
    # a layout DeepSpeed's uniform topology cannot run is never priced
    assert ev.resolve((MeshChoice("h", 1, 4, 1, "none", 1), MeshChoice("l", 2, 4, 1, "none", 1)))[0] == float("inf")


@pytest.mark.parametrize("flags, field, words", [
    # the search left the pinned cluster out in silence (6.5x slower than without the pin)
    (["--recompute", "h800=selective"], "--recompute", ["whole layers only"]),
    # the search found nothing and blamed TP and the links
    (["--use-clusters", "h800,ascend"], "--use-clusters", ["one vendor", "h800 is nvidia", "ascend is ascend"]),
    # ignored in silence: the plan blocked at every boundary
    (["--boundary-schedule", "overlapped"], "--boundary-schedule", ["blocks on every pipeline transfer"]),
    # ignored in silence too: the search ran one pipeline of single meshes
    (["--shapes", "all"], "--shapes", ["one pipeline of one mesh per cluster"]),
])
def test_what_deepspeeds_engine_cannot_run_is_refused_by_name(flags, field, words, capsys):
    import os

    from helpers import ROOT, run_cli
    inv = os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")
    rc, out, err = run_cli(["plan", "--model", "llama2-7b", "--inventory", inv, "--engine", "deepspeed", "--quiet",
                            *flags], capsys)
    assert rc == 2 and out == "" and f"field '{field}'" in err and "Fix: " in err, err
    assert all(w in err for w in words), err


def test_a_deepspeed_plan_in_a_precision_its_device_lacks_is_refused_naming_the_file():
    """Loading checks a DeepSpeed plan's settings as that engine runs them at each mesh's precision; a V100 (no
    bf16) in a bf16 plan was refused there without the file's name, which every other load error gives."""
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.plan.plan import plan_from_dict
    from hetauto_megatron.spec.model import PRESETS

    data = {"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "precision": "bf16",
            "engine": "deepspeed", "meshes": [{"cluster": "v", "device_type": "v100-16gb", "tp": 1, "dp": 1,
                                               "micro_batch_size": 8, "stage_layers": [8]}]}
    with pytest.raises(InputError) as exc:
        plan_from_dict(data, file="plan.yaml")
    assert exc.value.file == "plan.yaml" and exc.value.field == "precision", exc.value.message
    assert "cannot train in bf16" in exc.value.message


def test_a_deepspeed_fp16_plan_written_before_its_fp16_reduction_was_priced_still_reads(capsys):
    """DeepSpeed's fp16 with ZeRO-1 reduces gradients in fp16 (engines.py as_run_by); version-4 files written before
    hetauto priced that say `grad_reduce_dtype: fp32`, which loading refused as a setting the engine does not run
    (exit 2 from simulate, emit and explain on a file hetauto had written). It reads as it runs, with a note naming
    the field; another setting the engine does not run is still refused."""
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.spec.model import PRESETS

    def data(reduce_dtype, overlap=False):
        settings = {"sequence_parallel": False, "distributed_optimizer": True, "overlap_grad_reduce": overlap,
                    "overlap_param_gather": False, "grad_reduce_dtype": reduce_dtype}
        return {"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "precision": "fp16",
                "engine": "deepspeed", "meshes": [{"cluster": "v", "device_type": "v100-16gb", "tp": 1, "dp": 1,
                                                   "micro_batch_size": 8, "stage_layers": [8], "settings": settings}]}

    old = plan_from_dict(data("fp32"), file="old-plan.yaml")
    err = capsys.readouterr().err
    assert "old-plan.yaml: meshes[0].settings.grad_reduce_dtype fp32 is read as param" in err, err
    assert old.meshes[0].settings.grad_reduce_dtype == "param"
    assert old.settings_as_run(0) == plan_from_dict(data("param")).settings_as_run(0)
    with pytest.raises(InputError) as exc:
        plan_from_dict(data("param", overlap=True), file="plan.yaml")
    assert exc.value.field == "meshes[0].settings.overlap_grad_reduce" and "runs false" in exc.value.message
