"""Branch and bound over the decision tree (plan/space.py), shared by the cold search's bounded enumeration
(`search.bounded_enumeration`: the best `keep` leaves, best first by bound, or in diving order (`dive_order`) when
it only seeds the trees of a large tree) and re-planning's warm enumeration (`replan.warm_enumeration`: leaves
better than the old plan, diving, stopping when it stops finding better ones). `every_leaf` is --search
exhaustive's plain enumeration of every leaf.

A node whose bound (`SearchSpace.bound`) is above the `keep`-th best value held (or the incumbent) is never
visited; a leaf whose own cheaper-than-pricing bound (`leaf_bound`) is above it is not priced, and one whose leaf
bound is above its node bound waits its turn again by that bound. Ties are broken by the order nodes were reached,
so the visits and the leaves priced depend on the tree alone (deterministic).
"""
from __future__ import annotations

import heapq
import math
import sys
import time

from .space import SearchSpace, iter_leaves
from .stop import ctrl_c_reaches, out_of_time

SLACK = 1 + 1e-9                # a bound within rounding of a value does not prune it
DEADLINE_EVERY = 64             # visits between two looks at the clock
DIVE_WEIGHT = 0.005             # the diving order's priority: a node's bound x (1 + DIVE_WEIGHT x decisions left)


def decisions_left(space: SearchSpace, path: tuple) -> int:
    """How many decisions a path still needs to reach a leaf (an unfinished cluster order counts as the
    longest: the order's end, S, and a TP and a DP for every cluster, and under the cost objective its stages)."""
    per_mesh = 3 if space.stage_decision else 2
    order, complete, S, meshes, pending = space.decode(path)
    if not complete:
        return 2 + per_mesh * len(space.names)
    return (S is None) + per_mesh * (len(order) - len(meshes)) - (pending is not None) - isinstance(pending, tuple)


def dive_order(space: SearchSpace):
    """A queue order that dives (`branch_and_bound`'s `priority`): a node waits by its
    bound times (1 + DIVE_WEIGHT x its decisions left), so the leaves under a promising node are reached before
    the search widens. Near the top of the tree the bounds are loose (0.8-0.9 of the leaves' values on the
    736-device example): in pure best-first order thousands of nodes are visited before the first leaf."""
    return lambda path, bound: bound * (1 + DIVE_WEIGHT * decisions_left(space, path))


def branch_and_bound(space: SearchSpace, value, leaf_bound, keep: int = 1, incumbent: float = math.inf,
                     better: float = 0.0, priority=None, allowed=None, patience: int | None = None,
                     max_visits: int | None = None, deadline: float | None = None,
                     found: dict | None = None, max_priced: int | None = None,
                     improve=None, requeue: bool = True) -> tuple[dict, int, bool]:
    """-> ({layout: value} of every leaf priced, nodes visited, settled: no leaf left can enter the best `keep`).

    `value(path)` prices a leaf (-> (value, layout)); `leaf_bound(layout)` bounds a finished layout from below.
    The best `keep` values held start from `incumbent` (a plan to beat; inf: none), and a value enters them when
    it is below the `keep`-th best by more than the fraction `better` (re-planning counts only a real improvement
    as one, for `patience`).
    `priority(path, bound)` orders the queue (None: the bound itself, best first, so the first node popped above
    the cutoff ends the search; with another order pruned nodes are dropped one by one). `allowed(path, actions)`
    keeps only some of a node's decisions (None: all). It stops, unsettled, before a visit when `patience` visits
    have passed since the last better leaf (or the first leaf priced), when it has made `max_visits` visits or
    priced `max_priced` leaves (each `value` call counts, also one the caller's cache answers), or past `deadline`
    (time.perf_counter()); `found`, if given, then holds the leaves priced so far. `improve(layout, value)`
    (keep 1 only), if given, is asked of each leaf that enters the best held: a value a search from it reached (a
    climb, re-planning), which the cutoff and the patience's next better leaf then go by. `requeue` False: a
    leaf whose own bound is above its node's is priced at once (if not above the cutoff) rather than queued again
    by that bound: in diving order a tight leaf bound would otherwise queue it behind every inner node of a
    looser bound, and the dive would widen before it priced a leaf (re-planning's)."""
    assert improve is None or keep == 1, "improve replaces the one value held"
    found = {} if found is None else found
    top = [-incumbent] if math.isfinite(incumbent) else []   # max-heap (negated) of the best `keep` values held

    def cutoff() -> float:
        return -top[0] * SLACK if len(top) >= keep else math.inf

    cut = cutoff()
    root = space.bound(())
    # (priority, order reached, path, bound, whether the bound is the leaf's own)
    queue = [(root if priority is None else priority((), root), 0, (), root, False)]
    reached = visits = priced = 0
    last = None                         # the visit that priced the last better leaf (or the first leaf)
    while queue:
        if queue[0][3] > cut:           # the best held improved since this node was queued
            if priority is None:
                break                   # best first by bound: every node left is above the cutoff too
            heapq.heappop(queue)
            continue
        if ((patience is not None and last is not None and visits - last >= patience)
                or (max_visits is not None and visits >= max_visits)
                or (max_priced is not None and priced >= max_priced)
                or (visits % DEADLINE_EVERY == 0 and out_of_time(deadline))):
            return found, visits, False
        _, _, path, b, own = heapq.heappop(queue)
        visits += 1
        acts = space.actions(path)
        if acts:
            if allowed is not None:
                acts = allowed(path, acts)
            for a in acts:
                child = path + (a,)
                cb = space.bound(child)
                if cb <= cut:
                    reached += 1
                    heapq.heappush(queue, (cb if priority is None else priority(child, cb), reached, child, cb,
                                           False))
            continue
        meshes = space.leaf_meshes(path)
        if meshes is None:
            continue                    # a dead end
        if not own:                     # the leaf's own bound, cheaper than pricing it, decides its turn
            lb = leaf_bound(meshes)
            if lb > cut:
                continue
            if lb > b and requeue:
                reached += 1
                heapq.heappush(queue, (lb if priority is None else priority(path, lb), reached, path, lb, True))
                continue
        t, layout = value(path)
        priced += 1
        if last is None:
            last = visits
        if math.isfinite(t):
            found[layout] = t
            if len(top) < keep:
                heapq.heappush(top, -t)
            elif t < -top[0] * (1 - better):
                heapq.heapreplace(top, -t)
            else:
                continue
            if improve is not None:     # (keep 1: the one value held is this leaf's)
                top[0] = -min(t, improve(layout, t))
            last, cut = visits, cutoff()
    return found, visits, True


def every_leaf(space: SearchSpace, value, found: dict, deadline: float | None, progress: bool, est: float,
               t0: float, describe) -> tuple[int, bool]:
    """--search exhaustive: price every leaf (`value(path)` -> (value, layout)) into `found` {layout: value} ->
    (leaves priced, whether it was cut short). At `deadline` or a Ctrl-C (plan/stop.py out_of_time) it stops with
    the leaves priced so far, as the tree search does; with `progress`, a line on stderr every second says how far
    it got (`est`: the tree's estimated leaves; t0: when the search started; `describe(value, layout)`: the best in
    words, search_jobs.objective_text)."""
    count, best, best_layout, start = 0, math.inf, None, time.perf_counter()
    last_report = start
    of = f" of about {est:,.0f} (estimated)" if math.isfinite(est) else ""
    stops = ("--budget-s caps it, Ctrl-C stops it: the best so far is kept either way" if ctrl_c_reaches()
             else "--budget-s caps it: the best so far is kept")
    for path in iter_leaves(space):
        now = time.perf_counter()
        if out_of_time(deadline):
            return count, True
        t, layout = value(path)
        count += 1
        if layout is not None and math.isfinite(t):
            found[layout] = t
            if t < best:
                best, best_layout = t, layout
        if progress and now - last_report > 1.0:
            last_report = now
            rate = count / max(now - start, 1e-9)
            left = (f", about {_duration((est - count) / rate)} left at {rate:,.0f} a second ({stops})"
                    if math.isfinite(est) and est > count else "")
            print(f"hetauto plan: exhaustive: {count:,} leaves priced{of}, best {describe(best, best_layout)} "
                  f"({now - t0:.1f} s){left}", file=sys.stderr, flush=True)
    return count, False


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min" if seconds >= 90 \
        else f"{seconds:.0f} s"
