"""`hetauto validate-cost-model`: predicted vs measured times, per row and as MAPE (the dry runs' comparison:
commands/_dryrun_comparison.py)."""
from __future__ import annotations

import argparse
import os

from ..errors import InputError
from ..outputs import json_text
from ._dryrun_comparison import dryrun_results, print_dryrun_table
from .fit import SAILOR_DEFAULT, sailor_path

DESCRIPTION = """\
Compare a cost model's predictions with measurements and print a table with each row's error and the mean
absolute percentage error (MAPE).

Operator / layer times (needs --cost-model): a profile file from 'hetauto profile', or --sailor (the packaged
per-layer GPU times of transformer layers; --sailor=DIR another copy: one row per distinct reading, naming the
layers it stands for, '#2-24', as the file repeats one reading for most layers of a model). MAPE per device type
and phase, next to the roofline prior's.

Whole layers: a file from 'hetauto profile --layers' (passed with --profile too) compares each measured layer
with the layer time the planner would use - from the model (for a profiled device: the sum of the layer's
operators) and from the analytic model - forward and backward, with each one's MAPE - for the device at the
precision the file's layers ran in (its header's dtype and tf32).
Rows the model does not price - of a device type it has no measurements of, or measured in another precision
than the model's (an operator or layer file's header, a Sailor reading's) - are skipped, counted per device type
and precision with the reason; when it prices none of them, the command refuses (exit 2). Note: rows the model was
fitted on measure the fit, not the prediction; validate on a profile measured separately (or fit with a hold-out).

Published runs: --published compares the analytic model with the packaged published Megatron-LM runs
(--published=FILE another table in the same format): each run's error in sample (the packaged constants,
fitted on all runs) beside its error out of sample (the constants fitted without that run), and, with
--cost-model, the learned model's (which is never fitted on these runs; device types it does not cover, or
covers in another precision than the runs', are priced by the analytic model: the table says which model priced
each run, and below it why, per device type).

Iteration times: --dryrun REPORT PLAN (repeatable) takes the output of 'hetauto dryrun --plan PLAN --json' and
the plan it ran, simulates the plan on its inventory (the one stored in the plan, as 'hetauto plan -o' writes
it, or --inventory) with the cost model (--cost-model, or the analytic model),
and compares the predicted iteration time with the measured one. The prediction uses the model shape the dry
run ran (a --tiny dry run shrinks it; the report says which) and its ranks' share of the CPU cores: with more
ranks than cores, compute is stretched by ranks / cores. With --cost-model the analytic prediction is shown
next to the learned one; the column is named after the model that priced the rows, and stderr says which
model prices each device type and why, as 'hetauto plan' does (a learned model without cpu measurements leaves
them to the analytic model)."""

EPILOG = """\
examples:
  hetauto validate-cost-model --cost-model cost-model/ --profile profiles/profile-cpu.jsonl
  hetauto validate-cost-model --cost-model gpu-model/ --sailor --json
  hetauto validate-cost-model --cost-model h200-model/ --profile profiles/layers-h200.jsonl
  hetauto validate-cost-model --published
  hetauto validate-cost-model --published --cost-model gpu-model/ --json
  hetauto dryrun --plan plan-a.yaml --steps 6 --json > a.json
  hetauto validate-cost-model --cost-model cost-model/ --inventory inv.yaml --dryrun a.json plan-a.yaml \\
      --dryrun b.json plan-b.yaml

exit codes: 0 ok (whatever the errors measured), 2 invalid input (the message names file, field and fix)."""


DEFAULT_TABLE_ROWS = 15      # the per-reading tables' rows without --rows (--json then gives every row)


def add_arguments(p):
    p.add_argument("--cost-model", metavar="MODEL_DIR",
                   help="directory written by 'hetauto fit' (needed for --profile/--sailor; with --dryrun only, "
                        "the analytic model is validated when it is omitted)")
    p.add_argument("--profile", action="append", default=[], metavar="FILE", help="profile file (repeatable)")
    p.add_argument("--sailor", metavar="DIR", nargs="?", const=SAILOR_DEFAULT,
                   help="Sailor per-layer measurements: alone, the packaged copy; --sailor=DIR another directory")
    p.add_argument("--published", metavar="FILE", nargs="?", const="",
                   help="published Megatron-LM runs: alone, the packaged table; --published=FILE another table")
    p.add_argument("--dryrun", action="append", default=[], nargs=2, metavar=("REPORT", "PLAN"),
                   help="a 'hetauto dryrun --json' report and the plan it ran (repeatable)")
    p.add_argument("--inventory", metavar="INV", help="inventory the dry-run plans are simulated on (with --dryrun; "
                                                      "optional, default: the one stored in each plan)")
    p.add_argument("--cores", type=int, metavar="N",
                   help="CPU cores the dry runs' ranks shared (default: the report's 'cores', else this machine's)")
    p.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=None,
                   help="only for reports that do not name their model: the dry runs ran with --tiny "
                        "(--no-tiny: they ran the plan's model)")
    p.add_argument("--rows", type=int, metavar="N",
                   help=f"rows of the per-reading tables (profiles, --sailor) to print, worst first (default "
                        f"{DEFAULT_TABLE_ROWS}; 0 = all); --json gives the same rows when --rows is given, else every "
                        "row in the file's order; the --published and --dryrun tables print every run, in the file's "
                        "order")
    p.add_argument("--json", action="store_true", help="print everything as JSON")


# ---- published runs ----------------------------------------------------------------------------------------
def published_results(path: str | None, cost_model_dir: str | None) -> dict:
    """Every published run: in-sample and leave-one-out error of the analytic model, and the learned model's
    error when a model directory is given."""
    from ..cost.learned import LearnedCostModel
    from ..plan import calibration as C
    path = path or C.TABLE
    if not os.path.isfile(path):
        raise InputError("published-runs table not found", file=path, field="--published",
                         fix="pass a YAML table in the format of the packaged one, or --published alone")
    runs = C.published_runs(path)
    loo, fits = C.leave_one_out(path)
    rows = []
    for run, held, fit in zip(runs, loo, fits):
        ins = C.predict(run)
        row = {"source": run.source, "model": run.model.name, "device": run.device, "tp": run.tp, "pp": run.pp,
               "dp": run.dp, "published_s": run.published_s, "in_sample_s": ins,
               "in_sample_error_pct": 100.0 * (ins / run.published_s - 1), "held_out_s": held.predicted_s,
               "held_out_error_pct": 100.0 * held.error, "held_out_constants": fit}
        if cost_model_dir:
            learned = LearnedCostModel(cost_model_dir, fallback=C.era_cost_model(run))
            from ..spec.devices import get_device
            t = C.predict(run, cost_model=learned)
            # the device as C.predict prices it: the catalog's, at its 16-bit peak (the runs trained in fp16 or bf16)
            info, why = learned.coverage(get_device(run.device))
            row.update(learned_s=t, learned_error_pct=100.0 * (t / run.published_s - 1),
                       learned_source="learned" if info is not None else "analytic", learned_why=why)
        rows.append(row)

    def summary(key):
        # unrounded, as the rows are: rounded to 0.01 and printed to 0.1 the worst could read below its own row
        # (16.950 -> 16.95 -> '16.9' beside the row's '17.0')
        errs = [abs(r[key]) for r in rows]
        return {"mape_pct": sum(errs) / len(errs), "worst_pct": max(errs)}
    out = {"table": path, "fitted_constants": list(C.FITTED), "rows": rows,
           "summary": {"analytic_in_sample": summary("in_sample_error_pct"),
                       "analytic_leave_one_out": summary("held_out_error_pct")}}
    if cost_model_dir:
        out["summary"]["learned"] = summary("learned_error_pct")
        # which model priced each device type's runs, and why (a type covered in another precision says so)
        out["learned_coverage"] = {r["device"]: {"priced_by": r["learned_source"], "why": r["learned_why"]}
                                   for r in rows}
    return out


def print_published_table(res: dict) -> None:
    from ..plan import calibration as C
    rows = res["rows"]
    learned = "learned_s" in rows[0] if rows else False
    head = f"{'source':<15} {'model':<12} {'TP':>3} {'PP':>3} {'DP':>4} {'published s':>11} {'in-sample s':>11} " \
           f"{'error %':>8} {'held-out s':>10} {'error %':>8}"
    print(head + (f" {'learned s':>10} {'error %':>8} {'priced by':>9}" if learned else ""))
    for r in rows:
        line = f"{r['source']:<15} {r['model']:<12} {r['tp']:>3} {r['pp']:>3} {r['dp']:>4} {r['published_s']:>11.3f} " \
               f"{r['in_sample_s']:>11.3f} {r['in_sample_error_pct']:>8.1f} {r['held_out_s']:>10.3f} " \
               f"{r['held_out_error_pct']:>8.1f}"
        if learned:
            line += f" {r['learned_s']:>10.3f} {r['learned_error_pct']:>8.1f} {r['learned_source']:>9}"
        print(line)
    s = res["summary"]
    packaged = os.path.abspath(res["table"]) == os.path.abspath(C.TABLE)
    label = ("analytic, in sample (constants fitted on every run):" if packaged else
             "analytic, packaged constants (not fitted on this table):")
    print(f"\n{label:<56} MAPE {s['analytic_in_sample']['mape_pct']:.1f} %, "
          f"worst {s['analytic_in_sample']['worst_pct']:.1f} %")
    print(f"{'analytic, leave one out (fitted without the run):':<56} MAPE {s['analytic_leave_one_out']['mape_pct']:.1f} %, "
          f"worst {s['analytic_leave_one_out']['worst_pct']:.1f} %")
    if "learned" in s:
        # the device types the learned model does not cover are priced by the analytic model (the 'by' column)
        by = {r.get("learned_source") for r in res["rows"]} - {None}
        what = ("learned (never fitted on these runs)" if by != {"analytic"} else
                "--cost-model (prices none of these runs: analytic)")
        print(f"{what + ':':<53} MAPE {s['learned']['mape_pct']:.1f} %, worst {s['learned']['worst_pct']:.1f} %")
        for device, c in res.get("learned_coverage", {}).items():
            print(f"  {device}: {c['priced_by']} ({c['why']})")
    print(f"fitted constants: {', '.join(res['fitted_constants'])}; the others are physical (docs/cost-model.md)")


# ---- operator / layer measurements -------------------------------------------------------------------------
def _operator_results(args) -> dict:
    from ..cost import learned as L
    if not args.cost_model:
        raise InputError("--profile and --sailor validate a fitted model", field="--cost-model",
                         fix="pass --cost-model MODEL_DIR (written by 'hetauto fit')")
    model = L.LearnedCostModel(args.cost_model)
    layer_files = [p for p in args.profile if L.profile_granularity(p) == "layer"]
    samples = []
    for path in args.profile:
        if path not in layer_files:
            samples += L.profile_samples(path)[1]
    if args.sailor:
        # transformer layers: what a model fitted on this data predicts (heads and embeddings stay analytic), one
        # row per distinct reading (the file repeats one for most layers of a model)
        sailor = L.load_sailor(sailor_path(args.sailor))
        samples += L.sailor_reading_samples([r for r in sailor if r.shape.kind == "transformer"],
                                          model.fitted.score_bwd_weight, model.fitted.gemm_bwd_weight)
    res = L.validate(model, samples) if samples else {}
    if layer_files:
        res["layers"] = L.validate_layers(model, layer_files)
    return res


def worst_first(rows: list[dict], max_rows: int) -> list[dict]:
    """The rows by falling absolute error, the first max_rows of them (0 = all)."""
    rows = sorted(rows, key=lambda r: -abs(r["error_pct"]))
    return rows[:max_rows] if max_rows else rows


def print_layer_table(res: dict, max_rows: int) -> None:
    from ..cost.learned.validation import skipped_lines
    rows = worst_first(res["rows"], max_rows)
    print("Whole layers (one TP rank, no sequence parallelism): measured vs the planner's layer time")
    print(f"{'device':<10} {'ph':<4} {'measured ms':>12} {'model ms':>10} {'error %':>8} {'analytic ms':>12} "
          f"{'error %':>8}  layer")
    for r in rows:
        print(f"{r['device']:<10} {r['phase']:<4} {r['measured_s'] * 1e3:12.3f} {r['predicted_s'] * 1e3:10.3f} "
              f"{r['error_pct']:8.1f} {r['analytic_s'] * 1e3:12.3f} {r['analytic_error_pct']:8.1f}  {r['label']}")
    print(f"\n{'device phase':<24} {'rows':>6} {'model':>9} {'MAPE %':>8} {'analytic MAPE %':>16}")
    for k, v in res["summary"].items():
        print(f"{k:<24} {v['rows']:>6} {v['source']:>9} {v['mape_pct']:>8.2f} {v['analytic_mape_pct']:>16.2f}")
    for line in skipped_lines(res.get("skipped_why", [])):
        print(f"({line})")


def print_operator_table(res: dict, max_rows: int) -> None:
    from ..cost.learned.validation import skipped_lines
    rows = worst_first(res["rows"], max_rows)
    print(f"{'device':<12} {'ph':<4} {'measured ms':>12} {'predicted ms':>13} {'error %':>8}  row")
    for r in rows:
        print(f"{r['device']:<12} {r['phase']:<4} {r['measured_s'] * 1e3:12.4f} {r['predicted_s'] * 1e3:13.4f} "
              f"{r['error_pct']:8.1f}  {r['label']}")
    print(f"\n{'device phase':<24} {'rows':>6} {'MAPE %':>8} {'prior MAPE %':>13}")
    for k, v in res["summary"].items():
        print(f"{k:<24} {v['rows']:>6} {v['mape_pct']:>8.2f} {v['prior_mape_pct']:>13.2f}")
    for line in skipped_lines(res.get("skipped_why", [])):
        print(f"({line})")


def run(args) -> int:
    if args.rows is not None and args.rows < 0:
        raise InputError(f"must not be negative, got {args.rows}", field="--rows",
                         fix="give the number of table rows to print, or 0 for all")
    if not args.profile and not args.sailor and not args.dryrun and args.published is None:
        raise InputError("no measurements given", field="--profile",
                         fix="pass --profile FILE, --sailor [DIR], --published [FILE] and/or --dryrun REPORT PLAN")
    if not args.dryrun:
        for flag, given in (("--inventory", args.inventory), ("--cores", args.cores), ("--tiny", args.tiny)):
            if given is not None:
                raise InputError(f"{flag} only applies to --dryrun", field=flag,
                                 fix="add --dryrun REPORT PLAN or drop the option")
    # Operator rows keep their top-level JSON keys (rows, summary, skipped); dry runs come under "dryruns".
    res = _operator_results(args) if (args.profile or args.sailor) else {}
    dry = dryrun_results(args) if args.dryrun else None
    pub = published_results(args.published, args.cost_model) if args.published is not None else None
    if args.json:
        if args.rows is not None:     # the rows the table would print, in its order (the summaries keep them all)
            for part in (res, res.get("layers")):
                if part and "rows" in part:
                    part["rows"] = worst_first(part["rows"], args.rows)
        print(json_text({**res, **({"dryruns": dry} if dry else {}), **({"published": pub} if pub else {})},
                         indent=1))
        return 0
    if pub:
        print_published_table(pub)
        if res or dry:
            print()
    layers = res.pop("layers", None)
    rows = DEFAULT_TABLE_ROWS if args.rows is None else args.rows
    if res:
        print_operator_table(res, rows)
    if layers:
        if res:
            print()
        print_layer_table(layers, rows)
    if dry:
        if res or layers:
            print()
        print_dryrun_table(dry)
    return 0
