"""A finished layout's lower bound that knows every middle stage holds at least one layer.

`LayoutEvaluator.lower_bound` bounds the closed form `sum_i t_i + 2 sum_l x_l + (m - 1) P + tail + overhead` (t_i
stage i's forward + backward, P >= the slowest stage) from the cached terms, spreading the layers over the
stages by speed alone, fractions of a layer and empty stages allowed (stage i costs fixed_i + n_i per_i, per_i
without recomputation, the fastest):
    P >= P_0 = (L + sum_i fixed_i / per_i) / sum_i 1 / per_i,     sum_i t_i >= S_0 = sum_i fixed_i + L min_i per_i.
The split a layout runs puts whole layers on the stages, at least one on every middle stage (all but the
pipeline's first and last), so also
    P >= P_1 = the least P >= P_0 at which stage i, taking floor((P - fixed_i) / per_i) layers at most and a
               middle stage one at least, hold L (from P_0, stepped up to the next time at which a group of
               alike stages takes one more layer each, until they do),
    sum_i t_i >= S_1 = sum_i fixed_i + sum_(middle i) per_i + (L - middle stages) min_i per_i
(the other layers at the fastest per-layer time). P_1 >= P_0 and S_1 >= S_0, so the evaluator's bound raised by
(m - 1)(P_1 - P_0) + (S_1 - S_0) stays below the layout's value. It matters on deep pipelines of slow stages,
which the local search's moves (stage counts, TP/DP, S) often reach: on the 736-device example a neighbour on
63 single-GPU A100 stages is priced 188 s where the evaluator's bound says 11.8 s, and the climbs price about half
as many layouts with it (taking the same steps). The memory caps would add little: on the same climbs the exact split
with the largest cap any recomputation allows ruled out 1 more neighbour of 2,170, at the price of the cap
tables of every recomputation level. A test checks the bound against the evaluator on random layouts, local-search
moves included.
"""
from __future__ import annotations

import math

from .evaluator import AUTO, LayoutEvaluator


def split_lower_bound(ev: LayoutEvaluator, choices: tuple) -> float:
    """`ev.lower_bound(choices)` raised by what whole layers and a layer on every middle stage add (module
    docstring)."""
    m = ev.gbs // (choices[0].dp * choices[0].micro_batch_size)
    cur = tuple(ev.level(c, "none") if c.recompute == AUTO else c for c in choices)
    pm = ev.padded(cur)
    n, L = len(cur), ev.model.num_layers
    groups = []                         # (per-layer time, fixed time, least layers, stages) of alike stages
    for mi, c in enumerate(cur):
        prof = ev.profile(c, pm)
        per, k = prof.layer_fwd + prof.layer_bwd, c.num_stages
        ends = [(True, n == 1 and k == 1)] if mi == 0 else []      # the embedding's stage
        if mi == n - 1 and not (n == 1 and k == 1):
            ends.append((False, True))                              # the head's stage
        for f, l in ends:
            f0, b0 = prof.times(0, f, l)
            groups.append((per, f0 + b0, 0, 1))
        if k > len(ends):
            groups.append((per, 0.0, 1, k - len(ends)))             # middle stages: a layer each at least
    if sum(g[2] * g[3] for g in groups) > L:
        return math.inf                 # more middle stages than layers: no split exists
    fastest = min(g[0] for g in groups)
    period0 = (L + sum(c * f / q for q, f, _, c in groups)) / sum(c / q for q, _, _, c in groups)
    # the least P at which whole layers fit: from the fractional level and every stage's least time, step up to
    # the next stage time at which some group takes one more layer each until they hold L (a few steps: at the
    # fractional level each stage lacks less than a layer)
    period = max(period0, max(f + lo * q for q, f, lo, _ in groups))
    while True:
        held, step = 0, math.inf
        for q, f, _, c in groups:
            k = math.floor((period - f) / q + 1e-9)
            held += c * k
            step = min(step, f + (k + 1) * q)
        if held >= L:
            break
        period = step
    raise_work = sum(c * (q - fastest) for q, _, lo, c in groups if lo)
    return ev.lower_bound(choices) + (m - 1) * max(0.0, period - period0) + raise_work
