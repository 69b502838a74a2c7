"""The learned cost model: LightGBM corrections to a roofline prior, fitted on measured times.

Two kinds of measurement train it (cost/features.py defines both feature vectors):
- operator rows from `hetauto profile` (one device type per file): QKV/output projections, attention core, MLP
  GEMMs, norms, rotary, activation, logits GEMM, loss; a layer's time is the sum of its operators;
- whole-layer rows: the per-layer GPU timings published by the Sailor project (see `load_sailor`).

Each booster predicts log(measured / prior) for one (granularity, phase); prediction = prior * exp(output).
A model directory holds `manifest.json` (format, feature version, device types covered, fit metrics) and the
boosters in LightGBM's text format. `LearnedCostModel` answers for the device types it has measurements of and
hands every other device type to the analytic model, and `source(device)` says which one answered, so a plan
can state where each number came from.
"""
from __future__ import annotations

import json
import math
import os
import random
import statistics
from dataclasses import dataclass

from ..errors import InputError
from ..spec.devices import CATALOG, DeviceType, canonical_device_name
from ..spec.model import ModelSpec, read_json_file
from . import features as F

MODEL_FORMAT = "hetauto-learned-cost/1"
PROFILE_FORMAT = "hetauto-profile/1"
MANIFEST = "manifest.json"
BOOSTERS = ("op_fwd", "op_bwd", "layer_fwd", "layer_bwd")

# Small data (hundreds of rows): shallow trees, many of them, slow learning rate; one thread = deterministic.
LGB_PARAMS = {"objective": "regression_l2", "learning_rate": 0.05, "num_leaves": 15, "min_data_in_leaf": 3,
              "min_data_in_bin": 1, "max_bin": 255, "feature_fraction": 0.9, "bagging_fraction": 1.0,
              "lambda_l2": 1.0, "verbosity": -1, "num_threads": 1, "deterministic": True, "seed": 0}
NUM_ROUNDS = 600


@dataclass(frozen=True)
class Sample:
    """One training / validation row."""
    granularity: str       # "op" | "layer"
    phase: str             # "fwd" | "bwd"
    device: str            # device type the measurement comes from
    features: tuple
    prior_s: float
    measured_s: float
    group: str             # rows sharing a group are held out together (one shape, or one model)
    label: str             # for tables


@dataclass(frozen=True)
class DeviceInfo:
    """What the model knows of a device type: the figures its features were computed with."""
    name: str
    granularity: str
    dtype_bytes: int
    peak_tflops: float
    hbm_gbps: float
    rows: int
    source: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


# ---- profiles written by `hetauto profile` -------------------------------------------------------------------
def read_profile(path: str) -> tuple[dict, list[dict]]:
    """(header, rows) of a profile JSON-lines file; malformed files raise InputError naming the line."""
    if not os.path.isfile(path):
        raise InputError("profile file not found", file=path, fix="pass a file written by 'hetauto profile'")
    header, rows = None, []
    with open(path) as fh:
        for no, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"line {no} is not JSON ({exc.msg})", file=path,
                                 fix="pass a file written by 'hetauto profile' (a cut-off last line can be deleted)")
            if header is None:
                if not isinstance(rec, dict) or rec.get("format") != PROFILE_FORMAT:
                    raise InputError(f"does not start with a '{PROFILE_FORMAT}' header line", file=path,
                                     field="format", fix="pass a file written by 'hetauto profile'")
                header = rec
            else:
                rows.append(rec)
    if header is None:
        raise InputError("is empty", file=path, fix="run 'hetauto profile' to fill it")
    return header, rows


def profile_samples(path: str) -> tuple[DeviceInfo, list[Sample]]:
    header, rows = read_profile(path)
    try:
        dev, db = str(header["device_type"]), int(header["dtype_bytes"])
        peak, bw = float(header["peak_tflops"]), float(header["hbm_gbps"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"header lacks or garbles {exc}", file=path, field="header",
                         fix="re-run 'hetauto profile' to write a fresh file")
    samples = []
    for r in rows:
        try:
            op = F.Op.from_dict(r["op"])
            # The 10th percentile, not the median: on a shared host the median also measures the neighbours
            # (a preempted repetition takes a scheduler slice longer); on a dedicated accelerator both agree.
            phases = {ph: float(r.get(f"{ph}_p10_s", r[f"{ph}_s"])) for ph in ("fwd", "bwd")}
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"row {r.get('key', '?')} is malformed ({exc})", file=path,
                             fix="delete the row (profiling resumes and re-measures it)")
        for phase, t in phases.items():
            if t <= 0:
                continue
            feats = F.op_features(op, phase, dtype_bytes=db, peak_tflops=peak, hbm_gbps=bw)
            samples.append(Sample("op", phase, dev, tuple(feats),
                                  F.op_prior_s(op, phase, db, peak, bw), t, op.key(), f"{op.name} {op.key()}"))
    info = DeviceInfo(dev, "op", db, peak, bw, len(rows), os.path.basename(path))
    return info, samples


# ---- Sailor per-layer GPU measurements ---------------------------------------------------------------------
# The shapes of the four models as Sailor ran them, checked against llm_info.json's parameter counts
# (tests/test_learned_sailor.py): OPT and GPT-Neo are plain-MLP GPTs with learned positions; Sailor's
# "LLAMA-3-8" layer holds 268.5M parameters, i.e. full multi-head attention and a 16384-wide SwiGLU, and its
# activations are 8192 tokens per micro-batch.
SAILOR_MODELS = {
    "OPT-350": ModelSpec("OPT-350", 24, 1024, 16, 4096, 50272, 2048, gated_mlp=False, position_embedding="learned"),
    "GPT-Neo-2.7": ModelSpec("GPT-Neo-2.7", 32, 2560, 20, 10240, 50257, 2048, gated_mlp=False,
                             position_embedding="learned"),
    "OPT-30": ModelSpec("OPT-30", 48, 7168, 56, 28672, 50272, 2048, gated_mlp=False, position_embedding="learned"),
    "LLAMA-3-8": ModelSpec("LLAMA-3-8", 32, 4096, 32, 16384, 128256, 8192, gated_mlp=True, position_embedding="rope"),
}
# Sailor GPU names -> our catalog; GPUs outside the catalog still train the model with their datasheet figures
# (dense FP16 tensor throughput with FP32 accumulation, memory bandwidth).
SAILOR_GPUS = {"A100-40": "a100-40gb", "A100-80": "a100-80gb", "V100-16": "v100-16gb", "GH-96": "gh200"}
SAILOR_EXTRA_GPUS = {"Titan-RTX": (130.0, 672.0), "RTX-2080": (40.3, 448.0), "RTX-3090": (71.0, 936.0)}
SAILOR_DTYPE_BYTES = 2   # mixed-precision training runs
# The measurements ship inside the package (with their MIT attribution), so `hetauto fit --sailor` works from an
# installed copy without a path.
SAILOR_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "sailor")


@dataclass(frozen=True)
class SailorLayer:
    model: str
    gpu: str
    device: str
    peak_tflops: float
    hbm_gbps: float
    shape: F.LayerShape
    index: int            # layer index in Sailor's list (transformer layers 1..L)
    fwd_s: float
    bwd_s: float


def sailor_device(gpu: str) -> tuple[str, float, float]:
    if gpu in SAILOR_GPUS:
        d = CATALOG[SAILOR_GPUS[gpu]]
        return d.name, d.peak_tflops, d.hbm_gbps
    if gpu in SAILOR_EXTRA_GPUS:
        return gpu.lower(), *SAILOR_EXTRA_GPUS[gpu]
    return "", 0.0, 0.0


def load_sailor(directory: str) -> list[SailorLayer]:
    """Every transformer-layer and head measurement of profiles_tmp.json as a SailorLayer.

    Layout: [model][gpu][micro_batch][tp][layer_index] = [forward_s, backward_s, update_s]; index 0 is the
    embedding (not used: its sub-millisecond times are launch noise), 1..L the transformer layers, the
    remaining one or two indices the final norm and output head (summed into one head row).
    """
    path = os.path.join(directory, "profiles_tmp.json")
    if os.path.isfile(directory):
        raise InputError("is a file, --sailor takes the directory holding profiles_tmp.json", file=directory,
                         field="--sailor", fix="write '--sailor' after the profile files (alone it means the "
                                               "packaged measurements) or '--sailor=DIR'")
    if not os.path.isfile(path):
        raise InputError("profiles_tmp.json not found in the Sailor data directory", file=directory,
                         field="--sailor", fix="pass the directory holding Sailor's profiles_tmp.json and llm_info.json, "
                                               "or '--sailor' alone for the packaged copy")
    data = read_json_file(path, field="--sailor")
    out = []
    for mname, per_gpu in data.items():
        spec = SAILOR_MODELS.get(mname)
        if spec is None:
            continue
        for gpu, per_mb in per_gpu.items():
            dev, peak, bw = sailor_device(gpu)
            if not dev:
                continue
            for mb, per_tp in per_mb.items():
                for tp, layers in per_tp.items():
                    mb_i, tp_i = int(mb), int(tp)
                    if spec.num_attention_heads % tp_i or spec.ffn_hidden_size % tp_i:
                        continue
                    common = dict(hidden=spec.hidden_size, heads=spec.num_attention_heads,
                                  kv_heads=spec.num_query_groups, ffn=spec.ffn_hidden_size, vocab=spec.vocab_size,
                                  seq=spec.seq_length, micro_batch=mb_i, tp=tp_i, gated=int(spec.gated_mlp),
                                  rope=int(spec.position_embedding == "rope"))
                    idx = sorted(int(i) for i in layers)
                    L = spec.num_layers
                    for i in idx:
                        if 1 <= i <= L:
                            f, b = layers[str(i)][:2]
                            out.append(SailorLayer(mname, gpu, dev, peak, bw, F.LayerShape("transformer", **common),
                                                   i, float(f), float(b)))
                    tail = [i for i in idx if i > L]
                    if tail:
                        f = sum(layers[str(i)][0] for i in tail)
                        b = sum(layers[str(i)][1] for i in tail)
                        out.append(SailorLayer(mname, gpu, dev, peak, bw, F.LayerShape("head", **common),
                                               tail[-1], float(f), float(b)))
    if not out:
        raise InputError("holds no usable measurements", file=path, field="--sailor",
                         fix="pass Sailor's profiles_tmp.json (models OPT-350, GPT-Neo-2.7, OPT-30, LLAMA-3-8)")
    return out


def _sailor_config_key(r: SailorLayer) -> tuple:
    return (r.model, r.gpu, r.shape.kind, r.shape.micro_batch, r.shape.tp)


def sailor_samples(layers: list[SailorLayer]) -> list[Sample]:
    """One row per (model, GPU, layer kind, micro-batch, TP, phase): the median over the identical layers,
    so a 48-layer model does not outweigh a 24-layer one and per-layer jitter does not become signal."""
    groups: dict[tuple, list[SailorLayer]] = {}
    for r in layers:
        groups.setdefault(_sailor_config_key(r), []).append(r)
    out = []
    for key, rs in groups.items():
        r0 = rs[0]
        for phase in ("fwd", "bwd"):
            t = statistics.median(getattr(r, f"{phase}_s") for r in rs)
            if t <= 0:
                continue
            out.append(_sailor_sample(r0, phase, t))
    return out


def _sailor_sample(r: SailorLayer, phase: str, t: float) -> Sample:
    feats = F.layer_features(r.shape, phase, dtype_bytes=SAILOR_DTYPE_BYTES, peak_tflops=r.peak_tflops,
                             hbm_gbps=r.hbm_gbps)
    prior = F.layer_prior_s(r.shape.ops(), phase, SAILOR_DTYPE_BYTES, r.peak_tflops, r.hbm_gbps)
    label = f"{r.model} {r.gpu} {r.shape.kind} mb={r.shape.micro_batch} tp={r.shape.tp} #{r.index}"
    return Sample("layer", phase, r.device, tuple(feats), prior, t, r.model, label)


def sailor_device_infos(layers: list[SailorLayer]) -> dict[str, DeviceInfo]:
    count: dict[str, int] = {}
    for r in layers:
        count[r.device] = count.get(r.device, 0) + 1
    first = {r.device: r for r in layers}
    return {d: DeviceInfo(d, "layer", SAILOR_DTYPE_BYTES, first[d].peak_tflops, first[d].hbm_gbps, n, "sailor")
            for d, n in count.items()}


# ---- fitting -----------------------------------------------------------------------------------------------
def _lgb():
    import lightgbm  # imported on first use: the planner must start fast without a fitted model
    return lightgbm


def train_boosters(samples: list[Sample], seed: int = 0, rounds: int = NUM_ROUNDS) -> dict:
    """One booster per (granularity, phase) present in `samples`; target = log(measured / prior)."""
    import numpy as np
    lgb = _lgb()
    boosters = {}
    for name in BOOSTERS:
        gran, phase = name.split("_")
        rows = [s for s in samples if s.granularity == gran and s.phase == phase]
        if not rows:
            continue
        names = F.OP_FEATURES if gran == "op" else F.LAYER_FEATURES
        X = np.array([s.features for s in rows], dtype=np.float64)
        y = np.array([math.log(s.measured_s / s.prior_s) for s in rows], dtype=np.float64)
        ds = lgb.Dataset(X, y, feature_name=list(names), categorical_feature=["kind"], free_raw_data=True,
                         params={"verbosity": -1, "min_data_in_bin": 1})
        params = dict(LGB_PARAMS, seed=seed, min_data_in_leaf=max(1, min(3, len(rows) // 4)))
        boosters[name] = lgb.train(params, ds, num_boost_round=rounds)
    return boosters


def predict_samples(boosters: dict, samples: list[Sample]) -> list[float]:
    """Predicted seconds for each sample (samples whose booster is missing get their prior)."""
    import numpy as np
    out = [0.0] * len(samples)
    by_name: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_name.setdefault(f"{s.granularity}_{s.phase}", []).append(i)
    for name, idx in by_name.items():
        b = boosters.get(name)
        if b is None:
            for i in idx:
                out[i] = samples[i].prior_s
            continue
        pred = b.predict(np.array([samples[i].features for i in idx], dtype=np.float64))
        for i, p in zip(idx, pred):
            out[i] = samples[i].prior_s * math.exp(float(p))
    return out


def mape(pred: list[float], meas: list[float]) -> float:
    if not meas:
        return float("nan")
    return 100.0 * sum(abs(p - m) / m for p, m in zip(pred, meas)) / len(meas)


def split_holdout(samples: list[Sample], fraction: float, seed: int) -> tuple[list[Sample], list[Sample]]:
    """Random split by group (an operator shape, both phases, stays on one side)."""
    groups = sorted({(s.device, s.group) for s in samples})
    rng = random.Random(seed)
    rng.shuffle(groups)
    held = set(groups[:int(round(fraction * len(groups)))])
    return [s for s in samples if (s.device, s.group) not in held], [s for s in samples if (s.device, s.group) in held]


@dataclass(frozen=True)
class FitResult:
    model_dir: str
    devices: dict           # name -> DeviceInfo
    heldout: dict           # "device granularity phase" -> {"rows": n, "mape_pct": x}
    rows: int

    def to_dict(self) -> dict:
        return {"model_dir": self.model_dir, "rows": self.rows,
                "devices": {k: v.to_dict() for k, v in self.devices.items()}, "heldout": self.heldout}


def fit(profiles: list[str], out_dir: str, *, sailor_dir: str | None = None, holdout: float = 0.2,
        seed: int = 0, rounds: int = NUM_ROUNDS) -> FitResult:
    """Fit on profiles (and Sailor data), measure the error on a held-out share, refit on all rows, save."""
    if not profiles and not sailor_dir:
        raise InputError("nothing to fit", field="PROFILES",
                         fix="pass profile files from 'hetauto profile' and/or --sailor DIR")
    if not 0.0 <= holdout < 1.0:
        raise InputError(f"must be in [0, 1), got {holdout}", field="--holdout")
    devices: dict[str, DeviceInfo] = {}
    samples: list[Sample] = []
    for p in profiles:
        info, rows = profile_samples(p)
        if info.name in devices:
            raise InputError(f"device type {info.name} comes from two profiles", file=p, field="device_type",
                             fix="merge them into one file (profiling resumes into an existing file) or pass one")
        devices[info.name] = info
        samples += rows
    if sailor_dir:
        layers = load_sailor(sailor_dir)
        for name, info in sailor_device_infos(layers).items():
            if name in devices:
                raise InputError(f"device type {name} is both profiled and in the Sailor data", field="--sailor",
                                 fix="fit them into separate model directories")
            devices[name] = info
        samples += sailor_samples(layers)
    if len(samples) < 8:
        raise InputError(f"only {len(samples)} measurements: too few to fit", field="PROFILES",
                         fix="profile more shapes (drop --quick or widen the grid)")
    heldout = {}
    if holdout > 0:
        train, test = split_holdout(samples, holdout, seed)
        if train and test:
            pred = predict_samples(train_boosters(train, seed, rounds), test)
            keys: dict[str, list[int]] = {}
            for i, s in enumerate(test):
                keys.setdefault(f"{s.device} {s.granularity} {s.phase}", []).append(i)
            for k, idx in sorted(keys.items()):
                heldout[k] = {"rows": len(idx), "mape_pct": round(mape([pred[i] for i in idx],
                                                                        [test[i].measured_s for i in idx]), 2)}
            heldout["all"] = {"rows": len(test), "mape_pct": round(mape(pred, [s.measured_s for s in test]), 2)}
    boosters = train_boosters(samples, seed, rounds)
    save_model(out_dir, boosters, devices, {"heldout": heldout, "rows": len(samples), "seed": seed,
                                            "holdout_fraction": holdout, "rounds": rounds})
    return FitResult(out_dir, devices, heldout, len(samples))


def save_model(out_dir: str, boosters: dict, devices: dict, metrics: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    files = {}
    for name, b in boosters.items():
        files[name] = f"{name}.txt"
        b.save_model(os.path.join(out_dir, files[name]))
    manifest = {"format": MODEL_FORMAT, "feature_version": F.FEATURE_VERSION, "boosters": files,
                "op_features": list(F.OP_FEATURES), "layer_features": list(F.LAYER_FEATURES),
                "devices": {k: v.to_dict() for k, v in sorted(devices.items())}, "fit": metrics}
    with open(os.path.join(out_dir, MANIFEST), "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.write("\n")


# ---- prediction --------------------------------------------------------------------------------------------
class LearnedCostModel:
    """Same interface as AnalyticCostModel; learned where the model directory covers the device type."""

    name = "learned"

    def __init__(self, model_dir: str, fallback=None):
        if fallback is None:
            from .analytic import AnalyticCostModel
            fallback = AnalyticCostModel()
        self.fallback = fallback
        self.model_dir = model_dir
        path = os.path.join(model_dir, MANIFEST)
        if not os.path.isfile(path):
            raise InputError("is not a fitted cost model (no manifest.json)", file=model_dir, field="--cost-model",
                             fix="pass a directory written by 'hetauto fit'")
        man = read_json_file(path, field="--cost-model", fix="re-fit it with 'hetauto fit'")
        if man.get("format") != MODEL_FORMAT:
            raise InputError(f"has format {man.get('format')!r}, expected {MODEL_FORMAT!r}", file=path,
                             field="format", fix="re-fit it with this version of 'hetauto fit'")
        if man.get("feature_version") != F.FEATURE_VERSION:
            raise InputError(f"was fitted with feature version {man.get('feature_version')}, this version uses "
                             f"{F.FEATURE_VERSION}", file=path, field="feature_version",
                             fix="re-fit it: 'hetauto fit PROFILES -o DIR'")
        self.manifest = man
        self.devices = {k: DeviceInfo(**v) for k, v in man.get("devices", {}).items()}
        lgb = _lgb()
        self.boosters = {}
        for name, fname in man.get("boosters", {}).items():
            fpath = os.path.join(model_dir, fname)
            if not os.path.isfile(fpath):
                raise InputError(f"booster file {fname} is missing", file=model_dir, field="boosters",
                                 fix="re-fit the model or copy the whole directory")
            self.boosters[name] = lgb.Booster(model_file=fpath)
        self._cache: dict[tuple, tuple[float, float]] = {}

    def _info(self, device: DeviceType) -> DeviceInfo | None:
        info = self.devices.get(canonical_device_name(device.name) or device.name) or self.devices.get(device.name)
        if info is None:
            return None
        if f"{info.granularity}_fwd" not in self.boosters or f"{info.granularity}_bwd" not in self.boosters:
            return None
        return info

    def source(self, device: DeviceType) -> str:
        return "learned" if self._info(device) is not None else "analytic"

    def covered_devices(self) -> list[str]:
        """Device types this model predicts for (by name; some need not be in the catalog)."""
        return sorted(d for d, i in self.devices.items()
                      if f"{i.granularity}_fwd" in self.boosters and f"{i.granularity}_bwd" in self.boosters)

    # ---- internals --------------------------------------------------------------------------------------
    def _predict(self, name: str, X: list) -> list[float]:
        import numpy as np
        return [float(v) for v in self.boosters[name].predict(np.array(X, dtype=np.float64))]

    def _ops_time(self, info: DeviceInfo, ops: list[F.Op]) -> tuple[float, float]:
        out = []
        for phase in ("fwd", "bwd"):
            X = [F.op_features(o, phase, dtype_bytes=info.dtype_bytes, peak_tflops=info.peak_tflops,
                               hbm_gbps=info.hbm_gbps) for o in ops]
            pred = self._predict(f"op_{phase}", X)
            out.append(sum(F.op_prior_s(o, phase, info.dtype_bytes, info.peak_tflops, info.hbm_gbps) * math.exp(p)
                           for o, p in zip(ops, pred)))
        return out[0], out[1]

    def _layer_time(self, info: DeviceInfo, shape: F.LayerShape) -> tuple[float, float]:
        out = []
        for phase in ("fwd", "bwd"):
            x = F.layer_features(shape, phase, dtype_bytes=info.dtype_bytes, peak_tflops=info.peak_tflops,
                                 hbm_gbps=info.hbm_gbps)
            prior = F.layer_prior_s(shape.ops(), phase, info.dtype_bytes, info.peak_tflops, info.hbm_gbps)
            out.append(prior * math.exp(self._predict(f"layer_{phase}", [x])[0]))
        return out[0], out[1]

    def _piece(self, piece: str, model: ModelSpec, device: DeviceType, tp: int, mb: int, seq: int | None):
        info = self._info(device)
        if info is None:
            return getattr(self.fallback, f"{piece}_times")(model, device, tp, mb, seq)
        key = (piece, model, info.name, tp, mb, seq)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if info.granularity == "op":
            fn = {"layer": F.layer_ops, "head": F.head_ops, "embedding": F.embedding_ops}[piece]
            res = self._ops_time(info, fn(model, tp, mb, seq))
        elif piece == "embedding":
            res = self.fallback.embedding_times(model, device, tp, mb, seq)   # not measured per layer: analytic
        else:
            shape = F.LayerShape("transformer" if piece == "layer" else "head", model.hidden_size,
                                 model.num_attention_heads, model.num_query_groups, model.ffn_hidden_size,
                                 model.vocab_size, seq or model.seq_length, mb, tp, int(model.gated_mlp),
                                 int(model.position_embedding == "rope"))
            res = self._layer_time(info, shape)
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

    def recompute_time(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                       recompute: str, seq_length: int | None = None) -> float:
        """Full recomputation re-runs the layer's forward; selective re-runs the MLP share of it (the share
        from the analytic model's split, applied to the learned forward time)."""
        if recompute == "none":
            return 0.0
        fwd = self.layer_times(model, device, tp, micro_batch_size, seq_length)[0]
        if recompute == "full" or self._info(device) is None:
            return fwd if recompute == "full" else self.fallback.recompute_time(
                model, device, tp, micro_batch_size, recompute, seq_length)
        parts = self.fallback.layer_parts(model, device, tp, micro_batch_size, seq_length)
        total = sum(p[0] for p in parts.values())
        return fwd * parts["mlp"][0] / total if total > 0 else 0.0


def load_cost_model(path: str | None):
    """The cost model the planner uses: analytic when no directory is given, learned (with analytic fallback)
    otherwise."""
    if path is None:
        from .analytic import AnalyticCostModel
        return AnalyticCostModel()
    return LearnedCostModel(path)


# ---- validation --------------------------------------------------------------------------------------------
def sailor_layer_samples(layers: list[SailorLayer]) -> list[Sample]:
    """Every measured layer as its own row (validation compares per layer, not per configuration median)."""
    return [_sailor_sample(r, ph, getattr(r, f"{ph}_s")) for r in layers for ph in ("fwd", "bwd")
            if getattr(r, f"{ph}_s") > 0]


def validate(model: LearnedCostModel, samples: list[Sample]) -> dict:
    """Predicted vs measured for each sample the model covers; per-row error, MAPE by device and phase."""
    covered = set(model.covered_devices())
    rows = [s for s in samples if s.device in covered]
    if not rows:
        raise InputError("the model covers none of the measured device types "
                         f"({', '.join(sorted({s.device for s in samples}))})", field="--cost-model",
                         fix="fit a model that includes these measurements' device type")
    pred = predict_samples(model.boosters, rows)
    table = [{"device": s.device, "phase": s.phase, "label": s.label, "measured_s": s.measured_s,
              "predicted_s": p, "prior_s": s.prior_s, "error_pct": 100.0 * (p - s.measured_s) / s.measured_s}
             for s, p in zip(rows, pred)]
    summary: dict[str, dict] = {}
    for key in sorted({(r["device"], r["phase"]) for r in table}) + [("all", "")]:
        sel = [r for r in table if key[0] == "all" or (r["device"], r["phase"]) == key]
        summary[" ".join(k for k in key if k)] = {
            "rows": len(sel), "mape_pct": round(mape([r["predicted_s"] for r in sel], [r["measured_s"] for r in sel]), 2),
            "prior_mape_pct": round(mape([r["prior_s"] for r in sel], [r["measured_s"] for r in sel]), 2)}
    return {"rows": table, "summary": summary, "skipped": len(samples) - len(rows)}
