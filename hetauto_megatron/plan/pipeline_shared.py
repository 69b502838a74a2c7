"""The 1F1B event simulation of plan/pipeline.py for pipelines whose boundaries share an uplink (pure functions).

The same rules as `pipeline.simulate_1f1b` (its docstring): every forward and backward in 1F1B order, each link
direction a resource of its own, blocking and overlapped boundaries. In addition, a transfer that crosses a
contended uplink direction (plan/shared_uplinks.py `contended`) holds it for its bytes at the uplink's rate, and
the transfers take each such direction one at a time, first come, first served. That needs the transfers in the
order they are due (data ready, link free), which the dependency order of the plain simulation does not give (it
runs a stage ahead of its neighbours). So here every stage runs as far as its inputs allow, and the waiting
transfers are started one at a time, the earliest due first: a transfer not yet created comes from an operation
that waits for one of those, so it is due later than all of them. A blocking transfer is due once its receive is
posted too (rendezvous, pipeline_calls.py): the receiver posts when its previous compute ends (a paired call) or
once it returned from it, after a transfer already started.
"""
from __future__ import annotations

import heapq

from .pipeline import Event, PipelineTimes, schedule_order
from .pipeline_calls import paired
from .shared_uplinks import Uplinks


def simulate_shared(f: list, b: list, x: list, lat: list, occ: list, blk: list, warm: tuple, m: int,
                    uplinks, record: bool) -> PipelineTimes:
    """The simulation of `pipeline.simulate_1f1b` (its arguments, checked there: per-micro-batch compute lists
    f, b; per boundary the transfer x, latency, occupancy, schedule; the warm-up counts) with `uplinks`, the
    contended directions (shared_uplinks.contended)."""
    p = len(f)
    last = p - 1
    orders = [schedule_order(i, p, m, warm[i]) for i in range(p)]
    ptr = [0] * p
    free = [0.0] * p                    # when stage i may start its next operation (once not held)
    held = [False] * p                  # waiting for its own blocking send to arrive
    f_arr = [[None] * m for _ in range(p)]    # when micro-batch j's activation is at stage i (None: not yet sent)
    b_arr = [[None] * m for _ in range(p)]
    f_arr[0] = [0.0] * m
    f_end = [[0.0] * m for _ in range(p)]     # when stage i finished micro-batch j's forward (its send is ready)
    b_end = [[0.0] * m for _ in range(p)]
    sent = {}                           # (stage receiving, "F" | "B", j) -> when the sender finished
    link_free = {}                      # (boundary, "fwd" | "bwd") -> when its link direction is next free
    finish = [0.0] * p
    ups = Uplinks()
    waiting = []                        # heap of transfers to start: (due, boundary, direction, j, sender), due
                                        # when its data is ready and, once known, its link direction free
    ev = [] if record else None
    sends = {}                          # blocking transfers by (stage receiving, "F" | "B", j): (ready, boundary,
    posts = {}                          # direction, sender); the receives posted by then: when
    met = {}                            # (boundary, direction, j) -> when a blocking transfer's rendezvous was

    def post(i, kind, j, t):
        """Stage i posts its receive of (kind, j) at t, where it crosses a blocking boundary."""
        if (i > 0 if kind == "F" else i < last) and blk[i - 1 if kind == "F" else i]:
            key = (i, kind, j)
            posts.setdefault(key, t)
            queue(key)

    def queue(key):
        if key in sends and key in posts:
            ready, l, d, sender = sends.pop(key)
            met[(l, d, key[2])] = due = max(ready, posts[key])
            heapq.heappush(waiting, (due, l, d, key[2], sender))

    def run(i):
        """Stage i's operations until one waits for an input (or its blocking send)."""
        while ptr[i] < 2 * m and not held[i]:
            kind, j = orders[i][ptr[i]]
            post(i, kind, j, free[i])   # (once returned from the previous call; a paired one posted earlier)
            ready = (f_arr if kind == "F" else b_arr)[i][j]
            if ready is None:
                return
            fr = free[i]
            start = max(fr, ready)
            end = start + (f[i][j] if kind == "F" else b[i][j])
            ptr[i] += 1
            free[i] = end
            if ptr[i] < 2 * m:          # the steady loop's calls post the next input's receive with this send
                nk, nj = orders[i][ptr[i]]
                if nk != kind and paired(nk == "F", nj, m, warm[i]):
                    post(i, nk, nj, end)
            if record:
                ev.append(Event(("stage", i), kind, j, start, end))
                if (i > 0) if kind == "F" else (i < last):
                    since = max(fr, sent.get((i, kind, j), fr))
                    if ready > since:
                        ev.append(Event(("stage", i), "recv", j, since, ready))
            if kind == "F" and i == last:
                b_arr[i][j] = end        # the loss is computed here: the backward may start at once
            elif kind == "F":
                f_end[i][j] = end
                held[i] = blk[i]
                if blk[i]:
                    sends[(i + 1, "F", j)] = (end, i, 0, i)
                    queue((i + 1, "F", j))
                else:
                    heapq.heappush(waiting, (end, i, 0, j, i))
            else:
                finish[i] = end
                if i:
                    b_end[i][j] = end
                    held[i] = blk[i - 1]
                    if blk[i - 1]:
                        sends[(i - 1, "B", j)] = (end, i - 1, 1, i)
                        queue((i - 1, "B", j))
                    else:
                        heapq.heappush(waiting, (end, i - 1, 1, j, i))

    for i in range(p):
        run(i)
    while waiting:
        due, l, d, j, sender = heapq.heappop(waiting)
        direction = "fwd" if d == 0 else "bwd"
        s = link_free.get((l, direction), 0.0)
        if s > due:     # its link is still busy: it queues for the uplinks once the link is free
            heapq.heappush(waiting, (s, l, d, j, sender))
            continue
        s = due
        if uplinks[l] and uplinks[l][d]:
            s = ups.book(uplinks[l][d], s)
        link_free[(l, direction)] = s + occ[l]
        a = s + x[l]
        to = l + 1 if d == 0 else l
        (f_arr if d == 0 else b_arr)[to][j] = a
        if record:
            ready = (f_end if d == 0 else b_end)[sender][j]
            sent[(to, "F" if d == 0 else "B", j)] = ready
            ev.append(Event(("link", l, direction), "F" if d == 0 else "B", j, s, s + occ[l], a))
            # the sender is held by its send from the rendezvous (then waiting only for its link and uplinks);
            # before it, it waits for the receiver's compute: the bubble, as in pipeline.simulate_1f1b
            if blk[l] and a > met[(l, d, j)]:
                ev.append(Event(("stage", sender), "send", j, met[(l, d, j)], a))
        if blk[l]:
            held[sender] = False
            free[sender] = a
            run(sender)
        run(to)
    if any(k < 2 * m for k in ptr):     # cannot happen for warm-ups that do not grow down the pipeline
        raise RuntimeError(f"1F1B schedule with warm-ups {warm} deadlocks")
    busy = tuple(sum(f[i]) + sum(b[i]) for i in range(p))
    if record:
        ev.sort(key=lambda e: (e.start, e.resource, e.kind))
    return PipelineTimes(max(finish), busy, tuple(finish), tuple(ev) if record else None)
