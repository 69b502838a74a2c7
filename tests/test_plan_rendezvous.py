"""The 1F1B event simulation against a replay of Megatron-Core's own call sequence, with rendezvous transfers.

gloo, and NCCL for large messages, move a message only once the receiver has posted its receive. The replay below
runs, per stage, the calls of Megatron-Core 0.19's forward_backward_pipelining_without_interleaving in their
order (warm-up recv_forward / forward / send_forward, the loop entry's recv_forward, the steady state's forward,
send_forward_recv_backward, backward, send_backward_recv_forward or, in the last iteration, send_backward, then
the cool-down's recv_backward / backward / send_backward), each call posting its sends and receives when the stage
reaches it and returning once they are done. A transfer on a blocking boundary starts once its send and its
receive are posted and its link direction is free; on an overlapped boundary the receives are posted ahead
(runtime/cross_link.py), so it starts when sent and free, and the send does not hold its call.
"""
import random

import pytest

from hetauto_megatron.plan.pipeline import simulate_1f1b


def _calls(s, p, m, w):
    """Stage s's Megatron calls in order: ("F" | "B", j) computes, and ("call", [(send | recv, F | B, j)])."""
    first, last = s == 0, s == p - 1
    out = []

    def call(*items):
        items = [x for x in items if x is not None]
        if items:
            out.append(("call", items))
    recv_f = lambda j: None if first else ("recv", "F", j)         # noqa: E731
    send_f = lambda j: None if last else ("send", "F", j)          # noqa: E731
    recv_b = lambda j: None if last else ("recv", "B", j)          # noqa: E731
    send_b = lambda j: None if first else ("send", "B", j)         # noqa: E731
    for j in range(w):
        call(recv_f(j))
        out.append(("F", j))
        call(send_f(j))
    steady = m - w
    if steady > 0:
        call(recv_f(w))
    for i in range(steady):
        out.append(("F", w + i))
        call(send_f(w + i), recv_b(i))
        out.append(("B", i))
        if i == steady - 1:
            call(send_b(i))
        else:
            call(send_b(i), recv_f(w + i + 1))
    for i in range(steady, m):
        call(recv_b(i))
        out.append(("B", i))
        call(send_b(i))
    return out


def megatron_replay(f, b, x, m, lat=None, blocking=None, depth=None):
    p = len(f)
    lat = lat or [0.0] * (p - 1)
    blocking = blocking or [True] * (p - 1)
    depth = depth or [0] * (p - 1)
    warm = [min(m, p - s - 1 + sum(depth[s:])) for s in range(p)]
    programs = [_calls(s, p, m, warm[s]) for s in range(p)]
    pc, clock, finish = [0] * p, [0.0] * p, [0.0] * p
    posted, arrival, link_free = {}, {}, {}

    def boundary(s, kind, d):
        return s if (kind == "send") == (d == "F") else s - 1

    moved = True
    while moved:
        moved = False
        for s in range(p):
            while pc[s] < len(programs[s]):
                op = programs[s][pc[s]]
                if op[0] in ("F", "B"):
                    clock[s] += (f if op[0] == "F" else b)[s]
                    if op[0] == "B":
                        finish[s] = clock[s]
                    pc[s] += 1
                    moved = True
                    continue
                for kind, d, j in op[1]:
                    posted.setdefault((kind, d, boundary(s, kind, d), j), clock[s])
                ends, waiting = [clock[s]], False
                for kind, d, j in op[1]:
                    l = boundary(s, kind, d)
                    key = (d, l, j)
                    if key not in arrival:
                        sent = posted.get(("send", d, l, j))
                        received = posted.get(("recv", d, l, j)) if blocking[l] else 0.0
                        if sent is None or received is None:
                            waiting = True
                            continue
                        start = max(sent, received, link_free.get((d, l), 0.0))
                        link_free[(d, l)] = start + x[l] - lat[l]
                        arrival[key] = start + x[l]
                    if kind == "recv" or blocking[l]:
                        ends.append(arrival[key])
                if waiting:
                    break
                clock[s] = max(ends)
                pc[s] += 1
                moved = True
    assert all(pc[s] == len(programs[s]) for s in range(p)), "deadlock"
    return max(finish)


def test_the_h800_ascend_example_prices_the_cool_down_receive():
    """llama2-7b on H800 then Ascend (audit figures): stage 0 (Ascend, f 0.194 s, b 0.403 s) and stage 1 (H800,
    f 0.054 s, b 0.113 s) behind a blocking link of 0.174 s. Stage 0's last recv_backward is a call of its own,
    posted once its backward before it is done; the gradient, ready long before, moves only then: the iteration
    takes one link more than if it had moved when sent."""
    f, b, x = [0.194291, 0.05383], [0.402525, 0.112549], [0.173799]
    for m in (8, 32):
        got = simulate_1f1b(f, b, x, m).makespan
        assert got == pytest.approx(megatron_replay(f, b, x, m), rel=1e-12)
        stage0 = f[0] + x[0] + (m - 1) * (f[0] + x[0] + b[0]) + x[0] + b[0]
        assert got == pytest.approx(stage0, rel=1e-12)


@pytest.mark.parametrize("mixed", [False, True])
def test_random_pipelines_equal_megatrons_call_sequence(mixed, monkeypatch):
    """Random pipelines (2-6 stages, 1-60 micro-batches: the plain loop and the rounds that jump the steady
    state), every boundary blocking or a random mix with overlapped ones of random depth, links with latency:
    the simulation equals the replay (to float round-off), recorded or not; over 100 of the 150 ran in rounds."""
    from hetauto_megatron.plan import pipeline_rounds
    in_rounds = []
    rounds = pipeline_rounds.simulate_rounds
    monkeypatch.setattr(pipeline_rounds, "simulate_rounds", lambda *a, **k: in_rounds.append(1) or rounds(*a, **k))
    rng = random.Random(7 if mixed else 5)
    for _ in range(150):
        p, m = rng.randint(2, 6), rng.randint(1, 60)
        f = [rng.uniform(0.5, 5) for _ in range(p)]
        b = [v * rng.uniform(1, 3) for v in f]
        x = [rng.uniform(0, 4) for _ in range(p - 1)]
        lat = [v * rng.uniform(0, 1) for v in x]
        blk = [not mixed or rng.random() < 0.5 for _ in range(p - 1)]
        depth = [0 if v else rng.randint(0, 3) for v in blk]
        want = megatron_replay(f, b, x, m, lat, blk, depth)
        for record in (False, True):
            got = simulate_1f1b(f, b, x, m, latency=lat, blocking=blk, depth=depth, record=record).makespan
            assert got == pytest.approx(want, rel=1e-9), (p, m, f, b, x, lat, blk, depth, record)
    assert len(in_rounds) >= 100, len(in_rounds)
