"""Re-planning after the inventory changed (`hetauto plan --from PLAN`): warm start and what moved.

The old plan seeds the search: its meshes on the clusters that are still there (with the devices they still
have) become a local-search start, and the climbed old plan is the plan to beat. An enumeration pruned by its
value, over the old plan's micro-batch sizes, looks for what the old plan cannot reach by small steps
(another S, order, TP or DP), diving to leaves before it widens, climbing from each better leaf it finds and
stopping once it stops finding better ones (`warm_enumeration`), and climbs start from the best it finds at each
of its two best S; no trees
(docs/search.md has the measured time and quality against a cold search). A plan of several pipelines or
replica groups side by side seeds it with each of its pipelines; the new shapes are then searched as a cold plan
searches them, with the old plan itself as their first incumbent where it still runs (plan/multi_search.py
`_seeded`).
"""
from __future__ import annotations

import math
from dataclasses import replace

from .branch_and_bound import branch_and_bound, dive_order
from .evaluator import AUTO
from .plan import Plan
from .simulate import MeshChoice, num_micro_batches
from .space import SearchSpace


def searched_schedule(plan: Plan, default: str | None = "overlapped") -> str | None:
    """The boundary schedule a plan was searched with: as its estimate recorded it (estimate.search.
    boundary_schedule); for a plan without the record, as its meshes tell it: where a boundary crosses clusters,
    overlapped if any mesh's boundary is, else blocking (a search with overlapped boundaries may still leave every
    one blocking where the buffers do not fit: the record says so); a plan with no boundary between clusters does
    not tell, and gets `default` (the search's)."""
    search = (plan.estimate or {}).get("search") if isinstance(plan.estimate, dict) else None
    recorded = search.get("boundary_schedule") if isinstance(search, dict) else None
    if recorded in ("overlapped", "blocking"):
        return recorded
    crossing = [b for p in range(plan.num_pipelines) for a, b in zip(plan.positions(p), plan.positions(p)[1:])
                if {plan.meshes[i].cluster for i in a + b} != {plan.meshes[a[0]].cluster}]
    if not crossing:
        return default
    return "overlapped" if any(m.boundary_schedule == "overlapped" for m in plan.meshes) else "blocking"


def warm_layouts(old: Plan, space: SearchSpace) -> list[tuple]:
    """The old plan's layout on what is left of the inventory: meshes on clusters that are gone are dropped,
    and meshes keep their TP, DP and micro-batch with as many stages as their cluster still allows. A plan of
    several pipelines or replica groups side by side gives each of its pipelines' chains of meshes (the meshes
    alongside another left out) as a start of its own: the single-pipeline search climbs from each."""
    out = []
    for chain in _chains(old):
        for layout in _warm_chain(chain, space):
            if layout not in out:
                out.append(layout)
    return out


def _chains(plan: Plan) -> list[list]:
    """The meshes of each pipeline in stage order, without those alongside another (one chain: a simple plan)."""
    return [[m for i in plan.pipeline_mesh_indices(p) if not (m := plan.meshes[i]).alongside]
            for p in range(plan.num_pipelines)]


def _warm_chain(meshes: list, space: SearchSpace) -> list[tuple]:
    have = {c.name for c in space.inventory.clusters}
    kept = [m for m in meshes if m.cluster in have]
    if not kept:
        return []
    S = kept[0].samples_per_step
    if S not in space.samples or any(m.samples_per_step != S for m in kept):
        return []
    # (the old meshes' shapes running the new job's settings: the search prices no other)
    as_was = tuple(MeshChoice(m.cluster, m.tp, m.dp, m.micro_batch_size, AUTO, len(m.stage_layers),
                              space.job_settings) for m in kept)
    out = []
    for layout in (as_was, space.refit([(m.cluster, m.tp, m.dp) for m in kept], S)):
        if space.legal(layout) and layout not in out:
            out.append(layout)
    return out


PATIENCE = 1000         # it stops this many visits after its last better leaf (or its first leaf priced;
                        # with 300 a 4-cluster tree's better S was never reached: benchmarks/search_scale.py
                        # --replan-random, +6.85 %),
MAX_VISITS = 4000       # or after this many visits


def micro_batches(warm: list[tuple]) -> dict:
    """The micro-batch sizes the warm enumeration tries: each cluster of the old plan its own, any other cluster
    (key None) those the old plan used. A cluster's best micro-batch depends on its devices' memory and GEMM
    efficiency, which a change of inventory does not touch, while its TP, DP and stages move with S and the
    other clusters; a climb still tries other micro-batches from what the enumeration finds."""
    out: dict = {None: set()}
    for layout in warm:
        for m in layout:
            out.setdefault(m.cluster, set()).add(m.micro_batch_size)
            out[None].add(m.micro_batch_size)
    return out


def warm_enumeration(space: SearchSpace, value, leaf_bound, incumbent: float, patience: int | None = None,
                     found: dict | None = None, micro_batches: dict | None = None,
                     deadline: float | None = None, improve=None) -> tuple[dict, int, bool]:
    """Branch and bound for leaves better than `incumbent` (the climbed old plan): -> ({layout: value} of the
    leaves priced, nodes visited, settled: no leaf left beats the best value found). `value(path)` prices a
    leaf (-> (value, layout)), `leaf_bound(layout)` bounds it from below; `micro_batches` ({cluster or None:
    sizes}, `micro_batches()`), if given, keeps only the DP decisions that give those micro-batch sizes.

    A node whose bound (`SearchSpace.bound`; a leaf's own `leaf_bound`) is above the best value held is never
    visited, as in `search.bounded_enumeration` (both are plan/branch_and_bound.py), in diving order
    (`branch_and_bound.dive_order`): in pure best-first order the enumeration spent thousands of nodes near the
    top of the tree before it priced a leaf that beats the old plan (736 devices without H800: node 3,099;
    diving, node 27). Where the old plan is still the best, the bounds cannot prove it in thousands of nodes, so
    the search stops `patience` visits after its last better leaf (or its first leaf priced), after MAX_VISITS,
    or at `deadline` (time.perf_counter()). `improve(layout, value)`, if given, climbs from each leaf better than
    the best held and returns the climb's best value, which the enumeration then prunes by: a leaf that beats the
    leaf but not the climb from it no longer renews the patience (736 devices without H800: 1,482 visits, were
    2,185; the same plan). A leaf is priced when its turn comes unless its own bound is above the best held (not
    queued again by that bound, `branch_and_bound`'s `requeue`): the re-plan's leaf bound (leaf_bound.py,
    `links`) is close to the values, and queued by it the leaves waited behind the looser inner nodes (736
    devices without H800: no better leaf found in 1,223 visits, +0.25 %)."""
    def keep_micro_batches(path, acts):
        order, _, S, meshes, pending = space.decode(path)
        if pending is None or isinstance(pending, tuple):    # a TP or (cost objective) a stage decision
            return acts
        ok = micro_batches.get(order[len(meshes)], micro_batches[None])   # a DP decision: S // DP is its micro-batch
        return [a for a in acts if S // a in ok]

    # a leaf counts as better than the best held only by more than rounding (1e-9), so near-ties do not renew
    # the patience
    return branch_and_bound(space, value, leaf_bound, 1, incumbent, better=1e-9, priority=dive_order(space),
                            allowed=None if micro_batches is None else keep_micro_batches,
                            patience=PATIENCE if patience is None else patience, max_visits=MAX_VISITS,
                            deadline=deadline, found=found, improve=improve, requeue=False)


def micro_batch_variants(space: SearchSpace, layout: tuple) -> list[tuple]:
    """The layout with every mesh's micro-batch doubled, and halved where all are even (S doubled or halved, the
    same meshes and stages), where legal: with few micro-batches the closed form's fill and drain can rank
    these wrongly against the layout, so the event simulation decides (a climb prices one only when the
    closed form's bound says it may be better)."""
    out = []
    for num, den in ((2, 1), (1, 2)):
        if all(m.micro_batch_size * num % den == 0 for m in layout):
            v = tuple(replace(m, micro_batch_size=m.micro_batch_size * num // den) for m in layout)
            if space.legal(v):
                out.append(v)
    return out


def shortlist(ranked: list, gbs: int, few: int, most: int, many_micro_batches: int, same=lambda layout: layout
              ) -> list:
    """The layouts a re-plan's event simulation re-checks, from (value, layout) best first: the best `few`
    distinct ones, and those of the best `most` that run fewer than `many_micro_batches` micro-batches, where the
    closed form is up to 13 % off the simulation (fill and drain; search.RERANK_MARGIN_M). Layouts with the
    same `same(layout)` (the evaluator's resolved layout: recomputation chosen) count once."""
    out, seen = [], set()
    for t, layout in ranked:
        if not math.isfinite(t) or same(layout) in seen:
            continue
        seen.add(same(layout))
        if len(out) < few or num_micro_batches(layout, gbs) < many_micro_batches:
            out.append((t, layout))
        if len(seen) >= most:
            break
    return out


def describe_moves(old: Plan, new: Plan) -> list[str]:
    """One line per cluster whose part in the plan changed (joined, left, or a different shape), then the
    pipelines' order of clusters when it changed. A cluster of several meshes (replica groups side by side, or
    pipelines) lists them all; with several pipelines each mesh names its pipeline."""
    def shape(m):
        n = len(m.stage_layers)
        return (f"tp{m.tp} dp{m.dp} mb{m.micro_batch_size} {m.recompute}, {n} stage{'s' if n != 1 else ''}, "
                f"layers {'/'.join(map(str, m.stage_layers))}"
                + (f", pipeline {m.pipeline}" if old.num_pipelines > 1 or new.num_pipelines > 1 else "")
                + (", alongside" if m.alongside else ""))

    def by_cluster(plan):
        out: dict = {}
        for m in plan.meshes:
            out.setdefault(m.cluster, []).append(shape(m))
        return {name: "; ".join(shapes) for name, shapes in out.items()}

    def order(plan):
        return "  |  ".join(" -> ".join("+".join(plan.meshes[i].cluster for i in pos) for pos in plan.positions(p))
                            for p in range(plan.num_pipelines))

    before, after = by_cluster(old), by_cluster(new)
    lines = []
    for name, was in before.items():
        if name not in after:
            lines.append(f"{name}: left the plan (was {was})")
        elif was != after[name]:
            lines.append(f"{name}: {was} -> {after[name]}")
    for name, now in after.items():
        if name not in before:
            lines.append(f"{name}: joined the plan ({now})")
    if order(old) != order(new):
        lines.append(f"pipeline order: {order(old)}  =>  {order(new)}")
    lines += [f"{name}: settings {', '.join(moved)}" for name, moved in settings_moves(old, new).items()]
    return lines or ["nothing moved: the old plan is still the best found"]


def settings_moves(old: Plan, new: Plan) -> dict:
    """{cluster: ["key old -> new", ...]} for each cluster in both plans whose meshes run other settings: a
    setting any of its meshes sets apart from its TP's default, old or new, whose values differ (a setting that
    only follows a new TP's default is no move: the TP's line says it). Its meshes' distinct values are joined by
    "/"."""
    from .settings import default_settings

    def text(v):
        return str(v).lower() if isinstance(v, bool) else str(v)

    def by_cluster(plan):
        """({cluster: {key: its meshes' distinct values}}, {(cluster, key) a mesh sets apart from its default})"""
        values: dict = {}
        apart: set = set()
        for m in plan.meshes:
            base = default_settings(m.tp).to_dict()
            for k, v in m.settings.to_dict().items():
                seen = values.setdefault(m.cluster, {}).setdefault(k, [])
                if text(v) not in seen:
                    seen.append(text(v))
                if v != base[k]:
                    apart.add((m.cluster, k))
        return values, apart

    (before, apart_before), (after, apart_after) = by_cluster(old), by_cluster(new)
    out: dict = {}
    for name in (n for n in before if n in after):
        for k, was in before[name].items():
            now = after[name][k]
            if (name, k) in apart_before | apart_after and was != now:
                out.setdefault(name, []).append(f"{k} {'/'.join(was)} -> {'/'.join(now)}")
    return out
