"""The search's leaf evaluator: the closed-form value of a layout, fast enough to price hundreds of thousands.

It computes what `layout_pricing.evaluate_layout(..., exact=False)` computes (a test checks they agree to 1e-12 with
either boundary schedule), organised for a search that prices many layouts differing in one decision:

- every term is cached under the key it depends on, never under the layout: a mesh segment's per-layer times,
  fixed (embedding/head) times and memory caps under (cluster, TP, DP, micro-batch, recompute, its distance to
  the pipeline's end, its stage count, micro-batches, first/last); a stage's times and DP/optimizer tail under
  (mesh configuration, layers, first, last); a boundary's transfer under the two configurations and the link.
  A playout that changes one decision thus reuses every other mesh's work (incremental costing). The
  functions behind the caches (plan/costing.py, memory_fit.py, link_costs.py, tail_costs.py) stay pure: the
  caches only remember their answers.
- overlapped boundaries (plan/evaluator_overlap.py) follow `evaluate_layout`'s choice step for step (depth 0;
  blocking if even its boundary buffers do not fit; the round-trip depth, halved until it fits, when the links cost
  time at depth 0), from the same cached terms: memory caps with the extra in-flight micro-batches and boundary
  buffers come from the same affine tables, and the iteration tail is cached under the layer split (a deeper warm-up
  that keeps the split keeps the tail).
- a layout's lower bound, from the cached terms alone, lets the search skip pricing it (plan/leaf_bound.py).
- recomputation is resolved as before (start with none, raise the mesh that runs out of memory), but a layout
  that cannot fit even with full recomputation everywhere it may be raised is rejected from its layer counts
  alone, without pricing its memory shortfall. Only when no layout fits at all does `closest_miss` price the
  shortfall of the rejected ones, to report how far the closest one misses (as the error message always has).
"""
from __future__ import annotations

import copy
import math
from dataclasses import replace
from functools import lru_cache

from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import costing, link_costs, tail_costs
from .deepspeed_schedule import estimate_deepspeed
from .evaluator_overlap import OverlapPricing
from .layout_pricing import evaluate_layout
from .leaf_bound import LeafBound
from .memory_caps import CapTable
from .pipeline import estimate_1f1b
from .plan import RECOMPUTE_MODES
from .engines import DEFAULT_ENGINE, ENGINES, selective_runs
from .settings import settings_as_run
from .shapes import uniform_topology_gaps
from .shared_uplinks import contended
from .simulate import MeshChoice, boundary_transfer, deepspeed_passes, num_micro_batches, padded_model
from .split import split_layers

AUTO = "auto"          # recomputation still to be chosen by the evaluator


@lru_cache(maxsize=None)
def _all_blocking(n: int) -> tuple:
    """(True,) * n, built once per boundary count: the leaf evaluation's closed form asks it for every layout."""
    return (True,) * n


class LayoutEvaluator(OverlapPricing, LeafBound):
    """Closed-form iteration time of a layout, resolving AUTO recomputation. `resolve(choices)` ->
    (seconds or inf, layout with the recomputation chosen)."""

    def __init__(self, model: ModelSpec, inventory: Inventory, gbs: int, cost_model, schedule: str = "blocking",
                 engine: str = DEFAULT_ENGINE, share_uplinks: bool = True, estimate=estimate_1f1b):
        self.model, self.inventory, self.gbs, self.cost = model, inventory, gbs, cost_model
        # Megatron's 1F1B closed form (pipeline.estimate_1f1b; rescreen.fill_shortlist ranks by
        # pipeline_fill.estimate_fill_drain); DeepSpeed's schedule is screened by estimate_1f1b on its link times
        self.estimate = estimate
        # whether a pipeline's boundaries through one cluster share its uplink (plan/shared_uplinks.py); without,
        # the optimistic screen rescreen.uplink_shortlist ranks the layouts through a contended uplink by
        self.share_uplinks = share_uplinks
        # The pipeline engine planned for (engines.py ENGINES): DeepSpeed's runs every boundary blocking, its
        # TrainSchedule (screened by `deepspeed_links`), the settings as it runs them, and uniform layouts only.
        self.engine = engine
        self.selective = selective_runs(model, engine)
        self.schedule = "blocking" if ENGINES[engine].blocking_boundaries else schedule
        self._padded: dict = {}
        self.cache: dict = {}           # layout as decided -> (time, resolved layout)
        self.rejected: list = []        # layouts that cannot fit, kept to report the closest miss if none fits
        self._profiles: dict = {}
        self._segments: dict = {}
        self._depth_segments: dict = {}     # a mesh's caps under overlapped boundaries (evaluator_overlap.py)
        self._stages: dict = {}
        self._links: dict = {}
        self._caps: dict = {}
        self._levels: dict = {}
        self._joins: dict = {}
        self._uplinks: dict = {}
        self._mesh_bounds: dict = {}    # a mesh's share of lower_bound's sums (leaf_bound.py)
        self._tails: dict = {}
        self._stage_terms: dict = {}    # (profile, layers, first, last) -> DP collectives, optimizer step
        self._syncs: dict = {}
        self._rings: dict = {}          # (cluster, ranks) per mesh -> the global-norm all-reduce
        self._clusters = {c.name: c for c in inventory.clusters}
        # no cluster with an uplink: pipeline_uplinks would build every stage's profile list to say None, once per
        # layout (7 % of a 20-cluster chain's search)
        self._any_uplink = any(c.uplink_gbps for c in inventory.clusters)

    def variant(self, **changes) -> "LayoutEvaluator":
        """The same evaluator but for `changes` (`share_uplinks`, `estimate`): it shares every cached term (none
        depends on them) and prices layouts anew (`cache`, `rejected` its own)."""
        other = copy.copy(self)
        for name, value in changes.items():
            if name not in ("share_uplinks", "estimate"):
                raise TypeError(f"LayoutEvaluator.variant: unknown change {name!r}")
            setattr(other, name, value)
        other.cache, other.rejected = {}, []
        return other

    # ---- cached terms -------------------------------------------------------------------------------------
    def padded(self, cur: tuple) -> ModelSpec:
        """The model as it runs (its vocabulary padded for every mesh's TP), one object per set of TPs."""
        key = frozenset([c.tp for c in cur])
        pm = self._padded.get(key)
        if pm is None:
            pm = self._padded[key] = padded_model(self.model, cur)
        return pm

    def profile(self, c: MeshChoice, pm: ModelSpec):
        key = (pm.vocab_size, c.cluster, c.tp, c.dp, c.micro_batch_size, c.recompute)
        prof = self._profiles.get(key)
        if prof is None:
            prof = self._profiles[key] = costing.stage_profile(pm, self._clusters[c.cluster], c.tp, c.dp,
                                                               c.micro_batch_size, c.recompute, self.cost,
                                                               self.settings(c))
        return prof

    def settings(self, c: MeshChoice):
        """The mesh's settings as the engine runs them (settings.py `settings_as_run`)."""
        return settings_as_run(c.tp, c.setting_overrides, self.engine, self._clusters[c.cluster].device.precision)

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
            caps = self.cap_table(pm, prof, False, False).in_flight_caps(to_end, m, k)
            for j, f, l in ((0, first, last and k == 1), (k - 1, first and k == 1, last)):
                if f or l:              # the embedding's and the head's stages
                    f0, b0 = prof.times(0, f, l)
                    fixed[j] = f0 + b0
                    caps[j] = self.cap_table(pm, prof, f, l).cap(min(to_end - j, m))
            # tuples: once they hold only numbers the garbage collector stops scanning them (caches grow large)
            seg = self._segments[key] = ((prof,) * k, tuple(per), tuple(fixed), tuple(caps))
        return seg

    def cap_table(self, pm: ModelSpec, prof, first: bool, last: bool) -> "CapTable":
        """Memory caps (memory_fit.max_layers_in_memory) of a stage configuration (device, TP, DP, micro-batch,
        recomputation, settings: the profile) as first/last stage, for every in-flight count."""
        key = (prof, first, last)
        table = self._caps.get(key)
        if table is None:               # profiles that differ only in speed share one: memory is what counts
            dev = prof.cluster.device
            mkey = (pm.vocab_size, prof.tp, prof.dp, prof.micro_batch_size, prof.recompute, prof.settings,
                    dev.vendor, dev.dtype_bytes, prof.cluster.overhead, prof.memory_cap, prof.memory_job, first,
                    last)               # (memory_fit.stage_memory's inputs)
            table = self._caps[key] = self._caps.get(mkey) or self._caps.setdefault(mkey, CapTable(pm, prof, first,
                                                                                                      last))
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
            t = boundary_transfer(self.engine)(pm, self.profile(a, pm), self.profile(b, pm), link, inside, samples)
            out = self._links[key] = (t, min(link.latency_s, t))
        return out

    def level(self, c: MeshChoice, recompute: str) -> MeshChoice:
        """`c` with another recomputation (remembered: layouts are rebuilt mesh by mesh many times)."""
        key = (c, recompute)
        out = self._levels.get(key)
        if out is None:
            out = self._levels[key] = replace(c, recompute=recompute)
        return out

    def lightest(self, choices: tuple) -> tuple:
        """`choices` with every AUTO recomputation at its lightest level (none): the fastest, what bounds use."""
        return tuple([self.level(c, "none") if c.recompute == AUTO else c for c in choices])

    def _stage_lists(self, cur: tuple, m: int):
        pm = self.padded(cur)
        p = sum([c.num_stages for c in cur])
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

    def joins(self, cur: tuple, pm: ModelSpec):
        """(links, latency, cross, owners, overhead) of a layout's stage list: per boundary its transfer time, the
        latency part, whether it joins two clusters; per stage its mesh; the iteration's fixed overhead."""
        out = self._joins.get(cur)
        if out is None:
            links, latency, cross, owners = [], [], [], []
            samples = cur[0].dp * cur[0].micro_batch_size
            for mi, c in enumerate(cur):
                owners += [mi] * c.num_stages
                if c.num_stages > 1:
                    x = self.boundary(c, c, pm, True, samples)
                    links += [x[0]] * (c.num_stages - 1)
                    latency += [x[1]] * (c.num_stages - 1)
                    cross += [False] * (c.num_stages - 1)
                if mi < len(cur) - 1:
                    x = self.boundary(c, cur[mi + 1], pm, False, samples)
                    links.append(x[0])
                    latency.append(x[1])
                    cross.append(c.cluster != cur[mi + 1].cluster)
            overhead = max(self.cost.iteration_overhead_s(self._clusters[c.cluster].device) for c in cur)
            out = self._joins[cur] = (tuple(links), tuple(latency), tuple(cross), tuple(owners), overhead)
        return out

    def uplinks(self, cur: tuple, pm: ModelSpec):
        """The shared uplinks of a layout's boundaries (link_costs.pipeline_uplinks), once per layout."""
        if not self.share_uplinks or not self._any_uplink:
            return None
        if cur not in self._uplinks:
            profs = [self.profile(c, pm) for c in cur for _ in range(c.num_stages)]
            self._uplinks[cur] = link_costs.pipeline_uplinks(pm, self.inventory, profs, cur[0].samples_per_step)
        return self._uplinks[cur]

    def crosses_contended_uplink(self, cur: tuple) -> bool:
        """Whether a resolved layout's pipeline runs through an uplink its two boundaries can need more than all
        of (shared_uplinks.contended)."""
        pm = self.padded(cur)
        ups = self.uplinks(cur, pm)
        if not ups:
            return False
        links, latency = self.joins(cur, pm)[:2]
        return contended(ups, links, latency) is not None

    def sync(self, cur: tuple, pm: ModelSpec) -> float:
        """The tail's job-wide terms (tail_costs.iteration_sync_time): they depend on the layout only, so once per
        layout rather than once per layer split or bound; its global-norm ring once per (cluster, ranks) of each
        mesh, all it depends on (layouts that differ in recomputation or micro-batch share it)."""
        out = self._syncs.get(cur)
        if out is None:
            ring = tuple([(c.cluster, c.tp * c.dp * c.num_stages) for c in cur])
            norm = self._rings.get(ring)
            if norm is None:
                norm = self._rings[ring] = tail_costs.grad_norm_time(self.inventory, cur)
            out = self._syncs[cur] = tail_costs.iteration_sync_time(
                pm, self.inventory, cur, [self.profile(cur[0], pm), self.profile(cur[-1], pm)], norm, self.engine)
        return out

    def tail(self, cur: tuple, pm: ModelSpec, profs: list, layers: list[int], links: list, blocking):
        """(fwd, bwd, iteration tail) of a layer split: the tail depends on the split and on which boundaries block
        (a later stage's reduction starts once its last gradient send returned: tail_costs.tail_windows), not on
        the depths."""
        key = (cur, tuple(layers), tuple(blocking))
        out = self._tails.get(key)
        if out is None:
            # prof.times of every stage: n x the per-layer time in the middle (what times adds there is 0.0, which
            # changes no float), the embedding and the head at the ends
            fwd = [n * prof.layer_fwd for n, prof in zip(layers, profs)]
            bwd = [n * prof.layer_bwd for n, prof in zip(layers, profs)]
            p = len(profs)
            fwd[0], bwd[0] = profs[0].times(layers[0], True, p == 1)
            if p > 1:
                fwd[-1], bwd[-1] = profs[-1].times(layers[-1], False, True)
            t = tail_costs.tail_seconds(pm, profs, layers, fwd, bwd, links, blocking, self.sync(cur, pm),
                                        self._stage_terms)
            out = self._tails[key] = (tuple(fwd), tuple(bwd), t)
        return out

    def time(self, cur: tuple, pm: ModelSpec, profs: list, layers: list[int], m: int) -> float:
        """evaluate_layout's closed form for blocking boundaries, from the cached terms."""
        links, latency, _, _, overhead = self.joins(cur, pm)
        fwd, bwd, tail = self.tail(cur, pm, profs, layers, links, _all_blocking(len(links)))
        if self.engine == "deepspeed":     # its passes run the all-gathers of its TP-partitioned transfers
            fwd, bwd = deepspeed_passes(pm, profs, fwd, bwd)
            return estimate_deepspeed(fwd, bwd, links, m, self.uplinks(cur, pm)) + tail + overhead
        return self.estimate(fwd, bwd, links, m, latency=latency, uplinks=self.uplinks(cur, pm)) + tail + overhead

    def resolve(self, choices: tuple) -> tuple[float, tuple]:
        out = self.cache.get(choices)
        if out is not None:
            return out
        if self.engine == "deepspeed" and not self.uniform(choices):     # a layout DeepSpeed's engine cannot run
            out = self.cache[choices] = (math.inf, choices)
            return out
        auto = [c.recompute == AUTO for c in choices]
        cur = self.lightest(choices)
        m = num_micro_batches(choices, self.gbs)
        lists = self._stage_lists(cur, m)
        # (when the lightest levels fit, so would the most generous: the early rejection is only asked otherwise)
        if not self._fits(lists[5], lists[1]) and not self._may_fit(choices, auto):
            self.rejected.append(tuple(replace(c, recompute="full") if a else c for c, a in zip(choices, auto)))
            out = self.cache[choices] = (math.inf, self.rejected[-1])
            return out
        while True:
            pm, p, profs, per, fixed, caps = lists
            if self._fits(caps, p):
                if self.schedule == "blocking":
                    lo = [0 if i in (0, p - 1) else 1 for i in range(p)]
                    layers = split_layers(per, fixed, lo, caps, self.model.num_layers)
                    out = self.cache[choices] = (self.time(cur, pm, profs, layers, m), cur)
                    return out
                # overlapped boundaries: their depths are chosen here (blocking fits, so some choice does)
                out = self.cache[choices] = (self.overlapped(cur, pm, profs, per, fixed, caps, m)[0], cur)
                return out
            raise_at = self._short_mesh(cur, auto, per, fixed, caps)
            if raise_at is None:
                self.rejected.append(cur)
                out = self.cache[choices] = (math.inf, cur)
                return out
            nxt = RECOMPUTE_MODES[RECOMPUTE_MODES.index(cur[raise_at].recompute) + 1]
            if nxt == "selective" and (self.engine == "deepspeed" or not self.selective):
                nxt = "full"        # DeepSpeed checkpoints whole layers only; selective_runs says the rest
            cur = cur[:raise_at] + (self.level(cur[raise_at], nxt),) + cur[raise_at + 1:]
            lists = self._stage_lists(cur, m)

    def uniform(self, choices: tuple) -> bool:
        """Whether one uniform topology runs the layout (shapes.uniform_topology_gaps: what emit/deepspeed.py lists
        as DeepSpeed's gaps): equal TP, DP and micro-batch, one vendor, no selective recomputation."""
        return not uniform_topology_gaps(choices, [self._clusters[c.cluster].device.vendor for c in choices])

    def _may_fit(self, choices: tuple, auto: list) -> bool:
        """Early rejection from layer counts alone: could the layers fit if every AUTO stage held as many as its
        most generous recomputation level allows? If not, no choice of levels fits and nothing is priced.
        Full recomputation is nearly always the most generous, so it is tried alone first. (Blocking
        boundaries hold the least memory, so this is a necessary condition for either schedule.)"""
        m = num_micro_batches(choices, self.gbs)
        full = tuple([self.level(c, "full") if a else c for c, a in zip(choices, auto)])
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
                               schedule=self.schedule, engine=self.engine)

    def closest_miss(self) -> tuple[float, str] | None:
        """(GiB short, where) of the rejected layout that misses by the least: priced only when nothing fits."""
        best = None
        for cur in dict.fromkeys(self.rejected):
            res = evaluate_layout(self.model, self.inventory, list(cur), self.gbs, self.cost, exact=False,
                                  schedule=self.schedule, engine=self.engine)
            if res.stage_layers is None and (best is None or res.shortfall_gib < best[0]):
                best = (res.shortfall_gib, res.short_device)
        return best
