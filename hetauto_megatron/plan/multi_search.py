"""The search over the new plan shapes: several pipelines joined by data parallelism, mixed replica groups.

Above the single-pipeline search (plan/search.py, `search`), two more decisions:

1. **Which clusters form which pipeline** (a partition of a subset of the clusters into two or more blocks).
   Each block is one pipeline, searched by the existing search on exactly that block's clusters (all of them
   take part: the subsets are other partitions) with its share of the global batch. The shares start in
   proportion to the blocks' peak FLOP rates, then follow the pipelines' predicted times (plan/batch_split.py:
   multiples of each pipeline's micro-batch step, summing to the global batch); each layout is re-priced at
   its new share, and the plan (plan/multi_simulate.py) is priced as a whole, gradient exchange included. A
   partition is only searched when its bound (plan/partition_bound.py) beats the best plan held; partitions
   are tried best bound first.
2. **Mixed replica groups in a stage** (Sailor style; plan/alongside_search.py): the devices a cluster leaves over, or a cluster no
   pipeline uses, may stand alongside a mesh as more data-parallel replicas of its stages (same layers, their
   own TP, DP and micro-batch). The step's samples are split across the groups in proportion to their speed
   (closed form, rounded to whole micro-batches), not searched as a tree level; a group is kept when the
   priced plan is faster.

The result is the best of the single-pipeline plan and these (`--shapes simple` skips both levels), so the
new shapes never make a plan worse. Deterministic for a given seed (the single-pipeline searches are).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import sys
import time

from ..cost.analytic import AnalyticCostModel
from ..errors import InfeasibleError, InputError
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from .alongside_search import groups_alongside, mixed_starts
from .batch_split import split_batch
from .constraints import Constraints, check_floor
from .layout_pricing import evaluate_layout, layout_to_plan
from .link_costs import connected
from .plan import Plan
from .search import SearchConfig, search
from .engines import ENGINES
from .simulate import simulate
from .partition_bound import PartitionBound, set_partitions_into
from .space import tp_degrees
from .shapes_result import (ShapesResult, block_constraints, objective_bound, plan_score, progress,
                            quiet_config, within_budget)
from .space_bounds import peak_rate
from .stop import out_of_time

SHAPES = ("all", "simple")
MAX_PARTITIONS = 6          # partitions searched (best bound first) after the bound has pruned the rest
# Partitions bounded at most: every one of up to 8 usable clusters (20,891), the first of 9 or more in the order of
# _partition_candidates (their number grows with the Bell numbers: 27.6 million for 12 clusters, hours to bound).
MAX_PARTITIONS_BOUNDED = 25_000
REBALANCE_ROUNDS = 3        # batch re-splits from the pipelines' times


def search_shapes(model: ModelSpec, inventory: Inventory, gbs: int, cost_model=None,
                  config: SearchConfig | None = None, shapes: str = "all", over_floor_ok: bool = False) -> ShapesResult:
    """The best plan of the single-pipeline search and, unless shapes == "simple", of the new shapes (under
    --max-iteration-s, InfeasibleError where it is slower than that, unless `over_floor_ok`)."""
    cfg = config or SearchConfig()
    cost = cost_model or AnalyticCostModel()
    if shapes not in SHAPES:
        raise InputError(f"unknown value {shapes!r}", field="--shapes", fix="use all or simple")
    t0 = time.perf_counter()
    con = cfg.constraints or Constraints()
    one_pipeline = shapes == "simple" or ENGINES[cfg.engine].simple_only     # (DeepSpeed's engine: one pipeline)
    # under --max-iteration-s a single pipeline slower than it is the start that the other shapes must beat
    try:
        base = search(model, inventory, gbs, cost, cfg)
    except InfeasibleError as exc:
        # no single pipeline holds every cluster --use-clusters pins (more of them than --max-pp stages, or than
        # the micro-batches allow): several pipelines may, so the other shapes are searched; where none does, this
        # error is the answer. (Any other refusal, e.g. memory no layer fits in, stands: no shape can help it.)
        if one_pipeline or con.max_devices is not None or len(con.use_clusters) < 2:
            raise
        unfit, base = exc, None
        best = (math.inf, math.inf, None)
    if base is not None:
        plan = layout_to_plan(model, gbs, base.choices, base.stage_layers, inventory, boundaries=base.boundaries)
        best = (plan_score(con, inventory, plan, base.iteration_time_s), base.iteration_time_s, plan)
    out = ShapesResult(best[2], best[1], base, 0.0)
    if one_pipeline:
        if not over_floor_ok:
            check_floor(model, con, base.iteration_time_s)
        out.seconds = time.perf_counter() - t0
        return out
    if cfg.warm_plan is not None and con.max_devices is None:
        best = _seeded(model, inventory, gbs, cost, cfg, con, best, out)
    usable = [c.name for c in inventory.clusters if c.name not in con.exclude_clusters and tp_degrees(model, c)]
    # --budget-s covers the whole search: the levels below stop where it runs out
    deadline = None if cfg.budget_s is None else t0 + cfg.budget_s
    if cfg.progress:
        out.say = lambda text: print(f"hetauto plan: new shapes: {text} ({time.perf_counter() - t0:.1f} s)",
                                     file=sys.stderr, flush=True)
    if con.max_devices is None:      # (a device budget would have to be shared out across pipelines and groups)
        if len(usable) > 1:
            best = _partitions(model, inventory, gbs, cost, quiet_config(cfg), con, usable, best, out, deadline)
        progress(out, "replica groups side by side")
        if best[2] is not None:     # (groups grow from a plan)
            grown = groups_alongside(model, inventory, cost, con, best, out, cfg.max_micro_batch, deadline)
            if grown is not best:       # (what explain lists as the alternatives: the plan itself among them)
                out.tried.append(("the best of the above with groups alongside", grown[1],
                                  "the devices it leaves free as replica groups"))
            best = grown
        best = mixed_starts(model, inventory, gbs, cost, quiet_config(cfg), con, usable, best, out, deadline)
    if best[2] is None:
        raise unfit
    out.levels_cut = out.levels_cut or out_of_time(deadline)
    if not over_floor_ok:
        check_floor(model, con, best[1])
    out.plan, out.iteration_time_s = best[2], best[1]
    out.seconds = time.perf_counter() - t0
    out.say = None
    return out


def _seeded(model, inventory, gbs, cost, cfg, con, best, out: ShapesResult):
    """A re-plan (--from) of a plan of several pipelines or replica groups: that plan, where it still runs on the
    inventory under the constraints, is the incumbent the new shapes must beat (their bounds prune against it, and
    the groups alongside grow from it), instead of the single pipeline alone; the search goes on as a cold one."""
    old = cfg.warm_plan
    if old.is_simple or old.global_batch_size != gbs or not _meets(con, old, cfg.schedule):
        return best
    # (its meshes run the new job's settings, as every plan searched does: its own other settings are not searched)
    seed = dataclasses.replace(old, model=model, inventory=inventory.to_dict(), estimate=None,
                               precision=inventory.precision or old.precision, meshes=tuple(
                                   dataclasses.replace(m, setting_overrides=cfg.job_settings) for m in old.meshes))
    try:
        est = simulate(seed, inventory, cost)      # (which checks the plan against the inventory first)
    except InputError:          # a cluster gone or smaller, a link missing: it does not run here
        return best
    out.tried.append(("the plan re-planned (--from)", est.iteration_time_s if est.fits else None, "kept as is"))
    score = plan_score(con, inventory, seed, est.iteration_time_s)
    return (score, est.iteration_time_s, seed) if est.fits and score < best[0] - 1e-12 else best


def _meets(con: Constraints, plan: Plan, schedule: str) -> bool:
    """Whether a plan of any shape obeys the constraints (and the boundary schedule) as the new shapes' search
    keeps them: --max-pp per pipeline, the pins per mesh (meshes alongside another included), the clusters pinned
    in and out, --max-devices over every mesh."""
    used = {m.cluster for m in plan.meshes}
    if used & set(con.exclude_clusters) or not set(con.use_clusters) <= used:
        return False
    if con.max_devices is not None and plan.world_size > con.max_devices:
        return False
    if any(con.tp_of(m.cluster) not in (None, m.tp) or con.recompute_of(m.cluster) not in (None, m.recompute)
           or con.micro_batch_size not in (None, m.micro_batch_size)
           or (schedule == "blocking" and m.boundary_schedule != "blocking") for m in plan.meshes):
        return False
    # a pipeline's depth as the search bounds it (each block's search, and groups alongside add no stage): meshes
    # side by side share their stages, so they count once (Plan.pipeline_stages), not once per mesh
    return con.max_pp is None or all(plan.pipeline_stages(p) <= con.max_pp for p in range(plan.num_pipelines))


# ---- level 1: clusters -> pipelines ----------------------------------------------------------------------------
def _unit(gbs: int, k: int) -> int:
    """Initial shares are multiples of this power of two (room for a micro-batch step of several samples)."""
    u = 1
    while gbs % (2 * u) == 0 and 2 * u * k * 8 <= gbs:
        u *= 2
    return u


def _partition_candidates(usable: list, con: Constraints, gbs: int, joined=lambda subset: True):
    """(subset, blocks) for every partition into at least two pipelines of every subset of the usable clusters
    that holds --use-clusters: fewer pipelines first (each adds a gradient exchange across slow links), and for
    each count the larger subsets first, so that where MAX_PARTITIONS_BOUNDED cuts the enumeration short it keeps
    the likelier shapes. The blocks come in set_partitions' order (the bound's choice of pipeline 0 breaks ties
    by it), each listing its clusters in inventory order. `joined(subset)`: whether links join the subset's clusters
    (its pipelines exchange gradients; clusters no link reaches cannot take part together)."""
    for k in range(2, min(len(usable), gbs) + 1):
        for r in range(len(usable), k - 1, -1):
            for subset in itertools.combinations(usable, r):
                if all(c in subset for c in con.use_clusters) and joined(subset):
                    for blocks in set_partitions_into(list(subset), k):
                        yield subset, blocks


def _partitions(model, inventory, gbs, cost, cfg, con, usable, best, out: ShapesResult, deadline=None):
    bound = PartitionBound(model, inventory, gbs, cost, max(cfg.max_micro_batch, con.micro_batch_size or 0))
    names = [c.name for c in inventory.clusters]
    cands = []
    for subset, blocks in _partition_candidates(usable, con, gbs, lambda subset: connected(inventory, subset)):
        if out.partitions >= MAX_PARTITIONS_BOUNDED or (out.partitions % 512 == 0 and out_of_time(deadline)):
            out.partitions_cut = True
            break
        out.partitions += 1
        b = objective_bound(con, inventory, bound(blocks), subset)
        if b < best[0]:
            r = bound.root(blocks)        # pipeline 0: the block of the fastest cuts
            ordered = [blocks[r]] + blocks[:r] + blocks[r + 1:]
            cands.append((b, [sorted(x, key=names.index) for x in ordered]))
    cands.sort(key=lambda x: (x[0], str(x[1])))
    progress(out, f"{out.partitions:,} partition{'s' if out.partitions != 1 else ''} of the clusters into pipelines "
                   f"bounded, {len(cands):,} may beat one pipeline")
    cache: dict = {}
    for b, blocks in cands[:MAX_PARTITIONS]:
        if b >= best[0] or out_of_time(deadline):
            break
        # The tighter bound (PartitionBound.tight) is too dear for every partition, and cheap for these few: one
        # that cannot beat the plan held is not searched (on a 20-cluster chain each such search took tens of
        # seconds and lost). It keeps its place among the MAX_PARTITIONS, so the partitions searched are those
        # searched before less the ones that could not win, and the plan is the same.
        what = " | ".join("+".join(x) for x in blocks)
        tight = objective_bound(con, inventory, bound.tight(blocks), {c for x in blocks for c in x})
        if tight >= best[0]:
            progress(out, f"skipping pipelines {what}: their bound {tight:.3f} is no better than the plan held")
            continue
        progress(out, f"searching pipelines {what}")
        out.partitions_searched += 1
        found = _search_partition(model, inventory, gbs, cost, cfg, con, names, blocks, cache, out, deadline)
        if found is None:
            out.tried.append((what, None, "no feasible split"))
            continue
        t, plan = found
        out.tried.append((what, t, f"search bound {b:.3f} s"))
        s = plan_score(con, inventory, plan, t)
        if s < best[0] - 1e-12:
            best = (s, t, plan)
    return best


def _search_partition(model, inventory, gbs, cost, cfg, con, names, blocks, cache, out, deadline=None):
    k = len(blocks)
    rates = [sum(peak_rate(inventory.cluster(c)) for c in blk) for blk in blocks]
    try:
        shares = split_batch(gbs, [_unit(gbs, k)] * k, [1 / r for r in rates])
    except InputError:
        return None
    layouts = []
    for blk, share in zip(blocks, shares):
        key = (tuple(blk), share)
        if key not in cache:
            out.pipelines_searched += 1
            # (each is a whole single-pipeline search, quiet: tens of seconds for a block of many clusters)
            progress(out, f"  pipeline {'+'.join(blk)} at {share:,} samples: searching")
            try:
                # (a block above --max-iteration-s at its first share may come under it as the shares move)
                cache[key] = search(model, inventory, share, cost, dataclasses.replace(
                    within_budget(cfg, deadline), constraints=block_constraints(con, blk, names),
                    steps_above_devices=False))
                out.levels_cut |= cache[key].cut_by_budget
            except (InfeasibleError, InputError):
                cache[key] = None
        if cache[key] is None:
            return None
        r = cache[key]
        layouts.append((r.choices, r.stage_layers, r.boundaries, r.iteration_time_s))
    best = None
    for _ in range(REBALANCE_ROUNDS):
        plan = _joined(model, inventory, gbs, shares, layouts)
        est = simulate(plan, inventory, cost)
        t = est.iteration_time_s
        if est.fits and (best is None or t < best[0]):
            best = (t, plan)
        if out_of_time(deadline):      # (each round re-prices every pipeline: seconds at a large batch)
            out.levels_cut = True
            break
        steps = [c[0].dp * c[0].micro_batch_size for c, *_ in layouts]
        try:
            new = split_batch(gbs, steps, [lay[3] / s for lay, s in zip(layouts, shares)])
        except InputError:
            break
        if new == shares:
            break
        moved = []
        for (choices, _, bnd, _), share in zip(layouts, new):
            res = evaluate_layout(model, inventory, list(choices), share, cost, exact=True, schedule=cfg.schedule)
            if res.stage_layers is None:
                break
            moved.append((choices, res.stage_layers, res.boundaries, res.iteration_time_s))
        if len(moved) != k:
            break
        layouts, shares = moved, new
    return best


def _joined(model, inventory, gbs, shares, layouts) -> Plan:
    meshes = []
    for p, ((choices, layers, bnd, _), share) in enumerate(zip(layouts, shares)):
        part = layout_to_plan(model, share, choices, layers, inventory, boundaries=bnd)
        meshes += [dataclasses.replace(m, pipeline=p) for m in part.meshes]
    return Plan(model=model, global_batch_size=gbs, meshes=tuple(meshes), inventory=inventory.to_dict(),
                precision=inventory.precision or part.precision, pipeline_samples=tuple(shares))
