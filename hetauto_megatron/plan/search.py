"""Strategy search: Monte-Carlo tree search over a plan's sequential decisions, local search, final ranking.

The decision tree and its symmetries are in plan/space.py, its bounds in plan/space_bounds.py; one tree
search in plan/mcts.py; the local search in plan/local.py; trees and climbs as jobs for worker processes in
plan/search_jobs.py; leaves are priced by plan/evaluator.py (closed-form 1F1B, microseconds).

How much to search is decided by the problem, not by the number of clusters:
- first, a bounded enumeration (best-first branch and bound) tries to prove the tree's best `rerank` leaves:
  a node whose bound is above the `rerank`-th best leaf found is never visited, and a leaf whose cheap lower
  bound (`SearchSpace.leaf_bound`) is above it is not priced. When it finishes within
  `ENUMERATION_VISITS` nodes per estimated leaf (tried on trees of up to `ENUMERATION_TREE` leaves), its
  shortlist is the one full enumeration would re-rank (exact);
- otherwise the leaves it priced seed the trees: the best of them is the plan the trees must beat, so their
  bounds close more of the tree. On a tree estimated above `ENUMERATION_TREE` it runs only `SEED_VISITS` nodes,
  in diving order (`branch_and_bound.dive_order`: a node's bound weighed by the decisions left under it; best
  first, the 736-device example needs some 10,000 visits for its first leaf, its bounds being loose near the
  root). Where it priced none, dives seed instead: from each of the `DIVES` first decisions of lowest bound,
  the child of lowest bound down to a leaf, and a climb from the best of those leaves (a few dozen layouts);
- independent trees (seeds derived from --seed) are grown `TREE_ROUND` at a time, while a round finds a better
  plan than the best held before it (at most `TREES`). Each stops at a playout cap that grows with the tree's
  estimated size (Knuth's estimator), or earlier when it stalls;
- on a tree estimated at up to `PROVE_TREE` leaves, best first runs again, pruned by the best leaf found: it
  finds a better one or proves there is none (one estimate is heavy-tailed, so a tree of 30,000 leaves can be
  estimated above `ENUMERATION_TREE` and left to the trees), or gives up after pricing `PROVE_PRICED` leaves
  (where the bounds are loose many leaves' bounds are below the best);
- a local search climbs from the best leaf of each of the best cluster orders found; a neighbour whose lower
  bound is no better than the climb's current layout is not priced (the climb takes the same steps);
- the best distinct layouts are re-ranked with the event simulation (the closed form screens, the
  simulation decides).
Trees and climbs are independent of each other, so `workers` processes run them in parallel once the search
has run PARALLEL_AFTER_S (plan/search_jobs.py: shorter jobs gain more from sharing one process's caches); the
plan depends on the seed only (not on the worker count, nor on the machine's speed unless `budget_s` cuts the
search).
"""
from __future__ import annotations

import gc
import math
import sys
import time
from dataclasses import dataclass, field

from ..cost.analytic import AnalyticCostModel
from ..errors import InfeasibleError, InputError
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import local
from .branch_and_bound import branch_and_bound, dive_order, every_leaf
from .constraints import Constraints, check as check_constraints, restrict
from .evaluator import LayoutEvaluator
from .infeasible import raise_infeasible
from .layout_pricing import SCHEDULES
from .rescreen import fill_shortlist, uplink_shortlist
from .replan import micro_batch_variants, micro_batches, shortlist, warm_enumeration
from .search_jobs import (climb, climb_job, default_workers, layout_value, objective_text, release, run_all, share,
                          tree_job)
from .simulate import MeshChoice, num_micro_batches
from .space import SearchSpace
from .stop import out_of_time
from .tree_size import ENUMERATION_TREE, ENUMERATION_VISITS, PROVE_TREE, settle_estimate, tree_budget

TREES = 6                       # independent trees at most,
TREE_ROUND = 3                  # grown this many at a time while a round finds a better plan than the last
PROVE_PRICED = 1000             # on a tree estimated at up to PROVE_TREE leaves, the trees' best is proved (or
                                # bettered) by best first, which gives up after pricing this many leaves, priced
                                # before or not
                                # (search_quality's proofs: at most 172, 131 of them new; the 736-device example
                                # without its H800s, seed 1: 17,796 new leaves, 7 s)
SEED_VISITS = 2000              # on a tree too large to settle, the diving enumeration's visits (its leaves
                                # seed the trees; the 736-device example's best closed form among them)
DIVES = 16                      # dives that seed the trees where the bounded enumeration priced no leaf
REPLAN_CLIMBS = 2               # re-planning (a warm start, plan/replan.py): no trees; besides the old plan's, a
                                # climb from the best leaf of each of the two best S (samples per micro-batch
                                # step: a climb moves S only by halving or doubling it, and only through better
                                # layouts, so it rarely leaves the S it starts at)
REPLAN_RERANK = 4               # and the event simulation re-checks the best four layouts found (and
                                # those of the best `rerank` with fewer than RERANK_MARGIN_M micro-batches)
CLIMBS = 8                      # local-search starts (best leaf of each of the best cluster orders)
RERANK_MARGIN = 0.05            # the event simulation skips a layout of at least RERANK_MARGIN_M micro-batches
RERANK_MARGIN_M = 64            # whose closed form is over 5 % above the best simulated so far (they differ by
                                # up to 2 % there; with few micro-batches by up to 13 %: fill and drain)
RECHECK_GRACE_S = 5.0           # after a Ctrl-C the event simulation still re-checks the best layouts found for up to
                                # this long (plan/stop.py): the closed form's best is not always the simulation's
                                # (the 736-device example interrupted 7 s in: 6.921 s from its first layout, 6.794
                                # s from the whole re-check, 0.35 s more; uninterrupted 6.788 s)
GC_THRESHOLD = 20_000            # the garbage collector's first-generation threshold while a search runs (default 700)


@dataclass
class SearchConfig:
    method: str = "mcts"               # "mcts" | "exhaustive"
    iterations: int = 0                # MCTS playouts in all; 0 -> chosen from the tree's size
    budget_s: float | None = None      # wall-clock cap on the tree search
    seed: int = 0
    rerank: int = 16                   # best distinct layouts of each list re-evaluated with the event simulation
    schedule: str = "overlapped"       # cross-cluster boundaries: "overlapped" (depth chosen per layout) or "blocking"
    engine: str = "megatron"           # the pipeline engine planned for (engines.py ENGINES): "megatron" | "deepspeed"
    max_micro_batch: int = 16
    exploration: float = 0.7
    local_search: bool = True
    progress: bool = False             # progress lines on stderr
    workers: int = 1                   # processes (0: one per core)
    warm_start: tuple = ()             # layouts to start the local search from (a previous plan, re-planning)
    warm_plan: object = None           # the previous plan itself (re-planning): the new shapes' first incumbent
    constraints: Constraints | None = None   # objective and hard constraints (plan/constraints.py)
    job_settings: tuple = ()           # the job's dropouts, every mesh built runs them (settings.job_settings)
    steps_above_devices: bool = True   # micro-batch steps above the devices (space.step_sizes); a multi-pipeline
                                       # plan's pipelines are searched without them


@dataclass
class SearchResult:
    choices: list[MeshChoice]
    stage_layers: list[int]
    iteration_time_s: float
    seconds: float
    candidates_evaluated: int
    method: str
    cut_by_budget: bool = False
    iterations: int = 0
    trees: int = 0
    # every layout the event simulation re-checked, best first: (iteration s, choices, stage_layers); the
    # first is the result, the next ones are the runners-up `hetauto explain` shows
    ranked: list = field(default_factory=list)
    boundaries: tuple | None = None    # per mesh, the boundary after it: None (blocking) or the overlapped depth

    def to_dict(self) -> dict:
        return {"method": self.method, "seconds": round(self.seconds, 3), "candidates_evaluated":
                self.candidates_evaluated, "playouts": self.iterations, "trees": self.trees,
                "cut_by_budget": self.cut_by_budget}


def bounded_enumeration(space: SearchSpace, ev: LayoutEvaluator, keep: int, max_visits: int | None = None,
                        deadline: float | None = None, found: dict | None = None, incumbent: float = math.inf,
                        dive: bool = False, max_priced: int | None = None):
    """Best-first branch and bound over the whole tree, keeping the best `keep` leaves: -> ({layout: closed-form
    value} holding every leaf that can be among the best `keep` of the tree, nodes visited), or (None, visits)
    when it would need more than `max_visits` nodes (or run past `deadline`; `found`, if given, then holds the
    leaves it priced, which seed the tree search). Nodes are visited in order of their bound (`SearchSpace.bound`;
    for a leaf also its own, `SearchSpace.leaf_bound`), a leaf is priced when its turn comes, and the search ends
    when the smallest bound left is above the `keep`-th best value found: no leaf left can enter the best `keep` (plan/branch_and_bound.py).
    `incumbent`: a plan's value to beat (only better leaves are priced then). `dive`: the nodes in diving order
    (`branch_and_bound.dive_order`) instead of best first, for seeding: it reaches leaves sooner and settles later.
    `max_priced`: it stops, unsettled, after pricing this many leaves (priced before or not)."""
    found, visits, settled = branch_and_bound(space, layout_value(space, ev), lambda c: space.leaf_bound(c, ev),
                                              keep, incumbent=incumbent, max_visits=max_visits, deadline=deadline,
                                              found=found, priority=dive_order(space) if dive else None,
                                              max_priced=max_priced)
    # unsettled, the node over the limit counts as a visit (the playouts a plan records have always counted it)
    return (found, visits) if settled else (None, visits + 1)


def dive_seeds(space: SearchSpace, ev: LayoutEvaluator, deadline: float | None = None) -> dict:
    """{layout: value} of leaves found by diving, for when the seeding enumeration priced none: from each of
    the `DIVES` first decisions of lowest bound, the child of lowest bound down to a leaf (depth-first search's
    usual way to an incumbent), then a climb (plan/local.py) from the best of them."""
    value = layout_value(space, ev)
    found: dict = {}
    for first in sorted(space.actions(()), key=lambda a: space.bound((a,)))[:DIVES]:
        path = (first,)
        while children := space.child_bounds(path):
            path += (min(children, key=lambda ab: ab[1])[0],)
        t, meshes = value(path)
        if meshes is not None and math.isfinite(t):
            found[meshes] = t
    if found:
        for t, layout in climb(space, ev, min(found, key=found.get), deadline):
            found[layout] = min(t, found.get(layout, math.inf))
    return found


# ---- the search -------------------------------------------------------------------------------------------
def search(model: ModelSpec, inventory: Inventory, gbs: int, cost_model=None,
           config: SearchConfig | None = None) -> SearchResult:
    """The plan with the best objective for `model` on `inventory` at global batch `gbs` (module docstring).
    Under --max-iteration-s the best may be slower than it (then the fastest found: a start that other shapes may
    bring under it); the caller checks the plan it keeps (constraints.check_floor, multi_search.search_shapes).

    The search makes many small tuples that live until it ends (the evaluator's caches, the trees' nodes):
    the garbage collector would scan them, and everything the process held before, again and again without
    freeing anything. So the objects from before are frozen out of its scans and it runs less often while the
    search runs (736 devices, one core: about 0.1 s of 1.45 s less); both are restored afterwards."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(threshold[0], GC_THRESHOLD), *threshold[1:])
    try:
        return _search(model, inventory, gbs, cost_model, config)
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def _search(model: ModelSpec, inventory: Inventory, gbs: int, cost_model=None,
            config: SearchConfig | None = None) -> SearchResult:
    cfg = config or SearchConfig()
    cost = cost_model or AnalyticCostModel()
    if gbs < 1:
        raise InputError(f"must be at least 1, got {gbs}", field="--global-batch-size")
    if cfg.method not in ("mcts", "exhaustive"):
        raise InputError(f"unknown search method {cfg.method!r}", field="--search", fix="use mcts or exhaustive")
    if cfg.schedule not in SCHEDULES:
        raise InputError(f"unknown boundary schedule {cfg.schedule!r}", field="--boundary-schedule",
                         fix="use blocking or overlapped")
    con = cfg.constraints or Constraints()
    check_constraints(con, model, inventory, gbs)
    inventory = restrict(inventory, con)    # the excluded clusters are not there
    sp = SearchSpace(model, inventory, gbs, cost, cfg.max_micro_batch, con, cfg.engine, cfg.job_settings,
                     cfg.steps_above_devices)
    if not any(sp.tp.values()):
        raise InputError(f"no TP degree up to the node size divides the model's {model.num_attention_heads} "
                         f"attention heads and {model.num_query_groups} key/value heads", field="model",
                         fix="check num_attention_heads and num_query_groups")
    workers = cfg.workers or default_workers()
    ev = LayoutEvaluator(model, inventory, gbs, cost, cfg.schedule, cfg.engine)
    share(sp, ev, cfg)
    t0 = time.perf_counter()
    deadline = None if cfg.budget_s is None else t0 + cfg.budget_s
    leaves: dict[tuple, float] = {}
    dived: dict[tuple, float] = {}      # leaves found by diving (dive_seeds), where the enumeration priced none
    playouts, cut, trees = 0, False, 0
    priced = 0                          # distinct layouts priced (in whichever process priced them)
    method = cfg.method
    warm = list(dict.fromkeys(sp.canonical(w) for w in cfg.warm_start if sp.legal(sp.canonical(w))))
    # the tree's size sets the trees' budget and the enumeration's visits; a re-plan grows no trees
    cap, patience, est = tree_budget(sp, cfg.seed) if not warm or cfg.iterations else (0, 0, math.inf)
    # a re-plan's leaf bounds see the boundaries' share of the period (leaf_bound.py: why the cold search's do not)
    sp.leaf_links = bool(warm)
    warm_found = [(sp.score(ev.resolve(w)[0], w), w) for w in warm]
    peaks: set = set()                  # where the warm enumeration's climbs started and ended
    if warm and cfg.local_search:       # re-planning: first climb from the old plan (a few hundred layouts)
        for part, _ in run_all(climb_job, [(w, deadline) for w in warm], workers, t0):
            warm_found += part      # (their layouts are counted below, with the cache)
    best_known = old_best = min((t for t, _ in warm_found), default=math.inf)
    if warm and method == "mcts" and not cfg.iterations:
        # the climbed old plan is the plan to beat: an enumeration pruned by it, over the old plan's micro-batch
        # sizes, looks where a better leaf can be (another S, order, TP or DP than the old plan's, which no
        # climb reaches through better layouts; plan/replan.py), climbing from each leaf that beats the best held
        # (the climb's best is then the value to beat): no trees
        early: list = []

        def improve(layout, t):
            part = climb(sp, ev, layout, deadline)
            early.extend(part)
            top = min([(t, layout), *part], key=lambda x: x[0])
            peaks.update((layout, top[1]))
            return top[0]
        _, playouts, _ = warm_enumeration(sp, layout_value(sp, ev), lambda c: sp.leaf_bound(c, ev), best_known,
                                          found=leaves, micro_batches=micro_batches(warm), deadline=deadline,
                                          improve=improve if cfg.local_search else None)
        for t, layout in early:
            leaves[layout] = min(t, leaves.get(layout, math.inf))
        priced += len(ev.cache)
    elif method == "mcts" and not cfg.iterations:
        # a tree small enough is settled exactly; on a larger one a short run seeds the trees with its leaves
        size = settle_estimate(sp, cfg.seed, est)
        settle = size <= ENUMERATION_TREE
        visits = max(4000, int(ENUMERATION_VISITS * size)) if settle else SEED_VISITS
        seeds: dict = {}
        found, playouts = bounded_enumeration(sp, ev, max(cfg.rerank, 1), visits, deadline, seeds, dive=not settle)
        if found is None and not seeds:     # it priced no leaf: dive for a plan the trees must beat
            dived = dive_seeds(sp, ev, deadline)
        priced = len(ev.cache)
        if found is not None:          # the bounds settled the tree: its best leaves are known exactly
            method, leaves = "exhaustive", found
        else:                          # its best leaf is the plan the trees must beat
            leaves.update(seeds)
            leaves.update(dived)
            best_known = min([best_known, *seeds.values()])
    if method == "exhaustive" and cfg.method == "exhaustive":
        playouts, cut = every_leaf(sp, layout_value(sp, ev), leaves, deadline, cfg.progress, est, t0,
                                   objective_text(sp, ev))
        priced = len(ev.cache)
    elif method == "mcts":
        if cfg.iterations:
            cap, patience = max(1, cfg.iterations // TREES), cfg.iterations
        count = 0 if warm and not cfg.iterations else TREES
        while trees < count:           # rounds of TREE_ROUND trees, while a round finds a better plan
            if leaves and out_of_time(deadline):
                cut = True             # --budget-s: no new round once it ran out (a round's trees stop inside it)
                break
            n = min(TREE_ROUND, count - trees)
            bar = min([best_known, *dived.values()])     # what the trees prune with (a dive's leaf too)
            jobs = [(cfg.seed * 1000 + trees + j, cap, patience, deadline, bar) for j in range(n)]
            trees += n
            best_round = math.inf
            before = len(ev.cache)
            for run in run_all(tree_job, jobs, workers, t0):
                leaves.update(run.leaves)
                playouts += run.playouts
                cut |= run.cut
                best_round = min([best_round, *run.leaves.values()])
            # the distinct layouts priced (worker processes price some twice): the same count in one process or
            # several, so the plan file's candidates_evaluated does not depend on the machine's speed
            priced += len(ev.cache) - before
            if cfg.progress:        # a line per round of trees: a search of many clusters is minutes, not silence
                # (the best leaf held: the seeds' and the trees'; its value in the objective's own unit)
                top = min(leaves, key=leaves.get, default=None)
                print(f"search: {trees} trees, {priced:,} layouts priced, best "
                      + objective_text(sp, ev)(leaves[top] if top is not None else math.inf, top)
                      + f", {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
            if cut or (not cfg.iterations and not best_round < best_known * (1 - 1e-4)):
                break                  # out of time, or the round found nothing better than the plan held
            best_known = min(best_known, best_round)
        finite = [t for t in leaves.values() if math.isfinite(t)]
        if not cut and not warm and not cfg.iterations and finite and est <= PROVE_TREE:
            # a tree the estimate put just above ENUMERATION_TREE (one estimate is heavy-tailed): best first again,
            # pruned by the best leaf found, looks for a better one and usually proves there is none (or gives up
            # after PROVE_PRICED leaves)
            better: dict = {}
            before = len(ev.cache)
            bounded_enumeration(sp, ev, 1, int(ENUMERATION_VISITS * est), deadline, better, incumbent=min(finite),
                                max_priced=PROVE_PRICED)
            leaves.update(better)
            priced += len(ev.cache) - before
    ranked = sorted(((t, k) for k, t in leaves.items() if math.isfinite(t)), key=lambda x: x[0])
    if not ranked and not warm and cut:
        fix = "give the search more time (a larger --budget-s, or none)"
        raise InfeasibleError(f"{model.name}: --budget-s {cfg.budget_s:g} ran out before the search found a layout "
                              "that fits.", field="--budget-s", fix=fix)
    if not ranked and not warm:
        raise_infeasible(model, inventory, ev, sp)
    # The closed form screens; the event simulation decides among the best of the tree's own leaves, the same
    # leaves ranked by a second closed form (plan/rescreen.py) and, after the local search, the best of everything
    # found (lists of their own, so the climb's many near-identical layouts cannot crowd the tree's best leaves
    # out of the final check).
    shortlists = [ranked]
    # (a re-plan re-checks one list of its own, below: these would be priced for nothing)
    if ev.engine == "megatron" and not warm:    # layouts its fill and drain overcount (DeepSpeed's is its own)
        shortlists.append(fill_shortlist(ev, ranked, sp.score))
    if any(c.uplink_gbps for c in inventory.clusters) and not warm:   # layouts the uplink's screen may hide
        shortlists.append(uplink_shortlist(ev, ranked, sp.score))
    if (method == "mcts" and cfg.local_search) or warm:
        climbed = set(warm) | peaks if cfg.local_search else set()
        if warm:    # re-planning: the old plan was climbed; climb from the best of what beat it
            starts = local.starts([x for x in ranked if x[0] < old_best * (1 - 1e-9)], REPLAN_CLIMBS,
                                  kind=lambda layout: layout[0].samples_per_step)
        else:
            starts = local.starts(ranked, CLIMBS)
        jobs = [(s, deadline) for s in dict.fromkeys(warm + starts) if s not in climbed]
        found = list(ranked) + warm_found
        before = len(ev.cache)
        for part, _ in run_all(climb_job, jobs, workers, t0):
            found += part
        priced += len(ev.cache) - before    # distinct layouts, as for the trees
        found.sort(key=lambda x: x[0])
        if not warm:
            shortlists.append(found)
        else:       # re-planning: one list (the climbs are few), the best few of everything (replan.shortlist)
            top = found[0] if found else None        # its micro-batch variants, where few
            if top is not None and num_micro_batches(top[1], gbs) < RERANK_MARGIN_M:
                found = sorted(found + [(sp.score(ev.resolve(v)[0], v), v) for v in micro_batch_variants(sp, top[1])],
                               key=lambda x: x[0])
            shortlists = [shortlist(found, gbs, min(cfg.rerank, REPLAN_RERANK), cfg.rerank, RERANK_MARGIN_M,
                                    lambda c: ev.resolve(c)[1]),
                          # and the old plan's own layouts, whatever their closed form: a re-plan is never slower
                          # than the plan it started from (the closed form overcounts some layouts' fill and
                          # drain, and the old one fell off the list above on an unchanged inventory)
                          sorted(warm_found, key=lambda x: x[0])]
    best, exact, late = _rank_exact(ev, shortlists, len(shortlists[0]) if warm else cfg.rerank, sp.score,
                                    deadline, cfg.progress)
    if best is None:
        raise_infeasible(model, inventory, ev, sp)
    res, choices = best
    release()
    return SearchResult(list(choices), res.stage_layers, res.iteration_time_s, time.perf_counter() - t0,
                        priced, method, cut or late, playouts, trees, exact, res.boundaries)


def _rank_exact(ev: LayoutEvaluator, shortlists: list, rerank: int, score=lambda t, layout: t,
                deadline: float | None = None, progress: bool = False):
    """The event simulation decides: -> ((result, layout) of the best by `score` (the objective), every
    re-checked layout best first, whether --budget-s or a Ctrl-C stopped it). Its cost grows with the micro-batches
    (seconds a layout at tens of thousands of them), so past the deadline, or RECHECK_GRACE_S after a Ctrl-C, it
    stops once one layout fits."""
    best, seen, exact = None, set(), []
    t0 = last = time.perf_counter()
    for listed in shortlists:
        checked = 0
        for t, choices in listed:
            if not math.isfinite(t):
                continue
            now = time.perf_counter()
            if best is not None and out_of_time(deadline, grace_s=RECHECK_GRACE_S):
                return best, sorted(exact, key=lambda x: x[0]), True
            if progress and now - last > 1.0:
                last = now
                print(f"hetauto plan: event simulation of the best layouts: {len(seen)} checked ({now - t0:.1f} s)",
                      file=sys.stderr, flush=True)
            if (best is not None and t > score(best[0].iteration_time_s, best[1]) * (1 + RERANK_MARGIN)
                    and num_micro_batches(choices, ev.gbs) >= RERANK_MARGIN_M):
                continue    # many micro-batches: the closed form is close to the simulation, and this is not
            resolved = ev.resolve(choices)[1]
            if resolved in seen:
                continue
            seen.add(resolved)
            checked += 1
            res = ev.exact(resolved)
            if res.stage_layers is not None:
                exact.append((res.iteration_time_s, resolved, res.stage_layers))
            if res.stage_layers is not None and (best is None or score(res.iteration_time_s, resolved) <
                                                 score(best[0].iteration_time_s, best[1]) - 1e-12):
                best = (res, resolved)
            if checked >= rerank:
                break
    return best, sorted(exact, key=lambda x: x[0]), False
