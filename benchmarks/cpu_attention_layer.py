"""The learned model's CPU layer against the layer the dry run builds, timed on this CPU, at a sequence where the
s x s attention is most of the layer's time (docs/cost-model-learned.md, "The attention each device runs").

This CPU is profiled on the tiny grid (sequences of 16 and 32) and fitted without a hold-out, as `hetauto profile
--grid tiny` and `hetauto fit` do; one layer at 512 tokens (4 heads, 2 key/value groups, head dimension 16: a 16x
extrapolation in sequence) is priced composed from the unfused attention operator (what Megatron's local layers,
the CPU meshes', run) and from the fused one (what the learned model priced CPU meshes with before), and timed as
Megatron-Core builds it (measure/layer_timing.py). Prints both compositions against the measurement, per pass.
The target: the unfused composition within a factor 2 of the measurement, nearer than the fused one. Wall-clock
timing: run it on an idle machine (on two busy cores the measurement drifts 2-3x between the profile and the layer).

    python benchmarks/cpu_attention_layer.py          (about a minute)
"""
from __future__ import annotations

import math
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hetauto_megatron.cli import main as hetauto  # noqa: E402
from hetauto_megatron.cost import features as F  # noqa: E402
from hetauto_megatron.cost import learned as L  # noqa: E402
from hetauto_megatron.spec.model import ModelSpec  # noqa: E402

TIMING = dict(warmup=2, min_reps=7, max_reps=40, budget_s=0.4)
HEADS, KV, HEAD_DIM, SEQ = 4, 2, 16, 512


def main() -> int:
    from hetauto_megatron.measure.layer_timing import megatron_layer_times
    from hetauto_megatron.runtime.dryrun import preload_megatron

    d = tempfile.mkdtemp(prefix="cpu-attention-layer-")
    if hetauto(["profile", "--device-type", "cpu", "--grid", "tiny", "--out", d]) != 0:
        return 1
    if hetauto(["fit", os.path.join(d, "profile-cpu.jsonl"), "-o", os.path.join(d, "model"), "--holdout", "0"]):
        return 1
    model = L.LearnedCostModel(os.path.join(d, "model"))
    info = model.devices["cpu"]
    spec = ModelSpec("attn", 1, HEADS * HEAD_DIM, HEADS, 4 * HEADS * HEAD_DIM, 128, SEQ, num_query_groups=KV)
    preload_megatron()
    measured = megatron_layer_times(F.LayerShape.of(spec, 1, 1), "attn", timing=TIMING, threads=1)
    unfused = model.fitted.composed_layer_times(info, F.layer_ops(spec, 1, 1, unfused_attention=True))
    fused = model.fitted.composed_layer_times(info, F.layer_ops(spec, 1, 1))
    print(f"one layer at {SEQ} tokens ({HEADS} heads, {KV} KV groups, head dim {HEAD_DIM}), ms: measured / "
          "composed unfused (x measured) / composed fused (x measured)")
    ok = True
    for i, phase in enumerate(("fwd", "bwd")):
        m = measured[f"{phase}_p10_s"]
        print(f"  {phase}  {m * 1e3:8.2f}  {unfused[i] * 1e3:8.2f} ({unfused[i] / m:4.2f}x)  "
              f"{fused[i] * 1e3:8.2f} ({fused[i] / m:4.2f}x)")
        ok &= m / 2 < unfused[i] < 2 * m and abs(math.log(unfused[i] / m)) < abs(math.log(fused[i] / m))
    print("target (unfused within 2x, nearer than fused):", "met" if ok else "missed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
