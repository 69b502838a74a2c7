"""The two weights on a Sailor layer's backward prior that the data has to say (the backward's score traffic,
the backward TF32 GEMMs of K-major-only GPUs), chosen by leave-one-model-out like the boosting rounds."""
from __future__ import annotations

import statistics

from .. import features as F
from .boosting import train_sailor_model
from .fitted import predict_samples
from .sailor import SailorLayer, leave_model_out, sailor_reading_samples


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
