"""compute_transfers: every element of the step activation crosses the boundary exactly once, lands where the
receiver expects it, and comes from a sender that holds it. Pure: no processes."""
from collections import Counter, namedtuple

import pytest

from hetauto_megatron.runtime.transfers import compute_transfers, owned_seq_range

M = namedtuple("M", "tp dp")

PAIRS = [(M(1, 1), M(2, 1)), (M(2, 1), M(1, 1)), (M(4, 1), M(2, 1)), (M(2, 1), M(4, 1)), (M(1, 2), M(1, 1)),
         (M(1, 1), M(1, 2)), (M(1, 2), M(2, 1)), (M(2, 1), M(1, 2)), (M(2, 2), M(4, 1)), (M(4, 2), M(1, 4)),
         (M(2, 3), M(3, 2)), (M(3, 1), M(2, 3)), (M(8, 1), M(1, 8)), (M(1, 1), M(1, 1)), (M(2, 2), M(2, 2))]
SHAPES = [(32, 12, 4), (30, 24, 2), (7, 24, 3), (3, 24, 1)]


# the plan guarantees batch is divisible by both DP degrees, so only such cases exist
CASES = [(s, d, sh) for s, d in PAIRS for sh in SHAPES if sh[1] % s.dp == 0 and sh[1] % d.dp == 0]


@pytest.mark.parametrize("src,dst,shape", CASES)
def test_every_element_crosses_once_to_its_owner(src, dst, shape):
    seq, batch, hidden = shape
    ts = compute_transfers(src, dst, shape)
    hits = Counter()
    share_s, share_r = batch // src.dp, batch // dst.dp
    for t in ts:
        # the sender holds this block: its replica's batch share, any sequence position (no SP)
        assert t.src_dp * share_s <= t.batch_start and t.batch_stop <= (t.src_dp + 1) * share_s
        # the receiver replica needs it, and its TP rank owns these positions before the all-gather
        assert t.dst_dp * share_r <= t.batch_start and t.batch_stop <= (t.dst_dp + 1) * share_r
        lo, hi = owned_seq_range(t.dst_tp, dst.tp, seq)
        assert lo <= t.seq_start and t.seq_stop <= hi
        assert 0 <= t.src_tp < src.tp and 0 <= t.dst_tp < dst.tp
        # local slices stay inside the local tensors
        assert 0 <= t.src_batch.start < t.src_batch.stop <= share_s
        assert 0 <= t.dst_batch.start < t.dst_batch.stop <= share_r
        for s in range(t.seq_start, t.seq_stop):
            for b in range(t.batch_start, t.batch_stop):
                hits[(s, b)] += 1
    assert set(hits) == {(s, b) for s in range(seq) for b in range(batch)}
    assert set(hits.values()) == {1}
    assert sum(t.numel(hidden) for t in ts) == seq * batch * hidden


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


def test_rejects_batch_not_divisible():
    with pytest.raises(ValueError, match="not divisible"):
        compute_transfers(M(1, 3), M(1, 2), (8, 4, 2))
