"""Why single leave-one-model-out folds of the per-layer GPU fit miss (docs/cost-model-learned.md, "The folds over
10 %"): the held-out rows decomposed, and each model's layers against the roofline of the kernels the measured
framework ran.

1. A fold, per measured configuration (the median of its identical layers) and pass: measured, predicted, error,
   the calibrated prior by part (GEMMs, attention FLOPs, score-matrix traffic, the rest), the known part (TP
   all-reduces, PyTorch's softmax passes past 4096 keys) and whether the host floor set the prediction. Fitted as
   `hetauto fit --sailor` fits without the held-out model (weights chosen on the others); the cross-validation keeps
   no boosting rounds on this data, so the calibration is the fit (rounds 0 here).
2. Per GPU and model: the measured pass less its TP all-reduces, divided by (a) the learned prior (with the all-data
   weights) and (b) the sum of the rooflines of the kernels Sailor's Megatron-DeepSpeed fork runs for that layer in
   fp32 (`fork_kernels`, read from its code), each kernel at max(FLOPs at the TF32 peak, bytes at the memory
   bandwidth). A prior that describes the work makes that ratio the same for every model.

    python benchmarks/learned_folds.py [--fold MODEL:GPU ...] [--gpu GPU ...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hetauto_megatron.cost import features as F  # noqa: E402
from hetauto_megatron.cost import learned as L  # noqa: E402

FOLDS = ("LLAMA-3-8:GH-96", "OPT-350:A100-40")


def config_times(layers) -> dict[tuple, tuple]:
    """(model, GPU, micro-batch, TP) -> (a layer of it, {phase: the median over its identical layers}), as the fit
    takes a configuration (cost/learned/sailor.py sailor_samples)."""
    groups: dict[tuple, list] = {}
    for r in layers:
        if r.shape.kind == "transformer":
            groups.setdefault((r.model, r.gpu, r.shape.micro_batch, r.shape.tp), []).append(r)
    return {k: (rs[0], {ph: statistics.median(getattr(r, f"{ph}_s") for r in rs) for ph in ("fwd", "bwd")})
            for k, rs in groups.items()}


def fold(layers, held: str, gpu: str, fits: dict) -> None:
    train, held_layers = L.leave_model_out(layers, held, fits=fits)   # TP all-reduce rates from the training models
    w, g, _ = L.choose_weights(train, fits)
    model = L.train_sailor_model(train, w, rounds=0, gemm_bwd_weight=g)
    test = [r for r in held_layers if r.gpu == gpu and r.shape.kind == "transformer"]
    rows = L.sailor_layer_samples(test, w, g)
    pred = L.predict_samples(model, rows)
    per = {ph: L.mape([p for p, s in zip(pred, rows) if s.phase == ph], [s.measured_s for s in rows if s.phase == ph])
           for ph in ("fwd", "bwd")}
    print(f"\n{held} left out, {gpu}: weights score {w}, TF32 GEMM {g}; per pass over every layer: forward "
          f"{per['fwd']:.1f} %, backward {per['bwd']:.1f} %, both {L.mape(pred, [s.measured_s for s in rows]):.1f} %")
    print(f"{'mb':>3} {'tp':>3} {'pass':>4} {'measured':>9} {'predicted':>9} {'error':>7} | calibrated prior, ms: "
          f"{'GEMM':>6} {'attn':>6} {'scores':>6} {'rest':>6} | {'known':>6}  rate x prior + overhead")
    for _, (r0, times) in sorted(config_times(test).items(), key=lambda kv: (kv[0][2], kv[0][3])):
        for ph in ("fwd", "bwd"):
            s = next(x for x in L.sailor_layer_samples([r0], w, g) if x.phase == ph)
            s = L.Sample(**{**s.__dict__, "measured_s": times[ph]})
            p = L.predict_samples(model, [s])[0]
            rate, ovh = model.calibration.get(s.calibration_key(), (1.0, 0.0))
            gw = F.backward_gemm_weight(r0.device, r0.precision, g)
            parts = F.layer_prior_parts(r0.shape.ops(), ph, r0.dtype_bytes, r0.compute_tflops, r0.hbm_gbps, w,
                                        F.extra_score_pass(r0.shape), gw)
            floor = model.floor_s(s.device, ph, s.tp)
            print(f"{r0.shape.micro_batch:>3} {r0.shape.tp:>3} {ph:>4} {times[ph] * 1e3:9.2f} {p * 1e3:9.2f} "
                  f"{100 * (p - times[ph]) / times[ph]:+6.1f}% | {'':>22}"
                  + "".join(f"{rate * parts[k] * 1e3:7.2f}" for k in ("gemm", "attention", "scores", "other"))
                  + f" | {s.known_s * 1e3:6.2f}  x{rate:.3f} + {ovh * 1e3:.2f} ms"
                  + ("  (host floor)" if p == floor else ""))


# ---- the kernels Sailor's fork runs for one transformer layer on one TP rank, fp32 -------------------------------
# Read from third_party/Megatron-DeepSpeed at the packaged commit: megatron/model/{opt_model,gpt_neo_model,
# llama_model}.py, fused_softmax.py, and the Sailor profiler's launch line (profile_all.py: no --fp16/--bf16, so the
# fused softmax kernel, 16-bit input only, never runs; apply_query_key_layer_scaling keeps its default True).
# (name, class, FLOPs, bytes); T tokens, H hidden, Q = H / TP, Fn = FFN / TP, S score elements, hn head dim, 4-byte
# elements. Element-wise passes are counted kernel by kernel (r + w of each tensor they touch).
def fork_kernels(model: str, phase: str, shape) -> list[tuple[str, str, float, float]]:
    T, H = shape.micro_batch * shape.seq, shape.hidden
    nh, hn = shape.heads // shape.tp, shape.hidden // shape.heads
    Q, Fn, S = nh * hn, shape.ffn // shape.tp, shape.micro_batch * nh * shape.seq * shape.seq
    llama, bwd = model == "LLAMA-3-8", phase == "bwd"
    out = []

    def gemm(name, m, k, n):   # forward X W^T; backward dgrad and wgrad, each as many FLOPs
        for part in (("dgrad", "wgrad") if bwd else ("",)):
            out.append((f"{name} {part}".strip(), "gemm", 2.0 * m * k * n, 4.0 * (m * k + k * n + m * n)))

    def elementwise(name, fwd_bytes, bwd_bytes, cls="elementwise"):
        out.append((name, cls, 0.0, bwd_bytes if bwd else fwd_bytes))

    # norms: OPT's apex LayerNorm and GPT-Neo's torch.nn.LayerNorm are one kernel each way; the fork's LLaMA RMSNorm
    # is PyTorch ops (pow, mean, x * rsqrt, weight *): 7 passes forward, about 20 backward
    norm = (28 * T * H, 80 * T * H) if llama else (8 * T * H, 20 * T * H)
    elementwise("norm", *norm)
    gemm("qkv", T, H, 3 * Q)
    elementwise("qkv bias, split", 24 * T * Q, 36 * T * Q)
    if llama:   # rotate_half and two multiplies and an add for q and k, then q, k, v made contiguous
        elementwise("rotary, copies", 4 * 26 * T * Q, 4 * 34 * T * Q)
    for name in (("QK^T", "PV") if not bwd else ("dP", "dV", "dQ", "dK")):   # baddbmm / bmm over the s x s scores
        out.append((name, "bmm", 2.0 * S * hn, 4.0 * (S + 2 * T * Q)))
    if llama:   # layer scaling: input * layer_number before the mask (coeff None in OPT and GPT-Neo)
        elementwise("scale", 8 * S, 8 * S, "score")
    elementwise("mask (masked_fill_)", 9 * S, 9 * S, "score")
    elementwise("softmax", 8 * S, 12 * S, "score")
    elementwise("context copy", 8 * T * Q, 8 * T * Q)
    gemm("proj", T, Q, H)
    elementwise("residual", 12 * T * H, 12 * T * H)
    elementwise("norm", *norm)
    if llama:   # gate_proj and up_proj are two GEMMs; silu(gate * up)
        gemm("gate", T, H, Fn)
        gemm("up", T, H, Fn)
        elementwise("gate * up, silu", 20 * T * Fn, 36 * T * Fn)
    else:
        gemm("fc1", T, H, Fn)
        elementwise("relu / gelu", 8 * T * Fn, 12 * T * Fn)
    gemm("fc2", T, Fn, H)
    elementwise("residual", 12 * T * H, 12 * T * H)
    return out


def kernel_roofline_s(r, phase: str) -> dict[str, float]:
    """Seconds by kernel class: each kernel at max(FLOPs at the run's compute ceiling, bytes at the bandwidth)."""
    peak, bw = r.compute_tflops * 1e12, r.hbm_gbps * 1e9
    out: dict[str, float] = {}
    for _, cls, flops, nbytes in fork_kernels(r.model, phase, r.shape):
        out[cls] = out.get(cls, 0.0) + max(flops / peak, nbytes / bw)
    return out


def roofline_ratios(layers, gpu: str, score_bwd_weight: float, gemm_bwd_weight: float) -> dict:
    """(model, phase) -> [(measured less known / learned prior, measured less TP all-reduces / kernel rooflines,
    measured, kernel rooflines by class)] over the GPU's TF32 configurations that are not host-bound, the learned
    prior with the given backward weights (`consistency` passes those the fit chooses on all the data)."""
    rows = [r for r in layers if r.gpu == gpu and r.shape.kind == "transformer" and r.precision == "tf32"]
    hb = {(k[0], k[3], k[4], ph) for k, ph in L.host_bound_times(rows)}
    out: dict[tuple, list] = {}
    for (m, _, mb, tp), (r0, times) in config_times(rows).items():
        for ph in ("fwd", "bwd"):
            if (m, mb, tp, ph) in hb:
                continue
            s = next(x for x in L.sailor_layer_samples([r0], score_bwd_weight, gemm_bwd_weight) if x.phase == ph)
            kr = kernel_roofline_s(r0, ph)
            out.setdefault((m, ph), []).append(((times[ph] - s.known_s) / s.prior_s,
                                                (times[ph] - r0.tp_comm_s) / sum(kr.values()), times[ph], kr))
    return out


CLASSES = (("gemm", "elementwise"), ("bmm", "score"))   # GEMMs and element-wise kernels; the attention kernels


def two_class_fit(ratios: dict, phase: str, models) -> tuple[float, float]:
    """(multiple of the GEMM and element-wise kernels' rooflines, multiple of the attention kernels') that fits the
    measured passes of `models` best in relative error (least squares, no intercept)."""
    import numpy as np
    A, b = [], []
    for (m, ph), v in ratios.items():
        if ph == phase and m in models:
            for _, kratio, _, kr in v:
                A.append([sum(kr.get(c, 0.0) for c in cls) for cls in CLASSES])
                b.append(kratio * sum(kr.values()))
    A, b = np.array(A), np.array(b)
    coef = np.linalg.lstsq(A / b[:, None], np.ones(len(b)), rcond=None)[0]
    return float(coef[0]), float(coef[1])


def two_class_errors(ratios: dict, phase: str, coef, model: str) -> float:
    """Median error % of `model`'s passes priced with the two multiples `coef`."""
    errs = []
    for _, kratio, _, kr in ratios.get((model, phase), []):
        meas = kratio * sum(kr.values())
        pred = sum(c * sum(kr.get(k, 0.0) for k in cls) for c, cls in zip(coef, CLASSES))
        errs.append(100 * (pred - meas) / meas)
    return statistics.median(errs)


def consistency(layers, gpu: str, weights: tuple[float, float]) -> None:
    print(f"\n{gpu}, TF32 runs, configurations not host-bound: measured pass less its known part over the learned "
          f"prior (weights {weights[0]:g} / {weights[1]:g}, chosen on all the data as `hetauto fit --sailor` "
          "chooses them), and less its TP all-reduces over the fork's kernel rooflines; min, median, max")
    print(f"{'model':<12} {'pass':>4} {'configs':>7} {'/ learned prior':>18} {'/ kernel rooflines':>20}  "
          f"kernel rooflines by class (largest configuration)")
    ratios = roofline_ratios(layers, gpu, *weights)
    for (m, ph), v in sorted(ratios.items()):
        a, b = sorted(x[0] for x in v), sorted(x[1] for x in v)
        big = max(v, key=lambda x: x[2])[3]
        tot = sum(big.values())
        print(f"{m:<12} {ph:>4} {len(v):>7} {a[0]:5.2f} {statistics.median(a):5.2f} {a[-1]:5.2f}  "
              f"{b[0]:5.2f} {statistics.median(b):5.2f} {b[-1]:5.2f}   "
              + ", ".join(f"{k} {100 * x / tot:.0f} %" for k, x in big.items()))
    models = sorted({m for m, _ in ratios})
    for ph in ("fwd", "bwd"):
        coef = two_class_fit(ratios, ph, models)
        line = (f"{ph}: GEMMs and element-wise kernels x{coef[0]:.2f}, attention kernels (bmm, softmax, mask, scale) "
                f"x{coef[1]:.2f} their rooflines (all models); median error " + ", ".join(
                    f"{m} {two_class_errors(ratios, ph, coef, m):+.1f} %" for m in models))
        if len(models) > 2:
            loo = {m: two_class_fit(ratios, ph, [o for o in models if o != m]) for m in models}
            line += "; each model from the others: " + ", ".join(
                f"{m} {two_class_errors(ratios, ph, loo[m], m):+.1f} %" for m in models)
        print("  " + line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fold", action="append", help="MODEL:GPU held out (default: " + ", ".join(FOLDS) + ")")
    ap.add_argument("--gpu", action="append", help="GPU for the consistency table (default: GH-96, A100-40)")
    args = ap.parse_args()
    layers = L.load_sailor(L.SAILOR_DATA)
    fits = L.read_allreduce_fits(L.SAILOR_DATA)
    for spec in args.fold or FOLDS:
        held, gpu = spec.split(":")
        fold(layers, held, gpu, fits)
    weights = L.choose_weights(layers, fits)[:2]
    for gpu in args.gpu or ("GH-96", "A100-40"):
        consistency(layers, gpu, weights)
    return 0


if __name__ == "__main__":
    sys.exit(main())
