"""Which slice of an activation goes from which sender to which receiver at a mesh boundary.

An activation crossing from the last stage of one mesh to the first stage of the next has the shape
(seq, batch, hidden), where `batch` is the samples of one micro-batch step across ALL data-parallel
replicas (`Plan.samples_per_step`). Both sides hold it differently:

- data parallelism splits the batch dimension: replica d of a mesh with DP degree k holds samples
  [d*batch/k, (d+1)*batch/k) (Megatron gives each replica its own contiguous share);
- without sequence parallelism every TP rank of a replica holds that whole share (all sequence positions);
- with sequence parallelism (Megatron's --sequence-parallel) TP rank t of a replica holds only its own
  sequence shard, positions `owned_seq_range(t, tp, seq)` = [t*seq/tp, (t+1)*seq/tp), as a local tensor
  (seq/tp, share, hidden).

A naive exchange would send the whole share to every receiving TP rank, moving each byte tp_dst times over
the boundary (the slow, inter-cluster link). Instead the receiving replica's share is cut along the sequence
dimension at the shard boundaries of BOTH sides: each piece lies inside one sender TP rank's shard and one
receiver TP rank's shard, and crosses once, from that sender to that receiver. A receiver with sequence
parallelism then holds exactly its shard; one without reassembles the full share with an all-gather over its
own TP group, on its own fast intra-cluster backend. A sender without sequence parallelism holds every
position, so the same cut spreads the sending over its TP ranks and every sender's link carries a share of
the traffic. Backward (activation gradients) is the same computation with the two meshes swapped.

`compute_transfers` is pure: no processes, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transfer:
    """One contiguous block moved from sender (src_tp, src_dp) to receiver (dst_tp, dst_dp).

    seq_start/seq_stop and batch_start/batch_stop are in the coordinates of the full step activation;
    `src_batch_offset` / `dst_batch_offset` turn the batch range into the sender's / receiver's local
    tensor (whose batch dimension holds only that replica's share), `src_seq_offset` / `dst_seq_offset` the
    sequence range (non-zero only on a side with sequence parallelism, whose local tensor is its shard).
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
    src_seq_offset: int = 0
    dst_seq_offset: int = 0

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
        """The sequence range in full-activation coordinates."""
        return slice(self.seq_start, self.seq_stop)

    @property
    def src_seq(self) -> slice:
        """The sequence slice of the sender's local tensor."""
        return slice(self.seq_start - self.src_seq_offset, self.seq_stop - self.src_seq_offset)

    @property
    def dst_seq(self) -> slice:
        """The sequence slice of the receiver's local tensor."""
        return slice(self.seq_start - self.dst_seq_offset, self.seq_stop - self.dst_seq_offset)

    def numel(self, hidden: int) -> int:
        return (self.seq_stop - self.seq_start) * (self.batch_stop - self.batch_start) * hidden


def owned_seq_range(tp_rank: int, tp: int, seq: int) -> tuple[int, int]:
    """Sequence positions TP rank `tp_rank` (of `tp`) owns: its shard under sequence parallelism, and the part a
    receiver without it gets over the boundary before its all-gather."""
    return tp_rank * seq // tp, (tp_rank + 1) * seq // tp


def _owner(pos: int, tp: int, seq: int) -> int:
    return next(t for t in range(tp) if owned_seq_range(t, tp, seq)[0] <= pos < owned_seq_range(t, tp, seq)[1])


def compute_transfers(src_mesh, dst_mesh, shape, *, src_sp: bool = False, dst_sp: bool = False) -> list[Transfer]:
    """Map every block of a (seq, batch, hidden) step activation from its sender to its receiver.

    `src_mesh` and `dst_mesh` need only `.tp` and `.dp` (a plan `Mesh` works); `src_sp` / `dst_sp` say whether
    that side runs sequence parallelism (its `settings.sequence_parallel`), which needs `seq` divisible by its
    TP. `batch` must be divisible by both DP degrees (the plan guarantees it: batch = dp * micro_batch_size in
    every mesh). The result partitions the whole activation: every element is in exactly one transfer, so each
    byte crosses once. The order is deterministic (receiver dp, sender dp, sequence), so both sides can derive
    message tags from positions in the list.
    """
    seq, batch, hidden = (int(x) for x in shape)
    tp_s, dp_s, tp_r, dp_r = int(src_mesh.tp), int(src_mesh.dp), int(dst_mesh.tp), int(dst_mesh.dp)
    if min(tp_s, dp_s, tp_r, dp_r) < 1:
        raise ValueError(f"tp and dp must be >= 1, got src tp{tp_s} dp{dp_s}, dst tp{tp_r} dp{dp_r}")
    if seq < 1 or hidden < 1 or batch < 1:
        raise ValueError(f"shape must be positive, got {shape}")
    if batch % dp_s or batch % dp_r:
        raise ValueError(f"batch {batch} is not divisible by both DP degrees ({dp_s} and {dp_r})")
    for side, sp, tp in (("sender", src_sp, tp_s), ("receiver", dst_sp, tp_r)):
        if sp and seq % tp:
            raise ValueError(f"sequence parallelism on the {side} side needs seq {seq} divisible by its tp {tp}")
    # Cut the sequence at every shard boundary of both sides: each piece then has one sending TP rank (the
    # owner of its positions; with the equal floor split of a side without SP this spreads the sending evenly)
    # and one receiving TP rank. With seq a multiple of lcm(tp_s, tp_r) these are the lcm equal chunks.
    cuts = sorted({owned_seq_range(t, tp, seq)[0] for tp in (tp_s, tp_r) for t in range(tp)} | {seq})
    seq_blocks = [(_owner(a, tp_s, seq), _owner(a, tp_r, seq), a, b) for a, b in zip(cuts, cuts[1:])]
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
                                    batch_start=b0, batch_stop=b1, src_batch_offset=s0, dst_batch_offset=r0,
                                    src_seq_offset=owned_seq_range(src_tp, tp_s, seq)[0] if src_sp else 0,
                                    dst_seq_offset=owned_seq_range(dst_tp, tp_r, seq)[0] if dst_sp else 0))
    return out
