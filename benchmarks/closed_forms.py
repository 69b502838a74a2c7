"""How far the search's closed forms of a pipeline are from the event simulation, by regime.

    .venv/bin/python benchmarks/closed_forms.py [--pipelines 6000] [--seed 11] [--json]

The search screens layouts with closed forms (plan/pipeline.py `estimate_1f1b`, plan/pipeline_fill.py
`estimate_fill_drain`) and re-ranks its best ones with the event simulation (`simulate_1f1b`; DeepSpeed's schedule:
`deepspeed_schedule.simulate_deepspeed`, screened by estimate_1f1b on `deepspeed_links`). A closed form far above the
simulation for some layouts ranks them out of the re-ranking's reach; one below it promises too much. This prints
the error (closed form / simulation - 1) on random pipelines (tests/helpers.py `random_pipeline`: 2-10 stages,
backward about twice the forward, links of any speed, blocking or overlapped boundaries of random depth) with 1 to
128 micro-batches, by how the micro-batch count m compares with the first stage's warm-up w0 (the stages after it
plus the overlapped boundaries' depths): where m <= w0 no stage of the saturated front runs a forward after a
backward, where m > 2 w0 the steady state dominates. And on pipelines whose boundaries share a contended uplink
(plan/shared_uplinks.py), where each transfer is charged its longest wait.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from helpers import random_pipeline, shared_uplinks_draw  # noqa: E402

from hetauto_megatron.plan.deepspeed_schedule import estimate_deepspeed, simulate_deepspeed  # noqa: E402
from hetauto_megatron.plan.pipeline import estimate_1f1b, simulate_1f1b, warmup_forwards  # noqa: E402
from hetauto_megatron.plan.pipeline_fill import estimate_fill_drain  # noqa: E402
from hetauto_megatron.plan.shared_uplinks import contended  # noqa: E402

REGIMES = ("m < p", "p <= m <= w0", "w0 < m <= 2 w0", "m > 2 w0", "contended uplink")


def regime(p: int, m: int, w0: int) -> str:
    if m <= w0:
        return "m < p" if m < p else "p <= m <= w0"
    return "w0 < m <= 2 w0" if m <= 2 * w0 else "m > 2 w0"


def measure(n: int, seed: int) -> dict:
    """{regime: {form: [errors]}} over `n` random pipelines (and as many with shared uplinks)."""
    rng = random.Random(seed)
    out = {r: {"estimate_1f1b": [], "estimate_fill_drain": [], "deepspeed": []} for r in REGIMES}
    for k in range(2 * n):
        p, m, f, b, link, lat, blk, depth = random_pipeline(rng, 1, micro_batches=tuple(range(1, 129)))
        ups = None
        if k >= n:
            if p < 2:
                continue
            ups = shared_uplinks_draw(rng, p, [x - a for x, a in zip(link, lat)], whole=False)
            if not contended(ups, link, lat):
                continue
        kw = dict(latency=lat, blocking=blk, depth=depth, uplinks=ups)
        sim = simulate_1f1b(f, b, link, m, **kw).makespan
        row = out["contended uplink" if ups else regime(p, m, warmup_forwards(p, depth)[0])]
        row["estimate_1f1b"].append(estimate_1f1b(f, b, link, m, **kw) / sim - 1)
        row["estimate_fill_drain"].append(estimate_fill_drain(f, b, link, m, **kw) / sim - 1)
        row["deepspeed"].append(estimate_deepspeed(f, b, link, m, ups)
                                / simulate_deepspeed(f, b, link, m, ups)[0] - 1)
    return out


def summary(errs: list) -> dict:
    e = sorted(errs)
    return {"pipelines": len(e), "median_pct": 100 * statistics.median(e), "p90_pct": 100 * e[int(0.9 * len(e))],
            "max_pct": 100 * e[-1], "min_pct": 100 * e[0]} if e else {"pipelines": 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipelines", type=int, default=6000, help="random pipelines without uplinks (default 6000); "
                    "as many are drawn with shared uplinks, of which those with a contended one count")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json", action="store_true", help="the figures as JSON")
    args = ap.parse_args()
    table = {r: {form: summary(errs) for form, errs in forms.items()} for r, forms in measure(args.pipelines,
                                                                                             args.seed).items()}
    if args.json:
        print(json.dumps(table, indent=1))
        return 0
    print("closed form / event simulation - 1, in % (median, 90th percentile, largest, smallest: below 0 it undercuts)")
    print(f"{'regime':<18} {'pipelines':>9}  {'estimate_1f1b':>30}  {'estimate_fill_drain':>30}  "
          f"{'DeepSpeed (estimate_1f1b)':>30}")
    for r, forms in table.items():
        cells = ["{median_pct:6.1f} {p90_pct:6.1f} {max_pct:6.1f} {min_pct:6.1f}".format(**forms[f])
                 if forms[f]["pipelines"] else "-" for f in ("estimate_1f1b", "estimate_fill_drain", "deepspeed")]
        print(f"{r:<18} {forms['estimate_1f1b']['pipelines']:>9}  {cells[0]:>30}  {cells[1]:>30}  {cells[2]:>30}")
    print("p: stages; w0: the first stage's warm-up forwards. The search re-ranks its best layouts with the event "
          "simulation; the fill-and-drain form only adds candidates (rescreen.fill_shortlist), as it can undercut.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
