"""`hetauto validate-cost-model`: predicted vs measured times, per row and as MAPE."""
from __future__ import annotations

import json

from ..errors import InputError
from .fit import SAILOR_DEFAULT

DESCRIPTION = """\
Compare a fitted cost model's predictions with measurements and print a table with each row's error and the
mean absolute percentage error (MAPE) per device type and phase, next to the roofline prior's MAPE.
Measurements: a profile file from 'hetauto profile' (operator times), or --sailor (the packaged per-layer GPU
times; --sailor=DIR another copy).
Rows of device types the model does not cover are skipped (and counted). Note: rows the model was fitted on
measure the fit, not the prediction; validate on a profile measured separately (or fit with a hold-out)."""

EPILOG = """\
examples:
  hetauto validate-cost-model --cost-model cost-model/ --profile profiles/profile-cpu.jsonl
  hetauto validate-cost-model --cost-model gpu-model/ --sailor --json"""


def add_arguments(p):
    p.add_argument("--cost-model", required=True, metavar="MODEL_DIR", help="directory written by 'hetauto fit'")
    p.add_argument("--profile", action="append", default=[], metavar="FILE", help="profile file (repeatable)")
    p.add_argument("--sailor", metavar="DIR", nargs="?", const=SAILOR_DEFAULT,
                   help="Sailor per-layer measurements: alone, the packaged copy; --sailor=DIR another directory")
    p.add_argument("--rows", type=int, default=15, help="table rows to print, worst first (default 15; 0 = all)")
    p.add_argument("--json", action="store_true", help="print everything as JSON")


def run(args) -> int:
    from ..cost import learned as L
    if not args.profile and not args.sailor:
        raise InputError("no measurements given", field="--profile", fix="pass --profile FILE and/or --sailor DIR")
    model = L.LearnedCostModel(args.cost_model)
    samples = []
    for path in args.profile:
        samples += L.profile_samples(path)[1]
    if args.sailor:
        samples += L.sailor_layer_samples(L.load_sailor(L.SAILOR_DATA if args.sailor == SAILOR_DEFAULT
                                                        else args.sailor))
    res = L.validate(model, samples)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    rows = sorted(res["rows"], key=lambda r: -abs(r["error_pct"]))
    if args.rows:
        rows = rows[:args.rows]
    print(f"{'device':<12} {'ph':<4} {'measured ms':>12} {'predicted ms':>13} {'error %':>8}  row")
    for r in rows:
        print(f"{r['device']:<12} {r['phase']:<4} {r['measured_s'] * 1e3:12.4f} {r['predicted_s'] * 1e3:13.4f} "
              f"{r['error_pct']:8.1f}  {r['label']}")
    print(f"\n{'device phase':<24} {'rows':>6} {'MAPE %':>8} {'prior MAPE %':>13}")
    for k, v in res["summary"].items():
        print(f"{k:<24} {v['rows']:>6} {v['mape_pct']:>8.2f} {v['prior_mape_pct']:>13.2f}")
    if res["skipped"]:
        print(f"({res['skipped']} rows of device types the model does not cover were skipped)")
    return 0
