"""The all-gather after a boundary: a receiving rank without sequence parallelism gets from the boundary only its
own range of sequence positions (transfers.py cuts each block to cross once) and takes the others' from the
other TP ranks of its replica, over its own TP group (the mesh's fast backend, not the boundary's link)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .transfers import owned_seq_range


def allgather_seq(buf, tp: int, me: int, group) -> int:
    """Fill `buf` (seq, batch, hidden), of which TP rank `me` of `tp` holds its own positions, with every rank's;
    returns the bytes this rank sent."""
    if tp == 1:
        return 0
    seq = buf.shape[0]
    ranges = [owned_seq_range(t, tp, seq) for t in range(tp)]
    mine = buf[ranges[me][0]:ranges[me][1]]
    if seq % tp == 0:
        outs = [torch.empty_like(mine) for _ in range(tp)]
        dist.all_gather(outs, mine.contiguous(), group=group)
        for t, (lo, hi) in enumerate(ranges):
            if t != me:
                buf[lo:hi] = outs[t]
    else:       # uneven ranges: all_gather needs equal parts, so each rank broadcasts its own
        for t, (lo, hi) in enumerate(ranges):
            part = buf[lo:hi].contiguous()
            dist.broadcast(part, src=dist.get_global_rank(group, t), group=group)
            buf[lo:hi] = part
    return mine.numel() * mine.element_size() * (tp - 1)
