"""Reproduce published homogeneous Megatron-LM throughputs with the analytic model (the calibration check).

The table (hetauto_megatron/data/published-megatron-throughput.yaml) gives, per run, the model, TP/PP/DP, global
batch and achieved TFLOP/s per GPU, from which the published iteration time follows. We predict each row with
ONE fixed set of constants (cost/analytic.py `Calibration`) and the software stack of its era: the 2021 A100
runs predate flash attention and sequence parallelism, the 2024 H100 runs use both. The tables do not state
the micro-batch size; we use 1 for every row (Megatron's published configurations at these scales).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import yaml

from ..spec.inventory import inventory_from_dict
from ..spec.model import ModelSpec
from .simulate import MeshChoice, evaluate_layout
from ..cost.analytic import AnalyticCostModel

TABLE = os.path.join(os.path.dirname(__file__), "..", "data", "published-megatron-throughput.yaml")

# Per source: catalog device, node links of those systems (Selene: NVLink3 + 8x200G HDR; Eos: NVLink4 + 8x400G NDR),
# and the software generation.
_SOURCES = {
    "source_a_a100": dict(device="a100-80gb", intra=2400, inter=200, flash=False, sp=False),
    "source_b_h100": dict(device="h100-sxm", intra=3600, inter=400, flash=True, sp=True),
}


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


def published_iteration_time(source: str, table: dict, row: dict) -> float:
    h, L, V, s, B = row["hidden"], row["layers"], table["vocab"], table["seq_len"], row["batch"]
    if source == "source_a_a100":   # counts recomputation FLOPs
        flops = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    else:                           # model FLOPs
        flops = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    return flops / (row["tflops_per_gpu"] * 1e12 * row["gpus"])


def calibration_rows(path: str = TABLE) -> list[CalibrationRow]:
    with open(path) as fh:
        data = yaml.safe_load(fh)
    out = []
    for source, cfg in _SOURCES.items():
        table = data[source]
        cost = AnalyticCostModel(flash_attention=cfg["flash"], sequence_parallel=cfg["sp"])
        for row in table["rows"]:
            h = row["hidden"]
            model = ModelSpec(name=f"gpt-{row['params_b']}b", num_layers=row["layers"], hidden_size=h,
                              num_attention_heads=row["heads"], ffn_hidden_size=4 * h, vocab_size=table["vocab"],
                              seq_length=table["seq_len"], gated_mlp=False, position_embedding="learned",
                              tie_embeddings=source == "source_a_a100")
            tp, pp, gpus = row["tp"], row["pp"], row["gpus"]
            dp = gpus // (tp * pp)
            inv = inventory_from_dict({"clusters": [{
                "name": "c", "device": cfg["device"], "nodes": gpus // 8, "devices_per_node": 8,
                "intra_node": {"bandwidth_gbps": cfg["intra"], "latency_us": 5},
                "inter_node": {"bandwidth_gbps": cfg["inter"], "latency_us": 10}}]})
            res = evaluate_layout(model, inv, [MeshChoice("c", tp, dp, 1, table["recompute"], pp)], row["batch"],
                                  cost, extrapolate=False)
            out.append(CalibrationRow(source, row["params_b"], tp, pp, dp,
                                      published_iteration_time(source, table, row), res.iteration_time_s))
    return out
