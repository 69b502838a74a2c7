"""Memory caps of one stage configuration as a table (the search's leaf evaluator, plan/evaluator.py): the largest
layer count a stage can hold for every in-flight count and boundary-buffer count, from a few readings of the
memory model (cost/memory.py through memory_fit.stage_memory) instead of a search per count."""
from __future__ import annotations

from . import memory_fit


class CapTable:
    """Memory caps of one stage configuration for every in-flight count and boundary-buffer count, without
    re-running the memory model for each. A stage's peak is the largest of a few candidates (cost/memory.py
    `_reading`: the state with the activations, the state at DeepSpeed's gradient reduction, the state at the
    optimizer's step, and a memory job's), the reduction's the smallest of two pieces; each piece, with the runtime
    overhead it would bring as the peak, is affine in the layer count (from one layer on), in the in-flight
    micro-batches and in the boundary tensors the stage holds, with a layers x in-flight term (the activations). So
    five readings of the candidates (memory_fit.stage_memory_candidates) give each piece's line everywhere, and the
    cap is the smallest over the candidates of the largest over their pieces of the count its line allows: one
    line fitted through the largest candidate misses the kinks between them (a stage of llama2-7b under DeepSpeed
    fp16 on an H800 was allowed 23 layers, which need 98.4 GiB of its 80). A sixth reading, away from those,
    checks every line; if the memory model ever stops having that shape, every count is asked of
    memory_fit.max_layers_in_memory directly. Where not even one layer fits, the memory of zero layers, read,
    tells a cap of 0 from -1."""

    def __init__(self, model, prof, first: bool, last: bool):
        self.model, self.prof, self.first, self.last = model, prof, first, last
        self.caps: dict[tuple, int] = {}          # (in-flight, buffers) -> cap, buffers > 0
        self.limit = prof.memory_cap
        self.row: list[int] = []                  # by in-flight count, no buffers (most asks); None: not yet
        self._total = None                        # the total's reader, for zero layers (read when a cap is below 1)

        need = memory_fit.stage_memory_candidates(model, prof, first, last)   # (n, f, buffers) -> candidates
        m11, m21, m12, m22, m111, probe = (need(1, 1), need(2, 1), need(1, 2), need(2, 2), need(1, 1, 1),
                                           need(7, 5, 3))
        lines, affine = [], True
        for i, probes in enumerate(probe):
            pieces = []
            for j, at in enumerate(probes):
                p11, p21, p12, p22 = m11[i][j], m21[i][j], m12[i][j], m22[i][j]
                d = (p22 - p12) - (p21 - p11)                     # layers x in-flight
                b = (p21 - p11) - d                               # per layer
                c = (p12 - p11) - d                               # per in-flight micro-batch
                a = p11 - b - c - d                               # one layer and none in flight, less a layer
                line = (a, b, c, d, m111[i][j] - p11)             # ... and per boundary tensor
                pieces.append(line)
                affine = affine and abs(self._line(line, 7, 5, 3) - at) <= 1e-9 * max(at, 1.0)
            lines.append(tuple(pieces))
        self.lines, self.affine = tuple(lines), affine

    @staticmethod
    def _line(line: tuple, n: int, f: int, buf: int = 0) -> float:
        a, b, c, d, e = line
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
        n = None                        # None: no candidate's line grows with the layers
        for pieces in self.lines:       # the peak must fit as every candidate, as any one of its pieces
            caps = [self._line_cap(line, f, buf) for line in pieces]
            if None in caps:            # a piece that never outgrows the memory: neither does the candidate
                continue
            if n is None or max(caps) < n:
                n = max(caps)
            if n is not None and n < 1:
                break
        if n is None:
            return self.model.num_layers
        if n < 1:
            if self._total is None:
                self._total = memory_fit.stage_memory_reader(self.model, self.prof, self.first, self.last)
            return -1 if self._total(0, f, buf) > self.limit else 0
        return min(n, memory_fit.cap_ceiling(self.model.num_layers))      # as memory_fit.layers_that_fit stops

    def _line_cap(self, line: tuple, f: int, buf: int):
        """The largest n >= 1 one line allows, 0 if not one layer, None if it does not grow with the layers:
        memory_fit.layers_that_fit written out on the line, where its step lands on the edge (so the same caps as
        its bisection): the search asks it tens of thousands of times."""
        a, b, c, d, e = line
        limit = self.limit
        if a + b + c * f + d * f + e * buf > limit:
            return 0
        if b + d * f <= 0:
            return None
        n = 1 + int((limit - (a + b + c * f + d * f + e * buf)) // (b + d * f))
        while n > 1 and a + b * n + c * f + d * n * f + e * buf > limit:
            n -= 1
        while a + b * (n + 1) + c * f + d * (n + 1) * f + e * buf <= limit:
            n += 1
        return n
