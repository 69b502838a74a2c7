"""One Monte-Carlo tree search (UCT) over the decision tree of plan/space.py.

Each playout selects down the tree by UCT (mean and best reward of a subtree, rescaled to the range of rewards
seen so far, plus exploration), expands one untried decision, completes the plan with the default policy and
backs up reward = T_lower_bound / T. Fully explored subtrees are never selected again.

Branch and bound works at every level: `SearchSpace.bound` is a lower bound on the closed-form time of every leaf
below a node, and nodes whose bound is no better than the best plan held are closed and never walked into;
when every node is closed the tree has proved its best plan optimal (for the closed form).

A tree stops at its playout cap or when it stalls: no better plan in the last `patience` playouts, where the
patience grows with the playouts spent (a tree that keeps improving late is given time). Everything is driven
by one seeded generator, so a tree's result depends only on its seed and budget, never on time or on other
trees (which is what lets several trees run in parallel and still give the same plan).
"""
from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass, field

from .space import END, SearchSpace
from .stop import out_of_time


@dataclass
class TreeRun:
    leaves: dict = field(default_factory=dict)     # layout as decided -> closed-form seconds
    playouts: int = 0
    cut: bool = False
    best_at: int = 0                               # the playout that found the best plan
    priced: int = 0                                # layouts the evaluator priced for this tree (in its process)


class _Node:
    __slots__ = ("visits", "total", "best", "children", "untried", "done", "bound", "path")

    def __init__(self, untried: list, bound: float = 0.0):
        self.bound = bound               # SearchSpace.bound of the node (fixed: the bounds do not change)
        self.visits, self.total, self.best = 0, 0.0, 0.0
        self.children: list = []         # the child nodes, in the order they were expanded
        self.untried = untried
        self.done = not untried          # a leaf, or later: every child subtree fully explored
        self.path: tuple = ()


def _rollout_action(space: SearchSpace, path: tuple, acts: list, rng: random.Random, best_t: float):
    """Default policy: random, steered by the principles: keep adding clusters (each adds compute), preferably
    over the fastest link from the last one; never into a node whose bound is no better than the best plan."""
    acts = [a for a, b in space.child_bounds(path) if b < best_t]
    if not acts:
        return None
    if END not in path:                 # still choosing the clusters
        order = path
        real = [a for a in acts if a != END]
        if not real or (END in acts and rng.random() < 0.2):
            return END
        if order and rng.random() < 0.6:
            return max(real, key=lambda c: space.inventory.link(order[-1], c).bandwidth_gbps)
        return rng.choice(real)
    return rng.choice(acts)


def run_tree(space: SearchSpace, value, seed: int, max_playouts: int, patience: int, exploration: float,
             deadline: float | None, progress: bool, best_known: float, describe) -> TreeRun:
    """`value(leaf path)` -> (closed-form objective, layout); inf when infeasible or a dead end. `best_known`: a
    plan found elsewhere (re-planning: the old plan), which bounds the tree from the first playout. `describe(value,
    layout or None)`: the best value in words for the progress lines (search_jobs.objective_text)."""
    best_layout = None
    rng = random.Random(seed)
    run = TreeRun()
    t_lb = space.time_lower_bound()
    root = _Node(list(space.actions(())))
    best_t, best_at, last_report, t0 = best_known, 0, time.perf_counter(), time.perf_counter()
    r_lo, r_hi = 1.0, 0.0               # range of the feasible rewards seen so far
    sqrt = math.sqrt
    while run.playouts < max_playouts and not root.done:
        if run.playouts - best_at > max(patience, run.playouts // 2):
            break                       # stalled
        if run.leaves and out_of_time(deadline):
            run.cut = True
            break
        path, node, trail = (), root, [root]
        while True:                     # selection: UCT among children whose subtree is not exhausted
            if node.untried:
                for child in node.children:     # bounding: close what can no longer beat the best plan held
                    if not child.done and child.bound >= best_t:
                        child.done = True
                break
            # one pass: bounding, then UCT among the children still open: mean and best reward of the subtree,
            # rescaled to [0, 1] over the rewards seen so far (good plans differ by a few percent, which an
            # unscaled reward would drown in the exploration term), plus exploration; the first of equal
            # scores wins
            ln = math.log(max(node.visits, 1))
            span = max(r_hi - r_lo, 1e-9)
            pick, top = None, -math.inf
            for child in node.children:
                if child.done:
                    continue
                if child.bound >= best_t:
                    child.done = True
                    continue
                v = (0.5 * child.total / child.visits + 0.5 * child.best - r_lo) / span \
                    + exploration * sqrt(ln / child.visits)
                if pick is None or v > top:
                    pick, top = child, v
            if pick is None:
                break
            node = pick
            path = node.path
            trail.append(node)
        a = None
        while node.untried:             # expansion: an untried decision the bound does not rule out
            a = node.untried.pop(rng.randrange(len(node.untried)))
            if space.bound(path + (a,)) < best_t:
                break
            a = None
        if a is None:
            _close(trail)
            continue
        path = path + (a,)
        child = _Node(list(space.actions(path)), space.bound(path))
        child.path = path
        node.children.append(child)
        trail.append(child)
        run.playouts += 1
        leaf = path                     # rollout
        acts = space.actions(path)
        while acts:
            nxt = _rollout_action(space, leaf, acts, rng, best_t)
            if nxt is None:
                break
            leaf = leaf + (nxt,)
            acts = space.actions(leaf)
        t, layout = value(leaf) if not acts else (math.inf, None)
        if math.isfinite(t):
            run.leaves[layout] = t
        if t < best_t * (1 - 1e-4):
            best_at = run.best_at = run.playouts
        if t < best_t:
            best_t, best_layout = t, layout
        reward = 0.0 if not math.isfinite(t) else min(1.0, t_lb / t)
        if reward > 0:
            r_lo, r_hi = min(r_lo, reward), max(r_hi, reward)
        for n in trail:
            n.visits += 1
            n.total += reward
            if reward > n.best:
                n.best = reward
        _close(trail)
        if progress and time.perf_counter() - last_report > 1.0:
            last_report = time.perf_counter()
            print(f"hetauto plan: tree {seed}: {run.playouts} playouts, best {describe(best_t, best_layout)} "
                  f"({last_report - t0:.1f} s)", file=sys.stderr, flush=True)
    return run


def _close(trail: list) -> None:
    """A node whose children are all exhausted (or bounded) is exhausted."""
    for n in reversed(trail):
        if n.done:
            continue
        if n.untried or not all(c.done for c in n.children):
            break
        n.done = True
