"""What a pipeline stage holds per parameter: weights, the gradient buffer and the optimizer's state, as the
settings' engine holds them (plan/settings.py). cost/memory.py adds the activations and the runtime's overheads.

Priced with the mesh's `RuntimeSettings` (passed in; this module does not choose them) and the element size of
the job's precision (`dtype_bytes`: 2 for bf16/fp16/fp8 training, whose parameters are
16-bit, 4 for fp32 and for CPU dry runs). Megatron-Core's own allocations, per parameter of the stage:

    weights          dtype_bytes                 the model's parameters (with the distributed optimizer they
                                                 live in the DP buffer's `param_data`, which replaces them)
    gradient buffer  4 if grad_reduce_dtype is fp32 (Megatron's default, grad_reduce_in_fp32), else
                     dtype_bytes                 DDP's contiguous `grad_data`, every parameter's `main_grad`;
                                                 the DP reduce runs in it, bucket by bucket
    master weights   4 / d (16-bit training)     the optimizer's fp32 copy; none in fp32 training, where the
                                                 parameter is its own master
    Adam moments     8 / d                       exp_avg and exp_avg_sq in fp32
    fp32 gradients   4 / d, only when the gradient buffer is not fp32: the optimizer steps on `.float()`
                     copies of the (shard of the) gradients

d is the mesh's DP degree with the distributed optimizer (ZeRO-1: each DP rank owns one shard of the state),
1 without it. This is Megatron's own `theoretical_memory_usage` (6 + 12/d bytes per parameter in bf16 with the
distributed optimizer, 18 without). Overlapping the gradient reduce and the parameter gather allocates
nothing more in Megatron-Core 0.19: the buckets (max(40M, 1M x d) parameters when overlap_grad_reduce is on,
one bucket otherwise) are views into the same two buffers, and the all-gather writes into `param_data` in
place. Bucket padding (to 64 elements per parameter and to a DP-divisible bucket end) is below 0.1 % of a
real stage and is not modelled. tests/test_memory_megatron.py pins these figures against the tensors of a
real Megatron-Core stage built with DDP and the distributed optimizer. Under DeepSpeed's pipeline engine (the
settings' engine, plan/settings.py ENGINES) its optimizer wrappers hold other state: cost/deepspeed_state.py,
measured by tests/test_memory_deepspeed_state.py.
"""
from __future__ import annotations

from .deepspeed_state import (ADAM_MOMENT_BYTES, FP32, deepspeed_held_at_reduction, deepspeed_reduction_terms,
                              deepspeed_state_bytes_per_param, deepspeed_state_fixed_bytes,
                              deepspeed_step_bytes_per_param)


def adam_traffic_bytes_per_param(dtype_bytes: int) -> int:
    """Memory traffic of one Adam step per parameter: read and write the fp32 weight and the two fp32 moments,
    read the gradient (28 bytes); 16-bit mixed precision also writes the 16-bit weight from the fp32 master copy
    and reads a 16-bit gradient (32)."""
    return 28 if dtype_bytes == FP32 else 32


def grad_buffer_bytes(dtype_bytes: int, settings) -> int:
    """Element size of DDP's gradient buffer: fp32 unless the plan reduces in the training precision."""
    return FP32 if settings.grad_reduce_dtype == "fp32" else dtype_bytes


def precision_of(dtype_bytes: int, precision: str | None = None) -> str:
    """The training precision a memory figure is for: the one given, else the one the element size implies (bf16
    for 2 bytes). Only DeepSpeed's optimizers tell fp16 from bf16 (cost/deepspeed_state.py)."""
    return precision or ("fp32" if dtype_bytes >= FP32 else "bf16")


def state_bytes_per_param(dtype_bytes: int, dp: int, settings, precision: str | None = None) -> dict[str, float]:
    """Bytes per parameter held for weights, the gradient buffer and the optimizer (see the module docstring), as
    the settings' engine holds them: DeepSpeed's optimizer wrappers hold other state (cost/deepspeed_state.py)."""
    if settings.optimizer_state == "deepspeed":
        return deepspeed_state_bytes_per_param(precision_of(dtype_bytes, precision), dp, settings)
    shard = dp if settings.distributed_optimizer else 1
    grad = grad_buffer_bytes(dtype_bytes, settings)
    master = FP32 if dtype_bytes < FP32 else 0
    fp32_grad_copy = FP32 if grad < FP32 else 0
    return {"weights": float(dtype_bytes), "gradients": float(grad),
            "optimizer": (master + ADAM_MOMENT_BYTES + fp32_grad_copy) / shard}


def state_fixed_bytes(dtype_bytes: int, settings, precision: str | None = None) -> dict[str, float]:
    """Bytes of weights, gradients or optimizer state that do not grow with the stage: DeepSpeed's ZeRO reduce
    bucket (cost/deepspeed_state.py); none for Megatron-Core, which reduces in its gradient buffer."""
    if settings.optimizer_state == "deepspeed":
        return deepspeed_state_fixed_bytes(precision_of(dtype_bytes, precision), settings)
    return {}


def state_bytes_at_step_per_param(dtype_bytes: int, dp: int, settings,
                                  precision: str | None = None) -> dict[str, float] | None:
    """Bytes per parameter held while the optimizer steps, when that is a different set than the one held through
    the micro-batches (state_bytes_per_param + state_fixed_bytes): DeepSpeed's ZeRO optimizer frees the gradients
    and the reduce bucket and steps on an fp32 gradient partition (cost/deepspeed_state.py). The state priced is
    the larger of the two; None: one set (Megatron-Core, whose figures already include the step's copies)."""
    if settings.optimizer_state == "deepspeed":
        return deepspeed_step_bytes_per_param(precision_of(dtype_bytes, precision), dp, settings)
    return None


def state_bytes_at_reduction(dtype_bytes: int, dp: int, settings, params: float,
                             largest_tensor: float = 0.0, precision: str | None = None) -> float | None:
    """Bytes of weights, gradients and optimizer state held while the gradient reduction after a stage's last
    backward runs, the reduction's own buffers included, for a stage of `params` parameters whose largest
    parameter tensor has `largest_tensor` elements: a third candidate for the stage's peak (the activations are
    gone by then), against the state held through the micro-batches with the activations and the state at the
    optimizer's step. DeepSpeed's engine allocates a flat copy of the gradients or a second reduce bucket there
    (cost/deepspeed_state.py); None: Megatron-Core, which reduces in its gradient buffer in place."""
    if settings.optimizer_state != "deepspeed":
        return None
    terms = deepspeed_reduction_terms(precision_of(dtype_bytes, precision), dp, settings)
    return deepspeed_held_at_reduction(terms, largest_tensor, params)
