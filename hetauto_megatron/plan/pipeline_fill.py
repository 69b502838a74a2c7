"""A second closed form of Megatron's 1F1B that counts what the slowest stage does while the pipeline fills and
drains (pure functions). The search ranks its best leaves by it too (rescreen.fill_shortlist); the event simulation
still decides.

`pipeline.estimate_1f1b` charges the first micro-batch's whole round trip, F = sum_i (f_i + b_i) + 2 sum_l x_l,
plus (m - 1) periods. Where one stage k sets the period (P = T_k, its compute plus the blocking sends that hold
it), that reads as stage k's own work, m T_k, plus the rest of the round trip, R_k = sum_{i>k} (f_i + b_i) +
2 sum_{l>=k} x_l, spent idle twice over: once waiting for its first gradient, once for its last. But stage k
is not idle then. 1F1B gives it n_k = min(u_k, m - 1) more forwards to run before its first backward (u_k: its
warm-up forwards, pipeline.warmup_forwards) and n_k backwards still to run after its last forward, so

    T ~ sum_{i<k} (f_i + x_i) + sum_{i<k} (b_i + x_i) - h'_k + m T_k + n_k (h_k + h'_k)
        + max(R_k - h_k - n_k a_k, n_k (r_k - a_k))            (waiting for the first gradient)
        + max(R_k - h_k - n_k c_k, 0)                            (waiting for the last)

with h_k, h'_k the forward and backward sends that hold stage k where its boundaries block. Its n_k warm-up
forwards and cool-down backwards also wait, each, for its own receive's whole transfer: the warm-up's
recv_forward and the cool-down's recv_backward are calls of their own, posted only once the call before
returned, and a blocking transfer starts only then (rendezvous, pipeline.py). So each takes a_k = f_k + h_k + h'_k
or c_k = b_k + h'_k + h_k, n_k (h_k + h'_k) more than m T_k counts; r_k is the slowest forward rate before k (a
stage's a_i, an overlapped link's occupancy), at which the warm-up forwards can reach it at all. That is exact
where the stages around k keep up during fill and drain, and the estimate is the largest over k, never above
estimate_1f1b. It does not apply where a run of stages or a link sets the period (their cycles leave stage k
idle in the steady state too): there it is estimate_1f1b. estimate_1f1b counts the two waits as R_k - h_k - h'_k whatever n_k is, so it is
pessimistic by up to n_k (a_k + c_k) (tens of % with few micro-batches, a deep warm-up and a heavy first stage);
this form can fall below the simulation where the stages around k lag in the fill or drain (a few %, on
random pipelines; tests/test_plan_fill.py). Hence a ranking of its own, not a replacement.
"""
from __future__ import annotations

from .pipeline import closed_form_terms, warmup_forwards


def estimate_fill_drain(fwd, bwd, link, m: int, *, latency=None, blocking=None, depth=None, uplinks=None) -> float:
    """The closed form above; arguments as pipeline.estimate_1f1b's."""
    first, period, link, stage, cycle = closed_form_terms(fwd, bwd, link, m, latency, blocking, depth, uplinks)
    closed = first + (m - 1) * period       # estimate_1f1b
    p = len(fwd)
    if m <= 1 or p <= 1 or period > max(cycle) * (1 + 1e-9):
        return closed       # (a run of stages, a link or an uplink sets the period: estimate_1f1b's domain)
    blk = [blocking is None or blocking[l] for l in range(p - 1)]
    hold_f = [link[k] if k < p - 1 and blk[k] else 0.0 for k in range(p)]      # the forward send holding k
    hold_b = [link[k - 1] if k > 0 and blk[k - 1] else 0.0 for k in range(p)]  # the gradient send holding k
    d = [0] * (p - 1) if depth is None else list(depth)
    warm = warmup_forwards(p, [0 if blk[l] else d[l] for l in range(p - 1)])
    rest = [0.0] * p        # R_k
    acc = 0.0
    for k in range(p - 1, -1, -1):
        rest[k] = acc + (2 * link[k] if k < p - 1 else 0.0)
        acc = rest[k] + fwd[k] + bwd[k]
    best, before, rate = 0.0, 0.0, 0.0     # before: sum_{i<k} (f_i + b_i + 2 x_i)
    for k in range(p):
        n = min(warm[k], m - 1)
        # rendezvous: each of the n forwards and backwards also waits for its own receive's whole transfer
        a, c = fwd[k] + hold_f[k] + hold_b[k], bwd[k] + hold_b[k] + hold_f[k]
        rate = max(rate, a)
        wait = rest[k] - hold_f[k]
        t = before - hold_b[k] + m * stage[k] + n * (hold_b[k] + hold_f[k]) + max(wait - n * a, n * (rate - a)) \
            + max(wait - n * c, 0.0)
        best = max(best, t)
        if k < p - 1:
            before += fwd[k] + bwd[k] + 2 * link[k]
            if not blk[k]:      # an overlapped link passes the forwards on at most this fast
                rate = max(rate, link[k] - (0.0 if latency is None else latency[k]))
    return min(best, closed)
