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
2. **Mixed replica groups in a stage** (Sailor style): the devices a cluster leaves over, or a cluster no
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
from dataclasses import dataclass, field

from ..cost.analytic import AnalyticCostModel
from ..errors import InfeasibleError, InputError
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import costing
from .batch_split import split_batch
from .constraints import Constraints, check_floor, devices_by_cluster, objective_value
from .link_costs import connected
from .plan import Plan
from .search import SearchConfig, SearchResult, search
from .settings import ENGINES
from .simulate import evaluate_layout, layout_to_plan, simulate
from .partition_bound import PartitionBound, set_partitions_into
from .space import tp_degrees
from .space_bounds import COMPUTE_SLACK, peak_rate

SHAPES = ("all", "simple")
MAX_PARTITIONS = 6          # partitions searched (best bound first) after the bound has pruned the rest
# Partitions bounded at most: every one of up to 8 usable clusters (20,891), the first of 9 or more in the order of
# _partition_candidates (their number grows with the Bell numbers: 27.6 million for 12 clusters, hours to bound).
MAX_PARTITIONS_BOUNDED = 25_000
REBALANCE_ROUNDS = 3        # batch re-splits from the pipelines' times


@dataclass
class ShapesResult:
    plan: Plan                      # the best plan found (estimate not set)
    iteration_time_s: float
    simple: SearchResult            # the single-pipeline search (its runners-up, method, ...)
    seconds: float
    partitions: int = 0             # partitions of the clusters into pipelines considered
    partitions_searched: int = 0    # ... whose bound beat the best plan, searched
    partitions_cut: bool = False    # the enumeration stopped at MAX_PARTITIONS_BOUNDED (or at --budget-s)
    pipelines_searched: int = 0     # single-pipeline searches for those
    alongside_tried: int = 0        # mixed replica groups priced
    tried: list = field(default_factory=list)   # (what, seconds per iteration or None, why) for the report
    levels_cut: bool = False        # --budget-s ran out in the new shapes' levels (or one of their searches)
    say: object = field(default=None, repr=False)    # progress(text) on stderr, or None

    @property
    def candidates_evaluated(self) -> int:
        return self.simple.candidates_evaluated

    @property
    def method(self) -> str:
        return self.simple.method

    @property
    def cut_by_budget(self) -> bool:
        return self.simple.cut_by_budget or self.levels_cut

    def to_dict(self) -> dict:
        return {**self.simple.to_dict(), "seconds": round(self.seconds, 3), "cut_by_budget": self.cut_by_budget,
                "shapes": {"partitions": self.partitions, "partitions_searched": self.partitions_searched,
                           "partitions_cut": self.partitions_cut,
                           "pipelines_searched": self.pipelines_searched, "alongside_tried": self.alongside_tried}}


def _score(con: Constraints, inventory: Inventory, plan: Plan, seconds: float) -> float:
    return objective_value(con, inventory, seconds, devices_by_cluster(plan.meshes))


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
    # under --max-iteration-s a single pipeline slower than it is the start that the other shapes must beat
    base = search(model, inventory, gbs, cost, cfg)
    plan = layout_to_plan(model, gbs, base.choices, base.stage_layers, inventory, boundaries=base.boundaries)
    best = (_score(con, inventory, plan, base.iteration_time_s), base.iteration_time_s, plan)
    out = ShapesResult(plan, base.iteration_time_s, base, 0.0)
    if shapes == "simple" or ENGINES[cfg.engine].simple_only:   # (DeepSpeed's engine: one pipeline)
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
            best = _partitions(model, inventory, gbs, cost, _sub(cfg), con, usable, best, out, deadline)
        _progress(out, "replica groups side by side")
        best = _alongside(model, inventory, cost, con, best, out, cfg.max_micro_batch, deadline)
        best = _mixed_starts(model, inventory, gbs, cost, _sub(cfg), con, usable, best, out, deadline)
    out.levels_cut = out.levels_cut or _out_of_time(deadline)
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
    seed = dataclasses.replace(old, model=model, inventory=inventory.to_dict(), estimate=None,
                               precision=inventory.precision or old.precision)
    try:
        est = simulate(seed, inventory, cost)      # (which checks the plan against the inventory first)
    except InputError:          # a cluster gone or smaller, a link missing: it does not run here
        return best
    out.tried.append(("the plan re-planned (--from)", est.iteration_time_s if est.fits else None, "kept as is"))
    score = _score(con, inventory, seed, est.iteration_time_s)
    return (score, est.iteration_time_s, seed) if est.fits and score < best[0] - 1e-12 else best


def _meets(con: Constraints, plan: Plan, schedule: str) -> bool:
    """Whether a plan obeys the constraints (and the boundary schedule) as the new shapes' search keeps them:
    --max-pp per pipeline, the pins per mesh, the clusters pinned in and out."""
    used = {m.cluster for m in plan.meshes}
    if used & set(con.exclude_clusters) or not set(con.use_clusters) <= used:
        return False
    if any(con.tp_of(m.cluster) not in (None, m.tp) or con.recompute_of(m.cluster) not in (None, m.recompute)
           or con.micro_batch_size not in (None, m.micro_batch_size)
           or (schedule == "blocking" and m.boundary_schedule != "blocking") for m in plan.meshes):
        return False
    return con.max_pp is None or all(plan.pipeline(p).pipeline_parallel_size <= con.max_pp
                                     for p in range(plan.num_pipelines))


def _progress(out: ShapesResult, text: str) -> None:
    if out.say is not None:
        out.say(text)


def _sub(cfg: SearchConfig) -> SearchConfig:
    """The configuration of the single-pipeline searches below: quiet and cold (a re-plan's warm start seeds the
    single-pipeline search above: its layouts span other clusters and batches). Each of them gets what is left of
    --budget-s when it starts (`_in_time`)."""
    return dataclasses.replace(cfg, progress=False, warm_start=())


def _in_time(cfg: SearchConfig, deadline) -> SearchConfig:
    """`cfg` with what is left of --budget-s now (each search below starts its own clock)."""
    return cfg if deadline is None else dataclasses.replace(cfg, budget_s=max(0.1, deadline - time.perf_counter()))


def _out_of_time(deadline) -> bool:
    return deadline is not None and time.perf_counter() > deadline


# ---- level 1: clusters -> pipelines ----------------------------------------------------------------------------
def _block_constraints(con: Constraints, block: list, names: list) -> Constraints:
    """The pipeline of a block uses exactly the block's clusters (the partition says which clusters take part,
    so its bound may count only their links)."""
    keep = set(block)
    return dataclasses.replace(
        con, exclude_clusters=tuple(n for n in names if n not in keep), use_clusters=tuple(block),
        tp=tuple((c, t) for c, t in con.tp if c in keep), recompute=tuple((c, r) for c, r in con.recompute if c in keep))


def _unit(gbs: int, k: int) -> int:
    """Initial shares are multiples of this power of two (room for a micro-batch step of several samples)."""
    u = 1
    while gbs % (2 * u) == 0 and 2 * u * k * 8 <= gbs:
        u *= 2
    return u


def _objective_bound(con: Constraints, inventory: Inventory, seconds: float, clusters) -> float:
    """A time bound as a bound on the objective: with --objective cost, times the least the plan pays per second
    (one device of each of `clusters`, which all take part)."""
    return objective_value(con, inventory, seconds, {c: 1 for c in clusters})


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
    bound = PartitionBound(model, inventory, gbs)
    names = [c.name for c in inventory.clusters]
    cands = []
    for subset, blocks in _partition_candidates(usable, con, gbs, lambda subset: connected(inventory, subset)):
        if out.partitions >= MAX_PARTITIONS_BOUNDED or (out.partitions % 512 == 0 and _out_of_time(deadline)):
            out.partitions_cut = True
            break
        out.partitions += 1
        b = _objective_bound(con, inventory, bound(blocks), subset)
        if b < best[0]:
            r = bound.root(blocks)        # pipeline 0: the block of the fastest cuts
            ordered = [blocks[r]] + blocks[:r] + blocks[r + 1:]
            cands.append((b, [sorted(x, key=names.index) for x in ordered]))
    cands.sort(key=lambda x: (x[0], str(x[1])))
    _progress(out, f"{out.partitions:,} partition{'s' if out.partitions != 1 else ''} of the clusters into pipelines "
                   f"bounded, {len(cands):,} may beat one pipeline")
    cache: dict = {}
    for b, blocks in cands[:MAX_PARTITIONS]:
        if b >= best[0] or _out_of_time(deadline):
            break
        _progress(out, "searching pipelines " + " | ".join("+".join(x) for x in blocks))
        out.partitions_searched += 1
        found = _search_partition(model, inventory, gbs, cost, cfg, con, names, blocks, cache, out, deadline)
        what = " | ".join("+".join(x) for x in blocks)
        if found is None:
            out.tried.append((what, None, "no feasible split"))
            continue
        t, plan = found
        out.tried.append((what, t, f"search bound {b:.3f} s"))
        s = _score(con, inventory, plan, t)
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
            try:
                # (a block above --max-iteration-s at its first share may come under it as the shares move)
                cache[key] = search(model, inventory, share, cost, dataclasses.replace(
                    _in_time(cfg, deadline), constraints=_block_constraints(con, blk, names)))
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
        if _out_of_time(deadline):      # (each round re-prices every pipeline: seconds at a large batch)
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


# ---- level 2: mixed replica groups in a stage -----------------------------------------------------------------
def _split(S: int, groups: list) -> list | None:
    """Micro-batch per group of two so that dp_0 * mbs_0 + dp_1 * mbs_1 = S, the shares following the groups'
    speeds: a group takes mbs / v seconds per step (v: samples per second of one of its replicas), and the step
    takes the slower group's. The continuous optimum gives each group S * dp_g v_g / sum(dp v) samples; among the
    whole micro-batches that add up to S the split with the smallest max(mbs_g / v_g) is that optimum rounded
    (ties: more samples on the first group). groups: [(dp, v)] x 2. None when no split of whole micro-batches."""
    (dp0, v0), (dp1, v1) = groups
    best = None
    for m0 in range(1, S // dp0 + 1):
        rest = S - dp0 * m0
        if rest < dp1 or rest % dp1:
            continue
        key = (max(m0 / v0, rest // dp1 / v1), -m0)
        if best is None or key < best[0]:
            best = (key, [m0, rest // dp1])
    return None if best is None else best[1]


def _speed(model, inventory, cost, cluster, tp, dp, mbs, recompute) -> float:
    prof = costing.stage_profile(model, inventory.cluster(cluster), tp, dp, mbs, recompute, cost)
    return mbs / (prof.layer_fwd + prof.layer_bwd)


def _alongside(model, inventory, cost, con, best, out: ShapesResult, max_mb: int = 16, deadline=None):
    """Greedy, mesh by mesh: the best extra replica group from free devices, kept if the plan gains. The group
    takes part of the mesh's micro-batch step (the step stays), or the pipeline's step grows 2, 4 or 8 times (the
    other meshes of the pipeline scale their micro-batch alike) and the two groups share it by speed: a slow
    group needs a large step to take a small share of it. No micro-batch grows past `max_mb`
    (SearchConfig.max_micro_batch)."""
    inv = inventory.with_precision(best[2].precision)
    for _ in range(2):                                   # a second pass may use what the first left free
        plan = best[2]
        improved = False
        for idx, mesh in enumerate(plan.meshes):
            if _out_of_time(deadline):      # --budget-s: the best plan so far (hundreds of meshes take seconds)
                return best
            if mesh.alongside or (idx + 1 < len(plan.meshes) and plan.meshes[idx + 1].alongside):
                continue
            p = mesh.pipeline
            mates = [i for i in plan.pipeline_mesh_indices(p) if i != idx]
            used = devices_by_cluster(plan.meshes)
            k, S = mesh.num_stages, mesh.samples_per_step
            v0 = _speed(model, inv, cost, mesh.cluster, mesh.tp, mesh.dp, mesh.micro_batch_size, mesh.recompute)
            # a group on another cluster exchanges the mesh's layers' gradients (at least 2 bytes per parameter)
            # with the mesh over the link between them, two holders in one phase, both directions at once: no
            # faster than that alone. With other pipelines holding them too (three or more holders) the exchange
            # may route around that link (plan/exchange_roots.py): no bound then
            grads = 2 * model.layer_params * sum(mesh.stage_layers) if plan.num_pipelines == 1 else 0.0
            for cl in inv.clusters:
                free = cl.num_devices - used.get(cl.name, 0)
                if cl.name in con.exclude_clusters or free < k or (
                        cl.name != mesh.cluster and inv.link(cl.name, mesh.cluster) is None):
                    continue
                if cl.name != mesh.cluster and _objective_bound(
                        con, inv, grads / inv.link(cl.name, mesh.cluster).bytes_per_s,
                        {m.cluster for m in plan.meshes} | {cl.name}) >= best[0]:
                    continue
                for tp in tp_degrees(model, cl):
                    if con.tp_of(cl.name) not in (None, tp) or tp * k > free:
                        continue
                    most = free // (tp * k)
                    # all the free devices, or a power of two fewer replicas (a slow device type takes a few)
                    for dp in sorted({most} | {1 << j for j in range(most.bit_length()) if 1 << j < most}):
                        for scale in (1, 2, 4, 8):
                            step = S * scale
                            if plan.samples_per_pipeline[p] % step or (scale > 1 and any(
                                    plan.meshes[i].micro_batch_size * scale > max_mb for i in mates)):
                                continue
                            v1 = _speed(model, inv, cost, cl.name, tp, dp, max(1, step // (2 * dp)), "none")
                            mbs = _split(step, [(mesh.dp, v0), (dp, v1)])
                            if mbs is None or max(mbs) > max_mb or (con.micro_batch_size and set(mbs) != {
                                    con.micro_batch_size}):
                                continue
                            for rc in ("none", "selective", "full"):
                                if con.recompute_of(cl.name) not in (None, rc):
                                    continue
                                extra = dataclasses.replace(mesh, cluster=cl.name, device_type=cl.device.name,
                                                            tp=tp, dp=dp, micro_batch_size=mbs[1], recompute=rc,
                                                            setting_overrides=(), alongside=True,
                                                            boundary_schedule="blocking", boundary_depth=0)
                                main = dataclasses.replace(mesh, micro_batch_size=mbs[0])
                                cand = _with_group(plan, idx, main, extra, mates, scale, inv)
                                if cand is None:
                                    break
                                out.alongside_tried += 1
                                est = simulate(cand, inventory, cost)
                                if not est.fits:
                                    continue                 # more recomputation may fit
                                sc = _score(con, inventory, cand, est.iteration_time_s)
                                if sc < best[0] - 1e-12:
                                    best = (sc, est.iteration_time_s, cand)
                                    improved = True
                                break
        if not improved:
            break
    return best


def _mixed_starts(model, inventory, gbs, cost, cfg, con, usable, best, out: ShapesResult, deadline=None):
    """Sailor's shape: one cluster's pipeline with another cluster's devices as replica groups of its stages.
    Start from the best plan on each cluster alone, when a linked cluster could stand alongside it: the two
    groups would at least swap the model's gradients over the link between the two (one phase, both directions
    at once: plan/tail_costs.py holders_sync_time), on top of the model's FLOPs at both clusters' peak; clusters
    where that bound cannot beat the best plan are skipped."""
    bound = PartitionBound(model, inventory, gbs)
    names = [c.name for c in inventory.clusters]
    for c in usable:
        if _out_of_time(deadline):
            break
        partners = [d for d in usable if d != c and inventory.link(c, d) is not None
                    and _objective_bound(con, inventory, COMPUTE_SLACK * bound.flops / (bound.rate[c] + bound.rate[d])
                                         + bound.grad_bytes / inventory.link(c, d).bytes_per_s, (c, d)) < best[0]]
        if not partners:
            continue
        _progress(out, f"{c}'s pipeline with groups of {'+'.join(partners)} alongside")
        try:
            # (under --max-iteration-s the cluster alone may be slower than it: the groups alongside may bring
            # the plan under it)
            r = search(model, inventory, gbs, cost, dataclasses.replace(
                _in_time(cfg, deadline), constraints=_block_constraints(con, [c], names)))
        except (InfeasibleError, InputError):
            continue
        out.levels_cut |= r.cut_by_budget
        out.pipelines_searched += 1
        start = layout_to_plan(model, gbs, r.choices, r.stage_layers, inventory, boundaries=r.boundaries)
        held = (math.inf, math.inf, start)
        found = _alongside(model, inventory, cost, con, held, out, cfg.max_micro_batch, deadline)
        if found is not held and not all(u in {m.cluster for m in found[2].meshes} for u in con.use_clusters):
            found = held                 # --use-clusters: a cluster pinned in is missing
        if found is not held and found[0] < best[0] - 1e-12:
            best = found
        out.tried.append((f"{c} with groups alongside", found[1] if found is not held else None,
                          f"partners {'+'.join(partners)}"))
    return best


def _with_group(plan: Plan, idx: int, main, extra, mates, scale: int, inventory) -> Plan | None:
    """The plan with `extra` alongside mesh `idx` (now `main`); the pipeline's other meshes (`mates`) scale their
    micro-batch by `scale`. None when the launches would not start on whole nodes (Plan.check_whole_nodes), or
    when no order of the two groups keeps every TP group inside a node: on one
    cluster the two share a launch, ranks in mesh order, so e.g. one TP 1 device before four TP 2 groups would put
    a TP group across two 8-device nodes, the other order not. Both orders are tried (the two hold the same
    stages, so their order changes nothing else)."""
    meshes = list(plan.meshes)
    for i in mates:
        if scale != 1:
            meshes[i] = dataclasses.replace(meshes[i], micro_batch_size=meshes[i].micro_batch_size * scale)
    # the boundaries around a position with several groups are blocking (plan/shapes.py)
    if idx > 0 and meshes[idx - 1].pipeline == main.pipeline:
        meshes[idx - 1] = dataclasses.replace(meshes[idx - 1], boundary_schedule="blocking", boundary_depth=0)
    main = dataclasses.replace(main, boundary_schedule="blocking", boundary_depth=0)
    orders = [(main, extra)]
    if extra.cluster == main.cluster:
        orders.append((dataclasses.replace(extra, alongside=False), dataclasses.replace(main, alongside=True)))
    for first, second in orders:
        try:
            cand = dataclasses.replace(plan, meshes=(*meshes[:idx], first, second, *meshes[idx + 1:]), estimate=None)
            cand.check_tp_inside_nodes(lambda c: inventory.cluster(c).devices_per_node)
            cand.check_whole_nodes(lambda c: (inventory.cluster(c).devices_per_node, inventory.cluster(c).nodes))
            return cand
        except InputError:
            continue
    return None
