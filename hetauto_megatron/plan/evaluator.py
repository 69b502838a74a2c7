"""The search's leaf evaluator: the closed-form value of a layout, fast enough to price hundreds of thousands.

It computes what `simulate.evaluate_layout(..., exact=False)` computes (a test checks they agree), organised
for a search that prices many layouts differing in one decision (the overlapped boundary schedule, whose
depths are chosen per layout, is priced by `evaluate_layout` itself, after the same early rejection):

- every term is cached under the key it depends on, never under the layout: a mesh segment's per-layer times,
  fixed (embedding/head) times and memory caps under (cluster, TP, DP, micro-batch, recompute, its distance to
  the pipeline's end, its stage count, micro-batches, first/last); a stage's times and DP/optimizer tail under
  (mesh configuration, layers, first, last); a boundary's transfer under the two configurations and the link.
  A playout that changes one decision thus reuses every other mesh's work (incremental costing). The
  functions behind the caches (plan/costing.py) stay pure: the caches only remember their answers.
- recomputation is resolved as before (start with none, raise the mesh that runs out of memory), but a layout
  that cannot fit even with full recomputation everywhere it may be raised is rejected from its layer counts
  alone, without pricing its memory shortfall. Only when no layout fits at all does `closest_miss` price the
  shortfall of the rejected ones, to report how far the closest one misses (as the error message always has).
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import costing
from .pipeline import estimate_1f1b
from .plan import RECOMPUTE_MODES
from .simulate import MeshChoice, evaluate_layout, padded_model
from .split import split_layers

AUTO = "auto"          # recomputation still to be chosen by the evaluator


class LayoutEvaluator:
    """Closed-form iteration time of a layout, resolving AUTO recomputation. `resolve(choices)` ->
    (seconds or inf, layout with the recomputation chosen)."""

    def __init__(self, model: ModelSpec, inventory: Inventory, gbs: int, cost_model, schedule: str = "blocking"):
        self.model, self.inventory, self.gbs, self.cost = model, inventory, gbs, cost_model
        self.schedule = schedule
        self._padded: dict = {}
        self.cache: dict = {}           # layout as decided -> (time, resolved layout)
        self.rejected: list = []        # layouts that cannot fit, kept to report the closest miss if none fits
        self._profiles: dict = {}
        self._segments: dict = {}
        self._stages: dict = {}
        self._links: dict = {}
        self._caps: dict = {}
        self._levels: dict = {}
        self._clusters = {c.name: c for c in inventory.clusters}

    # ---- cached terms -------------------------------------------------------------------------------------
    def padded(self, cur: tuple) -> ModelSpec:
        """The model as it runs (its vocabulary padded for every mesh's TP), one object per set of TPs."""
        key = frozenset(c.tp for c in cur)
        pm = self._padded.get(key)
        if pm is None:
            pm = self._padded[key] = padded_model(self.model, cur)
        return pm

    def profile(self, c: MeshChoice, pm: ModelSpec):
        key = (pm.vocab_size, c.cluster, c.tp, c.dp, c.micro_batch_size, c.recompute)
        prof = self._profiles.get(key)
        if prof is None:
            prof = self._profiles[key] = costing.stage_profile(pm, self._clusters[c.cluster], c.tp, c.dp,
                                                               c.micro_batch_size, c.recompute, self.cost)
        return prof

    def segment(self, c: MeshChoice, pm: ModelSpec, to_end: int, m: int, first: bool, last: bool):
        """(profile, per-layer time, fixed time, memory cap) of each stage of mesh `c`, whose first stage is
        `to_end` stages from the pipeline's end (so stage j holds min(to_end - j, m) micro-batches in flight)."""
        key = (c, pm.vocab_size, to_end, m, first, last)
        seg = self._segments.get(key)
        if seg is None:
            prof = self.profile(c, pm)
            k = c.num_stages
            per = [prof.layer_fwd + prof.layer_bwd] * k
            fixed = [0.0] * k
            middle = self.cap_table(pm, prof, False, False)
            caps = [middle.cap(min(to_end - j, m)) for j in range(k)]
            for j, f, l in ((0, first, last and k == 1), (k - 1, first and k == 1, last)):
                if f or l:              # the embedding's and the head's stages
                    f0, b0 = prof.times(0, f, l)
                    fixed[j] = f0 + b0
                    caps[j] = self.cap_table(pm, prof, f, l).cap(min(to_end - j, m))
            seg = self._segments[key] = ([prof] * k, per, fixed, caps)
        return seg

    def cap_table(self, pm: ModelSpec, prof, first: bool, last: bool) -> "_CapTable":
        """Memory caps (costing.max_layers_in_memory) of a stage configuration (device, TP, DP, micro-batch,
        recomputation, settings: the profile) as first/last stage, for every in-flight count."""
        key = (prof, first, last)
        table = self._caps.get(key)
        if table is None:
            table = self._caps[key] = _CapTable(pm, prof, first, last)
        return table

    def boundary(self, a: MeshChoice, b: MeshChoice, pm: ModelSpec, inside: bool, samples: int):
        """(transfer time, latency part) of one micro-batch crossing from mesh a to mesh b (or inside a)."""
        key = (a, b, pm.vocab_size, inside, samples)
        out = self._links.get(key)
        if out is None:
            if inside:
                cl = self._clusters[a.cluster]
                link = cl.intra_node if a.tp * a.dp * a.num_stages <= cl.devices_per_node else cl.inter_node
            else:
                link = self.inventory.link(a.cluster, b.cluster)
            t = costing.boundary_transfer_time(pm, self.profile(a, pm), self.profile(b, pm), link, inside, samples)
            out = self._links[key] = (t, min(link.latency_s, t))
        return out

    def level(self, c: MeshChoice, recompute: str) -> MeshChoice:
        """`c` with another recomputation (remembered: layouts are rebuilt mesh by mesh many times)."""
        key = (c, recompute)
        out = self._levels.get(key)
        if out is None:
            out = self._levels[key] = replace(c, recompute=recompute)
        return out

    def _stage_lists(self, cur: tuple, m: int):
        pm = self.padded(cur)
        p = sum(c.num_stages for c in cur)
        profs, per, fixed, caps = [], [], [], []
        to_end = p
        for mi, c in enumerate(cur):
            sp, sper, sf, sc = self.segment(c, pm, to_end, m, mi == 0, mi == len(cur) - 1)
            profs += sp
            per += sper
            fixed += sf
            caps += sc
            to_end -= c.num_stages
        return pm, p, profs, per, fixed, caps

    def _fits(self, caps: list[int], p: int) -> bool:
        """Whether some split holds every layer: what `split_layers` checks before it splits."""
        return min(caps) >= 0 and (p < 3 or min(caps[1:-1]) >= 1) and sum(caps) >= self.model.num_layers

    def time(self, cur: tuple, pm: ModelSpec, profs: list, layers: list[int], m: int) -> float:
        """evaluate_layout's closed form for blocking boundaries, from the cached terms."""
        p = len(profs)
        fwd, bwd, links, latency = [], [], [], []
        for i, prof in enumerate(profs):
            f, b = prof.times(layers[i], i == 0, i == p - 1)
            fwd.append(f)
            bwd.append(b)
        samples = cur[0].dp * cur[0].micro_batch_size
        for mi, c in enumerate(cur):
            if c.num_stages > 1:
                x = self.boundary(c, c, pm, True, samples)
                links += [x[0]] * (c.num_stages - 1)
                latency += [x[1]] * (c.num_stages - 1)
            if mi < len(cur) - 1:
                x = self.boundary(c, cur[mi + 1], pm, False, samples)
                links.append(x[0])
                latency.append(x[1])
        tail = costing.iteration_tail(pm, self.inventory, cur, profs, layers, fwd, bwd, links)["tail_s"]
        overhead = max(self.cost.iteration_overhead_s(prof.cluster.device) for prof in profs)
        return estimate_1f1b(fwd, bwd, links, m, latency=latency) + tail + overhead

    def resolve(self, choices: tuple) -> tuple[float, tuple]:
        out = self.cache.get(choices)
        if out is not None:
            return out
        auto = [c.recompute == AUTO for c in choices]
        if not self._may_fit(choices, auto):
            self.rejected.append(tuple(replace(c, recompute="full") if a else c for c, a in zip(choices, auto)))
            out = self.cache[choices] = (math.inf, self.rejected[-1])
            return out
        cur = tuple(self.level(c, "none") if a else c for c, a in zip(choices, auto))
        m = self.gbs // (choices[0].dp * choices[0].micro_batch_size)
        while True:
            pm, p, profs, per, fixed, caps = self._stage_lists(cur, m)
            if self._fits(caps, p):
                if self.schedule == "blocking":
                    lo = [0 if i in (0, p - 1) else 1 for i in range(p)]
                    layers = split_layers(per, fixed, lo, caps, self.model.num_layers)
                    out = self.cache[choices] = (self.time(cur, pm, profs, layers, m), cur)
                    return out
                # overlapped boundaries: evaluate_layout chooses their depths (and may need more memory)
                res = evaluate_layout(self.model, self.inventory, list(cur), self.gbs, self.cost, exact=False,
                                      schedule=self.schedule)
                if res.stage_layers is not None:
                    out = self.cache[choices] = (res.iteration_time_s, cur)
                    return out
                raise_at = self._next_raise(cur, auto, res.short_mesh)
            else:
                raise_at = self._short_mesh(cur, auto, per, fixed, caps)
            if raise_at is None:
                self.rejected.append(cur)
                out = self.cache[choices] = (math.inf, cur)
                return out
            nxt = RECOMPUTE_MODES[RECOMPUTE_MODES.index(cur[raise_at].recompute) + 1]
            cur = cur[:raise_at] + (self.level(cur[raise_at], nxt),) + cur[raise_at + 1:]

    def _may_fit(self, choices: tuple, auto: list) -> bool:
        """Early rejection from layer counts alone: could the layers fit if every AUTO stage held as many as its
        most generous recomputation level allows? If not, no choice of levels fits and nothing is priced.
        Full recomputation is nearly always the most generous, so it is tried alone first. (Blocking
        boundaries hold the least memory, so this is a necessary condition for either schedule.)"""
        m = self.gbs // (choices[0].dp * choices[0].micro_batch_size)
        full = tuple(self.level(c, "full") if a else c for c, a in zip(choices, auto))
        pm, p, _, _, _, caps = self._stage_lists(full, m)
        if self._fits(caps, p):
            return True
        caps, to_end = [], p
        for mi, c in enumerate(choices):
            opts = [self.level(c, rc) for rc in RECOMPUTE_MODES] if auto[mi] else [c]
            segs = [self.segment(o, pm, to_end, m, mi == 0, mi == len(choices) - 1)[3] for o in opts]
            caps += [max(x) for x in zip(*segs)]
            to_end -= c.num_stages
        return self._fits(caps, p)

    def _short_mesh(self, cur: tuple, auto: list, per, fixed, caps) -> int | None:
        """The mesh whose recomputation to raise: the one with the stage that overshoots its cap by the most
        layers when layers are spread by speed alone (else the first other one still below full)."""
        p = len(per)
        lo = [0 if i in (0, p - 1) else 1 for i in range(p)]
        rough = split_layers(per, fixed, lo, [self.model.num_layers] * p, self.model.num_layers)
        owners = [mi for mi, c in enumerate(cur) for _ in range(c.num_stages)]
        worst, short = -math.inf, 0
        for i in range(p):
            over = rough[i] - caps[i]
            if over > worst:
                worst, short = over, owners[i]
        return self._next_raise(cur, auto, short)

    @staticmethod
    def _next_raise(cur: tuple, auto: list, short: int) -> int | None:
        order = [short] + [i for i in range(len(cur)) if i != short]
        return next((i for i in order if auto[i] and cur[i].recompute != "full"), None)

    def exact(self, choices: tuple):
        """The event simulation of a resolved layout (what the search's final ranking uses)."""
        return evaluate_layout(self.model, self.inventory, list(choices), self.gbs, self.cost, exact=True,
                               schedule=self.schedule)

    def closest_miss(self) -> tuple[float, str] | None:
        """(GiB short, where) of the rejected layout that misses by the least: priced only when nothing fits."""
        best = None
        for cur in dict.fromkeys(self.rejected):
            res = evaluate_layout(self.model, self.inventory, list(cur), self.gbs, self.cost, exact=False,
                                  schedule=self.schedule)
            if res.stage_layers is None and (best is None or res.shortfall_gib < best[0]):
                best = (res.shortfall_gib, res.short_device)
        return best


class _CapTable:
    """Memory caps of one stage configuration for every in-flight count, without re-running the memory model
    for each count: a stage's memory is affine in its layer count (from one layer on) and in its in-flight
    micro-batches, with a layers x in-flight term (the activations), so six readings of the memory model give
    it everywhere. A seventh reading, away from those six, checks the shape; if the memory model ever stops
    having it, every count is asked of costing.max_layers_in_memory directly."""

    def __init__(self, model, prof, first: bool, last: bool):
        self.model, self.prof, self.first, self.last = model, prof, first, last
        self.caps: dict[int, int] = {}

        def need(n, f):
            return costing.stage_memory(model, prof, n, f, first, last)["total"]

        z1, z2 = need(0, 1), need(0, 2)
        self.zero = (z1 - (z2 - z1), z2 - z1)                  # zero layers: a + c * f
        m11, m21, m12, m22 = need(1, 1), need(2, 1), need(1, 2), need(2, 2)
        d = (m22 - m12) - (m21 - m11)                         # layers x in-flight
        b = (m21 - m11) - d                                   # per layer
        c = (m12 - m11) - d                                   # per in-flight micro-batch
        a = m11 - b - c - d                                   # one layer and none in flight, less a layer
        self.coef = (a, b, c, d)
        probe = need(7, 5)
        self.affine = abs(self._need(7, 5) - probe) <= 1e-9 * max(probe, 1.0)

    def _need(self, n: int, f: int) -> float:
        if n == 0:
            return self.zero[0] + self.zero[1] * f
        a, b, c, d = self.coef
        return a + b * n + c * f + d * n * f

    def cap(self, f: int) -> int:
        n = self.caps.get(f)
        if n is not None:
            return n
        if not self.affine:
            n = costing.max_layers_in_memory(self.model, self.prof, f, self.first, self.last)
        else:
            limit = self.prof.memory_cap
            if self._need(0, f) > limit:
                n = -1
            elif self._need(1, f) > limit:
                n = 0
            else:
                a, b, c, d = self.coef
                per = b + d * f
                if per <= 0:
                    n = self.model.num_layers
                else:
                    n = max(1, int((limit - a - c * f) // per))
                    while n > 1 and self._need(n, f) > limit:
                        n -= 1
                    while self._need(n + 1, f) <= limit:
                        n += 1
        self.caps[f] = n
        return n
