"""`hetauto plan`: search the best heterogeneous plan and write it with its launch material."""
from __future__ import annotations

import dataclasses
import os
import sys

from ..outputs import json_text, output_errors, refuse_folder_over_files, refuse_overwriting_inputs
from ._common import (add_memory_job_arg, add_model_inventory_args, add_precision_arg, check_budget_s,
                      check_output_dir, check_output_file, check_timeline_paths, load_inputs, write_timelines)
from ._plan_constraints import (NameList, check_deepspeed_constraints, check_selective_runs, constraints_from_args,
                                search_explained, without_excluded_unable)
from ._plan_from import (JOB_DEFAULTS, at_kept_precision, drop_seq_length_for_another_model, keep_job_of,
                         keep_search_of, say_own_seq_length)

DESCRIPTION = """\
Search how to train a model on a multi-cluster device inventory: which clusters take part and in what
pipeline order, TP and DP inside each cluster, how many layers each stage gets (uneven), micro-batch sizes
and recomputation. A Monte-Carlo tree search (UCT) walks these decisions guided by the cost model, the layer
split is solved exactly for every candidate, and the best candidates are re-checked by an event-level 1F1B
simulation (docs/search.md, docs/cost-model.md).

The objective is the highest throughput (--objective throughput, the default) or the least cost per token
(--objective cost: each cluster's price_per_device_hour in the inventory, for the devices the plan uses;
reported as cost per 1M tokens whenever the clusters of the plan have prices). Constraints narrow the search:
--max-devices, --use-clusters / --exclude-clusters (pin clusters in or out), --tp CLUSTER=N and
--recompute CLUSTER=MODE (pin a cluster's TP or recomputation), --max-pp (pipeline stages in all),
--micro-batch-size and --max-iteration-s (a throughput floor, e.g. for the cost objective). The plan records them (estimate.search; docs/search.md), and re-planning with --from keeps
them unless their flag is given.

By default (--shapes all) the search also considers several pipelines joined by data parallelism (the clusters
partitioned into pipelines, the batch split by their speed, their gradients summed after each iteration) and
replica groups of another TP or device type alongside a mesh's stages, and keeps whichever plan is best: the
new shapes never make the plan worse; --shapes simple plans one pipeline with one mesh per cluster
(docs/search.md). A plan may give one cluster several consecutive meshes (e.g. the embedding's stage at TP 1,
the rest at TP 2; docs/plan-format.md); the search gives each cluster one mesh per pipeline; write such a
split into the plan file by hand and check it with 'hetauto simulate --plan'.

Prints the plan summary (per stage: cluster, devices, TP/DP, layers, time, memory, utilisation). With -o the
plan is written (YAML, or JSON for a .json name; docs/plan-format.md); with --emit DIR also the per-cluster
Megatron launch scripts and DeepSpeed configs. Same inputs and --seed give the same plan.

exit codes: 0 ok; 2 invalid input (the message names file, field and fix; e.g. an unknown cluster in a
constraint, --objective cost without a cluster's price, or -o, --timeline or --emit naming an input file or one
another, refused before anything is written); 3 no feasible plan (the message says by how much memory the closest
layout misses, and which constraint binds when lifting one would make a plan feasible)."""

EPILOG = """\
examples:
  hetauto plan --model llama2-70b --inventory examples/llama/inventory-2clusters.yaml -o plan.yaml
  hetauto plan --model config.json --inventory inv.yaml --global-batch-size 1024 --seq-length 4096 --json
  hetauto plan --model llama2-7b --inventory inv.yaml --search exhaustive      # small instances only
  hetauto plan --model llama2-7b --inventory a100-v100.yaml --precision fp16   # V100 has no bf16
  hetauto plan --model llama2-70b --inventory inv.yaml -o plan.yaml --emit launch/
  hetauto plan --model llama2-70b --inventory inv.yaml --explain --timeline plan.png   # why, and what it does
  hetauto plan --model llama2-70b --inventory inv.yaml --set link.h800-ascend.bandwidth_gbps=100  # what-if
  hetauto plan --model llama2-70b --inventory inv-without-a100.yaml --from plan.yaml -o plan2.yaml
  hetauto plan --model llama2-7b --inventory priced.yaml --objective cost       # least cost per 1M tokens
  hetauto plan --model llama2-70b --inventory inv.yaml --shapes simple   # one pipeline, one mesh per cluster
  hetauto plan --model llama2-70b --inventory inv.yaml --max-devices 256 --exclude-clusters ascend \\
      --tp h800=8 --recompute a100=full --max-pp 16 --micro-batch-size 1"""


def add_arguments(parser) -> None:
    add_model_inventory_args(parser)
    add_precision_arg(parser, None)        # None: --from's plan's, else bf16 (resolved in run)
    add_memory_job_arg(parser)
    parser.add_argument("--global-batch-size", type=int, default=None, metavar="N",
                        help="sequences per iteration (default 512; with --from, the old plan's)")
    for flag, where in (("--hidden-dropout", "after the embedding and each layer's attention and MLP"),
                        ("--attention-dropout", "on the attention probabilities")):
        parser.add_argument(flag, type=float, default=None, metavar="P",
                            help=f"the job's dropout probability {where} (Megatron's {flag}), run by every mesh and "
                                 "priced: above 0 each such dropout keeps its mask for the backward pass (default 0, "
                                 "as LLM pre-training runs; with --from, the old plan's)")
    parser.add_argument("--search", choices=("mcts", "exhaustive"), default="mcts",
                        help="mcts (default) or exhaustive (every leaf of the same tree; small instances: it says "
                             "its progress on stderr and stops at --budget-s with the best leaf so far)")
    parser.add_argument("--iterations", type=int, default=0, metavar="N",
                        help="MCTS playouts in all, N / 6 per tree in six trees, at least one each (default, or "
                             "0: from the tree's estimated size; docs/search.md); not with --search exhaustive")
    parser.add_argument("--budget-s", type=float, metavar="S",
                        help="stop the search (tree or exhaustive, and the new shapes') after S seconds, keeping the "
                             "best plan found so far; the output then says '(cut by --budget-s)'; a first Ctrl-C "
                             "does the same (a second stops the command)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the search (default 0)")
    parser.add_argument("--engine", choices=("megatron", "deepspeed"), default=None,
                        help="the pipeline engine the plan is for: megatron (hetauto's runtime and Megatron-LM; the "
                             "default) or deepspeed (DeepSpeed's pipeline engine, run with the configs 'hetauto emit "
                             "deepspeed' writes: one pipeline of single meshes with equal TP, DP and micro-batch, one "
                             "vendor, no selective recomputation, every boundary blocking, its TrainSchedule and pipe "
                             "buffers, the DP reduction after the last backward); the plan file records it "
                             "(docs/deepspeed.md); with --from, the old plan's")
    parser.add_argument("--boundary-schedule", choices=("overlapped", "blocking"), default=None,
                        help="cross-cluster pipeline boundaries: overlapped (the default: asynchronous transfers, "
                             "warm-up depth chosen per boundary) or blocking (the sender waits for each transfer, "
                             "as Megatron's own P2P does); with --from, the old plan's; docs/search.md")
    g = parser.add_argument_group("objective and constraints (docs/search.md)")
    g.add_argument("--objective", choices=("throughput", "cost"), default=None,
                   help="throughput (default: the shortest iteration) or cost (the least cost per token, from each "
                        "cluster's price_per_device_hour for the devices the plan uses, weighed by time: a plan k "
                        "times as fast wins when it costs under k^0.01 times as much, e.g. twice as fast for 0.7 %% "
                        "more; every cluster the search may use needs a price)")
    g.add_argument("--max-devices", type=int, metavar="N", help="use at most N devices in all")
    g.add_argument("--use-clusters", metavar="A,B", action=NameList,
                   help="clusters that must take part (others may join too; repeatable)")
    g.add_argument("--exclude-clusters", metavar="C,D", action=NameList,
                   help="clusters the plan must not use (repeatable)")
    g.add_argument("--tp", action="append", default=[], metavar="CLUSTER=N",
                   help="pin a cluster's tensor-parallel degree (repeatable), e.g. --tp h800=8")
    g.add_argument("--recompute", action="append", default=[], metavar="CLUSTER=MODE",
                   help="pin a cluster's recomputation (repeatable): none, selective (each layer's MLP re-run in "
                        "the backward) or full (each layer's whole forward re-run), e.g. --recompute a100=full "
                        "(default: the lightest that fits)")
    g.add_argument("--max-pp", type=int, metavar="N", help="at most N pipeline stages in all")
    g.add_argument("--micro-batch-size", type=int, metavar="N",
                   help="every mesh runs micro-batches of N samples (dividing the global batch)")
    g.add_argument("--max-iteration-s", type=float, metavar="SECONDS",
                   help="a throughput floor: no plan slower than SECONDS per iteration (with --objective cost: the "
                        "cheapest plan that runs at least this fast)")
    parser.add_argument("--shapes", choices=("all", "simple"), default=None,
                        help="all (default): also plan several pipelines joined by data parallelism and mixed replica "
                             "groups in a stage, keeping the best of those and the single pipeline; simple: one "
                             "pipeline, one mesh per cluster (docs/search.md); --emit writes Megatron-LM launch scripts "
                             "for every shape, DeepSpeed configs for the simple one. With --from, the setting the old "
                             "plan was searched with (all where its file does not say)")
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="processes the search runs on (default 0: one per available core); the plan depends "
                             "on --seed only, not on N")
    parser.add_argument("--from", dest="from_plan", metavar="PLAN",
                        help="re-plan after an inventory change: start from this plan (warm start: about a tenth of a "
                             "cold search's time on the 736-device example, docs/search.md; a plan of several "
                             "pipelines or replica groups side by side seeds it with each pipeline, and the new "
                             "shapes are searched again with it as the plan to beat, where it still runs) and print "
                             "what moved; the job stays the old plan's (global "
                             "batch, precision, sequence length unless --model is another model, engine, boundary "
                             "schedule, --shapes) and so do its "
                             "objective and constraints (--objective, --max-devices, --use-clusters, "
                             "--exclude-clusters, --tp, --recompute, --max-pp, --micro-batch-size, --max-iteration-s; "
                             "a pin of a cluster no longer in the inventory, or that a flag given contradicts, is "
                             "dropped) unless its flag is given; stderr says what was kept")
    parser.add_argument("-o", "--output", metavar="PLAN", help="write the plan file (YAML; JSON if it ends in .json, "
                        "in any case); naming an input file (--inventory, --model, --from) or a --timeline is refused")
    parser.add_argument("--emit", metavar="DIR", help="also write Megatron launch scripts and DeepSpeed configs "
                                                      "per cluster into DIR (needs -o); the DeepSpeed configs only "
                                                      "where DeepSpeed runs the plan (one pipeline, one DP size), "
                                                      "said on stderr")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--timeline", action="append", metavar="FILE",
                        help="write the plan's predicted iteration: FILE.json a Chrome/Perfetto trace, FILE.png a "
                             "picture (.svg and .pdf too; repeatable; 'hetauto simulate --help')")
    parser.add_argument("--explain", action="store_true",
                        help="also explain the plan: bottleneck, memory headroom, runners-up, sensitivity "
                             "('hetauto explain --help'; skipped after a Ctrl-C of the search)")


def given_dropouts(args, kept: dict) -> dict:
    """The job's dropouts given by --hidden-dropout / --attention-dropout -> {setting: probability}; a flag given
    replaces what --from kept of the old plan (dropped from `kept`). Every mesh the search builds runs them
    (SearchConfig.job_settings), so the memory model prices their masks."""
    from ..errors import InputError
    from ..plan.settings import JOB_SETTING_KEYS
    given = {}
    for key in JOB_SETTING_KEYS:
        value = getattr(args, key, None)
        if value is None:
            continue
        if not 0 <= value < 1:      # (NaN fails this too)
            flag = "--" + key.replace("_", "-")
            raise InputError(f"must be a probability from 0 up to (not including) 1, got {value:g}", field=flag,
                             fix=f"give {flag} 0 (no dropout, the default) or e.g. {flag} 0.1")
        given[key] = float(value)
        kept.pop(key, None)
    return given


def run(args) -> int:
    from ..errors import InputError
    from ..plan.search import SearchConfig
    from ..plan.settings import job_settings
    from ..plan.simulate import simulate
    from ..plan.plan import check_global_batch_size
    from ..plan.engines import ENGINES, check_engine_precision
    old = warm = None
    kept = {}
    schedule_given = args.boundary_schedule      # (before a --from plan or the default fills it in)
    shapes_given = args.shapes
    refuse_overwriting_inputs([("-o", args.output)] + [("--timeline", t) for t in args.timeline or []],
                              [("--model", args.model), ("--inventory", args.inventory), ("--from", args.from_plan),
                               ("--cost-model", args.cost_model)])
    # (before check_output_dir, which would call the file -o writes merely "not a directory")
    refuse_folder_over_files(("--emit", args.emit), [("-o", args.output)] + [("--timeline", t)
                                                                          for t in args.timeline or []])
    if args.from_plan:
        from ..plan.plan import load_plan
        old = load_plan(args.from_plan)
        kept = keep_job_of(old, args)
    for name, default in JOB_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    dropouts = given_dropouts(args, kept)
    check_global_batch_size(args.global_batch_size, field="--global-batch-size")
    check_output_file(args.output, "-o")
    if args.emit:
        check_output_dir(args.emit, "--emit")       # e.g. --emit inv.yaml: a file, refused before the search
    read = None
    if old is not None and "seq_length" in kept:    # (read once: the model is built from it twice, a pipe too)
        from ..spec.model import read_model
        read = read_model(args.model)
    another_model = read is not None and drop_seq_length_for_another_model(old, args, kept, read)
    model, inventory, cost_model = load_inputs(args, model_read=read)
    if old is not None:
        from ._common import warn_if_priced_otherwise
        warn_if_priced_otherwise(cost_model, old, args.from_plan, "plan")   # what moved would be the model's doing
        # a cluster that cannot train at the job's precision and that the old plan does not use was left out of its
        # search (--exclude-clusters, which the plan records without it, as its inventory is): it stays out
        from ._common import without_unused_unable
        inventory = without_unused_unable(inventory, args.precision, [m.cluster for m in old.meshes], "hetauto plan")
    inventory = without_excluded_unable(inventory, args)
    if "precision" in kept:
        inventory = at_kept_precision(inventory, old, args.from_plan)
    inventory = inventory.with_precision(args.precision)   # every device priced at the job's precision
    if args.iterations < 0:
        raise InputError(f"must not be negative, got {args.iterations}", field="--iterations",
                         fix="give the MCTS playouts in all, or 0 for the default from the tree's size")
    if args.iterations and args.search == "exhaustive":     # it was taken and did nothing
        raise InputError("sets the MCTS playouts; --search exhaustive evaluates every layout", field="--iterations",
                         fix="drop --iterations, or search with mcts")
    check_budget_s(args.budget_s, "the search's time limit", 30)
    if args.workers < 0:
        raise InputError(f"must not be negative, got {args.workers}", field="--workers",
                         fix="give a number of processes, or 0 for one per core")
    if args.emit and not args.output:
        raise InputError("--emit needs the plan written too", field="--emit", fix="add -o plan.yaml")
    if args.engine:
        check_engine_precision(args.engine, args.precision, field="--precision", command="plan")
    check_timeline_paths(args.timeline)
    if old is not None and (old.model.num_layers != model.num_layers or old.model.hidden_size != model.hidden_size):
        raise InputError(f"was made for {old.model.name} ({old.model.num_layers} layers, hidden "
                         f"{old.model.hidden_size}), not {model.name} ({model.num_layers} layers, hidden "
                         f"{model.hidden_size})", file=args.from_plan, field="model",
                         fix="pass the plan made for this --model, or drop --from for a cold search")
    if another_model and model.seq_length != old.model.seq_length:    # (the same length: nothing to say)
        say_own_seq_length(old, args, model)
    con = constraints_from_args(args)
    if old is not None:
        from ..plan.engines import DEFAULT_ENGINE
        from ..plan.replan import warm_layouts
        from ..plan.space import SearchSpace
        con = keep_search_of(old, args, con, inventory, kept, model)
        # the warm start as the constrained tree would hold it (under --max-devices, fewer stages where the cap
        # binds), not one the search then drops as breaking a constraint
        warm = warm_layouts(old, SearchSpace(model, inventory, args.global_batch_size, cost_model, constraints=con,
                                             engine=args.engine or DEFAULT_ENGINE,
                                             job_settings=job_settings({**kept, **dropouts})))
    if args.engine == "deepspeed":
        check_deepspeed_constraints(con, inventory, schedule_given, shapes_given)
    check_selective_runs(con, model, args.engine)
    cfg = SearchConfig(method=args.search, iterations=args.iterations, budget_s=args.budget_s, seed=args.seed,
                       progress=not args.quiet and not args.json, workers=args.workers, warm_start=tuple(warm or ()),
                       warm_plan=old, job_settings=job_settings({**kept, **dropouts}),  # (the flags', else --from's)
                       schedule=args.boundary_schedule, constraints=con, engine=args.engine)
    # DeepSpeed's engine runs one pipeline of single meshes (engines.py ENGINES; the evaluator plans its uniform
    # layouts and blocking boundaries only)
    shapes = "simple" if ENGINES[args.engine].simple_only else args.shapes
    from ..plan.stop import ctrl_c_keeps_best
    with ctrl_c_keeps_best("hetauto plan") as ctrl_c:     # the first Ctrl-C ends the search with its best so far
        result = search_explained(model, inventory, args.global_batch_size, cost_model, cfg, shapes)
    plan = result.plan.for_engine(args.engine)
    estimate = simulate(plan, inventory, cost_model, engine=plan.engine)
    # the plan records what was searched: DeepSpeed's engine, simple shapes and blocking boundaries whatever the
    # defaults said
    searched_schedule = "blocking" if ENGINES[args.engine].blocking_boundaries else cfg.schedule
    plan = dataclasses.replace(plan, estimate=plan_estimate(plan, inventory, estimate, result, con, shapes,
                                                            args.memory_job, searched_schedule, ctrl_c.pressed))
    inputs = [("--model", args.model), ("--inventory", args.inventory), ("--from", args.from_plan),
              ("--cost-model", args.cost_model)]
    timelines = [("--timeline", t) for t in args.timeline or []]
    emitted, note = emitted_files(plan, args.output) if args.emit else ([], None)
    # every output named before the first is written (the launch scripts' names come from the plan): -o
    # DIR/h800.sh with --emit DIR wrote the plan, and the script refused to overwrite it after
    refuse_overwriting_inputs([("-o", args.output), *timelines,
                               *[("--emit", os.path.join(args.emit, name)) for name, _, _ in emitted]], inputs)
    if args.timeline:
        from ..plan.timeline import check_timeline_size
        check_timeline_size(plan)           # (before the plan file: nothing written, or everything asked)
    written = []
    if args.output:
        with output_errors(args.output, "-o"):      # e.g. -o /proc/p.yaml: the folder exists but takes no files
            plan.save(args.output)
        written.append(args.output)
    if args.timeline:
        from ..plan.timeline import predicted_timeline
        written += write_timelines(args.timeline, [predicted_timeline(plan, inventory, cost_model)])
    if args.emit:
        from ..outputs import make_output_dir
        from .emit import deepspeed_notes, warn_stale, write_files
        make_output_dir(args.emit, "--emit")
        if any(name.startswith("ds_config.") for name, _, _ in emitted):
            for ds_note in deepspeed_notes(plan, args.output):
                print(f"hetauto plan: {ds_note}", file=sys.stderr)
        emitted = write_files(emitted, args.emit, "--emit", keep=[("-o", args.output), *inputs, *timelines])
        if note:        # what was left out, once the rest is written (a refused file says only its paragraph)
            print(f"hetauto plan: {note}", file=sys.stderr)
        warn_stale(args.emit, emitted, "hetauto plan")
        written += emitted
    explained = None
    if args.explain and ctrl_c.pressed:
        # its what-ifs are searches too (seconds each): after a Ctrl-C the user wants the plan, not more searching
        print("hetauto plan: --explain skipped after the Ctrl-C; 'hetauto explain --plan FILE' explains the plan "
              "written", file=sys.stderr)
    elif args.explain:
        from .explain import explain_report
        explained = explain_report(plan, inventory, cost_model, shapes_result=result, seed=args.seed,
                                   progress=not args.quiet and not args.json, workers=args.workers,
                                   budget_s=args.budget_s,      # its re-plans capped as the search was
                                   skip_hint="drop --explain to skip them")
    moved = None
    if old is not None:
        from ..plan.replan import describe_moves
        moved = describe_moves(old, plan)
    if args.json:
        search_record = {**plan.estimate["search"], "seconds": round(result.seconds, 3),
                         "cut_by_ctrl_c": ctrl_c.pressed}
        from ._common import json_document
        # keys that do not apply are null, never absent (docs/explain.md): the plan file's estimate leaves the
        # cost out when a cluster has no price and the learned model's reasons out when it prices nothing, and
        # --explain and --from add their parts only when given
        print(json_text(json_document("plan", {
            **plan.estimate, "cost_model_why": plan.estimate.get("cost_model_why"),
            "cost_per_million_tokens": plan.estimate.get("cost_per_million_tokens"),
            "search": search_record, "plan": plan.to_dict(), "written": written, "explain": explained or None,
            "moved": moved, "kept_from_plan": kept if moved is not None else None}), indent=2))
        return 0
    from ..emit.summary import format_summary
    print(format_summary(plan, plan.estimate))
    if plan.estimate.get("cost_per_million_tokens") is not None:
        print(f"\ncost: {plan.estimate['cost_per_million_tokens']:.4f} per 1M tokens (price per device-hour x "
              f"devices used; objective: {con.objective})")
    print(f"\nsearch: {result.method}, {result.candidates_evaluated} layouts evaluated in {result.seconds:.2f} s"
          + (" (cut short by Ctrl-C)" if ctrl_c.pressed else " (cut by --budget-s)" if result.cut_by_budget else "")
          + (f", warm start from {args.from_plan}" if old is not None else ""))
    if result.partitions or result.alongside_tried:
        from ..emit.summary import count_noun
        from ..plan.shapes import describe_shape
        cut = getattr(result, "partitions_cut", False)
        print(f"new shapes: {count_noun(result.partitions, 'partition')} of the clusters into pipelines bounded"
              + (" (the first, fewer pipelines and more clusters first: there are too many to bound them all)"
                 if cut else "") + ", "
              f"{result.partitions_searched} searched; {count_noun(result.alongside_tried, 'replica group')} side by "
              "side priced; "
              + (f"the plan has {describe_shape(plan.meshes)[0]} (one pipeline of single meshes: "
                 + (f"{result.simple.iteration_time_s:.3f} s)" if result.simple is not None else
                    "none follows the constraints)") if not plan.is_simple else "one pipeline of single meshes kept"))
    if moved is not None:
        print("\nwhat moved since " + args.from_plan + ":\n" + "\n".join("  " + line for line in moved))
    if explained:
        from .explain import format_report
        print("\n" + format_report(explained))
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return 0


def plan_estimate(plan, inventory, estimate, result, con, shapes: str = "all", memory_job: str | None = None,
                  schedule: str | None = None, ctrl_c: bool = False) -> dict:
    """The plan's `estimate`: the simulation, the cost per 1M tokens when its clusters have prices, and how the
    plan was made (search method, objective, constraints, the --shapes setting: `shapes.setting`, which --from
    keeps; the --memory-job every stage was also fitted to, which simulate, explain, compare and --from apply; the
    --boundary-schedule searched with, which --from and explain's re-plans keep: replan.searched_schedule).
    `ctrl_c`: a Ctrl-C stopped the search, which `cut_by_budget` says as for --budget-s, also where no part of the
    search had noticed it yet (the final re-check, say)."""
    from .. import tool_version
    from ..plan.constraints import cost_per_million_tokens
    from ..plan.plan_file import layout_digest
    tokens = plan.global_batch_size * plan.model.seq_length
    cost = cost_per_million_tokens(inventory, plan.meshes, estimate.iteration_time_s, tokens)
    record = {**result.to_dict(), "objective": con.objective, "constraints": con.active}
    record["cut_by_budget"] = bool(record.get("cut_by_budget")) or ctrl_c
    record["shapes"] = {"setting": shapes, **record.get("shapes", {})}
    if memory_job not in (None, "none"):
        record["memory_job"] = memory_job
    if schedule is not None:
        record["boundary_schedule"] = schedule
    record["hetauto_version"] = tool_version()     # which planner wrote it, for a plan read months later
    # the file holds what the inputs and the seed decide, so that the same ones write the same bytes: the search's
    # wall time goes to stderr and --json only
    record.pop("seconds", None)
    return {**estimate.to_dict(), **({"cost_per_million_tokens": cost} if cost is not None else {}),
            "search": record, "layout_digest": layout_digest(plan)}


def emitted_files(plan, plan_path: str) -> tuple[list[tuple], str | None]:
    """What 'hetauto emit megatron|deepspeed|summary -o DIR' would write for every cluster of the plan, as
    (name, text, mode) each, and a note for stderr on what is left out (or None): named before anything is written,
    so that one over another output or an input is refused while nothing is on disk yet."""
    from ..emit.deepspeed import check_one_grid, deepspeed_config, emit_deepspeed, unsupported_features
    from ..emit.megatron import emit_megatron
    from ..emit.summary import format_summary
    from ..errors import InputError
    from .emit import deepspeed_files, megatron_files, summary_files
    summary = summary_files(format_summary(plan, plan.estimate))
    if plan.engine == "deepspeed":      # made for DeepSpeed's pipeline engine: its configs are what runs it
        return deepspeed_files(emit_deepspeed(plan), unsupported_features(plan)) + summary, (
            "the plan is for DeepSpeed's pipeline engine (--engine deepspeed): DeepSpeed configs written, no "
            "Megatron-LM launch scripts ('hetauto emit megatron' writes them; they run 1F1B, which the plan's "
            "estimate does not price)")
    files = megatron_files(emit_megatron(plan, plan_path=os.path.abspath(plan_path), file=plan_path))
    if plan.is_simple:
        # meshes of different DP are no DeepSpeed job (check_one_grid, which 'hetauto emit deepspeed' exits 2 by):
        # the plan is fine for the Megatron-LM scripts, so they are written and the DeepSpeed configs left out
        blocks = [deepspeed_config(plan, i)["hetauto"] for i in range(len(plan.meshes))]
        try:
            check_one_grid(blocks, file=plan_path)
        except InputError as exc:
            return files + summary, (f"no DeepSpeed configs written: {exc.reason} ('hetauto plan --engine "
                                     "deepspeed' plans one it runs)")
        return files + deepspeed_files(emit_deepspeed(plan), unsupported_features(plan)) + summary, None
    # DeepSpeed's pipeline engine runs one pipeline of equal stages; the Megatron-LM scripts run every shape.
    from ..plan.shapes import describe_shape
    return files + summary, (f"no DeepSpeed configs written: this plan has {describe_shape(plan.meshes)[0]}, which "
                             "only the Megatron-LM launch scripts run (--shapes simple plans a shape DeepSpeed takes "
                             "too)")
