"""The pictures of docs/explain.md, made by the commands a user runs (nothing drawn by hand).

1. The README's 2-cluster plan (LLaMA-2-70B on 64 H800 + 32 Ascend 910B, global batch 512, cross-cluster
   transfers overlapped with compute): `hetauto plan --boundary-schedule overlapped`,
   then its predicted timeline (`hetauto simulate --timeline`) and explanation (`hetauto explain`).
2. A CPU dry run of examples/llama/plans/tiny-2clusters-cpu.yaml (the tiny model on two CPU "clusters", 6 ranks)
   with `hetauto dryrun --tiny --timeline ... --compare`: measured (one rank per stage) under the simulator's
   prediction of the same run.
3. `hetauto compare` of the README plan at 25 and at 100 Gbit/s between the sites (example prices).
4. A CPU dry run of examples/llama/plans/tiny-2pipelines-cpu.yaml (two pipelines joined by data parallelism, one
   per CPU "cluster", 8 ranks) with `--timeline ... --compare`: a lane per pipeline stage, the gradient
   exchange between the pipelines after both drained.
Prints the figures the pictures and docs/explain.md show (predicted and measured iteration time, the
bottleneck, the comparison).

    python benchmarks/explain_pictures.py [--out docs/images] [--steps 4]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hetauto_megatron.cli import main as hetauto  # noqa: E402

EX = os.path.join(ROOT, "examples", "llama")


def run(*argv: str) -> str:
    """`hetauto ARGV` in this process; its stdout (exits on failure)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = hetauto(list(argv))
    if rc:
        raise SystemExit(f"hetauto {' '.join(argv)}: exit code {rc}")
    return buf.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "images"))
    ap.add_argument("--steps", type=int, default=4, help="dry-run steps (the last one is drawn)")
    ap.add_argument("--cost-model", help="a learned CPU model ('hetauto fit') for the dry run's prediction "
                                         "(default: the analytic model)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="hetauto-explain-")

    inv = os.path.join(EX, "inventory-2clusters.yaml")
    plan = os.path.join(work, "llama2-70b.yaml")
    # the README's 2-cluster plan: overlapped boundaries (with blocking ones the 910B holds only the last layers)
    run("plan", "--model", "llama2-70b", "--inventory", inv, "--global-batch-size", "512", "-o", plan, "--quiet",
        "--boundary-schedule", "overlapped")
    png = os.path.join(args.out, "timeline-llama2-70b-2clusters.png")
    est = json.loads(run("simulate", "--model", "llama2-70b", "--inventory", inv, "--plan", plan, "--json",
                         "--timeline", png))
    rep = json.loads(run("explain", "--plan", plan, "--no-search", "--json"))
    print(f"1. {png}: predicted {est['iteration_time_s']:.3f} s per iteration, {est['tokens_per_s']:,.0f} tokens/s; "
          f"bottleneck: {rep['bottleneck']}")

    # the example CPU plan of two "clusters" (6 ranks: TP 2 x 2 stages, then DP 2), on the inventory it names
    # compare: the default plan (overlapped transfers) at 25 and at 100 Gbit/s
    a, b = os.path.join(work, "plan.yaml"), os.path.join(work, "plan-100g.yaml")
    run("plan", "--model", "llama2-70b", "--inventory", inv, "-o", a, "--quiet")
    run("plan", "--model", "llama2-70b", "--inventory", inv, "-o", b, "--quiet",
        "--set", "link.h800-ascend.bandwidth_gbps=100")
    print(run("compare", a, b, "--price", "h800=2.5", "--price", "ascend=1.2"))

    tiny = os.path.join(EX, "plans", "tiny-2clusters-cpu.yaml")
    inv = os.path.join(EX, "inventory-cpu-tiny-2clusters.yaml")      # the cluster names the plan uses
    png = os.path.join(args.out, "dryrun-measured-vs-predicted.png")
    trace = os.path.join(work, "dryrun.json")
    rep = json.loads(run("dryrun", "--plan", tiny, "--tiny", "--steps", str(args.steps), "--json",
                         "--timeline", png, "--timeline", trace, "--compare", "--inventory", inv,
                         *(["--cost-model", args.cost_model] if args.cost_model else [])))
    with open(trace) as fh:
        timelines = json.load(fh)["otherData"]["timelines"]
    pred, meas = (next(t for t in timelines if t["source"] == s) for s in ("predicted", "measured"))
    print(f"2. {png}: CPU dry run, {rep['cores']} cores; last step measured {meas['iteration_s']:.3f} s, "
          f"predicted {pred['iteration_s']:.3f} s ({100 * (pred['iteration_s'] / meas['iteration_s'] - 1):+.0f} %); "
          f"median step {rep['iteration_s']:.3f} s")

    two = os.path.join(EX, "plans", "tiny-2pipelines-cpu.yaml")
    png = os.path.join(args.out, "dryrun-two-pipelines.png")
    rep = json.loads(run("dryrun", "--plan", two, "--tiny", "--steps", str(args.steps), "--json", "--timeline", png,
                         "--compare", "--inventory", inv,
                         *(["--cost-model", args.cost_model] if args.cost_model else [])))
    print(f"4. {png}: CPU dry run of two pipelines, {rep['cores']} cores; median step {rep['iteration_s']:.3f} s, "
          f"{rep['bytes']['inter_cluster'] / args.steps / 1e3:.0f} kB between the clusters per step")
    for name in ("timeline-llama2-70b-2clusters.png", "dryrun-measured-vs-predicted.png", "dryrun-two-pipelines.png"):
        print(f"   {name}: {os.path.getsize(os.path.join(args.out, name)) / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
