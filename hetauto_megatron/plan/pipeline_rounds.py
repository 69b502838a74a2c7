"""The 1F1B event simulation of plan/pipeline.py in rounds, jumping over its steady state (pure functions).

The same operations, rules and arithmetic as `pipeline.simulate_1f1b` (its docstring), for the search's case: one
compute time per stage (not per micro-batch), no shared uplink, no recorded events. They are visited in rounds
instead of a precomputed dependency order:

- warm-up: forward j = 0 .. w_0 - 1 on every stage that warms up with it, stage 0 first (stage i's forward of j
  needs stage i - 1's; a blocking transfer also needs its receiver back from its forward j - 1, whose
  recv_forward is a call of its own: the rendezvous of plan/pipeline_calls.py);
- round r = 0 .. m - w_0 - 1: from the last stage to the first, each runs the forward of micro-batch w_i + r and
  the backward of r. The forward needs stage i - 1's forward of w_i + r, done in an earlier round since the
  warm-ups fall by at least one per stage; the backward needs stage i + 1's backward of r, done just before.
  On a blocking boundary i the two transfers of stage i's and stage i + 1's paired calls (the forward of w_i + r
  and the backward of r) are made once both computes are done;
- the drain: what is left (stage i's last w_0 - w_i pairs and its w_i backwards), in the order of
  `pipeline_calls.call_walk`, started where the rounds stopped.

Why rounds: every operation is a max of its inputs plus a constant (max-plus linear), so one round maps the state
the next rounds read (when each stage is free, when each link direction is free, the activations already sent
ahead) to the next state by a fixed map that commutes with adding a constant to every time. Once one round adds
the same amount to every part of the state, every later round adds it again: the schedule is periodic, and the
rounds up to the drain are a jump, not a loop. Exact up to rounding (a round-off of about 1e-12 of the iteration
time where the loop would add up the same period again and again). When no round repeats the one before (a
schedule whose period spans several rounds), every round is simulated. A pipeline with many micro-batches thus
costs O(stages x (stages + transient rounds)) instead of O(stages x micro-batches): a global batch of 16,384
on the GPT-3 example has thousands of micro-batches per pipeline and this is most of a search's time.
"""
from __future__ import annotations

import math
from functools import lru_cache

from . import pipeline_calls as calls

# A round that adds the same amount to every part of the state within this share of the amount repeats (float
# round-off in times of ~1e3 s is ~1e-13 s; a period is >= ~1e-6 s).
SAME_STEP = 1e-9
MIN_ROUNDS = 8          # fewer rounds than this: nothing to jump over
CHECK_EVERY = 16        # rounds between two looks at whether the makespan is proven above a caller's bound
# From SPARSE_FROM x stages^2 micro-batches on, the arrival times are kept in a dict of those written, not a list of
# stages x micro-batches: the rounds touch O(stages x (stages + transient)) of them, and at a global batch of
# 1,000,000 allocating and freeing lists of millions of zeros was most of a simulation's time (with fewer, the list
# is faster: a dict's reads cost more, and a long transient makes many of them).
SPARSE_FROM = 32


class _Zeros(dict):
    """Arrival times by index, for many micro-batches: an index never written reads 0.0, as in the list."""
    __slots__ = ()

    def __missing__(self, key):
        return 0.0


def _times(p: int, m: int):
    """p x m arrival times, all 0.0: a list, or for many micro-batches a `_Zeros`."""
    return _Zeros() if m >= SPARSE_FROM * p * p else [0.0] * (p * m)


def _window(arr, lo: int, hi: int) -> list:
    """arr[lo:hi] as a list (either kind of `_times`)."""
    return arr[lo:hi] if isinstance(arr, list) else [arr[k] for k in range(lo, hi)]


def usable(warm: tuple, m: int) -> bool:
    """Whether `simulate_rounds` applies (given one compute time per stage): warm-ups not capped by m (so they fall
    by at least one per stage) and enough rounds to be worth it."""
    return m - warm[0] >= MIN_ROUNDS and all(warm[i - 1] > warm[i] for i in range(1, len(warm)))


def simulate_rounds(f: list, b: list, x: list, occ: list, blk: list, warm: tuple, m: int,
                    above: float = math.inf) -> tuple | None:
    """(makespan, finish per stage) of `pipeline.simulate_1f1b` with f[i], b[i] one compute time per stage; x,
    occ, blk per boundary (the transfer with its latency, the link occupancy, blocking); warm: the warm-up
    forwards per stage (`usable` holds). None once the makespan is proven above `above` (`_beyond`): a caller
    that only needs to know whether it beats `above` is spared the rest of a long transient."""
    p = len(f)
    last = p - 1
    free = [0.0] * p
    f_arr = _times(p, m)                # [i * m + j]: when micro-batch j's activation is at stage i
    b_arr = _times(p, m)
    link_f = [0.0] * p
    link_b = [0.0] * p
    finish = [0.0] * p
    done = [0.0] * p                    # when stage i's last compute ended (a paired call posts its receive then)
    sent_f = [0.0] * p                  # when stage i's forward / backward whose blocking transfer is still to come
    sent_b = [0.0] * p                  # ended

    def forward(i, j):
        k = i * m + j
        fr, ready = free[i], f_arr[k]
        done[i] = end = (fr if fr > ready else ready) + f[i]
        free[i] = end
        if i == last:
            b_arr[k] = end
        elif blk[i]:
            sent_f[i] = end             # its transfer waits for the receive (send_f)
        else:
            s = end if end > link_f[i] else link_f[i]
            link_f[i] = s + occ[i]
            f_arr[k + m] = s + x[i]

    def backward(i, j):
        k = i * m + j
        fr, ready = free[i], b_arr[k]
        done[i] = end = (fr if fr > ready else ready) + b[i]
        finish[i] = end
        free[i] = end
        if i:
            if blk[i - 1]:
                sent_b[i] = end
            else:
                s = end if end > link_b[i - 1] else link_b[i - 1]
                link_b[i - 1] = s + occ[i - 1]
                b_arr[k - m] = s + x[i - 1]

    def send_f(i, j, post):
        """The blocking transfer of stage i's forward j, its receive posted at `post` (pipeline_calls.py)."""
        s = sent_f[i]
        if post > s:
            s = post
        if link_f[i] > s:
            s = link_f[i]
        link_f[i] = s + occ[i]
        free[i] = f_arr[(i + 1) * m + j] = s + x[i]

    def send_b(i, j, post):
        s = sent_b[i]
        if post > s:
            s = post
        if link_b[i - 1] > s:
            s = link_b[i - 1]
        link_b[i - 1] = s + occ[i - 1]
        free[i] = b_arr[(i - 1) * m + j] = s + x[i - 1]

    # warm-up: stage i's forward j is received by an unpaired recv_forward, posted once stage i + 1 returned from
    # its forward j - 1 (done in the pass of j - 1, with its own transfer)
    for j in range(warm[0]):
        for i in range(p):
            if j < warm[i]:
                forward(i, j)
                if i < last and blk[i]:
                    send_f(i, j, free[i + 1])

    def state(r):
        """What round r + 1 onwards reads, after round r: free stages and link directions, and the activations
        stage i - 1 has sent ahead of stage i (micro-batches w_i + r + 1 .. w_{i-1} + r)."""
        s = free + link_f[:last] + link_b[:last]
        for i in range(1, p):
            s.extend(_window(f_arr, i * m + warm[i] + r + 1, i * m + warm[i - 1] + r + 1))
        return s

    rounds = m - warm[0]
    # the states after the last rounds, for a schedule whose period spans c rounds: its slowest cycle (a run of
    # stages, pipeline.py) spans up to w_0 + 1 of them
    longest = warm[0] + 1
    seen: list = []
    r = 0
    while r < rounds:
        for i in range(last, -1, -1):
            forward(i, warm[i] + r)
            if i < last and blk[i]:
                # the paired calls of boundary i: stage i's send_forward_recv_backward and stage i + 1's
                # send_backward_recv_forward, each posted when its compute ended, wait for both transfers
                send_f(i, warm[i] + r, done[i + 1])
                send_b(i + 1, r, done[i])
            backward(i, r)
        if r + 2 < rounds:
            now = state(r)
            c = _repeats(now, seen, longest)
            if c:
                # after round r the state is the one c rounds earlier plus `step`: so every c rounds from here on
                n = (rounds - 2 - r) // c * c
                step = [a - e for a, e in zip(now, seen[-c])]
                _jump(r, n, n // c, step, free, link_f, link_b, f_arr, warm, m)
                r += n + 1
                seen.clear()
                continue
            if above < math.inf and len(seen) >= CHECK_EVERY and r % CHECK_EVERY == 0 \
                    and _beyond(now, seen, r, rounds, f, b, warm, above):
                return None
            seen.append(now)
            if len(seen) > longest:
                del seen[0]
        r += 1
    _drain(p, m, warm, blk, rounds, forward, backward, send_f, send_b, free, done)
    return max(finish), tuple(finish)


def _beyond(now: list, seen: list, r: int, rounds: int, f: list, b: list, warm: tuple, above: float) -> bool:
    """Whether the makespan is proven above `above` from the state after round r (`now`) and the one c rounds
    earlier (seen[-c], c = len(seen)). The round map is max-plus linear: monotone, and adding a constant to every
    time adds it to the result. So if every part grew by at least delta over those c rounds, it grows by at least
    delta over every c rounds from there (s_{q+c} >= s_q + delta gives s_{q+2c} >= s_{q+c} + delta), and stage
    i, free at free_i after round t = r - c + k c (the last such round), still runs its f_i + b_i in each later
    round and (w_0 - w_i) forwards and w_0 backwards in the drain: the makespan is at least their sum."""
    c = len(seen)
    old = seen[-c]
    delta = min([a - e for a, e in zip(now, old)])
    if delta <= 0:
        return False
    k = (rounds - 1 - r + c) // c
    left = rounds - 1 - (r - c + k * c)
    w0 = warm[0]
    lb = max([old[i] + k * delta + left * (f[i] + b[i]) + (w0 - warm[i]) * f[i] + w0 * b[i]
              for i in range(len(f))])
    return lb > above + 1e-9 * abs(above)


def _repeats(now: list, seen: list, longest: int) -> int:
    """The smallest c <= `longest` such that `now` is the state c rounds earlier (seen[-c]) with the same positive
    amount added to every part (0: none). The first and last parts are compared first: most c fail there."""
    for c in range(1, min(len(seen), longest) + 1):
        old = seen[-c]
        lam = now[0] - old[0]
        tol = SAME_STEP * lam
        if lam <= 0 or abs(now[-1] - old[-1] - lam) > tol:
            continue
        if all(abs(a - e - lam) <= tol for a, e in zip(now, old)):
            return c
    return 0


def _jump(r: int, n: int, times: int, step: list, free, link_f, link_b, f_arr, warm: tuple, m: int) -> None:
    """Move the state after round r to the state after round r + n, in place: each part plus `times` x its step
    (the change over one period of the schedule, n = `times` periods)."""
    if n <= 0:
        return
    p = len(free)
    last = p - 1
    it = iter(step)
    for arr, count in ((free, p), (link_f, last), (link_b, last)):
        for i in range(count):
            arr[i] += times * next(it)
    for i in range(1, p):
        lo, hi = i * m + warm[i] + r + 1, i * m + warm[i - 1] + r + 1
        moved = [f_arr[k] + times * next(it) for k in range(lo, hi)]
        if isinstance(f_arr, list):
            f_arr[lo + n:hi + n] = moved
        else:
            for k, t in enumerate(moved, lo + n):
                f_arr[k] = t


def _drain(p: int, m: int, warm: tuple, blk: list, rounds: int, forward, backward, send_f, send_b, free,
           done) -> None:
    """The steps after the rounds, in a dependency order (`_drain_order`). A blocking transfer's receive is posted
    when the receiver's last compute ended (paired) or once it returned (`free`)."""
    for i, code, j, pair in _drain_order(p, m, warm, tuple(blk), rounds):
        if code == calls.COMPUTE_F:
            forward(i, j)
        elif code == calls.COMPUTE_B:
            backward(i, j)
        else:
            r = i + 1 if code == calls.SEND_F else i - 1
            (send_f if code == calls.SEND_F else send_b)(i, j, done[r] if pair else free[r])


@lru_cache(maxsize=256)
def _drain_order(p: int, m: int, warm: tuple, blk: tuple, rounds: int) -> tuple:
    """`pipeline_calls.call_walk` from the end of the rounds: stage i has computed (and returned from) w_i + 2 x
    rounds operations, received w_{i-1} + rounds forwards and `rounds` backwards. Cached: layouts of one stage
    count and warm-up share it."""
    done = ([warm[i] + 2 * rounds for i in range(p)], [m] + [warm[i - 1] + rounds for i in range(1, p)],
            [rounds] * p)
    return tuple(calls.call_walk(p, m, warm, blk, done))
