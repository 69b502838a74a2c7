"""Received blocks that do not land in place at an overlapped cross-cluster boundary, and what they hold.

A receiving rank posts each block of a message (runtime/transfers.py `compute_transfers`: the same cut of the
step's activation the runtime makes) straight into its buffer, shape (seq, micro-batch, hidden), where the
block's view of that buffer is one contiguous run: the block spans the rank's whole micro-batch (or one sequence
position). Otherwise the block lands in a piece of its own, copied into the buffer when the stage takes the
message (runtime/communicator.py `_recv_from`): where the two sides' DP replicas hold different samples (a
receiver's micro-batch split over several senders, or the sequence cut of a TP/SP side inside a partial batch
range). An overlapped boundary posts its messages ahead, so each message held keeps its buffer AND its pieces
until it is taken. On an accelerator the pieces are pinned host memory (not priced against the device); on CPU
processes (the dry run, a `cpu` vendor) they are the same memory as the buffer, and priced.

`staged_fraction` is the share of a receiving rank's buffer that arrives in pieces (the busiest rank of the
receiving mesh); plan/pipeline_memory.py `memory_terms` turns it into boundary tensors. Pure: no torch.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from ..runtime.transfers import Share, compute_transfers


def _side(tp: int, dp: int, micro_batch_size: int, sp: bool) -> Share:
    return Share(int(tp), int(dp), 0, int(dp) * int(micro_batch_size), bool(sp and tp > 1))


@lru_cache(maxsize=4096)
def staged_fraction(sender: tuple, receiver: tuple, seq: int) -> float:
    """The largest share of one receiving rank's buffer that lands in pieces, for a message from `sender` to
    `receiver`, each (tp, dp, micro-batch size, sequence parallel) of one mesh holding the whole step (the two
    must hold the same samples per step: 0 otherwise, as nothing is then exchanged this way). A receiver
    without sequence parallelism gets only its own range of positions over the boundary (and all-gathers the
    rest): its pieces are that range's share of the buffer at most."""
    src, dst = _side(*sender), _side(*receiver)
    if src.stop != dst.stop or seq < 1:
        return 0.0
    staged: dict = {}
    local_seq = seq // dst.tp if dst.sp else seq
    for tr in compute_transfers([src], [dst], (seq, dst.stop, 1)):
        rows, batch = tr.seq_stop - tr.seq_start, tr.batch_stop - tr.batch_start
        if batch == dst.micro_batch_size or rows == 1:
            continue                                  # one contiguous run of the buffer: received in place
        key = (tr.dst_tp, tr.dst_dp)
        staged[key] = staged.get(key, 0) + rows * batch
    return max(staged.values(), default=0) / (local_seq * dst.micro_batch_size)


class BoundarySides(NamedTuple):
    """What the two sides of an overlapped boundary hold besides their activations, per side (plan/pipeline.py
    `side_buffers` turns it into boundary tensors): the shares of a gradient (before) and an activation (after)
    message that land in pieces, whether each side keeps its sends in flight as its own memory (CPU processes:
    a send keeps its blocks, the stage's output or input gradient, until it completes; on an accelerator they
    are pinned host copies), and whether the side before rebuilds activations in its backward pass (recompute
    'selective' or 'full': the gradient it takes is then not held beside that buffer)."""
    grad_share: float = 0.0
    act_share: float = 0.0
    before_sends: bool = False
    after_sends: bool = False
    before_recomputes: bool = False


def boundary_staging(before, after, seq: int, before_on_cpu: bool, after_on_cpu: bool) -> BoundarySides:
    """BoundarySides of an overlapped boundary, `before` / `after` anything with `tp`, `dp`, `micro_batch_size`,
    `recompute` and `settings.sequence_parallel` (a plan Mesh, a StageProfile); a side whose processes do not run
    on CPU gets no pieces and no sends: they are pinned host memory, not the device's."""
    a = (before.tp, before.dp, before.micro_batch_size, before.settings.sequence_parallel)
    b = (after.tp, after.dp, after.micro_batch_size, after.settings.sequence_parallel)
    return BoundarySides(staged_fraction(b, a, seq) if before_on_cpu else 0.0,
                         staged_fraction(a, b, seq) if after_on_cpu else 0.0,
                         bool(before_on_cpu), bool(after_on_cpu), before.recompute != "none")
