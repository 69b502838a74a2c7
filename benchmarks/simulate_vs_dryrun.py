"""The simulator, fed the learned CPU cost model, against measured CPU dry-run iteration times.

1. Profile this CPU (`hetauto profile --quick`, reused when the file exists) and fit the learned model
   (or reuse --cost-model DIR).
2. For each plan (default: the two small CPU plans in examples/llama/plans/cpu-small-*.yaml, on
   examples/llama/inventory-cpu-dryrun.yaml): `hetauto dryrun` on the FULL model shape (no --tiny), measured
   iteration time = median over the steps after the first, on the slowest rank.
3. `simulate(plan, inventory, cost_model)` with the learned model, and with the analytic model for reference.
   Prints predicted vs measured and the error (target: learned within 25 %).

Oversubscription: a dry run starts one process per device of the plan, and this machine may have fewer
cores than that. The profile was measured on one core with one thread (what a rank has when it is alone on
its core). When the plan has more ranks than the machine has cores, the ranks time-share the cores, so each
rank computes `ranks / cores` times slower; the benchmark tells the simulator so by scaling the learned
compute times by that factor (`SharedCoresCostModel`). Communication and optimizer terms are the simulator's
own (inventory links, device memory bandwidth), untouched.

    python benchmarks/simulate_vs_dryrun.py [--workdir DIR] [--cost-model DIR] [--steps N] [--plan FILE ...]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hetauto_megatron.cost import learned as L  # noqa: E402
from hetauto_megatron.cost.analytic import AnalyticCostModel  # noqa: E402
from hetauto_megatron.plan.plan import load_plan  # noqa: E402
from hetauto_megatron.plan.simulate import simulate  # noqa: E402
from hetauto_megatron.spec.inventory import load_inventory  # noqa: E402

PLANS = [os.path.join(ROOT, "examples", "llama", "plans", f) for f in ("cpu-small-pp2.yaml", "cpu-small-tp2.yaml")]
INVENTORY = os.path.join(ROOT, "examples", "llama", "inventory-cpu-dryrun.yaml")


class SharedCoresCostModel:
    """A cost model whose compute times are stretched by `factor`: ranks time-sharing fewer cores."""

    def __init__(self, base, factor: float):
        self.base, self.factor = base, factor
        self.name = base.name

    def source(self, device):
        return self.base.source(device)

    def _scaled(self, fn, *a):
        f, b = fn(*a)
        return f * self.factor, b * self.factor

    def layer_times(self, *a):
        return self._scaled(self.base.layer_times, *a)

    def head_times(self, *a):
        return self._scaled(self.base.head_times, *a)

    def embedding_times(self, *a):
        return self._scaled(self.base.embedding_times, *a)

    def recompute_time(self, *a):
        return self.base.recompute_time(*a) * self.factor


def _cpu_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    return sum(v), v[3] + v[4]          # total, idle + iowait


def idle_share(seconds: float = 1.0) -> float:
    """Share of the machine's CPU time that was idle over `seconds` (1.0 when /proc/stat is missing)."""
    try:
        t0, i0 = _cpu_jiffies()
        time.sleep(seconds)
        t1, i1 = _cpu_jiffies()
    except OSError:
        return 1.0
    return (i1 - i0) / max(t1 - t0, 1)


def wait_quiet(max_wait_s: float, threshold: float = 0.9) -> float:
    """Wait (up to max_wait_s) until the machine is mostly idle: a dry run's wall time measures the whole
    machine, so neighbours' work would count as ours. Returns the idle share seen last."""
    deadline = time.monotonic() + max_wait_s
    share = idle_share()
    while share < threshold and time.monotonic() < deadline:
        share = idle_share(2.0)
    return share


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def fitted_model(workdir: str, fresh: bool) -> str:
    from hetauto_megatron.cost.profile import profile, stderr_progress
    from hetauto_megatron.spec.devices import get_device
    prof = os.path.join(workdir, "profile-cpu.jsonl")
    if fresh and os.path.exists(prof):
        os.remove(prof)
    t = time.perf_counter()
    s = profile(get_device("cpu"), prof, grid="quick-cpu", progress=stderr_progress)
    print(f"profile: {s['operators']} operators ({s['measured_now']} measured now) in {time.perf_counter() - t:.1f} s")
    model_dir = os.path.join(workdir, "model-cpu")
    res = L.fit([prof], model_dir, holdout=0.2)
    print(f"fit: {res.rows} rows -> {model_dir}, held-out operator MAPE {res.heldout['all']['mape_pct']:.2f} %")
    return model_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=os.path.join(ROOT, "out", "learned_cost"))
    ap.add_argument("--cost-model", help="reuse a fitted model directory instead of profiling and fitting")
    ap.add_argument("--fresh", action="store_true", help="re-profile instead of reusing the profile file")
    ap.add_argument("--steps", type=int, default=6, help="dry-run steps per plan (the first is not timed)")
    ap.add_argument("--plan", action="append", help="plan file (repeatable; default: the two cpu-small plans)")
    ap.add_argument("--inventory", default=INVENTORY)
    ap.add_argument("--max-wait", type=float, default=180.0,
                    help="seconds to wait for an idle machine before each dry run (default 180)")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    model_dir = args.cost_model or fitted_model(args.workdir, args.fresh)
    learned = L.LearnedCostModel(model_dir)
    analytic = AnalyticCostModel()
    inv = load_inventory(args.inventory)
    cores = usable_cores()

    from hetauto_megatron.runtime.dryrun import run_dryrun
    rows = []
    for path in args.plan or PLANS:
        plan = load_plan(path)
        factor = max(1.0, plan.world_size / cores)
        est = simulate(plan, inv, SharedCoresCostModel(learned, factor))
        est_a = simulate(plan, inv, SharedCoresCostModel(analytic, factor))
        quiet = wait_quiet(args.max_wait)
        rep = run_dryrun(plan, steps=args.steps, seed=1234, tiny=False, reference=False, timeout_s=300,
                         plan_file=path)
        if "error" in rep:
            print(f"{os.path.basename(path)}: the dry run failed:\n{rep['error']}")
            return 1
        meas = rep["iteration_s"]
        rows.append((os.path.basename(path), plan.world_size, factor, meas, min(rep["step_times_s"][1:] or
                                                                              rep["step_times_s"]), est, est_a))
        print(f"{os.path.basename(path)}: machine {100 * quiet:.0f} % idle before, {100 * idle_share():.0f} % after; "
              f"steps {', '.join(f'{t:.3f}' for t in rep['step_times_s'])} s; "
              f"simulated pipeline {est.pipeline_s:.3f} s + DP/optimizer tail "
              f"{est.iteration_time_s - est.pipeline_s:.3f} s; cost model {est.cost_model}")
    print(f"\n{cores} usable cores; compute stretched by max(1, ranks / cores)")
    print("measured: median over the steps after the first (what 'hetauto dryrun' reports); best: their fastest")
    print(f"{'plan':<26} {'ranks':>5} {'x':>4} {'measured s':>11} {'best s':>7} {'learned s':>10} {'error %':>8} "
          f"{'vs best %':>9} {'analytic s':>11} {'error %':>8}")
    worst = 0.0
    for name, ranks, factor, meas, best, est, est_a in rows:
        e = 100 * (est.iteration_time_s - meas) / meas
        eb = 100 * (est.iteration_time_s - best) / best
        ea = 100 * (est_a.iteration_time_s - meas) / meas
        worst = max(worst, abs(e))
        print(f"{name:<26} {ranks:>5} {factor:>4.1f} {meas:>11.3f} {best:>7.3f} {est.iteration_time_s:>10.3f} "
              f"{e:>8.1f} {eb:>9.1f} {est_a.iteration_time_s:>11.3f} {ea:>8.1f}")
    print(f"worst learned error vs measured {worst:.1f} % (target <= 25 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
