"""The host floor of a measured layer: where the host issues a layer's kernels more slowly than the GPU runs them,
Sailor's per-layer timings measure the host, and a training step cannot run that layer faster either."""
from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

from .samples import host_floor_key

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
    (F.host_floored): the smallest host-bound time measured on that GPU, over models, at TP 1 and over the TP
    degrees above 1 apart (at TP > 1 the host issues the same kernels at any degree, plus the all-reduces' NCCL
    calls: on the GH200 at TP 4 OPT-350's and GPT-Neo's host-bound forwards take 1.500 and 1.505 ms with 0.16 and
    0.34 ms of all-reduces; OPT-350's at TP 1 1.225 ms). A GPU none of whose configurations is host-bound has none.
    A TP > 1 pass issues all a TP 1 pass does, so its floor is no lower than TP 1's (and TP 1's stands for it
    where no TP > 1 configuration was host-bound); a TP > 1 floor says nothing of TP 1, which then has none.
    The backward's floor is no lower than the forward's: the backward issues at least one kernel for each of the
    forward's (every operator's gradient, plus the weight gradients), through autograd's engine on top of the same
    dispatcher. Where no backward was measured host-bound (it grows with the work in every configuration of the
    models at hand) the forward's floor stands for it."""
    floors: dict[str, float] = {}
    conf = {config_key(r): r for r in layers}
    for (key, ph), t in host_bound_times(layers).items():
        k = host_floor_key(conf[key].device, ph, conf[key].shape.tp)
        floors[k] = min(floors.get(k, math.inf), t)
    for dev in sorted({r.device for r in layers}):
        for ph in ("fwd", "bwd"):
            one, many = host_floor_key(dev, ph, 1), host_floor_key(dev, ph, 2)
            if one in floors:
                floors[many] = max(floors.get(many, 0.0), floors[one])
    for k, t in list(floors.items()):
        if "|fwd|" in k:
            b = k.replace("|fwd|", "|bwd|")
            floors[b] = max(floors.get(b, 0.0), t)
    return floors
