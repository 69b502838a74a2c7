"""Fitting the learned model: stage 1 calibrates the roofline prior per group of rows (rate x prior +
overhead; roofline_calibration.py), stage 2 fits LightGBM on what is left with cross-validated rounds, stage 3 composes operators
into layers; `fit` runs all three, measures a held-out share and saves the model."""
from __future__ import annotations

import dataclasses
import math
import random
import statistics
from dataclasses import dataclass

from ...errors import InputError
from .. import features as F
from .fitted import FittedModel, _apply_rate, _lgb, calibrated_s, predict_samples
from .manifest import save_model
from .profile_merge import two_operator_profiles
from .roofline_calibration import _fit_rate_overhead, fit_calibration
from .sailor import (SailorLayer, leave_model_out, load_sailor, read_allreduce_fits, sailor_device_infos,
                     sailor_reading_samples, sailor_samples)
from .sailor_host_floor import sailor_host_floors
from .sailor_links import sailor_set_apart_rates
from .sailor_updates import load_sailor_updates
from .profile_checks import check_every_operator_kind
from .samples import (BOOSTERS, DeviceInfo, MeasuredLayer, Sample, check_same_threads, mape, profile_granularity,
                      profile_samples, read_layers)


# Small data (hundreds of rows): shallow trees, many of them, slow learning rate; one thread = deterministic.
LGB_PARAMS = {"objective": "regression_l2", "learning_rate": 0.05, "num_leaves": 15, "min_data_in_leaf": 3,
              "min_data_in_bin": 1, "max_bin": 255, "feature_fraction": 0.9, "bagging_fraction": 1.0,
              "lambda_l2": 1.0, "verbosity": -1, "num_threads": 1, "deterministic": True, "seed": 0}
NUM_ROUNDS = 600


# Stage 1, the roofline calibrated per group of rows (rate x prior + overhead), is in roofline_calibration.py.


# ---- stage 2: LightGBM on what the calibration leaves ------------------------------------------------------
# The number of boosting rounds is chosen per booster by cross-validation over the training rows' groups (whole
# models for per-layer data, operator shapes for profiles): where tree corrections do not carry over to unseen
# groups, the fit says so and keeps fewer or none of them.
ROUND_CHOICES = (0, 50, 150, 300, NUM_ROUNDS)
CV_FOLDS = 5


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
        # no fold could judge a booster (one group of shapes, or none held out): no trees, the calibration
        # alone, as where the trees do not clearly beat it; unjudged, NUM_ROUNDS were kept and said cross-validated
        per = {n: chosen.get(n, 0) for n in BOOSTERS if n in present}
    else:
        per = {n: rounds for n in BOOSTERS}
    return FittedModel(cal, _train_trees(samples, cal, per, seed), per)


def train_sailor_model(layers: list[SailorLayer], score_bwd_weight: float = 1.0, seed: int = 0,
                       rounds: int | None = None, gemm_bwd_weight: float = 1.0) -> FittedModel:
    """`train_model` on the Sailor layers (host-bound configurations left out of the calibration), with the host
    floor those configurations measured."""
    model = train_model(sailor_samples(layers, score_bwd_weight, gemm_bwd_weight), seed, rounds)
    model.host_floor = sailor_host_floors(layers)
    model.tp_allreduce = sailor_set_apart_rates(layers)
    model.score_bwd_weight, model.gemm_bwd_weight = score_bwd_weight, gemm_bwd_weight
    return model


# Two weights on a layer's backward prior that the data has to say, chosen like the boosting rounds: by
# leave-one-model-out on the training models (the calibration alone; every GPU weighted equally), from grids.
# - The unfused attention's backward score kernels (softmax backward, the batched GEMMs reading the s x s gradients)
#   cost more than their counted bytes at full bandwidth: the weight on the backward's score traffic.
# - TF32 backward GEMMs on a GPU whose TF32 instruction takes K-major operands only (features.TF32_K_MAJOR_ONLY:
#   Hopper) run at a lower share of the TF32 peak than the forward's: the weight on their roofline. It changes only
#   those GPUs' rows, so for each score weight it is chosen on their rows alone; 1 where no such GPU was measured
#   with two models.
SCORE_WEIGHTS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0)
GEMM_BWD_WEIGHTS = (1.0, 1.25, 1.5, 1.75, 2.0)


def _lomo_folds(layers: list[SailorLayer], fits: dict | None = None) -> list[tuple[list, list]]:
    """Per held-out model, (training layers, its transformer layers): with `fits` (the data's all-reduce curves)
    each fold's TP all-reduce rates from its training models only (sailor.py leave_model_out), as every
    leave-one-model-out figure takes them. They depend on neither weight, so choose_weights splits once."""
    out = []
    for held in sorted({r.model for r in layers}):
        if fits is None:
            train, held_layers = [r for r in layers if r.model != held], [r for r in layers if r.model == held]
        else:
            train, held_layers = leave_model_out(layers, held, fits=fits)
        out.append((train, [r for r in held_layers if r.shape.kind == "transformer"]))
    return out


def _lomo_errors(folds: list[tuple[list, list]], w: float, g: float) -> dict[str, list[float]]:
    """Device -> relative errors of every distinct reading of each model's transformer layers, predicted by the
    calibration fitted on the other models, judged where that calibration exists (as choose_rounds judges the
    trees): a row of a device and arithmetic no other model was measured in would measure the median borrowed from
    other devices, not the weights. A reading counts once (sailor_reading_samples): profiles_tmp.json repeats one
    reading for most layers of a model, and its copies would weigh a configuration by its model's depth. `folds`:
    _lomo_folds."""
    errs: dict[str, list[float]] = {}
    for train, held_layers in folds:
        model = train_sailor_model(train, w, rounds=0, gemm_bwd_weight=g)
        test = [s for s in sailor_reading_samples(held_layers, w, g) if s.calibration_key() in model.calibration]
        if not test:
            continue
        pred = predict_samples(model, test)
        for s, p in zip(test, pred):
            errs.setdefault(s.device, []).append(abs(p - s.measured_s) / s.measured_s)
    return errs


def choose_weights(layers: list[SailorLayer], fits: dict | None = None) -> tuple[float, float, dict]:
    """(score weight, backward-GEMM weight, {"score": {w: mean over GPUs of the leave-one-model-out MAPE % with the
    best backward-GEMM weight for w}, "gemm": {g: the same at the chosen w}}); 1.0, 1.0 with fewer than two
    models."""
    if len({r.model for r in layers}) < 2:
        return 1.0, 1.0, {"score": {}, "gemm": {}}
    weighted = [r for r in layers if F.backward_gemm_weighted(r.device, r.precision)]
    devices = {r.device for r in weighted}
    gemm_grid = GEMM_BWD_WEIGHTS if len({r.model for r in weighted}) >= 2 else (1.0,)
    table: dict[float, dict[float, float]] = {}
    folds = _lomo_folds(layers, fits)
    weighted_folds = _lomo_folds(weighted, fits) if len(gemm_grid) > 1 else None
    for w in SCORE_WEIGHTS:
        errs = _lomo_errors(folds, w, 1.0)
        rest = [statistics.mean(v) for d, v in errs.items() if d not in devices]
        for g in gemm_grid:
            # the backward-GEMM weight changes only its GPUs' rows: their errors from a fit on their rows alone
            own = _lomo_errors(weighted_folds, w, g) if len(gemm_grid) > 1 else errs
            mine = [statistics.mean(v) for d, v in own.items() if d in devices]
            if rest or mine:
                table.setdefault(w, {})[g] = round(100.0 * statistics.mean(rest + mine), 3)
    if not table:
        return 1.0, 1.0, {"score": {}, "gemm": {}}
    w, g = min(((w, g) for w in table for g in table[w]), key=lambda k: (table[k[0]][k[1]], k))
    return w, g, {"score": {k: min(v.values()) for k, v in table.items()}, "gemm": dict(table[w])}


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


def split_holdout(samples: list[Sample], fraction: float, seed: int) -> tuple[list[Sample], list[Sample]]:
    """Random split by group (an operator shape, both phases, stays on one side)."""
    groups = sorted({(s.device, s.group) for s in samples})
    rng = random.Random(seed)
    rng.shuffle(groups)
    held = set(groups[:int(round(fraction * len(groups)))])
    return [s for s in samples if (s.device, s.group) not in held], [s for s in samples if (s.device, s.group) in held]


# ---- the optimizer step ---------------------------------------------------------------------------------------
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


@dataclass(frozen=True)
class FitResult:
    model_dir: str
    devices: dict           # name -> DeviceInfo
    heldout: dict           # "device granularity phase" -> {"rows": n, "mape_pct": x}
    rows: int
    rounds: dict            # booster -> boosting rounds kept (0: the calibrated roofline alone)
    composition: dict = dataclasses.field(default_factory=dict)   # "device|phase" -> (rate, overhead_s)
    score_bwd_weight: float = 1.0
    host_floor: dict = dataclasses.field(default_factory=dict)    # "device|phase" -> seconds
    gemm_bwd_weight: float = 1.0

    def to_dict(self) -> dict:
        return {"model_dir": self.model_dir, "rows": self.rows, "rounds": self.rounds,
                "score_bwd_weight": self.score_bwd_weight, "gemm_bwd_weight": self.gemm_bwd_weight,
                "host_floor": self.host_floor,
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
        raise InputError(f"must be in [0, 1), got {holdout:g}", field="--holdout",
                         fix="give a share below 1, e.g. --holdout 0.2 (0: no held-out report)")
    devices: dict[str, DeviceInfo] = {}
    samples: list[Sample] = []
    layer_files = [p for p in profiles if profile_granularity(p) == "layer"]
    op_files: dict[str, str] = {}       # device type -> its operator profile
    for p in profiles:
        if p in layer_files:
            continue
        info, rows = profile_samples(p)
        check_every_operator_kind(p, info, rows)
        if info.name in devices:
            raise two_operator_profiles(info.name, op_files[info.name], p)
        devices[info.name] = info
        op_files[info.name] = p
        samples += rows
    if sailor_dir:
        sailor = load_sailor(sailor_dir)
        for name, info in sailor_device_infos(sailor).items():
            if name in devices:
                raise InputError(f"device type {name} is both profiled and in the Sailor data", field="--sailor",
                                 fix="fit them into separate model directories")
            devices[name] = info
        # (each fold's TP all-reduce rates from its training models: load_sailor read them from all)
        score_weight, gemm_weight, weight_scores = choose_weights(sailor, read_allreduce_fits(sailor_dir))
        samples += sailor_samples(sailor, score_weight, gemm_weight)
        optimizer, optimizer_report = fit_optimizer(load_sailor_updates(sailor_dir, sailor))
    else:
        score_weight, gemm_weight, weight_scores = 1.0, 1.0, {"score": {}, "gemm": {}}
        optimizer, optimizer_report = {}, {}
    layers = _layer_files_of(layer_files, devices, op_files)
    if len(samples) < 8:
        raise InputError(f"only {len(samples)} measurements: too few to fit", field="PROFILES",
                         fix="profile more shapes (drop --quick or widen the grid)")
    heldout = {}
    if holdout > 0:
        train, test = split_holdout(samples, holdout, seed)
        # refused before any fitting: a share that holds out every shape (or none) would leave the held-out
        # report out without a word
        shapes = len({(s.device, s.group) for s in samples})
        held = len({(s.device, s.group) for s in test})
        if not test:
            # (with one shape no share can hold one out and keep one to fit: a larger share is no fix there)
            fix = ("give a larger share (e.g. --holdout 0.2), or --holdout 0 to fit without a held-out report"
                   if shapes > 1 else "profile more shapes (a larger --grid) to hold one out, or --holdout 0 to fit "
                                      "without a held-out report")
            raise InputError(f"{holdout:g} holds out none of the {shapes} shapes", field="--holdout", fix=fix)
        if len(train) < 8:
            raise InputError(f"{holdout:g} holds out {held} of the {shapes} shapes, which leaves {len(train)} "
                             "measurements to train on (at least 8 needed)", field="--holdout",
                             fix="give a smaller share (e.g. --holdout 0.2), or --holdout 0 to fit without a "
                                 "held-out report")
        pred = predict_samples(train_model(train, seed, rounds), test)
        keys: dict[str, list[int]] = {}
        for i, s in enumerate(test):
            keys.setdefault(f"{s.device} {s.granularity} {s.phase}", []).append(i)
        for k, idx in sorted(keys.items()):
            heldout[k] = {"rows": len(idx), "mape_pct": round(mape([pred[i] for i in idx],
                                                                    [test[i].measured_s for i in idx]), 2)}
        heldout["all"] = {"rows": len(test), "mape_pct": round(mape(pred, [s.measured_s for s in test]), 2)}
    model = train_model(samples, seed, rounds)
    model.score_bwd_weight, model.gemm_bwd_weight = score_weight, gemm_weight
    model.host_floor = sailor_host_floors(sailor) if sailor_dir else {}
    model.tp_allreduce = sailor_set_apart_rates(sailor) if sailor_dir else {}
    model.composition, report = fit_composition(model, devices, layers)
    model.optimizer = optimizer
    heldout.update(report)
    heldout.update(optimizer_report)
    save_model(out_dir, model, devices, {"heldout": heldout, "rows": len(samples), "seed": seed,
                                         "holdout_fraction": holdout, "rounds": model.rounds,
                                         "layers": {d: len(v) for d, v in layers.items()},
                                         "score_bwd_weights": {str(k): v for k, v in weight_scores["score"].items()},
                                         "gemm_bwd_weights": {str(k): v for k, v in weight_scores["gemm"].items()}})
    return FitResult(out_dir, devices, heldout, len(samples), dict(model.rounds), dict(model.composition),
                     model.score_bwd_weight, dict(model.host_floor), model.gemm_bwd_weight)


def _layer_files_of(layer_files: list[str], devices: dict, op_files: dict) -> dict:
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
