"""Stage 1 of the learned model's fit: the roofline prior calibrated per group of rows (rate x prior + overhead),
and the robust fit of a rate and an overhead that stage 3 (composing operators into a layer) and the optimizer step
reuse (cost/learned/composition.py, optimizer_step.py). The fitted table is applied by fitted.py (`calibrated_s`)."""
from __future__ import annotations

import math
import statistics

from .samples import Sample

# Every (device, granularity, phase, operator or layer kind, element size) group gets
#     learned part = rate * prior + overhead
# `rate`: how many times slower than its roofline the device runs that kind of work at scale; `overhead`: the
# fixed time per call (kernel launches, the framework's Python) that dominates small shapes. Two physical numbers
# per group carry over to shapes and models the measurements never covered. Trees fitted directly on
# log(measured / prior) instead learn a per-model offset from whatever feature happens to separate the training
# models, and extrapolate it to a new model wherever it falls (benchmarks/learned_cost.py shows the difference).
OVERHEAD_STEPS = 20


def _fit_rate_overhead(prior: list[float], y: list[float]) -> tuple[float, float]:
    """Least absolute log error over overheads from 0 to 95% of the fastest measurement (the rate is the median
    ratio for each); deterministic and robust to a few noisy rows."""
    if len(y) < 3:
        return math.exp(statistics.median(math.log(v / p) for p, v in zip(prior, y))), 0.0
    best = None
    for i in range(OVERHEAD_STEPS):
        t0 = min(y) * i / OVERHEAD_STEPS
        rate = math.exp(statistics.median(math.log((v - t0) / p) for p, v in zip(prior, y)))
        err = sum(abs(math.log(rate * p + t0) - math.log(v)) for p, v in zip(prior, y))
        if best is None or err < best[0] - 1e-12:
            best = (err, rate, t0)
    return best[1], best[2]


def fit_calibration(samples: list[Sample]) -> dict[str, tuple[float, float]]:
    """Calibration key -> (rate, overhead seconds), from each group's rows."""
    groups: dict[str, tuple[list, list]] = {}
    for s in samples:
        p, y = groups.setdefault(s.calibration_key(), ([], []))
        p.append(s.prior_s)
        y.append(s.learned_part_s())
    return {k: _fit_rate_overhead(p, y) for k, (p, y) in sorted(groups.items())}
