"""Blocking vs overlapped cross-cluster transfers on CPU with emulated links, measured and predicted.

    .venv/bin/python benchmarks/overlap.py [--steps N] [--micro-batches M] [--ratios 0.25,0.5,1.0]

Two "clusters" of one CPU process each (one pipeline stage each) train a small GPT with Megatron-Core's 1F1B
through hetauto's communicator. A run without link emulation before each point measures each stage's forward
and backward per micro-batch. Then the link between the clusters is emulated (runtime/cross_link.py: the boundary's bytes at
the link bandwidth, queued per direction, plus latency; half of the link time each) so that one micro-batch's
transfer takes 0.25x, 0.5x and 1.0x the slower stage's compute, and each point runs with the blocking schedule
and with the overlapped one (depth: the link's round trip in stage times, rounded up, as the planner chooses).

Per run it prints the measured iteration time (median of the steps after the first, slowest rank) and the
simulator's prediction (plan/pipeline.py) fed, step by step, with every forward and backward measured in that
step (each micro-batch's own time on each stage) plus its measured time outside the pipeline, so the
comparison tests the schedule and link model, not the CPU compute model (the error is the median over steps). Then the exposed cross-cluster
time as a share of the iteration, measured (the time a rank's compute waited while a message was on its way,
communicator.exposed_s) and predicted (the simulator's held sends and waits for data on its way, the same
quantity), for the bottleneck stage (the larger measured compute: its waits are what lengthens the
iteration) and for the worst rank (a faster stage waits anyway, and part of that wait is link time).
The pipeline's fill and drain each carry one crossing of the link no schedule can hide, so the exposed share
falls as 1 / micro-batches. "steady" is the simulator's exposed share of the bottleneck stage for the same
step with every operation at its stage's mean time, "jitter" the largest coefficient of variation of one
stage's forward or backward times in a step: on a shared machine operations vary, a stage that is briefly
faster waits for data still on the link, and both the measure and the replay count that wait.
Targets: overlapped exposed time <= 5 % of the iteration at 0.5x; predicted within 10 % of measured for both
schedules at every point.
"""
from __future__ import annotations

import argparse
import math
import statistics

from hetauto_megatron.plan.pipeline import simulate_1f1b
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.runtime.dryrun import run_dryrun

MODEL = {"name": "bench-small", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
         "ffn_hidden_size": 1024, "vocab_size": 512, "seq_length": 128, "num_query_groups": 4}


def make_plan(m: int, boundary: dict, link: dict | None) -> object:
    inv = {"clusters": [{"name": n, "device": "cpu", "nodes": 1, "devices_per_node": 1} for n in ("a", "b")],
           "links": [{"between": ["a", "b"], **(link or {"bandwidth_gbps": 100, "latency_ms": 0})}]}
    mesh = lambda c, extra: {"cluster": c, "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 1,
                             "recompute": "none", "stage_layers": [2], **extra}
    return plan_from_dict({"version": 2, "model": MODEL, "global_batch_size": m, "inventory": inv,
                           "meshes": [mesh("a", {"boundary": boundary}), mesh("b", {})]})


def stage_ops(report: dict, rank: int, step: int) -> tuple[list, list]:
    """Forward and backward seconds of each micro-batch of a rank in one step, in micro-batch order."""
    ops = report["ops"][rank][step]["ops"]
    f = [e - s for k, _, s, e in sorted(o for o in ops if o[0] == "forward")]
    b = [e - s for k, _, s, e in sorted(o for o in ops if o[0] == "backward")]
    return f, b


def stage_times(report: dict, rank: int, step: int) -> tuple[float, float]:
    """Mean forward and backward seconds per micro-batch of a rank in one step."""
    return tuple(statistics.mean(v) for v in stage_ops(report, rank, step))


def outside_pipeline(report: dict, step: int) -> float:
    """The step's time (slowest rank) not spanned by any rank's pipeline operations (data, optimizer, ...)."""
    steps = [r[step] for r in report["ops"]]
    kinds = ("forward", "backward", "send", "receive")
    first = min(op[2] for st in steps for op in st["ops"] if op[0] in kinds)
    last = max(op[3] for st in steps for op in st["ops"] if op[0] in kinds)
    return report["step_times_s"][step] - (last - first)


def run(m: int, steps: int, boundary: dict, link: dict | None, emulate: bool) -> dict:
    r = run_dryrun(make_plan(m, boundary, link), steps=steps, seed=3, tiny=False, reference=False,
                   timeout_s=120, emulate_links=1.0 if emulate else None)
    if "error" in r:
        raise SystemExit(r["error"])
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--micro-batches", type=int, default=32)
    ap.add_argument("--ratios", default="0.25,0.5,1.0", help="link time per micro-batch / a stage's compute")
    args = ap.parse_args()
    m = args.micro_batches
    base = run(m, args.steps, {"schedule": "blocking"}, None, emulate=False)
    later = range(1, args.steps)             # the first step pays for allocation and warm-up
    fb = [statistics.median(sum(stage_times(base, r, i)) for i in later) for r in (0, 1)]
    stage = max(fb)
    boundary_bytes = MODEL["seq_length"] * 1 * MODEL["hidden_size"] * 4      # fp32 activations of one step
    print(f"stage compute per micro-batch (forward + backward): {fb[0] * 1e3:.1f} / {fb[1] * 1e3:.1f} ms; "
          f"{m} micro-batches; no-link iteration {base['iteration_s']:.3f} s")
    print("link/stage: as set from a run without link just before / as measured in the run (the load changes)")
    print(f"{'link/stage':>10} {'schedule':>14} {'measured s':>10} {'predicted s':>11} {'error':>7} "
          f"{'exposed, bottleneck stage':>26} {'exposed, worst rank':>20} {'steady':>7} {'jitter':>7}")
    print(f"{'':>10} {'':>14} {'':>10} {'':>11} {'':>7} {'measured / predicted':>26} {'measured / predicted':>20}")
    for n, ratio in enumerate(float(v) for v in args.ratios.split(",")):
        if n:    # the machine's load changes: measure the stages again right before each point
            again = run(m, 3, {"schedule": "blocking"}, None, emulate=False)
            stage = max(statistics.median(sum(stage_times(again, r, i)) for i in (1, 2)) for r in (0, 1))
        x = ratio * stage
        latency = x / 2
        link = {"bandwidth_gbps": boundary_bytes * 8 / (x - latency) / 1e9, "latency_ms": latency * 1e3}
        depth = math.ceil(2 * x / stage - 1e-9)
        for boundary in ({"schedule": "blocking"}, {"schedule": "overlapped", "depth": depth}):
            r = run(m, args.steps, boundary, link, emulate=True)
            blocking = boundary["schedule"] == "blocking"
            measured, predicted, errors, exp_m, exp_p, compute, steady, jitter = [], [], [], [], [], [], [], []
            for i in later:      # each step replayed with its own measured operations (the machine is shared)
                (f0, b0), (f1, b1) = stage_ops(r, 0, i), stage_ops(r, 1, i)
                sim = simulate_1f1b([f0, f1], [b0, b1], [x], m, latency=[latency], blocking=[blocking],
                                    depth=[0 if blocking else depth], record=True)
                measured.append(r["step_times_s"][i])
                predicted.append(sim.makespan + outside_pipeline(r, i))
                errors.append(predicted[-1] / measured[-1] - 1)
                # exposed: the simulator's "send" (held by a blocking send) and "recv" (data on its way) events
                exp_p.append([sum(e.end - e.start for e in sim.events if e.resource == ("stage", s)
                                  and e.kind in ("send", "recv")) / predicted[-1] for s in (0, 1)])
                exp_m.append([r["exposed_s"][s][i] / measured[-1] for s in (0, 1)])
                compute.append([statistics.mean(f0) + statistics.mean(b0), statistics.mean(f1) + statistics.mean(b1)])
                # the same step with every operation at its stage's mean: the schedule's exposure without jitter
                flat = simulate_1f1b([statistics.mean(f0), statistics.mean(f1)], [statistics.mean(b0),
                                     statistics.mean(b1)], [x], m, latency=[latency], blocking=[blocking],
                                     depth=[0 if blocking else depth], record=True)
                steady.append([sum(e.end - e.start for e in flat.events if e.resource == ("stage", s)
                                   and e.kind in ("send", "recv")) / flat.makespan for s in (0, 1)])
                jitter.append(max(statistics.pstdev(v) / statistics.mean(v) for v in (f0, b0, f1, b1)))
            it = statistics.median(measured)
            slow = max((0, 1), key=lambda s: statistics.median(c[s] for c in compute))   # the bottleneck stage
            med = lambda rows, s: statistics.median(row[s] for row in rows)
            name = "blocking" if blocking else f"overlapped d={depth}"
            bottleneck = f"{med(exp_m, slow):.1%} / {med(exp_p, slow):.1%} (stage {slow})"
            worst = f"{max(med(exp_m, s) for s in (0, 1)):.1%} / {max(med(exp_p, s) for s in (0, 1)):.1%}"
            actual = x / med(compute, slow)       # the link's time over the bottleneck's compute in this run
            print(f"{ratio:>5.2f}x {actual:>4.2f}x {name:>14} {it:10.3f} {statistics.median(predicted):11.3f} "
                  f"{statistics.median(errors):+7.1%} {bottleneck:>26} {worst:>20} {med(steady, slow):7.1%} "
                  f"{statistics.median(jitter):7.0%}")


if __name__ == "__main__":
    main()
