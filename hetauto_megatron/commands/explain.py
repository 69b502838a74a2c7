"""`hetauto explain`: why this plan - its bottleneck, memory headroom, the runners-up, and what-if sensitivity."""
from __future__ import annotations

import sys
import time

from ..outputs import json_text

DESCRIPTION = """\
Explain a plan before booking the devices:

  bottleneck   the iteration cut into the slowest stage's compute, the pipeline bubble (1F1B fill and
               drain), the exposed link time (what the links add on top), DP synchronisation, the
               optimizer step and the fixed per-iteration overhead; the parts add up to the predicted
               iteration time, the largest one is the
               bottleneck (each part is what the iteration would save without it: the event simulation
               is re-run with that cost removed);
  memory       headroom per stage: capacity minus the busiest device's predicted memory;
  runners-up   the 5 best other layouts of the search, their predicted throughput and the decision in
               which each differs from the plan (cluster order, TP, DP, micro-batch, stages, recompute);
               for a plan of several pipelines or replica groups side by side, the alternatives the whole
               search weighed (the best single pipeline, each partition into pipelines, each cluster with
               groups alongside) and this plan's throughput against each;
  sensitivity  throughput at half and twice each inter-cluster link's bandwidth and the global batch (the
               plan's layout re-simulated), and each cluster's node count (re-planned: a bigger cluster
               allows other layouts); links the plan does not cross at twice their bandwidth (re-planned:
               would a faster link bring another cluster in?); where the plan overlaps its cross-cluster
               transfers with compute, its throughput with those boundaries blocking instead.

The model and inventory default to those stored in the plan (a 'hetauto plan -o' file has both);
--set overrides the inventory first (what-if). Text by default, --json for scripts. --no-search skips the
runners-up and the re-planned sensitivities (one search each: the inventory as it is, each link the plan does
not use, each cluster at half and twice its nodes; 14 for the 4-cluster example, over a hundred for 20 clusters:
about a second each for two clusters, a few seconds each for 736 devices, so half a minute in all there on two
cores; run --workers at a time, one per core by default; a line on stderr after each, --quiet drops them).

exit codes: 0 ok, 2 invalid input, 3 no layout fits the inventory at all (the runners-up and re-planned what-ifs
have nothing to weigh the plan against; --no-search explains the plan alone)."""

EPILOG = """\
examples:
  hetauto plan --model llama2-70b --inventory examples/llama/inventory-2clusters.yaml -o plan.yaml
  hetauto explain --plan plan.yaml
  hetauto explain --plan plan.yaml --set link.h800-ascend.bandwidth_gbps=100 --json
  hetauto explain --plan my-plan.yaml --model llama2-70b --inventory inv.yaml --no-search
  hetauto plan --model llama2-70b --inventory inv.yaml --explain        # plan and explain in one go"""


def add_arguments(parser) -> None:
    parser.add_argument("--plan", required=True, metavar="PLAN", help="plan file from 'hetauto plan' (YAML or JSON)")
    add_plan_input_args(parser)
    parser.add_argument("--runners-up", type=int, default=5, metavar="K", help="runner-up layouts to show (default 5)")
    parser.add_argument("--no-search", action="store_true",
                        help="skip the runners-up and the re-planned cluster-size sensitivities")
    parser.add_argument("--seed", type=int, default=0, help="seed of the searches (default 0)")
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="processes the re-planned what-ifs are searched in (default 0: one per available "
                             "core); the report depends on --seed only (and, where it cuts a search, --budget-s), "
                             "not on N")
    parser.add_argument("--budget-s", type=float, metavar="S",
                        help="cap each re-planned what-if's search at S seconds, as 'hetauto plan --budget-s' caps "
                             "its search (default: none; a large inventory's re-plans take minutes in all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def add_plan_input_args(parser) -> None:
    """--model/--inventory/--cost-model/--set for commands that read a plan file (explain, compare, dryrun)."""
    parser.add_argument("--model", metavar="M", help="the plan's model as a preset, YAML or config.json (default: the "
                                                     "model stored in the plan)")
    parser.add_argument("--inventory", metavar="I", help="inventory YAML (default: the one stored in the plan)")
    parser.add_argument("--cost-model", metavar="DIR", help="a learned cost model from 'hetauto fit' (default: analytic)")
    from ..spec.whatif import keys_line
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="what-if override of the inventory (repeatable): " + keys_line() + "; units in "
                             "docs/explain.md; e.g. link.A-B.bandwidth_gbps=100 or cluster.NAME.nodes=8")


def plan_inputs(args, plan_path: str, plan=None):
    """(plan, inventory, cost model) for a plan file (every shape): the model and inventory it carries unless
    given."""
    import dataclasses

    from ..cost.learned import load_cost_model
    from ..errors import InputError
    from ..plan.plan import load_plan
    from ..spec.model import load_model
    from ..spec.whatif import apply_overrides
    plan = plan or load_plan(plan_path)
    if getattr(args, "model", None):
        model = load_model(args.model)
        if (model.num_layers, model.hidden_size) != (plan.model.num_layers, plan.model.hidden_size):
            raise InputError(f"the plan is for {plan.model.name} ({plan.model.num_layers} layers, hidden "
                             f"{plan.model.hidden_size}), --model is {model.name}", file=plan_path, field="model",
                             fix="pass the plan's model, or leave --model out to use the one in the plan")
        try:
            plan = dataclasses.replace(plan, model=model)
        except InputError as exc:   # the --model's shape does not suit the plan's meshes (TP vs heads, SP vs sequence)
            raise InputError(f"does not suit the layout of {plan_path}: {exc.reason}", file=args.model,
                             field="--model", fix="give a model the plan's layout runs, or make a plan for this one: "
                             f"hetauto plan --model {args.model}") from None
    from ._common import as_priced_on, inventory_of
    inventory = inventory_of(getattr(args, "inventory", None) or None, plan, plan_path)
    if getattr(args, "inventory", None):
        # a TF32 choice the plan's launch does not make is said (the figures follow --inventory)
        as_priced_on(plan, inventory, f"hetauto {getattr(args, 'command', None) or 'explain'}")
    inventory = apply_overrides(inventory, getattr(args, "set", None))
    from ._common import without_unused_unable
    inventory = without_unused_unable(inventory, plan.precision, [m.cluster for m in plan.meshes],
                                      f"hetauto {getattr(args, 'command', None) or 'explain'}")
    from ..plan.simulate import check_plan_against_inventory
    from ._common import plan_error
    try:        # up front: an inventory the plan does not fit was found only after the what-ifs were re-planned
        check_plan_against_inventory(plan, inventory)
    except InputError as exc:
        raise plan_error(exc, plan_path, getattr(args, "set", None)) from None
    cost_model = load_cost_model(getattr(args, "cost_model", None))
    # the plan's memory job, decided at its precision as every command decides it (plan/memory_fit.py)
    from ._common import apply_memory_job, at_plan_precision, use_recorded_memory_job
    use_recorded_memory_job(cost_model, plan, plan_path)       # the --memory-job the plan was fitted to
    from ._common import warn_if_priced_otherwise
    warn_if_priced_otherwise(cost_model, plan, plan_path, getattr(args, "command", None) or "explain")
    apply_memory_job(cost_model, at_plan_precision(inventory, plan, plan_path))
    return plan, inventory, cost_model


# The re-planned what-ifs searched ahead in worker processes (forked, they inherit it; set and cleared by
# _search_ahead): the search function and the inventories.
_AHEAD: dict = {}


def _ahead_job(i: int) -> tuple[int, tuple | None]:
    from ..errors import InfeasibleError
    try:
        inv = _AHEAD["inventories"][i]
        return i, _AHEAD["outcome"](_AHEAD["search"](inv), inv)
    except InfeasibleError:     # re-run where the sensitivity asks for it, which notes it (sensitivity._replanned)
        return i, None


def _search_ahead(inventories: list, search_one, workers: int, on_done, outcome=None) -> dict:
    """{index: outcome(result, inventory)} (by default the iteration time) of `search_one` on each inventory that
    has a feasible plan, in `workers` processes forked now, each search on one core (as one search alone runs it:
    the same plan, which depends on its seed only); `on_done()` after each found."""
    import multiprocessing

    from ..plan import stop
    _AHEAD.update(search=search_one, inventories=inventories,
                  outcome=outcome or (lambda result, inv: result.iteration_time_s))
    try:
        # the workers leave a Ctrl-C to this process, which ends them with the pool (each raised KeyboardInterrupt
        # and printed its traceback under the command's one line "interrupted")
        with multiprocessing.get_context("fork").Pool(min(workers, len(inventories)),
                                                       initializer=stop.keep_best_in_worker) as pool:
            out = {}
            for i, seconds in pool.imap_unordered(_ahead_job, range(len(inventories))):
                if seconds is not None:
                    out[i] = seconds
                    on_done()
            return out
    finally:
        _AHEAD.clear()


def explain_report(plan, inventory, cost_model, *, search_result=None, shapes_result=None, do_search: bool = True,
                   k: int = 5, seed: int = 0, progress: bool = False, workers: int = 1,
                   budget_s: float | None = None, skip_hint: str = "--no-search skips them") -> dict:
    """Everything `hetauto explain` prints, as one JSON-able dict. `skip_hint`: how the progress lines say to skip
    the re-plans (`plan --explain` has no --no-search). `search_result` (the single-pipeline search) or
    `shapes_result` (the whole search, shapes_result.ShapesResult): a search already run on the same inputs (plan
    --explain), reused for the runners-up; a plan of the new shapes lists the alternatives the whole search
    weighed (the best single pipeline, each partition into pipelines and each cluster with groups alongside).
    `progress`: a line on stderr per re-planned what-if (each is a whole search). `workers`: processes the
    re-planned what-ifs are searched in (0: one per available core); the report does not depend on it."""
    from ..errors import InputError
    from ..plan import explain as X
    from ..plan import sensitivity as S
    from ..plan.constraints import Constraints, cost_per_million_tokens, devices_by_cluster
    from ..plan.multi_search import search_shapes
    from ..plan.search import SearchConfig, search
    from ..plan.settings import shared_job_settings
    from ..plan.search_jobs import default_workers
    from ..plan.simulate import simulate
    # re-planned under the plan's own boundary schedule, objective and constraints (as its estimate recorded them)
    try:
        constraints = Constraints.from_record((plan.estimate or {}).get("search"))
    except InputError:
        if do_search:       # the re-plans search under them: the paragraph names the record
            raise
        constraints = Constraints()     # --no-search reads only the objective of it, as simulate reads none
    from ..plan.replan import searched_schedule
    schedule = searched_schedule(plan)  # (a plan that crosses no cluster boundary: the search's default)
    inventory = inventory.with_precision(plan.precision)   # re-plans train in the plan's precision too
    tokens = plan.global_batch_size * plan.model.seq_length
    # ... and for the plan's pipeline engine (DeepSpeed's: its uniform layouts, priced as it runs them)
    config = SearchConfig(seed=seed, schedule=schedule, constraints=constraints, engine=plan.engine,
                          budget_s=budget_s, job_settings=shared_job_settings(plan.meshes) or ())   # its dropouts
    searches = {}

    def key(inv):
        return (tuple((c.name, c.nodes, c.uplink_gbps) for c in inv.clusters), tuple(sorted(
            (tuple(sorted(k)), v.bandwidth_gbps) for k, v in inv.links.items())))

    # the re-planned what-ifs: the unchanged inventory, each link the plan does not cross, each cluster at x0.5, x2
    whatifs = S.replanned_inventories(plan, inventory)
    ahead = {}      # key(inventory) -> the iteration time of its search, for the what-ifs searched ahead
    t0, done = time.perf_counter(), [0]

    def searched():
        done[0] += 1
        if progress:
            print(f"explain: re-planned {done[0]} of {len(whatifs)} what-ifs, {time.perf_counter() - t0:.1f} s "
                  f"({skip_hint})", file=sys.stderr, flush=True)

    def search_one(inv):
        # a plan of one pipeline of single meshes re-plans that shape (as `plan --shapes simple` would); the other
        # shapes search every shape, as the plan's own search did
        # (under the plan's --max-iteration-s, the best found even where it is above the floor: its runners-up
        # are what the report lists, and a what-if that no plan within the floor survives is still priced)
        return (search(plan.model, inv, plan.global_batch_size, cost_model, config)
                if plan.is_simple else
                search_shapes(plan.model, inv, plan.global_batch_size, cost_model, config, over_floor_ok=True))

    def run_search(inv):
        if key(inv) not in searches:
            searches[key(inv)] = search_one(inv)
            searched()
        return searches[key(inv)]

    def outcome(result, inv):
        # (tokens/s, cost per 1M tokens of the layout the search found, None where a cluster it uses has no price,
        # its devices per cluster: sensitivity.at_least_the_plan judges it against the plan by the objective)
        t = result.iteration_time_s
        meshes = result.plan.meshes if hasattr(result, "plan") else result.choices
        return tokens / t, cost_per_million_tokens(inv, meshes, t, tokens), devices_by_cluster(meshes)

    def replan(inv):
        return ahead[key(inv)] if key(inv) in ahead else outcome(run_search(inv), inv)

    workers = default_workers() if workers == 0 else workers
    if do_search and progress:
        # said first: each re-plan is a whole search, and a large inventory's first may take a minute
        print(f"explain: re-planning {len(whatifs)} what-ifs (the inventory as it is, each unused link at x2, each "
              f"cluster at x0.5 and x2), each a whole search, in {workers} process{'es' if workers > 1 else ''} "
              f"({skip_hint})", file=sys.stderr, flush=True)
    if do_search and workers > 1:
        # the changed inventories in worker processes (the unchanged one's whole search is needed here)
        todo = list({key(inv): inv for inv in whatifs[1:] if key(inv) != key(inventory)}.values())
        if todo:
            times = _search_ahead(todo, search_one, workers, searched, outcome)
            ahead.update({key(todo[i]): seconds for i, seconds in times.items()})

    # The runners-up come from the search that made the plan where it is given; the re-planned sensitivities compare
    # with explain's own search of the unchanged inventory (the same settings as each changed one).
    if not plan.is_simple:     # several pipelines, replica groups side by side
        from ..plan.multi_explain import alternatives, shapes_report
        rep = shapes_report(plan, inventory, cost_model, replan=replan if do_search else None)
        # the objective and cost a plan of one pipeline reports too (its header gives the cost)
        rep["objective"] = constraints.objective
        rep["cost_per_million_tokens"] = cost_per_million_tokens(inventory, plan.meshes, rep["iteration_time_s"],
                                                                 tokens)
        if do_search:
            rep["runners_up"] = alternatives(shapes_result or run_search(inventory), rep["iteration_time_s"], k)
        rep["runners_up_requested"] = k
        return rep
    if shapes_result is not None and search_result is None:
        search_result = shapes_result.simple
    priced = simulate(plan, inventory, cost_model)
    est = priced.to_dict()
    bd = X.breakdown(est, plan.num_micro_batches)
    rep = {"model": plan.model.name, "devices": plan.world_size, "stages": plan.pipeline_parallel_size,
           "micro_batches": plan.num_micro_batches, "global_batch_size": plan.global_batch_size,
           "iteration_time_s": est["iteration_time_s"], "tokens_per_s": est["tokens_per_s"], "fits": est["fits"],
           "breakdown": bd, "bottleneck": X.describe_bottleneck(plan, bd),
           "objective": constraints.objective,
           # (of the unrounded time, as simulate and the what-ifs give it: the 6-decimal one moved it by 2e-6)
           "cost_per_million_tokens": cost_per_million_tokens(inventory, plan.meshes, priced.iteration_time_s, tokens),
           "memory": X.memory_headroom(est), "runners_up": None, "runners_up_requested": k, "sensitivity": None,
           # (the change against the unrounded rate: the rounded one moved a tiny rate's change by its rounding)
           "blocking_boundaries": S.blocking_boundaries(plan, inventory, cost_model, priced.tokens_per_s)}
    if do_search:
        rep["runners_up"] = X.runners_up(plan, search_result or run_search(inventory), k, inventory,
                                         constraints)
    rep["sensitivity"] = S.sensitivity(plan, inventory, cost_model, replan=replan if do_search else None)
    return rep


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def format_report(rep: dict) -> str:
    from ..plan.constraints import TIME_WEIGHT
    from ..plan.explain import PART_NAMES, grad_norm_note
    if rep.get("shape") == "pipelines":
        from ..plan.multi_explain import format_shapes_report
        return "\n".join([format_shapes_report(rep)] + _format_what_if(rep))
    bd = rep["breakdown"]
    from ..emit.summary import count_noun, distinct_gib
    out = [f"plan: {rep['model']} on {count_noun(rep['devices'], 'device')}, {count_noun(rep['stages'], 'stage')}, "
           f"{count_noun(rep['micro_batches'], 'micro-batch')}; predicted {rep['iteration_time_s']:.3f} s per iteration, {rep['tokens_per_s']:,.0f} tokens/s"
           + (f", {rep['cost_per_million_tokens']:.4f} per 1M tokens" if rep.get("cost_per_million_tokens") is not None
              else "") + ("" if rep["fits"] else "  (DOES NOT FIT in memory)")
           + ("\nobjective: the least cost per token (--objective cost); the re-planned what-ifs below minimise it "
              "too (their tokens/s is shown)" if rep.get("objective") == "cost" else ""), "",
           f"bottleneck: {rep['bottleneck']}"]
    for k, v in bd["parts"].items():
        note = ""
        if k == "link" and bd.get("link_boundary") is not None and v["seconds"] > 0:
            b = bd["link_boundary"]
            note = f"  (boundary {b} -> {b + 1} alone: {bd['link_boundary_saves_s']:.3f} s"
            if bd.get("link_boundaries"):
                note += (f"; boundaries {', '.join(f'{x} -> {x + 1}' for x in bd['link_boundaries'])} together: "
                         f"{bd['link_boundaries_save_s']:.3f} s")
            note += ")"
        if k == "tail_sync" and bd.get("grad_norm_s"):
            note = grad_norm_note(bd)
        out.append(f"  {PART_NAMES[k]:<34} {v['seconds']:>10.3f} s {100 * v['share']:>6.1f}%"
                   + ("  <- bottleneck" if k == bd["bottleneck"] else "") + note)
    out += ["", "memory headroom per stage (busiest device):",
            "  stage  cluster         used GiB  capacity GiB  headroom"]
    tight = min(rep["memory"], key=lambda m: m["headroom_share"], default=None)
    for m in rep["memory"]:
        used, room = distinct_gib(m["memory_gib"], m["capacity_gib"]), distinct_gib(m["headroom_gib"], 0.0)
        out.append(f"  {m['stage']:>5}  {str(m['cluster']):<14} {used:>9}  {m['capacity_gib']:>12.1f}  "
                   f"{room:>6} GiB ({100 * m['headroom_share']:.{0 if abs(m['headroom_share']) >= 0.005 else 1}f}%)"
                   + ("  <- least headroom" if m is tight else ""))
    if rep["runners_up"] is not None and rep.get("runners_up_requested", 1) > 0:     # (--runners-up 0: none asked)
        # with prices, each layout's cost per 1M tokens too; under --objective cost that is what ranks them
        priced = rep.get("cost_per_million_tokens") is not None
        by_cost = priced and rep.get("objective") == "cost"
        out += ["", "runners-up (the next best layouts the search re-checked, predicted"
                + (", ranked by the plan's objective: cost per token weighed by time, k times as fast wins"
                   f" below k^{TIME_WEIGHT:g} times the cost):" if by_cost else "):"),
                f"  {'#':>2}  {'tokens/s':>10}  {'vs plan':>8}" + (f"  {'per 1M tok':>10}  {'vs plan':>8}" if priced
                                                                   else "") + "  decision that differs"]
        for i, r in enumerate(rep["runners_up"], 1):     # the same tokens per iteration: throughput goes as 1 / time
            vs = _pct(rep["iteration_time_s"] / r["iteration_time_s"] - 1)     # (a rounded tokens/s can be 0)
            cost = ""
            if priced:
                c, mine = r.get("cost_per_million_tokens"), rep["cost_per_million_tokens"]
                vs_cost = _pct(c / mine - 1) if c is not None and mine else "-"
                cost = f"  {c:>10.4f}  {vs_cost:>8}" if c is not None else f"  {'-':>10}  {'-':>8}"
            out.append(f"  {i:>2}  {r['tokens_per_s']:>10,.0f}  {vs:>8}{cost}  " + "; ".join(r["differs"]))
        if not rep["runners_up"]:
            out.append("  (the search found no other layout that fits)")
    return "\n".join(out + _format_what_if(rep))


def _format_what_if(rep: dict) -> list[str]:
    """The sensitivity rows and what the overlapped boundaries are worth, for a plan of any shape."""
    by_cost = rep.get("objective") == "cost"
    out = ["", "sensitivity of throughput (tokens/s at x0.5 and x2 of one input"
           + ("; re-planned rows also their cost per 1M tokens, the objective they minimise" if by_cost else "")
           + "; '=': the plan itself, the re-plan found nothing better):"]
    for row in rep["sensitivity"]:
        cells = []
        for c in row["cases"]:
            cost = (f", {c['cost_per_million_tokens']:.4f}/1M ({_pct(c.get('cost_change'))})"
                    if by_cost and c.get("cost_per_million_tokens") is not None else "")
            mark = "=" if c.get("note", "").startswith("the plan itself") else ""
            cells.append(f"x{c['factor']:g} ({c['value']:g}): " + (f"{mark}{c['tokens_per_s']:,.0f} "
                                                                  f"({_pct(c['change'])}){cost}"
                                                                  if c["tokens_per_s"] else c.get("note", "-")))
        out.append(f"  {row['what']:<36} base {row['base']:g}: " + ";  ".join(cells) + f"  [{row['method']}]")
    if rep["runners_up"] is None:
        out.append("  (cluster sizes need a search: run without --no-search)")
    blocking = rep.get("blocking_boundaries")
    if blocking:
        out += ["", f"overlapped cross-cluster boundaries ({', '.join(blocking['boundaries'])}): blocking instead "
                    f"(same layout) {blocking['tokens_per_s']:,.0f} tokens/s ({_pct(blocking['change'])})"
                    + ("" if blocking["fits"] else ", does not fit") + ": what the plan owes to hiding those "
                    "transfers behind compute"]
    return out


def run(args) -> int:
    from ..errors import InputError
    if args.runners_up < 0:
        raise InputError(f"must not be negative, got {args.runners_up}", field="--runners-up",
                         fix="give the number of runners-up to show, 0 for none")
    if args.workers < 0:
        raise InputError(f"must not be negative, got {args.workers}", field="--workers",
                         fix="give the processes to search the what-ifs in, or 0 for one per available core")
    from ._common import check_budget_s
    check_budget_s(args.budget_s, "each re-plan's time limit", 10)
    plan, inventory, cost_model = plan_inputs(args, args.plan)
    try:
        rep = explain_report(plan, inventory, cost_model, do_search=not args.no_search, k=args.runners_up,
                             seed=args.seed, progress=not args.quiet, workers=args.workers,
                             budget_s=args.budget_s)
    except InputError as exc:
        from ._common import plan_error
        raise (plan_error(exc, args.plan, args.set) if exc.field and exc.field.startswith(("meshes", "estimate"))
               else exc) from None
    if args.json:
        from ._common import json_document
        print(json_text(json_document("explain", rep), indent=2))
    else:
        print(format_report(rep))
    return 0
