"""The dry run measures its iteration time (what the simulator is checked against), and the simulator answers
for the small CPU plans with the learned model when one covers 'cpu'."""
import json
import os

import pytest

from hetauto_megatron.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANS = os.path.join(ROOT, "examples", "llama", "plans")


def test_dryrun_json_reports_step_times_and_iteration_time(capsys):
    plan = os.path.join(PLANS, "tiny-2clusters-cpu.yaml")
    assert main(["dryrun", "--plan", plan, "--tiny", "--steps", "3", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    times = rep["step_times_s"]
    assert len(times) == 3 and all(t > 0 for t in times)
    # the median of the steps after the first (the first pays for warm-up)
    assert rep["iteration_s"] == pytest.approx(sorted(times[1:])[0] / 2 + sorted(times[1:])[1] / 2)
    assert rep["iteration_s"] < rep["seconds"]


@pytest.fixture(scope="module")
def cpu_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("timing")
    assert main(["profile", "--device-type", "cpu", "--grid", "tiny", "--out", str(d)]) == 0
    assert main(["fit", str(d / "profile-cpu.jsonl"), "-o", str(d / "model"), "--holdout", "0"]) == 0
    return str(d / "model")


@pytest.mark.parametrize("name", ["cpu-small-pp2", "cpu-small-pp2-uneven", "cpu-small-tp2", "cpu-small-tp2-dp2"])
def test_small_cpu_plans_simulate_with_the_learned_model(name, cpu_model):
    from hetauto_megatron.cost.learned import load_cost_model
    from hetauto_megatron.plan.plan import load_plan
    from hetauto_megatron.plan.simulate import simulate
    from hetauto_megatron.spec.inventory import load_inventory
    plan = load_plan(os.path.join(PLANS, f"{name}.yaml"))
    inv = load_inventory(os.path.join(ROOT, "examples", "llama", "inventory-cpu-dryrun.yaml"))
    est = simulate(plan, inv, load_cost_model(cpu_model))
    assert est.cost_model == {"cpu": "learned"} and est.fits
    # the plans are sized so that compute dominates: a learned CPU step is far above the transfer times
    assert est.iteration_time_s > 10 * max(s["send_next_s"] for s in est.stages)
