"""The search's independent jobs (one tree, one climb) and the worker processes that run them.

Trees and climbs do not depend on each other, so `run_all` may run them in worker processes forked from the
search (plan/search.py): each worker inherits the search's tree, evaluator and configuration (`share`), a job
carries only its seed or start layout, and the layouts a worker priced come back into the search's cache. A
search that has run less than PARALLEL_AFTER_S keeps its jobs in its own process, where they share each other's
priced layouts (why: `run_all`). Either way the plan is the same: it depends on the jobs' seeds only.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import signal
import time

from . import local, stop
from .constraints import cost_per_million_tokens
from .evaluator import LayoutEvaluator
from .mcts import TreeRun, run_tree
from .space import SearchSpace

FORWARD_EVERY_S = 0.1          # how often run_all looks whether a Ctrl-C is to be passed on to its workers
PARALLEL_AFTER_S = 5.0          # jobs go to worker processes only once the search has run this long (run_all)

# What the jobs work on: the search's tree, evaluator and configuration. Set before the search runs jobs
# (forked workers inherit it, so a job need not carry them), cleared when the search ends.
_CTX: dict = {}


def share(space: SearchSpace, ev: LayoutEvaluator, cfg) -> None:
    """Make the search's tree, evaluator and configuration (a SearchConfig) the jobs' context."""
    _CTX.update(space=space, ev=ev, cfg=cfg)


def release() -> None:
    _CTX.clear()


def layout_value(space: SearchSpace, ev: LayoutEvaluator):
    """path -> (objective value, meshes) of a leaf of the tree; (inf, None) for a dead end."""
    def value(path: tuple):
        meshes = space.leaf_meshes(path)
        if meshes is None:
            return math.inf, None       # a dead end
        return space.score(ev.resolve(meshes)[0], meshes), meshes
    return value


def objective_text(space: SearchSpace, ev: LayoutEvaluator):
    """(objective value, its layout or None) -> the value for a progress line, in the unit `hetauto plan`'s summary
    prints: seconds per iteration, or under --objective cost the layout's cost per 1M tokens (and its seconds). The
    cost objective's value is money per iteration weighed by time (constraints.objective_value), a figure in no unit
    a reader knows; without the layout (a bar set before this job) it is only said that nothing beat it yet."""
    tokens = space.gbs * space.model.seq_length

    def text(value: float, layout) -> str:
        if not math.isfinite(value):
            return "none fits yet"
        if space.con.objective != "cost":
            return f"{value:.3f} s per iteration"
        if layout is None:
            return "none better than the plan held yet"
        seconds = ev.resolve(layout)[0]
        cost = cost_per_million_tokens(space.inventory, layout, seconds, tokens)
        return (f"{cost:.4f} per 1M tokens" if cost is not None else "no price") + f" at {seconds:.3f} s per iteration"
    return text


def tree_job(job) -> TreeRun:
    seed, cap, patience, deadline, best_known = job
    sp, ev, cfg = _CTX["space"], _CTX["ev"], _CTX["cfg"]
    before = len(ev.cache)
    run = run_tree(sp, layout_value(sp, ev), seed, cap, patience, cfg.exploration, deadline, cfg.progress,
                   best_known, objective_text(sp, ev))
    run.priced = len(ev.cache) - before
    return run


def climb(space: SearchSpace, ev: LayoutEvaluator, start: tuple, deadline: float | None) -> list:
    """plan/local.py's climb from `start`, pricing with `ev` and skipping neighbours by their leaf bound."""
    return local.climb(space, lambda c: space.score(ev.resolve(c)[0], c), start, deadline,
                       lambda c: space.leaf_bound(c, ev))


def climb_job(job) -> tuple[list, int]:
    start, deadline = job
    ev = _CTX["ev"]
    before = len(ev.cache)
    found = climb(_CTX["space"], ev, start, deadline)
    return found, len(ev.cache) - before


def priced_in_worker(call) -> tuple:
    """(fn's result, the layouts it priced with their values): a worker process's cache dies with it."""
    fn, job = call
    ev = _CTX["ev"]
    before = len(ev.cache)
    out = fn(job)
    return out, list(ev.cache.items())[before:]     # a dict keeps insertion order: the new entries are last


def run_all(fn, jobs: list, workers: int, started: float) -> list:
    """fn over jobs, in `workers` processes forked now (they inherit every layout priced so far). The layouts the
    workers price come back into this process's cache, so later jobs and the final ranking do not price them
    again. Jobs run one after another in this process share each other's layouts, which processes cannot: on
    the benchmark's instances (jobs of 0.01-0.3 s) two processes spent more CPU than one (736 devices: trees
    0.33 s each against 0.27, climbs 0.55 s against 0.39) and were slower in wall time (1.42 s against 1.14),
    so a search that has run less than PARALLEL_AFTER_S keeps its jobs in this process. The plan is the same
    either way (the cache only remembers values)."""
    if workers <= 1 or len(jobs) <= 1 or time.perf_counter() - started < PARALLEL_AFTER_S or stop.requested():
        return [fn(j) for j in jobs]    # (after a Ctrl-C each job ends at its first check: no processes for that)
    with multiprocessing.get_context("fork").Pool(min(workers, len(jobs)), initializer=stop.keep_best_in_worker) \
            as pool:
        pending = pool.map_async(priced_in_worker, [(fn, j) for j in jobs], chunksize=1)
        told = False
        while not pending.ready():
            pending.wait(FORWARD_EVERY_S)
            if stop.requested() and not told:
                # a Ctrl-C this process got and its workers may not have (`kill -INT` of the command alone, not a
                # terminal's, which reaches them all): their jobs end with what they found, as this process's do
                for child in multiprocessing.active_children():
                    os.kill(child.pid, signal.SIGINT)
                told = True
        done = pending.get()
    cache = _CTX["ev"].cache
    for _, priced in done:
        for key, value in priced:
            cache.setdefault(key, value)
    return [out for out, _ in done]


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
