"""The checks on a published-runs table (validate-cost-model --published=FILE, plan/calibration.py): every figure
of a source and of its rows read up front, in the table's own names (`source.rows[N].tp`, `source.seq_len`),
so that a figure the analytic model cannot price is one paragraph naming the file, never a ZeroDivisionError,
an infinite prediction or a field of ModelSpec or the inventory the table does not have.

A row must describe a layout Megatron-LM could have run: TP divides the heads and the heads the hidden size,
tp x pp x dp is the GPU count, no more stages than layers (a split need not be even: Megatron-LM splits
unevenly too, and the prediction takes the best split),
the global batch is a whole number of micro-batches per data-parallel rank, and the published TFLOP/s per GPU
are within the device's dense peak. The runs are priced on nodes of 8 GPUs (calibration.py `predict`), as the
published systems (Selene, Eos) were built."""
from __future__ import annotations

import math

from ..errors import InputError
from ..spec._fields import MAX_FIGURE, MIN_FIGURE
from ..spec.model import MAX_LAYERS, MAX_SIZE
from .mesh import MAX_GLOBAL_BATCH_SIZE, RECOMPUTE_MODES

ROW_KEYS = ("params_b", "heads", "hidden", "layers", "tp", "pp", "gpus", "batch", "tflops_per_gpu")
FLOPS_COUNTS = {"hardware": "with the recomputation's FLOPs", "model": "without them"}
GPUS_PER_NODE = 8       # the nodes `predict` lays the runs out on


def _is_number(v, whole: bool) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and (not whole or isinstance(v, int)))


def check_source(cfg: dict, table: dict, source: str, path: str) -> None:
    """A source's own figures: vocabulary, sequence length, recomputation, how its TFLOP/s were counted, the
    micro-batch size and its node links."""
    for key, limit in (("vocab", MAX_SIZE), ("seq_len", MAX_SIZE)):
        v = table.get(key)
        what = "vocabulary size" if key == "vocab" else "sequence length in tokens"
        if not _is_number(v, True) or not 0 < v <= limit:
            raise InputError(f"{key} of source {source} is {v!r}, not a whole number from 1 to {limit:,}", file=path,
                             field=f"{source}.{key}", fix=f"give the {what} the published runs trained with")
    if table.get("recompute") not in RECOMPUTE_MODES:
        raise InputError(f"recompute of source {source} is {table.get('recompute')!r}", file=path,
                         field=f"{source}.recompute", fix=f"write one of {', '.join(RECOMPUTE_MODES)} (Megatron's "
                         "activation recomputation of those runs)")
    if cfg["flops_count"] not in FLOPS_COUNTS:
        raise InputError(f"flops_count of source {source} is {cfg['flops_count']!r}", file=path,
                         field=f"{source}.flops_count", fix="write hardware (the published TFLOP/s count the "
                         "recomputation's FLOPs) or model (they do not)")
    mbs = cfg["micro_batch_size"]
    if not _is_number(mbs, True) or not 0 < mbs <= MAX_GLOBAL_BATCH_SIZE:
        raise InputError(f"micro_batch_size of source {source} is {mbs!r}, not a positive whole number", file=path,
                         field=f"{source}.micro_batch_size", fix="give the runs' --micro-batch-size (1 where the "
                         "publication does not say)")
    for key in ("intra_node_gbps", "inter_node_gbps"):
        v = cfg[key]
        if not _is_number(v, False) or not MIN_FIGURE <= v <= MAX_FIGURE:
            raise InputError(f"{key} of source {source} is {v!r}, not a bandwidth from {MIN_FIGURE:g} to "
                             f"{MAX_FIGURE:g} Gbit/s", file=path, field=f"{source}.{key}",
                             fix="give the link's bandwidth per GPU in Gbit/s (e.g. 2400 for NVLink3, 200 for HDR)")


def check_row(row, i: int, source: str, path: str) -> None:
    """One row's keys and figures: known keys, positive whole numbers, a whole data-parallel degree."""
    where = f"{source}.rows[{i}]"
    if not isinstance(row, dict):
        raise InputError(f"row {i} of {source} is not a mapping", file=path, field=where,
                         fix=f"write each row as {{{', '.join(ROW_KEYS)}}}")
    unknown = sorted(set(row) - set(ROW_KEYS) - {"dp"}, key=str)
    if unknown:
        raise InputError(f"row {i} of {source} has unknown key {unknown[0]!r}", file=path, field=f"{where}.{unknown[0]}",
                         fix=f"use only {', '.join(ROW_KEYS)} (and dp)")
    for key in ROW_KEYS + (("dp",) if "dp" in row else ()):
        v = row.get(key)
        whole = key not in ("params_b", "tflops_per_gpu")
        if not (_is_number(v, whole) and v > 0):
            raise InputError(f"row {i} of {source}: {key} is {v!r}, not a positive {'whole ' if whole else ''}number",
                             file=path, field=f"{where}.{key}", fix=f"give {key} as the published table states it")
    for key, limit in (("layers", MAX_LAYERS), ("hidden", MAX_SIZE), ("heads", MAX_SIZE)):
        if row[key] > limit:
            raise InputError(f"row {i} of {source}: {key} is {row[key]:,}, more than any transformer has (at most "
                             f"{limit:,})", file=path, field=f"{where}.{key}", fix=f"give {key} as the published "
                             "table states it")
    if row["batch"] > MAX_GLOBAL_BATCH_SIZE:
        raise InputError(f"row {i} of {source}: batch {row['batch']} is above {MAX_GLOBAL_BATCH_SIZE:,}", file=path,
                         field=f"{where}.batch", fix="give the global batch in samples")
    tp, pp, gpus = row["tp"], row["pp"], row["gpus"]
    if gpus % (tp * pp) or ("dp" in row and row["dp"] != gpus // (tp * pp)):
        raise InputError(f"row {i} of {source}: gpus {gpus} is not tp x pp x dp ({tp} x {pp} x {row.get('dp', '?')})",
                         file=path, field=f"{where}.gpus", fix="give gpus = tp x pp x dp")


def check_layout(row: dict, i: int, source: str, path: str, micro_batch_size: int, peak_tflops: float,
                 device: str) -> None:
    """Whether a row (already through check_row) is a layout Megatron-LM runs on nodes of 8 GPUs, and its
    throughput one the device can reach."""
    where = f"{source}.rows[{i}]"
    tp, pp, gpus, heads, layers = row["tp"], row["pp"], row["gpus"], row["heads"], row["layers"]
    dp = gpus // (tp * pp)

    def refuse(key: str, reason: str, fix: str):
        raise InputError(f"row {i} of {source}: {reason}", file=path, field=f"{where}.{key}", fix=fix)

    if row["hidden"] % heads:
        refuse("heads", f"hidden {row['hidden']} is not divisible by heads {heads}",
               "give the published head count (the hidden size is a whole number of heads)")
    if heads % tp:
        refuse("tp", f"tp {tp} does not divide the {heads} heads (Megatron splits whole heads over the TP ranks)",
               "give the published TP degree")
    if tp > GPUS_PER_NODE:
        refuse("tp", f"tp {tp} spans more than one node of {GPUS_PER_NODE} GPUs",
               f"give the published TP degree (at most {GPUS_PER_NODE})")
    if gpus > GPUS_PER_NODE and gpus % GPUS_PER_NODE:
        refuse("gpus", f"gpus {gpus} is not a whole number of nodes of {GPUS_PER_NODE} GPUs",
               f"give the published GPU count ({GPUS_PER_NODE} or fewer, or a multiple of {GPUS_PER_NODE})")
    if layers < pp:       # (an uneven split is Megatron-LM's too: --decoder-first/last-pipeline-num-layers)
        refuse("pp", f"pp {pp} is more stages than the {layers} layers (each pipeline stage holds at least one)",
               "give the published PP degree and layer count")
    if row["batch"] % (micro_batch_size * dp):
        refuse("batch", f"batch {row['batch']} is not a whole number of micro-batches of {micro_batch_size} on each "
               f"of the {dp} data-parallel ranks", f"give the published global batch, or the source's "
               f"micro_batch_size (batch = micro-batches x micro_batch_size x dp)")
    if row["tflops_per_gpu"] > peak_tflops:
        refuse("tflops_per_gpu", f"tflops_per_gpu {row['tflops_per_gpu']:g} is above the {device}'s dense peak of "
               f"{peak_tflops:g} TFLOP/s", "give the published TFLOP/s per GPU, or the source's device")


# ModelSpec's fields, as the table names them (a model the table builds is named in the table's terms)
_MODEL_FIELDS = {"num_layers": "rows[{i}].layers", "hidden_size": "rows[{i}].hidden",
                 "num_attention_heads": "rows[{i}].heads", "ffn_hidden_size": "rows[{i}].hidden",
                 "vocab_size": "vocab", "seq_length": "seq_len", "max_position_embeddings": "seq_len"}


def in_table_terms(exc: InputError, i: int, source: str, path: str) -> InputError:
    """A ModelSpec's refusal of a row's model, re-addressed to the table's file and field."""
    field = _MODEL_FIELDS.get(exc.field or "", "rows[{i}]").format(i=i)
    return InputError(f"row {i} of {source}: {exc.reason}", file=path, field=f"{source}.{field}",
                      fix="give the row's figures as the published table states them")
