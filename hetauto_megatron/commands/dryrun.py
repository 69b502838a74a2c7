"""`hetauto dryrun`: run a plan's real Megatron-Core layout on local CPU processes and check its numerics."""
from __future__ import annotations

import argparse
import math
import os
import sys

from ..errors import InputError
from ..outputs import json_text
from ..spec._fields import shorten
from ._timeline import add_timeline_args, check_timeline_args, write_dryrun_timelines

DESCRIPTION = """\
Run a plan's real Megatron-Core layout on this machine before booking the clusters.

One local process per device of the plan (CPU, gloo, whatever the plan's device types): every mesh gets its
own TP/DP groups and layer counts, activations cross meshes through hetauto's pipeline communicator (host-
staged, as between real clusters), and the model trains a few steps with Megatron's DDP, Adam with gradient
clipping and the 1F1B schedule on deterministic synthetic tokens. Each mesh runs the plan's runtime settings,
as the launch scripts do: by default the distributed optimizer with the gradient reduce-scatter and the
parameter all-gather overlapped, gradients reduced in fp32, sequence parallelism where TP > 1 (a plan may
override them per mesh). Per step it prints the loss and the global gradient norm, and the bytes that
crossed inside clusters and between clusters; then the settings each mesh ran with and the measured iteration
time (median over the steps after the first, on the slowest rank; the reference run is not timed in it).
Each rank measures what it holds in the first step (weights, gradient buffer and optimizer state from the
tensors; activations as the peak of the tensors autograd keeps for the backward pass, through the whole
schedule), printed per stage beside the memory model's prediction (--json: "memory", one entry per rank).

--no-distributed-optimizer runs every mesh with the plain optimizer instead, to compare.

--emulate-links makes every cross-cluster transfer take the inventory's link time (the boundary's bytes at the
link's bandwidth, queued per direction, plus its latency; blocking or overlapped as the plan's boundary says),
multiplied by a scale that keeps the plan's ratio of link time to compute on this machine's CPU processes
(printed; give SCALE to choose it). The gradient exchange across meshes holding the same layers (several
pipelines, replica groups side by side) crosses the emulated links too, as the planner prices it, and the global
gradient norm's all-reduce is held for its hops between clusters (on one machine they are the loopback's). It
reports, per rank, the time its compute waited on a cross-cluster transfer, measured before booking the clusters:
the links' time where it is not hidden and, at a blocking boundary, also the sender's wait for its peer to post
the receive (the peer's own compute), which a faster link does not remove. `hetauto explain`'s "exposed link
time" is another figure: what the plan would gain with links that cost nothing.

--tiny keeps the layer counts and the whole parallel layout but shrinks hidden size, heads, vocabulary and
sequence so the run takes seconds. --reference also trains the same model in ONE process and compares:
the exit code is 1 when a loss differs by more than 1e-5, or a grad norm by more than 1e-4 of itself (fp32: the
optimizer's norm of shards and of whole tensors round differently)."""

EPILOG = """\
examples:
  hetauto dryrun --plan examples/llama/plans/tiny-2clusters-cpu.yaml --tiny --reference
  hetauto dryrun --plan plan.yaml --tiny --steps 5 --json
  hetauto dryrun --plan plan.yaml --tiny --timeline run.png --timeline run.json   # what each rank did, when
  hetauto dryrun --plan plan.yaml --tiny --timeline vs.png --compare     # predicted above measured
  hetauto dryrun --plan plan.yaml --tiny --emulate-links                 # links at the inventory's speed

exit codes: 0 ok, 1 the run failed or did not match the reference, 2 invalid plan or options, or a run whose
predicted memory (every rank is a process here) exceeds this machine's available memory: try --tiny."""

MAX_LOCAL_RANKS = 16
MAX_STEPS = 100_000             # a dry run checks a plan in a few steps; more is a mistyped number
MAX_TIMEOUT_S = 86_400.0        # a day: each rank's wait is a timedelta handed to C (10^14 s overflowed it)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, help="plan file (YAML or JSON) from 'hetauto plan'")
    parser.add_argument("--tiny", action="store_true",
                        help="shrink the model (hidden, heads, vocab, sequence) but keep layers and layout")
    parser.add_argument("--steps", type=int, default=3, metavar="N", help="optimizer steps (default 3; at most 100,000)")
    parser.add_argument("--seed", type=int, default=1234, help="seed of weights and data (default 1234)")
    parser.add_argument("--reference", action="store_true",
                        help="also run the model in one process and compare (exit 1 if a loss differs by more than "
                             "1e-5, a grad norm by more than 1e-4 of itself)")
    parser.add_argument("--no-distributed-optimizer", dest="distributed_optimizer", action="store_false",
                        help="every mesh with Megatron's plain optimizer (replicated Adam state, gradients "
                             "all-reduced) instead of the plan's distributed optimizer, to compare")
    parser.add_argument("--emulate-links", nargs="?", const="auto", metavar="SCALE",
                        help="cross-cluster transfers at the inventory's link bandwidth and latency, times SCALE "
                             "(default: the scale that keeps the plan's link-to-compute ratio on this CPU)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S",
                        help="seconds any rank may wait for a peer before failing (default 120; at most a day, 86400)")
    add_timeline_args(parser)


def run(args) -> int:
    # torch's C++ layer logs every failed rendezvous attempt of every rank with a native stack trace (over a
    # hundred lines at --timeout 0.001) ahead of the one paragraph the failure reaches the user as; set before
    # torch is imported, which the ranks (forked) inherit. As probe-link does; a user's own level is kept.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    from ..emit.summary import _num      # a figure, or '-' where there is none (a norm of 0, a NaN)
    from ..plan.plan import load_plan
    from ..runtime.dryrun import GRAD_NORM_TOLERANCE, LOSS_TOLERANCE

    if not 1 <= args.steps <= MAX_STEPS:     # (a billion steps ran for ever; 10^400 overflowed the run's deadline)
        raise InputError(f"must be from 1 to {MAX_STEPS:,}, got {shorten(str(args.steps), 40)}", field="--steps",
                         fix="give --steps 1 or more (default 3; a dry run checks a plan in a few steps)")
    if args.steps < 2 and getattr(args, "compare", False):
        raise InputError("--compare sets the prediction against the measured iteration time, the median of the "
                         "steps after the first (which the memory measurement slows): one step has none",
                         field="--steps", fix="give --steps 2 or more (default 3)")
    if not 0 <= args.seed < 2 ** 63:    # every rank seeds torch with it (a C long)
        raise InputError(f"must be from 0 to 2**63 - 1, got {args.seed}", field="--seed", fix="e.g. --seed 1234")
    if not 0 < args.timeout <= MAX_TIMEOUT_S:     # NaN too; each rank's wait is a timedelta, and C's int
        raise InputError(f"must be a positive number of seconds up to {MAX_TIMEOUT_S:g} (a day), got "
                         f"{args.timeout:g}", field="--timeout", fix="e.g. --timeout 120")
    plan = load_plan(args.plan)
    if plan.world_size > MAX_LOCAL_RANKS:
        raise InputError(f"the plan has {plan.world_size} devices; a local dry run starts one process per device "
                         f"and allows at most {MAX_LOCAL_RANKS}", file=args.plan, field="meshes",
                         fix="dry-run a smaller plan with the same shape (fewer DP replicas or stages)")
    # a precision a mesh's device lacks (fp8 on an A100 or a cpu process), refused as simulate and emit refuse it,
    # though the dry run itself trains in fp32: the field is the plan's `precision` (dryrun has no flag for it)
    plan.check_precision(args.plan)
    given = check_timeline_args(args, plan)
    dropping = [i for i, m in enumerate(plan.meshes) if m.settings.hidden_dropout or m.settings.attention_dropout]
    if args.reference and dropping:
        raise InputError("--reference compares losses with a single-process run, and with dropout every layout "
                         "draws its masks differently", file=args.plan, field=f"meshes[{dropping[0]}].settings",
                         fix="drop --reference, or dry-run the plan with hidden_dropout: 0 and attention_dropout: 0")
    from ..runtime.dryrun import run_dryrun

    # (a wrong --emulate-links number is told before the plan's inventory is read)
    scale = _scale_given(args) if args.emulate_links else None
    inv, where = _inventory(args, plan, given)
    if args.emulate_links:
        plan, scale = _emulation(args, plan, inv, scale)
    _check_inventory(args, plan, inv, where)
    try:
        report = run_dryrun(plan, steps=args.steps, seed=args.seed, tiny=args.tiny, reference=args.reference,
                            timeout_s=args.timeout, distributed_optimizer=args.distributed_optimizer,
                            emulate_links=scale, timeout_flag="--timeout")
    except InputError as exc:
        # the plan's checks before any process starts name the plan file; a wait past --timeout is the flag's
        raise (exc.within(file=args.plan) if exc.file is None and exc.field != "--timeout" else exc) from None
    if "error" in report:
        print(f"hetauto dryrun: the run failed:\n{report['error']}", file=sys.stderr)
        if any(w in report["error"].lower() for w in ("timeout", "timed out")):   # (gloo: "Timed out waiting")
            # e.g. --timeout 0.05: the ranks could not even connect; or emulated links slower than the waits
            print(f"hetauto dryrun: a wait ran past --timeout {args.timeout:g} s (every wait counts, the ranks' "
                  "connecting included): on a slow or busy machine give a larger --timeout (default 120)"
                  + (f"; with --emulate-links {scale:g} a rank also waits on peers that wait on the slowed links, "
                     "so give a smaller scale or a larger --timeout" if scale and scale > 1 else ""),
                  file=sys.stderr)
        from ..cli import json_error        # (the README: under --json every failure is one object on stdout too)
        json_error(args, 1, "run failed", report["error"])
        return 1
    report["link_scale"] = scale        # the links as the run emulated them: its prediction prices them so
    if args.timeline:
        for path in write_dryrun_timelines(args, plan, report, inv):
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(json_text({**{k: report[k] for k in ("steps", "reference", "max_abs_diff", "parity", "bytes", "settings",
                                                    "padded_vocab_size",
                                                    "step_times_s", "iteration_s", "seconds", "model", "cores",
                                                    "exposed_s", "memory", "shared_digests", "link_scale")
                             if k in report}}))
    else:
        _print_table(report, plan)
        _print_memory(report)
        _print_exposed(report, plan, scale)
    if args.reference and not report["parity"]["ok"]:
        par = report["parity"]
        if not par["finite"]:
            print("hetauto dryrun: a loss or grad norm of the plan's run or of the single-process reference is not a "
                  "finite number (NaN or infinite): the two cannot be compared", file=sys.stderr)
            return 1
        print(f"hetauto dryrun: the plan's run differs from the single-process reference: losses by "
              f"{_num(par['loss_max_abs_diff'], '.3g')} (tolerance {LOSS_TOLERANCE:g}), grad norms by "
              f"{_num(par['grad_norm_max_rel_diff'], '.3g')} of themselves (tolerance {GRAD_NORM_TOLERANCE:g})", file=sys.stderr)
        return 1
    return 0


def _inventory(args, plan, given):
    """(the inventory the run is checked, emulated and predicted on, the file it came from), read once: --inventory's
    (`given`, which check_timeline_args read), else the one stored in the plan file; (None, None) for neither."""
    if given is not None:
        return given, args.inventory
    if plan.inventory is not None:
        from ..spec.inventory import inventory_from_dict
        return inventory_from_dict(plan.inventory, file=args.plan), args.plan
    return None, None


def _check_inventory(args, plan, inv, where) -> None:
    """Before any process starts: the plan fits the inventory it names (`inv` from `where`: --inventory, else the
    one stored in the plan file), as emit and explain check it; with --compare, the prediction can be made (every
    link it prices exists). A mismatch found after the run would cost the run and lose its measurements."""
    from ..cost.analytic import AnalyticCostModel
    from ..plan.simulate import check_plan_against_inventory, simulate
    if inv is None:
        return
    if args.compare or args.emulate_links:
        # priced (the prediction, the links' scale) as simulate prices the plan: without the clusters it does not
        # use that cannot train in its precision (said here; _emulation and the timelines leave them out quietly)
        from ._common import without_unused_unable
        inv = without_unused_unable(inv, plan.precision, [m.cluster for m in plan.meshes], "hetauto dryrun")
    try:
        if args.compare:        # the prediction (its first check is the plan against the inventory)
            simulate(plan, inv, AnalyticCostModel())
        else:
            check_plan_against_inventory(plan, inv)
    except InputError as exc:
        if exc.file is None and (exc.field or "").startswith("meshes"):
            # the plan's meshes (clusters, devices, sizes) are the plan file's fields; the inventory is named too
            from ._common import naming_inventory
            raise InputError(naming_inventory(exc.reason, where, args.plan), file=args.plan, field=exc.field,
                             fix=exc.fix) from None
        raise (exc.within(file=where) if exc.file is None else exc) from None


def _scale_given(args) -> float | None:
    """The link-time scale --emulate-links gives, None for the automatic one (worked out by _emulation)."""
    if args.emulate_links == "auto":
        return None
    try:
        scale = float(args.emulate_links)
    except ValueError:
        scale = -1.0
    if not 0 < scale < math.inf:
        raise InputError(f"must be a positive number, got {args.emulate_links!r}", field="--emulate-links",
                         fix="give a scale such as 1 or 1000, or no value for the automatic one")
    return scale


def _emulation(args, plan, inv, scale):
    """(plan with its inventory, link-time scale) for --emulate-links: `inv` is the inventory the links are
    emulated at (_inventory), `scale` the one given (None: worked out here); the scale is printed by the caller."""
    import dataclasses

    from ..plan.simulate import check_plan_against_inventory
    from ..runtime.dryrun import emulation_scale, prepare_plan
    if inv is None:
        raise InputError("needs the inventory the plan was made for, and the plan file has none",
                         field="--emulate-links", file=args.plan,
                         fix="add --inventory INVENTORY.yaml (or write the plan with 'hetauto plan')")
    if args.inventory:      # the ranks emulate the links of the plan's inventory
        plan = dataclasses.replace(plan, inventory=inv.to_dict())
    try:                                  # the plan's clusters, devices and sizes first: a link needs both ends
        check_plan_against_inventory(plan, inv)
    except InputError as exc:
        raise (exc.within(file=args.plan) if exc.file is None else exc) from None
    from ..plan.simulate import check_plan_links
    try:        # the meshes of consecutive positions of a pipeline send to each other
        check_plan_links(plan, inv)
    except InputError as exc:
        raise (exc.within(file=args.inventory or args.plan) if exc.file is None else exc) from None
    run = prepare_plan(plan, tiny=args.tiny)
    if args.emulate_links == "auto":
        from ._common import without_unused_unable
        priced = without_unused_unable(inv, plan.precision, [m.cluster for m in plan.meshes], None)
        try:
            scale = emulation_scale(plan, run, priced)
        except InputError as exc:
            raise (exc.within(file=args.plan) if exc.file is None else exc) from None
    # every wait has --timeout: an emulated transfer past it would fail every rank as if a peer had died (and one
    # past what a clock holds, e.g. 1e300, failed them with an OverflowError)
    nbytes = max(run.model.seq_length * m.micro_batch_size * run.model.hidden_size * 4 for m in run.meshes)
    clusters = sorted({m.cluster for m in plan.meshes})
    links = [inv.link(a, b) for a in clusters for b in clusters if a < b and inv.link(a, b) is not None]
    for link in links:
        seconds = link.transfer_time(nbytes) * scale       # (at least: fewer connections may go slower)
        if not seconds < args.timeout:
            raise InputError(f"{scale:g} makes a transfer take {seconds:.3g} s (the inventory's {link.latency_s * 1e3:g}"
                             f" ms latency and {link.bandwidth_gbps:g} Gbit/s for a {nbytes / 2**20:.3g} MiB activation, x "
                             f"{scale:g}), past --timeout {args.timeout:g} s, which every wait has",
                             field="--emulate-links",
                             fix="give a smaller scale, or a --timeout well above the emulated link times")
    return plan, scale


def _print_exposed(report: dict, plan, scale) -> None:
    """Per rank, the median time per step its compute waited on cross-cluster transfers."""
    import statistics
    if scale is not None:
        print(f"link emulation: inventory link times x {scale:.4g}")
    exposed = report.get("exposed_s") or []
    rows = [(r, statistics.median(e[1:] or e)) for r, e in enumerate(exposed) if e and max(e) > 0]
    if rows:
        it = report["iteration_s"]
        # without emulation the "links" are this machine's loopback: the wait is the other ranks' turn on the
        # shared cores, not a link's cost
        print("waited on cross-cluster transfers per step (median"
              + ("; at a blocking boundary the wait for the peer's receive too)" if scale is not None else
                 "; loopback without --emulate-links: the ranks' turns on this machine's cores, not a link's cost)")
              + ": "
              + ", ".join(f"rank {r} {t * 1e3:.1f} ms ({t / it:.0%})" for r, t in rows))


def _print_memory(report: dict) -> None:
    """Per stage (its first rank): predicted and measured memory, activations and the whole."""
    rows = {}
    for r in report.get("memory", []):
        # meshes side by side at a stage: one line each; several pipelines: theirs in order
        rows.setdefault((r.get("pipeline", 0), r["stage"], r["mesh"]), r)
    if not rows:
        return
    print("memory per rank, KiB predicted / measured (weights + gradients + optimizer + activations; the "
          "activations are the peak autograd held over the step):")
    for (pipeline, stage, _), r in sorted(rows.items()):
        p, g = r["predicted"], r["measured"]
        where = f"pipeline {pipeline} " if "pipeline" in r else ""
        print(f"  {where}stage {stage} (tp {r['tp']} x dp {r['dp']}, recompute {r['recompute']}, {r['in_flight']} in "
              f"flight): activations {p['activations'] / 1024:,.0f} / {g['activations'] / 1024:,.0f}, total "
              f"{p['total'] / 1024:,.0f} / {g['total'] / 1024:,.0f} ({g['total'] / p['total'] - 1:+.1%}); "
              f"allocator peak in the step {g['allocator_peak'] / 1024:,.0f}")


def settings_line(i: int, s: dict) -> str:
    """One mesh's settings as its ranks ran them (a report's "settings" entry), the gradients' dtype named:
    grad_reduce_dtype "param" is the parameters' dtype, which the DDP gradient buffers report."""
    on = [k for k in ("sequence_parallel", "distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather")
          if s[k]]
    dtype = s.get("grad_buffer_dtype")
    if s["grad_reduce_dtype"] == "param":
        grads = f"{dtype} (the parameters' dtype)" if dtype else "the parameters' dtype"
    else:
        grads = dtype or s["grad_reduce_dtype"]
    # the dropouts, where a mesh runs any (the settings' default is none; docs/plan-format.md)
    drops = [f"{k} {s[k]:g}" for k in ("hidden_dropout", "attention_dropout") if s.get(k)]
    return (f"mesh {i} ({s['cluster']}, tp {s['tp']} x dp {s['dp']}): {', '.join(on) or 'no sharding or overlap'}; "
            f"gradients reduced in {grads}" + (f"; {', '.join(drops)}" if drops else ""))


def _print_table(report: dict, plan) -> None:
    from ..emit.summary import _num, count_noun
    from ..runtime.dryrun import GRAD_NORM_TOLERANCE, LOSS_TOLERANCE
    from ..plan.layout import PipelineLayout

    m = report["model"]
    pipes = [PipelineLayout(plan, p) for p in range(plan.num_pipelines)]
    shape = "; ".join(f"{count_noun(q.num_stages, 'stage')}, {count_noun(q.num_micro_batches, 'micro-batch')} per step"
                      + (f" ({q.samples} samples)" if len(pipes) > 1 else "") for q in pipes)
    if len(pipes) > 1:
        shape = f"{len(pipes)} pipelines joined by data parallelism: {shape}"
    print(f"dry run of {plan.world_size} ranks, {count_noun(len(plan.meshes), 'mesh')}, model {m['name']} ({m['num_layers']} "
          f"layers, hidden {m['hidden_size']}), {shape}")
    ref = report.get("reference")
    head = f"{'step':>4}  {'loss':>14}  {'grad norm':>14}"
    if ref:
        head += f"  {'ref loss':>14}  {'ref grad norm':>14}"
    print(head)
    for i, s in enumerate(report["steps"]):
        line = f"{i:>4}  {s['loss']:>14.8f}  {s['grad_norm']:>14.8f}"
        if ref:
            line += f"  {ref[i]['loss']:>14.8f}  {ref[i]['grad_norm']:>14.8f}"
        print(line)
    b = report["bytes"]
    print(f"bytes sent: intra-cluster {b['intra_cluster']:,}, inter-cluster {b['inter_cluster']:,}"
          + ("" if not b.get("between") else " (" + ", ".join(f"{k} {v:,}" for k, v in b["between"].items()) + ")"))
    for i, s in enumerate(report["settings"]):
        print(settings_line(i, s))
    if ref:
        par = report["parity"]
        print(f"vs single process: losses within {_num(par['loss_max_abs_diff'], '.3g')} (tolerance {LOSS_TOLERANCE:g}), grad "
              f"norms within {_num(par['grad_norm_max_rel_diff'], '.3g')} of themselves (tolerance {GRAD_NORM_TOLERANCE:g}): "
              f"{'match' if par['ok'] else 'MISMATCH'}")
    how = ("median of steps after the first, slowest rank" if len(report["steps"]) > 1 else
           "the only step, slowed by the memory measurement: run --steps 2 or more for the iteration time")
    print(f"iteration time {report['iteration_s']:.3f}s ({how}); wall time {report['seconds']:.1f}s")
