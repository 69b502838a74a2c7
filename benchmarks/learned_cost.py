"""Accuracy of the learned cost model, printed as tables.

1. This CPU: `hetauto profile --quick` (reused when the file exists; --fresh re-profiles), fit with 20% of the
   shapes held out, held-out MAPE on operator time for several random splits (target <= 10%).
2. The shipped GPU measurements (hetauto_megatron/data/sailor, from the Sailor project): the precision each
   run used (recovered), then leave-one-model-out, i.e. fit on three models and predict every measured
   transformer layer of the fourth, MAPE per GPU type and held-out model (target <= 10% on A100-40 and GH-96).
   Two measures: the layer's time (forward + backward of each measured layer, what a pipeline stage costs per
   micro-batch and what the planner's 1F1B model adds up), and the stricter per-pass one (forward and backward
   rows apart, where an error that moves time from one pass to the other counts twice); the calibration alone
   and the roofline prior are shown per pass.

3. The packaged NVIDIA H200 measurements (hetauto_megatron/data/h200, measured by `hetauto profile`): held-out
   MAPE on operator time over the same random splits, the model fitted on the quick grid against a separately
   measured part of the full grid (larger shapes), and whole layers: the sum of operators, the composed layer
   time (leave one model out) and the analytic model, each against 96 measured layers.

    python benchmarks/learned_cost.py [--workdir DIR] [--fresh] [--skip-cpu]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hetauto_megatron.cost import learned as L  # noqa: E402
from hetauto_megatron.measure.profile import profile, stderr_progress  # noqa: E402
from hetauto_megatron.spec.devices import get_device  # noqa: E402

SAILOR = L.SAILOR_DATA


def cpu_part(workdir: str, fresh: bool, seeds=(0, 1, 2, 3, 4)) -> None:
    prof = os.path.join(workdir, "profile-cpu.jsonl")
    if fresh and os.path.exists(prof):
        os.remove(prof)
    t = time.perf_counter()
    summary = profile(get_device("cpu"), prof, grid="quick-cpu", progress=stderr_progress)
    print(f"\n[1] CPU quick profile: {summary['operators']} operators, {summary['measured_now']} measured in "
          f"{time.perf_counter() - t:.1f} s ({summary['resumed']} reused)")
    heldout_splits(L.profile_samples(prof)[1], seeds)


def heldout_splits(samples, seeds=(0, 1, 2, 3, 4)) -> None:
    """Held-out MAPE on operator time: fit on 80% of the shapes, predict the other 20%, for several splits."""
    print(f"{'split seed':>10} {'fwd MAPE %':>11} {'bwd MAPE %':>11} {'all MAPE %':>11} {'prior MAPE %':>13}")
    alls = []
    for seed in seeds:
        train, test = L.split_holdout(samples, 0.2, seed)
        pred = L.predict_samples(L.train_model(train, seed), test)
        by = {ph: [(p, s.measured_s) for p, s in zip(pred, test) if s.phase == ph] for ph in ("fwd", "bwd")}
        m = {ph: L.mape([a for a, _ in v], [b for _, b in v]) for ph, v in by.items()}
        allm = L.mape(pred, [s.measured_s for s in test])
        alls.append(allm)
        prior = L.mape([s.prior_s for s in test], [s.measured_s for s in test])
        print(f"{seed:>10} {m['fwd']:>11.2f} {m['bwd']:>11.2f} {allm:>11.2f} {prior:>13.1f}")
    print(f"{'mean':>10} {'':>11} {'':>11} {sum(alls) / len(alls):>11.2f}   (target <= 10)")


def sailor_part() -> None:
    layers = L.load_sailor(SAILOR)
    models = sorted({r.model for r in layers})
    prec = L.sailor_precisions(layers)
    print("\n[2] Sailor GPU measurements. Arithmetic of each run (recovered, see docs/cost-model-learned.md):")
    for gpu in sorted({g for _, g in prec}):
        best = {m: max(L.forward_tflops(r) for r in layers if r.model == m and r.gpu == gpu
                       and r.shape.kind == "transformer") for m, g in prec if g == gpu}
        print(f"    {gpu:<10} FP32 peak {L.SAILOR_FP32_TFLOPS[gpu]:5.1f} TFLOP/s; " + ", ".join(
            f"{m} {prec[(m, gpu)]} (best {v:.1f})" for m, v in sorted(best.items())))
    print("Leave-one-model-out MAPE % over every measured transformer layer of the held-out model. 'layer': its "
          "forward + backward time; 'per pass': forward and backward rows apart:")
    print(f"{'GPU':<10} {'held-out model':<14} {'layers':>7} {'layer %':>8} {'per pass %':>11} "
          f"{'calibrated %':>13} {'prior %':>8}")
    agg: dict[str, dict[str, list]] = {}
    fits = L.read_allreduce_fits(SAILOR)     # Sailor's all-reduce curves, read once for every fold
    for held in models:
        # what `hetauto fit --sailor` does on the three training models: the backward score-traffic weight chosen
        # by leave-one-model-out among them, then the calibration and the trees
        # the TP all-reduces' rates read from the training models only, for the held-out rows too
        train_layers, held_layers = L.leave_model_out(layers, held, fits=fits)
        weight, gemm_weight, _ = L.choose_weights(train_layers, fits)
        model = L.train_sailor_model(train_layers, weight, 0, gemm_bwd_weight=gemm_weight)
        calibrated = L.train_sailor_model(train_layers, weight, 0, rounds=0, gemm_bwd_weight=gemm_weight)
        trained_gpus = {r.gpu for r in layers if r.model != held}
        test_layers = [r for r in held_layers if r.shape.kind == "transformer"]
        print(f"  (fit without {held}: backward score-traffic weight {weight}, TF32 GEMM weight {gemm_weight}; boosting rounds kept by "
              "cross-validation: " + ", ".join(f"{k} {v}" for k, v in sorted(model.rounds.items())) + "; host floor: "
              + (", ".join(f"{k.replace('|', ' ')} {v * 1e3:.2f} ms" for k, v in sorted(model.host_floor.items()))
                 or "none") + ")")
        for gpu in sorted({r.gpu for r in test_layers}):
            sel = [r for r in test_layers if r.gpu == gpu]
            ss = L.sailor_layer_samples(sel, weight, gemm_weight)
            if gpu not in trained_gpus:
                print(f"{gpu:<10} {held:<14} {len(sel):>7} {'n/a':>8}  (no other model measured on it)")
                continue
            pred, cal = L.predict_samples(model, ss), L.predict_samples(calibrated, ss)
            meas, prior = [s.measured_s for s in ss], [s.baseline_s for s in ss]
            lt = L.layer_time_pairs(ss, pred)
            a = agg.setdefault(gpu, {"pass": [], "layer": []})
            a["pass"].extend(zip(pred, cal, prior, meas))
            a["layer"].extend(lt)
            print(f"{gpu:<10} {held:<14} {len(sel):>7} {L.mape(*zip(*lt)):>8.1f} {L.mape(pred, meas):>11.1f} "
                  f"{L.mape(cal, meas):>13.1f} {L.mape(prior, meas):>8.1f}")
    print(f"\n{'GPU':<10} {'all folds: layer %':>19} {'per pass %':>11} {'calibrated %':>13} {'prior %':>8}")
    for gpu, a in sorted(agg.items()):
        v = a["pass"]
        meas = [m for *_, m in v]
        print(f"{gpu:<10} {L.mape(*zip(*a['layer'])):>19.1f} {L.mape([p for p, *_ in v], meas):>11.1f} "
              f"{L.mape([c for _, c, *_ in v], meas):>13.1f} {L.mape([p for _, _, p, _ in v], meas):>8.1f}")
    print("targets: <= 10 on A100-40 and GH-96. 'calibrated': stage 1 alone (no trees); 'prior': the roofline "
          "plus the TP all-reduces")


def sailor_optimizer_part() -> None:
    """The optimizer step of Sailor's profiled model (its third figure: one Adam call over the embedding, two
    layers and the head), fitted per GPU on the other models, each model left out in turn, against the bare
    memory traffic the analytic model prices."""
    from hetauto_megatron.cost.learned.optimizer_step import fit_optimizer
    from hetauto_megatron.cost.learned.sailor_updates import load_sailor_updates
    table, report = fit_optimizer(load_sailor_updates(SAILOR))
    print("\nOptimizer step (one call over the profiled model), leave one model out (kept where at least two models "
          "were measured and it beats the traffic alone):")
    print(f"{'device':<12} {'models':>6} {'rows':>5} {'learned %':>10} {'traffic %':>10}  fitted on all models")
    for key, r in report.items():
        dev = key.split()[0]
        fit = f"x{table[dev][0]:.2f} + {table[dev][1] * 1e3:.3f} ms/step" if dev in table else "not kept"
        lomo = f"{r['mape_pct']:.1f}" if r["mape_pct"] is not None else "n/a"
        print(f"{dev:<12} {r['models']:>6} {r['rows']:>5} {lomo:>10} {r['traffic_mape_pct']:>10.1f}  {fit}")


def h200_part(workdir: str) -> None:
    prof, layers, full = (os.path.join(L.H200_DATA, f) for f in
                          ("profile-h200.jsonl", "layers-h200.jsonl", "profile-h200-full-grid-part.jsonl"))
    print("\n[3] NVIDIA H200 (packaged measurements, bf16, CUDA-event device time). Quick grid, held out:")
    heldout_splits(L.profile_samples(prof)[1])
    # One fit: the layers only add stage 3, so the operator predictions are those of the quick grid alone.
    model_dir = os.path.join(workdir, "h200-model")
    res = L.fit([prof, layers], model_dir, holdout=0.0)
    model = L.LearnedCostModel(model_dir)
    v = L.validate(model, L.profile_samples(full)[1])
    print("Fitted on the quick grid, predicting the separately measured full-grid part (larger shapes):")
    print(f"{'kind':<12} {'phase':<6} {'rows':>5} {'learned %':>10} {'prior %':>9}")
    kinds = sorted({r["label"].split()[1].split(":")[0] for r in v["rows"]})
    for kind in kinds:
        for ph in ("fwd", "bwd"):
            sel = [r for r in v["rows"] if r["phase"] == ph and r["label"].split()[1].startswith(kind + ":")]
            print(f"{kind:<12} {ph:<6} {len(sel):>5} {L.mape([r['predicted_s'] for r in sel], [r['measured_s'] for r in sel]):>10.1f} "
                  f"{L.mape([r['prior_s'] for r in sel], [r['measured_s'] for r in sel]):>9.1f}")
    for k, s in v["summary"].items():
        print(f"{'all ' + k:<19} {s['rows']:>5} {s['mape_pct']:>10.1f} {s['prior_mape_pct']:>9.1f}")
    lv = L.validate_layers(model, [layers])
    print("Whole layers (96 measured; one TP rank, no sequence parallelism), MAPE %:")
    print(f"{'phase':<6} {'sum of operators':>17} {'composed, model left out':>25} {'analytic model':>15}")
    for ph in ("fwd", "bwd"):
        c = res.heldout[f"h200 layer-composition {ph}"]
        a = lv["summary"][f"h200 {ph}"]
        print(f"{ph:<6} {c['sum_of_operators_mape_pct']:>17.1f} {c['mape_pct']:>25.1f} {a['analytic_mape_pct']:>15.1f}")
    print("composition kept: " + ", ".join(f"{k.replace('|', ' ')} x{r:.3f} + {o * 1e6:.0f} us"
                                           for k, (r, o) in sorted(res.composition.items())))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=os.path.join(ROOT, "out", "learned_cost"))
    ap.add_argument("--fresh", action="store_true", help="re-profile instead of reusing the profile file")
    ap.add_argument("--skip-cpu", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    if not args.skip_cpu:
        cpu_part(args.workdir, args.fresh)
    sailor_part()
    sailor_optimizer_part()
    h200_part(args.workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
