"""Sailor's measured all-reduce curves inside a node (intra_node_bandwidths.json, read by sailor.read_allreduce_fits):
how long a ring all-reduce of a message takes on them, the alpha-beta link that matches them (the inventory
entry of such a node), and the rates at which the fit set the measured layers' all-reduces apart."""
from __future__ import annotations

import math

from .samples import tp_allreduce_key


def sailor_allreduce_s(fits: dict, nbytes: float, n: int) -> float:
    """Ring all-reduce time of an `nbytes` message over `n` GPUs inside one node, from Sailor's measured curve:
    2(n-1)/n x nbytes at the bus bandwidth the curve gives for that message, GB/s = a x^2 + b x + c with
    x = log2(megabytes), capped at the measured maximum. `fits`: one GPU's entry, {group size: [[a, b, c], max
    bytes/s]}; the largest group stands in for bigger.

    The curve is read as it was measured: Sailor's profiler (sailor/profiling/networking/test_collectives.py, fitted by
    fit_func.py) times one all-reduce of the whole message per size, so x is the whole message. Its figures are bus
    bandwidths: the A100-40's 4-GPU maximum, 243 GB/s, would need 365 GB/s per GPU as an algorithm bandwidth
    (2(n-1)/n of it crosses each GPU's links), over NVLink3's 300. Sailor's own simulator evaluates the curve at the
    chunk, nbytes/n (profile_utils.estimate_ar_time), which prices a 4-GPU all-reduce 1.2-2.2x slower at these
    sizes; the layers measured at TP 4 against TP 1 show the whole message's reading (docs/cost-model-learned.md,
    step 9)."""
    if n <= 1 or nbytes <= 0 or not fits:
        return 0.0
    key = str(n) if str(n) in fits else max(fits, key=int)
    (a, b, c), max_bps = fits[key]
    x = math.log2(max(nbytes / 1e6, 1e-3))
    bw = min(max_bps, max(1e9 * (a * x * x + b * x + c), 1e9))
    return 2 * (n - 1) / n * nbytes / bw


def fit_ring_allreduce(fits: dict, n: int, sizes, *, max_latency_us: float) -> tuple[float, float]:
    """(bandwidth bytes/s, latency us) of the alpha-beta ring all-reduce of `n` ranks, 2(n-1)/n x size / bandwidth +
    2(n-1) x latency, closest to Sailor's curve (`sailor_allreduce_s`) over the message `sizes` in least absolute
    log error: a grid of 0.5 us below `max_latency_us` and 0.5 GB/s from 2 to 499.5 GB/s (how an inventory entry
    is derived from Sailor's measurements)."""
    import numpy as np
    measured = [sailor_allreduce_s(fits, s, n) for s in sizes]
    lats_us = 0.5 * np.arange(int(2 * max_latency_us))
    bws = 0.5e9 * np.arange(4, 1000)
    err = np.zeros((len(lats_us), len(bws)))        # [latency, bandwidth], summed size by size in order
    for s, t in zip(sizes, measured):
        err += np.abs(np.log((2 * (n - 1) / n * s / bws[None, :] + 2 * (n - 1) * lats_us[:, None] * 1e-6) / t))
    i = int(err.argmin())       # the first least error, latency-major: the grid's order
    return float(bws[i % len(bws)]), float(lats_us[i // len(bws)])


def sailor_set_apart_rates(layers: list) -> dict[str, tuple]:
    """tp_allreduce_key -> ((message bytes, bus bandwidth in bytes/s), ...): the rate at which the fit set the TP
    all-reduces of `layers` (sailor.SailorLayer, `tp_comm_s` set by sailor.with_tp_comm: Sailor's curve of the GPU,
    or the layers' own rate where slower) apart, at every message size measured, the slowest where several rows
    share one. The learned compute is each measurement less those all-reduces, so the planner adds them back at
    these rates (LearnedCostModel.tp_link) where the node's link would run them faster."""
    by: dict[str, dict[float, float]] = {}
    for r in layers:
        if r.shape.kind != "transformer" or r.shape.tp <= 1 or r.tp_comm_s <= 0:
            continue
        n = r.shape.tp
        nbytes = float(r.shape.micro_batch * r.shape.seq * r.shape.hidden * r.dtype_bytes)
        rate = 2 * (n - 1) / n * nbytes / (r.tp_comm_s / 2)
        sizes = by.setdefault(tp_allreduce_key(r.device, n), {})
        sizes[nbytes] = min(sizes.get(nbytes, math.inf), rate)
    return {k: tuple(sorted(v.items())) for k, v in sorted(by.items())}
