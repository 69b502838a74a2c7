"""`hetauto fit`: fit the learned (LightGBM) cost model from operator profiles and/or per-layer GPU data."""
from __future__ import annotations

from ..outputs import json_text

# What a bare `--sailor` stores; `sailor_path` resolves it to the packaged copy (cost.learned is imported lazily).
SAILOR_DEFAULT = "packaged"


def sailor_path(value: str | None) -> str | None:
    """The Sailor data directory a `--sailor[=DIR]` option names."""
    if value != SAILOR_DEFAULT:
        return value
    from ..cost.learned import SAILOR_DATA
    return SAILOR_DATA

DESCRIPTION = """\
Fit a cost model from measured times: operator profiles written by 'hetauto profile' (one file per device
type: a second grid of a device is profiled into its file, which 'hetauto profile' resumes) and, with --sailor,
the published per-layer GPU measurements of the Sailor project (A100, V100, GH200, RTX GPUs; a copy ships with
hetauto, --sailor=DIR reads another directory holding profiles_tmp.json).

Two stages. (1) The roofline prior, calibrated per device type, phase and operator kind:
time = rate x prior + overhead. (2) LightGBM regressors correcting what is left,
time = calibrated x exp(prediction), with the number of boosting rounds chosen by cross-validation over
whole shapes or models (the fewest rounds within one standard error of the best; 0 = trees do not carry over
and the calibration answers alone). The report says how many rounds each booster kept.

A share of the rows (--holdout) is kept aside first to report the error on unseen shapes; then the model is
refitted on all rows and written to MODEL_DIR: manifest.json (with the calibration) plus each kept booster in
LightGBM's text format. 'hetauto plan/simulate --cost-model MODEL_DIR' use it for the device types it covers
and the analytic model for the others.

Whole layers timed by 'hetauto profile --layers' (pass the file among the PROFILEs, with the same device's
operator profile, timed in the same dtype and, on cpu, with the same --threads) add a third stage: a layer's
time = rate x (sum of its operators) + overhead, per device and phase, for the backward work no isolated
operator does (gradient accumulation where the residual stream forks, assembling the gradients of fused
projections). Its leave-one-model-out error is reported."""

EPILOG = """\
examples:
  hetauto fit profiles/profile-cpu.jsonl -o cost-model/
  hetauto fit profiles/*.jsonl --sailor -o cost-model/ --json      # + the packaged GPU data
  hetauto fit profiles/profile-h200.jsonl profiles/layers-h200.jsonl -o h200-model/   # + whole layers

exit codes: 0 ok, 2 invalid input (a missing or malformed profile, an output path that is a file, ...)."""


def add_arguments(p):
    p.add_argument("profiles", nargs="*", metavar="PROFILE", help="profile files from 'hetauto profile' (operators "
                                                                 "and, optionally, --layers files)")
    p.add_argument("-o", "--out", required=True, metavar="MODEL_DIR", help="directory to write the model to")
    p.add_argument("--sailor", metavar="DIR", nargs="?", const=SAILOR_DEFAULT,
                   help="also fit Sailor's per-layer GPU times: alone, the packaged copy; --sailor=DIR another "
                        "directory holding profiles_tmp.json")
    p.add_argument("--holdout", type=float, default=0.2, metavar="SHARE",
                   help="share of shapes held out to report the error (default 0.2; 0 = none)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the hold-out draw, the cross-validation folds and LightGBM (default 0); the same "
                        "profiles and seed give the same model")
    p.add_argument("--json", action="store_true", help="print the fit report as JSON")


def run(args) -> int:
    from ..cost.learned import fit
    from ._common import check_output_dir
    from ..cost.learned.manifest import check_model_files
    check_output_dir(args.out, "-o")      # before the fit, which takes minutes
    check_model_files(args.out, "-o")
    res = fit(list(args.profiles), args.out, sailor_dir=sailor_path(args.sailor), holdout=args.holdout,
              seed=args.seed)
    if args.json:
        print(json_text(res.to_dict(), indent=1, sort_keys=True))
        return 0
    print(f"fitted {res.rows} rows -> {res.model_dir}")
    print(f"device types: {', '.join(f'{k} ({v.granularity})' for k, v in sorted(res.devices.items()))}")
    print("boosting rounds kept (cross-validated; 0 = calibrated roofline alone): "
          + ", ".join(f"{k} {v}" for k, v in sorted(res.rounds.items())))
    if args.sailor:
        print(f"backward score-traffic weight of the per-layer data: {res.score_bwd_weight}; backward TF32 GEMM weight "
              f"on K-major-only GPUs: {res.gemm_bwd_weight} (both chosen by leave-one-model-out among its models)")
        print("host floor of a layer's pass (measured where doubling the micro-batch adds under half to the time): "
              + (", ".join(f"{k.replace('|', ' ')} {v * 1e3:.2f} ms" for k, v in sorted(res.host_floor.items()))
                 or "none"))
    if res.composition:
        print("layer composition (whole layers measured; layer = rate x sum of operators + overhead): " + ", ".join(
            f"{k.replace('|', ' ')} x{r:.3f} + {o * 1e6:.0f} us" for k, (r, o) in sorted(res.composition.items())))
    if res.heldout:
        print(f"held-out error ({args.holdout:.0%} of operator shapes; per-layer data: of (device, model) pairs):")
        print(f"  {'device granularity phase':<32} {'rows':>6} {'MAPE %':>8}")
        for k, v in res.heldout.items():
            if "sum_of_operators_mape_pct" in v or "traffic_mape_pct" in v:
                continue
            print(f"  {k:<32} {v['rows']:>6} {v['mape_pct']:>8.2f}")
    _leave_one_model_out(res.heldout, "sum_of_operators_mape_pct", " layer-composition",
                         "whole layers, leave one model out (composition kept only where it beats the plain sum):",
                         ("device phase", "layers", "sum MAPE %", "composed MAPE %"))
    _leave_one_model_out(res.heldout, "traffic_mape_pct", " optimizer-step",
                         "optimizer step (one per stage and iteration), leave one model out (kept only where it beats the bare memory "
                         "traffic):", ("device", "rows", "traffic MAPE %", "fitted MAPE %"))
    return 0


def _leave_one_model_out(heldout: dict, baseline_key: str, suffix: str, title: str, columns: tuple):
    """One leave-one-model-out table: per device, the baseline's error beside the fitted stage's and whether the
    fitted stage was kept (the layer composition and the optimizer step report the same way)."""
    rows = {k: v for k, v in heldout.items() if baseline_key in v}
    if not rows:
        return
    first, rows_name, baseline_name, fitted_name = columns
    wb, wf = len(baseline_name) + 1, len(fitted_name) + 1
    print(title)
    print(f"  {first:<32} {rows_name:>6} {'models':>6} {baseline_name:>{wb}} {fitted_name:>{wf}} kept")
    for k, v in rows.items():
        fitted = f"{v['mape_pct']:.2f}" if v["mape_pct"] is not None else "n/a"
        print(f"  {k.replace(suffix, ''):<32} {v['rows']:>6} {v['models']:>6} "
              f"{v[baseline_key]:>{wb}.2f} {fitted:>{wf}} {'yes' if v['kept'] else 'no'}")
