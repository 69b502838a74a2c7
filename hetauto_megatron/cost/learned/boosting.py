"""Stage 2 of the fit: LightGBM on what the stage-1 calibration (roofline_calibration.py) leaves, with the
boosting rounds per booster chosen by cross-validation; `train_model` runs stages 1 and 2 on a set of rows."""
from __future__ import annotations

import math
import random

from .. import features as F
from .fitted import FittedModel, _lgb, calibrated_s
from .roofline_calibration import fit_calibration
from .sailor import SailorLayer, sailor_samples
from .sailor_host_floor import sailor_host_floors
from .sailor_links import sailor_set_apart_rates
from .samples import BOOSTERS, Sample


# Small data (hundreds of rows): shallow trees, many of them, slow learning rate; one thread = deterministic.
LGB_PARAMS = {"objective": "regression_l2", "learning_rate": 0.05, "num_leaves": 15, "min_data_in_leaf": 3,
              "min_data_in_bin": 1, "max_bin": 255, "feature_fraction": 0.9, "bagging_fraction": 1.0,
              "lambda_l2": 1.0, "verbosity": -1, "num_threads": 1, "deterministic": True, "seed": 0}
NUM_ROUNDS = 600


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
                # (one thread, as FittedModel.times predicts: a forked process after this one would hang)
                corr = np.exp(boosters[name].predict(X, num_iteration=k, num_threads=1)) if k else 1.0
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
