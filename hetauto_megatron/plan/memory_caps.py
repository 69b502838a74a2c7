"""Memory caps of one stage configuration as a table (the search's leaf evaluator, plan/evaluator.py): the largest
layer count a stage can hold for every in-flight count and boundary-buffer count, from a few readings of the
memory model (cost/memory.py through memory_fit.stage_memory) instead of a search per count."""
from __future__ import annotations

from . import memory_fit


class CapTable:
    """Memory caps of one stage configuration for every in-flight count and boundary-buffer count, without
    re-running the memory model for each: a stage's memory is affine in its layer count (from one layer on), in
    its in-flight micro-batches and in the boundary tensors it holds, with a layers x in-flight term (the
    activations), so five readings of the memory model give it everywhere. A sixth reading, away from those,
    checks the shape; if the memory model ever stops having it, every count is asked of
    memory_fit.max_layers_in_memory directly. Three more, taken only when a stage cannot hold even one layer, give
    the zero-layer memory (affine in the in-flight count and the buffers) that tells a cap of 0 from -1."""

    def __init__(self, model, prof, first: bool, last: bool):
        self.model, self.prof, self.first, self.last = model, prof, first, last
        self.caps: dict[tuple, int] = {}          # (in-flight, buffers) -> cap, buffers > 0
        self.limit = prof.memory_cap
        self.row: list[int] = []                  # by in-flight count, no buffers (most asks); None: not yet

        need = self.reading = memory_fit.stage_memory_reader(model, prof, first, last)   # (n, f, buffers)
        self._zero = None               # zero layers: a + c * f + e * buffers (read when a cap is below 1)
        m11, m21, m12, m22 = need(1, 1), need(2, 1), need(1, 2), need(2, 2)
        d = (m22 - m12) - (m21 - m11)                         # layers x in-flight
        b = (m21 - m11) - d                                   # per layer
        c = (m12 - m11) - d                                   # per in-flight micro-batch
        a = m11 - b - c - d                                   # one layer and none in flight, less a layer
        self.coef = (a, b, c, d, need(1, 1, 1) - m11)         # ... and per boundary tensor
        probe = need(7, 5, 3)
        self.affine = abs(self._need(7, 5, 3) - probe) <= 1e-9 * max(probe, 1.0)

    @property
    def zero(self) -> tuple:
        if self._zero is None:
            need = self.reading
            z1, z2 = need(0, 1), need(0, 2)
            self._zero = (z1 - (z2 - z1), z2 - z1, need(0, 1, 1) - z1)
        return self._zero

    def _need(self, n: int, f: int, buf: int = 0) -> float:
        if n == 0:
            return self.zero[0] + self.zero[1] * f + self.zero[2] * buf
        a, b, c, d, e = self.coef
        return a + b * n + c * f + d * n * f + e * buf

    def in_flight_caps(self, to_end: int, m: int, k: int) -> list[int]:
        """The caps of k consecutive stages of this configuration, the first `to_end` stages from the pipeline's
        end: stage j holds min(to_end - j, m) micro-batches in flight (no boundary buffers). The row by
        in-flight count is filled only where asked (a mesh far from the pipeline's end never asks the small
        counts): the rows were most of the search's cap computations."""
        top = min(to_end, m)
        deep = min(max(to_end - m, 0), k)                                 # stages holding all m
        row = self._row(top)
        for f in range(to_end - k + 1, to_end - deep + 1):
            if row[f] is None:
                row[f] = self._fit(f, 0)
        if deep and row[top] is None:
            row[top] = self._fit(top, 0)
        return [row[top]] * deep + row[to_end - k + 1:to_end - deep + 1][::-1]

    def _row(self, f: int) -> list:
        """The row by in-flight count, long enough to hold count f."""
        row = self.row
        if len(row) <= f:
            row.extend([None] * (f + 1 - len(row)))
        return row

    def cap(self, f: int, buf: int = 0) -> int:
        if not buf:                     # no boundary buffers: the row in_flight_caps fills
            row = self._row(f)
            n = row[f]
            if n is None:
                n = row[f] = self._fit(f, 0)
            return n
        n = self.caps.get((f, buf))
        if n is None:
            n = self.caps[(f, buf)] = self._fit(f, buf)
        return n

    def _fit(self, f: int, buf: int) -> int:
        """The cap for f in flight and buf boundary tensors (uncached: `cap` and the rows remember it)."""
        if not self.affine:
            return memory_fit.max_layers_in_memory(self.model, self.prof, f, self.first, self.last, buf)
        # memory_fit.layers_that_fit written out on the affine need, where its step lands on the edge (so the same
        # caps as its bisection): the search asks it tens of thousands of times
        a, b, c, d, e = self.coef
        limit = self.limit
        n = 1
        if a + b * n + c * f + d * n * f + e * buf > limit:
            return -1 if self._need(0, f, buf) > limit else 0
        if b + d * f <= 0:
            return self.model.num_layers
        n = 1 + int((limit - (a + b * n + c * f + d * n * f + e * buf)) // (b + d * f))
        while n > 1 and a + b * n + c * f + d * n * f + e * buf > limit:
            n -= 1
        while a + b * (n + 1) + c * f + d * (n + 1) * f + e * buf <= limit:
            n += 1
        return n
