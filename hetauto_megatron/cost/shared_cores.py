"""Ranks that time-share fewer CPU cores than there are ranks: a cost model whose compute times are stretched.

A CPU dry run starts one process per device of the plan. The learned CPU model is measured on one core with one
thread (what a rank has when it is alone on its core); with more ranks than cores, the ranks take turns, so
every compute time grows by ranks / cores. That is a lower bound: time-sharing also costs cache refills and
scheduling delays at every collective (docs/cost-model-learned.md).
"""
from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def core_sharing_factor(ranks: int, cores: int) -> float:
    """How much longer each rank's compute takes when `ranks` processes share `cores` cores."""
    return max(1.0, ranks / max(1, cores))


class SharedCoresCostModel:
    """`base` with its compute times multiplied by `factor` (communication is not stretched: the simulator
    prices it from the inventory's links)."""

    def __init__(self, base, factor: float):
        if factor < 1.0:
            raise ValueError(f"a core-sharing factor below 1 ({factor}) would speed ranks up")
        self.base, self.factor = base, factor
        self.name = base.name

    def source(self, device):
        return self.base.source(device)

    def _scaled(self, fn, *a):
        f, b = fn(*a)
        return f * self.factor, b * self.factor

    def layer_times(self, *a):
        return self._scaled(self.base.layer_times, *a)

    def head_times(self, *a):
        return self._scaled(self.base.head_times, *a)

    def embedding_times(self, *a):
        return self._scaled(self.base.embedding_times, *a)

    def tp_link(self, device, tp, link, nbytes=None):
        """The link TP collectives run on is the base model's (a link is not stretched either)."""
        pick = getattr(self.base, "tp_link", None)
        return pick(device, tp, link, nbytes) if pick is not None else link

    def host_floors(self, *a):
        return self._scaled(self.base.host_floors, *a)

    def recompute_time(self, *a):
        return self.base.recompute_time(*a) * self.factor

    def iteration_overhead_s(self, device):
        return self.base.iteration_overhead_s(device) * self.factor

    def optimizer_calibration(self, device):
        rate, per_step = self.base.optimizer_calibration(device)
        return rate * self.factor, per_step * self.factor
