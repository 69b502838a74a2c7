"""A finished layout's lower bounds, from the leaf evaluator's cached terms: what lets a search skip pricing it.

`LayoutEvaluator.lower_bound` (`LeafBound`, mixed into the evaluator) bounds the closed form
`sum_i t_i + 2 sum_l x_l + (m - 1) P + tail + overhead` (t_i stage i's forward + backward, P >= the slowest stage)
from the cached terms, spreading the layers over the stages by speed alone, fractions of a layer and empty stages
allowed (stage i costs fixed_i + n_i per_i, per_i without recomputation, the fastest):
    P >= P_0 = (L + sum_i fixed_i / per_i) / sum_i 1 / per_i,     sum_i t_i >= S_0 = sum_i fixed_i + L min_i per_i.
The split a layout runs puts whole layers on the stages, at least one on every middle stage (all but the
pipeline's first and last), so also
    P >= P_1 = the least P >= P_0 at which stage i, taking floor((P - fixed_i) / per_i) layers at most and a
               middle stage one at least, hold L (from P_0, stepped up to the next time at which a group of
               alike stages takes one more layer each, until they do),
    sum_i t_i >= S_1 = sum_i fixed_i + sum_(middle i) per_i + (L - middle stages) min_i per_i
(the other layers at the fastest per-layer time). P_1 >= P_0 and S_1 >= S_0, so the evaluator's bound raised by
(m - 1)(P_1 - P_0) + (S_1 - S_0) (`split_lower_bound`) stays below the layout's value. It matters on deep
pipelines of slow stages, which the local search's moves (stage counts, TP/DP, S) often reach: on the 736-device
example a neighbour on 63 single-GPU A100 stages is priced 188 s where the evaluator's bound says 11.8 s, and the
climbs price about half as many layouts with it (taking the same steps). The memory caps would add little: on the
same climbs the exact split with the largest cap any recomputation allows ruled out 1 more neighbour of 2,170, at
the price of the cap tables of every recomputation level. A test checks the bound against the evaluator on random
layouts, local-search moves included.

Re-planning's bound (`links`) also counts what the boundaries add to the period: a blocking boundary's send x_l
holds both stages it joins (a boundary inside a cluster is blocking under either schedule; under blocking
boundaries every one is), so stage i's time is at least fixed_i + n_i per_i + its blocking sends, and P_1 is
taken with those; and P >= x_l - latency_l for every boundary (an overlapped link's occupancy, the closed form's
period_link; a blocking one holds its stage for x_l). On the 736-device example without its H800s the period is
the cross-cluster link's occupancy in nearly every layout the re-plan prices, which the split's rules do not see:
the median bound rose from 0.83 to 0.97 of the layout's value, and the re-plan priced 175 layouts, were 747. The
cold search keeps the bound without it: its proving enumeration stops after pricing `search.PROVE_PRICED`
leaves, and with the tighter bound it priced fewer and visited far more nodes (the same example, seed 1: about
twice the search's time), while its plans were the same.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..spec.model import ModelSpec
from . import tail_costs
from .simulate import num_micro_batches

if TYPE_CHECKING:
    from .evaluator import LayoutEvaluator
    from .simulate import MeshChoice


class LeafBound:
    """`LayoutEvaluator.lower_bound` (plan/evaluator.py), mixed into it: its methods read the evaluator's cached
    terms (`lightest`, `padded`, `profile`, `boundary`, `sync`), `gbs`, `model` and `cost`."""

    def lower_bound(self, choices: tuple) -> float:
        """A lower bound on `resolve(choices)`'s time (either schedule), from cached terms only (no layer split,
        no tail, no 1F1B): the closed form is
            sum_i (f_i + b_i) + 2 sum_l x_l + (m - 1) P + tail + overhead,
        and with stage i costing fixed_i + n_i per_i for its n_i layers (sum n_i = L),
        - sum_i (f_i + b_i) >= sum_i fixed_i + L min_i per_i;
        - P >= the slowest stage >= (L + sum_i fixed_i / per_i) / sum_i 1 / per_i: if every stage takes at most
          M, then n_i <= (M - fixed_i) / per_i, and these add up to at least L;
        - the tail >= the job-wide sync + the slowest optimizer step, which is affine in the layers too, so the
          same argument bounds it;
        with per-layer times without recomputation (the fastest; recomputation only adds). A test checks it
        against every leaf of random instances."""
        m = num_micro_batches(choices, self.gbs)
        cur = self.lightest(choices)
        pm = self.padded(cur)
        n, L = len(cur), self.model.num_layers
        samples = cur[0].dp * cur[0].micro_batch_size
        fixed = fixed_per = inv_per = opt_fixed = opt_inv = links = overhead = opt_max = 0.0
        fastest, opt_affine = math.inf, True
        for mi, c in enumerate(cur):
            t = self._mesh_terms(c, pm, mi == 0, mi == n - 1)
            fixed += t[0]
            fixed_per += t[1]
            inv_per += t[2]
            fastest = min(fastest, t[3])
            opt_fixed += t[4]
            opt_inv += t[5]
            opt_affine &= t[6]
            opt_max = max(opt_max, t[7])
            overhead = max(overhead, t[8])
            if c.num_stages > 1:
                links += (c.num_stages - 1) * self.boundary(c, c, pm, True, samples)[0]
            if mi < n - 1:
                links += self.boundary(c, cur[mi + 1], pm, False, samples)[0]
        period = (L + fixed_per) / inv_per
        opt = (L + opt_fixed) / opt_inv if opt_affine else opt_max
        return fixed + L * fastest + 2 * links + (m - 1) * period + self.sync(cur, pm) + opt + overhead

    def _mesh_terms(self, c: MeshChoice, pm: ModelSpec, first: bool, last: bool) -> tuple:
        """A mesh's share of `lower_bound`'s sums over its stages: (sum fixed_i, sum fixed_i / per_i,
        sum 1 / per_i, per-layer time, sum opt0_i / opt1_i, sum 1 / opt1_i, every opt1_i > 0, max opt0_i,
        iteration overhead), with opt0_i + n opt1_i stage i's optimizer step for n layers."""
        key = (c, pm.vocab_size, first, last)
        out = self._mesh_bounds.get(key)
        if out is None:
            prof = self.profile(c, pm)
            k = c.num_stages
            per = prof.layer_fwd + prof.layer_bwd
            kinds = {}                  # (first, last) of each stage -> how many stages
            for j in range(k):
                f, l = first and j == 0, last and j == k - 1
                kinds[(f, l)] = kinds.get((f, l), 0) + 1
            fixed = fixed_per = opt_fixed = opt_inv = opt_max = 0.0
            affine = True
            for (f, l), count in kinds.items():
                f0, b0 = prof.times(0, f, l)
                fixed += count * (f0 + b0)
                fixed_per += count * (f0 + b0) / per
                o0 = tail_costs.optimizer_time(pm, prof, 0, f, l)
                o1 = tail_costs.optimizer_time(pm, prof, 1, f, l) - o0
                opt_max = max(opt_max, o0)
                if o1 > 0:
                    opt_fixed += count * o0 / o1
                    opt_inv += count / o1
                else:
                    affine = False
            out = self._mesh_bounds[key] = (fixed, fixed_per, k / per, per, opt_fixed, opt_inv, affine, opt_max,
                                            self.cost.iteration_overhead_s(prof.cluster.device))
        return out


def split_lower_bound(ev: LayoutEvaluator, choices: tuple, links: bool = False) -> float:
    """`ev.lower_bound(choices)` raised by what whole layers and a layer on every middle stage add (module
    docstring); with `links`, also by what the boundaries add to the period (module docstring: re-planning's)."""
    m = num_micro_batches(choices, ev.gbs)
    cur = ev.lightest(choices)
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

    def level(groups) -> float:         # the period at which the groups hold L layers, fractions of one allowed
        return (L + sum(c * f / q for q, f, _, c in groups)) / sum(c / q for q, _, _, c in groups)

    fastest = min(g[0] for g in groups)
    period0 = level(groups)
    sends = latency = ()
    if links:
        sends, latency, cross = ev.joins(cur, pm)[:3]
        groups = _held_groups(ev, cur, pm, sends, cross)
    # the least P at which whole layers fit: from the fractional level and every stage's least time, step up to
    # the next stage time at which some group takes one more layer each until they hold L (a few steps: at the
    # fractional level each stage lacks less than a layer)
    period = max(level(groups) if links else period0, max(f + lo * q for q, f, lo, _ in groups))
    while True:
        held, step = 0, math.inf
        for q, f, _, c in groups:
            k = math.floor((period - f) / q + 1e-9)
            held += c * k
            step = min(step, f + (k + 1) * q)
        if held >= L:
            break
        period = step
    # and the period is at least each boundary's occupancy of its link per micro-batch: an overlapped boundary's
    # (pipeline.closed_form_terms' period_link), a blocking one's holds its stages longer still
    period = max([period, *(x - lat for x, lat in zip(sends, latency))])
    raise_work = sum(c * (q - fastest) for q, _, lo, c in groups if lo)
    return ev.lower_bound(choices) + (m - 1) * max(0.0, period - period0) + raise_work


def _held_groups(ev: LayoutEvaluator, cur: tuple, pm: ModelSpec, sends: tuple, cross: tuple) -> list:
    """split_lower_bound's groups of stages with, in each stage's fixed time, the sends that hold it: a blocking
    boundary's send holds both stages it joins (pipeline.closed_form_terms), and a boundary that joins two
    stages of one cluster is blocking under either schedule (every one is under blocking boundaries and
    DeepSpeed's engine); a mesh's stages other than its first and last are held by two sends inside it."""
    every = ev.schedule == "blocking"
    p = len(sends) + 1

    def held(g: int) -> float:
        return sends[g] if 0 <= g < p - 1 and (every or not cross[g]) else 0.0

    out, at = [], 0
    for c in cur:
        prof = ev.profile(c, pm)
        per, k = prof.layer_fwd + prof.layer_bwd, c.num_stages
        for g in dict.fromkeys((at, at + k - 1)):
            f0 = b0 = 0.0
            if g in (0, p - 1):          # the embedding's and the head's stages: no layer needed
                f0, b0 = prof.times(0, g == 0, g == p - 1)
            out.append((per, f0 + b0 + held(g - 1) + held(g), 0 if g in (0, p - 1) else 1, 1))
        if k > 2:
            out.append((per, 2 * held(at), 1, k - 2))
        at += k
    return out
