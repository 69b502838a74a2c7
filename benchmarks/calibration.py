"""The analytic cost model against published homogeneous Megatron-LM runs (docs/cost-model.md).

    .venv/bin/python benchmarks/calibration.py
"""
from hetauto_megatron.plan.calibration import calibration_rows


def main() -> None:
    rows = calibration_rows()
    print(f"{'source':15} {'params':>7} {'TP':>3} {'PP':>3} {'DP':>4} {'published s':>11} {'predicted s':>11} {'error':>7}")
    for r in rows:
        print(f"{r.source:15} {r.params_b:6.1f}B {r.tp:3d} {r.pp:3d} {r.dp:4d} {r.published_s:11.3f} "
              f"{r.predicted_s:11.3f} {r.error:+7.1%}")
    print(f"max |error| {max(abs(r.error) for r in rows):.1%} (target <= 15%), one set of constants for all rows")


if __name__ == "__main__":
    main()
