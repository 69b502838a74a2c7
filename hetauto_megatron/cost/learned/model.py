"""The fitted model: calibration tables and LightGBM boosters (`FittedModel`), their manifest on disk, and
`LearnedCostModel`, the planner's cost-model interface over them (analytic fallback for device types it
does not cover)."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from dataclasses import dataclass

from ...errors import InputError
from ...outputs import make_output_dir, write_text_file
from ...spec.devices import DeviceType, canonical_device_name
from ...spec.inventory import LinkSpec
from ...spec.model import ModelSpec, read_json_file
from .. import features as F
from .samples import (BOOSTERS, MANIFEST, MODEL_FORMAT, DeviceInfo, Sample, allreduce_rate_at, calibration_key,
                      host_floor_key, tp_allreduce_key)


# ---- fitting -----------------------------------------------------------------------------------------------
def _lgb():
    import lightgbm  # imported on first use: the planner must start fast without a fitted model
    return lightgbm


def calibrated_s(calibration: dict, key: str, prior_s: float) -> float:
    """rate * prior + overhead. A group never measured (a precision or operator kind this device was not
    profiled in) borrows the median calibration of the same group on the other devices: a GPU's efficiency is a
    better guess than none; with no such group, the bare roofline."""
    hit = calibration.get(key)
    if hit is None:
        rest = key.split("|", 1)[1]
        same = [v for k, v in calibration.items() if k.split("|", 1)[1] == rest]
        hit = (statistics.median(r for r, _ in same), statistics.median(o for _, o in same)) if same else (1.0, 0.0)
    return hit[0] * prior_s + hit[1]


@dataclass
class FittedModel:
    calibration: dict          # calibration key -> (rate, overhead_s)
    boosters: dict             # booster name -> lightgbm.Booster (absent where 0 rounds were chosen)
    rounds: dict               # booster name -> rounds used
    composition: dict = dataclasses.field(default_factory=dict)   # "device|phase" -> (rate, overhead_s)
    score_bwd_weight: float = 1.0   # weight of the backward's score traffic in whole-layer priors
    optimizer: dict = dataclasses.field(default_factory=dict)     # device -> (rate, overhead_s per step)
    host_floor: dict = dataclasses.field(default_factory=dict)    # host_floor_key -> seconds (sailor_host_floors)
    gemm_bwd_weight: float = 1.0    # weight of the backward GEMMs in whole-layer priors where F.backward_gemm_weighted
    tp_allreduce: dict = dataclasses.field(default_factory=dict)  # "device|tpN" -> ((bytes, bytes/s), ...) its layers'
                                                                  # TP all-reduces ran at (sailor_tp_allreduce_rates)

    def floor_s(self, device: str, phase: str, tp: int) -> float:
        """The device's host floor for a layer's pass at TP degree `tp`, compute and TP all-reduces together
        (F.host_floored); 0 where none was measured. (Models fitted before the floor bounded the all-reduces
        too keyed it "device|phase", on compute alone; it is read as the whole pass's, a little lower.)"""
        return self.host_floor.get(host_floor_key(device, phase, tp), self.host_floor.get(f"{device}|{phase}", 0.0))

    def times(self, name: str, keys: list[str], priors: list[float], X: list) -> list[float]:
        """Seconds for rows of one booster: calibrated roofline x the booster's correction (when kept)."""
        import numpy as np
        b = self.boosters.get(name)
        corr = b.predict(np.array(X, dtype=np.float64)) if b is not None else [0.0] * len(keys)
        return [calibrated_s(self.calibration, k, p) * math.exp(float(c)) for k, p, c in zip(keys, priors, corr)]

    def op_sum_times(self, info: "DeviceInfo", ops: list[F.Op]) -> tuple[float, float]:
        """(forward, backward) seconds of a list of operators on a profiled device: the sum of their times."""
        a = dict(dtype_bytes=info.dtype_bytes, peak_tflops=info.peak_tflops, hbm_gbps=info.hbm_gbps)
        out = []
        for phase in ("fwd", "bwd"):
            rows = [F.op_row(o, phase, **a) for o in ops]
            X, priors = [x for x, _ in rows], [p for _, p in rows]
            keys = [calibration_key(info.name, "op", phase, x, info.arithmetic) for x in X]
            out.append(sum(self.times(f"op_{phase}", keys, priors, X)))
        return out[0], out[1]

    def composed_layer_times(self, info: "DeviceInfo", ops: list[F.Op]) -> tuple[float, float]:
        """A transformer layer from its operators: their sum, composed (stage 3) where whole layers of the device
        were measured."""
        sums = self.op_sum_times(info, ops)
        return tuple(_apply_rate(self.composition.get(f"{info.name}|{ph}"), t) for ph, t in zip(("fwd", "bwd"), sums))


def _apply_rate(rate_overhead, t: float) -> float:
    return t if rate_overhead is None else rate_overhead[0] * t + rate_overhead[1]


def predict_samples(model: FittedModel, samples: list[Sample]) -> list[float]:
    """Predicted seconds for each sample: calibrated roofline x tree correction + the known part."""
    out = [0.0] * len(samples)
    by_name: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_name.setdefault(f"{s.granularity}_{s.phase}", []).append(i)
    for name, idx in by_name.items():
        rows = [samples[i] for i in idx]
        times = model.times(name, [s.calibration_key() for s in rows], [s.prior_s for s in rows],
                            [s.features for s in rows])
        for i, t in zip(idx, times):
            s = samples[i]
            # a measured layer's pass: its learned part and its known part (TP all-reduces, softmax passes)
            # together stand on the host floor
            out[i] = (F.host_floored(t + s.known_s, model.floor_s(s.device, s.phase, s.tp)) if s.granularity == "layer"
                      else t + s.known_s)
    return out


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
            else:
                ok = ok and isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
        ok = ok and v["arithmetic"] in F.ARITHMETIC_BYTES and F.ARITHMETIC_BYTES[v["arithmetic"]] == v["dtype_bytes"]
        if not ok:
            raise InputError(f"has a garbled entry for {name!r} (expected {', '.join(kinds)}, each a figure of "
                             "the right kind)", file=path, field=f"devices.{name}", fix="re-fit it with 'hetauto fit'")
        out[name] = DeviceInfo(**v)
    return out


_ARITHMETIC_WORDS = {"16-bit": "16-bit precision (bf16/fp16)", "fp32": "fp32 without tensor cores",
                     "tf32": "fp32 with TF32 GEMMs"}


# ---- prediction --------------------------------------------------------------------------------------------
class LearnedCostModel:
    """Same interface as AnalyticCostModel; learned where the model directory covers the device type."""

    name = "learned"

    def __init__(self, model_dir: str, fallback=None):
        if fallback is None:
            from ..analytic import AnalyticCostModel
            fallback = AnalyticCostModel()
        self.fallback = fallback
        self.model_dir = model_dir
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
        self.manifest = man
        self.devices = _device_infos(man.get("devices", {}), path)
        tables = {}
        for table in ("calibration", "composition", "optimizer_step"):
            try:
                tables[table] = {k: (float(v["rate"]), float(v["overhead_s"]))
                                 for k, v in man.get(table, {}).items()}
            except (TypeError, KeyError, ValueError, AttributeError):
                raise InputError(f"has a garbled '{table}' table", file=path, field=table,
                                 fix="re-fit it with 'hetauto fit'")
            bad = [k for k, (r, o) in tables[table].items() if not (math.isfinite(r) and math.isfinite(o))
                   or (table == "calibration" and len(k.split("|")) != 5)]
            if bad:
                raise InputError(f"has a garbled '{table}' table (entry {bad[0]!r}: not finite figures or not a "
                                 "calibration key)", file=path, field=f"{table}.{bad[0]}", fix="re-fit it with 'hetauto fit'")
            # a fit makes every rate positive (fitting.py _fit_rate_overhead: the exp of a median): a rate of 0 or
            # below would price that work as free or negative and steer the search to it
            for k, (r, _) in tables[table].items():
                if r <= 0:
                    raise InputError(f"must be positive, got {r:g} (no fit writes that)", file=path,
                                     field=f"{table}.{k}.rate", fix="re-fit it with 'hetauto fit'")
        lgb = _lgb()
        boosters = {}
        named = man.get("boosters", {})
        if not isinstance(named, dict) or not all(isinstance(f, str) for f in named.values()):
            raise InputError("must map each booster's name to its file name", file=path, field="boosters",
                             fix="re-fit it with 'hetauto fit'")
        for name, fname in named.items():
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
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise InputError(f"has a garbled {field} ({value!r})", file=path, field=field,
                                 fix="re-fit it with 'hetauto fit'")
        fit = man.get("fit") if isinstance(man.get("fit"), dict) else {}    # the fit's report: informational
        self.fitted = FittedModel(tables["calibration"], boosters, fit.get("rounds", {}),
                                  tables["composition"], float(weight))
        self.fitted.optimizer = tables["optimizer_step"]
        self.fitted.gemm_bwd_weight = float(gemm_weight)
        floor = man.get("host_floor", {})   # models fitted before it existed: no floor
        if not isinstance(floor, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf for v in floor.values()):
            raise InputError("has a garbled host_floor table", file=path, field="host_floor",
                             fix="re-fit it with 'hetauto fit'")
        self.fitted.host_floor = {str(k): float(v) for k, v in floor.items()}
        rates = man.get("tp_allreduce_bytes_per_s", {})   # models fitted before it existed: the node's link
        self.fitted.tp_allreduce = _read_rates(rates, path)
        # Covered: measured in both phases at its granularity, in the arithmetic its DeviceInfo states (the
        # calibration has groups for both phases in it).
        groups = {(d, g, ph, a) for d, g, ph, _, a in (k.split("|") for k in self.fitted.calibration)}
        self._covered = {d for d, i in self.devices.items()
                         if all((i.name, i.granularity, ph, i.arithmetic) in groups for ph in ("fwd", "bwd"))}
        self._cache: dict[tuple, tuple[float, float]] = {}

    def coverage(self, device: DeviceType) -> tuple[DeviceInfo | None, str]:
        """(what the model knows of `device`, None if the analytic model prices it; and why, in words).

        A device type is priced by the learned model only with its own measurements in the arithmetic it trains in
        (F.device_arithmetic: 16-bit, fp32, or fp32 with TF32 GEMMs, e.g. Sailor's tensor-core runs): no rate is
        borrowed from another device type or another precision."""
        name = canonical_device_name(device.name) or device.name
        name = name if name in self.devices else device.name
        covered = ", ".join(self.covered_devices()) or "none"
        info = self.devices.get(name)
        if info is None or name not in self._covered:
            kin = [d for d in self.covered_devices() if d.split("-")[0] == name.split("-")[0] and d != name]
            hint = (f"; {' / '.join(kin)}: the same chip with another memory size, if yours are those write "
                    "that name in the inventory") if kin else ""
            return None, f"no measurements of {name} in the learned model (it covers: {covered}){hint}"
        want = F.device_arithmetic(device)
        if info.arithmetic != want:
            return None, (f"the learned model measured {name} in {_ARITHMETIC_WORDS[info.arithmetic]}, the plan trains "
                          f"in {_ARITHMETIC_WORDS[want]}: no rate is borrowed from another precision"
                          + ("; an fp32 plan runs on TF32 unless the inventory says 'tf32: false' for the cluster"
                             if info.arithmetic == "tf32" and device.precision == "fp32"
                             and device.peak_tflops_at("tf32") is not None else ""))
        if device.precision == "fp8":   # same element size as bf16, another GEMM rate: measured never in fp8
            return None, (f"the learned model measured {name} in 16-bit, the plan trains in fp8: no rate is "
                          "borrowed from another precision")
        return info, f"measured ({info.source}, {info.rows} rows, {_ARITHMETIC_WORDS[info.arithmetic]})"

    def _info(self, device: DeviceType) -> DeviceInfo | None:
        return self.coverage(device)[0]

    def source(self, device: DeviceType) -> str:
        return "learned" if self._info(device) is not None else "analytic"

    def describe(self, devices) -> list[str]:
        """One line per device type: which model prices it and why (what the planner says on stderr)."""
        out = []
        for dev in sorted({d.name: d for d in devices}.values(), key=lambda d: d.name):
            info, why = self.coverage(dev)
            out.append(f"{dev.name}: {'learned' if info is not None else 'analytic'} ({why})")
        return out

    def covered_devices(self) -> list[str]:
        """Device types this model predicts for (by name; some need not be in the catalog)."""
        return sorted(self._covered)

    # ---- internals --------------------------------------------------------------------------------------
    def _predict(self, info: DeviceInfo, phase: str, rows: list[tuple[list, float]]) -> float:
        """Sum over rows of (features, prior) of the fitted model's times."""
        keys = [calibration_key(info.name, info.granularity, phase, x, info.arithmetic) for x, _ in rows]
        return sum(self.fitted.times(f"{info.granularity}_{phase}", keys, [p for _, p in rows],
                                     [x for x, _ in rows]))

    def _layer_time(self, info: DeviceInfo, shape: F.LayerShape) -> tuple[float, float]:
        """Compute only: a measured layer's TP all-reduces were set apart when fitting (Sample.known_s), and
        the planner prices them with its communication model; the host floor bounds compute and all-reduces
        together, so the planner applies it where it adds them (`host_floors`)."""
        a = dict(dtype_bytes=info.dtype_bytes, peak_tflops=info.peak_tflops, hbm_gbps=info.hbm_gbps,
                 score_bwd_weight=self.fitted.score_bwd_weight,
                 gemm_bwd_weight=F.backward_gemm_weight(info.name, info.arithmetic, self.fitted.gemm_bwd_weight))
        return tuple(self._predict(info, phase, [F.layer_row(shape, phase, **a)])
                     + F.unfused_softmax_s(shape, phase, info.dtype_bytes, info.hbm_gbps) for phase in ("fwd", "bwd"))

    def _piece(self, piece: str, model: ModelSpec, device: DeviceType, tp: int, mb: int, seq: int | None):
        info = self._info(device)
        if info is None or (info.granularity != "op" and piece in ("embedding", "head")):
            # per-layer data measures transformer layers only (see sailor_samples): the analytic model prices the
            # embedding and head for the device as this plan sees it (its precision, TF32), so not cached by name
            return getattr(self.fallback, f"{piece}_times")(model, device, tp, mb, seq)
        key = (piece, model, info.name, tp, mb, seq)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if info.granularity == "op" and piece == "layer":
            res = self.fitted.composed_layer_times(info, F.layer_ops(model, tp, mb, seq))
        elif info.granularity == "op":
            fn = {"head": F.head_ops, "embedding": F.embedding_ops}[piece]
            res = self.fitted.op_sum_times(info, fn(model, tp, mb, seq))
        else:
            res = self._layer_time(info, F.LayerShape.of(model, tp, mb, seq))
        self._cache[key] = res
        return res

    # ---- the cost-model interface -----------------------------------------------------------------------
    def layer_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                    seq_length: int | None = None) -> tuple[float, float]:
        return self._piece("layer", model, device, tp, micro_batch_size, seq_length)

    def head_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                   seq_length: int | None = None) -> tuple[float, float]:
        return self._piece("head", model, device, tp, micro_batch_size, seq_length)

    def embedding_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                        seq_length: int | None = None) -> tuple[float, float]:
        return self._piece("embedding", model, device, tp, micro_batch_size, seq_length)

    def optimizer_calibration(self, device: DeviceType) -> tuple[float, float]:
        """(rate on the optimizer's memory traffic, fixed seconds per optimizer step) of a stage's optimizer step:
        measured for a covered device type where the fit kept it (fit_optimizer), else the analytic model's (1, 0)."""
        info = self._info(device)
        hit = self.fitted.optimizer.get(info.name) if info is not None else None
        return hit if hit is not None else self.fallback.optimizer_calibration(device)

    def host_floors(self, device: DeviceType, tp: int) -> tuple[float, float]:
        """(forward, backward) host floor of a transformer layer's pass at TP degree `tp`, compute and TP
        all-reduces together (F.host_floored; the planner applies it where it adds the all-reduces): the fitted
        one for a device measured per layer, else the fallback's."""
        info = self._info(device)
        if info is None:
            return self.fallback.host_floors(device, tp)
        if info.granularity != "layer":
            return 0.0, 0.0
        return self.fitted.floor_s(info.name, "fwd", tp), self.fitted.floor_s(info.name, "bwd", tp)

    def tp_link(self, device: DeviceType, tp: int, link: LinkSpec, nbytes: float | None = None) -> LinkSpec:
        """The link `device`'s TP collectives of `nbytes` run on at degree `tp`: `link` (the node's), or where this
        device's measured layers ran their all-reduces of that size slower at that degree, that rate
        (sailor_tp_allreduce_rates; the fit set the all-reduces apart at it, so the planner adds them back at it).
        nbytes None: the rate of the largest message measured."""
        info = self._info(device)
        points = self.fitted.tp_allreduce.get(tp_allreduce_key(info.name, tp)) if info is not None else None
        rate = allreduce_rate_at(points, nbytes) if points is not None else None
        if rate is None or rate >= link.bytes_per_s:
            return link
        return dataclasses.replace(link, bandwidth_gbps=rate * 8 / 1e9)

    def iteration_overhead_s(self, device: DeviceType) -> float:
        """Per-iteration fixed time: no measurement covers it, the analytic model's constant."""
        return self.fallback.iteration_overhead_s(device)

    def recompute_time(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                       recompute: str, seq_length: int | None = None) -> float:
        """Full recomputation re-runs the layer's forward; selective re-runs the MLP share of it (the share
        from the analytic model's split, applied to the learned forward time)."""
        if recompute == "none":
            return 0.0
        if recompute == "full":
            return self.layer_times(model, device, tp, micro_batch_size, seq_length)[0]
        if self._info(device) is None:
            return self.fallback.recompute_time(model, device, tp, micro_batch_size, recompute, seq_length)
        fwd = self.layer_times(model, device, tp, micro_batch_size, seq_length)[0]
        parts = self.fallback.layer_parts(model, device, tp, micro_batch_size, seq_length)
        total = sum(p[0] for p in parts.values())
        return fwd * parts["mlp"][0] / total if total > 0 else 0.0


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


def _read_rates(rates, path: str) -> dict:
    """The manifest's tp_allreduce_bytes_per_s: per key a list of [message bytes, bytes/s] in increasing bytes, or
    (models fitted before the sizes were kept) one rate for every size."""
    def number(x, low: float) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and low < x < math.inf

    def points(v):
        if number(v, 0):
            return float(v)
        if not isinstance(v, list) or not v or not all(isinstance(p, list) and len(p) == 2 and number(p[0], 0)
                                                       and number(p[1], 0) for p in v):
            return None
        out = tuple((float(b), float(r)) for b, r in v)
        return out if all(a[0] < b[0] for a, b in zip(out, out[1:])) else None

    read = {str(k): points(v) for k, v in rates.items()} if isinstance(rates, dict) else None
    if read is None or any(v is None for v in read.values()):
        raise InputError("has a garbled tp_allreduce_bytes_per_s table (each entry a rate in bytes/s, or a list of "
                         "[message bytes, bytes/s] in increasing bytes)", file=path, field="tp_allreduce_bytes_per_s",
                         fix="re-fit it with 'hetauto fit'")
    return read


def load_cost_model(path: str | None):
    """The cost model the planner uses: analytic when no directory is given, learned (with analytic fallback)
    otherwise."""
    if path is None:
        from ..analytic import AnalyticCostModel
        return AnalyticCostModel()
    return LearnedCostModel(path)
