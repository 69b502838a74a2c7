"""`hetauto dryrun --timeline [--compare]`: the measured timeline of a dry run, and the predicted one above it."""
from __future__ import annotations

import os
import sys


def add_timeline_args(parser) -> None:
    g = parser.add_argument_group("timelines (docs/explain.md)")
    g.add_argument("--timeline", action="append", metavar="FILE",
                   help="write the measured schedule of the last step: FILE.json a Chrome/Perfetto trace (every "
                        "rank), FILE.png a picture (.svg and .pdf too; one rank per stage); forward, backward, send, receive (waiting "
                        "for a peer), idle, DP sync, optimizer (repeatable)")
    g.add_argument("--compare", action="store_true",
                   help="with --timeline: also the simulator's prediction of the same run (the shape it ran, its "
                        "ranks' share of the CPU cores), drawn above the measured one")
    g.add_argument("--inventory", metavar="INV",
                   help="inventory the prediction uses (default: the one stored in the plan)")
    g.add_argument("--cost-model", metavar="DIR", help="learned cost model for the prediction (default: analytic)")


def check_timeline_args(args, plan):
    """Fail before the run: bad file names, --compare without --timeline or without an inventory. Returns the
    inventory --inventory names, read here (None without it): the run's checks and prediction take it."""
    from ..errors import InputError
    from ._common import check_timeline_paths
    check_timeline_paths(args.timeline)
    from ..outputs import refuse_overwriting_inputs
    refuse_overwriting_inputs([("--timeline", t) for t in args.timeline or []],
                              [("--plan", args.plan), ("--inventory", args.inventory),
                               ("--cost-model", args.cost_model)])
    if args.compare and not args.timeline:
        raise InputError("--compare draws the prediction next to a measured timeline", field="--compare",
                         fix="add --timeline FILE.png (or .json)")
    if args.compare and not (args.inventory or plan.inventory):
        raise InputError("the plan carries no inventory to predict the run on", file=args.plan, field="inventory",
                         fix="pass --inventory INV (the one the plan was made for)")
    # Everything the run reads afterwards is read now: a wrong path must not cost the whole run first (or be
    # ignored because nothing came to read it).
    for path in args.timeline or []:
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            raise InputError(f"{path!r}: the folder {folder!r} does not exist", field="--timeline",
                             fix="create it first, or write the timeline elsewhere")
    if args.inventory and not (args.compare or getattr(args, "emulate_links", None)):
        raise InputError("only --compare (the prediction of the run) and --emulate-links read an inventory",
                         field="--inventory", fix="add --timeline FILE --compare or --emulate-links, or drop --inventory")
    if args.cost_model and not args.compare:
        raise InputError("only --compare (the prediction of the run) reads a cost model", field="--cost-model",
                         fix="add --timeline FILE --compare, or drop --cost-model")
    inventory = None
    if args.inventory:
        from ..spec.inventory import load_inventory
        inventory = load_inventory(args.inventory)
    if args.cost_model:
        from ..cost.learned import load_cost_model
        load_cost_model(args.cost_model)
    return inventory


def write_dryrun_timelines(args, plan, report, inventory) -> list[str]:
    """The --timeline files of a run; `inventory`: the one the run was checked on (dryrun's _inventory), which
    --compare predicts it on."""
    from ..cost.learned import load_cost_model
    from ..cost.shared_cores import SharedCoresCostModel, core_sharing_factor
    from ..plan.timeline import predicted_timeline
    from ..runtime.op_timing import measured_timeline
    from ._common import without_unused_unable, write_timelines
    from ._dryrun_comparison import measured_plan
    ran = measured_plan(report, plan, report_file=args.plan, tiny=None)
    written = []
    for path in args.timeline:
        per_stage = not path.lower().endswith(".json")     # pictures: one rank per stage, like the prediction
        timelines = [measured_timeline(ran, report["ops"], per_stage=per_stage)]
        if args.compare:
            # as the check before the run priced it (commands/dryrun.py _check_inventory, which said so)
            inv = without_unused_unable(inventory, plan.precision, [m.cluster for m in plan.meshes], None)
            if report.get("link_scale"):        # the links as --emulate-links ran them
                inv = inv.with_link_time_scale(report["link_scale"])
            factor = core_sharing_factor(ran.world_size, report["cores"])
            cost = SharedCoresCostModel(load_cost_model(args.cost_model), factor)
            timelines.insert(0, predicted_timeline(ran, inv, cost, title=(
                f"predicted: {ran.model.name} as run (hidden {ran.model.hidden_size}, sequence {ran.model.seq_length}), "
                f"{ran.world_size} ranks on {report['cores']} cores (compute x{factor:.1f})")))
        written += write_timelines([path], timelines)
    if args.compare:
        pred, meas = timelines[0], measured_timeline(ran, report["ops"], per_stage=True)
        print(f"timeline: last step measured {meas.iteration_s:.3f} s, predicted {pred.iteration_s:.3f} s "
              f"({100 * (pred.iteration_s / meas.iteration_s - 1):+.0f} %); forward + backward per stage, "
              "measured / predicted: " + ", ".join(
                  f"{_stage_label(ran, lane)}: {meas.busy(i):.3f} / {pred.busy(k):.3f} s"
                  for i, lane in enumerate(meas.lanes)
                  for k, pl in enumerate(pred.lanes) if pl.kind == "stage" and _same_stage(pl, lane)),
              file=sys.stderr)
    return written


def _same_stage(predicted, measured) -> bool:
    """A predicted stage lane and a measured one of the same stage (and replica group, where a stage has several:
    the predicted lanes of a plan of single meshes name no mesh)."""
    return (predicted.pipeline, predicted.stage) == (measured.pipeline, measured.stage) and \
        predicted.mesh in (None, measured.mesh)


def _stage_label(plan, lane) -> str:
    pipeline = f"P{lane.pipeline} " if plan.num_pipelines > 1 else ""
    return f"{pipeline}{lane.stage}" + ("" if plan.is_simple else f" (mesh {lane.mesh})")
