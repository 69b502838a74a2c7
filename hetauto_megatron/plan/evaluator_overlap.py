"""The leaf evaluator's pricing of overlapped boundaries: the depth of each cross-cluster boundary, chosen as
`layout_pricing.evaluate_layout(..., exact=False, schedule="overlapped")` chooses it (plan/overlap.py), priced from the
evaluator's cached terms.

Kept apart from plan/evaluator.py as its own concept: the memory caps a deeper warm-up leaves and the policy that
picks the depths. `OverlapPricing` is mixed into `LayoutEvaluator`; its methods read the evaluator's cached terms
(`profile`, `cap_table`, `joins`, `tail`, `time`) and `model`.
"""
from __future__ import annotations

import math
from itertools import chain
from operator import le

from ..spec.model import ModelSpec
from .overlap import Priced, choose_depths
from .pipeline_memory import side_buffers
from .split import split_layers
from .staged_pieces import boundary_staging


class OverlapPricing:
    """Overlapped boundaries of `LayoutEvaluator` (plan/evaluator.py)."""

    def _depth_caps(self, cur: tuple, pm: ModelSpec, cross: list, depths: list, m: int):
        """Memory caps per stage with overlapped boundaries of the given per-mesh depths (pipeline_memory.memory_terms'
        rule: the extra warm-up forwards in flight, the messages each side holds received ahead, `boundary_buffers`)
        -> (caps, depth per boundary), mesh by mesh. A mesh's stages all see the depths of the boundaries from its
        own last one on (A), so stage j of a mesh starting `to_end` stages from the end holds min(to_end - j + A, m)
        micro-batches: the blocking caps' pattern further from the end; only its end stages differ (buffers,
        embedding, head)."""
        p, n = len(cross) + 1, len(cur)
        depth = [0] * (p - 1)
        parts = []
        after = to_end = 0
        d_in = None                     # the depth of the boundary into the mesh after (None: blocking)
        for mi in range(n - 1, -1, -1):
            c = cur[mi]
            k = c.num_stages
            start = p - to_end - k
            to_end += k
            d_out = d_in
            d_in = depths[mi - 1] if mi and cross[start - 1] else None
            if d_out is not None:
                depth[start + k - 1] = d_out
                after += d_out
            prof = self.profile(c, pm)
            # the shares of a message its end stages receive in pieces (plan/staged_pieces.py; CPU only)
            grad_in = None if d_out is None else self._staged(prof, self.profile(cur[mi + 1], pm), pm)
            act_in = None if d_in is None else self._staged(self.profile(cur[mi - 1], pm), prof, pm)
            # a mesh's caps depend on these alone: remembered, as the search moves one decision at a time
            key = (c, pm.vocab_size, to_end, after, m, d_in, d_out, start == 0, to_end == k, grad_in, act_in)
            seg = self._depth_segments.get(key)
            if seg is None:
                seg = self.cap_table(pm, prof, False, False).in_flight_caps(to_end + after, m, k)
                for j in {0, k - 1}:
                    i = start + j
                    f = min(to_end - j + after, m)      # the stage's in-flight micro-batches
                    buf = (side_buffers(d_in, m, act_in, f) if j == 0 and d_in is not None else 0) + \
                          (side_buffers(d_out, m, grad_in) if j == k - 1 and d_out is not None else 0)
                    if buf or i == 0 or i == p - 1:
                        seg[j] = self.cap_table(pm, prof, i == 0, i == p - 1).cap(f, buf)
                seg = self._depth_segments[key] = tuple(seg)
            parts.append(seg)
        return list(chain.from_iterable(reversed(parts))), depth

    @staticmethod
    def _staged(before, after, pm: ModelSpec) -> tuple[float, float]:
        """staged_pieces.boundary_staging of two stage profiles joined by an overlapped boundary."""
        return boundary_staging(before, after, pm.seq_length, before.cluster.device.vendor == "cpu",
                                after.cluster.device.vendor == "cpu")

    def overlapped(self, cur: tuple, pm: ModelSpec, profs: list, per: list, fixed: list, caps: list, m: int):
        """evaluate_layout(..., exact=False, schedule="overlapped") of a layout whose blocking split fits
        (`caps`: its blocking caps): the same policy (plan/overlap.py) priced from the cached terms ->
        (seconds, per-mesh boundary depths or None)."""
        links, latency, cross, owners, overhead = self.joins(cur, pm)
        uplinks = self.uplinks(cur, pm)
        p, L = len(profs), self.model.num_layers
        lo = [0 if i in (0, p - 1) else 1 for i in range(p)]
        blocking = [not c for c in cross]

        def price(depths, reuse) -> Priced:
            if not any(d is not None for d in depths):
                t = self.time(cur, pm, profs, split_layers(per, fixed, lo, caps, L), m)
                return Priced(t, True, None, None, None, None, (t, None))
            dcaps, depth = self._depth_caps(cur, pm, cross, depths, m)
            if reuse is not None and all(map(le, reuse[0], dcaps)):
                layers, fwd, bwd, tail = reuse      # the same split (optimal under looser caps), the same tail
            else:
                layers = split_layers(per, fixed, lo, dcaps, L) if min(dcaps) >= 0 else None
                if layers is None:
                    return Priced(math.inf, False, None, None, None, None, None)
                fwd, bwd, tail = self.tail(cur, pm, profs, layers, links, blocking)
            closed = self.estimate(fwd, bwd, links, m, latency=latency, blocking=blocking, depth=depth,
                                   uplinks=uplinks)
            t = closed + tail + overhead
            return Priced(t, True, fwd, bwd, closed, (layers, fwd, bwd, tail), (t, tuple(depths)))

        return choose_depths(cross, owners, links, latency, m, len(cur), price, uplinks).result
