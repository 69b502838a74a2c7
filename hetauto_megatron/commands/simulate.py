"""`hetauto simulate`: predict a plan's (or a homogeneous layout's) iteration time, throughput and memory."""
from __future__ import annotations

import dataclasses
import sys

from ._common import (add_memory_job_arg, add_model_inventory_args, add_precision_arg, apply_memory_job,
                      as_priced_on, at_plan_precision, check_timeline_paths, load_inputs, measured_layers_hint,
                      use_recorded_memory_job, warn_if_priced_otherwise, without_unused_unable, write_timelines)
from ..outputs import json_text
from ..spec.whatif import keys_help

DESCRIPTION = """\
Predict one training iteration with the cost model and the event-level 1F1B simulator (--engine deepspeed:
DeepSpeed's pipeline schedule, for plans run by DeepSpeed's engine): per stage compute,
busy and bubble time, memory of the busiest device and whether it fits, and overall iteration time,
tokens/s and model TFLOP/s per device, and the cost per 1M tokens when the inventory prices the plan's
clusters (price_per_device_hour, for the devices the plan uses). Give either a plan file, or a homogeneous layout on one cluster
(--tp/--pp/--dp/--micro-batch-size/--global-batch-size; the layers are split evenly, or by the planner's
exact split when they do not divide).

What-if without editing files: --set KEY=VALUE overrides the inventory (repeatable; units as in the
inventory, docs/explain.md):
""" + keys_help() + """
and --global-batch-size / --seq-length override the plan's. A plan keeps its layout: to see what a bigger
cluster buys, re-plan with the same --set ('hetauto plan --set ...'), or 'hetauto explain' for x0.5 / x2 of
every link, cluster and the batch at once.

--timeline FILE writes the predicted schedule: .json a Chrome/Perfetto trace, .png a picture (docs/explain.md).

exit codes: 0 ok (also when the layout does not fit: see "fits"), 2 invalid input."""

EPILOG = """\
examples:
  hetauto simulate --model llama2-70b --inventory examples/llama/inventory-2clusters.yaml --plan plan.yaml
  hetauto simulate --plan plan.yaml                    # the model and inventory the plan file stores
  # the predicted schedule as a picture and as a trace for ui.perfetto.dev
  hetauto simulate --model llama2-70b --inventory inv.yaml --plan plan.yaml --timeline plan.png --timeline plan.json
  # what-if, without editing files: a 4x faster link, twice the batch, twice the sequence
  hetauto simulate --model llama2-70b --inventory inv.yaml --plan plan.yaml \\
      --set link.h800-ascend.bandwidth_gbps=100 --global-batch-size 1024 --seq-length 8192
  hetauto plan --model llama2-70b --inventory inv.yaml --set cluster.ascend.nodes=8   # a bigger cluster: re-plan
  hetauto simulate --model llama2-7b --inventory inv.yaml --tp 2 --pp 2 --dp 8 --micro-batch-size 1 \\
      --global-batch-size 256 --recompute selective --cluster h800 --json"""


def add_arguments(parser) -> None:
    add_model_inventory_args(parser, stored_in_plan=True)
    add_precision_arg(parser, None)
    add_memory_job_arg(parser)
    parser.add_argument("--plan", metavar="PLAN", help="plan file to evaluate (its model must match --model; "
                                                       "without --model and --inventory, the ones it stores)")
    parser.add_argument("--engine", choices=("megatron", "deepspeed"), default=None,
                        help="the pipeline engine that runs the plan (default: the one the plan file records, else "
                             "megatron): megatron (hetauto's runtime and Megatron-LM, "
                             "1F1B) or deepspeed (DeepSpeed's pipeline engine with the configs 'hetauto emit "
                             "deepspeed' writes: its TrainSchedule and pipe buffers, every send and receive blocking "
                             "both stages)")
    parser.add_argument("--timeline", action="append", metavar="FILE",
                        help="write the predicted schedule of one iteration: FILE.json is a Chrome/Perfetto trace "
                             "(open it in ui.perfetto.dev), FILE.png a picture (.svg and .pdf too); per stage forward, backward, "
                             "waiting for a link, idle, DP sync and optimizer, per link its transfers; as "
                             "--engine runs it; every plan shape (repeatable)")
    g = parser.add_argument_group("homogeneous layout (instead of --plan; all five numbers needed)")
    g.add_argument("--tp", type=int, metavar="N", help="tensor-parallel degree (inside a node, dividing the heads)")
    g.add_argument("--pp", type=int, metavar="N", help="pipeline stages (the layers split evenly, or by the planner's "
                                                       "exact split when they do not divide)")
    g.add_argument("--dp", type=int, metavar="N", help="data-parallel replicas; tp x pp x dp devices of the cluster")
    g.add_argument("--micro-batch-size", type=int, metavar="N", help="samples per micro-batch and replica")
    g.add_argument("--global-batch-size", type=int, metavar="N",
                   help="samples per iteration, a multiple of dp x micro-batch size; with --plan: what-if, "
                        "overrides the plan's (default: the plan's)")
    g.add_argument("--recompute", choices=("none", "selective", "full"), default=None,
                   help="activation recomputation: none (the default), selective (each layer's MLP re-run in the "
                        "backward) or full (each layer's whole forward re-run); docs/cost-model.md")
    g.add_argument("--cluster", metavar="NAME", help="cluster to place it on (default: the inventory's first)")


def homogeneous_split(model, inventory, cluster, layout: tuple, args, cost_model) -> list[int]:
    """A homogeneous layout's layers per stage: even where the stages divide them (Megatron's own split), else
    the planner's exact split of that layout (balancing the stage times with the embedding and the output layer,
    within each stage's memory); where that finds none (the layout does not fit, or is not valid: the plan's
    checks say why), as even as possible, the extra layers on the last stages."""
    from ..errors import InputError
    from ..plan.layout_pricing import evaluate_layout
    from ..plan.simulate import MeshChoice
    tp, pp, dp, mbs, gbs = layout
    layers = model.num_layers
    if layers % pp == 0:
        return [layers // pp] * pp
    try:
        res = evaluate_layout(model, inventory.with_precision(args.precision or "bf16"),
                              [MeshChoice(cluster.name, tp, dp, mbs, args.recompute or "none", pp, ())], gbs,
                              cost_model, exact=False, engine=args.engine)
        if res.stage_layers is not None:
            return list(res.stage_layers)
    except (InputError, ValueError, ZeroDivisionError):
        pass
    if pp > layers:     # beyond one layer per stage: the first and the last hold the embedding or the head only
        return [0] + [1] * layers + [0] * (pp - layers - 1)
    base, extra = divmod(layers, pp)
    return [base] * (pp - extra) + [base + 1] * extra


def run(args) -> int:
    from ..errors import InputError
    from ..plan.plan import Mesh, Plan, load_plan
    from ..plan.simulate import simulate
    check_timeline_paths(args.timeline)
    from ..outputs import refuse_overwriting_inputs
    refuse_overwriting_inputs([("--timeline", t) for t in args.timeline or []],
                              [("--model", args.model), ("--inventory", args.inventory), ("--plan", args.plan),
                               ("--cost-model", args.cost_model)])
    if args.global_batch_size is not None:
        from ..plan.plan import check_global_batch_size
        check_global_batch_size(args.global_batch_size, field="--global-batch-size")
    stored = None
    if args.plan:
        # its model and inventory stand in for a flag left out, and the cost model is described at its precision
        stored = load_plan(args.plan)
    elif args.model is None or args.inventory is None:
        missing = [f for f, v in (("--model", args.model), ("--inventory", args.inventory)) if v is None]
        raise InputError(f"missing {' and '.join(missing)}", field=missing[0],
                         fix="give --model and --inventory with a layout, or --plan PLAN (a file from 'hetauto plan "
                             "-o' stores both)")
    model, inventory, cost_model = load_inputs(args, stored, args.plan)
    layout = [args.tp, args.pp, args.dp, args.micro_batch_size, args.global_batch_size]
    if args.plan:
        # a layout flag beside --plan would be silently ignored: the plan's meshes say what runs
        given = [flag for flag, v in (("--tp", args.tp), ("--pp", args.pp), ("--dp", args.dp),
                                      ("--micro-batch-size", args.micro_batch_size), ("--recompute", args.recompute),
                                      ("--cluster", args.cluster)) if v is not None]
        if given:
            raise InputError(f"give either --plan or a layout ({', '.join(given)}), not both", field="--plan",
                             fix="with --plan only --global-batch-size, --seq-length, --precision and --engine may "
                                 "change (edit the plan file's meshes to change their recomputation or cluster)")
        plan = stored
        if args.engine is None:         # the engine the plan was made for
            args.engine = plan.engine
        # the --memory-job the plan was fitted to, unless the flag names one
        use_recorded_memory_job(cost_model, plan, args.plan, args.memory_job)
        warn_if_priced_otherwise(cost_model, plan, args.plan, "simulate")
        if plan.model.num_layers != model.num_layers or plan.model.hidden_size != model.hidden_size:
            raise InputError(f"the plan is for model {plan.model.name} ({plan.model.num_layers} layers, hidden "
                             f"{plan.model.hidden_size}) but --model is {model.name} ({model.num_layers} layers, "
                             f"hidden {model.hidden_size})", file=args.plan, field="model",
                             fix="pass the plan's model to --model")
        # a --model that differs from the plan's (same depth and width, e.g. another vocabulary or sequence) is
        # what runs: price the plan with it, as compare and explain do, instead of ignoring the flag
        model_changed = args.model is not None and model != plan.model
        if args.seq_length or args.global_batch_size or model_changed:
            gbs = args.global_batch_size or plan.global_batch_size
            try:
                samples = plan.pipeline_samples
                if samples and gbs != plan.global_batch_size:   # several pipelines: their shares kept in proportion
                    from ..plan.batch_split import split_batch
                    samples = tuple(split_batch(gbs, [plan.pipeline_step(p) for p in range(plan.num_pipelines)],
                                                [1 / n for n in samples]))
                plan = Plan(model, gbs, plan.meshes, plan.inventory, precision=plan.precision,
                            pipeline_samples=samples, engine=plan.engine)
            except InputError as exc:
                if args.seq_length and "sequence" in (exc.field or ""):
                    # the what-if sequence, not the plan's settings, is what changed: a length the TP degrees divide
                    import math
                    step = math.lcm(*(m.tp for m in plan.meshes))
                    raise InputError(f"--seq-length {args.seq_length} does not suit the plan's layout: {exc.reason}",
                                     field="--seq-length", fix=f"give a multiple of {step} (what every mesh's tp "
                                     "divides)") from None
                if model_changed and "global_batch_size" not in (exc.field or ""):
                    # the --model's shape does not suit the plan's meshes (tp vs heads, SP vs sequence)
                    raise InputError(f"does not suit the layout of {args.plan}: {exc.reason}", file=args.model,
                                     field="--model", fix="give a model the plan's layout runs, or make a plan "
                                     f"for this one: hetauto plan --model {args.model}") from None
                # what-if batch that the plan's micro-batch step does not divide
                raise InputError(exc.reason, field="--global-batch-size" if args.global_batch_size else exc.field,
                                 fix=exc.fix) from None
    else:
        args.engine = args.engine or "megatron"
        names = ["--tp", "--pp", "--dp", "--micro-batch-size", "--global-batch-size"]
        missing = [n for n, v in zip(names, layout) if v is None]
        if missing:
            raise InputError(f"missing {', '.join(missing)}", field=missing[0],
                             fix="give --plan PLAN, or all of --tp --pp --dp --micro-batch-size --global-batch-size")
        for n, v in zip(names, layout):
            if v < 1:
                raise InputError(f"must be at least 1, got {v}", field=n, fix=f"give {n} 1 or more")
        tp, pp, dp, mbs, gbs = layout
        from ..plan.engines import recompute_as_run_by
        if args.recompute and recompute_as_run_by(args.recompute, args.engine) != args.recompute:
            # priced as the engine runs it (the table says so too); said, as the flag asked for another
            print(f"hetauto simulate: --recompute {args.recompute}: DeepSpeed's pipeline engine checkpoints whole "
                  f"layers only, so it runs, and is priced, as {recompute_as_run_by(args.recompute, args.engine)}",
                  file=sys.stderr)
        try:
            cluster = inventory.cluster(args.cluster) if args.cluster else inventory.clusters[0]
        except InputError as exc:       # named as the flag that chose it
            raise InputError(f"the inventory {exc.reason}", file=args.inventory, field="--cluster",
                             fix=exc.fix) from None
        try:    # the one cluster --cluster chose: a precision it has, or another cluster (nothing to exclude)
            cluster.device.at_precision(args.precision or "bf16")
        except InputError as exc:
            raise InputError(f"cluster {cluster.name}: {exc.reason}", file=args.inventory, field="--precision",
                             fix=f"give --precision one it has ({', '.join(cluster.device.precisions)}), or "
                                 "--cluster another cluster") from None
        if pp > model.num_layers + 2:
            raise InputError(f"{pp} stages for {model.num_layers} layers", field="--pp",
                             fix=f"use at most {model.num_layers + 2} stages (the first and the last may hold "
                                 "only the embedding and the output layer)")
        inventory = without_unused_unable(inventory, args.precision or "bf16", [cluster.name], "hetauto simulate")
        layers = homogeneous_split(model, inventory, cluster, (tp, pp, dp, mbs, gbs), args, cost_model)
        try:
            # made for the engine that runs it (selective_runs: DeepSpeed's runs a biased model's "selective", as
            # full) and written as that engine runs it (Plan.for_engine), as simulate prices it
            plan = Plan(model, gbs, (Mesh(cluster.name, cluster.device.name, tp, dp, mbs, args.recompute or "none",
                                          tuple(layers)),), precision=args.precision or "bf16",
                        engine=args.engine).for_engine(args.engine)
        except InputError as exc:   # name the command-line flag, not the plan field it became
            flag = {"tp": "--tp", "dp": "--dp", "micro_batch_size": "--micro-batch-size",
                    "global_batch_size": "--global-batch-size"}
            key = (exc.field or "").split(".")[-1]
            if key == "recompute":      # selective for a model with linear biases (engines.selective_runs)
                raise InputError(exc.reason, field="--recompute", fix="use --recompute full or none") from None
            if key == "sequence_parallel":      # a mesh of --tp > 1 runs it: there is no settings block to edit
                raise InputError(exc.reason, field="--tp", fix=f"choose a --tp that divides the {model.seq_length}"
                                 f"-token sequence, or a --seq-length that {tp} divides") from None
            raise InputError(exc.reason, field=flag.get(key, exc.field), fix=exc.fix) from None
    if args.precision and args.precision != plan.precision:     # what-if: the same plan at another precision
        plan = dataclasses.replace(plan, precision=args.precision)
    from ..plan.engines import check_engine_precision      # (plan and the plan file refuse it too)
    check_engine_precision(args.engine, plan.precision, field="--precision" if args.precision else "--engine",
                           command="simulate")
    inventory = without_unused_unable(inventory, plan.precision, [m.cluster for m in plan.meshes], "hetauto simulate")
    try:
        # the plan's memory job, decided at its precision as every command decides it (plan/memory_fit.py)
        apply_memory_job(cost_model, inventory.with_precision(plan.precision) if args.precision or not args.plan
                         else at_plan_precision(inventory, plan, args.plan))
        if plan.precision == "fp32" and not args.precision and not hasattr(cost_model, "describe"):
            measured_layers_hint(inventory.with_precision("fp32"))     # an fp32 plan file, the analytic model
        if args.engine != "megatron" and not plan.is_simple:
            raise InputError("DeepSpeed's pipeline engine runs one pipeline of single meshes; this plan has several "
                             "pipelines or meshes side by side", field="--engine",
                             fix="simulate it with --engine megatron (hetauto's runtime runs every plan shape)")
        if args.engine == "deepspeed" and args.plan:
            from ..plan.shapes import uniform_topology_gaps
            from ..spec.devices import get_device
            gaps = [g for g in uniform_topology_gaps(plan.meshes, [get_device(m.device_type).vendor
                                                                   for m in plan.meshes]) if g != "selective"]
            if gaps:      # priced as that engine's schedule would run this layout, which one DeepSpeed job cannot
                words = {"tp": "TP", "dp": "DP", "micro_batch_size": "micro-batch size", "vendor": "vendor"}
                print(f"hetauto simulate: one DeepSpeed job cannot run {args.plan} (its meshes differ in "
                      f"{', '.join(words[g] for g in gaps)}; 'hetauto emit deepspeed' says more): the figure is "
                      "DeepSpeed's schedule on this layout, 'hetauto plan --engine deepspeed' plans one it runs",
                      file=sys.stderr)
        est = simulate(plan, inventory, cost_model, engine=args.engine)
    except InputError as exc:
        if args.plan and exc.file is None:
            from ._common import plan_error
            raise plan_error(exc, args.plan, getattr(args, "set", None)) from None
        if not args.plan and exc.field and exc.field.startswith("meshes[0]."):
            flag = {"tp": "--tp", "device_type": "--cluster"}.get(exc.field.split(".")[-1], exc.field)
            raise InputError(exc.reason, field=flag, fix=exc.fix) from None
        if not args.plan and exc.field in ("meshes[0]", "meshes"):
            # the layout came from --tp/--pp/--dp: no meshes were written, so the flags are named
            fix = (exc.fix or "").replace("the meshes' dp or stages", "--dp or --pp").replace(
                "reduce tp, dp or the number of stages", "reduce --tp, --dp or --pp")
            raise InputError(exc.reason, field="--tp/--pp/--dp", fix=fix) from None
        raise
    written = []
    if args.timeline:
        from ..plan.timeline import check_timeline_size, predicted_timeline
        check_timeline_size(plan)
        written = write_timelines(args.timeline, [predicted_timeline(plan, inventory, cost_model, engine=args.engine)])
    from ..plan.constraints import cost_per_million_tokens
    cost = cost_per_million_tokens(inventory, plan.meshes, est.iteration_time_s,
                                   plan.global_batch_size * plan.model.seq_length)   # None without prices
    if args.json:
        from ._common import json_document
        # every key always present (null where it does not apply), as explain and compare write them
        print(json_text(json_document("simulate", {"engine": args.engine, **est.to_dict(),
                                                    "cost_model_why": est.cost_model_why or None,
                                                    "cost_per_million_tokens": cost, "written": written or []}),
                         indent=2))
        return 0
    from ..emit.summary import format_summary
    # the plan as the engine priced runs it (its settings and recomputation), which may not be the file's engine
    shown = plan if args.engine == plan.engine else plan.for_engine(args.engine)
    if args.plan:
        shown = as_priced_on(shown, inventory, "hetauto simulate")
    print(format_summary(shown, est.to_dict()))
    if cost is not None:
        print(f"\ncost: {cost:.4f} per 1M tokens (price per device-hour x devices used)")
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return 0
