"""The optimizer step of the learned model: Sailor's measured Adam step per device, fitted as rate x memory
traffic + overhead where that carries over to a model left out (plan/tail_costs.py prices it)."""
from __future__ import annotations

from .fitted import _apply_rate
from .roofline_calibration import _fit_rate_overhead
from .samples import mape


# The measured step of Sailor's profiled model (sailor_updates.SailorUpdate: one Adam call over the embedding, two layers and
# the head) is 0.9-1.8x its memory traffic at full bandwidth. Per device,
#     step = rate x traffic + overhead      (overhead: once per optimizer call, i.e. per stage and iteration)
# with the stage-1 fit, kept only for a device measured with at least two models and only where it predicts a
# model left out better than the traffic alone; the planner's optimizer step (plan/tail_costs.py) then uses it.
def fit_optimizer(updates: list) -> tuple[dict, dict]:
    """(device -> (rate, overhead_s per step), device -> report with the leave-one-model-out MAPE next to the
    bare traffic's)."""
    table, report = {}, {}
    for dev in sorted({u.device for u in updates}):
        rows = [u for u in updates if u.device == dev]
        models = sorted({u.model for u in rows})
        plain = mape([u.prior_s for u in rows], [u.update_s for u in rows])
        if len(models) < 2:
            report[f"{dev} optimizer-step"] = {"rows": len(rows), "models": len(models), "mape_pct": None,
                                               "traffic_mape_pct": round(plain, 2), "kept": False}
            continue
        pred, meas = [], []
        for held in models:
            ro = _fit_rate_overhead([u.prior_s for u in rows if u.model != held],
                                    [u.update_s for u in rows if u.model != held])
            pred += [_apply_rate(ro, u.prior_s) for u in rows if u.model == held]
            meas += [u.update_s for u in rows if u.model == held]
        lomo = mape(pred, meas)
        kept = lomo < plain
        if kept:
            table[dev] = _fit_rate_overhead([u.prior_s for u in rows], [u.update_s for u in rows])
        report[f"{dev} optimizer-step"] = {"rows": len(rows), "models": len(models), "mape_pct": round(lomo, 2),
                                           "traffic_mape_pct": round(plain, 2), "kept": kept}
    return table, report
