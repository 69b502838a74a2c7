"""The `cpu` device's two measured constants (docs/cost-model.md), and the analytic model's per-layer prediction of
single-rank CPU dry runs against the measurement.

1. One core's fp32 GEMM rate: torch.matmul, one thread (a dry-run rank's OMP_NUM_THREADS=1), at the shapes of
   the example CPU models' layers. The catalog's `cpu` peak is that rate over E_max.
2. Per layer and micro-batch, forward and backward, on real Megatron-Core: single-rank dry runs of 2 and 8
   layers (the slope over layers, median over the steps after the first, from the runs' operation stamps), at
   hidden 32 / sequence 16 (the tiny model) and hidden 256 / sequence 128 (the example CPU plans' width), micro-
   batch 1 and 4. `Calibration.host_layer_s` for `cpu` is the first row's measurement less the roofline's own
   price of that layer; the other rows are out of sample.

    python benchmarks/cpu_device.py            (about two minutes on two cores; run it on an idle machine)
"""
from __future__ import annotations

import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hetauto_megatron.cost.analytic import DEFAULT_CALIBRATION, AnalyticCostModel  # noqa: E402
from hetauto_megatron.plan.plan import plan_from_dict  # noqa: E402
from hetauto_megatron.spec.devices import get_device  # noqa: E402
from hetauto_megatron.spec.model import PRESETS, model_from_dict  # noqa: E402

SHAPES = {"32, 16": {}, "256, 128": {"hidden_size": 256, "ffn_hidden_size": 1024, "num_attention_heads": 4,
                                      "num_query_groups": 4, "seq_length": 128, "max_position_embeddings": 128,
                                      "vocab_size": 512}}


def gemm_rate() -> list[tuple[tuple, float]]:
    import torch
    torch.set_num_threads(1)
    out = []
    for n, k, m in ((128, 256, 384), (512, 256, 1024), (512, 1024, 256), (2048, 256, 1024)):
        a, b = torch.randn(n, k), torch.randn(k, m)
        for _ in range(3):
            a @ b
        t, reps = time.perf_counter(), 20
        for _ in range(reps):
            a @ b
        out.append(((n, k, m), 2 * n * k * m * reps / (time.perf_counter() - t) / 1e9))
    return out


def model_of(shape: str, layers: int) -> dict:
    return dict(PRESETS["tiny"].to_dict(), num_layers=layers, **SHAPES[shape])


def per_micro_batch(shape: str, layers: int, mbs: int) -> tuple[float, float]:
    """Median forward and backward of one micro-batch through the whole stage, single rank."""
    from hetauto_megatron.runtime.dryrun import run_dryrun
    plan = plan_from_dict({"version": 2, "model": model_of(shape, layers), "global_batch_size": 4 * mbs,
                           "meshes": [{"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 1,
                                       "micro_batch_size": mbs, "recompute": "none", "stage_layers": [layers]}]})
    r = run_dryrun(plan, steps=5, seed=1, tiny=False, reference=False, timeout_s=300)
    if "error" in r:
        raise SystemExit(r["error"])
    fwd, bwd = [], []
    for step in r["ops"][0][1:]:
        for kind, _, t0, t1 in step["ops"]:
            if kind in ("forward", "backward"):
                (fwd if kind == "forward" else bwd).append(t1 - t0)
    return statistics.median(fwd), statistics.median(bwd)


def main() -> None:
    rates = gemm_rate()
    e_max = DEFAULT_CALIBRATION.gemm_max_efficiency
    cpu = get_device("cpu").at_precision("fp32")
    print("one core's fp32 GEMM rate, one thread (n x k x m: GFLOP/s): "
          + ", ".join(f"{n}x{k}x{m}: {g:.1f}" for (n, k, m), g in rates))
    print(f"median {statistics.median(g for _, g in rates):.1f} GFLOP/s = {statistics.median(g for _, g in rates) / e_max / 1e3:.3f} "
          f"TFLOP/s over E_max {e_max}; the catalog's cpu peak: {cpu.peak_tflops} TFLOP/s")
    host = dict(DEFAULT_CALIBRATION.host_layer_s)["cpu"]
    print(f"host time per layer (Calibration.host_layer_s): {host[0] * 1e3:.2f} / {host[1] * 1e3:.2f} ms")
    cm = AnalyticCostModel()
    print(f"\n{'hidden, sequence':>16} {'mbs':>3} {'measured ms fwd / bwd':>22} {'predicted':>16} {'error':>14}")
    errors = []
    for shape in SHAPES:
        for mbs in (1, 4):
            (f2, b2), (f8, b8) = per_micro_batch(shape, 2, mbs), per_micro_batch(shape, 8, mbs)
            mf, mb = (f8 - f2) / 6, (b8 - b2) / 6
            pf, pb = cm.layer_times(model_from_dict(model_of(shape, 8)), cpu, 1, mbs)
            ef, eb = pf / mf - 1, pb / mb - 1
            own = shape == "32, 16" and mbs == 1
            if not own:
                errors += [abs(ef), abs(eb)]
            print(f"{shape:>16} {mbs:>3} {mf * 1e3:>10.3f} / {mb * 1e3:<9.3f} {pf * 1e3:>7.2f} / {pb * 1e3:<6.2f} "
                  f"{ef:>+6.0%} / {eb:<+5.0%}" + ("  (the host time's own row)" if own else ""))
    print(f"\nout of sample (the other rows, both passes): mean |error| {statistics.mean(errors):.0%}, "
          f"worst {max(errors):.0%}")


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
