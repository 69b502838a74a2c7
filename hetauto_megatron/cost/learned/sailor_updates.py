"""The optimizer step Sailor measured for each profiled (model, GPU, TP): the third figure of its per-layer entries."""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from ...spec.files import read_json_file
from ..model_state import adam_traffic_bytes_per_param
from ..sailor_job import SAILOR_ELEMENT_BYTES
from .sailor import _profiled_runs, load_sailor
from .samples import measured_time


@dataclass(frozen=True)
class SailorUpdate:
    """The optimizer step Sailor measured for one (model, GPU, TP): the third figure of its entries. It is the mean
    step of the whole model the profiler trained (the fork's megatron/training.py writes
    `model[0].timers(STEP_MICRO_TIMER).mean()` into every entry): the embedding, two transformer layers and the
    output-layer entry, one optimizer call over their parameters on one TP rank (`llm_info.json`'s count of those
    entries at that TP). The median over the entries and micro-batch sizes (the step does not depend on the
    micro-batch)."""
    model: str
    gpu: str
    device: str
    tp: int
    params: float          # the profiled model's parameters on one TP rank
    bytes_per_param: int   # Adam's memory traffic per parameter: 28 in an fp32 job (no master copy), as all these ran
    hbm_gbps: float
    update_s: float

    @property
    def prior_s(self) -> float:
        """The optimizer's memory traffic at full bandwidth (plan/tail_costs.py `optimizer_time`)."""
        return self.params * self.bytes_per_param / (self.hbm_gbps * 1e9)


PROFILED_LAYERS = 2    # transformer layers in the model Sailor's profiler trains (with the embedding and the head)


def load_sailor_updates(directory: str, layers=None) -> list[SailorUpdate]:
    """Every (model, GPU, TP) of profiles_tmp.json with a measured optimizer step and llm_info.json's parameter
    count of the profiled model at that TP (the embedding entry, the first two transformer layers, the last entry).
    `layers`: load_sailor(directory) where the caller has read it already (else it is read here)."""
    path = os.path.join(directory, "profiles_tmp.json")
    data = read_json_file(path, field="--sailor")
    info = read_json_file(os.path.join(directory, "llm_info.json"), field="--sailor")
    # the (model, GPU) runs with measured layers (the fit read them first, and said what it left out)
    runs = {(r.model, r.gpu) for r in (layers if layers is not None else load_sailor(directory, quiet=True))}
    out = []
    for mname, spec, gpu, (dev, _, bw), per_mb in _profiled_runs(data):
        if (mname, gpu) not in runs:
            continue
        by_tp: dict[int, list[float]] = {}
        for mb, per_tp in per_mb.items():
            for tp, entries in per_tp.items():
                for i, e in entries.items():
                    # 0: an entry whose step Sailor did not time (it times a few of each run); below 0, not a time
                    update = 0.0 if len(e) < 3 else measured_time(
                        e[2], file=path, field="update_s", row=f"{mname} {gpu} micro-batch {mb} TP {tp} entry {i}",
                        fix="pass Sailor's measurements unchanged, or delete the entry")
                    if update > 0:
                        by_tp.setdefault(int(tp), []).append(update)
        for tp, ups in sorted(by_tp.items()):
            counts = info.get(mname, {}).get(str(tp))
            if not counts:
                continue         # no parameter count at this TP (V100-16's LLAMA-3-8 at TP 8)
            last = max(counts, key=int)
            params = sum(counts[k]["params_floats"] for k in ("0", *map(str, range(1, PROFILED_LAYERS + 1)), last))
            out.append(SailorUpdate(mname, gpu, dev, tp, float(params), adam_traffic_bytes_per_param(SAILOR_ELEMENT_BYTES),
                                    bw, statistics.median(ups)))
    return out
