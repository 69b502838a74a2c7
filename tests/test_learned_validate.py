"""`hetauto validate-cost-model --dryrun REPORT PLAN`: a real (tiny) dry run's measured iteration time against the
simulator's prediction for the model shape the dry run ran."""
import json

import pytest
from conftest import TINY_PLAN
from helpers import CPU_INVENTORY

from hetauto_megatron.cli import main
from hetauto_megatron.plan.plan import load_plan
from hetauto_megatron.plan.simulate import simulate
from hetauto_megatron.runtime.dryrun import prepare_plan
from hetauto_megatron.spec.inventory import load_inventory

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

PLAN = TINY_PLAN


@pytest.fixture(scope="module")
def dryrun(tmp_path_factory, tiny_dryrun_json):
    """One real --tiny dry run of the 2-cluster plan (6 ranks), its --json report written as a user would."""
    d = tmp_path_factory.mktemp("validate")
    inv = d / "inventory.yaml"
    inv.write_text(CPU_INVENTORY)
    report = json.loads(tiny_dryrun_json)
    # `hetauto dryrun --json` names the shape its ranks ran (the shrunk one under --tiny) ...
    assert report["model"]["hidden_size"] == tiny_plan().model.hidden_size and report["cores"] >= 1
    (d / "report.json").write_text(tiny_dryrun_json)
    # ... but a report written by hand or by another tool may not: the tests below use such an unnamed report
    # (and `with_model` to name it), so both paths are covered.
    del report["model"]
    rep = d / "report-unnamed.json"
    rep.write_text(json.dumps(report))
    return d, str(rep), str(inv)


def tiny_plan():
    return prepare_plan(load_plan(PLAN), tiny=True)


def run_json(argv, capsys):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def with_model(d, rep, model):
    """The report with the "model" entry the runtime writes (runtime/dryrun.py: the shape the ranks ran)."""
    data = json.loads(open(rep).read())
    data["model"] = model.to_dict()
    path = d / f"report-{model.name}-{model.hidden_size}-{model.seq_length}.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_tiny_dryrun_compared_with_the_shrunk_models_prediction(dryrun, capsys):
    d, rep, inv = dryrun
    measured = json.loads(open(rep).read())["iteration_s"]
    res = run_json(["validate-cost-model", "--inventory", inv, "--dryrun", rep, PLAN, "--tiny", "--cores", "2"],
                   capsys)
    assert "rows" not in res and set(res) == {"dryruns"}      # no operator rows were asked for
    row, = res["dryruns"]["rows"]
    plan = tiny_plan()
    # The --tiny run shrank the model (sequence 32 -> 16): the prediction is for what ran, not the plan's model.
    assert (row["hidden_size"], row["seq_length"]) == (plan.model.hidden_size, plan.model.seq_length)
    assert row["seq_length"] != load_plan(PLAN).model.seq_length
    assert row["ranks"] == 6 and row["stretch"] == 3.0 and row["measured_s"] == measured
    assert row["error_pct"] == pytest.approx(100 * (row["predicted_s"] - measured) / measured)
    assert res["dryruns"]["summary"] == {"rows": 1, "mape_pct": round(abs(row["error_pct"]), 2)}
    assert row["cost_model"] == {"cpu": "analytic"}


def test_report_naming_its_model_needs_no_flag(dryrun, capsys):
    d, rep, inv = dryrun
    named = with_model(d, rep, tiny_plan().model)
    a = run_json(["validate-cost-model", "--inventory", inv, "--dryrun", named, PLAN, "--cores", "2"], capsys)
    b = run_json(["validate-cost-model", "--inventory", inv, "--dryrun", rep, PLAN, "--tiny", "--cores", "2"], capsys)
    assert a["dryruns"]["rows"][0]["predicted_s"] == b["dryruns"]["rows"][0]["predicted_s"]
    # the plan's own (unshrunk) shape predicts something else: the shape matters
    full = run_json(["validate-cost-model", "--inventory", inv, "--dryrun", rep, PLAN, "--no-tiny", "--cores", "2"],
                    capsys)
    assert full["dryruns"]["rows"][0]["seq_length"] == 32
    assert full["dryruns"]["rows"][0]["predicted_s"] != a["dryruns"]["rows"][0]["predicted_s"]


def test_repeated_pairs_and_text_table(dryrun, capsys):
    d, rep, inv = dryrun
    named = with_model(d, rep, tiny_plan().model)
    argv = ["validate-cost-model", "--inventory", inv, "--dryrun", named, PLAN, "--dryrun", named, PLAN,
            "--cores", "6"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("tiny-2clusters-cpu.yaml") == 2 and "MAPE over 2 dry run(s)" in out
    res = run_json(argv, capsys)
    assert [r["stretch"] for r in res["dryruns"]["rows"]] == [1.0, 1.0]     # 6 ranks on 6 cores: no stretch


def test_learned_model_shown_next_to_analytic(dryrun, tiny_cpu_model, capsys):
    d, rep, inv = dryrun
    capsys.readouterr()
    res = run_json(["validate-cost-model", "--cost-model", str(tiny_cpu_model[1]), "--inventory", inv,
                    "--dryrun", rep, PLAN, "--tiny", "--cores", "2"], capsys)
    row = res["dryruns"]["rows"][0]
    assert res["dryruns"]["cost_model"] == "learned" and row["cost_model"] == {"cpu": "learned"}
    assert row["predicted_s"] != row["analytic_s"]
    assert row["analytic_error_pct"] == pytest.approx(100 * (row["analytic_s"] - row["measured_s"]) / row["measured_s"])
    assert set(res["dryruns"]["summary"]) == {"rows", "mape_pct", "analytic_mape_pct"}


def test_fp32_cpu_memory_and_transfers_use_four_bytes(dryrun):
    """The dry run trains in fp32: the simulated cpu plan sizes weights, gradients, Adam state and pipeline
    sends at 4 bytes per element (docs/cost-model.md, 'Precision')."""
    from hetauto_megatron.cost.memory import stage_memory_bytes
    from hetauto_megatron.spec.devices import get_device
    _, _, inv = dryrun
    assert get_device("cpu").dtype_bytes == 4 and get_device("h800").dtype_bytes == 2
    from hetauto_megatron.plan.settings import default_settings
    m = tiny_plan().model.replace(vocab_size=tiny_plan().padded_vocab_size)   # the table that runs
    kw = dict(layers=3, tp=2, dp=1, micro_batch_size=2, recompute="none", in_flight=3, first=True, last=False,
              settings=default_settings(2))
    fp32, bf16 = stage_memory_bytes(m, dtype_bytes=4, **kw), stage_memory_bytes(m, dtype_bytes=2, **kw)
    assert fp32["weights_grads_optimizer"] == fp32["params"] * 16        # 4 + 4 + 8 / dp, dp = 1
    assert bf16["weights_grads_optimizer"] == bf16["params"] * 18        # 2 + 4 + 12 / dp
    # Activations in the training precision double; dropout masks (1 byte) and token ids (int64) do not.
    assert bf16["activations"] < fp32["activations"] < 2 * bf16["activations"]
    # the simulator's first stage (cluster-a: 3 layers, TP 2; 3 of 4 micro-batches in flight) is that fp32 figure
    # with the layers CPU processes run: Megatron's local spec, as the dry run predicts them (plan/memory_fit.py)
    from hetauto_megatron.cost.activations import DRY_RUN_IMPL
    run = stage_memory_bytes(m, dtype_bytes=4, impl=DRY_RUN_IMPL, **kw)
    assert run["activations"] > fp32["activations"]           # it keeps the softmax output and more
    est = simulate(tiny_plan(), load_inventory(inv))
    reserved = 0.5 * 1024 ** 3
    assert est.memory_gib[0] * 1024 ** 3 == pytest.approx(run["total"] - run["reserved"] + reserved)


@pytest.mark.parametrize("case, needle", [
    ("missing", "dry-run report not found"),
    ("not-json", "is not valid JSON"),
    ("no-time", "no positive measured iteration time"),
    # a time no dry run measures: its error overflowed to -Infinity / Infinity in --json (not strict JSON)
    ("huge-time", "no dry run's iteration time"),
    ("tiny-time", "no dry run's iteration time"),
    ("no-model", "does not say which model shape"),
    ("contradicts", "contradicts the report"),
    ("other-plan", "report is of another plan"),
    ("other-ranks", "the dry run ran 6 ranks, but"),
    ("other-layout", "rank 0 of the dry run ran mesh 0 at TP 2, DP 1"),
    ("gpu-plan", "a dry run measures CPU processes"),
    ("no-inventory", "needs the inventory"),
    ("inventory-alone", "only applies to --dryrun"),
])
def test_bad_dryrun_inputs_exit_2(dryrun, tmp_path, capsys, case, needle):
    d, rep, inv = dryrun
    named = with_model(d, rep, tiny_plan().model)
    plan, extra = PLAN, []
    if case == "missing":
        rep = str(tmp_path / "nowhere.json")
    elif case == "not-json":
        (tmp_path / "r.json").write_text("loss 4.8\n")
        rep = str(tmp_path / "r.json")
    elif case == "no-time":
        (tmp_path / "r.json").write_text(json.dumps({"error": "rank 3 died"}))
        rep = str(tmp_path / "r.json")
    elif case in ("huge-time", "tiny-time"):
        (tmp_path / "r.json").write_text(json.dumps(dict(json.load(open(rep)), iteration_s=1e308 if case ==
                                                         "huge-time" else 5e-324)))
        rep = str(tmp_path / "r.json")
    elif case == "contradicts":
        rep, extra = named, ["--no-tiny"]
    elif case == "other-plan":
        rep = with_model(tmp_path, rep, tiny_plan().model.replace(name="six", num_layers=6))
    elif case in ("other-ranks", "other-layout"):
        # a 2-rank plan of the same model (each mesh TP 1, DP 1), or the same 6 ranks laid out TP 1 x DP 2 first:
        # the report (of the 6-rank TP 2 plan) names the model it ran, which these plans share
        text = open(PLAN).read()
        text = (text.replace("tp: 2, dp: 1, micro_batch_size: 2, recompute: none, stage_layers: [3, 2]",
                             "tp: 1, dp: 1, micro_batch_size: 2, recompute: none, stage_layers: [5]")
                .replace("tp: 1, dp: 2, micro_batch_size: 1", "tp: 1, dp: 1, micro_batch_size: 2")
                if case == "other-ranks" else
                text.replace("tp: 2, dp: 1, micro_batch_size: 2", "tp: 1, dp: 2, micro_batch_size: 1"))
        (tmp_path / "p2.yaml").write_text(text)
        rep, plan = str(d / "report.json"), str(tmp_path / "p2.yaml")
    elif case == "gpu-plan":
        text = open(PLAN).read().replace("device_type: cpu", "device_type: h800")
        (tmp_path / "p.yaml").write_text(text)
        rep, plan = named, str(tmp_path / "p.yaml")
    argv = ["validate-cost-model", "--dryrun", rep, plan, "--inventory", inv] + extra
    if case == "no-inventory":
        argv = ["validate-cost-model", "--dryrun", named, plan]
    elif case == "inventory-alone":
        argv = ["validate-cost-model", "--cost-model", "x", "--profile", "y", "--inventory", inv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    if case in ("other-ranks", "other-layout"):
        assert rep in err and plan in err, err       # both files named


def test_published_runs_in_sample_and_held_out(tmp_path, capsys):
    """`validate-cost-model --published`: every packaged published run with the analytic model's error in sample
    and with the constants fitted without it; the held-out errors are the published rows' (recomputed here from
    the printed times), within the targets (MAPE <= 12 %, worst <= 20 %)."""
    res = run_json(["validate-cost-model", "--published"], capsys)["published"]
    rows = res["rows"]
    assert len(rows) >= 5 and res["fitted_constants"] == ["gemm_max_efficiency"]
    errs = [100 * (r["held_out_s"] / r["published_s"] - 1) for r in rows]
    assert errs == pytest.approx([r["held_out_error_pct"] for r in rows])
    assert sum(abs(e) for e in errs) / len(errs) <= 12.0 and max(abs(e) for e in errs) <= 20.0
    assert main(["validate-cost-model", "--published"]) == 0
    out = capsys.readouterr().out
    assert "leave one out" in out and "in sample" in out
    assert main(["validate-cost-model", f"--published={tmp_path / 'none.yaml'}"]) == 2
    err = capsys.readouterr().err
    assert "published-runs table not found" in err and "Traceback" not in err


def test_published_summary_reads_as_its_rows(capsys):
    """The printed summary's worst error is the largest error the printed rows show (it read '16.9 %' beside a row
    printing '17.0': the summary was rounded to 0.01 and then printed to 0.1)."""
    assert main(["validate-cost-model", "--published"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.startswith("source_")]
    for column, label in ((7, "in sample"), (9, "leave one out")):
        shown = max(abs(float(r[column])) for r in rows)
        summary = next(line for line in lines if line.startswith(f"analytic, {label}"))
        assert summary.rstrip().endswith(f"worst {shown:.1f} %"), (summary, shown)
