"""How much of a stage's DP gradient reduction and parameter all-gather its own compute hides, bucket by bucket,
as Megatron-Core's DDP issues them (cost/ddp_buffer.py stage_buckets: each bucket's elements and the share of the
stage's work done once its gradients are produced; plan/tail_costs.py dp_exposed_times puts these into the tail).

Reduction (overlap_grad_reduce): bucket j's reduction is issued once the last micro-batch's backward has produced
its gradients, at B s_j (B the stage's backward, s_j its share done then), and the reductions run one after the
other: the last one ends at max_j (B s_j + R a_j), R the whole reduction, a_j the share of the elements in buckets
j and after. What is left after the backward: max_j (R a_j - B (1 - s_j)), at least the last bucket's R w_last.

All-gather (overlap_param_gather): the next forward's pre-hook of a bucket's first module waits for its gather
and then issues the next one (the bucket before it in the layout), which runs while this bucket's modules
compute: the first gathered (the layout's last bucket) is exposed in full unless started earlier (the published
runs' Megatron-Core started it at the step's start), each later one by what the previous bucket's forward
(F c, c its share of the stage's work) does not hide: G w_last + sum_k max(0, G w_k - F c_(k+1)).

Both are kept per stage kind as a few numbers (`Buckets`) so that the search's leaves evaluate them in a few
operations: the reduction's lines reduced to their upper envelope, the gather's terms sorted by where they stop
showing.
"""
from __future__ import annotations

import bisect
import math
from functools import lru_cache


class Buckets:
    """A stage's buckets in layout order ((elements, work share), ...), in the form the exposures read."""
    __slots__ = ("count", "last", "lines", "stops", "w_after", "c_after")

    def __init__(self, buckets: tuple):
        total = sum(e for e, _ in buckets) or 1
        w = [e / total for e, _ in buckets]
        s = [share for _, share in buckets]
        self.count = len(buckets)
        self.last = w[-1] if w else 0.0
        # the reduction: y_j(x) = a_j - x b_j, x = B / R >= 0; the upper envelope of these lines, from the last
        lines, a = [], 0.0
        for j in range(len(w) - 1, -1, -1):
            a += w[j]
            lines.append((a, 1.0 - s[j]))
        self.lines = _upper_envelope(lines) or ((0.0, 0.0),)
        # the gather after the first: max(0, w_k - y c_k1), y = F / G, showing while y < w_k / c_k1
        terms = sorted(((w[k] / c if c > 0 else float("inf")), w[k], c)
                       for k in range(len(w) - 1) for c in (s[k + 1] - s[k],))
        self.stops = [t[0] for t in terms]
        self.w_after, self.c_after = [0.0], [0.0]     # sums of w and c over the terms from index i on
        for _, wk, ck in reversed(terms):
            self.w_after.append(self.w_after[-1] + wk)
            self.c_after.append(self.c_after[-1] + ck)
        self.w_after.reverse()
        self.c_after.reverse()

    def reduce_left(self, reduce: float, bwd: float) -> float:
        """Seconds of the reduction still running when the stage's backward ends (R = `reduce`, B = `bwd`)."""
        if reduce <= 0.0:
            return 0.0
        best = -math.inf
        for a, b in self.lines:         # a few lines (one for a stage of one bucket): a plain loop is the cheapest
            v = reduce * a - bwd * b
            if v > best:
                best = v
        return best

    def gather_chain(self, gather: float, fwd: float) -> float:
        """Seconds the gathers after the first one add to the stage's forward (G = `gather`, F = `fwd`)."""
        if gather <= 0.0 or self.count < 2:
            return 0.0
        y = fwd / gather
        i = bisect.bisect_right(self.stops, y)
        return max(0.0, gather * (self.w_after[i] - y * self.c_after[i]))


def _upper_envelope(lines: list) -> tuple:
    """The lines (a, b) that attain max_j (a_j - x b_j) for some x >= 0, of `lines` in order of rising a and b (the
    buckets from the last: the line of the largest a, the first bucket's, leads at x = 0 and falls fastest)."""
    hull: list = []
    for a, b in lines:
        while hull and hull[-1][1] >= b:
            hull.pop()                      # falls as fast or faster from no higher: never above this one
        while len(hull) >= 2:
            (a1, b1), (a2, b2) = hull[-2], hull[-1]
            # hull[-1] leads nowhere if hull[-2] overtakes it no earlier than it overtakes this line
            if (a - a2) * (b2 - b1) >= (a2 - a1) * (b - b2):
                hull.pop()
            else:
                break
        hull.append((a, b))
    return tuple(hull)


@lru_cache(maxsize=65536)
def buckets_of(layout: tuple) -> Buckets:
    """Buckets(layout), once per layout."""
    return Buckets(layout)
