"""Stage 3 of the fit: how a device's operators compose into a whole layer (`hetauto profile --layers` files),
kept per device and phase only where it carries over to a model left out; and the layer files it reads, each
checked against the operator profile it composes."""
from __future__ import annotations

import math

from ...errors import InputError
from .. import features as F
from .fitted import FittedModel, _apply_rate
from .roofline_calibration import _fit_rate_overhead
from .samples import DeviceInfo, MeasuredLayer, check_same_threads, mape, read_layers


# A layer is more than its operators timed one by one: its backward accumulates the residual stream's gradient
# where the stream forks and assembles the gradients of fused projections (QKV, gate+up) from their parts, work no
# isolated operator does. Whole layers measured on the device (`hetauto profile --layers`) calibrate
#     layer = rate * (sum of the layer's operators) + overhead
# per device and phase, with the same robust fit as stage 1. It is kept only where it carries over: fitted without
# one model, it must predict that model's layers better than the plain sum does (leave one model out), the same
# rule that keeps or drops the trees. On a CPU, whose caches make a layer faster or slower than its operators
# depending on the shape, it usually does not.
def layer_op_sums(model: FittedModel, info: DeviceInfo, layers: list[MeasuredLayer]) -> list[tuple[float, float]]:
    return [model.op_sum_times(info, r.shape.ops(r.unfused_attention)) for r in layers]


def fit_composition(model: FittedModel, infos: dict, layers: dict) -> tuple[dict, dict]:
    """`layers`: device -> measured layers. Returns ("device|phase" -> (rate, overhead_s)) for the compositions
    kept and, per device and phase, the leave-one-model-out MAPE of the composed layer time next to the plain
    sum's, and whether it was kept (it needs layers of at least two models to be judged)."""
    comp, report = {}, {}
    for dev, rows in sorted(layers.items()):
        sums = layer_op_sums(model, infos[dev], rows)
        names = sorted({r.model for r in rows})
        for i, ph in enumerate(("fwd", "bwd")):
            pred = [sm[i] for sm in sums]
            meas = [getattr(r, f"{ph}_s") for r in rows]
            errs = []
            for name in names if len(names) > 1 else []:
                rest = [(p, m) for p, m, r in zip(pred, meas, rows) if r.model != name]
                ro = _fit_rate_overhead([p for p, _ in rest], [m for _, m in rest])
                errs += [abs(_apply_rate(ro, p) - m) / m for p, m, r in zip(pred, meas, rows) if r.model == name]
            plain = mape(pred, meas)
            composed = 100.0 * sum(errs) / len(errs) if errs else float("nan")
            kept = bool(errs) and composed < plain
            if kept:
                comp[f"{dev}|{ph}"] = _fit_rate_overhead(pred, meas)
            report[f"{dev} layer-composition {ph}"] = {
                "rows": len(rows), "models": len(names), "mape_pct": round(composed, 2) if errs else None,
                "sum_of_operators_mape_pct": round(plain, 2), "kept": kept}
    return comp, report


def layer_files_of(layer_files: list[str], devices: dict, op_files: dict) -> dict:
    """Device -> measured layers, each file checked against the operator profile it composes."""
    layers: dict[str, list[MeasuredLayer]] = {}
    for p in layer_files:
        header, rows = read_layers(p)
        from ...spec.devices import canonical_device_name
        dev = canonical_device_name(str(header.get("device_type"))) or str(header.get("device_type"))   # (as for operators)
        if devices.get(dev) is None or devices[dev].granularity != "op":
            raise InputError(f"whole layers of device type {dev}, but no operator profile of it is being fitted",
                             file=p, field="device_type",
                             fix=f"pass the operator profile of {dev} ('hetauto profile --device-type {dev}') too")
        if dev in layers:
            raise InputError(f"device type {dev} has two layer files", file=p, field="device_type",
                             fix="pass one of them (a further 'hetauto profile --layers' run of the same "
                                 "--layer-impl resumes into that file; files of two implementations do not merge)")
        if F.arithmetic_of(int(header.get("dtype_bytes", 0)), bool(header.get("tf32", False))) != devices[dev].arithmetic:
            raise InputError(f"layers were timed with {header.get('dtype')}{' on TF32' if header.get('tf32') else ''}, "
                             f"the operators in {devices[dev].arithmetic}", file=p, field="dtype",
                             fix="profile layers and operators with the same --dtype")
        # timed on the device of its operator profile: the header's memory bandwidth is that device's (a layer
        # file of another device relabelled was composed with this one's operators)
        bw = header.get("hbm_gbps")
        if bw is not None and (isinstance(bw, bool) or not isinstance(bw, (int, float)) or not math.isfinite(bw)
                               or abs(bw - devices[dev].hbm_gbps) > 1e-9 * devices[dev].hbm_gbps):
            raise InputError(f"says device_type {dev}, but its header's hbm_gbps {str(bw)[:40]} is not that of the "
                             f"device its operator profile was timed on ({devices[dev].hbm_gbps:g})", file=p,
                             field="device_type", fix="pass the layer file timed on the same device as the operators")
        check_same_threads(op_files[dev], p, header)
        layers[dev] = rows
    return layers
