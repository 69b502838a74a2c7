"""The dry run measures its iteration time (what the simulator is checked against), and the simulator answers
for the small CPU plans with the learned model when one covers 'cpu'."""
import json
import os

import pytest

from helpers import ROOT

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

PLANS = os.path.join(ROOT, "examples", "llama", "plans")


def test_dryrun_json_reports_step_times_and_iteration_time(tiny_dryrun_json):
    rep = json.loads(tiny_dryrun_json)
    times = rep["step_times_s"]
    assert len(times) == 3 and all(t > 0 for t in times)
    # the median of the steps after the first (the first pays for warm-up)
    assert rep["iteration_s"] == pytest.approx(sorted(times[1:])[0] / 2 + sorted(times[1:])[1] / 2)
    assert rep["iteration_s"] < rep["seconds"]


@pytest.mark.parametrize("name", ["cpu-small-pp2", "cpu-small-pp2-uneven", "cpu-small-tp2", "cpu-small-tp2-dp2"])
def test_small_cpu_plans_simulate_with_the_learned_model(name, tiny_cpu_model):
    from hetauto_megatron.cost.learned import load_cost_model
    from hetauto_megatron.plan.plan import load_plan
    from hetauto_megatron.plan.simulate import simulate
    from hetauto_megatron.spec.inventory import load_inventory
    plan = load_plan(os.path.join(PLANS, f"{name}.yaml"))
    inv = load_inventory(os.path.join(ROOT, "examples", "llama", "inventory-cpu-dryrun.yaml"))
    est = simulate(plan, inv, load_cost_model(str(tiny_cpu_model[1])))
    assert est.cost_model == {"cpu": "learned"} and est.fits
    # the plans are sized so that compute dominates: a learned CPU step is far above the transfer times
    assert est.iteration_time_s > 10 * max(s["send_next_s"] for s in est.stages)


def test_a_learned_model_with_trees_prices_in_forked_workers(tiny_cpu_model, tmp_path):
    """A fitted model whose boosters are kept (20 rounds) in `hetauto plan --explain --workers 2`: the command's own
    predictions started LightGBM's OpenMP team (torch's libgomp, one per process), which is not fork-safe, and the
    forked what-if workers hung in their first prediction until killed; the predictions are single-threaded now."""
    import subprocess
    import sys

    from hetauto_megatron.cost.learned.fitting import fit
    out = tmp_path / "model"
    fit([str(tiny_cpu_model[0])], str(out), holdout=0.0, rounds=20)
    assert any(p.suffix == ".txt" for p in out.iterdir()), list(out.iterdir())      # the boosters are kept
    r = subprocess.run([sys.executable, "-m", "hetauto_megatron.cli", "plan", "--model", "tiny", "--inventory",
                        os.path.join(ROOT, "examples", "llama", "inventory-cpu-dryrun.yaml"), "--global-batch-size",
                        "8", "--cost-model", str(out), "--workers", "2", "--explain"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, start_new_session=True)
    assert r.returncode == 0 and "re-planned" in r.stderr, r.stderr[-2000:]
