"""Published homogeneous Megatron-LM throughputs against the analytic model: in sample and out of sample.

The table (hetauto_megatron/data/published-megatron-throughput.yaml) gives, per run, the model, TP/PP/DP, global
batch and achieved TFLOP/s per GPU, from which the published iteration time follows. Each source states the
system and the software of its era (device, node links, flash attention, sequence parallelism, micro-batch
size, how its TFLOP/s were counted); a source without those keys gets the defaults of the two sources the
package ships (`_SOURCE_DEFAULTS`), so another table in the same format can be checked as it is.

`FITTED` names the only constants fitted on these runs (cost/analytic.py `Calibration`); every other constant
is a physical figure. `leave_one_out` predicts each run with the constants fitted on the others: that is the
out-of-sample error the docs and `hetauto validate-cost-model --published` report.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from ..cost.analytic import DEFAULT_CALIBRATION, AnalyticCostModel, Calibration
from ..errors import InputError
from ..spec.devices import canonical_device_name, get_device
from ..spec._fields import file_kind
from ..spec.inventory import inventory_from_dict
from ..spec.files import load_yaml_file
from ..spec.model import ModelSpec
from .layout_pricing import evaluate_layout
from .engines import ENGINES
from .published_checks import ROW_KEYS, check_layout, check_row, check_source, in_table_terms
from .simulate import MeshChoice

TABLE = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "data", "published-megatron-throughput.yaml"))

# Per source: catalog device, node links of those systems (Selene: NVLink3 + 8x200G HDR; Eos: NVLink4 + 8x400G
# NDR), the software generation, and whether the published TFLOP/s count the recomputation's FLOPs.
_SOURCE_DEFAULTS = {
    "source_a_a100": dict(device="a100-80gb", intra_node_gbps=2400, inter_node_gbps=200, flash_attention=False,
                          sequence_parallel=False, micro_batch_size=1, flops_count="hardware",
                          tie_embeddings=True, engine="megatron-core-0.8"),
    "source_b_h100": dict(device="h100-sxm", intra_node_gbps=3600, inter_node_gbps=400, flash_attention=True,
                          sequence_parallel=True, micro_batch_size=1, flops_count="model", tie_embeddings=False,
                          tp_comm_overlap=True, engine="megatron-core-0.8"),
}
# Keys a source may leave out (their value when it does): whether the runs hid the TP collectives under the GEMMs
# (Megatron-Core's --tp-comm-overlap, which the 2024 runs name and hetauto's runtime does not run).
# `engine`: the row of the settings table (plan/engines.py ENGINES) whose Megatron-Core ran them: the published
# tables predate Megatron-Core 0.19 ("megatron-core-0.8": the parameter gather started at the step's start).
_SOURCE_OPTIONAL = {"tp_comm_overlap": False, "engine": "megatron"}
_SWITCHES = ("flash_attention", "sequence_parallel", "tie_embeddings", "tp_comm_overlap")     # true or false

# The runtime settings (plan/settings.py) each era's Megatron-LM ran with, as plan overrides; a source may state
# its own (`runtime_settings:`). 2021 had neither sequence parallelism nor the distributed optimizer and
# all-reduced the gradients after the backward pass, in fp16: its runs trained in fp16 (the README's scripts of the
# time pass --fp16), and Megatron-LM then reduced in fp32 only with --accumulate-allreduce-grads-in-fp32, which it
# forced for bf16 alone (arguments.py, June 2021; its DDP's buffer took the parameters' dtype otherwise,
# model/distributed.py `_get_buffer_type`). The 2024 runs use the table's defaults (bf16: reduced in fp32).
_SOURCE_SETTINGS = {
    "source_a_a100": {"sequence_parallel": False, "distributed_optimizer": False, "overlap_grad_reduce": False,
                      "overlap_param_gather": False, "grad_reduce_dtype": "param"},
}

# The constants fitted on published runs; the rest of `Calibration` is physical (docs/cost-model.md). The
# framework's time per layer (`layer_overhead_s`) was fitted too, to 0 in every fold while the TP collectives of
# the 2024 runs were priced exposed; pricing them as those runs ran, the one fold that then fitted it (the 18.4B
# run left out: 0.22 ms, for the 7.1B run's short kernels) predicted the 18.4B run 21 % slow; it stays at 0.
FITTED = ("gemm_max_efficiency",)
_BOUNDS = {"gemm_max_efficiency": (0.3, 1.0)}
_SCALE = {"gemm_max_efficiency": 1.0}     # the search moves in these units


@dataclass(frozen=True)
class PublishedRun:
    source: str
    params_b: float
    model: ModelSpec
    device: str
    tp: int
    pp: int
    dp: int
    global_batch: int
    micro_batch_size: int
    recompute: str
    flash_attention: bool
    sequence_parallel: bool
    intra_node_gbps: float
    inter_node_gbps: float
    published_s: float
    settings: tuple = ()     # the run's runtime-settings overrides, sorted (key, value) pairs
    tp_comm_overlap: bool = False   # TP collectives run under the GEMMs (--tp-comm-overlap)
    engine: str = "megatron"        # the Megatron-Core that ran it (plan/engines.py ENGINES)


@dataclass
class CalibrationRow:
    source: str
    params_b: float
    tp: int
    pp: int
    dp: int
    published_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.published_s - 1


def published_iteration_time(flops_count: str, vocab: int, seq: int, row: dict) -> float:
    """Seconds per iteration from the published TFLOP/s per GPU (Narayanan et al. 2021, appendix)."""
    h, L, V, s, B = row["hidden"], row["layers"], vocab, seq, row["batch"]
    if flops_count == "hardware":   # counts the recomputation's FLOPs
        flops = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    else:                           # model FLOPs
        flops = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    return flops / (row["tflops_per_gpu"] * 1e12 * row["gpus"])


_SOURCE_KEYS = {"rows", "vocab", "seq_len", "recompute", "runtime_settings"}


def published_runs(path: str = TABLE) -> list[PublishedRun]:
    data = load_yaml_file(path, "published-runs table")   # syntax, encoding, a directory: one paragraph each
    out = []
    for source, table in data.items():
        if not isinstance(table, dict) or not isinstance(table.get("rows"), list):
            kind = file_kind(data)
            if kind:    # a whole file of another kind (a plan, an inventory, a model): say so, not "source version"
                raise InputError(f"has '{kind[0]}:': it looks like {kind[1]}, not a published-runs table (what "
                                 "validate-cost-model --published reads)", file=path,
                                 fix="pass each file to its own option; --published alone compares the packaged "
                                     "table (docs/cost-model.md describes its format)")
            raise InputError(f"is not a published-runs table (validate-cost-model --published, calibration.py): "
                             f"source {source} is not a mapping with a list of rows", file=path, field=str(source),
                             fix="write each source as vocab, seq_len, recompute and rows: (see the packaged table)")
        cfg = dict(_SOURCE_OPTIONAL, **_SOURCE_DEFAULTS.get(source, {}))
        cfg.update({k: v for k, v in table.items() if k in cfg or k in _SOURCE_DEFAULTS["source_a_a100"]})
        missing = [k for k in _SOURCE_DEFAULTS["source_a_a100"] if k not in cfg]
        if missing:
            raise InputError(f"source {source} does not say {', '.join(missing)}", file=path, field=source,
                             fix="add these keys to the source (see the packaged table)")
        # (inventory_from_dict names no file)
        device = get_device(str(cfg["device"]), file=path, field=f"{source}.device")
        for key in _SWITCHES:
            if not isinstance(cfg[key], bool):
                raise InputError(f"{key} of source {source} is {cfg[key]!r}, not true or false", file=path,
                                 field=f"{source}.{key}", fix="write true or false (unquoted)")
        if cfg["engine"] not in ENGINES or ENGINES[cfg["engine"]].blocking_boundaries:
            raise InputError(f"engine {cfg['engine']!r} of source {source} is not a Megatron-Core", file=path,
                             field=f"{source}.engine", fix="write megatron (Megatron-Core 0.19) or "
                             "megatron-core-0.8 (the parameter gather started at the step's start)")
        if cfg["tp_comm_overlap"] and not cfg["sequence_parallel"]:
            raise InputError(f"source {source} overlaps its TP collectives with the GEMMs without sequence "
                             "parallelism, which Megatron-LM's --tp-comm-overlap requires", file=path,
                             field=f"{source}.tp_comm_overlap", fix="set sequence_parallel: true, or "
                             "tp_comm_overlap: false")
        unknown = sorted(set(table) - set(cfg) - _SOURCE_KEYS, key=str)
        if unknown:
            raise InputError(f"source {source} has unknown key {unknown[0]!r}", file=path, field=f"{source}.{unknown[0]}",
                             fix=f"use only {', '.join(sorted(set(cfg) | _SOURCE_KEYS))}")
        check_source(cfg, table, source, path)
        for i, row in enumerate(table["rows"]):
            check_row(row, i, source, path)
            check_layout(row, i, source, path, cfg["micro_batch_size"], device.peak_tflops, device.name)
            try:
                h = row["hidden"]
                model = ModelSpec(name=f"gpt-{row['params_b']}b", num_layers=row["layers"], hidden_size=h,
                                  num_attention_heads=row["heads"], ffn_hidden_size=4 * h, vocab_size=table["vocab"],
                                  seq_length=table["seq_len"], gated_mlp=False, position_embedding="learned",
                                  tie_embeddings=cfg["tie_embeddings"])
                tp, pp, gpus = row["tp"], row["pp"], row["gpus"]
                out.append(PublishedRun(
                    source, float(row["params_b"]), model, canonical_device_name(str(cfg["device"])), tp, pp, gpus // (tp * pp), row["batch"],
                    int(cfg["micro_batch_size"]), table["recompute"], cfg["flash_attention"],
                    cfg["sequence_parallel"], float(cfg["intra_node_gbps"]), float(cfg["inter_node_gbps"]),
                    published_iteration_time(cfg["flops_count"], table["vocab"], table["seq_len"], row),
                    tuple(sorted(dict(table.get("runtime_settings") or _SOURCE_SETTINGS.get(source, {})).items())),
                    cfg["tp_comm_overlap"], cfg["engine"]))
            except InputError as exc:
                raise in_table_terms(exc, i, source, path) from None
            except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
                raise InputError(f"row {i} of {source} is incomplete ({exc})", file=path, field=f"{source}.rows",
                                 fix=f"give {', '.join(ROW_KEYS)}")
    return out


def era_cost_model(run: PublishedRun, calibration: Calibration = DEFAULT_CALIBRATION) -> AnalyticCostModel:
    """The analytic model with the software the run used (flash attention, sequence parallelism, TP collectives
    overlapped with the GEMMs)."""
    return AnalyticCostModel(calibration, flash_attention=run.flash_attention,
                             sequence_parallel=run.sequence_parallel, tp_comm_overlap=run.tp_comm_overlap)


def predict(run: PublishedRun, calibration: Calibration = DEFAULT_CALIBRATION, cost_model=None) -> float:
    """Iteration time of a published run: the analytic model with `calibration` and the run's software, or
    `cost_model` when given."""
    cost = cost_model if cost_model is not None else era_cost_model(run, calibration)
    gpus = run.tp * run.pp * run.dp
    inv = inventory_from_dict({"clusters": [{
        "name": "c", "device": run.device, "nodes": max(1, gpus // 8), "devices_per_node": min(8, gpus),
        "intra_node": {"bandwidth_gbps": run.intra_node_gbps, "latency_us": 5},
        "inter_node": {"bandwidth_gbps": run.inter_node_gbps, "latency_us": 10}}]})
    res = evaluate_layout(run.model, inv, [MeshChoice("c", run.tp, run.dp, run.micro_batch_size, run.recompute,
                                                      run.pp, run.settings)], run.global_batch, cost,
                          engine=run.engine)
    return res.iteration_time_s


def _row(run: PublishedRun, predicted: float) -> CalibrationRow:
    return CalibrationRow(run.source, run.params_b, run.tp, run.pp, run.dp, run.published_s, predicted)


def fit_constants(runs: list[PublishedRun], base: Calibration = DEFAULT_CALIBRATION) -> Calibration:
    """The FITTED constants minimising the mean squared log(predicted / published) over `runs` (Nelder-Mead
    from `base`, restarted once from its own answer; deterministic); the other constants stay as in `base`."""
    from scipy.optimize import minimize
    scale = [_SCALE[k] for k in FITTED]

    def calib(x) -> Calibration:
        vals = {k: float(min(max(v * s, _BOUNDS[k][0]), _BOUNDS[k][1])) for k, v, s in zip(FITTED, x, scale)}
        return dataclasses.replace(base, **vals)

    def loss(x) -> float:
        c = calib(x)
        return sum(math.log(predict(r, c) / r.published_s) ** 2 for r in runs) / len(runs)

    x = [max(getattr(base, k), 0.5 * s) / s for k, s in zip(FITTED, scale)]
    for _ in range(2):
        x = minimize(loss, x, method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-8, "maxiter": 400}).x
    return calib(x)


def calibration_rows(path: str = TABLE, calibration: Calibration = DEFAULT_CALIBRATION) -> list[CalibrationRow]:
    """Every run predicted with one given set of constants (in sample for the packaged table)."""
    return [_row(r, predict(r, calibration)) for r in published_runs(path)]


def leave_one_out(path: str = TABLE, base: Calibration = DEFAULT_CALIBRATION) -> tuple[list[CalibrationRow], list]:
    """Each run predicted with the FITTED constants fitted on all the other runs (each run is its own model).
    Returns the rows and, per run, the constants its fold used."""
    runs = published_runs(path)
    if len(runs) < 2:
        raise InputError(f"holds {len(runs)} run(s); leaving one out needs at least 2", file=path, field="rows",
                         fix="add rows (the constants of each fold are fitted on the other runs)")
    rows, fits = [], []
    for i, held in enumerate(runs):
        cal = fit_constants(runs[:i] + runs[i + 1:], base)
        rows.append(_row(held, predict(held, cal)))
        fits.append({k: getattr(cal, k) for k in FITTED})
    return rows, fits


def mape(rows: list[CalibrationRow]) -> float:
    return 100.0 * sum(abs(r.error) for r in rows) / len(rows)
