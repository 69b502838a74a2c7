"""The fitted model in memory: per-group calibrations of the roofline prior, the LightGBM boosters that correct
them, and how measured operators compose into layers (`FittedModel`); `predict_samples` prices measured rows."""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

from .. import features as F
from .samples import DeviceInfo, Sample, calibration_key, host_floor_at


def _lgb():
    import lightgbm  # imported on first use: the planner must start fast without a fitted model
    return lightgbm


def calibrated_s(calibration: dict, key: str, prior_s: float) -> float:
    """rate * prior + overhead. A group never measured (a precision or operator kind this device was not
    profiled in) borrows the median calibration of the same group on the other devices: a GPU's efficiency is a
    better guess than none; with no such group, the bare roofline."""
    hit = calibration.get(key)
    if hit is None:
        rest = key.split("|", 1)[1]
        same = [v for k, v in calibration.items() if k.split("|", 1)[1] == rest]
        hit = (statistics.median(r for r, _ in same), statistics.median(o for _, o in same)) if same else (1.0, 0.0)
    return hit[0] * prior_s + hit[1]


@dataclass
class FittedModel:
    calibration: dict          # calibration key -> (rate, overhead_s)
    boosters: dict             # booster name -> lightgbm.Booster (absent where 0 rounds were chosen)
    rounds: dict               # booster name -> rounds used
    composition: dict = dataclasses.field(default_factory=dict)   # "device|phase" -> (rate, overhead_s)
    score_bwd_weight: float = 1.0   # weight of the backward's score traffic in whole-layer priors
    optimizer: dict = dataclasses.field(default_factory=dict)     # device -> (rate, overhead_s per step)
    host_floor: dict = dataclasses.field(default_factory=dict)    # host_floor_key -> seconds (sailor_host_floors)
    gemm_bwd_weight: float = 1.0    # weight of the backward GEMMs in whole-layer priors where F.backward_gemm_weighted
    tp_allreduce: dict = dataclasses.field(default_factory=dict)  # "device|tpN" -> ((bytes, bytes/s), ...) the fit
                                                                  # set its layers' TP all-reduces apart at
                                                                  # (sailor_set_apart_rates)

    def floor_s(self, device: str, phase: str, tp: int) -> float:
        """The device's host floor for a layer's pass at TP degree `tp`, compute and TP all-reduces together
        (F.host_floored; samples.host_floor_at reads a degree not measured); 0 where none was measured."""
        return host_floor_at(self.host_floor, device, phase, tp)

    def times(self, name: str, keys: list[str], priors: list[float], X: list) -> list[float]:
        """Seconds for rows of one booster: calibrated roofline x the booster's correction (when kept)."""
        import numpy as np
        b = self.boosters.get(name)
        # one thread: LightGBM's OpenMP team (torch's libgomp, one copy per process) is not fork-safe, and the
        # search's and explain's forked workers hung in their first prediction after the parent's had started it
        corr = b.predict(np.array(X, dtype=np.float64), num_threads=1) if b is not None else [0.0] * len(keys)
        return [calibrated_s(self.calibration, k, p) * math.exp(float(c)) for k, p, c in zip(keys, priors, corr)]

    def op_sum_times(self, info: "DeviceInfo", ops: list[F.Op]) -> tuple[float, float]:
        """(forward, backward) seconds of a list of operators on a profiled device: the sum of their times."""
        a = dict(dtype_bytes=info.dtype_bytes, peak_tflops=info.peak_tflops, hbm_gbps=info.hbm_gbps)
        out = []
        for phase in ("fwd", "bwd"):
            rows = [F.op_row(o, phase, **a) for o in ops]
            X, priors = [x for x, _ in rows], [p for _, p in rows]
            keys = [calibration_key(info.name, "op", phase, x, info.arithmetic) for x in X]
            out.append(sum(self.times(f"op_{phase}", keys, priors, X)))
        return out[0], out[1]

    def composed_layer_times(self, info: "DeviceInfo", ops: list[F.Op]) -> tuple[float, float]:
        """A transformer layer from its operators: their sum, composed (stage 3) where whole layers of the device
        were measured."""
        sums = self.op_sum_times(info, ops)
        return tuple(_apply_rate(self.composition.get(f"{info.name}|{ph}"), t) for ph, t in zip(("fwd", "bwd"), sums))


def _apply_rate(rate_overhead, t: float) -> float:
    return t if rate_overhead is None else rate_overhead[0] * t + rate_overhead[1]


def predict_samples(model: FittedModel, samples: list[Sample]) -> list[float]:
    """Predicted seconds for each sample: calibrated roofline x tree correction + the known part."""
    out = [0.0] * len(samples)
    by_name: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_name.setdefault(f"{s.granularity}_{s.phase}", []).append(i)
    for name, idx in by_name.items():
        rows = [samples[i] for i in idx]
        times = model.times(name, [s.calibration_key() for s in rows], [s.prior_s for s in rows],
                            [s.features for s in rows])
        for i, t in zip(idx, times):
            s = samples[i]
            # a measured layer's pass: its learned part and its known part (TP all-reduces, softmax passes)
            # together stand on the host floor
            out[i] = (F.host_floored(t + s.known_s, model.floor_s(s.device, s.phase, s.tp)) if s.granularity == "layer"
                      else t + s.known_s)
    return out
