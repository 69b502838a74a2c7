"""Which slice of an activation goes from which sender to which receiver at a mesh boundary.

An activation crossing from the last stage of one mesh to the first stage of the next has the shape
(seq, batch, hidden), where `batch` is the samples of one micro-batch step across ALL data-parallel
replicas (`Plan.samples_per_step`). Both sides hold it differently:

- data parallelism splits the batch dimension: replica d of a mesh with DP degree k holds samples
  [d*batch/k, (d+1)*batch/k) (Megatron gives each replica its own contiguous share);
- without sequence parallelism every TP rank of a replica holds that whole share (all sequence positions).

A naive exchange would send the whole share to every receiving TP rank, moving each byte tp_dst times over
the boundary (the slow, inter-cluster link). Instead the receiving replica's share is cut along the sequence
dimension into one piece per receiving TP rank; each piece crosses once, and the receivers reassemble the
full share with an all-gather over their own TP group, on their own fast intra-cluster backend. On the
sending side the pieces are spread over the sender's TP ranks (which all hold the same data) so every
sender's link carries a share of the traffic. Backward (activation gradients) is the same computation with
the two meshes swapped.

`compute_transfers` is pure: no processes, no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Transfer:
    """One contiguous block moved from sender (src_tp, src_dp) to receiver (dst_tp, dst_dp).

    seq_start/seq_stop and batch_start/batch_stop are in the coordinates of the full step activation;
    `src_batch_offset` / `dst_batch_offset` turn the batch range into the sender's / receiver's local
    tensor (whose batch dimension holds only that replica's share).
    """
    src_tp: int
    src_dp: int
    dst_tp: int
    dst_dp: int
    seq_start: int
    seq_stop: int
    batch_start: int
    batch_stop: int
    src_batch_offset: int
    dst_batch_offset: int

    def __post_init__(self):
        if not (0 <= self.seq_start < self.seq_stop and 0 <= self.batch_start < self.batch_stop):
            raise ValueError(f"empty or negative block: {self}")

    @property
    def src_batch(self) -> slice:
        """The batch slice of the sender's local tensor."""
        return slice(self.batch_start - self.src_batch_offset, self.batch_stop - self.src_batch_offset)

    @property
    def dst_batch(self) -> slice:
        """The batch slice of the receiver's local tensor."""
        return slice(self.batch_start - self.dst_batch_offset, self.batch_stop - self.dst_batch_offset)

    @property
    def seq(self) -> slice:
        return slice(self.seq_start, self.seq_stop)

    def numel(self, hidden: int) -> int:
        return (self.seq_stop - self.seq_start) * (self.batch_stop - self.batch_start) * hidden


def owned_seq_range(tp_rank: int, tp: int, seq: int) -> tuple[int, int]:
    """Sequence positions receiver TP rank `tp_rank` (of `tp`) gets over the boundary before the all-gather."""
    return tp_rank * seq // tp, (tp_rank + 1) * seq // tp


def compute_transfers(src_mesh, dst_mesh, shape) -> list[Transfer]:
    """Map every block of a (seq, batch, hidden) step activation from its sender to its receiver.

    `src_mesh` and `dst_mesh` need only `.tp` and `.dp` (a plan `Mesh` works). `batch` must be divisible by
    both DP degrees (the plan guarantees it: batch = dp * micro_batch_size in every mesh). The result
    partitions the whole activation: every element is in exactly one transfer, so each byte crosses once.
    The order is deterministic (receiver dp, sender dp, sequence), so both sides can derive message tags
    from positions in the list.
    """
    seq, batch, hidden = (int(x) for x in shape)
    tp_s, dp_s, tp_r, dp_r = int(src_mesh.tp), int(src_mesh.dp), int(dst_mesh.tp), int(dst_mesh.dp)
    if min(tp_s, dp_s, tp_r, dp_r) < 1:
        raise ValueError(f"tp and dp must be >= 1, got src tp{tp_s} dp{dp_s}, dst tp{tp_r} dp{dp_r}")
    if seq < 1 or hidden < 1 or batch < 1:
        raise ValueError(f"shape must be positive, got {shape}")
    if batch % dp_s or batch % dp_r:
        raise ValueError(f"batch {batch} is not divisible by both DP degrees ({dp_s} and {dp_r})")
    # Cut the sequence into n = lcm(tp_s, tp_r) chunks: chunk c goes from sender TP rank c*tp_s//n to
    # receiver TP rank c*tp_r//n, so both sides' TP ranks get contiguous, equal shares of the work.
    n = min(math.lcm(tp_s, tp_r), seq)
    bound = [c * seq // n for c in range(n + 1)]
    seq_blocks = []  # (src_tp, dst_tp, start, stop), consecutive chunks with the same pair merged
    for c in range(n):
        if bound[c] == bound[c + 1]:
            continue
        pair = (c * tp_s // n, c * tp_r // n)
        if seq_blocks and seq_blocks[-1][:2] == pair and seq_blocks[-1][3] == bound[c]:
            seq_blocks[-1] = (*pair, seq_blocks[-1][2], bound[c + 1])
        else:
            seq_blocks.append((*pair, bound[c], bound[c + 1]))
    if n < math.lcm(tp_s, tp_r):
        # Fewer positions than TP ranks: re-derive the receiver of each position from owned_seq_range so
        # the all-gather on the receiving side finds every position where it expects it.
        seq_blocks = []
        for pos in range(seq):
            dst = next(t for t in range(tp_r) if owned_seq_range(t, tp_r, seq)[0] <= pos < owned_seq_range(t, tp_r, seq)[1])
            seq_blocks.append((pos * tp_s // seq, dst, pos, pos + 1))
    share_s, share_r = batch // dp_s, batch // dp_r
    out = []
    for e in range(dp_r):
        r0, r1 = e * share_r, (e + 1) * share_r
        for d in range(dp_s):
            s0, s1 = d * share_s, (d + 1) * share_s
            b0, b1 = max(r0, s0), min(r1, s1)
            if b0 >= b1:
                continue
            for src_tp, dst_tp, q0, q1 in seq_blocks:
                out.append(Transfer(src_tp=src_tp, src_dp=d, dst_tp=dst_tp, dst_dp=e, seq_start=q0, seq_stop=q1,
                                    batch_start=b0, batch_stop=b1, src_batch_offset=s0, dst_batch_offset=r0))
    return out
