"""The learned cost model: LightGBM corrections to a roofline prior, fitted on measured times.

Three kinds of measurement train it (cost/features.py defines the feature vectors):
- operator rows from `hetauto profile` (one device type per file): QKV/output projections, attention core, MLP
  GEMMs, norms, rotary, activation, logits GEMM, loss; a layer's time is the sum of its operators;
- whole layers from `hetauto profile --layers` of a profiled device: how its operators compose into a layer
  (stage 3 below), kept where it carries over to a model left out;
- whole-layer rows: the per-layer GPU timings published by the Sailor project (see `load_sailor`).

Stage 1 calibrates the roofline prior per group of rows (rate x prior + overhead), stage 2 fits LightGBM on
log(measured / calibrated) per (granularity, phase) with cross-validated rounds, stage 3 composes operators into
layers. A model directory holds `manifest.json` (format, feature version, calibration and composition tables,
device types covered, fit metrics) and the boosters in LightGBM's text format. `LearnedCostModel` answers for the device types it has measurements of and
hands every other device type to the analytic model, and `source(device)` says which one answered, so a plan
can state where each number came from.
"""
from __future__ import annotations

import dataclasses
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

MODEL_FORMAT = "hetauto-learned-cost/2"
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
    known_s: float = 0.0   # part of measured_s another model prices (a layer's TP all-reduces): not learned

    @property
    def baseline_s(self) -> float:
        """What the analytic side alone predicts: the roofline prior plus the known part."""
        return self.prior_s + self.known_s

    def learned_part_s(self) -> float:
        """The measurement less its known part, kept >= a quarter of the measurement so that an over-estimated
        known part cannot make it vanish."""
        return max(self.measured_s - self.known_s, 0.25 * self.measured_s)

    def calibration_key(self) -> str:
        return calibration_key(self.device, self.granularity, self.phase, self.features)


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
def read_profile(path: str, *, header_only: bool = False) -> tuple[dict, list[dict]]:
    """(header, rows) of a profile JSON-lines file; malformed files raise InputError naming the line.
    `header_only`: stop after the header (rows come back empty)."""
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
                if header_only:
                    break
            else:
                rows.append(rec)
    if header is None:
        raise InputError("is empty", file=path, fix="run 'hetauto profile' to fill it")
    return header, rows


def profile_samples(path: str) -> tuple[DeviceInfo, list[Sample]]:
    header, rows = read_profile(path)
    if header.get("granularity", "op") != "op":
        raise InputError("holds whole-layer timings ('hetauto profile --layers'), not operators", file=path,
                         field="granularity", fix="pass it to 'hetauto fit' together with the same device's operator "
                                                  "profile, or to 'hetauto validate-cost-model --profile'")
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
            feats, prior = F.op_row(op, phase, dtype_bytes=db, peak_tflops=peak, hbm_gbps=bw)
            samples.append(Sample("op", phase, dev, tuple(feats), prior, t, op.key(), f"{op.name} {op.key()}"))
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
# Datasheet FP32 throughput without tensor cores (TF32 off), TFLOP/s: the ceiling of a run in plain FP32.
SAILOR_FP32_TFLOPS = {"A100-40": 19.5, "A100-80": 19.5, "V100-16": 15.7, "GH-96": 67.0, "Titan-RTX": 16.3,
                      "RTX-2080": 10.1, "RTX-3090": 35.6}
# The measurements ship inside the package (with their MIT attribution), so `hetauto fit --sailor` works from an
# installed copy without a path.
SAILOR_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "sailor")


# NVIDIA H200 operator and whole-layer timings measured by `hetauto profile` (data/h200/README.md).
H200_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "h200")


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
    precision: str = "fp16"   # "fp16" (tensor cores) or "fp32" (see sailor_precisions)
    tp_comm_s: float = 0.0    # TP all-reduce time the measurement contains, per pass (see tp_allreduces_s)

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.precision == "fp32" else SAILOR_DTYPE_BYTES

    @property
    def compute_tflops(self) -> float:
        """The compute ceiling of this run: the tensor-core peak, or the FP32 peak for an FP32 run."""
        return SAILOR_FP32_TFLOPS[self.gpu] if self.precision == "fp32" else self.peak_tflops


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
    prec = sailor_precisions(out)
    out = [dataclasses.replace(r, precision=prec[(r.model, r.gpu)]) for r in out]
    fits = read_allreduce_fits(directory)
    return [dataclasses.replace(r, tp_comm_s=tp_allreduces_s(r, fits)) for r in out]


def forward_tflops(r: SailorLayer) -> float:
    """The FLOP rate a measured transformer layer achieved in its forward pass (attention scores counted in
    full, as the unfused runs compute them)."""
    ops = r.shape.ops()
    flops = sum(o.flops() for o in ops) + sum(o.flops() for o in ops if o.kind == "attention")
    return flops / r.fwd_s / 1e12


def sailor_precisions(layers: list[SailorLayer]) -> dict[tuple, str]:
    """The arithmetic each (model, GPU) run used, which the data does not record.

    Rule: a run is FP32 when no transformer layer of it ever beat the GPU's FP32 (non-tensor-core) peak;
    one that did must have used tensor cores (fp16). A run's precision is a fact of how it was launched,
    like its micro-batch, so it is recovered once per run from the whole run and never fitted.
    docs/cost-model-learned.md gives the evidence (the same project's fp16/fp32-labelled operator profiles)."""
    best: dict[tuple, float] = {}
    for r in layers:
        if r.shape.kind == "transformer" and r.fwd_s > 0:
            k = (r.model, r.gpu)
            best[k] = max(best.get(k, 0.0), forward_tflops(r))
    return {(r.model, r.gpu): ("fp32" if best.get((r.model, r.gpu), math.inf) <= SAILOR_FP32_TFLOPS[r.gpu] else "fp16")
            for r in layers}


def _sailor_config_key(r: SailorLayer) -> tuple:
    return (r.model, r.gpu, r.shape.kind, r.shape.micro_batch, r.shape.tp)


def sailor_samples(layers: list[SailorLayer], score_bwd_weight: float = 1.0) -> list[Sample]:
    """One row per (model, GPU, micro-batch, TP, phase) of the transformer layers: the median over the identical
    layers, so a 48-layer model does not outweigh a 24-layer one and per-layer jitter does not become signal.

    The output-head rows are left out: they do not measure the same thing in every model. GPT-Neo-2.7's last
    entry is the final norm alone (0.3 ms on a GH200, 3-30 % of a logits GEMM's roofline), OPT-350's includes
    the logits and the loss, LLAMA-3-8's is split over two entries. A learned head would be whichever model it
    was fitted on; the planner prices the head (and the embedding) with the analytic model instead."""
    groups: dict[tuple, list[SailorLayer]] = {}
    for r in layers:
        if r.shape.kind == "transformer":
            groups.setdefault(_sailor_config_key(r), []).append(r)
    out = []
    for key, rs in groups.items():
        r0 = rs[0]
        for phase in ("fwd", "bwd"):
            t = statistics.median(getattr(r, f"{phase}_s") for r in rs)
            if t <= 0:
                continue
            out.append(_sailor_sample(r0, phase, t, score_bwd_weight))
    return out


# The unfused attention's backward score kernels (softmax and dropout backward, the batched GEMMs reading the
# s x s gradients) cost more than their counted bytes at full bandwidth, by a factor the data has to say: the
# weight on the backward's score traffic is chosen like the boosting rounds, by leave-one-model-out on the
# training models (the calibration alone; every GPU weighted equally), from this grid.
SCORE_WEIGHTS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0)


def choose_score_weight(layers: list[SailorLayer]) -> tuple[float, dict]:
    """(weight, {weight: mean over GPUs of the leave-one-model-out MAPE %}); 1.0 with fewer than two models."""
    models = sorted({r.model for r in layers})
    if len(models) < 2:
        return 1.0, {}
    scores = {}
    for w in SCORE_WEIGHTS:
        errs: dict[str, list[float]] = {}
        for held in models:
            train = [r for r in layers if r.model != held]
            trained = {r.gpu for r in train}
            test = sailor_layer_samples([r for r in layers if r.model == held and r.gpu in trained
                                         and r.shape.kind == "transformer"], w)
            if not test:
                continue
            pred = predict_samples(train_model(sailor_samples(train, w), rounds=0), test)
            for s, p in zip(test, pred):
                errs.setdefault(s.device, []).append(abs(p - s.measured_s) / s.measured_s)
        if errs:
            scores[w] = round(100.0 * statistics.mean(statistics.mean(v) for v in errs.values()), 3)
    if not scores:
        return 1.0, {}
    return min(scores, key=lambda w: (scores[w], w)), scores


def read_allreduce_fits(directory: str) -> dict:
    """Sailor's measured all-reduce bandwidth per GPU and group size (intra_node_bandwidths.json) from the data
    directory, else from the packaged copy."""
    path = os.path.join(directory, "intra_node_bandwidths.json")
    if not os.path.isfile(path):
        path = os.path.join(SAILOR_DATA, "intra_node_bandwidths.json")
    return read_json_file(path, field="--sailor")


def sailor_allreduce_s(fits: dict, nbytes: float, n: int) -> float:
    """Ring all-reduce time inside one node, the way Sailor prices it from its measurements
    (sailor/profiling/profile_utils.py): 2(n-1) steps, each moving a chunk of nbytes/n at the bandwidth measured
    for that chunk size, GB/s = a x^2 + b x + c with x = log2(megabytes), capped at the measured maximum.
    `fits`: one GPU's entry, {group size: [[a, b, c], max bytes/s]}; the largest group stands in for bigger."""
    if n <= 1 or nbytes <= 0 or not fits:
        return 0.0
    key = str(n) if str(n) in fits else max(fits, key=int)
    (a, b, c), max_bps = fits[key]
    chunk = nbytes / n
    x = math.log2(max(chunk / 1e6, 1e-3))
    bw = min(max_bps, max(1e9 * (a * x * x + b * x + c), 1e9))
    return 2 * (n - 1) * chunk / bw


def tp_allreduces_s(r: SailorLayer, fits: dict) -> float:
    """The tensor-parallel all-reduces a measured layer contains, per pass (Megatron: two in the forward, two
    in the backward, each of the layer's activations), which the compute roofline does not price."""
    if r.shape.kind != "transformer" or r.shape.tp <= 1:
        return 0.0
    nbytes = r.shape.micro_batch * r.shape.seq * r.shape.hidden * r.dtype_bytes
    return 2 * sailor_allreduce_s(fits.get(r.gpu, {}), nbytes, r.shape.tp)


def _sailor_sample(r: SailorLayer, phase: str, t: float, score_bwd_weight: float = 1.0) -> Sample:
    feats, prior = F.layer_row(r.shape, phase, dtype_bytes=r.dtype_bytes, peak_tflops=r.compute_tflops,
                               hbm_gbps=r.hbm_gbps, score_bwd_weight=score_bwd_weight)
    label = f"{r.model} {r.gpu} {r.shape.kind} mb={r.shape.micro_batch} tp={r.shape.tp} #{r.index} {r.precision}"
    return Sample("layer", phase, r.device, tuple(feats), prior, t, r.model, label, r.tp_comm_s)


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


# ---- stage 1: the roofline, calibrated per device ----------------------------------------------------------
# Every (device, granularity, phase, operator or layer kind, element size) group gets
#     learned part = rate * prior + overhead
# `rate`: how many times slower than its roofline the device runs that kind of work at scale; `overhead`: the
# fixed time per call (kernel launches, the framework's Python) that dominates small shapes. Two physical numbers
# per group carry over to shapes and models the measurements never covered. Trees fitted directly on
# log(measured / prior) instead learn a per-model offset from whatever feature happens to separate the training
# models, and extrapolate it to a new model wherever it falls (benchmarks/learned_cost.py shows the difference).
OVERHEAD_STEPS = 20


def _fit_rate_overhead(prior: list[float], y: list[float]) -> tuple[float, float]:
    """Least absolute log error over overheads from 0 to 95% of the fastest measurement (the rate is the median
    ratio for each); deterministic and robust to a few noisy rows."""
    if len(y) < 3:
        return math.exp(statistics.median(math.log(v / p) for p, v in zip(prior, y))), 0.0
    best = None
    for i in range(OVERHEAD_STEPS):
        t0 = min(y) * i / OVERHEAD_STEPS
        rate = math.exp(statistics.median(math.log((v - t0) / p) for p, v in zip(prior, y)))
        err = sum(abs(math.log(rate * p + t0) - math.log(v)) for p, v in zip(prior, y))
        if best is None or err < best[0] - 1e-12:
            best = (err, rate, t0)
    return best[1], best[2]


def fit_calibration(samples: list[Sample]) -> dict[str, tuple[float, float]]:
    """Calibration key -> (rate, overhead seconds), from each group's rows."""
    groups: dict[str, tuple[list, list]] = {}
    for s in samples:
        p, y = groups.setdefault(s.calibration_key(), ([], []))
        p.append(s.prior_s)
        y.append(s.learned_part_s())
    return {k: _fit_rate_overhead(p, y) for k, (p, y) in sorted(groups.items())}


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


def calibration_key(device: str, granularity: str, phase: str, features) -> str:
    """device|granularity|phase|operator or layer kind|element size."""
    names = F.OP_FEATURES if granularity == "op" else F.LAYER_FEATURES
    return f"{device}|{granularity}|{phase}|{int(features[0])}|{int(features[names.index('dtype_bytes')])}"


# ---- stage 2: LightGBM on what the calibration leaves ------------------------------------------------------
# The number of boosting rounds is chosen per booster by cross-validation over the training rows' groups (whole
# models for per-layer data, operator shapes for profiles): where tree corrections do not carry over to unseen
# groups, the fit says so and keeps fewer or none of them.
ROUND_CHOICES = (0, 50, 150, 300, NUM_ROUNDS)
CV_FOLDS = 5


@dataclass
class FittedModel:
    calibration: dict          # calibration key -> (rate, overhead_s)
    boosters: dict             # booster name -> lightgbm.Booster (absent where 0 rounds were chosen)
    rounds: dict               # booster name -> rounds used
    composition: dict = dataclasses.field(default_factory=dict)   # "device|phase" -> (rate, overhead_s)
    score_bwd_weight: float = 1.0   # weight of the backward's score traffic in whole-layer priors

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
            keys = [calibration_key(info.name, "op", phase, x) for x in X]
            out.append(sum(self.times(f"op_{phase}", keys, priors, X)))
        return out[0], out[1]

    def composed_layer_times(self, info: "DeviceInfo", ops: list[F.Op]) -> tuple[float, float]:
        """A transformer layer from its operators: their sum, composed (stage 3) where whole layers of the device
        were measured."""
        sums = self.op_sum_times(info, ops)
        return tuple(_apply_rate(self.composition.get(f"{info.name}|{ph}"), t) for ph, t in zip(("fwd", "bwd"), sums))


def _apply_rate(rate_overhead, t: float) -> float:
    return t if rate_overhead is None else rate_overhead[0] * t + rate_overhead[1]


def _train_trees(samples: list[Sample], calibration: dict, rounds: dict, seed: int) -> dict:
    import numpy as np
    lgb = _lgb()
    boosters = {}
    for name in BOOSTERS:
        n = rounds.get(name, 0)
        gran, phase = name.split("_")
        rows = [s for s in samples if s.granularity == gran and s.phase == phase]
        if not rows or n <= 0:
            continue
        names = F.OP_FEATURES if gran == "op" else F.LAYER_FEATURES
        X = np.array([s.features for s in rows], dtype=np.float64)
        y = np.array([math.log(s.learned_part_s() / calibrated_s(calibration, s.calibration_key(), s.prior_s))
                      for s in rows], dtype=np.float64)
        ds = lgb.Dataset(X, y, feature_name=list(names), categorical_feature=["kind"], free_raw_data=True,
                         params={"verbosity": -1, "min_data_in_bin": 1})
        params = dict(LGB_PARAMS, seed=seed, min_data_in_leaf=max(1, min(3, len(rows) // 4)))
        boosters[name] = lgb.train(params, ds, num_boost_round=n)
    return boosters


def _cv_folds(samples: list[Sample], seed: int) -> list[set]:
    groups = sorted({s.group for s in samples})
    if len(groups) <= CV_FOLDS + 1:
        return [{g} for g in groups]          # few groups (whole models): leave one out
    random.Random(seed).shuffle(groups)
    return [set(groups[i::CV_FOLDS]) for i in range(CV_FOLDS)]


def choose_rounds(samples: list[Sample], seed: int = 0) -> tuple[dict, dict]:
    """Rounds per booster by cross-validation with the one-standard-error rule: the fewest rounds whose mean
    fold MAPE is within one standard error of the best (trees must clearly beat the calibration to be kept).
    Returns the choice and, per booster, {rounds: [mean MAPE %, standard error]}."""
    import numpy as np
    per_fold: dict[str, dict[int, list]] = {}
    for held in _cv_folds(samples, seed):
        train = [s for s in samples if s.group not in held]
        test = [s for s in samples if s.group in held]
        if not train or not test:
            continue
        cal = fit_calibration(train)
        test = [s for s in test if s.calibration_key() in cal]   # judge the trees where the calibration exists
        boosters = _train_trees(train, cal, {n: max(ROUND_CHOICES) for n in BOOSTERS}, seed)
        for name in BOOSTERS:
            gran, phase = name.split("_")
            rows = [s for s in test if s.granularity == gran and s.phase == phase]
            if not rows or name not in boosters:
                continue
            base = np.array([calibrated_s(cal, s.calibration_key(), s.prior_s) for s in rows])
            known = np.array([s.known_s for s in rows])
            meas = np.array([s.measured_s for s in rows])
            X = np.array([s.features for s in rows], dtype=np.float64)
            for k in ROUND_CHOICES:
                corr = np.exp(boosters[name].predict(X, num_iteration=k)) if k else 1.0
                per_fold.setdefault(name, {}).setdefault(k, []).append(
                    100.0 * float(np.mean(np.abs(base * corr + known - meas) / meas)))
    scores, chosen = {}, {}
    for name, per in per_fold.items():
        stats = {k: (float(np.mean(v)), float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else 0.0)
                 for k, v in per.items()}
        best = min(stats, key=lambda k: (stats[k][0], k))
        chosen[name] = min(k for k in stats if stats[k][0] <= stats[best][0] + stats[best][1])
        scores[name] = {k: [round(m, 3), round(se, 3)] for k, (m, se) in stats.items()}
    return chosen, scores


def train_model(samples: list[Sample], seed: int = 0, rounds: int | None = None) -> FittedModel:
    """Stage 1 on all rows, then trees with `rounds` each (None: chosen by cross-validation)."""
    cal = fit_calibration(samples)
    if rounds is None:
        chosen, _ = choose_rounds(samples, seed)
        present = {f"{s.granularity}_{s.phase}" for s in samples}
        per = {n: chosen.get(n, NUM_ROUNDS) for n in BOOSTERS if n in present}
    else:
        per = {n: rounds for n in BOOSTERS}
    return FittedModel(cal, _train_trees(samples, cal, per, seed), per)


# ---- stage 3: composing operators into a layer ----------------------------------------------------------------
# A layer is more than its operators timed one by one: its backward accumulates the residual stream's gradient
# where the stream forks and assembles the gradients of fused projections (QKV, gate+up) from their parts, work no
# isolated operator does. Whole layers measured on the device (`hetauto profile --layers`) calibrate
#     layer = rate * (sum of the layer's operators) + overhead
# per device and phase, with the same robust fit as stage 1. It is kept only where it carries over: fitted without
# one model, it must predict that model's layers better than the plain sum does (leave one model out), the same
# rule that keeps or drops the trees. On a CPU, whose caches make a layer faster or slower than its operators
# depending on the shape, it usually does not.
def layer_op_sums(model: FittedModel, info: DeviceInfo, layers: list[MeasuredLayer]) -> list[tuple[float, float]]:
    return [model.op_sum_times(info, r.shape.ops()) for r in layers]


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
            out[i] = t + samples[i].known_s
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
    rounds: dict            # booster -> boosting rounds kept (0: the calibrated roofline alone)
    composition: dict = dataclasses.field(default_factory=dict)   # "device|phase" -> (rate, overhead_s)
    score_bwd_weight: float = 1.0

    def to_dict(self) -> dict:
        return {"model_dir": self.model_dir, "rows": self.rows, "rounds": self.rounds,
                "score_bwd_weight": self.score_bwd_weight,
                "composition": {k: {"rate": r, "overhead_s": o} for k, (r, o) in self.composition.items()},
                "devices": {k: v.to_dict() for k, v in self.devices.items()}, "heldout": self.heldout}


def fit(profiles: list[str], out_dir: str, *, sailor_dir: str | None = None, holdout: float = 0.2,
        seed: int = 0, rounds: int | None = None) -> FitResult:
    """Fit on profiles (and Sailor data), measure the error on a held-out share, refit on all rows, save.
    `rounds` None: boosting rounds chosen by cross-validation (see choose_rounds)."""
    if not profiles and not sailor_dir:
        raise InputError("nothing to fit", field="PROFILES",
                         fix="pass profile files from 'hetauto profile' and/or --sailor DIR")
    if not 0.0 <= holdout < 1.0:
        raise InputError(f"must be in [0, 1), got {holdout}", field="--holdout")
    devices: dict[str, DeviceInfo] = {}
    samples: list[Sample] = []
    layer_files = [p for p in profiles if profile_granularity(p) == "layer"]
    for p in profiles:
        if p in layer_files:
            continue
        info, rows = profile_samples(p)
        if info.name in devices:
            raise InputError(f"device type {info.name} comes from two profiles", file=p, field="device_type",
                             fix="merge them into one file (profiling resumes into an existing file) or pass one")
        devices[info.name] = info
        samples += rows
    if sailor_dir:
        sailor = load_sailor(sailor_dir)
        for name, info in sailor_device_infos(sailor).items():
            if name in devices:
                raise InputError(f"device type {name} is both profiled and in the Sailor data", field="--sailor",
                                 fix="fit them into separate model directories")
            devices[name] = info
        score_weight, score_weights = choose_score_weight(sailor)
        samples += sailor_samples(sailor, score_weight)
    else:
        score_weight, score_weights = 1.0, {}
    layers = _layer_files_of(layer_files, devices)
    if len(samples) < 8:
        raise InputError(f"only {len(samples)} measurements: too few to fit", field="PROFILES",
                         fix="profile more shapes (drop --quick or widen the grid)")
    heldout = {}
    if holdout > 0:
        train, test = split_holdout(samples, holdout, seed)
        if train and test:
            pred = predict_samples(train_model(train, seed, rounds), test)
            keys: dict[str, list[int]] = {}
            for i, s in enumerate(test):
                keys.setdefault(f"{s.device} {s.granularity} {s.phase}", []).append(i)
            for k, idx in sorted(keys.items()):
                heldout[k] = {"rows": len(idx), "mape_pct": round(mape([pred[i] for i in idx],
                                                                        [test[i].measured_s for i in idx]), 2)}
            heldout["all"] = {"rows": len(test), "mape_pct": round(mape(pred, [s.measured_s for s in test]), 2)}
    model = train_model(samples, seed, rounds)
    model.score_bwd_weight = score_weight
    model.composition, report = fit_composition(model, devices, layers)
    heldout.update(report)
    save_model(out_dir, model, devices, {"heldout": heldout, "rows": len(samples), "seed": seed,
                                         "holdout_fraction": holdout, "rounds": model.rounds,
                                         "layers": {d: len(v) for d, v in layers.items()},
                                         "score_bwd_weights": {str(k): v for k, v in score_weights.items()}})
    return FitResult(out_dir, devices, heldout, len(samples), dict(model.rounds), dict(model.composition),
                     model.score_bwd_weight)


def _layer_files_of(layer_files: list[str], devices: dict) -> dict:
    """Device -> measured layers, each file checked against the operator profile it composes."""
    layers: dict[str, list[MeasuredLayer]] = {}
    for p in layer_files:
        header, rows = read_layers(p)
        dev = str(header.get("device_type"))
        if devices.get(dev) is None or devices[dev].granularity != "op":
            raise InputError(f"whole layers of device type {dev}, but no operator profile of it is being fitted",
                             file=p, field="device_type",
                             fix=f"pass the operator profile of {dev} ('hetauto profile --device-type {dev}') too")
        if dev in layers:
            raise InputError(f"device type {dev} has two layer files", file=p, field="device_type",
                             fix="merge them into one file (profiling resumes into an existing file) or pass one")
        if int(header.get("dtype_bytes", 0)) != devices[dev].dtype_bytes:
            raise InputError(f"layers were timed with {header.get('dtype')}, the operators with "
                             f"{devices[dev].dtype_bytes}-byte elements", file=p, field="dtype",
                             fix="profile layers and operators with the same --dtype")
        layers[dev] = rows
    return layers


def save_model(out_dir: str, model: FittedModel, devices: dict, metrics: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
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
                "score_bwd_weight": model.score_bwd_weight,
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
        tables = {}
        for table in ("calibration", "composition"):
            try:
                tables[table] = {k: (float(v["rate"]), float(v["overhead_s"]))
                                 for k, v in man.get(table, {}).items()}
            except (TypeError, KeyError, ValueError, AttributeError):
                raise InputError(f"has a garbled '{table}' table", file=path, field=table,
                                 fix="re-fit it with 'hetauto fit'")
        lgb = _lgb()
        boosters = {}
        for name, fname in man.get("boosters", {}).items():
            fpath = os.path.join(model_dir, fname)
            if not os.path.isfile(fpath):
                raise InputError(f"booster file {fname} is missing", file=model_dir, field="boosters",
                                 fix="re-fit the model or copy the whole directory")
            boosters[name] = lgb.Booster(model_file=fpath)
        weight = man.get("score_bwd_weight", 1.0)   # models fitted before it existed: the counted traffic
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise InputError(f"has a garbled score_bwd_weight ({weight!r})", file=path, field="score_bwd_weight",
                             fix="re-fit it with 'hetauto fit'")
        self.fitted = FittedModel(tables["calibration"], boosters, man.get("fit", {}).get("rounds", {}),
                                  tables["composition"], float(weight))
        # Covered: measured in both phases at its granularity (its calibration has groups for both).
        groups = {tuple(k.split("|")[:3]) for k in self.fitted.calibration}
        self._covered = {d for d, i in self.devices.items()
                         if all((i.name, i.granularity, ph) in groups for ph in ("fwd", "bwd"))}
        self._cache: dict[tuple, tuple[float, float]] = {}

    def _info(self, device: DeviceType) -> DeviceInfo | None:
        name = canonical_device_name(device.name) or device.name
        name = name if name in self.devices else device.name
        return self.devices[name] if name in self._covered else None

    def source(self, device: DeviceType) -> str:
        return "learned" if self._info(device) is not None else "analytic"

    def covered_devices(self) -> list[str]:
        """Device types this model predicts for (by name; some need not be in the catalog)."""
        return sorted(self._covered)

    # ---- internals --------------------------------------------------------------------------------------
    def _predict(self, info: DeviceInfo, phase: str, rows: list[tuple[list, float]]) -> float:
        """Sum over rows of (features, prior) of the fitted model's times."""
        keys = [calibration_key(info.name, info.granularity, phase, x) for x, _ in rows]
        return sum(self.fitted.times(f"{info.granularity}_{phase}", keys, [p for _, p in rows],
                                     [x for x, _ in rows]))

    def _layer_time(self, info: DeviceInfo, shape: F.LayerShape) -> tuple[float, float]:
        """Compute only: a measured layer's TP all-reduces were set apart when fitting (Sample.known_s), and
        the planner prices them with its communication model."""
        a = dict(dtype_bytes=info.dtype_bytes, peak_tflops=info.peak_tflops, hbm_gbps=info.hbm_gbps,
                 score_bwd_weight=self.fitted.score_bwd_weight)
        return tuple(self._predict(info, phase, [F.layer_row(shape, phase, **a)]) for phase in ("fwd", "bwd"))

    def _piece(self, piece: str, model: ModelSpec, device: DeviceType, tp: int, mb: int, seq: int | None):
        info = self._info(device)
        if info is None:
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
        elif piece in ("embedding", "head"):
            # per-layer data measures transformer layers only (see sailor_samples): analytic
            res = getattr(self.fallback, f"{piece}_times")(model, device, tp, mb, seq)
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


def load_cost_model(path: str | None):
    """The cost model the planner uses: analytic when no directory is given, learned (with analytic fallback)
    otherwise."""
    if path is None:
        from .analytic import AnalyticCostModel
        return AnalyticCostModel()
    return LearnedCostModel(path)


# ---- validation --------------------------------------------------------------------------------------------
def sailor_layer_samples(layers: list[SailorLayer], score_bwd_weight: float = 1.0) -> list[Sample]:
    """Every measured layer as its own row (validation compares per layer, not per configuration median)."""
    return [_sailor_sample(r, ph, getattr(r, f"{ph}_s"), score_bwd_weight) for r in layers
            for ph in ("fwd", "bwd") if getattr(r, f"{ph}_s") > 0]


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


# ---- whole layers measured by `hetauto profile --layers` ------------------------------------------------------
@dataclass(frozen=True)
class MeasuredLayer:
    """One row of a layer file: a transformer layer as one TP rank ran it, forward and backward."""
    model: str
    shape: F.LayerShape
    fwd_s: float
    bwd_s: float


def read_layers(path: str) -> tuple[dict, list[MeasuredLayer]]:
    """(header, rows) of a file written by `hetauto profile --layers`."""
    header, rows = read_profile(path)
    if header.get("granularity") != "layer":
        raise InputError("holds operator timings, not whole layers", file=path, field="granularity",
                         fix="pass a file written by 'hetauto profile --layers'")
    out = []
    for r in rows:
        try:
            out.append(MeasuredLayer(str(r.get("model", "?")), F.LayerShape.from_dict(r["layer"]),
                                     float(r.get("fwd_p10_s", r["fwd_s"])), float(r.get("bwd_p10_s", r["bwd_s"]))))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"row {r.get('key', '?')} is malformed ({exc})", file=path,
                             fix="delete the row (profiling resumes and re-measures it)")
    return header, out


def profile_granularity(path: str) -> str:
    """'op' or 'layer': what a file written by `hetauto profile` holds (its header says)."""
    header, _ = read_profile(path, header_only=True)
    return str(header.get("granularity", "op"))


def validate_layers(model, paths: list[str]) -> dict:
    """Measured whole layers vs the layer time the planner gets from `model` (for a profiled device: the sum of
    the layer's operators) and from the analytic model. The measured layers run every element-wise operator on
    the whole sequence, so the analytic model is asked without sequence parallelism."""
    from .analytic import AnalyticCostModel
    from ..spec.devices import get_device
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
                              "error_pct": 100.0 * (pred[i] - meas) / meas,
                              "analytic_error_pct": 100.0 * (ana[i] - meas) / meas})
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
    pred = predict_samples(model.fitted, rows)
    table = [{"device": s.device, "phase": s.phase, "label": s.label, "measured_s": s.measured_s,
              "predicted_s": p, "prior_s": s.baseline_s, "error_pct": 100.0 * (p - s.measured_s) / s.measured_s}
             for s, p in zip(rows, pred)]
    return {"rows": table, "summary": summarise(table, {"prior_mape_pct": "prior_s"}),
            "skipped": len(samples) - len(rows)}
