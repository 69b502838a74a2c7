"""Where the whole-iteration error on Sailor's measured GH200 runs comes from, run by run (a diagnostic of
benchmarks/sailor_iterations.py; docs/cost-model-learned.md, "Micro-batch 1-2, term by term").

For each run the learned model is fitted without the run's model and the run composed as sailor_iterations.py
composes it (DeepSpeed's pipeline, the job's fp32). Two splits, each in % of the measured iteration:
- by piece: how much the prediction moves when one priced piece is replaced by Sailor's own measurement of the
  run's model on the GH200 at the run's TP and micro-batch (in sample, `MeasuredLayers`): the transformer layer's
  forward, its backward, the output head, the embedding. Positive: the learned piece is above the measured one.
  `composition` is the prediction with all four measured, against the measured iteration: what the composition
  itself misses or adds.
- by term of the composition as priced: the P2P sends between stages and the receiving stages' TP all-gathers
  (DeepSpeed's partitioned transfers), the fill/drain bubble (the pipeline's makespan without transfers or
  gathers, less m x the busiest stage's forward + backward), the exposed DP all-reduce, the optimizer step, the
  tail's job-wide terms (global norm) and the fixed per-iteration time.
The MAPE lines give each group's error with each piece replaced (what a perfect price of that piece would give).

    python benchmarks/sailor_iteration_terms.py
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sailor_iterations as S  # noqa: E402
from hetauto_megatron.plan.deepspeed_schedule import simulate_deepspeed  # noqa: E402
from hetauto_megatron.plan.simulate import (_pipeline, deepspeed_passes, padded_model, plan_choices,  # noqa: E402
                                            simulate)

PIECES = ("forward", "backward", "head", "embedding")


class Pieces:
    """The learned model with the pieces named in `measured` taken from Sailor's measurement (MeasuredLayers)."""

    def __init__(self, learned, measured: S.MeasuredLayers, pieces):
        self.learned, self.measured, self.pieces = learned, measured, set(pieces)

    def __getattr__(self, name):
        if name.startswith("__") or name == "learned":    # copy.copy looks these up before __init__ has run
            raise AttributeError(name)
        return getattr(self.learned, name)

    def layer_times(self, *a, **k):
        lf, lb = self.learned.layer_times(*a, **k)
        mf, mb = self.measured.layer_times(*a, **k)
        return (mf if "forward" in self.pieces else lf, mb if "backward" in self.pieces else lb)

    def embedding_times(self, *a, **k):
        return (self.measured if "embedding" in self.pieces else self.learned).embedding_times(*a, **k)

    def head_times(self, *a, **k):
        return (self.measured if "head" in self.pieces else self.learned).head_times(*a, **k)


def composition_terms(plan, inv, cost_model) -> dict:
    """Seconds of each term of the iteration as simulate(..., engine="deepspeed") composes it."""
    e = simulate(plan, inv, cost_model, engine="deepspeed")
    m, choices = plan.num_micro_batches, plan_choices(plan)
    model = padded_model(plan.model, choices)
    pipe = _pipeline(model, inv.with_precision(plan.precision), choices, cost_model, "deepspeed")
    p, links = len(pipe.profs), pipe.links
    passes = [prof.times(n, i == 0, i == p - 1) for i, (prof, n) in enumerate(zip(pipe.profs, plan.stage_layers))]
    fwd, bwd = [f for f, _ in passes], [b for _, b in passes]
    with_gathers = deepspeed_passes(model, pipe.profs, fwd, bwd)
    none = [0.0] * len(links)
    full = simulate_deepspeed(*with_gathers, links, m)[0]
    assert abs(full - e.pipeline_s) <= 1e-9 * max(1.0, full)        # the same makespan as the estimate's
    bare = simulate_deepspeed(fwd, bwd, none, m)[0]
    return {"iteration": e.iteration_time_s,
            "p2p": full - simulate_deepspeed(*with_gathers, none, m)[0],
            "gathers": full - simulate_deepspeed(fwd, bwd, links, m)[0],
            "bubble": bare - m * max(f + b for f, b in zip(fwd, bwd)),
            "dp": e.dp_exposed_s, "optimizer": e.optimizer_s, "sync": e.sync_s,
            "fixed": e.iteration_time_s - e.pipeline_s - e.dp_exposed_s - e.optimizer_s - e.sync_s}


def decompose(workdir: str) -> list[dict]:
    runs = S.load_runs()
    out = []
    for held in sorted({r["model"] for r in runs}):
        cm = S.fit_without(held, os.path.join(workdir, held))
        for r in runs:
            if r["model"] != held or (built := S.run_plan(r)) is None:
                continue
            plan, inv = built
            intra = inv.clusters[0].intra_node
            meas = S.MeasuredLayers(cm, held, {"gh200": "GH-96"}, lambda gpu, tp: intra)
            terms = composition_terms(plan, inv, cm)
            base = terms["iteration"]
            with_piece = {p: simulate(plan, inv, Pieces(cm, meas, [p]), engine="deepspeed").iteration_time_s
                          for p in PIECES}
            with_all = simulate(plan, inv, meas, engine="deepspeed").iteration_time_s      # every piece measured
            out.append({"run": r, "m": plan.num_micro_batches, "measured": r["measured_iteration_s"], "learned": base,
                        "with_piece": with_piece, "with_all": with_all, "terms": terms})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = decompose(tmp)
    pct = lambda x, row: 100.0 * x / row["measured"]
    print(f"{'model':<8}{'nodes':>5} {'entries':<16}{'mbs':>3}{'dp':>3}{'m':>4} {'meas ms':>8} {'error':>6} | "
          f"{'fwd':>5} {'bwd':>5} {'head':>5} {'emb':>5} {'compos':>6} | "
          f"{'p2p':>4} {'gath':>4} {'bubbl':>5} {'dp':>4} {'opt':>4} {'sync':>4} {'fixed':>5}   (% of measured)")
    for x in sorted(rows, key=lambda x: (x["run"]["micro_batch_size"] > 2, x["run"]["model"], x["run"]["nodes"])):
        r, t = x["run"], x["terms"]
        piece = [pct(x["learned"] - x["with_piece"][p], x) for p in PIECES]
        print(f"{r['model'][:7]:<8}{r['nodes']:>5} {str(r['stage_layers']):<16}{r['micro_batch_size']:>3}"
              f"{r['dp'][0]:>3}{x['m']:>4} {x['measured'] * 1e3:>8.1f} {pct(x['learned'] - x['measured'], x):>+6.1f} | "
              + " ".join(f"{v:>+5.1f}" for v in piece) + f" {pct(x['with_all'] - x['measured'], x):>+6.1f} | "
              + " ".join(f"{pct(t[k], x):>{w}.1f}" for k, w in (("p2p", 4), ("gathers", 4), ("bubble", 5), ("dp", 4),
                                                               ("optimizer", 4), ("sync", 4), ("fixed", 5))))
    groups = {"all": rows, "micro-batch size 1-2": [x for x in rows if x["run"]["micro_batch_size"] <= 2],
              "micro-batch size 4-8": [x for x in rows if x["run"]["micro_batch_size"] >= 4]}
    err = lambda t, x: abs(100.0 * (t / x["measured"] - 1.0))
    print("\nMAPE with one piece as Sailor measured it (in sample), else learned:")
    print(f"  {'runs':<22} {'learned':>8} " + " ".join(f"{p:>9}" for p in PIECES) + f" {'all four':>9}")
    for name, sel in groups.items():
        mape = lambda f: sum(f(x) for x in sel) / len(sel)
        print(f"  {name:<22} {mape(lambda x: err(x['learned'], x)):>7.1f}% "
              + " ".join(f"{mape(lambda x, p=p: err(x['with_piece'][p], x)):>8.1f}%" for p in PIECES)
              + f" {mape(lambda x: err(x['with_all'], x)):>8.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
