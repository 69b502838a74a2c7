"""Predicted peak memory per GPU against Sailor's measured GH200 runs (data/sailor/validation-runs.json).

Sailor trains with its Megatron-DeepSpeed fork: fp32, Adam state on every rank (no optimizer sharding), no
sequence parallelism, Megatron's unfused attention with dropout. The memory model (cost/memory.py) is
configured to those settings, never fitted to the runs, and printed three ways:
  plan defaults   what `hetauto plan` assumes for a bf16 Megatron-Core job (distributed optimizer,
                  Transformer Engine layers): the figure the issue reported (about a third of the measurement)
  job settings    fp32, no optimizer sharding, no SP, unfused attention with dropout; our nvidia overheads
  + fork consts   the same, plus the framework constants Sailor's own simulator documents for its fork
                  (sailor/Planner/simulations/runtime_simulator.py: 4.76e9 + 300e6 bytes of kernels and context,
                  8 bytes per parameter for DeepSpeed's two extra model copies and its communication buffer)
Stage memory is the max over the pipeline's stages (in flight: min(p - i, micro-batches)); the embedding and
head entries Sailor counts as layers are the first and last stage's embedding and head.

    python benchmarks/memory_sailor.py
"""
from __future__ import annotations

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hetauto_megatron.cost.learned.sailor import SAILOR_MODELS  # noqa: E402
from hetauto_megatron.cost.memory import GIB, TRANSFORMER_ENGINE, LayerImpl, stage_memory_bytes  # noqa: E402
from hetauto_megatron.plan.settings import RuntimeSettings, default_settings, padded_vocab_size  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hetauto_megatron", "data",
                    "sailor", "validation-runs.json")
SAILOR_JOB = RuntimeSettings(sequence_parallel=False, distributed_optimizer=False, overlap_grad_reduce=False,
                             overlap_param_gather=False)
SAILOR_LAYERS = LayerImpl(flash_attention=False, dropout=True)
FORK_FIXED_BYTES = 4.76e9 + 300e6      # Sailor's documented kernel loading and context for its fork
FORK_BYTES_PER_PARAM = 8               # DeepSpeed's extra model copies (4) and communication buffer (4)


def predicted_peak(run: dict, *, dtype_bytes: int, settings, impl, fork: bool = False) -> float:
    model = SAILOR_MODELS[run["model"]]
    model = model.replace(vocab_size=padded_vocab_size(model.vocab_size, run["tp"]), tie_embeddings=True)
    p = len(run["stage_layers"])
    micro = run["global_batch_size"] // (run["micro_batch_size"] * run["dp"][0])
    peaks = []
    for i, entries in enumerate(run["stage_layers"]):
        first, last = i == 0, i == p - 1
        b = stage_memory_bytes(model, layers=entries - first - last, tp=run["tp"][i], dp=run["dp"][i],
                               micro_batch_size=run["micro_batch_size"], recompute="none",
                               in_flight=min(p - i, micro), first=first, last=last,
                               settings=settings or default_settings(run["tp"][i]), vendor="nvidia",
                               dtype_bytes=dtype_bytes, impl=impl)
        total = b["total"]
        if fork:
            total += FORK_BYTES_PER_PARAM * b["params"] + FORK_FIXED_BYTES - b["reserved"]
        peaks.append(total)
    return max(peaks)


VARIANTS = {
    "plan defaults": dict(dtype_bytes=2, settings=None, impl=TRANSFORMER_ENGINE),
    "job settings": dict(dtype_bytes=4, settings=SAILOR_JOB, impl=SAILOR_LAYERS),
    "+ fork consts": dict(dtype_bytes=4, settings=SAILOR_JOB, impl=SAILOR_LAYERS, fork=True),
}


def main() -> None:
    with open(DATA) as f:
        runs = json.load(f)
    print(f"{'run':<42} {'mbs':>3} {'measured':>9}  " + "  ".join(f"{k:>13}" for k in VARIANTS) + "   (GiB)")
    ratios = {k: [] for k in VARIANTS}
    for r in runs:
        measured = r["measured_max_mem_bytes"]
        pred = {k: predicted_peak(r, **kw) for k, kw in VARIANTS.items()}
        for k, v in pred.items():
            ratios[k].append(v / measured)
        print(f"{r['model'] + ' ' + r['file'].split('/')[-1]:<42} {r['micro_batch_size']:>3} {measured / GIB:>9.1f}  "
              + "  ".join(f"{pred[k] / GIB:>13.1f}" for k in VARIANTS))
    for k, rs in ratios.items():
        print(f"{k:<14} predicted/measured: median {statistics.median(rs):.2f}, range {min(rs):.2f}-{max(rs):.2f}, "
              f"MAPE {100 * statistics.mean(abs(x - 1) for x in rs):.1f} % over {len(rs)} runs")


if __name__ == "__main__":
    main()
