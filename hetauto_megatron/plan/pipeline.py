"""1F1B pipeline timing over stages of different speeds joined by links of different speeds (pure functions).

`simulate_1f1b` is the event-level simulation: every forward/backward of every micro-batch on every stage, and
every transfer on every link, in Megatron's non-interleaved 1F1B order (stage i runs w_i warm-up forwards,
then alternates one forward and one backward, then drains its backwards). It prices what the runtime does:

- An operation starts when its stage is free and its input has arrived.
- A link is a resource of its own, one per direction (links are full duplex). One micro-batch's transfer
  occupies its direction for `link - latency` seconds (the bytes at the link's bandwidth) and arrives
  `latency` seconds later; transfers in one direction queue in micro-batch order, so a link slower than
  the stages around it is a pipeline stage of its own (docs/inputs.md: a link's bandwidth is shared by
  every flow crossing it; one transfer at a time at the full bandwidth finishes the queue at the same time
  as sharing it would, and each transfer no later).
- A middle cluster's uplink (`uplink_gbps`), which the two boundaries through it share, is a resource too where
  their transfers can need more than all of it: there a transfer starts only when its link direction and that
  uplink direction are free, and holds the uplink for its bytes at the uplink's rate (plan/shared_uplinks.py).
- Boundary schedules, per boundary l (between stages l and l + 1):
  blocking   (Megatron's native P2P, and every boundary inside a cluster): the sending stage is held until its
             transfer has arrived (the runtime waits for every send, including a synchronous device-to-host
             copy on the cross-cluster path), then runs its next operation;
  overlapped (the asynchronous cross-cluster communicator): the send is posted and the stage goes on at once;
             receives are posted early, so the receiver waits only if the data has not arrived when it needs
             it. Its depth d_l adds d_l warm-up forwards to every stage before the boundary, so d_l more
             micro-batches are in flight across the link (the link acts as d_l virtual stages):
                 w_i = min(m, p - i - 1 + sum_{l >= i} d_l)
  A blocking transfer is a rendezvous (gloo, and NCCL for large messages, move a message only once its receive
  is posted): it starts once the sender has posted its send, the receiver its receive and its link direction is
  free. Megatron's steady state pairs each send with the neighbour's matching receive
  (send_forward_recv_backward with send_backward_recv_forward, each posted when its compute ends); its warm-up,
  loop entry and cool-down receive in calls of their own, posted only once the stage's previous call returned,
  so there the transfer cannot start before the receiver is idle (plan/pipeline_calls.py says which is which and
  orders the simulation's steps).

The operations are visited in a dependency order computed once per pipeline shape (cached), then each costs a few
additions in a tight loop (~1 µs per operation). Where every micro-batch of a stage takes the same time and no
events are recorded (the search), plan/pipeline_rounds.py visits them in rounds and jumps over the steady state
once a round repeats the one before, exactly (max-plus linear): O(stages x (stages + transient)), not O(stages x
micro-batches).

`estimate_1f1b` is the closed form the search screens candidates with (no events):
    T = sum_i (f_i + b_i) + sum_l 2 x_l + (m - 1) * P
where P, the steady-state period, is the slowest cycle of the schedule's dependency graph: every overlapped
link direction alone (its occupancy per micro-batch), and every run of stages i..k,
    (sum_{q=i..k} (f'_q + b'_q) + 2 sum_{overlapped links inside} x_l) / min(w_i - w_k + 1, m)
with f'_q, b'_q the compute plus the blocking sends that hold stage q, plus its rendezvous waits (the whole
blocking link before each receive called on its own: min(w_q, m - 1) activations and w_q gradients) spread
over the m - 1 periods. A run is a cycle because 1F1B lets stage i
start the forward of micro-batch j + (w_i - w_k + 1) only after the backward of micro-batch j came back
through stages k..i: with k = i it is the stage itself, with k = p - 1 the in-flight window of stage i, and a
slow link inside a run is why it costs time even when its bandwidth is not the bottleneck. A stage whose
warm-up takes every micro-batch (w_i = m) runs no forward after a backward, so a run from it closes no cycle:
only its own work counts. (Counting those runs too, as the closed form did before, charged a pipeline with
fewer micro-batches than its first stage's warm-up a whole run of stages per micro-batch: with fewer than the
stages 67 % above the simulation at the median, 220 % at worst; then 3.7 % and 20 %, 6.3 % and 28 % since the
rendezvous waits count; benchmarks/closed_forms.py prints the figures by regime.) The closed form never
undercuts the event simulation on the tests' random cases (32-128 micro-batches) and is within a few % of it
once m >= 32; it is a bound of those cases, not of every pipeline (a wider draw with few micro-batches and
mixed boundaries found 85 of 20,000 below it, by up to 6.3 %; 609 and 15.5 % before the rendezvous was priced),
which is why the search re-ranks its best candidates with the event simulation.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numbers

from . import pipeline_calls as calls
from . import pipeline_rounds as rounds
from .shared_uplinks import contended, uplink_period, with_waits


@dataclass(frozen=True)
class Event:
    """One operation of the simulated iteration (`simulate_1f1b(..., record=True)`), times in seconds.

    resource: ("stage", i) for pipeline stage i, or ("link", l, "fwd" | "bwd") for the link between stages l and
              l + 1 in the direction of the activations ("fwd") or of their gradients ("bwd").
    kind:     on a stage: "F" / "B" (forward / backward compute), "send" (held by a send it does not overlap, once
              its receive is posted: the wait for that is idle), "recv" (waiting for data still on its link);
              on a link: "F" / "B" (the micro-batch's activation / gradient occupying the link from `start` to
              `end`; it reaches the other side at `arrival`, `end` plus the latency).
    Events of one resource never overlap.
    """
    resource: tuple
    kind: str
    micro_batch: int
    start: float
    end: float
    arrival: float | None = None    # link transfers only


@dataclass(frozen=True)
class PipelineTimes:
    makespan: float                 # end of the last backward
    busy: tuple[float, ...] | None  # compute seconds per stage (None: not asked for, simulate_1f1b's with_busy)
    finish: tuple[float, ...]       # when each stage ran its last backward
    events: tuple[Event, ...] | None = None   # every operation, when simulated with record=True


def warmup_forwards(p: int, depth=None) -> tuple[int, ...]:
    """The warm-up rule, before the cap at the micro-batch count: per stage, the stages after it plus the depth
    of every overlapped boundary after it (`depth`: per boundary, 0 where blocking). The runtime hands it to
    Megatron's 1F1B, which caps it itself (runtime/communicator.py `total_stages`)."""
    d = list(depth) if depth is not None else [0] * max(p - 1, 0)
    out, after = [0] * p, 0
    for i in range(p - 1, -1, -1):
        if i < p - 1:
            after += d[i]
        out[i] = p - i - 1 + after
    return tuple(out)


def warmup_counts(p: int, m: int, depth=None) -> tuple[int, ...]:
    """Warm-up forwards per stage of 1F1B with `m` micro-batches: `warmup_forwards`, at most m."""
    return tuple(min(m, w) for w in warmup_forwards(p, depth))


def schedule_order(stage: int, p: int, m: int, warm: int | None = None) -> list[tuple[str, int]]:
    warm = min(p - stage - 1, m) if warm is None else warm
    ops = [("F", j) for j in range(warm)]
    for j in range(m - warm):
        ops.append(("F", warm + j))
        ops.append(("B", j))
    ops += [("B", j) for j in range(m - warm, m)]
    return ops


@lru_cache(maxsize=512)
def _call_order(p: int, m: int, warm: tuple, blocking: tuple) -> tuple:
    """The simulation's steps (pipeline_calls.call_walk: computes, and blocking transfers apart), ordered so every
    input is known before it is used and each stage keeps its 1F1B order. Any such order gives the same times."""
    out = tuple(calls.call_walk(p, m, warm, blocking))
    if sum(1 for s in out if s[1] < calls.SEND_F) < 2 * p * m:   # cannot happen for warm-ups that do not grow
        raise RuntimeError(f"1F1B schedule with warm-ups {warm} deadlocks")   # down the pipeline
    return out


def _boundaries(p, link, latency, blocking, depth):
    n = max(p - 1, 0)
    x = [float(v) for v in link]
    lat = [0.0] * n if latency is None else [float(v) for v in latency]
    blk = [True] * n if blocking is None else [bool(v) for v in blocking]
    d = [0] * n if depth is None else [int(v) for v in depth]
    assert len(x) == len(lat) == len(blk) == len(d) == n
    assert all(0 <= a <= t for a, t in zip(lat, x)) and all(v >= 0 for v in d)
    assert not any(b and v for b, v in zip(blk, d)), "a blocking boundary has no extra warm-up depth"
    return x, lat, blk, d


def simulate_1f1b(fwd, bwd, link, m: int, *, latency=None, blocking=None, depth=None, uplinks=None,
                  record: bool = False, above: float = math.inf, with_busy: bool = True) -> PipelineTimes | None:
    """fwd[i], bwd[i]: per-micro-batch compute seconds of stage i (or a sequence of m: micro-batch j's own time,
    to replay measured operations); link[l]: one micro-batch's transfer time
    between stage l and l + 1 (latency included); latency[l]: the part of it that does not occupy the link
    (default 0); blocking[l]: the boundary's schedule (default True: blocking); depth[l]: extra warm-up
    micro-batches of an overlapped boundary (default 0); uplinks[l]: the shared uplink directions its transfers
    also occupy (plan/shared_uplinks.py `boundary_uplinks`; default none). record=True also returns every
    operation's start and end (`PipelineTimes.events`, see `Event`). `above`: a makespan the caller only needs
    beaten; where the simulation runs in rounds and proves the makespan above it, the answer is None (the rest of
    the rounds not run). `with_busy=False`: the caller reads no `busy` (None then; each stage's sum over its m
    compute times is not taken)."""
    p = len(fwd)
    assert len(bwd) == p and len(link) == p - 1 and m >= 1
    x, lat, blk, d = _boundaries(p, link, latency, blocking, depth)
    occ = [a - b for a, b in zip(x, lat)]
    assert uplinks is None or len(uplinks) == p - 1
    busy = contended(uplinks, occ)
    warm = warmup_counts(p, m, d)
    if not busy and not record and rounds.usable(warm, m) \
            and all(isinstance(v, numbers.Real) for v in (*fwd, *bwd)):
        # the search's case: the same operations, jumping over the steady state (plan/pipeline_rounds.py); one
        # compute time per stage, so no list of m of them (at a global batch of 1,000,000 building and adding
        # those lists took most of a search)
        f1, b1 = [float(v) for v in fwd], [float(v) for v in bwd]
        out = rounds.simulate_rounds(f1, b1, x, occ, blk, warm, m, above)
        if out is None:
            return None
        makespan, finish = out
        return PipelineTimes(makespan, tuple(_repeated_sum(f1[i], m) + _repeated_sum(b1[i], m) for i in range(p))
                             if with_busy else None, finish)
    f = [_per_micro_batch(v, m) for v in fwd]
    b = [_per_micro_batch(v, m) for v in bwd]
    if busy:        # transfers sharing an uplink must be started in the order they are due: its own loop
        from .pipeline_shared import simulate_shared
        out = simulate_shared(f, b, x, lat, occ, blk, warm, m, busy, record)
        return out if with_busy else PipelineTimes(out.makespan, None, out.finish, out.events)
    order = _call_order(p, m, warm, tuple(blk))
    free = [0.0] * p                    # when stage i may start its next operation
    done = [0.0] * p                    # when stage i's last compute ended (a paired call posts its receive then)
    f_arr = [0.0] * (p * m)             # [i * m + j]: when micro-batch j's activation is at stage i
    b_arr = [0.0] * (p * m)             # ... its gradient
    f_sent = [0.0] * (p * m)            # when the sender finished the data now travelling to stage i
    b_sent = [0.0] * (p * m)
    link_f = [0.0] * p                  # when link l is next free, activation direction
    link_b = [0.0] * p
    finish = [0.0] * p
    last = p - 1
    ev = [] if record else None
    for i, code, j, pair in order:
        k = i * m + j
        if code >= calls.SEND_F:        # a blocking transfer: once sent, received and its link direction free
            fw = code == calls.SEND_F
            l, r = (i, i + 1) if fw else (i - 1, i - 1)
            sent = (f_sent if fw else b_sent)[r * m + j]
            post = done[r] if pair else free[r]
            s = sent if sent > post else post
            lf = link_f if fw else link_b
            if lf[l] > s:
                s = lf[l]
            lf[l] = s + occ[l]
            a = s + x[l]
            (f_arr if fw else b_arr)[r * m + j] = a
            free[i] = a
            if record:
                ev.append(Event(("link", l, "fwd" if fw else "bwd"), "F" if fw else "B", j, s, lf[l], a))
                met = sent if sent > post else post     # held from the rendezvous on: waiting for it is the bubble
                if a > met:
                    ev.append(Event(("stage", i), "send", j, met, a))
            continue
        fw = code == calls.COMPUTE_F
        fr = free[i]
        if fw:
            ready = f_arr[k]
            start = fr if fr > ready else ready
            end = start + f[i][j]
            if i == last:
                b_arr[k] = end            # the loss is computed here: the backward may start at once
                free[i] = end
            else:
                f_sent[k + m] = end
                free[i] = end
                if not blk[i]:            # overlapped: posted at once, its receive posted ahead
                    s = end if end > link_f[i] else link_f[i]
                    link_f[i] = s + occ[i]
                    a = s + x[i]
                    f_arr[k + m] = a
                    if record:
                        ev.append(Event(("link", i, "fwd"), "F", j, s, link_f[i], a))
        else:
            ready = b_arr[k]
            start = fr if fr > ready else ready
            end = start + b[i][j]
            finish[i] = end
            free[i] = end
            if i:
                b_sent[k - m] = end
                if not blk[i - 1]:
                    s = end if end > link_b[i - 1] else link_b[i - 1]
                    link_b[i - 1] = s + occ[i - 1]
                    a = s + x[i - 1]
                    b_arr[k - m] = a
                    if record:
                        ev.append(Event(("link", i - 1, "bwd"), "B", j, s, link_b[i - 1], a))
        done[i] = end
        if record:
            ev.append(Event(("stage", i), "F" if fw else "B", j, start, end))
            # waiting for data that is on its way (sent, queued or on the wire) is exposed communication
            if (i > 0) if fw else (i < last):
                since = max(fr, (f_sent if fw else b_sent)[k])
                if ready > since:
                    ev.append(Event(("stage", i), "recv", j, since, ready))
    busy = tuple(sum(f[i]) + sum(b[i]) for i in range(p)) if with_busy else None
    if record:
        ev.sort(key=lambda e: (e.start, e.resource, e.kind))
    return PipelineTimes(max(finish), busy, tuple(finish), tuple(ev) if record else None)


@lru_cache(maxsize=1 << 14)
def _repeated_sum(x: float, m: int) -> float:
    """sum([x] * m) without the list: the same m additions (`sum` compensates float round-off, so a product
    would differ in the last bits). Cached: a search simulates the same stage times at several depths and
    layouts, and at a million micro-batches one sum takes tens of milliseconds."""
    return sum(itertools.repeat(x, m))


def _per_micro_batch(v, m: int) -> list[float]:
    if isinstance(v, numbers.Real):     # (numpy floats too, without importing numpy for them)
        return [float(v)] * m
    out = [float(x) for x in v]
    assert len(out) == m, "one compute time per micro-batch"
    return out


def estimate_1f1b(fwd, bwd, link, m: int, *, latency=None, blocking=None, depth=None, uplinks=None,
                  rendezvous: bool = True) -> float:
    """The closed form (module docstring): sum of the stages + the links both ways + (m - 1) x the period, which
    is also at least the busiest shared uplink direction's time per micro-batch (`uplinks`, as simulate_1f1b).
    Plain loops, O(p) per pass (`_run_period`): at the search's 2-100 stages they are several times faster than
    evaluating every run of stages with numpy. rendezvous=False leaves out the waits of Megatron's receives called
    on their own (`_rendezvous_waits`): DeepSpeed's screen, on deepspeed_links, already holds both stages for
    every transfer."""
    first, period = closed_form_terms(fwd, bwd, link, m, latency, blocking, depth, uplinks, rendezvous)[:2]
    return first + (m - 1) * period


def closed_form_terms(fwd, bwd, link, m: int, latency=None, blocking=None, depth=None, uplinks=None,
                      rendezvous: bool = True) -> tuple:
    """estimate_1f1b's terms (its arguments): (the first micro-batch's round trip, the period, per boundary the
    link time with its wait for contended uplinks, per stage its compute plus the blocking sends that hold it,
    per stage that plus its rendezvous waits per period: what the period's runs add up)."""
    p = len(fwd)
    busy = contended(uplinks, link, latency)
    if busy:            # each transfer's possible wait for the others on a contended uplink direction
        link = with_waits(link, busy)
    stage = [f + b for f, b in zip(fwd, bwd)]
    gain = [0.0] * p                        # per boundary: 2 x_l if overlapped
    extra = [0] * p if depth is None else list(depth) + [0]    # per boundary: its depth d_l
    period_link = 0.0
    overlapped = []
    for l, x in enumerate(link):
        if blocking is None or blocking[l]:
            stage[l] += x                   # a blocking forward send holds the sender until it has arrived
            stage[l + 1] += x               # and so does the gradient sent back
        else:
            gain[l] = 2 * x
            overlapped.append(l)
            occ = x - (0.0 if latency is None else latency[l])
            if occ > period_link:
                period_link = occ
    held = list(stage)
    if m > 1 and rendezvous:
        _rendezvous_waits(stage, link, m, blocking, extra[:p - 1])
    period = _run_period(stage, gain, extra, m, overlapped)
    if busy:
        period_link = max(period_link, uplink_period(busy))
    first = sum(fwd) + sum(bwd) + 2 * sum(link)
    return first, (period if period > period_link else period_link), link, held, stage


def _rendezvous_waits(stage: list, link, m: int, blocking, depth) -> None:
    """Add to each stage's time per period (in place) its rendezvous waits. A receive Megatron calls on its own,
    after the previous operation returned (the warm-up's and loop entry's recv_forward, the cool-down's
    recv_backward), starts its transfer only then (pipeline_calls.py), so stage q waits a whole blocking link for
    each: min(w_q, m - 1) x_{q-1} + w_q x_q over the iteration, spread over the m - 1 periods. Counted in full:
    charging only what the round trip's idle time does not already cover undercut the event simulation on
    random pipelines (by up to 2.8 %), where the warm-up's receives chain the stages before a deep boundary."""
    p = len(stage)
    w = warmup_counts(p, m, depth)
    for q in range(p):
        if q and (blocking is None or blocking[q - 1]):
            stage[q] += min(w[q], m - 1) * link[q - 1] / (m - 1)
        if q < p - 1 and (blocking is None or blocking[q]):
            stage[q] += w[q] * link[q] / (m - 1)


def _run_period(stage: list, gain: list, extra: list, m: int, overlapped: list) -> float:
    """max over runs of stages i <= k of N(i, k) / D(i, k), the runs' part of the period (module docstring):
    N(i, k) = sum_{q=i..k} stage_q + sum_{l=i..k-1} gain_l (gain: 2 x_l on overlapped boundaries) and
    D(i, k) = min(w_i - w_k + 1, m), w_i = min(m, u_i), u_i = p - 1 - i + sum_{l >= i} extra_l.

    Stages with u_i >= m (a prefix, F) have w_i = m: all their forwards come before their first backward, so a
    run from one of them closes no cycle and only their single-stage runs count. Runs starting after F have
    D = u_i - u_k + 1 (<= m), the weight of their stages (1 each) and boundaries (extra_l each): N / D is then a
    mediant, at most the largest of the stages' and boundaries' own ratios, so the single stages (D = 1) decide
    unless a boundary's gain beats its weight at that ratio; then Dinkelbach's iteration finds the best run
    exactly: for a ratio r, max_{i <= k} N - r D = max_k (G_k + r u_k) - min_{i <= k} (H_i + r u_i) - r
    (N = G_k - H_i) is one pass, and the run attaining it has a larger ratio unless r is already the maximum. `overlapped`: the boundaries
    that may have a gain (the blocking ones have none), all a boundary check need look at."""
    p = len(stage)
    best = max(stage)                       # the runs of one stage
    if p - 1 + sum(extra) < m and not any(gain[l] > best * extra[l] for l in overlapped):
        return best                         # no F, and no boundary beats the best single stage
    u = [0] * p
    acc = 0
    for i in range(p - 2, -1, -1):
        acc += 1 + extra[i]
        u[i] = acc
    G, H = [0.0] * p, [0.0] * p            # N(i, k) = G[k] - H[i]
    h = 0.0
    for q in range(p):
        H[q] = h
        G[q] = g = h + stage[q]
        h = g + gain[q]
    front = 0                               # |F|
    while front < p and u[front] >= m:
        front += 1
    # A run from a stage of F closes no cycle: such a stage runs all m forwards before its first backward, and
    # the forward its cycle ends with (micro-batch j + m + 1) does not exist.
    if not any(gain[l] > best * extra[l] for l in overlapped if l >= front):
        return best                         # no boundary after F beats the best single stage
    for _ in range(64):                     # Dinkelbach: a handful of passes
        lo_val, lo_i = math.inf, front
        top, i, k = -math.inf, None, None
        for q in range(front, p):
            ru = best * u[q]
            y = H[q] + ru
            if y < lo_val:
                lo_val, lo_i = y, q
            v = G[q] + ru - lo_val
            if v > top:
                top, i, k = v, lo_i, q
        r = (G[k] - H[i]) / (u[i] - u[k] + 1)
        if not r > best:
            break
        best = r
    return best

