"""Checks of a profile's content before it is fitted or compared: its header's element size agrees with its dtype
(`check_dtype_bytes`), an operator profile times every operator kind its device runs (`check_every_operator_kind`),
and each row's operator or layer is one that can run (`op_of_row`, `layer_of_row`)."""
from __future__ import annotations

from ...errors import InputError
from ...spec._fields import shorten
from .. import features as F


def check_dtype_bytes(path: str, header: dict, dtype_bytes: int) -> None:
    """A header's element size (`dtype_bytes`, what every feature and prior is computed with) is its dtype's:
    'hetauto profile' writes both from one name, so a disagreement is a hand edit, and the fit priced the rows at
    the wrong width and keyed them to the wrong arithmetic (16-bit / fp32). A header without a dtype passes."""
    dtype = header.get("dtype")
    if dtype is None:
        return
    want = F.DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
    if want is None:
        raise InputError(f"the header's dtype {shorten(repr(dtype), 40)} is none this version knows", file=path,
                         field="dtype", fix=f"use one of: {', '.join(F.DTYPE_BYTES)} (the dtype it was profiled "
                                            "with), or re-run 'hetauto profile' to write a fresh file")
    if want != dtype_bytes:
        raise InputError(f"the header's dtype_bytes is {dtype_bytes}, but its dtype {dtype} is {want} bytes wide",
                         file=path, field="dtype_bytes",
                         fix=f"write dtype_bytes {want} if the rows were timed in {dtype}, or the dtype they were "
                             "timed in; or re-run 'hetauto profile' to write a fresh file")


def expected_operator_kinds(info: "DeviceInfo") -> tuple[str, ...]:
    """The operator kinds an operator profile of `info`'s device times: every kind, the unfused attention only where
    Megatron runs it on that device at that element size (features.runs_unfused_attention; measure/grids.py
    with_unfused_attention)."""
    from ...spec.devices import get_device
    unfused = F.runs_unfused_attention(get_device(info.name), info.dtype_bytes)
    return tuple(k for k in F.OP_KINDS if unfused or k != "attention_unfused")


def check_every_operator_kind(path: str, info: "DeviceInfo", samples: list) -> None:
    """An operator profile to fit from times every operator kind its device runs in both passes (every grid does:
    measure/grids.py keeps each kind when it samples, `expected_operator_kinds`): a kind missing is a profile cut off
    before it, or written before the kind was timed (a CPU profile without the unfused attention), whose layers the
    fitted model would price from other devices' rates or the bare roofline (fitted.calibrated_s) without a word."""
    for phase in ("fwd", "bwd"):
        have = {F.OP_KINDS[int(x.features[0])] for x in samples if x.phase == phase}
        missing = [k for k in expected_operator_kinds(info) if k not in have]
        if missing:
            raise InputError(f"holds no {phase} time of the operator kind(s) {', '.join(missing)}, which every layer "
                             f"of a model on {info.name} is priced from (a profile stopped before it reached them, "
                             f"or written by a version that did not time them: {info.rows} rows)", file=path,
                             field="rows", fix="run the same 'hetauto profile' command again: it resumes into the "
                                               "file and measures the rest")


# ---- a row's operator or layer shape ------------------------------------------------------------------------
_JSON_TYPES = {str: "a JSON string", bool: "a JSON boolean", list: "a JSON array", dict: "a JSON object",
               type(None): "JSON null", float: "a number with a fraction"}
_REMEASURE = "delete the row (profiling resumes and re-measures it)"
# The largest dimension a row may give: a 32-bit count. What `hetauto profile` times is far under it (a
# micro-batch's tokens, a vocabulary of ~10^5); a larger one is a hand edit, whose roofline prior and features
# priced plans 10^25 times too slow (a dimension of 10^30) without a word.
MAX_DIMENSION = 2 ** 31 - 1
# The dimensions each operator kind is sized by (F.Op.flops / elements_moved / features): 0 is no operator at all
# (a 0-wide activation is timed as its launch alone and learned as a rate of nothing). Unused ones may be 0.
_OP_SIZED_BY = {"gemm": ("k", "n"), "embedding": ("k", "n"), "rotary": ("heads", "head_dim"),
                **{kind: ("batch", "seq", "heads", "kv_heads", "head_dim") for kind in F.ATTENTION_KINDS}}
_FLAGS = ("gated", "rope")      # 0 or 1
# ModelSpec's fields (what LayerShape.model refuses) by the layer row's
_LAYER_FIELD = {"hidden_size": "hidden", "num_attention_heads": "heads", "num_query_groups": "kv_heads",
                "ffn_hidden_size": "ffn", "vocab_size": "vocab", "seq_length": "seq"}


def row_label(row: dict, line: int) -> str:
    """How a profile row is named in a message: its line in the file (where the user edits it) and its key."""
    return f"line {line} (row {shorten(str(row.get('key', '?')), 80)})"


def _whole(value, *, path: str, row: str, field: str, least: int, most: int = MAX_DIMENSION) -> int:
    """One dimension of a row: a JSON whole number from `least` to `most`. Every writer of a profile writes such
    numbers, so text ("2048"), a fraction or true is a hand edit; int() took true as 1 and "2048" failed far away."""
    if isinstance(value, bool) or not isinstance(value, int):
        what = _JSON_TYPES.get(type(value), f"a {type(value).__name__}")
        raise InputError(f"{row} has {field} {shorten(repr(value), 40)}, {what}, not a whole number", file=path,
                         field=field, fix=f"write it as the shape measured had it (a JSON whole number from {least}, "
                                          f"no quotes), or {_REMEASURE}")
    if not least <= value <= most:
        bound = f"{least} or {most}" if most - least == 1 else f"from {least} to {most:,}"
        raise InputError(f"{row} has {field} {shorten(str(value), 40)}, not {bound}", file=path, field=field,
                         fix=f"write the dimension the measured shape had, or {_REMEASURE}")
    return value


def _mapping(row: dict, key: str, *, path: str, label: str) -> dict:
    value = row.get(key)
    if not isinstance(value, dict):
        shown = "null" if value is None else shorten(repr(value), 40)
        what = "no field" if key not in row else _JSON_TYPES.get(type(value), f"a {type(value).__name__}")
        raise InputError(f"{label} has {key} {shown} ({what}), not the object of a measured shape", file=path,
                         field=key, fix=_REMEASURE)
    return value


def _kind(d: dict, key: str, kinds, *, path: str, label: str) -> str:
    if d.get("kind") not in kinds:
        raise InputError(f"{label} has {key}.kind {shorten(repr(d.get('kind')), 40)}, none this version knows",
                         file=path, field=f"{key}.kind", fix=f"use one of: {', '.join(kinds)}; or {_REMEASURE}")
    return d["kind"]


def op_of_row(row: dict, *, path: str, line: int) -> F.Op:
    """The operator of one row of an operator profile, each dimension checked (`_whole`): one it is sized by
    (_OP_SIZED_BY; the tokens always) at least 1, the others at least 0, `gated` 0 or 1; else InputError naming
    the file, the line and the field."""
    label = row_label(row, line)
    d = _mapping(row, "op", path=path, label=label)
    kind = _kind(d, "op", F.OP_KINDS, path=path, label=label)
    sized_by = ("tokens",) + _OP_SIZED_BY.get(kind, ("n",))
    dims = {}
    for name in F.Op.__dataclass_fields__:
        if name in ("name", "kind") or (name not in d and name not in sized_by):
            continue
        if name not in d:
            raise InputError(f"{label} lacks op.{name}, which a {kind} operator is sized by", file=path,
                             field=f"op.{name}", fix=_REMEASURE)
        dims[name] = _whole(d[name], path=path, row=label, field=f"op.{name}", least=int(name in sized_by),
                            most=1 if name in _FLAGS else MAX_DIMENSION)
    return F.Op(str(d.get("name", kind)), kind, **dims)


def layer_of_row(row: dict, *, path: str, line: int) -> F.LayerShape:
    """The layer of one row of a layer profile, each field checked (`_whole`; `gated`, `rope` 0 or 1), then as a
    model's (ModelSpec: the heads divide the width, the groups the heads) and, for a transformer layer, its TP
    degree dividing its heads, groups and FFN width (F.layer_ops splits them): else InputError naming the file, the
    line and the field."""
    label = row_label(row, line)
    d = _mapping(row, "layer", path=path, label=label)
    kind = _kind(d, "layer", F.LAYER_KINDS, path=path, label=label)
    dims = {}
    for name in F.LayerShape.__dataclass_fields__:
        if name == "kind":
            continue
        if name not in d:
            raise InputError(f"{label} lacks layer.{name}", file=path, field=f"layer.{name}", fix=_REMEASURE)
        dims[name] = _whole(d[name], path=path, row=label, field=f"layer.{name}", least=int(name not in _FLAGS),
                            most=1 if name in _FLAGS else MAX_DIMENSION)
    shape = F.LayerShape(kind, **dims)
    try:
        model = shape.model()
    except InputError as exc:
        names = [f"{k} is layer.{v}" for k, v in _LAYER_FIELD.items() if k in exc.reason]
        raise InputError(f"{label} has a layer no model has: {exc.reason.rstrip('.')}"
                         + (f" ({'; '.join(names)})" if names else ""), file=path,
                         field=f"layer.{_LAYER_FIELD.get(exc.field, exc.field)}",
                         fix=f"write the shape the measured layer had, or {_REMEASURE}") from None
    if kind == "transformer" and not F.tp_divides(model, shape.tp):
        raise InputError(f"{label} has layer.tp {shape.tp}, which does not divide its heads {shape.heads}, groups "
                         f"{shape.kv_heads} and FFN width {shape.ffn} (each TP rank runs an equal share)", file=path,
                         field="layer.tp", fix=f"write the TP degree the layer ran at, or {_REMEASURE}")
    return shape
