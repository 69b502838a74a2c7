"""The exact uneven layer split: how many transformer layers each pipeline stage gets.

All transformer layers of a model cost the same, so on stage i a split of n_i layers costs
    t_i(n_i) = fixed_i + n_i * per_layer_i           (forward + backward per micro-batch)
with per_layer_i depending on the stage's device, TP and micro-batch, and fixed_i the embedding or output head.
The 1F1B steady state runs at the pace of the slowest stage, so the split minimises max_i t_i(n_i) subject to
sum n_i = L, lo_i <= n_i <= cap_i (cap from the stage's memory, lo = 1 for middle stages).

Distributing identical items to minimise the maximum of increasing per-bin costs is solved exactly by handing
out layers one at a time to the stage whose cost after taking it is smallest (exchange argument: any optimal
split can be turned into the greedy one without raising the maximum); the hand-out starts from every layer
cheaper than the level where the uncapped stages would hold all layers, which it would take first anyway.
Among the splits with that optimal maximum T*, the one with the least total work (which sets pipeline fill
and drain) fills the cheapest stages first up to their cap under T*. `split_layers_bruteforce` checks both claims in the tests.
"""
from __future__ import annotations

import itertools
import math
from heapq import heapify, heappop, heapreplace
from operator import lt, truediv


def split_layers(per: list[float], fixed: list[float], lo: list[int], cap: list[int],
                 total: int) -> list[int] | None:
    """Layers per stage minimising (max stage time, then total time); None if the caps cannot hold `total`.
    (Plain loops without builtin calls per stage: at the 2-100 stages of a pipeline they are faster than numpy,
    whose per-call overhead dominates, and than map chains of builtins; measured with benchmarks/search_scale.py's
    instances.)"""
    n = len(per)
    if sum(lo) > total or sum(cap) < total or any(map(lt, cap, lo)):
        return None
    counts = _fill_below(per, fixed, lo, cap, total)
    left = total - sum(counts)
    if left:
        heap = [(fixed[i] + per[i] * (k + 1), i) for i, k in enumerate(counts) if k < cap[i]]
        heapify(heap)
        for _ in range(left):       # (entries are distinct (time, stage) pairs: the pop order is the heap's)
            i = heap[0][1]
            k = counts[i] = counts[i] + 1
            if k < cap[i]:
                heapreplace(heap, (fixed[i] + per[i] * (k + 1), i))
            else:
                heappop(heap)
    t_star = max([f + p * k for f, p, k in zip(fixed, per, counts)])
    # Least total work with max <= t_star: give each stage its lower bound, then fill cheapest-per-layer first.
    best = list(lo)
    left = total - sum(lo)
    worst = -math.inf
    order = sorted(range(n), key=per.__getitem__)     # (stable: equal per-layer times in stage order)
    for pos, i in enumerate(order):
        if not left:                # the rest keep their lower bounds: only their times remain to compare
            rest = max([fixed[j] + per[j] * best[j] for j in order[pos:]])
            if rest > worst:
                worst = rest
            break
        p, f = per[i], fixed[i]
        limit = int((t_star - f) / p + 1e-9) if p > 0 else cap[i]
        take = (limit if limit < cap[i] else cap[i]) - best[i]
        if take > 0:
            if take > left:
                take = left
            best[i] += take
            left -= take
        t = f + p * best[i]
        if t > worst:
            worst = t
    if left == 0 and worst <= t_star + 1e-12:
        return best
    return counts


def _fill_below(per, fixed, lo, cap, total) -> list[int]:
    """A head start for the one-by-one hand-out: every layer cheaper than the level at which the stages,
    ignoring their caps, would hold `total` layers. The hand-out takes exactly these first (it always takes
    the cheapest next layer), so starting from them only saves steps. If rounding makes the start hold more
    than `total`, start from the lower bounds instead."""
    if min(per) <= 0:
        return list(lo)
    level = (total + sum(map(truediv, fixed, per))) / sum([1.0 / p for p in per])
    counts = [c if (k := int((level - f) / p)) >= c else l if k <= l else k
              for p, f, l, c in zip(per, fixed, lo, cap)]
    return counts if sum(counts) <= total else list(lo)


def split_layers_bruteforce(per_layer, fixed, lo, cap, total):
    """Reference for tests: every split, ordered by (max, sum)."""
    best = None
    for counts in itertools.product(*[range(l, c + 1) for l, c in zip(lo, cap)]):
        if sum(counts) != total:
            continue
        times = [f + p * c for p, f, c in zip(per_layer, fixed, counts)]
        key = (round(max(times), 12), round(sum(times), 12))
        if best is None or key < best[0]:
            best = (key, list(counts))
    return None if best is None else best[1]
