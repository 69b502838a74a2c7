"""How the search chooses the depth of each overlapped cross-cluster boundary (docs/search.md, "Boundary
schedules"): one policy, priced either by the closed form (the search's leaf evaluator, plan/evaluator.py) or by
the event simulation (`layout_pricing.evaluate_layout(exact=True)`, the final ranking).

Depth 0 on every mesh with a cross-cluster boundary after it; blocking when not even those boundaries' buffers
fit; then, unless the links already cost nothing at depth 0, the link's round trip in micro-batches
(`ceil(2 x transfer / slowest stage)`, halved until the layer split fits), kept when it is faster.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

from .pipeline import estimate_1f1b


class Priced(NamedTuple):
    """A layout priced with given boundary depths (the pricer's answer)."""
    seconds: float              # the iteration (inf when the split does not fit)
    fits: bool                  # whether the layer split fits in memory with those depths
    fwd: list | None            # per stage, its split's forward and backward times (when it fits)
    bwd: list | None
    closed: float | None        # the closed-form 1F1B time at those depths, when the pricer has it
    reuse: object               # handed back to the pricer when it prices a deeper warm-up of the same layout
    result: object              # what the caller returns
    # an exact pricer's simulation, left until its seconds are needed (seconds and result wait for it): pending(above)
    # -> the Priced, or None when the simulation proves the layout slower than `above` seconds (the event
    # simulation of a depth that loses is stopped early: layout_pricing.evaluate_layout)
    pending: Callable | None = None


def settled(priced: Priced, above: float = math.inf) -> Priced | None:
    """`priced` with its seconds (its pending simulation run), or None when proven slower than `above`."""
    return priced if priced.pending is None else priced.pending(above)


def choose_depths(cross: list, owners: list, links: list, latency: list, m: int, meshes: int,
                  price: Callable[[list, object], Priced], uplinks=None) -> Priced:
    """The best of the depths the policy tries. cross: per boundary, whether it joins two clusters; owners:
    per stage, its mesh; links / latency / uplinks: per boundary (simulate.Pipeline); price(depths, reuse): the
    layout with per-mesh depths (None: blocking), `reuse` the shallower pricing's `reuse` (or None)."""
    crossing = {owners[l] for l, c in enumerate(cross) if c}
    blocking_all = [None] * meshes
    if not crossing:
        return settled(price(blocking_all, None))
    zero = [0 if i in crossing else None for i in range(meshes)]
    best = price(zero, None)
    if not best.fits:               # not even the overlapped buffers fit: blocking needs none
        return settled(price(blocking_all, None))
    fwd, bwd = best.fwd, best.bwd
    blocking, depth = [not c for c in cross], [0] * len(cross)
    shallow = best.closed if best.closed is not None else \
        estimate_1f1b(fwd, bwd, links, m, latency=latency, blocking=blocking, depth=depth, uplinks=uplinks)
    # The links already cost nothing at depth 0 (within 0.1 % of the links priced away): a deeper warm-up
    # cannot help. Pricing them away saves at least their fill and drain, 2 x each, so when that alone is over
    # 0.1 % of the time they do cost something, without the second closed form.
    if 2 * sum([x for c, x in zip(cross, links) if c]) <= 0.001 * shallow:
        hidden = estimate_1f1b(fwd, bwd, [0.0 if c else x for c, x in zip(cross, links)], m, blocking=blocking,
                               depth=depth)
        if shallow <= hidden * 1.001:
            return settled(best)
    slowest = max([f + b for f, b in zip(fwd, bwd)])
    deep = list(zero)
    for l, c in enumerate(cross):
        if c:
            deep[owners[l]] = min(m, math.ceil(2 * links[l] / slowest - 1e-9))
    while any(deep):
        res = price(deep, best.reuse)
        if res.fits:
            # depth 0 is simulated only as far as it takes to lose (its transient can be hundreds of rounds)
            res = settled(res)
            shallow_priced = settled(best, res.seconds)
            return res if shallow_priced is None or res.seconds < shallow_priced.seconds else shallow_priced
        deep = [None if d is None else d // 2 for d in deep]
    return settled(best)
