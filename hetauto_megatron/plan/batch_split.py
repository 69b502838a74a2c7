"""Split a global batch across pipelines by their speed (plan format version 3, `pipelines[p].samples`).

Pipelines joined by data parallelism wait for each other at every iteration's gradient exchange, so an
iteration takes as long as the slowest pipeline. Pipeline p trains n_p micro-batch steps of `step_p` samples,
taking n_p * step_p * seconds_per_sample_p. `split_batch` picks the n_p >= 1 that sum exactly to the global
batch and minimise the largest of those times (an exact search, not rounding of the proportional shares, which
can miss the sum or leave a pipeline idle); among equally good splits it keeps each pipeline, in order, as
close as possible to its proportional share, so the result is deterministic.

Exactness: which totals a set of pipelines can make with 1..N_p steps each is a bounded coin problem, solved
with Python integers as bitsets (bit k set = total k reachable) and binary splitting of each count, so one
check costs O(pipelines * log(steps)) big-integer shifts; a binary search over the candidate iteration times
(every n * step_p * seconds_per_sample_p) finds the smallest feasible one.
"""
from __future__ import annotations

from ..errors import InputError


def _reach_with(reach: int, step: int, lo: int, hi: int, limit: int) -> int:
    """Totals reachable after adding lo..hi steps of `step` samples to each total in `reach` (capped at limit)."""
    mask = (1 << (limit + 1)) - 1
    reach = (reach << (lo * step)) & mask
    out, count, chunk = reach, hi - lo, 1
    while count > 0:   # binary splitting: chunks 1, 2, 4, ... then the rest cover every count 0..hi-lo
        take = min(chunk, count)
        out |= (out << (take * step)) & mask
        count -= take
        chunk *= 2
    return out


def _suffix_reach(steps, caps, limit: int) -> list[int]:
    """suffix[p] = totals pipelines p, p+1, ... can make with 1..caps[q] steps each; suffix[P] = {0}."""
    suffix = [1]
    for step, cap in zip(reversed(steps), reversed(caps)):
        suffix.append(_reach_with(suffix[-1], step, 1, cap, limit) if cap >= 1 else 0)
    return suffix[::-1]


def _nearest_possible(global_batch: int, steps) -> list[int]:
    """The totals closest below and above global_batch that positive multiples of the steps can make."""
    limit = 2 * global_batch + 2 * sum(steps)
    reach = _suffix_reach(steps, [limit // s for s in steps], limit)[0]
    below = [k for k in range(global_batch, -1, -1) if reach >> k & 1][:1]
    above = [k for k in range(global_batch + 1, limit + 1) if reach >> k & 1][:1]
    return below + above


def _least_feasible(steps, secs, caps, feasible) -> float:
    """The smallest of the candidate times n * step_p * t_p (1 <= n <= caps[p]) that is `feasible`, given that
    `feasible` is monotone (a later time allows at least as many steps) and holds at the largest candidate.
    Each pipeline's candidates rise with n, so its least feasible one is a binary search over n, and only a
    pipeline whose candidate just below the best found is feasible can lower it: a few dozen checks, where a
    binary search over every candidate sorted (a million per pipeline at a global batch of 1,000,000) took a tenth
    of a second per split."""
    best = max(cap * s * t for s, t, cap in zip(steps, secs, caps))
    for s, t, cap in zip(steps, secs, caps):
        lo, hi = 0, cap                 # the largest n whose candidate is below `best`
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if mid * s * t < best:
                lo = mid
            else:
                hi = mid - 1
        if hi < 1 or not feasible(hi * s * t):
            continue
        lo = 1                          # the least n up to it whose candidate is feasible
        while lo < hi:
            mid = (lo + hi) // 2
            if feasible(mid * s * t):
                hi = mid
            else:
                lo = mid + 1
        best = lo * s * t
    return best


def split_batch(global_batch: int, step_sizes, seconds_per_sample) -> list[int]:
    """Samples per iteration for each pipeline: multiples (>= 1) of its step size, summing exactly to
    `global_batch`, in proportion to its throughput (1 / seconds_per_sample) as far as the multiples allow, i.e.
    with the largest pipeline time n_p * step_p * seconds_per_sample_p as small as possible.

    InputError when no split exists (the global batch is smaller than one step per pipeline, or no sum of
    multiples of the step sizes makes it)."""
    steps, secs = [int(s) for s in step_sizes], [float(t) for t in seconds_per_sample]
    if len(steps) != len(secs) or not steps:
        raise ValueError("split_batch needs one step size and one seconds_per_sample per pipeline")
    if any(s < 1 for s in steps) or any(not t > 0 for t in secs):
        raise ValueError(f"step sizes must be >= 1 and times positive, got {steps} and {secs}")
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < sum(steps):
        raise InputError(f"global_batch_size {global_batch} is smaller than one micro-batch step of every pipeline "
                         f"({' + '.join(map(str, steps))} = {sum(steps)} samples)", field="global_batch_size",
                         fix=f"use a global batch of at least {sum(steps)}, or fewer pipelines")
    caps = [global_batch // s for s in steps]
    if not _suffix_reach(steps, caps, global_batch)[0] >> global_batch & 1:
        near = _nearest_possible(global_batch, steps)
        raise InputError(f"global_batch_size {global_batch} cannot be split into positive multiples of the "
                         f"pipelines' samples per micro-batch step ({', '.join(map(str, steps))})",
                         field="global_batch_size",
                         fix="use a global batch that such multiples add up to, e.g. "
                             + " or ".join(map(str, near)))
    # The smallest candidate iteration time (some n * step_p * t_p) at which n_p <= T / (step_p * t_p) still
    # reaches the global batch exactly.
    def caps_at(limit_t: float) -> list[int]:
        # The tiny relative slack keeps n at a candidate time that equals limit_t up to float rounding.
        return [min(cap, int(limit_t * (1 + 1e-12) / (s * t))) for s, t, cap in zip(steps, secs, caps)]

    best = caps_at(_least_feasible(steps, secs, caps,
                                   lambda t: _suffix_reach(steps, caps_at(t), global_batch)[0] >> global_batch & 1))
    suffix = _suffix_reach(steps, best, global_batch)
    # Walk the pipelines in order, each taking the feasible count closest to its proportional share.
    speed = [1 / (s * t) for s, t in zip(steps, secs)]   # steps per second
    total_t = global_batch / sum(sp * s for sp, s in zip(speed, steps))
    out, left = [], global_batch
    for p, (s, cap) in enumerate(zip(steps, best)):
        ideal = speed[p] * total_t
        ok = [n for n in range(1, cap + 1) if left - n * s >= 0 and suffix[p + 1] >> (left - n * s) & 1]
        n = min(ok, key=lambda k: (abs(k - ideal), k))
        out.append(n * s)
        left -= n * s
    assert left == 0
    return out
