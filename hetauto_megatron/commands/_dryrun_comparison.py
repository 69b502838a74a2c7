"""`hetauto validate-cost-model --dryrun REPORT PLAN`: a dry run's measured iteration time against the simulator's
prediction. Reads a 'hetauto dryrun --json' report, checks it is of the plan it is paired with, rebuilds the model
shape the dry run ran (`measured_plan`, which 'hetauto dryrun --timeline' uses too) and prices that plan
with the ranks' share of the CPU cores; one row per dry run, and their table."""
from __future__ import annotations

import math
import os
import sys

from ..cost.shared_cores import SharedCoresCostModel
from ..errors import InputError
from ..spec.files import read_json_file

# Keys a 'hetauto dryrun --json' report (or the runtime's {"error": ...} of a failed one) has, and no other JSON
# file hetauto writes: a file with none of them is another kind of file.
REPORT_KEYS = {"iteration_s", "step_times_s", "steps", "memory", "error"}


def load_dryrun_report(path: str) -> dict:
    """A 'hetauto dryrun --json' report, checked for what the comparison reads."""
    if not os.path.exists(path):        # (a device or a pipe exists: read_json_file bounds what it reads)
        raise InputError("dry-run report not found", file=path, field="--dryrun",
                         fix="pass the output of 'hetauto dryrun --plan PLAN --json'")
    if os.path.isdir(path):
        raise InputError("is a directory, not a dry-run report", file=path, field="--dryrun",
                         fix="pass the output of 'hetauto dryrun --plan PLAN --json'")
    rep = read_json_file(path, field="--dryrun",
                         fix="pass the output of 'hetauto dryrun --plan PLAN --json' (nothing else on stdout)")
    if not isinstance(rep, dict):
        raise InputError("is not a JSON object", file=path, field="--dryrun",
                         fix="pass the output of 'hetauto dryrun --plan PLAN --json'")
    if not REPORT_KEYS & set(rep):
        # another JSON file (a profile summary, a plan written as JSON): say so, not that a time is missing
        from ..spec._fields import file_kind, shorten
        kind = file_kind(rep)
        has = f"its keys: {shorten(', '.join(sorted(map(str, rep))), 80)}" if rep else "it is empty"
        raise InputError(f"is not a dry-run report ('hetauto dryrun --json' output): it has none of "
                         f"{', '.join(sorted(REPORT_KEYS))} ({has})"
                         + (f"; it looks like {kind[1]}" if kind else ""), file=path, field="--dryrun",
                         fix="pass each dry run as --dryrun REPORT PLAN, REPORT the output of "
                             "'hetauto dryrun --plan PLAN --json'")
    t = rep.get("iteration_s")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        raise InputError(f"has no positive measured iteration time (iteration_s: {t!r})", file=path,
                         field="iteration_s", fix="pass the output of a dry run that finished: "
                                                  "'hetauto dryrun --plan PLAN --json'")
    if not 1e-9 <= t <= 1e9:     # no dry run's iteration: a hand-edited figure (its error overflowed to Infinity)
        raise InputError(f"is {t:g} s, no dry run's iteration time (1 ns to 1e9 s)", file=path, field="iteration_s",
                         fix="pass the output of a dry run that finished: 'hetauto dryrun --plan PLAN --json'")
    scale = rep.get("link_scale")
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                  and 0 < scale < math.inf):
        # (a hand-edited "x", 0 or -5 was read as a run without emulation, its links priced at full speed)
        from ..spec._fields import shorten
        raise InputError(f"link_scale is {shorten(repr(scale), 40)}, not the positive number a dry run with "
                         "--emulate-links records (or null without it)", file=path, field="link_scale",
                         fix="pass the report 'hetauto dryrun --json' wrote, unchanged")
    steps = rep.get("steps")
    if isinstance(steps, list) and len(steps) == 1:
        # the time of a run of one step is that step's: the first, slowed by the memory hooks and the profiler
        raise InputError("timed one step only, the first, which the memory measurement slows: its iteration_s is "
                         "not the iteration time the model predicts", file=path, field="steps",
                         fix="dry-run 2 steps or more (--steps 3, the default)")
    return rep


def check_report_of_plan(report: dict, plan, *, report_file: str, plan_file: str) -> None:
    """The report's per-rank memory entries (every 'hetauto dryrun --json' report has them) must be of the plan's
    layout: as many ranks, each on the mesh of the plan its rank falls in, with that mesh's TP and DP. A report
    of another plan would otherwise be compared with this plan's prediction as if it had run it."""
    entries = report.get("memory")
    if not isinstance(entries, list) or not entries:
        return          # a report written by hand or by another tool: the model check (measured_plan) remains
    fix = "pair each report with the plan it ran: --dryrun REPORT PLAN"
    if len(entries) != plan.world_size:
        raise InputError(f"the dry run ran {len(entries)} ranks, but {plan_file} has {plan.world_size}: the report "
                         "is of another plan", file=report_file, field="memory", fix=fix)
    for entry in entries:
        if not isinstance(entry, dict):
            raise InputError("has a memory entry that is not a mapping", file=report_file, field="memory",
                             fix="pass the output of 'hetauto dryrun --json' unchanged")
        i = entry.get("mesh")
        mesh = plan.meshes[i] if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(plan.meshes) else None
        if mesh is None or (entry.get("tp"), entry.get("dp")) != (mesh.tp, mesh.dp):
            ran = f"mesh {i} at TP {entry.get('tp')}, DP {entry.get('dp')}"
            has = f"TP {mesh.tp}, DP {mesh.dp}" if mesh is not None else f"{len(plan.meshes)} meshes"
            raise InputError(f"rank {entry.get('rank')} of the dry run ran {ran}, but {plan_file} has {has}: the "
                             "report is of another plan", file=report_file, field="memory", fix=fix)


def measured_plan(report: dict, plan, *, report_file: str, tiny: bool | None):
    """`plan` as the dry run ran it: with the model shape it measured (the report's "model", or for reports without
    it the plan's model, shrunk the way --tiny shrinks it when `tiny`), and with the plain optimizer where the
    report's settings say every mesh ran it (`dryrun --no-distributed-optimizer`: priced with the plan's
    distributed one, each DP rank stepping 1/DP of the parameters and gathering them, the prediction was of
    another run than the one measured)."""
    plan = _optimizer_as_run(report, plan)
    return _model_as_run(report, plan, report_file=report_file, tiny=tiny)


def _optimizer_as_run(report: dict, plan):
    settings = report.get("settings")
    if (isinstance(settings, list) and settings and all(isinstance(s, dict) for s in settings)
            and all(s.get("distributed_optimizer") is False for s in settings)):
        from ..runtime.dryrun import prepare_plan
        return prepare_plan(plan, tiny=False, distributed_optimizer=False)
    return plan


def _model_as_run(report: dict, plan, *, report_file: str, tiny: bool | None):
    import dataclasses

    from ..spec.model import model_from_dict
    if "model" in report:
        if not isinstance(report["model"], dict):
            raise InputError("'model' is not a mapping", file=report_file, field="model",
                             fix="pass the output of 'hetauto dryrun --json' unchanged")
        model = model_from_dict(report["model"], file=report_file, prefix="model.")
        if model.num_layers != plan.model.num_layers:
            raise InputError(f"the dry run ran {model.num_layers} layers, the plan has {plan.model.num_layers}: "
                             "the report is of another plan", file=report_file, field="model.num_layers",
                             fix="pair each report with the plan it ran: --dryrun REPORT PLAN")
        if tiny is not None:
            from ..runtime.dryrun import prepare_plan
            expect = prepare_plan(plan, tiny=tiny).model
            if (model.hidden_size, model.seq_length) != (expect.hidden_size, expect.seq_length):
                raise InputError(f"--{'' if tiny else 'no-'}tiny contradicts the report, which ran hidden size "
                                 f"{model.hidden_size} and sequence {model.seq_length}", file=report_file,
                                 field="--tiny", fix="drop --tiny/--no-tiny: the report names its model")
        try:
            return dataclasses.replace(plan, model=model)
        except InputError as exc:
            raise InputError(f"its model does not fit the plan's layout: {exc.reason}", file=report_file,
                             field="model", fix="pair each report with the plan it ran: --dryrun REPORT PLAN") from None
    if tiny is None:
        raise InputError("the report does not say which model shape the dry run ran", file=report_file,
                         field="model", fix="pass --tiny if the dry run used --tiny, --no-tiny if it ran the plan's "
                                            "model (a report that has 'model' needs neither)")
    from ..runtime.dryrun import prepare_plan
    return prepare_plan(plan, tiny=tiny)


def dryrun_row(label: str, report: dict, plan, inventory, cost_model, *, cores: int, analytic=None) -> dict:
    """Predicted vs measured iteration time of one dry run. `plan` carries the measured model shape
    (measured_plan); compute is stretched by max(1, ranks / cores). `analytic`: a second model shown beside."""
    from ..cost.shared_cores import core_sharing_factor
    from ..plan.simulate import simulate
    for i, mesh in enumerate(plan.meshes):
        if mesh.device_type != "cpu":
            raise InputError(f"mesh {i} is on {mesh.device_type}, but a dry run measures CPU processes: its time "
                             "can only be compared with a prediction for device type cpu", field=f"meshes[{i}]",
                             fix="validate with plans (and an inventory) whose clusters are of device type cpu")
    plan.check_precision()      # the plan's precision named (the caller names its file), as dryrun and emit do
    from ..plan.simulate import check_plan_against_inventory
    try:
        check_plan_against_inventory(plan, inventory)
    except InputError as exc:
        # the plan and the inventory disagree: name the inventory (the caller names the plan file)
        from ._common import naming_inventory
        raise InputError(naming_inventory(exc.reason, inventory.source), file=exc.file, field=exc.field,
                         fix=f"{exc.fix}; or pass the inventory the plan was made for (--inventory)") from None
    factor = core_sharing_factor(plan.world_size, cores)
    # a run with --emulate-links SCALE ran the inventory's links SCALE times as slow (its report says how much)
    scale = report.get("link_scale")        # (load_dryrun_report checked it: null, or a positive number)
    if scale is not None:
        inventory = inventory.with_link_time_scale(float(scale))
    stretched = _SaysWhy if hasattr(cost_model, "coverage") else SharedCoresCostModel
    est = simulate(plan, inventory, stretched(cost_model, factor))
    meas = float(report["iteration_s"])
    row = {"label": label, "model": plan.model.name, "hidden_size": plan.model.hidden_size,
           "seq_length": plan.model.seq_length, "ranks": plan.world_size, "cores": cores, "stretch": factor,
           "measured_s": meas, "predicted_s": est.iteration_time_s,
           "error_pct": 100.0 * (est.iteration_time_s / meas - 1),
           "pipeline_s": est.pipeline_s, "cost_model": est.cost_model,
           **({"cost_model_why": est.cost_model_why} if est.cost_model_why else {})}
    # where the learned model covers none of the plan's devices its fallback priced them: the analytic column
    # would repeat the prediction under another name
    if analytic is not None and "learned" in est.cost_model.values():
        a = simulate(plan, inventory, SharedCoresCostModel(analytic, factor)).iteration_time_s
        row.update(analytic_s=a, analytic_error_pct=100.0 * (a / meas - 1))
    return row


class _SaysWhy(SharedCoresCostModel):
    """A stretched learned model that says why it prices each device type as it does (the simulator records
    `coverage` in Estimate.cost_model_why, as for the unstretched model 'hetauto simulate' uses)."""

    def coverage(self, device):
        return self.base.coverage(device)


def priced_by(rows: list[dict]) -> str:
    """The model that priced the rows' devices: 'learned', 'analytic', or 'learned/analytic' where both did."""
    sources = {s for r in rows for s in r["cost_model"].values()}
    return "/".join(sorted(sources, reverse=True)) or "analytic"


def dryrun_summary(rows: list[dict]) -> dict:
    def mape(key):
        return round(sum(abs(r[key]) for r in rows) / len(rows), 2) if rows else float("nan")
    out = {"rows": len(rows), "mape_pct": mape("error_pct")}
    if rows and all("analytic_error_pct" in r for r in rows):
        out["analytic_mape_pct"] = mape("analytic_error_pct")
    return out


def dryrun_results(args) -> dict:
    """Every --dryrun REPORT PLAN pair of the command line compared, and the MAPE over them."""
    from ..cost.analytic import AnalyticCostModel
    from ..cost.learned import load_cost_model
    from ..cost.shared_cores import usable_cores
    from ..plan.plan import load_plan
    from ..spec.inventory import inventory_from_dict, load_inventory
    if args.cores is not None and args.cores < 1:
        raise InputError(f"must be at least 1, got {args.cores}", field="--cores", fix="give --cores 1 or more")
    # without --inventory each plan is simulated on the inventory it carries, as every command reading a plan
    given = load_inventory(args.inventory) if args.inventory else None
    model = load_cost_model(args.cost_model)
    analytic = AnalyticCostModel() if args.cost_model else None
    rows = []
    for report_file, plan_file in args.dryrun:
        report = load_dryrun_report(report_file)
        plan = load_plan(plan_file)
        inventory = given
        if inventory is None and plan.inventory:
            try:
                inventory = inventory_from_dict(plan.inventory, file=plan_file)
            except InputError as exc:
                raise exc.within(prefix="inventory") from None
        elif inventory is None:
            raise InputError("--dryrun needs the inventory the plan is simulated on, and the plan carries none",
                             file=plan_file, field="inventory",
                             fix="pass --inventory INV (clusters of device type cpu, as the dry runs), or a plan "
                                 "written by 'hetauto plan -o', which carries its inventory")
        check_report_of_plan(report, plan, report_file=report_file, plan_file=plan_file)
        plan = measured_plan(report, plan, report_file=report_file, tiny=args.tiny)
        cores = args.cores or (report["cores"] if report.get("cores") is not None else usable_cores())
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise InputError(f"'cores' must be a positive whole number, got {cores!r}", file=report_file,
                             field="cores", fix="pass --cores N")
        try:
            rows.append(dryrun_row(os.path.basename(plan_file), report, plan, inventory, model, cores=cores,
                                   analytic=analytic))
        except InputError as exc:      # the plan's meshes (device type, clusters): name the plan file
            raise (exc.within(file=plan_file) if exc.file is None and (exc.field or "").startswith(
                ("meshes", "precision")) else exc) from None
    # which model priced each device type, and why, as 'hetauto plan' says it (commands/_common.py)
    said = {(d, r["cost_model"][d], why) for r in rows for d, why in r.get("cost_model_why", {}).items()}
    for device, source, why in sorted(said):
        print(f"cost model: {device}: {source} ({why})", file=sys.stderr)
    return {"cost_model": priced_by(rows), "rows": rows, "summary": dryrun_summary(rows)}


def print_dryrun_table(res: dict) -> None:
    rows = res["rows"]
    with_analytic = bool(rows) and all("analytic_s" in r for r in rows)
    head = f"{'plan':<28} {'model shape':>13} {'ranks':>5} {'x':>4} {'measured s':>11} {res['cost_model'] + ' s':>11} " \
           f"{'error %':>8}"
    print(head + (f" {'analytic s':>11} {'error %':>8}" if with_analytic else ""))
    for r in rows:
        shape = f"h{r['hidden_size']} s{r['seq_length']}"
        line = f"{r['label']:<28} {shape:>13} {r['ranks']:>5} {r['stretch']:>4.1f} {r['measured_s']:>11.4f} " \
               f"{r['predicted_s']:>11.4f} {r['error_pct']:>8.1f}"
        if with_analytic:
            line += f" {r['analytic_s']:>11.4f} {r['analytic_error_pct']:>8.1f}"
        print(line)
    s = res["summary"]
    line = f"MAPE over {s['rows']} dry run(s): {s['mape_pct']:.2f} %"
    if "analytic_mape_pct" in s:
        line += f" (analytic: {s['analytic_mape_pct']:.2f} %)"
    print(line)
    print("x: compute stretch max(1, ranks / cores) for ranks time-sharing the dry run's CPU cores")
