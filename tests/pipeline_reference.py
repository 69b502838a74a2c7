"""A brute-force reference for the 1F1B simulator (tests only): a discrete-time state machine.

Independent of plan/pipeline.py's formulation (a dependency order and a longest-path pass): time advances one
tick at a time; at every tick each link direction starts its oldest queued transfer when it is free, stages
finish, hand data to their links and start whatever their 1F1B order allows. All durations are whole ticks, so
the answer is exact. The rules are the ones documented in plan/pipeline.py: a stage runs one operation at a
time in its 1F1B order (w_i warm-ups); a transfer occupies its link direction for `occ` ticks and arrives
`lat` ticks after that; a blocking boundary holds the sender until its transfer has arrived. A stage's forward
or backward cost is one number, or a list with each micro-batch's own.

Rendezvous (gloo, and NCCL for large messages, move a message only once its receive is posted): a transfer on a
blocking boundary leaves its queue only once the receiver has posted the receive, which it does where
Megatron-Core 0.19's forward_backward_pipelining_without_interleaving calls it. In the steady state a stage
calls send_forward_recv_backward right after a forward and send_backward_recv_forward right after a backward
(except after the loop's last one): the receive of the next operation's input is posted the tick that compute
ends. Every other receive (warm-up and loop-entry recv_forward, cool-down recv_backward) is a call of its own,
posted once the stage is idle at that operation (its compute ended, its blocking send arrived). Overlapped
boundaries post their receives ahead: their transfers never wait for one.

Shared uplinks (plan/shared_uplinks.py), as documented there: an uplink direction is contended when the
transfers crossing it, each at its link's speed (its seconds on the uplink over its link occupancy, at most 1),
need more than all of it together. A transfer crossing contended directions starts only when each is free and
no transfer that was due before it (data ready and link free; ties by boundary, direction, micro-batch) still
waits for one of them (a blocking transfer is due once its receive is posted too); it holds each for its
seconds on it. Transfers start after the stages that finish at a
tick have handed theirs over, so those are among the candidates of the tick.
"""
from __future__ import annotations


def reference_makespan(fwd, bwd, occ, lat, m, blocking, depth, uplinks=None) -> float:
    p = len(fwd)
    warm = [min(m, p - i - 1 + sum(depth[i:])) for i in range(p)]
    orders = []
    for i in range(p):
        ops = [("F", j) for j in range(warm[i])]
        for j in range(m - warm[i]):
            ops += [("F", warm[i] + j), ("B", j)]
        ops += [("B", j) for j in range(m - warm[i], m)]
        orders.append(ops)
    have = [set() for _ in range(p)]          # ("F", j) / ("B", j) inputs that have arrived at stage i
    for j in range(m):
        have[0].add(("F", j))
    nxt = [0] * p
    running = [None] * p                      # (op, end tick) while computing
    held = [None] * p                         # transfer the stage waits on (blocking send)
    queue = {}                                # (l, dir) -> list of transfers waiting for the link
    link_busy = {}                            # (l, dir) -> tick the current transfer stops occupying it
    flying = []                               # [arrival tick, stage, data, transfer id]
    up_free = {}                              # contended uplink direction -> tick it is free again
    share = {}
    for l, entry in enumerate(uplinks or ()):
        for needs in entry or ():
            for key, sec in needs:
                if sec > 0:
                    share[key] = share.get(key, 0) + (min(1, sec / occ[l]) if occ[l] else 1)
    busy_keys = {key for key, v in share.items() if v > 1 + 1e-9}
    arrived_ids = set()
    posted = [{} for _ in range(p)]           # receives stage i has posted: ("F", j) / ("B", j) -> tick
    tid = 0
    done = 0
    t = 0
    last_end = 0
    while done < 2 * p * m:
        changed = True
        while changed:                        # settle everything that happens at tick t
            changed = False
            for fl in list(flying):
                if fl[0] == t:
                    flying.remove(fl)
                    have[fl[1]].add(fl[2])
                    arrived_ids.add(fl[3])
                    changed = True
            for i in range(p):
                if running[i] is not None and running[i][1] == t:
                    (kind, j), _ = running[i]
                    running[i] = None
                    done += 1
                    last_end = t
                    changed = True
                    if nxt[i] < len(orders[i]):
                        # the steady loop's calls: the send of this compute goes with the next input's receive
                        nk, nj = orders[i][nxt[i]]
                        if (kind, nk) == ("F", "B") and nj < m - warm[i] or \
                                (kind, nk) == ("B", "F") and nj > warm[i]:
                            posted[i].setdefault((nk, nj), t)
                    if kind == "F" and i == p - 1:
                        have[i].add(("B", j))
                    elif kind == "F" or i > 0:
                        l, d, dst = (i, "f", i + 1) if kind == "F" else (i - 1, "b", i - 1)
                        tid += 1
                        queue.setdefault((l, d), []).append((dst, (kind, j), tid, t))
                        if blocking[l]:
                            held[i] = tid
                if held[i] is not None and held[i] in arrived_ids:
                    held[i] = None
                    changed = True
                if running[i] is None and held[i] is None and nxt[i] < len(orders[i]):
                    op = orders[i][nxt[i]]
                    posted[i].setdefault(op, t)   # idle at this operation: its receive is posted
                    if op in have[i]:
                        nxt[i] += 1
                        cost = fwd[i] if op[0] == "F" else bwd[i]
                        running[i] = (op, t + (cost[op[1]] if isinstance(cost, list) else cost))
                        changed = True
            heads = []
            for (l, d), q in queue.items():
                if q and blocking[l] and q[0][1] not in posted[q[0][0]]:
                    continue                      # rendezvous: the receiver has not posted its receive
                if q and link_busy.get((l, d), 0) <= t:
                    post = posted[q[0][0]][q[0][1]] if blocking[l] else 0
                    due = max(q[0][3], link_busy.get((l, d), 0), post)
                    heads.append((due, l, 0 if d == "f" else 1, q[0][1][1], d))
            blocked = set()
            for due, l, way, _, d in sorted(heads):
                needs = [(key, sec) for key, sec in (uplinks[l][way] if uplinks and uplinks[l] else ())
                         if key in busy_keys and sec > 0]
                if any(key in blocked or up_free.get(key, 0) > t for key, _ in needs):
                    blocked.update(key for key, _ in needs)
                    continue
                for key, sec in needs:
                    up_free[key] = t + sec
                stage, data, ident, _ = queue[(l, d)].pop(0)
                link_busy[(l, d)] = t + occ[l]
                flying.append([t + occ[l] + lat[l], stage, data, ident])
                changed = True
        t += 1
        if t > 10 ** 7:
            raise RuntimeError("reference simulation does not end")
    return last_end
