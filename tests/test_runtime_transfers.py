"""compute_transfers: every element of the step activation crosses the boundary exactly once, lands where the
receiver expects it, and comes from a sender that holds it, with sequence parallelism on either side, both or
neither. Pure: no processes."""
from collections import Counter, namedtuple

import pytest

from hetauto_megatron.runtime.transfers import Share, compute_transfers, owned_seq_range

M = namedtuple("M", "tp dp")

PAIRS = [(M(1, 1), M(2, 1)), (M(2, 1), M(1, 1)), (M(4, 1), M(2, 1)), (M(2, 1), M(4, 1)), (M(1, 2), M(1, 1)),
         (M(1, 1), M(1, 2)), (M(1, 2), M(2, 1)), (M(2, 1), M(1, 2)), (M(2, 2), M(4, 1)), (M(4, 2), M(1, 4)),
         (M(2, 3), M(3, 2)), (M(3, 1), M(2, 3)), (M(8, 1), M(1, 8)), (M(1, 1), M(1, 1)), (M(2, 2), M(2, 2))]
SHAPES = [(32, 12, 4), (30, 24, 2), (7, 24, 3), (3, 24, 1)]


# the plan guarantees batch is divisible by both DP degrees, so only such cases exist; sequence parallelism
# (only for TP > 1) needs the sequence divisible by that side's TP, as Megatron requires
SP = [(False, False), (True, False), (False, True), (True, True)]
CASES = [(s, d, sh, ssp, dsp) for s, d in PAIRS for sh in SHAPES for ssp, dsp in SP
         if sh[1] % s.dp == 0 and sh[1] % d.dp == 0 and not (ssp and (s.tp == 1 or sh[0] % s.tp))
         and not (dsp and (d.tp == 1 or sh[0] % d.tp))]


def local_positions(tp_rank, tp, seq, sp):
    """The full-sequence positions a TP rank's local tensor holds, in local order."""
    return list(range(*owned_seq_range(tp_rank, tp, seq))) if sp else list(range(seq))


@pytest.mark.parametrize("src,dst,shape,src_sp,dst_sp", CASES)
def test_every_element_crosses_once_to_its_owner(src, dst, shape, src_sp, dst_sp):
    seq, batch, hidden = shape
    ts = compute_transfers(src, dst, shape, src_sp=src_sp, dst_sp=dst_sp)
    hits = Counter()
    share_s, share_r = batch // src.dp, batch // dst.dp
    got = Counter()  # (dst_tp, dst_dp) -> elements received
    for t in ts:
        assert 0 <= t.src_tp < src.tp and 0 <= t.dst_tp < dst.tp
        # the sender holds this block: its replica's batch share, and (with SP) its own sequence shard; the
        # local slice it reads holds exactly these full-sequence positions
        assert t.src_dp * share_s <= t.batch_start and t.batch_stop <= (t.src_dp + 1) * share_s
        held = local_positions(t.src_tp, src.tp, seq, src_sp)
        assert held[t.src_seq] == list(range(t.seq_start, t.seq_stop))
        # the receiver replica needs it, its TP rank owns these positions (its shard with SP, its part of the
        # all-gather without), and the local slice it writes is where those positions live
        assert t.dst_dp * share_r <= t.batch_start and t.batch_stop <= (t.dst_dp + 1) * share_r
        lo, hi = owned_seq_range(t.dst_tp, dst.tp, seq)
        assert lo <= t.seq_start and t.seq_stop <= hi
        assert local_positions(t.dst_tp, dst.tp, seq, dst_sp)[t.dst_seq] == list(range(t.seq_start, t.seq_stop))
        # local slices stay inside the local tensors
        assert 0 <= t.src_batch.start < t.src_batch.stop <= share_s
        assert 0 <= t.dst_batch.start < t.dst_batch.stop <= share_r
        got[(t.dst_tp, t.dst_dp)] += t.numel(1)
        for s in range(t.seq_start, t.seq_stop):
            for b in range(t.batch_start, t.batch_stop):
                hits[(s, b)] += 1
    assert set(hits) == {(s, b) for s in range(seq) for b in range(batch)}
    assert set(hits.values()) == {1}
    assert sum(t.numel(hidden) for t in ts) == seq * batch * hidden
    # with SP every receiving rank gets its whole shard over the boundary and nothing else
    if dst_sp:
        assert got == {(t, e): seq // dst.tp * share_r for t in range(dst.tp) for e in range(dst.dp)}


@pytest.mark.parametrize("src,dst", [(M(2, 1), M(1, 1)), (M(4, 1), M(2, 1)), (M(4, 2), M(1, 4)), (M(2, 2), M(4, 1))])
def test_senders_share_the_load(src, dst):
    seq, batch, hidden = 32, 8, 4
    load = Counter()
    for t in compute_transfers(src, dst, (seq, batch, hidden)):
        load[(t.src_tp, t.src_dp)] += t.numel(hidden)
    assert len(load) == src.tp * src.dp              # every sender works
    assert max(load.values()) == min(load.values())  # equally


def test_examples_spelled_out():
    # TP 1 -> 2: the single sender sends the first half of the sequence to tp0 and the second to tp1
    ts = compute_transfers(M(1, 1), M(2, 1), (32, 2, 8))
    assert [(t.src_tp, t.dst_tp, t.seq_start, t.seq_stop) for t in ts] == [(0, 0, 0, 16), (0, 1, 16, 32)]
    # TP 2 -> 1: each sender sends half
    ts = compute_transfers(M(2, 1), M(1, 1), (32, 2, 8))
    assert [(t.src_tp, t.dst_tp, t.seq_start, t.seq_stop) for t in ts] == [(0, 0, 0, 16), (1, 0, 16, 32)]
    # DP 2 -> 1: the receiver gets sample 0 from replica 0 and sample 1 from replica 1
    ts = compute_transfers(M(1, 2), M(1, 1), (32, 2, 8))
    assert [(t.src_dp, t.batch_start, t.batch_stop, t.src_batch, t.dst_batch) for t in ts] == [
        (0, 0, 1, slice(0, 1), slice(0, 1)), (1, 1, 2, slice(0, 1), slice(1, 2))]
    # identical meshes: tp rank t sends its own share of the sequence to tp rank t
    ts = compute_transfers(M(2, 1), M(2, 1), (32, 2, 8))
    assert [(t.src_tp, t.dst_tp) for t in ts] == [(0, 0), (1, 1)]


def test_sequence_parallel_examples_spelled_out():
    # TP 2 (SP) -> TP 1: each sender sends its whole local shard; the receiver puts them one after the other
    ts = compute_transfers(M(2, 1), M(1, 1), (32, 2, 8), src_sp=True)
    assert [(t.src_tp, t.src_seq, t.dst_seq) for t in ts] == [(0, slice(0, 16), slice(0, 16)),
                                                              (1, slice(0, 16), slice(16, 32))]
    # TP 1 -> TP 2 (SP): receiver tp1 gets positions 16..31 as its local 0..15 and skips the all-gather
    ts = compute_transfers(M(1, 1), M(2, 1), (32, 2, 8), dst_sp=True)
    assert [(t.dst_tp, t.src_seq, t.dst_seq) for t in ts] == [(0, slice(0, 16), slice(0, 16)),
                                                              (1, slice(16, 32), slice(0, 16))]
    # TP 2 (SP) -> TP 4 (SP): sender tp0 feeds receivers 0 and 1, each a quarter, from its two halves
    ts = compute_transfers(M(2, 1), M(4, 1), (32, 2, 8), src_sp=True, dst_sp=True)
    assert [(t.src_tp, t.dst_tp, t.src_seq, t.dst_seq) for t in ts] == [
        (0, 0, slice(0, 8), slice(0, 8)), (0, 1, slice(8, 16), slice(0, 8)),
        (1, 2, slice(0, 8), slice(0, 8)), (1, 3, slice(8, 16), slice(0, 8))]
    # SP on both sides with equal TP: shard t goes to shard t, whole
    ts = compute_transfers(M(2, 1), M(2, 1), (32, 2, 8), src_sp=True, dst_sp=True)
    assert [(t.src_tp, t.dst_tp, t.src_seq, t.dst_seq) for t in ts] == [(0, 0, slice(0, 16), slice(0, 16)),
                                                                        (1, 1, slice(0, 16), slice(0, 16))]


def test_sequence_parallel_needs_a_divisible_sequence():
    with pytest.raises(ValueError, match="divisible by its tp 4"):
        compute_transfers(M(4, 1), M(1, 1), (30, 2, 8), src_sp=True)
    with pytest.raises(ValueError, match="receiver side"):
        compute_transfers(M(1, 1), M(4, 1), (30, 2, 8), dst_sp=True)


def test_rejects_batch_not_divisible():
    with pytest.raises(ValueError, match="not divisible"):
        compute_transfers(M(1, 3), M(1, 2), (8, 4, 2))


# ---- positions with several meshes side by side (alongside meshes: other TP, DP and micro-batch size) -----------

def shares(*meshes):
    """Share list of a position from (tp, dp, micro_batch_size, sp) per mesh, sample ranges in order."""
    out, start = [], 0
    for tp, dp, mbs, sp in meshes:
        out.append(Share(tp, dp, start, start + dp * mbs, sp))
        start += dp * mbs
    return out


# Positions of a 4-sample and a 6-sample step: one mesh, or two / three meshes that differ in TP, DP, micro-batch
# size and sequence parallelism (SP only where TP > 1, as the runtime settings table has it).
POSITIONS = {
    4: [shares((1, 4, 1, False)), shares((2, 2, 2, True)), shares((1, 2, 1, False), (2, 1, 2, True)),
        shares((2, 1, 2, True), (1, 2, 1, False)), shares((4, 1, 1, True), (1, 1, 2, False), (2, 1, 1, False))],
    6: [shares((2, 3, 2, True)), shares((1, 2, 1, False), (4, 1, 4, True)),
        shares((2, 2, 1, False), (1, 1, 3, False), (4, 1, 1, True)), shares((3, 1, 3, True), (1, 3, 1, False))],
}
MIXED = [(a, b, seq) for batch, sides in POSITIONS.items() for a in sides for b in sides
         if len(a) > 1 or len(b) > 1 for seq in (12, 7) if seq % 12 == 0 or not any(s.sp for s in a + b)]


def holder(position, sample):
    """Brute force: (mesh, replica, first sample of that replica) holding `sample`."""
    for k, sh in enumerate(position):
        for d in range(sh.dp):
            lo = sh.start + d * sh.micro_batch_size
            if lo <= sample < lo + sh.micro_batch_size:
                return k, d, lo
    raise AssertionError(sample)


@pytest.mark.parametrize("src,dst,seq", MIXED)
def test_positions_every_element_delivered_once_to_its_owner(src, dst, seq):
    """Against brute force: every (position, sample) of the step activation reaches, exactly once, the receiving
    rank that owns it (the replica holding the sample, the TP rank owning the position), read from a sender
    rank that holds it, at the right place of both local tensors."""
    batch, hidden = src[-1].stop, 3
    ts = compute_transfers(src, dst, (seq, batch, hidden))
    delivered = Counter()
    for t in ts:
        s, r = src[t.src_mesh], dst[t.dst_mesh]
        assert 0 <= t.src_tp < s.tp and 0 <= t.dst_tp < r.tp and t.src_dp < s.dp and t.dst_dp < r.dp
        for q in range(t.seq_start, t.seq_stop):
            for b in range(t.batch_start, t.batch_stop):
                # the sender holds it, at the local index it reads
                mk, md, lo = holder(src, b)
                assert (mk, md) == (t.src_mesh, t.src_dp)
                assert b - lo == b - t.src_batch_offset
                held = local_positions(t.src_tp, s.tp, seq, s.sp)
                assert q in held and held.index(q) == q - t.src_seq_offset
                # the receiver owns it, at the local index it writes
                rk, rd, rlo = holder(dst, b)
                assert (rk, rd) == (t.dst_mesh, t.dst_dp)
                assert owned_seq_range(t.dst_tp, r.tp, seq)[0] <= q < owned_seq_range(t.dst_tp, r.tp, seq)[1]
                assert local_positions(t.dst_tp, r.tp, seq, r.sp).index(q) == q - t.dst_seq_offset
                assert b - rlo == b - t.dst_batch_offset
                delivered[(q, b)] += 1
        assert 0 <= t.src_batch.start < t.src_batch.stop <= s.micro_batch_size
        assert 0 <= t.dst_batch.start < t.dst_batch.stop <= r.micro_batch_size
    assert delivered == Counter({(q, b): 1 for q in range(seq) for b in range(batch)})
    assert sum(t.numel(hidden) for t in ts) == seq * batch * hidden      # each byte crosses once


def test_positions_example_spelled_out():
    # stage 0 = mesh A (TP 1 x DP 2, one sample each) + mesh B (TP 2 with SP, DP 1, two samples);
    # stage 1 = mesh C (TP 1 x DP 2, two samples each). A's two replicas feed C replica 0; B's two TP ranks
    # each send their half of the sequence of samples 2..3 to C replica 1, which stacks them.
    ts = compute_transfers(shares((1, 2, 1, False), (2, 1, 2, True)), shares((1, 2, 2, False)), (8, 4, 5))
    assert [(t.src_mesh, t.src_tp, t.src_dp, t.dst_dp, t.seq, t.src_batch, t.dst_batch, t.src_seq, t.dst_seq)
            for t in ts] == [
        (0, 0, 0, 0, slice(0, 8), slice(0, 1), slice(0, 1), slice(0, 8), slice(0, 8)),
        (0, 0, 1, 0, slice(0, 8), slice(0, 1), slice(1, 2), slice(0, 8), slice(0, 8)),
        (1, 0, 0, 1, slice(0, 4), slice(0, 2), slice(0, 2), slice(0, 4), slice(0, 4)),
        (1, 1, 0, 1, slice(4, 8), slice(0, 2), slice(0, 2), slice(0, 4), slice(4, 8))]
    # the gradients flow back with the sides swapped: C replica 1 sends each of B's TP ranks its shard
    back = compute_transfers(shares((1, 2, 2, False)), shares((1, 2, 1, False), (2, 1, 2, True)), (8, 4, 5))
    assert [(t.src_dp, t.dst_mesh, t.dst_tp, t.dst_dp, t.seq) for t in back] == [
        (0, 0, 0, 0, slice(0, 8)), (0, 0, 0, 1, slice(0, 8)), (1, 1, 0, 0, slice(0, 4)), (1, 1, 1, 0, slice(4, 8))]


def test_positions_reject_ranges_that_do_not_partition_the_step():
    with pytest.raises(ValueError, match="partition the step"):
        compute_transfers([Share(1, 1, 0, 2), Share(1, 1, 3, 4)], M(1, 1), (4, 4, 1))
    with pytest.raises(ValueError, match="hold 3 samples of a 4-sample step"):
        compute_transfers([Share(1, 1, 0, 2), Share(1, 1, 2, 3)], M(1, 1), (4, 4, 1))
    with pytest.raises(ValueError, match="not divisible by its dp 2"):
        compute_transfers([Share(1, 2, 0, 3), Share(1, 1, 3, 4)], M(1, 1), (4, 4, 1))
