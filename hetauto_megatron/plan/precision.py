"""The job's training precision: which precisions a plan may train in, the default, and the 16-bit type each
keeps its parameters and gradients in.

Apart from the per-mesh settings (plan/settings.py) because precision is job-wide (`Plan.precision`; a CPU mesh
trains in fp32 whatever it says, `Plan.mesh_precision`), yet the same readers need it: the cost model, the
emitters (Megatron's flags in plan/megatron_flags.py `precision_args`, DeepSpeed's config) and the plan file.
"""
from __future__ import annotations

from ..errors import InputError
from ..spec.devices import PRECISIONS

DEFAULT_PRECISION = "bf16"


def check_precision(precision: str, *, field: str = "precision", file: str | None = None) -> str:
    if precision not in PRECISIONS:
        raise InputError(f"must be one of {', '.join(PRECISIONS)}, got {precision!r}", file=file, field=field,
                         fix="write bf16 (the default), fp16, fp8 (Transformer Engine, Hopper/Ada/MI300) or fp32")
    return precision


def sixteen_bit_dtype(precision: str) -> str | None:
    """The 16-bit type a precision keeps its parameters and gradients in: bf16 for bf16 and fp8 (Transformer
    Engine runs fp8 GEMMs on bf16 parameters), fp16 for fp16; None for fp32."""
    return {"bf16": "bf16", "fp8": "bf16", "fp16": "fp16"}.get(precision)
