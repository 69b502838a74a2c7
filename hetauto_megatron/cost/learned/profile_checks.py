"""Checks of an operator profile's content before it is fitted: its header's element size agrees with its dtype
(`check_dtype_bytes`), and it times every operator kind its device runs (`check_every_operator_kind`)."""
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
