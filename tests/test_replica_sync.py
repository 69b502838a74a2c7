"""Which gradient elements move where when several meshes hold a parameter (runtime/shard_regions.py), checked
without processes: the regions follow Megatron's TP cuts and DP shards, and running the moves on plain Python
numbers leaves every holder with sum(weight x gradient) computed element by element from the whole tensors."""
import itertools
import os

import pytest

from hetauto_megatron.runtime.gradients import owned_interval
from hetauto_megatron.runtime.shard_regions import (Owner, meet, region, root_chunks, sync_moves, table_shape, to_local,
                                                   tp_layout)


def test_tp_cut_along_columns_maps_a_dp_shard_to_row_pieces():
    # whole (4, 6), TP 2 along dim 1: rank 1 holds columns 3..5; its DP shard is local elements [2, 7)
    lay = tp_layout((4, 3), 2, 1, 1)
    assert lay.whole == (4, 6)
    assert region(lay, 2, 7) == ((0, 1, 5, 6), (1, 2, 3, 6), (2, 3, 3, 4))
    assert to_local(lay, (1, 2, 3, 6)) == (1, 2, 0, 3)


def test_gated_fc1_shard_is_two_row_blocks():
    # SwiGLU fc1 of 8 rows (4 gate, 4 up), TP 2: rank 1 holds gate rows 2..3 and up rows 6..7
    lay = tp_layout((4, 5), 2, 1, 0, gated=True)
    assert region(lay, 0, 20) == ((2, 4, 0, 5), (6, 8, 0, 5))
    assert region(lay, 7, 13) == ((3, 4, 2, 5), (6, 7, 0, 3))
    assert table_shape((7,)) == (7, 1) and table_shape((2, 3, 4)) == (2, 12)


def _owners(holder, weight, whole, tp, dp, partition_dim, *, first_rank, sharded=True, gated=False):
    """The owners of one holder: TP x DP ranks (tp fastest), DP shards as Megatron's reduce-scatter leaves them
    for a parameter alone in a bucket padded to a multiple of dp."""
    rows, cols = whole
    local = (rows // tp, cols) if partition_dim == 0 else (rows, cols // tp) if partition_dim == 1 else whole
    numel = local[0] * local[1]
    bucket = -(-numel // dp) * dp
    out = []
    for d, t in itertools.product(range(dp), range(tp)):
        lo, hi = owned_interval(0, numel, bucket, dp, d) if sharded else (0, numel)
        source = (sharded or d == 0) and (partition_dim is not None or t == 0)
        out.append(Owner(first_rank + d * tp + t, holder, weight, tp_layout(local, tp, t, partition_dim, gated=gated),
                         lo, hi, source))
    return out


def _run(moves, owners, grads, weights, rotate=True, roots=None):
    """Execute the moves on dicts {(row, col): value} per rank, as replica_sync.ReplicaSync.reduce does, then
    give every copy its holder's source's values (the broadcast inside the mesh)."""
    held = {}
    for o in owners:
        held[o.rank] = {}
        for rect in o.region:
            for r in range(rect[0], rect[1]):
                for c in range(rect[2], rect[3]):
                    held[o.rank][(r, c)] = grads[o.holder][(r, c)]
    keys = sorted({o.holder for o in owners})
    whole = owners[0].layout.whole
    runs = root_chunks(whole, roots or (1,) * len(keys)) if rotate else [((0, whole[0], 0, whole[1]),)]
    root_of = {(r, c): keys[j] for j, run in enumerate(runs) for rect in run for r in range(rect[0], rect[1])
               for c in range(rect[2], rect[3])}
    paired = [m for m in moves if m.phase == "pair"]     # two holders: both ends sum the same two operands
    sent = {id(m): {(r, c): held[m.src][(r, c)] for rect in m.rects for r in range(rect[0], rect[1])
                    for c in range(rect[2], rect[3])} for m in paired}
    for m in paired:
        for k, v in sent[id(m)].items():
            g = {m.holder: v, 1 - m.holder: held[m.dst][k]}
            held[m.dst][k] = weights[0] * g[0] + weights[1] * g[1]
    for o in owners if not paired else ():       # each root's own term of the elements it is root of
        if o.source:
            held[o.rank] = {k: v * weights[keys.index(o.holder)] if root_of[k] == o.holder else v
                            for k, v in held[o.rank].items()}
    gathered = [m for m in moves if m.phase == "gather"]
    sent = {id(m): {(r, c): held[m.src][(r, c)] for rect in m.rects for r in range(rect[0], rect[1])
                    for c in range(rect[2], rect[3])} for m in gathered}
    for m in sorted(gathered, key=lambda m: m.holder):
        for k, v in sent[id(m)].items():
            held[m.dst][k] += weights[m.holder] * v
    for m in moves:
        if m.phase == "scatter":
            for rect in m.rects:
                for r in range(rect[0], rect[1]):
                    for c in range(rect[2], rect[3]):
                        held[m.dst][(r, c)] = held[m.src][(r, c)]
    for o in owners:
        if not o.source:
            source = {k: held[s.rank][k] for s in owners if s.holder == o.holder and s.source for k in held[s.rank]}
            held[o.rank] = {k: source[k] for k in held[o.rank]}
    return held


@pytest.mark.parametrize("partition_dim,sharded,gated", [(0, True, False), (1, True, False), (None, True, False),
                                                         (1, False, False), (0, True, True)])
def test_every_holder_ends_with_the_weighted_sum(partition_dim, sharded, gated):
    # a (6, 4) parameter held by three meshes: TP 2 x DP 2, TP 1 x DP 3, TP 3 x DP 1 (not for gated: 3 rows of 6
    # do not split into gate and up halves), weights 0.5, 0.3, 0.2
    whole = (8, 4) if gated else (6, 4) if partition_dim != 1 else (4, 6)
    layouts = [(2, 2), (1, 3)] + ([] if gated else [(3, 1)])
    weights = [0.5, 0.3, 0.2][:len(layouts)]
    owners, first = [], 0
    for h, (tp, dp) in enumerate(layouts):
        owners += _owners((h, 0), weights[h], whole, tp, dp, partition_dim, first_rank=first, sharded=sharded,
                          gated=gated)
        first += tp * dp
    grads = {(h, 0): {(r, c): float(1 + r * 10 + c + 100 * h) for r in range(whole[0]) for c in range(whole[1])}
             for h in range(len(layouts))}
    moves = sync_moves("w", owners)
    held = _run(moves, owners, grads, weights)
    for o in owners:
        if o.lo == o.hi:
            continue
        for (r, c), v in held[o.rank].items():
            want = sum(weights[h] * grads[(h, 0)][(r, c)] for h in range(len(layouts)))
            assert v == pytest.approx(want, rel=1e-12), (o.rank, r, c)
    # two holders: every element once each way, in one phase; more: each element once from every holder but its
    # root to the root (gather), the sum once back (scatter), the roots taking turns: every holder sends and
    # receives (H - 1) / H of the table in each phase
    total = whole[0] * whole[1]
    if len(layouts) == 2:
        assert {m.phase for m in moves} == {"pair"} and sum(m.numel for m in moves) == 2 * total
    else:
        H = len(layouts)
        for phase in ("gather", "scatter"):
            assert sum(m.numel for m in moves if m.phase == phase) == (H - 1) * total
        holder = {o.rank: o.holder for o in owners}
        for h in range(H):
            out = sum(m.numel for m in moves if m.phase == "gather" and holder[m.src] == (h, 0))
            inn = sum(m.numel for m in moves if m.phase == "gather" and holder[m.dst] == (h, 0))
            assert out == total - _run_len(whole, H, h), (h, out)
            assert inn == (H - 1) * _run_len(whole, H, h), (h, inn)
    # one root takes all (plan/exchange_roots.py, where the others' link is slow), or uneven runs: the same sums;
    # with holder 1 the one root, holders 0 and 2 exchange nothing with each other
    holder = {o.rank: o.holder for o in owners}
    if len(layouts) == 3:
        for roots in ((0, 1, 0), (2, 0, 1)):
            moved = sync_moves("w", owners, weights=roots)
            held = _run(moved, owners, grads, weights, roots=roots)
            for o in owners:
                for (r, c), v in held[o.rank].items():
                    want = sum(weights[h] * grads[(h, 0)][(r, c)] for h in range(len(layouts)))
                    assert v == pytest.approx(want, rel=1e-12), (roots, o.rank, r, c)
            if roots == (0, 1, 0):
                assert {frozenset((holder[m.src][0], holder[m.dst][0])) for m in moved} == {frozenset((0, 1)),
                                                                                            frozenset((1, 2))}
                assert sum(m.numel for m in moved if m.phase == "gather") == 2 * total
    # the start-up copy of the weights: the first holder is the root of every element
    fixed = sync_moves("w", owners, pairwise=False, rotate=False)
    assert {holder[m.dst] for m in fixed if m.phase == "gather"} == {(0, 0)}
    held = _run(fixed, owners, grads, weights, rotate=False)
    for o in owners:
        for (r, c), v in held[o.rank].items():
            want = sum(weights[h] * grads[(h, 0)][(r, c)] for h in range(len(layouts)))
            assert v == pytest.approx(want, rel=1e-12), (o.rank, r, c)


def _run_len(whole, holders, j) -> int:
    """Elements in run j of the table (shard_regions.root_chunks)."""
    n = whole[0] * whole[1]
    return (j + 1) * n // holders - j * n // holders


def test_two_holders_sharded_once_move_each_element_once_each_way():
    # what the cost model prices: a TP-cut parameter, distributed optimizer, two pipelines -> 2 x its elements
    owners = _owners((0, 0), 0.625, (8, 4), 2, 1, 0, first_rank=0) + \
        _owners((3, 1), 0.375, (8, 4), 1, 2, 0, first_rank=2)
    moves = sync_moves("w", owners)
    assert {m.phase for m in moves} == {"pair"} and sum(m.numel for m in moves) == 64
    assert {(m.src, m.dst) for m in moves} == {(2, 0), (0, 2), (3, 1), (1, 3)}
    assert [m.numel for m in moves if m.holder == 1] == [m.numel for m in moves if m.holder == 0] == [16, 16]
    # the start-up copy of the first holder's weights: the scatter phase of the gather/scatter moves
    moves = sync_moves("w", owners, pairwise=False, rotate=False)
    assert sum(m.numel for m in moves if m.phase == "gather") == 32
    assert sum(m.numel for m in moves if m.phase == "scatter") == 32
    assert {(m.src, m.dst) for m in moves if m.phase == "gather"} == {(2, 0), (3, 1)}


def test_holders_that_do_not_partition_the_parameter_are_refused():
    good = _owners((0, 0), 0.5, (4, 4), 1, 2, 0, first_rank=0)
    bad = _owners((1, 0), 0.5, (4, 4), 1, 2, 0, first_rank=2)
    bad[1] = Owner(3, (1, 0), 0.5, bad[1].layout, 7, 16, True)      # overlaps rank 2's [0, 8)
    with pytest.raises(ValueError, match="do not partition"):
        sync_moves("w", good + bad)
    other = _owners((1, 0), 0.5, (4, 8), 1, 1, 0, first_rank=2)
    with pytest.raises(ValueError, match="different shapes"):
        sync_moves("w", good + other)
    assert meet(((0, 2, 0, 2),), ((1, 3, 1, 3),)) == ((1, 2, 1, 2),)


def test_one_ranks_moves_are_its_share_of_all_moves():
    # each rank derives only its own moves (time linear in the owners): the same moves, in the same order
    owners = _owners((0, 0), 0.5, (8, 6), 2, 2, 1, first_rank=0) + _owners((1, 0), 0.25, (8, 6), 1, 3, None,
                                                                          first_rank=4) + \
        _owners((2, 1), 0.25, (8, 6), 2, 1, 0, first_rank=7)
    every = sync_moves("w", owners)
    for rank in range(9):
        assert sync_moves("w", owners, rank=rank) == [m for m in every if rank in (m.src, m.dst)]
    two = owners[:7]      # two holders: the pair moves
    every = sync_moves("w", two)
    assert {m.phase for m in every} == {"pair"}
    for rank in range(7):
        assert sync_moves("w", two, rank=rank) == [m for m in every if rank in (m.src, m.dst)]


def test_ranks_are_named_with_their_pipeline():
    from helpers import ROOT, mesh

    from hetauto_megatron.plan.plan import load_plan, plan_from_dict
    from hetauto_megatron.runtime.ranks import describe_rank
    plan = load_plan(os.path.join(ROOT, "examples", "llama", "plans", "tiny-2pipelines-cpu.yaml"))
    assert describe_rank(plan, 5) == "rank 5 (pipeline 1, cluster cluster-b, stage 0)"
    assert describe_rank(plan, 3) == "rank 3 (pipeline 0, cluster cluster-a, stage 1)"
    one = plan_from_dict({"version": 2, "model": {"preset": "tiny"}, "global_batch_size": 4,
                          "meshes": [mesh("a", 1, 1, 2, [8])]})
    assert describe_rank(one, 0) == "rank 0 (cluster a, stage 0)"


def test_each_message_is_read_as_it_was_written():
    # replica_sync groups each rank's moves into one message per peer once; the receiver must place every piece
    # of a message at the offset its sender wrote it, and a pair's two ends take the same rectangles
    from hetauto_megatron.runtime.replica_messages import messages_of

    owners = {"w": _owners((0, 0), 0.5, (8, 6), 2, 2, 1, first_rank=0) +
              _owners((1, 0), 0.25, (8, 6), 1, 3, None, first_rank=4) +
              _owners((2, 1), 0.25, (8, 6), 2, 1, 0, first_rank=7),
              "v": _owners((0, 0), 0.5, (8, 1), 2, 2, None, first_rank=0) +
              _owners((1, 0), 0.5, (8, 1), 1, 3, None, first_rank=4)}
    for phases in (("pair", "gather"), ("scatter",)):
        msgs = {}
        for rank in range(9):
            moves = [m for name in sorted(owners) for m in sync_moves(name, owners[name], rank=rank)]
            layouts = {name: o.layout for name, os_ in owners.items() for o in os_ if o.rank == rank}
            msgs[rank] = messages_of(moves, phases, rank, layouts)
        assert any(msgs[r].sends for r in msgs)
        for rank, mine in msgs.items():
            for peer, numel, pieces in mine.sends:
                inbox = {p: (n, ps) for p, n, ps in msgs[peer].receives}[rank]
                assert inbox[0] == numel == sum(p.numel for p in pieces)
                assert [(p.name, p.move.rects, p.at) for p in pieces] == \
                    [(p.name, p.move.rects, p.at) for p in inbox[1]]
                back = {p: ps for p, _, ps in mine.receives}.get(peer, ())   # two holders of "v": a pair
                assert sorted((p.name, p.rect) for p in pieces if p.move.phase == "pair") == \
                    sorted((p.name, p.rect) for p in back if p.move.phase == "pair")
        paired = [p for m in msgs.values() for _, _, ps in m.sends for p in ps if p.move.phase == "pair"]
        assert bool(paired) == (phases[0] == "pair")


@pytest.mark.parametrize("a, b", [((1, 1), (1, 1)), ((1, 2), (1, 3)), ((1, 4), (1, 6)), ((2, 2), (1, 3)),
                                  ((2, 2), (2, 2)), ((4, 1), (1, 4)), ((2, 4), (4, 2)), ((2, 2), (1, 1))])
def test_the_priced_rank_pairs_are_the_runtimes_where_the_cuts_are_runs(a, b):
    """The exchange's price counts the rank pairs (one connection each) that share a link's per-connection limit
    (plan/tail_costs.py exchange_pairs): the runtime's own moves between two holders have exactly that many pairs
    where both cut the elements into runs (no TP, or TP across rows), and more, never fewer, where TP cuts columns
    (the price's per-connection limit then conservative)."""
    from hetauto_megatron.plan.holders_exchange import exchange_pairs
    for partition_dim in (0, 1, None):
        owners = _owners((0, 0), 0.5, (48, 24), *a, partition_dim, first_rank=0) + \
            _owners((1, 0), 0.5, (48, 24), *b, partition_dim, first_rank=100)
        pairs = {(m.src, m.dst) for m in sync_moves("w", owners) if m.src < 100 <= m.dst}
        sources = [sum(1 for o in owners if o.holder == h and o.source and o.lo < o.hi) for h in ((0, 0), (1, 0))]
        if partition_dim == 1 and min(a[0], b[0]) < max(a[0], b[0]):
            assert len(pairs) >= exchange_pairs(*sources), (partition_dim, len(pairs))
        else:
            assert len(pairs) == exchange_pairs(*sources), (partition_dim, len(pairs))
