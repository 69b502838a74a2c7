"""The analytic cost model against published homogeneous Megatron-LM runs, in sample and out of sample
(docs/cost-model.md). Each run is predicted twice: with the packaged constants (fitted on every run: in sample)
and with the constants fitted on the other runs only (leave one out: each run is its own model).

    .venv/bin/python benchmarks/calibration.py [TABLE.yaml]

TABLE defaults to the packaged table; benchmarks/published-megatron-other-rows.yaml holds the other rows of the same
published tables, a check no constant is fitted on.
"""
import argparse
import os
import sys

from hetauto_megatron.errors import InputError
from hetauto_megatron.plan.calibration import FITTED, TABLE, calibration_rows, leave_one_out, mape


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", nargs="?", default=TABLE, help="published-runs table (YAML; default: the packaged one)")
    path = ap.parse_args().table
    try:
        ins = calibration_rows(path)
        loo, fits = leave_one_out(path)
    except InputError as e:
        print(f"calibration.py: {e.message}", file=sys.stderr)
        return e.exit_code
    # the packaged constants were fitted on the packaged table: on any other table they are out of sample
    packaged = os.path.abspath(path) == os.path.abspath(TABLE)
    first = "in-sample s" if packaged else "packaged s"
    print(f"{'source':15} {'params':>7} {'TP':>3} {'PP':>3} {'DP':>4} {'published s':>11} {first:>11} "
          f"{'error':>7} {'held-out s':>10} {'error':>7}  constants fitted without the run")
    for a, b, f in zip(ins, loo, fits):
        consts = ", ".join(f"{k}={v:.4g}" for k, v in f.items())
        print(f"{a.source:15} {a.params_b:6.1f}B {a.tp:3d} {a.pp:3d} {a.dp:4d} {a.published_s:11.3f} "
              f"{a.predicted_s:11.3f} {a.error:+7.1%} {b.predicted_s:10.3f} {b.error:+7.1%}  {consts}")
    print(f"{'in sample:' if packaged else 'packaged constants (fitted on the packaged table, out of sample here):'}"
          f"{' ' * 6 if packaged else ' '}MAPE {mape(ins):4.1f} %, worst {100 * max(abs(r.error) for r in ins):4.1f} %")
    print(f"leave one out:  MAPE {mape(loo):4.1f} %, worst {100 * max(abs(r.error) for r in loo):4.1f} % "
          f"(targets: <= 12 %, worst <= 20 %); fitted: {', '.join(FITTED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
