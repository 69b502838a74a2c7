"""The fitted model on disk: `manifest.json` (format, feature version, calibration and composition tables, the
device types covered, the fit's metrics) beside the boosters in LightGBM's text format. Writing it, and reading it
back with every table checked, so that a garbled or cut-off file is one paragraph naming the field, never a
LightGBM crash or a TypeError."""
from __future__ import annotations

import dataclasses
import json
import math
import os

from ...errors import InputError
from ...outputs import make_output_dir, write_text_file
from ...spec._fields import MAX_FIGURE, MIN_FIGURE
from ...spec.files import read_json_file
from .. import features as F
from .fitted import FittedModel, _lgb
from .samples import BOOSTERS, MANIFEST, MODEL_FORMAT, DeviceInfo


def check_model_files(out_dir: str, field: str = "-o") -> None:
    """Refuse a model directory where a file the model writes is a directory (LightGBM would fail on it with
    its own error, after the fit): `hetauto fit` checks before fitting, save_model again."""
    for name in [MANIFEST] + [f"{b}.txt" for b in BOOSTERS]:
        if os.path.isdir(os.path.join(out_dir, name)):
            raise InputError(f"{os.path.join(out_dir, name)!r} is a directory, where the model writes a file",
                             field=field, fix="remove or rename that directory, or write the model elsewhere")


def save_model(out_dir: str, model: FittedModel, devices: dict, metrics: dict, field: str = "-o") -> None:
    make_output_dir(out_dir, field)
    check_model_files(out_dir, field)
    for name in BOOSTERS:   # a booster left from an earlier fit must not be read as part of this one
        stale = os.path.join(out_dir, f"{name}.txt")
        if name not in model.boosters and os.path.exists(stale):
            os.remove(stale)
    files = {}
    for name, b in model.boosters.items():
        files[name] = f"{name}.txt"
        b.save_model(os.path.join(out_dir, files[name]))
    manifest = {"format": MODEL_FORMAT, "feature_version": F.FEATURE_VERSION, "boosters": files,
                "calibration": {k: {"rate": r, "overhead_s": o} for k, (r, o) in model.calibration.items()},
                "composition": {k: {"rate": r, "overhead_s": o} for k, (r, o) in model.composition.items()},
                # the optimizer step's fixed cost is per optimizer call ("optimizer_step"); models that stored it
                # per layer ("optimizer", before) are read without it: their step is the analytic model's
                "optimizer_step": {k: {"rate": r, "overhead_s": o} for k, (r, o) in model.optimizer.items()},
                "score_bwd_weight": model.score_bwd_weight, "gemm_bwd_weight": model.gemm_bwd_weight,
                "host_floor": dict(sorted(model.host_floor.items())),
                "tp_allreduce_bytes_per_s": {k: [list(p) for p in v] for k, v in sorted(model.tp_allreduce.items())},
                "op_features": list(F.OP_FEATURES), "layer_features": list(F.LAYER_FEATURES),
                "devices": {k: v.to_dict() for k, v in sorted(devices.items())}, "fit": metrics}
    write_text_file(os.path.join(out_dir, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True) + "\n", field=field)


def _device_infos(raw, path: str) -> dict:
    """The manifest's `devices` table, each entry checked: a garbled one is named, never a TypeError."""
    kinds = {f.name: f.type for f in dataclasses.fields(DeviceInfo)}
    if not isinstance(raw, dict):
        raise InputError("must be a mapping of device type: figures", file=path, field="devices",
                         fix="re-fit it with 'hetauto fit'")
    out = {}
    for name, v in raw.items():
        ok = isinstance(v, dict) and set(v) == set(kinds)
        for key, kind in (kinds.items() if ok else ()):
            x = v[key]
            if kind in ("str", str):
                ok = ok and isinstance(x, str)
            elif kind in ("int", int):
                ok = ok and isinstance(x, int) and not isinstance(x, bool) and x >= (0 if key == "rows" else 1)
            else:       # (the inventory's own bounds on a device's figures: far past them the prices overflow)
                ok = ok and isinstance(x, (int, float)) and not isinstance(x, bool) and MIN_FIGURE <= x <= MAX_FIGURE
        ok = ok and v["arithmetic"] in F.ARITHMETIC_BYTES and F.ARITHMETIC_BYTES[v["arithmetic"]] == v["dtype_bytes"]
        ok = ok and v.get("name", name) == name     # (the entry of a device is that device's)
        if not ok:
            raise InputError(f"has a garbled entry for {name!r} (expected {', '.join(kinds)}, each a figure of "
                             f"the right kind; rates between {MIN_FIGURE:g} and {MAX_FIGURE:g}, as in an "
                             "inventory)", file=path, field=f"devices.{name}", fix="re-fit it with 'hetauto fit'")
        out[name] = DeviceInfo(**v)
    return out


def booster_text_problem(path: str) -> str | None:
    """What makes a booster file not a whole LightGBM text model (None if nothing). LightGBM's parser aborts or
    crashes the process on some cut-off files (a SIGABRT, or a segmentation fault with the last lines gone) instead
    of raising, so a file must show what LightGBM writes before it is handed over: UTF-8 text, a header whose
    `tree_sizes` lists one size per `Tree=` section, the trees' end, and the trailing `pandas_categorical` line."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError:
        return "not UTF-8 text (cut off inside a character?)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not text.startswith("tree\n"):
        return "it does not start with LightGBM's 'tree' header"
    sizes = next((line.split("=", 1)[1].split() for line in text.splitlines() if line.startswith("tree_sizes=")), None)
    trees = sum(1 for line in text.splitlines() if line.startswith("Tree="))
    if sizes is None or len(sizes) != trees:
        return f"its header lists {len(sizes or [])} trees and {trees} follow"
    if "\nend of trees\n" not in text or not text.rstrip("\n").splitlines()[-1].startswith("pandas_categorical:"):
        return "it ends early (no 'end of trees' or no last 'pandas_categorical' line)"
    return None


# The range a fitted figure can hold (a fit writes none outside it; an edited manifest can). A rate is a time over
# its roofline prior (`time = rate x prior + overhead`), 0.2-7 on the CPU and about 1-1.5 on GPUs, where a
# catalog peak is off by at most a few times: four orders of magnitude either side is no device. An overhead is
# a fixed time per call, fitted from 0 up to 95 % of the group's fastest measurement (roofline_calibration.py):
# never negative, and an hour per kernel, layer or optimizer call is no job. Past them the prices overflow to
# infinity or turn negative (a ZeroDivisionError in the search's bounds, Infinity in --json).
RATE_RANGE = (1e-4, 1e4)
MAX_OVERHEAD_S = 3600.0
# the TP all-reduce's measured bus rate: 1 kB/s to 1 PB/s (fits hold 1e9-3e11); message sizes up to 1 PB
BYTES_PER_S_RANGE = (1e3, 1e15)
MAX_MESSAGE_BYTES = 1e15


def _out_of_range(rate: float, overhead: float) -> tuple[str, str] | None:
    """(field, what is wrong) for a calibration, composition or optimizer-step entry outside what a fit writes."""
    if not RATE_RANGE[0] <= rate <= RATE_RANGE[1]:
        what = "must be positive" if rate <= 0 else "is outside what any fit writes"
        return "rate", (f"{what}, got {rate:g} (a rate is the time over its roofline prior, fitted between "
                        f"{RATE_RANGE[0]:g} and {RATE_RANGE[1]:g})")
    if not 0 <= overhead <= MAX_OVERHEAD_S:
        return "overhead_s", (f"is {overhead:g} s, outside what any fit writes (a fixed time per call, from 0 to "
                              f"{MAX_OVERHEAD_S:g} s)")
    return None


def _number(value) -> float:
    """A figure a fit wrote as a JSON number: text ("1.0") or true is a hand edit float() would read."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def _read_rates(rates, path: str) -> dict:
    """The manifest's tp_allreduce_bytes_per_s: per key a list of [message bytes, bytes/s] in increasing bytes, or
    (models fitted before the sizes were kept) one rate for every size."""
    def number(x, low: float) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and low < x < math.inf

    def rate(x) -> bool:
        return number(x, 0) and BYTES_PER_S_RANGE[0] <= x <= BYTES_PER_S_RANGE[1]

    def points(v):
        if rate(v):
            return float(v)
        if not isinstance(v, list) or not v or not all(isinstance(p, list) and len(p) == 2 and number(p[0], 0)
                                                       and p[0] <= MAX_MESSAGE_BYTES and rate(p[1]) for p in v):
            return None
        out = tuple((float(b), float(r)) for b, r in v)
        return out if all(a[0] < b[0] for a, b in zip(out, out[1:])) else None

    read = {str(k): points(v) for k, v in rates.items()} if isinstance(rates, dict) else None
    if read is None or any(v is None for v in read.values()):
        raise InputError("has a garbled tp_allreduce_bytes_per_s table (each entry a rate in bytes/s, or a list of "
                         f"[message bytes, bytes/s] in increasing bytes; rates from {BYTES_PER_S_RANGE[0]:g} to "
                         f"{BYTES_PER_S_RANGE[1]:g} bytes/s)", file=path, field="tp_allreduce_bytes_per_s",
                         fix="re-fit it with 'hetauto fit'")
    return read


def read_model_dir(model_dir: str) -> tuple[dict, dict, FittedModel]:
    """(the manifest, the device types measured: DeviceInfo by name, the fitted model) of a directory that
    `hetauto fit` wrote; InputError for anything else."""
    if os.path.isfile(model_dir) and os.path.basename(model_dir) == MANIFEST:
        raise InputError("is the model's manifest; --cost-model takes the directory that holds it",
                         file=model_dir, field="--cost-model", fix=f"pass {os.path.dirname(model_dir) or '.'}")
    path = os.path.join(model_dir, MANIFEST)
    if not os.path.isfile(path):
        raise InputError("is not a fitted cost model (no manifest.json)", file=model_dir, field="--cost-model",
                         fix="pass a directory written by 'hetauto fit'")
    man = read_json_file(path, field="--cost-model", fix="re-fit it with 'hetauto fit'")
    if not isinstance(man, dict):
        raise InputError("is not a manifest (a JSON object)", file=path, field="--cost-model",
                         fix="pass a directory written by 'hetauto fit'")
    if man.get("format") != MODEL_FORMAT:
        raise InputError(f"has format {man.get('format')!r}, expected {MODEL_FORMAT!r}", file=path,
                         field="format", fix="re-fit it with this version of 'hetauto fit'")
    if man.get("feature_version") != F.FEATURE_VERSION:
        raise InputError(f"was fitted with feature version {man.get('feature_version')}, this version uses "
                         f"{F.FEATURE_VERSION}", file=path, field="feature_version",
                         fix="re-fit it: 'hetauto fit PROFILES -o DIR'")
    if "devices" not in man:        # (a fit always writes it: without it every device fell back to analytic)
        raise InputError("has no 'devices' table", file=path, field="devices", fix="re-fit it with 'hetauto fit'")
    devices = _device_infos(man["devices"], path)
    tables = {}
    for table in ("calibration", "composition", "optimizer_step"):
        try:
            tables[table] = {k: (_number(v["rate"]), _number(v["overhead_s"]))
                             for k, v in man.get(table, {}).items()}
        except (TypeError, KeyError, ValueError, AttributeError):
            raise InputError(f"has a garbled '{table}' table", file=path, field=table,
                             fix="re-fit it with 'hetauto fit'")
        bad = [k for k, (r, o) in tables[table].items() if not (math.isfinite(r) and math.isfinite(o))
               or (table == "calibration" and len(k.split("|")) != 5)]
        if bad:
            raise InputError(f"has a garbled '{table}' table (entry {bad[0]!r}: not finite figures or not a "
                             "calibration key)", file=path, field=f"{table}.{bad[0]}", fix="re-fit it with 'hetauto fit'")
        # a fit makes every rate positive (roofline_calibration.py _fit_rate_overhead: the exp of a median): a rate
        # of 0 or below would price that work as free or negative and steer the search to it
        for k, (r, o) in tables[table].items():
            bad = _out_of_range(r, o)
            if bad:
                raise InputError(bad[1], file=path, field=f"{table}.{k}.{bad[0]}",
                                 fix="re-fit the model with 'hetauto fit' (an edited figure is not a fitted one)")
    # every device a fit lists has its calibration (a table deleted or emptied by hand read as "no measurements
    # of cpu in the learned model (it covers: none)", priced by the analytic model)
    calibrated = {k.split("|", 1)[0] for k in tables["calibration"]}
    uncalibrated = sorted(d for d in devices if d not in calibrated)
    if uncalibrated:
        raise InputError(f"lists device type(s) {', '.join(uncalibrated)} without their calibration", file=path,
                         field="calibration", fix="re-fit it with 'hetauto fit'")
    lgb = _lgb()
    boosters = {}
    named = man.get("boosters", {})
    if not isinstance(named, dict) or not all(isinstance(f, str) for f in named.values()):
        raise InputError("must map each booster's name to its file name", file=path, field="boosters",
                         fix="re-fit it with 'hetauto fit'")
    from .samples import BOOSTERS
    unknown = sorted(n for n in named if n not in BOOSTERS)
    if unknown:      # no fit writes another (a predictor the planner would never ask)
        raise InputError(f"names booster(s) {', '.join(map(str, unknown))}, which no fit writes (it writes "
                         f"{', '.join(BOOSTERS)})", file=path, field=f"boosters.{unknown[0]}",
                         fix="re-fit it with 'hetauto fit'")
    for name, fname in named.items():
        # a booster is a file of the model's own directory (a name that leads out of it is never what fit writes)
        if os.path.isabs(fname) or os.path.basename(fname) != fname or fname in ("", ".", ".."):
            raise InputError(f"booster {name!r} names {fname!r}, not a file of the model's directory", file=path,
                             field=f"boosters.{name}", fix="re-fit it with 'hetauto fit'")
        fpath = os.path.join(model_dir, fname)
        if not os.path.isfile(fpath):
            raise InputError(f"booster file {fname} is missing", file=model_dir, field="boosters",
                             fix="re-fit the model or copy the whole directory")
        problem = booster_text_problem(fpath)
        if problem:
            raise InputError(f"booster file {fname} is not a whole LightGBM model: {problem}", file=model_dir,
                             field="boosters", fix="re-fit the model or copy the whole directory")
        try:
            boosters[name] = lgb.Booster(model_file=fpath)
        except Exception as exc:     # LightGBM's own error type for a file it cannot parse
            raise InputError(f"booster file {fname} is not a LightGBM model ({str(exc).strip()[:120]})",
                             file=model_dir, field="boosters", fix="re-fit the model or copy the whole directory") from None
    weight = man.get("score_bwd_weight", 1.0)   # models fitted before it existed: the counted traffic
    gemm_weight = man.get("gemm_bwd_weight", 1.0)   # models fitted before it existed: the forward's efficiency
    for field, value in (("score_bwd_weight", weight), ("gemm_bwd_weight", gemm_weight)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not RATE_RANGE[0] <= value <= RATE_RANGE[1]:     # (a weight of about 1: a share of the traffic)
            raise InputError(f"has a garbled {field} ({value!r})", file=path, field=field,
                             fix="re-fit it with 'hetauto fit'")
    fit = man.get("fit") if isinstance(man.get("fit"), dict) else {}    # the fit's report: informational
    fitted = FittedModel(tables["calibration"], boosters, fit.get("rounds", {}),
                              tables["composition"], float(weight))
    fitted.optimizer = tables["optimizer_step"]
    fitted.gemm_bwd_weight = float(gemm_weight)
    floor = man.get("host_floor", {})   # models fitted before it existed: no floor
    if not isinstance(floor, dict):
        raise InputError("has a garbled host_floor table", file=path, field="host_floor",
                         fix="re-fit it with 'hetauto fit'")
    for k, v in floor.items():      # the host's time per pass: seconds, as an overhead
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_OVERHEAD_S:
            raise InputError(f"is {v!r}, not a time per pass from 0 to {MAX_OVERHEAD_S:g} s", file=path,
                             field=f"host_floor.{k}", fix="re-fit the model with 'hetauto fit'")
    fitted.host_floor = {str(k): float(v) for k, v in floor.items()}
    rates = man.get("tp_allreduce_bytes_per_s", {})   # models fitted before it existed: the node's link
    fitted.tp_allreduce = _read_rates(rates, path)
    return man, devices, fitted
