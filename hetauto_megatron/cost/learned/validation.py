"""Predicted against measured: per-row and per-layer errors, MAPE tables by device and phase."""
from __future__ import annotations

from ...errors import InputError
from .fitted import predict_samples
from .model import LearnedCostModel
from .samples import Sample, mape, read_layers


def layer_time_pairs(samples: list[Sample], pred: list[float]) -> list[tuple[float, float]]:
    """(predicted, measured) forward + backward seconds of each measured layer, from its per-pass rows (a layer's
    rows share a label): the time a pipeline stage spends on the layer per micro-batch, which the layer split
    and the 1F1B model add up."""
    sums: dict[str, list[float]] = {}
    for s, p in zip(samples, pred):
        a = sums.setdefault(s.label, [0.0, 0.0])
        a[0] += p
        a[1] += s.measured_s
    return [(a, b) for a, b in sums.values()]


def validate_layers(model, paths: list[str]) -> dict:
    """Measured whole layers vs the layer time the planner gets from `model` (for a profiled device: the sum of
    the layer's operators) and from the analytic model. The measured layers run every element-wise operator on
    the whole sequence, so the analytic model is asked without sequence parallelism."""
    from ..analytic import AnalyticCostModel
    from ...spec.devices import get_device
    analytic = AnalyticCostModel(sequence_parallel=False)
    table = []
    for path in paths:
        header, rows = read_layers(path)
        device = get_device(str(header.get("device_type")), file=path, field="device_type")
        source = model.source(device)
        for r in rows:
            spec = r.shape.model(r.model)
            pred = model.layer_times(spec, device, r.shape.tp, r.shape.micro_batch)
            ana = analytic.layer_times(spec, device, r.shape.tp, r.shape.micro_batch)
            for i, phase in enumerate(("fwd", "bwd")):
                meas = r.fwd_s if phase == "fwd" else r.bwd_s
                table.append({"device": device.name, "source": source, "phase": phase,
                              "label": f"{r.model} tp{r.shape.tp} b{r.shape.micro_batch} s{r.shape.seq}",
                              "measured_s": meas, "predicted_s": pred[i], "analytic_s": ana[i],
                              "error_pct": 100.0 * (pred[i] / meas - 1),
                              "analytic_error_pct": 100.0 * (ana[i] / meas - 1)})
    summary = summarise(table, {"analytic_mape_pct": "analytic_s"})
    for key, v in summary.items():
        v["source"] = ",".join(sorted({r["source"] for r in table if key == "all" or
                                       f"{r['device']} {r['phase']}" == key}))
    return {"rows": table, "summary": summary}


def summarise(table: list[dict], others: dict[str, str]) -> dict:
    """MAPE of a validation table's rows per 'device phase' and over 'all': of "predicted_s", and of each
    other prediction (summary key -> row key) beside it."""
    summary: dict[str, dict] = {}
    for key in sorted({(r["device"], r["phase"]) for r in table}) + [("all", "")]:
        sel = [r for r in table if key[0] == "all" or (r["device"], r["phase"]) == key]
        meas = [r["measured_s"] for r in sel]
        summary[" ".join(k for k in key if k)] = {
            "rows": len(sel), "mape_pct": round(mape([r["predicted_s"] for r in sel], meas), 2),
            **{name: round(mape([r[col] for r in sel], meas), 2) for name, col in others.items()}}
    return summary


def validate(model: LearnedCostModel, samples: list[Sample]) -> dict:
    """Predicted vs measured for each sample the model covers; per-row error, MAPE by device and phase."""
    covered = set(model.covered_devices())
    rows = [s for s in samples if s.device in covered]
    if not rows:
        raise InputError("the model covers none of the measured device types "
                         f"({', '.join(sorted({s.device for s in samples}))})", field="--cost-model",
                         fix="fit a model that includes these measurements' device type")
    # a device measured in another arithmetic than the model's (a bf16 profile against an fp32 fit): the planner
    # never prices it with that model (LearnedCostModel.coverage), so its error would be no error of the model's
    other = {(s.device, s.arithmetic) for s in rows if s.arithmetic != model.devices[s.device].arithmetic}
    rows = [s for s in rows if s.arithmetic == model.devices[s.device].arithmetic]
    if not rows:
        device, arithmetic = sorted(other)[0]
        raise InputError(f"the model measured {device} in {model.devices[device].arithmetic}, these measurements "
                         f"are in {arithmetic}: the planner prices no precision with another's rates",
                         field="--profile",
                         fix="validate with measurements in the precision the model was fitted on, or fit one on these")
    pred = predict_samples(model.fitted, rows)
    table = [{"device": s.device, "phase": s.phase, "label": s.label, "measured_s": s.measured_s,
              "predicted_s": p, "prior_s": s.baseline_s, "error_pct": 100.0 * (p / s.measured_s - 1)}
             for s, p in zip(rows, pred)]
    return {"rows": table, "summary": summarise(table, {"prior_mape_pct": "prior_s"}),
            "skipped": len(samples) - len(rows)}
