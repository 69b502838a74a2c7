"""Fitting the learned model: stage 1 calibrates the roofline prior per group of rows (rate x prior +
overhead; roofline_calibration.py), stage 2 fits LightGBM on what is left with cross-validated rounds
(boosting.py; the Sailor layers' backward weights: backward_weights.py), stage 3 composes operators into layers
(composition.py), and Sailor's optimizer step is fitted apart (optimizer_step.py); `fit` runs them all, measures a
held-out share and saves the model."""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from ...errors import InputError
from .backward_weights import choose_weights
from .boosting import train_model
from .composition import fit_composition, layer_files_of
from .fitted import predict_samples
from .manifest import save_model
from .optimizer_step import fit_optimizer
from .profile_merge import two_operator_profiles
from .sailor import load_sailor, read_allreduce_fits, sailor_device_infos, sailor_samples
from .sailor_host_floor import sailor_host_floors
from .sailor_links import sailor_set_apart_rates
from .sailor_updates import load_sailor_updates
from .profile_checks import check_every_operator_kind
from .samples import DeviceInfo, Sample, mape, profile_granularity, profile_samples


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
    read = []
    for p in profiles:
        if p in layer_files:
            continue
        info, rows = profile_samples(p)
        if info.name in op_files:
            raise two_operator_profiles(info.name, op_files[info.name], p)
        op_files[info.name] = p
        read.append((p, info, rows))
    # each file's completeness once no device has two: a second grid's file may hold only some operator kinds,
    # whichever order the files were given in
    for p, info, rows in read:
        check_every_operator_kind(p, info, rows)
        devices[info.name] = info
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
    layers = layer_files_of(layer_files, devices, op_files)
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
