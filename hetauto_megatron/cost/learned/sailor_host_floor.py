"""The host floor of a measured layer: where the host issues a layer's kernels more slowly than the GPU runs them,
Sailor's per-layer timings measure the host, and a training step cannot run that layer faster either."""
from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

from .samples import host_floor_at, host_floor_key

if TYPE_CHECKING:
    from .sailor import SailorLayer


def config_key(r: SailorLayer) -> tuple:
    return (r.model, r.gpu, r.shape.kind, r.shape.micro_batch, r.shape.tp)


def config_times(layers: list[SailorLayer]) -> dict[tuple, tuple[SailorLayer, dict[str, float]]]:
    """Configuration key -> (a layer of it, {phase: the median time over its identical transformer layers})."""
    groups: dict[tuple, list[SailorLayer]] = {}
    for r in layers:
        if r.shape.kind == "transformer":
            groups.setdefault(config_key(r), []).append(r)
    return {k: (rs[0], {ph: statistics.median(getattr(r, f"{ph}_s") for r in rs) for ph in ("fwd", "bwd")})
            for k, rs in groups.items()}


# ---- the host floor -------------------------------------------------------------------------------------------
# Sailor timed each layer with CUDA events recorded in the layer's forward and backward hooks, without synchronising
# between layers (sailor/profiling/profile_utils.py). Where the host issues a layer's kernels (Python, PyTorch's
# dispatcher, the launches and the TP all-reduces' NCCL calls) more slowly than the GPU runs them, the GPU waits
# for each kernel and the events measure the host: the time no longer follows the work. A training step issues its
# layers the same way, so a layer there cannot take less either. A measured configuration is host-bound when
# doubling its micro-batch (twice the GPU work) adds less than half to its time, from a series' smallest
# micro-batch up to the first that does not: under `max(GPU, host)` with the GPU's time proportional to the work,
# a time that less than doubles is set by the host (1.5 is the midpoint between flat, 1, and proportional, 2).
HOST_BOUND_RATIO = 1.5


def host_bound_times(layers: list[SailorLayer]) -> dict[tuple, float]:
    """(configuration key, phase) -> its measured time, the whole pass (compute, softmax passes and TP all-reduces:
    the host issues them all, and the GPU waits for it either way; F.host_floored), for every host-bound
    configuration of the transformer layers (see HOST_BOUND_RATIO)."""
    conf = config_times(layers)
    series: dict[tuple, dict[int, tuple]] = {}
    for key, (r0, times) in conf.items():
        for ph, t in times.items():
            if t > 0:
                series.setdefault((r0.model, r0.gpu, r0.shape.tp, ph), {})[r0.shape.micro_batch] = (key, r0, t)
    out = {}
    for (_, _, _, ph), per in series.items():
        for b in sorted(per):
            if 2 * b not in per or per[2 * b][2] >= HOST_BOUND_RATIO * per[b][2]:
                break
            key, r0, t = per[b]
            out[(key, ph)] = t
    return out


def sailor_host_floors(layers: list[SailorLayer]) -> dict[str, float]:
    """host_floor_key -> the host floor of a transformer layer's pass, compute and TP all-reduces together
    (F.host_floored), per GPU, pass and TP degree: the smallest host-bound time measured on that GPU at that degree,
    over models. A GPU none of whose configurations is host-bound has none.

    The floor grows with the TP degree. At TP 1 the host issues no all-reduce (on the GH200 OPT-350's host-bound
    forward takes 1.225 ms); at TP n each of the pass's all-reduces also waits for the last of the n ranks' hosts, so
    a TP n pass issues all a TP m < n pass does and waits on more ranks: a host-bound reading at n bounds the floor
    at every m < n from above, and the floor at n is no lower than at m (A100-40: OPT-350's host-bound forwards take
    1.91 ms at TP 2 and 2.13-2.39 ms at TP 4, GPT-Neo-2.7's 2.45 ms at TP 4; GH200: 1.44 ms at TP 2, 1.50-1.70 at
    TP 4). So each degree's floor is the smallest of its own and every higher degree's readings, and no lower than
    any lower degree's (samples.host_floor_at reads a degree not measured).
    The backward's floor is no lower than the forward's at the same degree: the backward issues at least one kernel
    for each of the forward's (every operator's gradient, plus the weight gradients), through autograd's engine on
    top of the same dispatcher. Where no backward was measured host-bound (it grows with the work in every
    configuration of the models at hand) the forward's floor stands for it."""
    readings: dict[tuple, float] = {}       # (device, phase, TP degree) -> the smallest host-bound time there
    conf = {config_key(r): r for r in layers}
    for (key, ph), t in host_bound_times(layers).items():
        k = (conf[key].device, ph, max(conf[key].shape.tp, 1))
        readings[k] = min(readings.get(k, math.inf), t)
    floors: dict[str, float] = {}
    for dev, ph in sorted({(d, ph) for d, ph, _ in readings}):
        per = {n: t for (d, p, n), t in readings.items() if (d, p) == (dev, ph)}
        lower = 0.0
        for n in sorted(per):
            t = max(min(v for m, v in per.items() if m >= n), lower)   # bounded above by higher degrees' readings
            floors[host_floor_key(dev, ph, n)] = lower = t
    for dev in sorted({d for d, _, _ in readings}):
        degrees = sorted({n for d, _, n in readings if d == dev})
        for n in degrees:
            fwd = host_floor_at(floors, dev, "fwd", n)
            if fwd > 0:
                floors[host_floor_key(dev, "bwd", n)] = max(host_floor_at(floors, dev, "bwd", n), fwd)
        lower = 0.0     # (raised to the forward's, the backward's floor still grows with the degree)
        for n in degrees:
            key = host_floor_key(dev, "bwd", n)
            if key in floors:
                floors[key] = lower = max(floors[key], lower)
    return floors
