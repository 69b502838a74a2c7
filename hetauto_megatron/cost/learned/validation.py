"""Predicted against measured: per-row and per-layer errors, MAPE tables by device and phase. Rows the model does
not price (a device type it has no measurements of, or one measured in another precision) are left out, each kind
counted with the reason, since the planner prices them with the analytic model, not with this model."""
from __future__ import annotations

import dataclasses

from ...errors import InputError
from .. import features as F
from .fitted import predict_samples
from .model import _ARITHMETIC_WORDS, LearnedCostModel
from .samples import Sample, layer_file_unfused, mape, read_layers

# the header's dtype (measure/profile.py writes the torch name) -> the training precision a job in it has
_PRECISION_OF_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_LAYER_FIX = "pass a file written by 'hetauto profile --layers' (its header says what the layers ran in)"


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


def layer_file_device(header: dict, path: str):
    """(the device a layer file measured, as a job in the precision its layers ran in sees it; that arithmetic).
    The header's dtype and tf32 say the precision (measure/profile.py): a file of fp32 layers priced at the
    device's 16-bit peak would compare them with a bf16 job's times."""
    from ...spec.devices import get_device
    device = get_device(str(header.get("device_type")), file=path, field="device_type")
    dtype, width, tf32 = header.get("dtype"), header.get("dtype_bytes"), header.get("tf32", False)
    if dtype not in _PRECISION_OF_DTYPE:
        raise InputError(f"the header's dtype is {dtype!r}, not one of {', '.join(_PRECISION_OF_DTYPE)}", file=path,
                         field="dtype", fix=_LAYER_FIX)
    if width is not None and width != F.DTYPE_BYTES[dtype]:
        raise InputError(f"the header says dtype {dtype} ({F.DTYPE_BYTES[dtype]} bytes) but dtype_bytes {width!r}",
                         file=path, field="dtype_bytes",
                         fix="write the dtype the layers ran in with its width, or re-run 'hetauto profile --layers'")
    if not isinstance(tf32, bool):
        raise InputError(f"the header's tf32 is {tf32!r}, not true or false", file=path, field="tf32", fix=_LAYER_FIX)
    if tf32 and (dtype != "float32" or not device.has_tf32):
        why = f"the layers ran in {dtype}" if dtype != "float32" else f"{device.name} has no TF32 tensor cores"
        raise InputError(f"the header says tf32 (fp32 GEMMs on TF32 tensor cores), but {why}", file=path,
                         field="tf32", fix="write tf32: false, or re-run 'hetauto profile --layers'")
    arithmetic = F.arithmetic_of(F.DTYPE_BYTES[dtype], tf32)
    placed = dataclasses.replace(device, tf32=tf32).at_precision(_PRECISION_OF_DTYPE[dtype], file=path, field="dtype")
    if F.device_arithmetic(placed) != arithmetic:    # a CPU: the planner prices it in fp32 whatever the job's
        raise InputError(f"the layers ran in {_ARITHMETIC_WORDS[arithmetic]}, but the planner prices {device.name} "
                         f"in {_ARITHMETIC_WORDS[F.device_arithmetic(placed)]} whatever the job's precision",
                         file=path, field="dtype", fix=f"profile {device.name}'s layers with --dtype float32")
    return placed, arithmetic


def _dtype_of(arithmetic: str) -> str:
    return "bfloat16" if arithmetic == "16-bit" else "float32"


def validate_layers(model: LearnedCostModel, paths: list[str]) -> dict:
    """Measured whole layers vs the layer time the planner gets from `model` (for a profiled device: the sum of
    the layer's operators) and from the analytic model, both for the device at the file's precision. The measured
    layers run every element-wise operator on the whole sequence, so the analytic model is asked without sequence
    parallelism. A file the model does not price (its device type, or that in the file's precision) is skipped
    with the reason: the planner would give the analytic model's time, which the analytic column already shows."""
    import copy

    from ..analytic import AnalyticCostModel
    table, skipped = [], []
    for path in paths:
        header, rows = read_layers(path)
        # both priced with the attention the file's layers ran (fused, or unfused: samples.layer_file_unfused)
        fused = not layer_file_unfused(header)
        analytic = AnalyticCostModel(sequence_parallel=False, flash_attention=fused)
        learned = copy.copy(model)
        learned.flash_attention = fused
        device, arithmetic = layer_file_device(header, path)
        info, why = model.coverage(device)
        measured = model.devices.get(device.name)
        if info is None and device.name in model.covered_devices() and measured.arithmetic != arithmetic:
            why = (f"the model measured {device.name} in {_ARITHMETIC_WORDS[measured.arithmetic]}: no rate is "
                   "borrowed from another precision")
        if info is None:
            skipped.append({"file": path, "device": device.name, "arithmetic": arithmetic, "rows": 2 * len(rows),
                            "reason": why})
            continue
        for r in rows:
            spec = r.shape.model(r.model)
            pred = learned.layer_times(spec, device, r.shape.tp, r.shape.micro_batch)
            ana = analytic.layer_times(spec, device, r.shape.tp, r.shape.micro_batch)
            for i, phase in enumerate(("fwd", "bwd")):
                meas = r.fwd_s if phase == "fwd" else r.bwd_s
                table.append({"device": device.name, "source": "learned", "arithmetic": arithmetic, "phase": phase,
                              "label": f"{r.model} tp{r.shape.tp} b{r.shape.micro_batch} s{r.shape.seq}",
                              "measured_s": meas, "predicted_s": pred[i], "analytic_s": ana[i],
                              "error_pct": 100.0 * (pred[i] / meas - 1),
                              "analytic_error_pct": 100.0 * (ana[i] / meas - 1)})
    if not table:
        s = skipped[0]
        other = s["device"] in model.covered_devices()     # the type is measured, in another precision
        raise InputError(
            f"the model prices none of these layers, which ran in {_ARITHMETIC_WORDS[s['arithmetic']]}: "
            f"{s['reason']}", file=s["file"],
            field="dtype" if other else "device_type",
            fix=(f"validate with layers timed in the model's precision ('hetauto profile --layers --dtype "
                 f"{_dtype_of(model.devices[s['device']].arithmetic)}'), or with a model fitted on operators and "
                 "layers timed in this file's" if other else
                 f"validate with a model fitted on {s['device']}'s profile ('hetauto fit PROFILE LAYERS -o DIR'), "
                 "or leave the file out"))
    summary = summarise(table, {"analytic_mape_pct": "analytic_s"})
    for key, v in summary.items():
        v["source"] = ",".join(sorted({r["source"] for r in table if key == "all" or
                                       f"{r['device']} {r['phase']}" == key}))
    return {"rows": table, "summary": summary, "skipped": sum(s["rows"] for s in skipped), "skipped_why": skipped}


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
    """Predicted vs measured for each sample the model covers; per-row error, MAPE by device and phase; the rows
    left out ("skipped"), and per device type and arithmetic why ("skipped_why")."""
    covered = set(model.covered_devices())
    rows = [s for s in samples if s.device in covered]
    if not rows:
        raise InputError("the model covers none of the measured device types "
                         f"({', '.join(sorted({s.device for s in samples}))})", field="--cost-model",
                         fix="fit a model that includes these measurements' device type")
    skipped = {}
    for s in samples:
        if s.device not in covered:
            why = f"no measurements of {s.device} in the model (it covers: {', '.join(sorted(covered))})"
        elif s.arithmetic != model.devices[s.device].arithmetic:
            # a device measured in another arithmetic than the model's (a bf16 profile against an fp32 fit): the
            # planner never prices it with that model (LearnedCostModel.coverage), so its error is no error of the
            # model's
            why = (f"the model measured {s.device} in {_ARITHMETIC_WORDS[model.devices[s.device].arithmetic]}: no "
                   "rate is borrowed from another precision")
        else:
            continue
        entry = skipped.setdefault((s.device, s.arithmetic), {"device": s.device, "arithmetic": s.arithmetic,
                                                              "rows": 0, "reason": why})
        entry["rows"] += 1
    rows = [s for s in rows if s.arithmetic == model.devices[s.device].arithmetic]
    if not rows:
        device, arithmetic = sorted(k for k in skipped if k[0] in covered)[0]
        raise InputError(f"the model measured {device} in {model.devices[device].arithmetic}, these measurements "
                         f"are in {arithmetic}: the planner prices no precision with another's rates",
                         field="--profile",
                         fix="validate with measurements in the precision the model was fitted on, or fit one on these")
    pred = predict_samples(model.fitted, rows)
    table = [{"device": s.device, "phase": s.phase, "label": s.label, "measured_s": s.measured_s,
              "predicted_s": p, "prior_s": s.baseline_s, "error_pct": 100.0 * (p / s.measured_s - 1)}
             for s, p in zip(rows, pred)]
    return {"rows": table, "summary": summarise(table, {"prior_mape_pct": "prior_s"}),
            "skipped": len(samples) - len(rows), "skipped_why": [skipped[k] for k in sorted(skipped)]}


def skipped_lines(skipped_why: list[dict]) -> list[str]:
    """One line per kind of row left out: how many, of what, measured in which arithmetic, and why."""
    return [(f"{s['file']}: " if "file" in s else "") + f"{s['rows']} rows of {s['device']} measured in "
            f"{_ARITHMETIC_WORDS.get(s['arithmetic'], s['arithmetic'])} skipped: {s['reason']}" for s in skipped_why]
