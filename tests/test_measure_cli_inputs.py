"""User errors of the measuring commands (profile, fit, probe-link, validate-cost-model): each is refused with
exit 2 and one paragraph naming the file, the field and the fix, before anything is measured or fitted; and
validate-cost-model --dryrun simulates a plan on the inventory it carries, as every command reading a plan."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml
from conftest import TINY_PLAN
from helpers import ROOT, cpu_inventory, run_cli

from hetauto_megatron.cost import features as F
from hetauto_megatron.cost.learned import PROFILE_FORMAT
from hetauto_megatron.measure.grids import GRIDS, grid_ops, with_unfused_attention

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)


def write_tiny_profile(path, *, threads: int = 1, rows: int | None = None) -> None:
    """A CPU operator profile of the tiny grid as 'hetauto profile --grid tiny' writes it (header, then a row per
    operator), with made-up times: `rows` operators of it (default all), timed with `threads` threads."""
    header = {"format": PROFILE_FORMAT, "granularity": "op", "feature_version": F.FEATURE_VERSION,
              "device_type": "cpu", "vendor": "cpu", "peak_tflops": 0.128, "hbm_gbps": 20.0, "torch_device": "cpu",
              "dtype": "float32", "dtype_bytes": 4, "grid": "tiny", "threads": threads, "tf32": False,
              "timing": "wall clock"}
    ops = with_unfused_attention(grid_ops(GRIDS["tiny"], 0), True)[:rows]
    lines = [header] + [{"key": op.key(), "op": op.to_dict(), "fwd_s": 1e-5 * (1 + i % 7),
                         "bwd_s": 2e-5 * (1 + i % 5), "reps": 7} for i, op in enumerate(ops)]
    path.write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in lines))


@pytest.fixture
def no_timing(monkeypatch):
    """Any operator timed fails the test at once (a refusal must come before measuring; a regression must not
    spend minutes profiling); torch's thread count is restored afterwards (profile sets it in this process)."""
    import torch

    from hetauto_megatron.measure import profile as P
    threads = torch.get_num_threads()

    def timed(*_a, **_k):
        raise AssertionError("an operator was timed")
    monkeypatch.setattr(P.Runner, "time_fn", timed)
    yield
    torch.set_num_threads(threads)


def test_profile_refuses_to_resume_a_file_of_another_thread_count(tmp_path, capsys, no_timing):
    prof = tmp_path / "profile-cpu.jsonl"
    write_tiny_profile(prof, threads=1, rows=3)
    before = prof.read_text()
    rc, out, err = run_cli(["profile", "--device-type", "cpu", "--grid", "tiny", "--threads", "2",
                            "--out", str(tmp_path)], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert f"{prof}: field 'threads'" in err and "threads 1" in err and "has 2" in err
    assert "Fix:" in err and "--threads 1" in err and "--out" in err
    assert prof.read_text() == before          # nothing appended: refused before any row


def test_profile_resumes_a_file_of_the_same_thread_count(tmp_path, capsys, no_timing):
    """The control: the same file, profiled with its thread count (1, the CPU default), resumes as before."""
    prof = tmp_path / "profile-cpu.jsonl"
    write_tiny_profile(prof, threads=1)
    rc, out, err = run_cli(["profile", "--device-type", "cpu", "--grid", "tiny", "--out", str(tmp_path), "--json"],
                           capsys)
    assert rc == 0, err
    res = json.loads(out)
    assert res["measured_now"] == 0 and res["resumed"] == res["operators"] > 0


def test_profile_called_from_python_gives_the_callers_thread_count_back(tmp_path, capsys, no_timing):
    """profile times a CPU with one intra-op thread; called from Python (cli.main with a list), it left the caller's
    process at that count (a later fork inherited it, and the caller's own work ran on one thread)."""
    import torch

    write_tiny_profile(tmp_path / "profile-cpu.jsonl", threads=1)
    torch.set_num_threads(3)
    rc, out, err = run_cli(["profile", "--device-type", "cpu", "--grid", "tiny", "--out", str(tmp_path), "--json"],
                           capsys)
    assert rc == 0, err
    assert json.loads(out)["resumed"] > 0       # it ran at one thread: the file's count, else refused
    assert torch.get_num_threads() == 3


def test_resuming_a_file_of_one_grid_name_with_that_grid_adds_no_grid_to_its_header(tmp_path, capsys, no_timing):
    """A file written before the header listed its grids names one 'grid' and no seed, which matches any seed:
    resumed with that grid (here with nothing left to time), its header listed the grid twice, at seed None and
    at seed 0, for the same rows. The file stays as it was."""
    from hetauto_megatron.cost.learned import read_profile
    from hetauto_megatron.cost.learned.profile_merge import profile_grids
    prof = tmp_path / "profile-cpu.jsonl"
    write_tiny_profile(prof)
    before = prof.read_text()
    assert profile_grids(read_profile(str(prof))[0]) == [{"grid": "tiny", "seed": None}]
    rc, _, err = run_cli(["profile", "--device-type", "cpu", "--grid", "tiny", "--out", str(tmp_path)], capsys)
    assert rc == 0, err
    assert prof.read_text() == before and not list(tmp_path.glob("*.tmp"))


def test_resuming_a_layer_file_with_another_seed_adds_no_grid_to_its_header(tmp_path, capsys, no_timing):
    """--seed does not change a layer grid's shapes, yet a layers file resumed with --seed 3 gained a second
    entry for the same rows; a layer grid's entry has no seed now, and matches the one a file holds at any."""
    layers = tmp_path / "layers-cpu.jsonl"
    _write_tiny_layers(layers, threads=1)
    before = layers.read_text()
    rc, _, err = run_cli(["profile", "--device-type", "cpu", "--layers", "--grid", "layers-tiny", "--seed", "3",
                          "--out", str(tmp_path), "--json"], capsys)
    assert rc == 0, err
    assert layers.read_text() == before


def test_a_grid_entry_has_a_seed_where_the_seed_picks_the_shapes():
    """The header's entry for a grid names its seed where two seeds give other shapes (every operator grid
    subsamples its operators with it) and leaves it out where they give the same (layer grids)."""
    from hetauto_megatron.measure.grids import LAYER_GRIDS, grid_entry
    for name, grid in GRIDS.items():
        assert grid_ops(grid, 0) != grid_ops(grid, 1) and grid_entry(name, 1) == {"grid": name, "seed": 1}, name
    for name in LAYER_GRIDS:
        assert grid_entry(name, 1) == {"grid": name}, name


def _with_grids(path, grids) -> None:
    lines = path.read_text().splitlines(keepends=True)
    header = {k: v for k, v in json.loads(lines[0]).items() if k != "grid"}
    path.write_text(json.dumps({**header, "grids": grids}) + "\n" + "".join(lines[1:]))


@pytest.mark.parametrize("first_name, second_grids, fix", [
    # a first file of another name than profile writes: copied to where a resume finds it
    ("ops.jsonl", [{"grid": "tiny", "seed": 3}],
     "copy {first} to DIR/profile-cpu.jsonl, then run 'hetauto profile --device-type cpu --grid tiny --seed 3 "
     "--dtype float32 --threads 1 --out DIR'"),
    ("profile-cpu.jsonl", [{"grid": "tiny", "seed": 0}], ": {first} was profiled over this one's grids too"),
])
def test_fit_says_what_to_do_with_two_operator_profiles_of_one_device(tmp_path, capsys, first_name, second_grids,
                                                                      fix):
    """The paragraph talked of --layers files only; it names both files and says how to measure the second's grid
    into the first (or, where the first holds its grids already, to pass one)."""
    first, second = tmp_path / "a" / first_name, tmp_path / "b" / "profile-cpu.jsonl"
    for path, grids in ((first, [{"grid": "tiny", "seed": 0}]), (second, second_grids)):
        path.parent.mkdir()
        write_tiny_profile(path)
        _with_grids(path, grids)
    rc, _, err = run_cli(["fit", str(first), str(second), "-o", str(tmp_path / "m")], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert f"{second}: field 'device_type': device type cpu comes from two operator profiles, {first}" in err, err
    assert "Fix: pass one of them" in err and fix.format(first=first) in err and "--layers" not in err, err
    assert "re-measured" not in err, err       # both timed alike: the second's rows could be merged as they are


def test_a_second_grids_file_of_one_device_is_named_as_the_second_profile(tmp_path, capsys):
    """The packaged H200 profile and its separately measured full-grid part (larger shapes of some operator kinds)
    given together: the fit named the second file's missing norm, rotary and loss rows and said to resume its
    profiling, not that one device came from two profiles, whose paragraph says how to measure both into one."""
    h200 = os.path.join(ROOT, "hetauto_megatron", "data", "h200")
    files = [os.path.join(h200, f) for f in ("profile-h200.jsonl", "profile-h200-full-grid-part.jsonl")]
    for first, second in (files, files[::-1]):      # whichever comes first
        rc, _, err = run_cli(["fit", first, second, "-o", str(tmp_path / "m")], capsys)
        assert rc == 2 and f"{second}: field 'device_type': device type h200 comes from two operator profiles" \
            in err, err
        assert "holds no fwd time" not in err, err


@pytest.mark.parametrize("second_settings, words", [
    ({"threads": 1}, "this one was timed with threads 1, {first} with threads 2"),
    ({"threads": 2, "dtype": "bfloat16", "dtype_bytes": 2},
     "this one was timed with dtype bfloat16, {first} with dtype float32"),
])
def test_fit_gives_the_command_at_the_first_files_own_settings(tmp_path, capsys, no_timing, second_settings,
                                                                words):
    """The fix said to resume the first file with the --dtype and --threads the second was made with, which
    profile refuses (a file of 2 threads resumed with 1: exit 2). The command now carries the first's own, and
    says the second's grid is re-measured at them; run as given, profile accepts it and lists the grid (the
    first file holds the grid's operators already here, so nothing is timed)."""
    import re
    import shlex

    from hetauto_megatron.cost.learned import read_profile
    from hetauto_megatron.cost.learned.profile_merge import profile_grids
    first, second = tmp_path / "a" / "profile-cpu.jsonl", tmp_path / "b" / "profile-cpu.jsonl"
    for path in (first, second):
        path.parent.mkdir()
        write_tiny_profile(path, threads=2 if path == first else 1)
    _with_grids(first, [{"grid": "tiny", "seed": 0}])
    _with_grids(second, [{"grid": "tiny", "seed": 3}])
    lines = second.read_text().splitlines(keepends=True)
    second.write_text(json.dumps({**json.loads(lines[0]), **second_settings}) + "\n" + "".join(lines[1:]))
    held = {json.loads(line)["key"] for line in first.read_text().splitlines()[1:]}
    with first.open("a") as fh:
        for op in with_unfused_attention(grid_ops(GRIDS["tiny"], 3), True):
            if op.key() not in held:
                fh.write(json.dumps({"key": op.key(), "op": op.to_dict(), "fwd_s": 1e-5, "bwd_s": 2e-5, "reps": 7})
                         + "\n")
    rc, _, err = run_cli(["fit", str(first), str(second), "-o", str(tmp_path / "m")], capsys)
    assert rc == 2 and "Traceback" not in err, err
    command = re.search(r"'hetauto (profile [^']*)'", err)
    assert command and command.group(1) == ("profile --device-type cpu --grid tiny --seed 3 --dtype float32 "
                                            f"--threads 2 --out {first.parent}"), err
    assert words.format(first=first) in err and "re-measured at the first's settings" in err, err
    rc, _, err = run_cli(shlex.split(command.group(1)), capsys)
    assert rc == 0, err
    assert profile_grids(read_profile(str(first))[0]) == [{"grid": "tiny", "seed": 0}, {"grid": "tiny", "seed": 3}]


def _write_tiny_layers(path, *, threads: int) -> None:
    """A CPU layer file of the layers-tiny grid as 'hetauto profile --layers' writes it, with made-up times."""
    from hetauto_megatron.measure.grids import LAYER_GRIDS, layer_shapes
    header = {"format": PROFILE_FORMAT, "granularity": "layer", "feature_version": F.FEATURE_VERSION,
              "device_type": "cpu", "vendor": "cpu", "peak_tflops": 0.128, "hbm_gbps": 20.0, "torch_device": "cpu",
              "dtype": "float32", "dtype_bytes": 4, "grids": [{"grid": "layers-tiny", "seed": 0}],
              "threads": threads, "tf32": False, "timing": "wall clock", "layer_impl": "torch",
              "attention": "unfused"}
    rows = [{"key": sh.key(), "model": name, "layer": sh.to_dict(), "fwd_s": 1e-4 * (1 + i), "bwd_s": 2e-4 * (1 + i),
             "reps": 7} for i, (name, sh) in enumerate(layer_shapes(LAYER_GRIDS["layers-tiny"]))]
    path.write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in [header] + rows))


def test_fit_refuses_cpu_layers_and_operators_of_different_thread_counts(tmp_path, capsys):
    """Operators timed with 1 thread and layers with 2 were fitted together without a word: the composition
    learned the second thread's speed-up as the layer's own. Refused naming both files; the same count fits."""
    ops, layers = tmp_path / "profile-cpu.jsonl", tmp_path / "layers-cpu.jsonl"
    write_tiny_profile(ops, threads=1)
    _write_tiny_layers(layers, threads=2)
    rc, _, err = run_cli(["fit", str(ops), str(layers), "-o", str(tmp_path / "m"), "--holdout", "0"], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert f"{layers}: field 'threads': layers were timed with threads 2" in err and f"{ops} with threads 1" in err
    assert "Fix: re-measure one file with the other's thread count" in err and "--threads 1" in err, err
    assert not (tmp_path / "m").exists()
    _write_tiny_layers(layers, threads=1)
    rc, _, err = run_cli(["fit", str(ops), str(layers), "-o", str(tmp_path / "m"), "--holdout", "0"], capsys)
    assert rc == 0, err


def test_fit_holdout_of_one_or_more_says_how_to_fix_it(tmp_path, capsys):
    prof = tmp_path / "profile-cpu.jsonl"
    write_tiny_profile(prof)
    rc, _, err = run_cli(["fit", str(prof), "-o", str(tmp_path / "m"), "--holdout", "1.5"], capsys)
    assert rc == 2 and "field '--holdout': must be in [0, 1), got 1.5" in err
    assert "Fix:" in err and "--holdout 0.2" in err


@pytest.mark.parametrize("share, needle", [
    ("0.995", "holds out 52 of the 52 shapes, which leaves 0 measurements to train on"),
    ("0.005", "holds out none of the 52 shapes"),
])
def test_fit_refuses_a_holdout_that_leaves_no_held_out_report(tmp_path, capsys, share, needle):
    """A share that holds out every shape (nothing to train on) or none (nothing to report) used to fit with
    exit 0 and leave the held-out report out without a word."""
    prof = tmp_path / "profile-cpu.jsonl"
    write_tiny_profile(prof)
    assert len(with_unfused_attention(grid_ops(GRIDS["tiny"], 0), True)) == 52
    rc, out, err = run_cli(["fit", str(prof), "-o", str(tmp_path / "m"), "--holdout", share], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert needle in err and "field '--holdout'" in err and "Fix:" in err and "--holdout 0" in err
    assert not (tmp_path / "m" / "manifest.json").exists()      # refused before fitting


@pytest.mark.parametrize("flag, value, fix", [
    ("--iters", "0", "--iters 5"), ("--max-size-mib", "0", "--max-size-mib 64"),
    ("--connections", "0", "--connections 8"), ("--timeout", "0", "--timeout 60"),
])
def test_probe_link_bad_numbers_say_how_to_fix_them(capsys, flag, value, fix):
    rc, _, err = run_cli(["probe-link", "--local", flag, value], capsys)
    assert rc == 2 and f"field '{flag}': must be" in err
    assert "Fix:" in err and fix in err


# ---- validate-cost-model --dryrun ------------------------------------------------------------------------
@pytest.fixture
def dryrun_inputs(tmp_path):
    """(report, plan carrying its inventory, plan without one, inventory file): a report as 'hetauto dryrun
    --json' writes it (the shape it ran, its cores, its iteration time) of the tiny 2-cluster plan."""
    from hetauto_megatron.plan.plan import load_plan
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"iteration_s": 0.25, "step_times_s": [0.3, 0.25, 0.25], "cores": 6,
                                  "model": load_plan(TINY_PLAN).model.to_dict()}))
    inv = tmp_path / "inventory.yaml"
    inv.write_text(cpu_inventory())
    plan = yaml.safe_load(open(TINY_PLAN))
    plan["inventory"] = yaml.safe_load(cpu_inventory())
    with_inv = tmp_path / "plan-with-inventory.yaml"
    with_inv.write_text(yaml.safe_dump(plan))
    return str(report), str(with_inv), TINY_PLAN, str(inv)


def test_dryrun_validation_defaults_to_the_plans_inventory(dryrun_inputs, capsys):
    report, with_inv, _, inv = dryrun_inputs
    rc, out, err = run_cli(["validate-cost-model", "--dryrun", report, with_inv, "--json"], capsys)
    assert rc == 0, err
    stored = json.loads(out)["dryruns"]["rows"][0]
    rc, out, err = run_cli(["validate-cost-model", "--dryrun", report, with_inv, "--inventory", inv, "--json"],
                           capsys)
    assert rc == 0, err
    assert stored["predicted_s"] == json.loads(out)["dryruns"]["rows"][0]["predicted_s"] > 0   # the same inventory


def test_dryrun_validation_help_says_inventory_is_optional(capsys):
    with pytest.raises(SystemExit) as exc:
        run_cli(["validate-cost-model", "--help"], capsys)
    assert exc.value.code == 0
    assert "the one stored in each plan" in " ".join(capsys.readouterr().out.split())


def test_dryrun_plan_without_inventory_needs_one(dryrun_inputs, capsys):
    report, _, bare, _ = dryrun_inputs
    rc, _, err = run_cli(["validate-cost-model", "--dryrun", report, bare], capsys)
    assert rc == 2 and f"{bare}: field 'inventory'" in err and "needs the inventory" in err
    assert "Fix:" in err and "--inventory" in err


def test_dryrun_report_that_is_another_json_file_is_named_so(dryrun_inputs, tmp_path, capsys):
    """A profile summary ('hetauto profile --json') passed as the report: not 'iteration_s: None'."""
    _, with_inv, _, _ = dryrun_inputs
    summary = tmp_path / "prof.json"
    summary.write_text(json.dumps({"file": "p/profile-cpu.jsonl", "device_type": "cpu", "grid": "tiny",
                                   "granularity": "op", "operators": 46, "measured_now": 46, "resumed": 0,
                                   "seconds": 1.74}))
    rc, _, err = run_cli(["validate-cost-model", "--dryrun", str(summary), with_inv], capsys)
    assert rc == 2 and f"{summary}: field '--dryrun': is not a dry-run report" in err, err
    assert "iteration_s: None" not in err and "hetauto dryrun" in err and "Fix:" in err


def test_dryrun_mismatched_inventory_names_the_inventory_file(dryrun_inputs, tmp_path, capsys):
    report, with_inv, _, _ = dryrun_inputs
    small = tmp_path / "small-inventory.yaml"
    small.write_text(cpu_inventory(a=2, b=2))     # cluster-a has 2 devices, the plan's mesh there uses 4
    rc, _, err = run_cli(["validate-cost-model", "--dryrun", report, with_inv, "--inventory", str(small)], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert str(small) in err and with_inv in err and "which has 2" in err and "Fix:" in err


@pytest.mark.parametrize("kind", ["plan", "inventory"])
def test_published_table_that_is_another_file_is_named_so(dryrun_inputs, capsys, kind):
    _, with_inv, _, inv = dryrun_inputs
    path = with_inv if kind == "plan" else inv
    rc, _, err = run_cli(["validate-cost-model", f"--published={path}"], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert f"it looks like a{'n' if kind == 'inventory' else ''} {kind} file" in err and path in err
    assert "source version" not in err and "not a published-runs table" in err and "Fix:" in err


def test_a_dryrun_report_of_one_step_is_not_an_iteration_time(dryrun_inputs, capsys):
    """A dry run of one step timed only that step, the first, which the memory measurement slows (4x on the tiny
    plan): its iteration_s is refused as the measured iteration, naming the report's 'steps'."""
    report, with_inv, _, _ = dryrun_inputs
    data = json.loads(open(report).read())
    data.update(steps=[{"loss": 5.5, "grad_norm": 1.0}], step_times_s=[0.4], iteration_s=0.4)
    with open(report, "w") as f:
        json.dump(data, f)
    rc, _, err = run_cli(["validate-cost-model", "--dryrun", report, with_inv], capsys)
    assert rc == 2 and f"{report}: field 'steps'" in err and "--steps" in err


@pytest.mark.parametrize("argv, field", [
    (["--steps", "1", "--timeline", "t.png", "--compare"], "--steps"),
    (["--seed", "99999999999999999999"], "--seed"),
    (["--seed", "-1"], "--seed"),
    # a billion steps ran for ever; 10^400 ended in an OverflowError traceback (the run's deadline)
    (["--steps", "1000000000"], "--steps"),
    (["--steps", "1" + "0" * 400], "--steps"),
    # every rank's wait overflowed C's int (exit 1, "6 rank(s) failed: OverflowError")
    (["--timeout", "1e300"], "--timeout"),
])
def test_dryrun_refuses_before_starting_a_rank(argv, field, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(["dryrun", "--plan", TINY_PLAN, "--tiny", *argv], capsys)
    assert rc == 2 and f"field '{field}'" in err and "Traceback" not in err, err


def test_dryrun_names_the_plan_for_a_cluster_the_inventory_lacks(capsys, tmp_path, monkeypatch):
    """The plan's mesh names a cluster another inventory lacks: the paragraph names the plan file, whose field
    meshes[0].cluster it is (it named the --inventory file), as explain and simulate do."""
    monkeypatch.chdir(tmp_path)
    inv = os.path.join(ROOT, "examples", "llama", "inventory-cpu-dryrun.yaml")
    rc, _, err = run_cli(["dryrun", "--plan", TINY_PLAN, "--tiny", "--inventory", inv, "--timeline", "t.png",
                          "--compare"], capsys)
    assert rc == 2 and f"{TINY_PLAN}: field 'meshes[0].cluster'" in err and "Traceback" not in err, err
    assert f"the inventory {inv} does not have" in err, err


def test_an_output_may_not_overwrite_a_file_of_an_input_folder(tmp_path):
    """A learned cost model is a folder (--cost-model DIR): `dryrun --timeline DIR/manifest.json` wrote a trace over
    the model's manifest. Another file there (a timeline written there before) is not the model's."""
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.outputs import refuse_overwriting_inputs
    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.json").write_text("{}")
    with pytest.raises(InputError) as exc:
        refuse_overwriting_inputs([("--timeline", str(model / "manifest.json"))], [("--cost-model", str(model))])
    assert exc.value.field == "--timeline" and "--cost-model" in str(exc.value)
    (model / "trace.json").write_text("{}")
    refuse_overwriting_inputs([("--timeline", str(model / "trace.json"))], [("--cost-model", str(model))])


def _published_table(tmp_path, edit) -> str:
    """The packaged published-runs table with `edit(data)` applied, written to a file of its own."""
    from hetauto_megatron.plan.calibration import TABLE
    data = yaml.safe_load(open(TABLE))
    edit(data)
    path = tmp_path / "published.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _sources(data):
    return [k for k, v in data.items() if isinstance(v, dict) and "rows" in v]


def _keep_one_row(data):
    first, *rest = _sources(data)
    data[first]["rows"] = data[first]["rows"][:1]
    for k in rest:
        del data[k]


@pytest.mark.parametrize("edit, field", [
    (_keep_one_row, "rows"),                                                      # leave-one-out divided by 0
    (lambda d: d[_sources(d)[0]]["rows"][0].update(batch=10 ** 12), ".rows[0].batch"),     # MemoryError
    (lambda d: d[_sources(d)[0]]["rows"][0].update(tflops_per_gpu=float("nan")), ".rows[0].tflops_per_gpu"),
    (lambda d: d[_sources(d)[0]]["rows"][0].update(tp=3), ".rows[0].gpus"),       # 2 GPUs silently dropped
    (lambda d: d[_sources(d)[0]]["rows"][0].update(speed=1), ".rows[0].speed"),   # silently ignored
    (lambda d: d[_sources(d)[0]].update(device="nosuch"), ".device"),           # named no file
])
def test_a_published_table_that_cannot_be_validated_is_named(tmp_path, capsys, edit, field):
    """validate-cost-model --published=FILE on a table of one run crashed (ZeroDivisionError), on a batch of 1e12
    ran out of memory, and took a NaN throughput, a TP that does not divide the GPUs and an unknown key without a
    word: each is refused naming the row's field."""
    path = _published_table(tmp_path, edit)
    rc, out, err = run_cli(["validate-cost-model", f"--published={path}"], capsys)
    assert rc == 2 and "Traceback" not in err and "nan" not in out.lower(), err
    assert path in err and "Fix:" in err and f"{field}'" in err, err


@pytest.mark.parametrize("edit", [
    lambda d: d.update({m: {g: {"x": v for v in per_mb.values()} for g, per_mb in d[m].items()} for m in list(d)[:1]}),
    lambda d: d.update({m: [] for m in list(d)[:1]}),
])
def test_sailor_profiles_not_laid_out_as_sailors_are_named(tmp_path, capsys, edit):
    """`fit --sailor DIR` with a profiles_tmp.json whose micro-batch key is not a number, or whose model entry is a
    list, crashed (ValueError, AttributeError): refused naming the file and the layout it expects."""
    import shutil

    from hetauto_megatron import data as packaged
    src = pathlib.Path(packaged.__path__[0]) / "sailor"
    shutil.copytree(src, tmp_path / "sailor")
    profiles = tmp_path / "sailor" / "profiles_tmp.json"
    d = json.loads(profiles.read_text())
    edit(d)
    profiles.write_text(json.dumps(d))
    rc, _, err = run_cli(["fit", f"--sailor={tmp_path / 'sailor'}", "-o", str(tmp_path / "model")], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert str(profiles) in err and "profiles_tmp.json" in err and "Fix:" in err


def test_a_profile_of_a_header_alone_is_refused_not_fitted_to_nan(tmp_path, capsys):
    """A profile whose run was stopped before its first operator (the header alone) was fitted to NaN errors,
    written into --json and the model's manifest as bare NaN (not JSON)."""
    path = tmp_path / "profile.jsonl"
    write_tiny_profile(path, rows=0)
    rc, out, err = run_cli(["fit", str(path), "-o", str(tmp_path / "model"), "--json"], capsys)
    assert rc == 2 and "NaN" not in out and "Traceback" not in err, err
    assert str(path) in err and "no measured operators" in err


def test_a_dry_run_timeout_too_short_to_connect_names_the_flag():
    """--timeout 0.001: the local ranks cannot connect in time. The paragraph named HETAUTO_WORLD_SIZE and told to
    start the launch scripts with NODE_RANK and HETAUTO_MASTER_ADDR, none of which a local dry run has; and ahead of
    it torch's C++ layer logged every rank's failed connection with a native stack trace (over 100 lines), which
    only the command's own stderr shows (a fresh interpreter, as a user starts it)."""
    run = subprocess.run([sys.executable, "-m", "hetauto_megatron.cli", "dryrun", "--plan", TINY_PLAN, "--tiny",
                          "--timeout", "0.001", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=240,
                         env={k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"})
    err = run.stderr
    assert run.returncode == 2 and len(err.strip().splitlines()) == 1, err[-2000:]
    assert "'--timeout'" in err and "HETAUTO_MASTER_ADDR" not in err and "NODE_RANK" not in err, err
    assert json.loads(run.stdout)["error"]["field"] == "--timeout"


def test_a_command_called_from_python_leaves_torchs_log_level_as_it_was(capsys, monkeypatch):
    """dryrun quiets torch's C++ log (TORCH_CPP_LOG_LEVEL) for its own process; called from Python (cli.main with a
    list) it left the variable set, so every process the caller started later (a test's fresh interpreter) logged
    nothing of what that test checks the absence of, whatever the code under test did."""
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    rc, out, err = run_cli(["dryrun", "--plan", TINY_PLAN, "--steps", "0"], capsys)     # refused: set, then left
    assert rc == 2 and "--steps" in err, err
    assert "TORCH_CPP_LOG_LEVEL" not in os.environ
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")       # a caller's own level stays too
    run_cli(["dryrun", "--plan", TINY_PLAN, "--steps", "0"], capsys)
    assert os.environ["TORCH_CPP_LOG_LEVEL"] == "INFO"
