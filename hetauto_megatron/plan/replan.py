"""Re-planning after the inventory changed (`hetauto plan --from PLAN`): warm start and what moved.

The old plan seeds the search: its meshes on the clusters that are still there (with the devices they still
have) become local-search starts, and their predicted time is the plan to beat. The bounded enumeration,
pruned by that time, looks for what the old plan cannot reach by small steps (another S, another order), and
climbs start from both; no trees (docs/search.md has the measured time and quality against a cold search).
"""
from __future__ import annotations

from .evaluator import AUTO
from .plan import Plan
from .simulate import MeshChoice
from .space import SearchSpace


def warm_layouts(old: Plan, space: SearchSpace) -> list[tuple]:
    """The old plan's layout on what is left of the inventory: meshes on clusters that are gone are dropped,
    and meshes keep their TP, DP and micro-batch with as many stages as their cluster still allows."""
    have = {c.name for c in space.inventory.clusters}
    kept = [m for m in old.meshes if m.cluster in have]
    if not kept:
        return []
    S = kept[0].dp * kept[0].micro_batch_size
    if S not in space.samples or any(m.dp * m.micro_batch_size != S for m in kept):
        return []
    as_was = tuple(MeshChoice(m.cluster, m.tp, m.dp, m.micro_batch_size, AUTO, len(m.stage_layers)) for m in kept)
    out, before = [], 0
    refit = []
    for i, m in enumerate(kept):
        refit.append(space.mesh(m.cluster, m.tp, m.dp, S, before, len(kept) - i - 1))
        before += refit[-1].num_stages
    for layout in (as_was, tuple(refit)):
        if space.legal(layout) and layout not in out:
            out.append(layout)
    return out


def describe_moves(old: Plan, new: Plan) -> list[str]:
    """One line per cluster whose part in the plan changed (joined, left, or a different shape)."""
    def shape(m):
        return (f"tp{m.tp} dp{m.dp} mb{m.micro_batch_size} {m.recompute}, {len(m.stage_layers)} stages, "
                f"layers {'/'.join(map(str, m.stage_layers))}")

    before = {m.cluster: m for m in old.meshes}
    after = {m.cluster: m for m in new.meshes}
    lines = []
    for name, m in before.items():
        if name not in after:
            lines.append(f"{name}: left the plan (was {shape(m)})")
        elif shape(m) != shape(after[name]):
            lines.append(f"{name}: {shape(m)} -> {shape(after[name])}")
    for name, m in after.items():
        if name not in before:
            lines.append(f"{name}: joined the plan ({shape(m)})")
    old_order = [m.cluster for m in old.meshes]
    new_order = [m.cluster for m in new.meshes]
    if old_order != new_order:
        lines.append(f"pipeline order: {' -> '.join(old_order)}  =>  {' -> '.join(new_order)}")
    return lines or ["nothing moved: the old plan is still the best found"]
