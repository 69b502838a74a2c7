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

A pipeline position may hold several meshes side by side (`alongside` meshes in the plan: more DP replicas of
the same stages, possibly with another TP and micro-batch size). Then each side of the boundary is a list of
meshes, each holding its own sample range of the step (`Share`), and the batch dimension is re-sliced between
the two sides' replicas exactly as between the DP replicas of two single meshes.

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
    src_mesh: int = 0          # which mesh of the sending side (index into its list of `Share`s)
    dst_mesh: int = 0          # which mesh of the receiving side

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


@dataclass(frozen=True)
class Share:
    """One mesh of a pipeline position as a boundary sees it: its TP and DP degree, whether it runs sequence
    parallelism, and the samples [start, stop) of the micro-batch step it holds (replica d of it the
    contiguous `mbs = (stop - start) / dp` samples from start + d * mbs; `Plan.sample_range`)."""
    tp: int
    dp: int
    start: int
    stop: int
    sp: bool = False

    @property
    def micro_batch_size(self) -> int:
        return (self.stop - self.start) // self.dp


def _shares(side, seq: int, batch: int, sp: bool, name: str) -> list[Share]:
    """A side given as one mesh (`.tp`, `.dp`; it holds the whole step) or as its meshes' `Share`s, checked: the
    one validation of a side, each message naming the side and, in a list, the mesh."""
    if hasattr(side, "tp"):
        shares, labels = [Share(int(side.tp), int(side.dp), 0, batch, sp)], [f"the {name} side"]
    else:
        shares, labels = list(side), [f"{name} mesh {k}" for k in range(len(side))]
    covered = 0
    for sh, label in zip(shares, labels):
        if min(sh.tp, sh.dp) < 1:
            raise ValueError(f"tp and dp must be >= 1, got {label}: tp{sh.tp} dp{sh.dp}")
        if sh.start != covered or sh.stop <= sh.start:
            raise ValueError(f"the {name} meshes' sample ranges must partition the step in order; {label} holds "
                             f"[{sh.start}, {sh.stop}), expected to start at {covered}")
        if (sh.stop - sh.start) % sh.dp:
            raise ValueError(f"batch {sh.stop - sh.start} of {label} is not divisible by its dp {sh.dp}")
        if sh.sp and seq % sh.tp:
            raise ValueError(f"sequence parallelism on {label} needs seq {seq} divisible by its tp {sh.tp}")
        covered = sh.stop
    if covered != batch:
        raise ValueError(f"the {name} meshes hold {covered} samples of a {batch}-sample step")
    return shares


def compute_transfers(src, dst, shape, *, src_sp: bool = False, dst_sp: bool = False) -> list[Transfer]:
    """Map every block of a (seq, batch, hidden) step activation from its sender to its receiver.

    Each side is one mesh (anything with `.tp` and `.dp`, e.g. a plan `Mesh`; `src_sp` / `dst_sp` say whether
    it runs sequence parallelism, its `settings.sequence_parallel`) holding the whole step, or the meshes of a
    pipeline position as a list of `Share`s, each holding its own sample range of the step with its own TP,
    DP, micro-batch size and sequence parallelism (then `src_sp` / `dst_sp` are not used). A side with sequence
    parallelism needs `seq` divisible by its TP, and each mesh's samples must divide by its DP (the plan
    guarantees both). The result partitions the whole activation: every element is in exactly one transfer, so
    each byte crosses once. `Transfer.src_mesh` / `.dst_mesh` index the side's list (0 for a single mesh). The
    order is deterministic (receiver mesh, receiver dp, sender mesh, sender dp, sequence), so both sides can
    derive message tags from positions in the list.
    """
    seq, batch, hidden = (int(x) for x in shape)
    if seq < 1 or hidden < 1 or batch < 1:
        raise ValueError(f"shape must be positive, got {shape}")
    senders, receivers = _shares(src, seq, batch, src_sp, "sender"), _shares(dst, seq, batch, dst_sp, "receiver")
    out = []
    for rm, r in enumerate(receivers):
        # Cut the sequence at every shard boundary of both meshes: each piece then has one sending TP rank (the
        # owner of its positions; with the equal floor split of a mesh without SP this spreads the sending evenly)
        # and one receiving TP rank. With seq a multiple of lcm(tp_s, tp_r) these are the lcm equal chunks. The
        # cuts depend only on the two meshes, so they are computed once per pair, not per receiving replica.
        sender_blocks = []
        for s in senders:
            cuts = sorted({owned_seq_range(t, tp, seq)[0] for tp in (s.tp, r.tp) for t in range(tp)} | {seq})
            sender_blocks.append([(_owner(a, s.tp, seq), _owner(a, r.tp, seq), a, b) for a, b in zip(cuts, cuts[1:])])
        for e in range(r.dp):
            r0 = r.start + e * r.micro_batch_size
            r1 = r0 + r.micro_batch_size
            for sm, (s, blocks) in enumerate(zip(senders, sender_blocks)):
                for d in range(s.dp):
                    s0 = s.start + d * s.micro_batch_size
                    b0, b1 = max(r0, s0), min(r1, s0 + s.micro_batch_size)
                    if b0 >= b1:
                        continue
                    for src_tp, dst_tp, q0, q1 in blocks:
                        out.append(Transfer(src_tp=src_tp, src_dp=d, dst_tp=dst_tp, dst_dp=e, seq_start=q0,
                                            seq_stop=q1, batch_start=b0, batch_stop=b1, src_batch_offset=s0,
                                            dst_batch_offset=r0,
                                            src_seq_offset=owned_seq_range(src_tp, s.tp, seq)[0] if s.sp else 0,
                                            dst_seq_offset=owned_seq_range(dst_tp, r.tp, seq)[0] if r.sp else 0,
                                            src_mesh=sm, dst_mesh=rm))
    return out
