"""Which elements of a parameter's gradient move between which ranks when several meshes hold the parameter.

Pure (no torch, no processes): the plan for `replica_sync.py`.

A parameter is seen as a 2-D table (rows, cols): a matrix as itself, a vector of n elements as (n, 1). Each
rank holds a local tensor, its TP shard, and a `Layout` says where the local tensor's blocks sit in the whole
table: TP along dim 0 is a block of rows, TP along dim 1 a block of columns, SwiGLU's fused fc1 two blocks of
rows (the rank's gate rows and its up rows), a parameter without TP the whole table. After the mesh's own DP
reduction a rank holds the reduced gradient of one interval of its local tensor, flattened row-major: with
Megatron's distributed optimizer the part its DP rank owns after the reduce-scatter (`gradients.owned_interval`),
with the plain optimizer all of it. Mapped into the whole table that interval is a few rectangles: the rank's
`region`.

Every holder (one stage of one mesh) has "sources": one rank per element whose reduced gradient counts (its
regions partition the table: DP rank 0 only with the plain optimizer, TP rank 0 only for a parameter that TP
duplicates). The other ranks of the holder keep copies; they get the sum from their source inside the mesh
(replica_sync.py broadcasts it).

A parameter with exactly two holders (the tied table of one pipeline, every parameter of two pipelines) is
exchanged in one phase, "pair": each source of either holder sends each element of its region to the other
holder's source of that element (the rectangles where the two regions meet), both directions at once, and both
ends compute the same sum w0 x g0 + w1 x g1 from the same two operands (replica_sync.py says how they get the
same bits). Every element crosses once each way: 2 x its elements, in one phase.

With three or more holders the exchange is a gather to a root holder and a scatter back, the root taking turns:
the table, flattened row-major, is cut into H equal runs (`root_chunks`) and holder j (in plan order) is the root
of run j, so every holder sends and receives about the same bytes (a reduce-scatter and an all-gather among the
holders) instead of one root's links carrying everything:

- gather: every source of every other holder sends each element of its region to the source of that element in
  the element's root, once;
- the root source sums weight x gradient of every holder, its own term first, then the others in holder order
  (the result is the same bits for every holder, because only the root computes it);
- scatter: every root source sends the sum of each element it is root of to the other holders' sources of it.

So a parameter with H >= 3 holders moves 2 (H - 1) times its elements per iteration between holders, once to
and once from their roots, in two phases one after the other; each holder's links carry 2 (H - 1) / H of the
table each way, where a single root's carried H - 1 times it. Where one pair of holders is joined by a far
slower link than the rest, the runs follow uneven integer weights instead (run j in proportion to weight j,
e.g. 1 : 10 : 1, so the slow link carries as long as the fast ones; a weight of 0 roots nothing, a single 1
one root takes all). plan/exchange_roots.py chooses the weights from the plan's inventory, the same rule for
the runtime and the price.

`sync_moves(..., pairwise=False, rotate=False)` gives the gather and scatter moves with the first holder the root
of every element, for two holders as well: the start-up copy of the first holder's weights
(replica_weights.ReplicaWeights) is the scatter phase alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..plan.exchange_roots import run_edges

Rect = tuple  # (row_start, row_stop, col_start, col_stop) in the whole table, stops exclusive


@dataclass(frozen=True)
class Layout:
    """Where a rank's local tensor sits in the whole parameter. `segments`: (local_row, whole_row, rows,
    local_col, whole_col, cols) blocks, each mapping a block of the local table onto one of the whole table."""
    local: tuple[int, int]
    whole: tuple[int, int]
    segments: tuple[tuple[int, int, int, int, int, int], ...]


def table_shape(shape) -> tuple[int, int]:
    """A tensor shape as (rows, cols): vectors are one column, higher ranks fold everything after dim 0."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        return (1, 1)
    if len(shape) == 1:
        return (shape[0], 1)
    cols = 1
    for s in shape[1:]:
        cols *= s
    return (shape[0], cols)


def tp_layout(local_shape, tp: int, tp_rank: int, partition_dim: int | None, *, gated: bool = False) -> Layout:
    """The layout of TP rank `tp_rank` of `tp` for a local tensor of `local_shape`, cut by Megatron along
    `partition_dim` (None: not cut, every TP rank holds the whole parameter). `gated`: SwiGLU's fc1, whose
    shard is [gate rows of this rank; up rows of this rank] (runtime/model.py tp_shard)."""
    rows, cols = table_shape(local_shape)
    if tp == 1 or partition_dim is None:
        return Layout((rows, cols), (rows, cols), ((0, 0, rows, 0, 0, cols),))
    if partition_dim == 0 and gated:
        half = rows // 2
        return Layout((rows, cols), (rows * tp, cols),
                      ((0, tp_rank * half, half, 0, 0, cols), (half, tp * half + tp_rank * half, half, 0, 0, cols)))
    if partition_dim == 0:
        return Layout((rows, cols), (rows * tp, cols), ((0, tp_rank * rows, rows, 0, 0, cols),))
    if partition_dim == 1 and len(tuple(local_shape)) == 2:
        return Layout((rows, cols), (rows, cols * tp), ((0, 0, rows, 0, tp_rank * cols, cols),))
    raise ValueError(f"no layout for a tensor of shape {tuple(local_shape)} cut along dim {partition_dim}")


def _flat_rects(lo: int, hi: int, cols: int) -> list[Rect]:
    """The row-major interval [lo, hi) of a table with `cols` columns as at most three rectangles."""
    out = []
    while lo < hi:
        r, c = divmod(lo, cols)
        if c or hi - lo < cols:                          # a partial row
            stop = min(hi, (r + 1) * cols)
            out.append((r, r + 1, c, c + stop - lo))
            lo = stop
        else:                                            # whole rows
            n = (hi - lo) // cols
            out.append((r, r + n, 0, cols))
            lo += n * cols
    return out


def _meet(a: Rect, b: Rect) -> Rect | None:
    r0, r1, c0, c1 = max(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), min(a[3], b[3])
    return (r0, r1, c0, c1) if r0 < r1 and c0 < c1 else None


def region(layout: Layout, lo: int, hi: int) -> tuple[Rect, ...]:
    """The whole-table rectangles of the local flattened interval [lo, hi), sorted; each lies inside one segment."""
    out = []
    for piece in _flat_rects(lo, hi, layout.local[1]):
        for lr, wr, nr, lc, wc, nc in layout.segments:
            m = _meet(piece, (lr, lr + nr, lc, lc + nc))
            if m is not None:
                out.append((m[0] - lr + wr, m[1] - lr + wr, m[2] - lc + wc, m[3] - lc + wc))
    return tuple(sorted(out))


def meet(a, b) -> tuple[Rect, ...]:
    """The rectangles where two regions overlap, sorted (the order both ends of a message agree on)."""
    return tuple(sorted(m for x in a for y in b if (m := _meet(x, y)) is not None))


def area(rects) -> int:
    return sum((r[1] - r[0]) * (r[3] - r[2]) for r in rects)


def to_local(layout: Layout, rect: Rect) -> Rect:
    """A whole-table rectangle (inside one of the layout's segments) in the local table's coordinates."""
    for lr, wr, nr, lc, wc, nc in layout.segments:
        if wr <= rect[0] and rect[1] <= wr + nr and wc <= rect[2] and rect[3] <= wc + nc:
            return (rect[0] - wr + lr, rect[1] - wr + lr, rect[2] - wc + lc, rect[3] - wc + lc)
    raise ValueError(f"{rect} is not inside one block of this rank's shard {layout.segments}")


@dataclass(frozen=True)
class Owner:
    """One rank's share of one holder of a parameter. `holder`: a sortable key (mesh index, stage in mesh);
    `weight`: the factor of this holder's gradient in the sum; [lo, hi): the interval of the local tensor,
    flattened, whose reduced gradient the rank holds; `source`: whether its values count (see module doc)."""
    rank: int
    holder: tuple
    weight: float
    layout: Layout
    lo: int
    hi: int
    source: bool

    @cached_property
    def region(self) -> tuple[Rect, ...]:
        return region(self.layout, self.lo, self.hi)


@dataclass(frozen=True)
class Move:
    """Rectangles of one parameter sent from `src` to `dst`: phase "pair" (two holders: the sender's gradient to
    the other holder, `holder` = the sender's holder index, 0 or 1), "gather" (a holder's gradient to the root,
    `holder` = that holder's index in plan order) or "scatter" (the sum back to another holder's source,
    `holder` = the receiver's index)."""
    phase: str
    src: int
    dst: int
    name: str
    holder: int
    rects: tuple[Rect, ...]

    @property
    def numel(self) -> int:
        return area(self.rects)


def holders_of(owners) -> list[tuple]:
    """The holder keys of a parameter in plan order; the first is the root."""
    return sorted({o.holder for o in owners})


def weights_of(owners) -> list[float]:
    """Each holder's weight (every owner of a holder must carry the same one)."""
    out = []
    for h in holders_of(owners):
        ws = {o.weight for o in owners if o.holder == h}
        if len(ws) != 1:
            raise ValueError(f"the ranks of holder {h} disagree on its weight: {sorted(ws)}")
        out.append(ws.pop())
    return out


def _check_partition(name: str, holder, sources) -> None:
    """The sources' intervals must cover the parameter once. Ranks with one layout (one TP rank) must hold
    disjoint intervals of it; different TP ranks' blocks are disjoint by construction, so the sizes must add up
    to the whole. Linear in the ranks (a holder may have thousands)."""
    if not sources:
        raise ValueError(f"{name}: holder {holder} has no source rank")
    whole = sources[0].layout.whole
    if any(o.layout.whole != whole for o in sources):
        raise ValueError(f"{name}: the ranks of holder {holder} see different whole shapes")
    by_layout: dict = {}
    for o in sources:
        by_layout.setdefault(o.layout, []).append((o.lo, o.hi))
    overlap = False
    for intervals in by_layout.values():
        intervals.sort()
        overlap |= any(b[0] < a[1] for a, b in zip(intervals, intervals[1:]))
    size = sum(o.hi - o.lo for o in sources)
    if overlap or size != whole[0] * whole[1]:
        raise ValueError(f"{name}: the source ranks of holder {holder} do not partition the parameter "
                         f"({size} of {whole[0] * whole[1]} elements{', overlapping' if overlap else ''})")


def root_chunks(whole: tuple, weights) -> list[tuple[Rect, ...]]:
    """The runs of the whole table (rows, cols), flattened row-major, that each holder is the root of, in
    proportion to its integer weight (plan/exchange_roots.py run_edges), as rectangles."""
    rows, cols = whole
    return [tuple(_flat_rects(lo, hi, cols)) for lo, hi in run_edges(rows * cols, weights)]


def root_weights(holders: int, rotate: bool = True, weights=None) -> tuple[int, ...]:
    """The weights sync_moves roots the runs by (its `rotate` and `weights`), checked against the holders."""
    if weights is None:
        return (1,) * holders if rotate else (1,)
    if len(weights) != holders or min(weights) < 0 or not sum(weights):
        raise ValueError(f"root weights {tuple(weights)} for {holders} holders: one non-negative weight each, "
                         "not all zero")
    return tuple(weights)


def sync_moves(name: str, owners, rank: int | None = None, *, pairwise: bool = True,
               rotate: bool = True, weights=None) -> list[Move]:
    """Every move of one parameter's gradient exchange among its holders (module doc), deterministic; with
    `rank`, only the moves that rank sends or receives (the same moves, found in time linear in the owners);
    `pairwise=False`: gather and scatter even for two holders; `weights`: each holder's share of the elements it
    is the root of (`root_chunks`; plan/exchange_roots.py chooses them), by default equal (holder j the root of
    run j), or with `rotate=False` the first holder the root of every element. Checks that every holder sees the
    same whole shape and that each holder's sources partition it."""
    keys = holders_of(owners)
    if len(keys) < 2:
        return []
    shapes = {o.layout.whole for o in owners}
    if len(shapes) != 1:
        raise ValueError(f"{name}: the holders hold different shapes {sorted(shapes)}")
    sources = {h: sorted((o for o in owners if o.holder == h and o.source and o.lo < o.hi), key=lambda o: o.rank)
               for h in keys}
    for h in keys:
        _check_partition(name, h, sources[h])
    root = sources[keys[0]]

    def pairs(a, b):
        """(x, y) for x in a, y in b, but only those involving `rank` when it is given."""
        if rank is None:
            return [(x, y) for x in a for y in b]
        mine = [y for y in b if y.rank == rank]
        return [(x, y) for x in a if x.rank == rank for y in b] + [(x, y) for x in a if x.rank != rank for y in mine]

    moves = []
    if pairwise and len(keys) == 2:     # both directions at once, each pair of ranks in (sender, receiver) order
        for s, r in sorted(pairs(sources[keys[1]], root), key=lambda p: (p[0].rank, p[1].rank)):
            rects = meet(s.region, r.region)
            if rects:
                moves += [Move("pair", s.rank, r.rank, name, 1, rects), Move("pair", r.rank, s.rank, name, 0, rects)]
        return moves
    whole = shapes.pop()
    runs = root_chunks(whole, root_weights(len(keys), rotate, weights))
    for j, run in enumerate(runs):          # the gathers into every root, then the scatters out of every root
        root = sources[keys[j]]
        for index, h in enumerate(keys):
            if index == j:
                continue
            for s, r in sorted(pairs(sources[h], root), key=lambda p: (p[0].rank, p[1].rank)):
                rects = meet(meet(s.region, r.region), run)
                if rects:
                    moves.append(Move("gather", s.rank, r.rank, name, index, rects))
    for j, run in enumerate(runs):
        root = sources[keys[j]]
        sinks = sorted((o for h in keys if h != keys[j] for o in sources[h]), key=lambda o: (o.holder, o.rank))
        order = {(o.holder, o.rank): n for n, o in enumerate(sinks)}
        for r, k in sorted(pairs(root, sinks), key=lambda p: (p[0].rank, order[(p[1].holder, p[1].rank)])):
            rects = meet(meet(r.region, k.region), run)
            if rects:
                moves.append(Move("scatter", r.rank, k.rank, name, keys.index(k.holder), rects))
    return moves
