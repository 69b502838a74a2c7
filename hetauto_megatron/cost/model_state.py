"""What a pipeline stage holds per parameter: weights, the gradient buffer and the optimizer's state, as the
settings' engine holds them (plan/settings.py). cost/memory.py adds the activations and the runtime's overheads.

Priced with the mesh's `RuntimeSettings` (passed in; this module does not choose them) and the element size of
the job's precision (`dtype_bytes`: 2 for bf16/fp16/fp8 training, whose parameters are 16-bit, 4 for fp32 and for
CPU dry runs). Megatron-Core's own allocations, per element of its DDP buffer (cost/ddp_buffer.py counts them):

    weights          dtype_bytes                 per element of the buffer's `param_data` with the distributed
                                                 optimizer (the parameters live there, padded), else per parameter
    gradient buffer  4 if grad_reduce_dtype is fp32 (Megatron's default, grad_reduce_in_fp32), else
                     dtype_bytes                 per element of DDP's contiguous `grad_data` (padded with the
                                                 distributed optimizer), every parameter's `main_grad`; the DP
                                                 reduce runs in it, bucket by bucket
    master weights   4 (16-bit training)         the optimizer's fp32 copy; none in fp32 training, where the
                                                 parameter is its own master
    Adam moments     8                           exp_avg and exp_avg_sq in fp32
    fp32 gradients   4, only when the gradient buffer is not fp32, and only while the optimizer steps: it steps
                     on `.float()` copies of the (shard of the) gradients, made in step()
                     (`_copy_model_grads_to_main_grads`, distrib_optimizer.py:2782, optimizer.py:1097) and set to
                     None by zero_grad (distrib_optimizer.py:2558-2588, optimizer.py:1048-1061), which Megatron-LM's
                     train_step (and runtime/train.py) calls before the next step's forward: the activations are
                     gone when they exist, so they are the step's set (state_bytes_at_step_per_param), not held

the last three per parameter element in the busiest DP rank's shard with the distributed optimizer (ZeRO-1: each
DP rank owns one piece of every bucket, and its optimizer state covers the parameters' elements there, not the
padding), per parameter without it. Up to that padding this is Megatron's own `theoretical_memory_usage` (6 +
12/d bytes per parameter in bf16 with the distributed optimizer over d DP ranks, 18 without; `state_bytes_per_param`;
its formula counts no fp32 gradient copy either).
The padding (every parameter starting on a 64-element boundary, every bucket's end on a multiple of lcm(DP, 128))
is fewer than lcm(DP, 128) elements a bucket at real widths, but a 32-element bias of the dry run's --tiny widths
takes 64 elements.
Overlapping the gradient reduce and the parameter gather allocates nothing more in Megatron-Core 0.19: the buckets
(max(40M, 1M x d) parameters when overlap_grad_reduce is on, one bucket otherwise) are views into the same two
buffers, and the all-gather writes into `param_data` in place. tests/test_memory_megatron.py pins these figures,
to the byte, against the tensors of real Megatron-Core stages built with DDP and the distributed optimizer. Under
DeepSpeed's pipeline engine (the settings' engine, plan/engines.py ENGINES) its optimizer wrappers hold other state
per parameter: cost/deepspeed_state.py, measured by tests/test_memory_deepspeed_state.py.
"""
from __future__ import annotations

from functools import lru_cache

from ..spec.model import ModelSpec
from .ddp_buffer import StageBuffer, stage_buffer
from .deepspeed_state import (ADAM_MOMENT_BYTES, FP32, deepspeed_held_at_reduction, deepspeed_padding_bytes_per_element,
                              deepspeed_padding_elements, deepspeed_reduction_terms, deepspeed_state_bytes_per_param,
                              deepspeed_state_fixed_bytes, deepspeed_step_bytes_per_param, deepspeed_step_fixed_bytes)


# fp8 training keeps, beside each 16-bit GEMM weight of Transformer Engine's layers, its fp8 copies, per element of the
# weight: Megatron passes is_first_microbatch to every TE linear (core/extensions/transformer_engine.py, TELinear and
# TELayerNormColumnParallelLinear.forward), so TE quantizes the weight into a workspace cached in the module's
# _fp8_workspaces ("weight", module/base.py get_weight_workspace) and keeps it for the whole run, updated in place at
# each first micro-batch. Under Megatron's default recipe (delayed scaling: --fp8-recipe, not emitted; another is
# refused, megatron/settings_args.py) that workspace is a Float8Tensor with its row-wise data (1 byte) and, for the
# backward's data-gradient GEMM, its transpose (1 byte): TE allocates the transpose wherever cuBLASLt takes fp8 GEMMs in
# the TN layout only (csrc/quantizer.cpp, with_transpose = columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported(),
# false below compute capability 10.0): on every fp8 device of the catalog (Hopper 9.0, Ada 8.9, and the MI300X's 9.4 in
# ROCm's port, which keeps the rule). TransformerEngine v2.14; one fp32 scale per weight is left out.
FP8_WEIGHT_COPY_BYTES = 2


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


def state_bytes_per_element(dtype_bytes: int, dp: int, settings, precision: str | None = None) -> dict[str, float]:
    """Bytes held for weights, the gradient buffer and the optimizer per element `state_elements` counts (see the
    module docstring), as the settings' engine holds them: DeepSpeed's optimizer wrappers hold other state per
    parameter (cost/deepspeed_state.py)."""
    if settings.optimizer_state == "deepspeed":
        return deepspeed_state_bytes_per_param(precision_of(dtype_bytes, precision), dp, settings)
    grad = grad_buffer_bytes(dtype_bytes, settings)
    master = FP32 if dtype_bytes < FP32 else 0
    return {"weights": float(dtype_bytes), "gradients": float(grad), "optimizer": float(master + ADAM_MOMENT_BYTES)}


def _step_gradient_copy_bytes(dtype_bytes: int, settings) -> int:
    """Megatron-Core's fp32 copy of each gradient its optimizer steps on, per element of its shard: only when the
    gradient buffer is not fp32 (`.float()` of an fp32 main_grad is the buffer itself); made in step(), freed by
    the next zero_grad (module docstring)."""
    return FP32 if grad_buffer_bytes(dtype_bytes, settings) < FP32 else 0


def state_elements(buffer: StageBuffer) -> dict[str, int]:
    """Elements each part of `state_bytes_per_element` is held for under Megatron-Core, on a stage whose DDP buffer
    is `buffer` (cost/ddp_buffer.py stage_buffer): its `param_data`, its `grad_data` and the busiest DP rank's
    optimizer shard. (DeepSpeed's engine: every part per parameter of the stage.)"""
    return {"weights": buffer.param_data, "gradients": buffer.grad_data, "optimizer": buffer.optimizer}


@lru_cache(maxsize=65536)     # pure; every reading of a stage configuration asks for it
def state_counts(settings, model: ModelSpec, tp: int, dp: int, first: bool, last: bool):
    """`state_elements` of a stage under the settings' engine as a function of its layer count, remembered per
    layer count (a search reads each configuration at many); None: every part per parameter of the stage
    (DeepSpeed's engine, cost/deepspeed_state.py)."""
    if settings.optimizer_state == "deepspeed":
        return None
    memo: dict = {}

    def counts(layers: int) -> dict[str, int]:
        got = memo.get(layers)
        if got is None:
            got = memo[layers] = state_elements(stage_buffer(model, tp, dp, layers, first, last,
                                                             settings.distributed_optimizer,
                                                             settings.overlap_grad_reduce))
        return got
    return counts


def state_bytes_per_param(dtype_bytes: int, dp: int, settings, precision: str | None = None) -> dict[str, float]:
    """Bytes per parameter held for weights, the gradient buffer and the optimizer without the buffer's padding
    (Megatron's `theoretical_memory_usage`: the optimizer's over the DP degree with the distributed optimizer); what
    a stage holds is `state_bytes_per_element` x `state_elements`. DeepSpeed's figures as they are."""
    per = state_bytes_per_element(dtype_bytes, dp, settings, precision)
    if settings.optimizer_state == "deepspeed" or not settings.distributed_optimizer:
        return per
    return {**per, "optimizer": per["optimizer"] / dp}


def state_fixed_bytes(dtype_bytes: int, settings, precision: str | None = None) -> dict[str, float]:
    """Bytes of weights, gradients or optimizer state that do not grow with the stage: DeepSpeed's ZeRO reduce
    bucket (cost/deepspeed_state.py); none for Megatron-Core, which reduces in its gradient buffer."""
    if settings.optimizer_state == "deepspeed":
        return deepspeed_state_fixed_bytes(precision_of(dtype_bytes, precision), settings)
    return {}


def state_padding_per_element(dtype_bytes: int, dp: int, settings, precision: str | None = None,
                              at_step: bool = False) -> dict[str, float]:
    """Bytes per element of the padding DeepSpeed's BF16 and ZeRO optimizers give a stage's flat buffer (held
    through the micro-batches, or by the ZeRO optimizer at its step with `at_step`): cost/deepspeed_state.py
    deepspeed_padding_bytes_per_element; empty for Megatron-Core, whose padding state_elements counts."""
    if settings.optimizer_state == "deepspeed":
        return deepspeed_padding_bytes_per_element(precision_of(dtype_bytes, precision), dp, settings, at_step)
    return {}


def state_padding_bytes(dtype_bytes: int, dp: int, settings, params: float, precision: str | None = None,
                        at_step: bool = False) -> dict[str, float]:
    """Bytes of that padding on a stage of `params` parameters (deepspeed_padding_elements of them), per part."""
    pad = deepspeed_padding_elements(params, dp)
    return {k: pad * v for k, v in state_padding_per_element(dtype_bytes, dp, settings, precision, at_step).items()}


def state_bytes_at_step_per_param(dtype_bytes: int, dp: int, settings,
                                  precision: str | None = None) -> dict[str, float] | None:
    """Bytes per parameter held while the optimizer steps, when that is a different set than the one held through
    the micro-batches (state_bytes_per_param + state_fixed_bytes): DeepSpeed's ZeRO optimizer frees the reduce
    bucket and the gradients outside the rank's partition, copies those inside into a flat partition and that
    into the fp32 partition it steps on, and its FP16 and BF16 optimizers add an fp32 copy of the gradients
    (cost/deepspeed_state.py), with state_fixed_bytes_at_step; Megatron-Core's optimizer adds its fp32 gradient
    copies (4 per element of its shard, when the gradient buffer is not fp32). The step runs after the last
    backward, when the activations are gone: cost/memory.py prices this set as a candidate for the peak of its own,
    beside the micro-batches' set with the activations. None: one set (the step allocates nothing more). Per element
    `state_elements` counts under Megatron-Core (its optimizer shard for the copies), per parameter under
    DeepSpeed."""
    if settings.optimizer_state == "deepspeed":
        return deepspeed_step_bytes_per_param(precision_of(dtype_bytes, precision), dp, settings)
    copy = _step_gradient_copy_bytes(dtype_bytes, settings)
    if not copy:
        return None
    held = state_bytes_per_element(dtype_bytes, dp, settings, precision)
    return {**held, "optimizer": held["optimizer"] + copy}


def state_fixed_bytes_at_step(dtype_bytes: int, dp: int, settings, params: float, tensors: tuple[float, float],
                              precision: str | None = None) -> dict[str, float]:
    """Bytes of that set at the step beyond its per-parameter bytes, on a stage of `params` parameters whose
    largest tensors are `tensors` (cost/deepspeed_state.py stage_param_tensors): the whole gradients of the
    tensors straddling the busiest rank's partition boundaries (deepspeed_step_fixed_bytes, an upper bound);
    empty for Megatron-Core."""
    if settings.optimizer_state == "deepspeed":
        return deepspeed_step_fixed_bytes(precision_of(dtype_bytes, precision), dp, settings, params, tensors)
    return {}


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
