"""Memory per device of one pipeline stage under the runtime settings that run (plan/settings.py).

Everything here is priced with the mesh's `RuntimeSettings` (passed in; this module does not choose them) and
the element size of the job's precision (`dtype_bytes`: 2 for bf16/fp16/fp8 training, whose parameters are
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
real Megatron-Core stage built with DDP and the distributed optimizer.

Activations per transformer layer and micro-batch, at 2 bytes per element (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", Table 2, generalised to GQA and gated MLPs, with flash
attention so no s^2 score matrix is stored), scaled by dtype_bytes / 2:
    attention  s*b*(7h + 4*kv_hidden)   QKV input 2h and dropout mask h [replicated], Q 2h, K and V 4kv,
                                        context (projection input) 2h [split by TP]
    norms      4*s*b*h                  the two norm inputs [replicated]
    mlp        3*s*b*h + 4*s*b*f        plain: input 2h and dropout mask h [replicated], up output, activation
                                        output [split]
               3*s*b*h + 8*s*b*f        gated: the same replicated part, gate and up outputs, activation output
                                        and product [split]
The split parts are always divided by TP (tensor-parallel regions). The replicated ones (10sbh of Korthikanti's
34sbh) are divided by TP only with sequence parallelism, which shards the sequence outside those regions; with
it off every TP rank holds them in full, Table 2's sbh(10 + 24/t).
Recompute 'selective' re-runs the MLP and keeps only its input; 'full' keeps each layer's input (2sbh, split by
TP only under sequence parallelism) plus one layer's full activations while it is recomputed. Under 1F1B stage
i of p holds min(p - i, m) micro-batches in flight, more before an overlapped cross-cluster
boundary (its warm-up depth, plan/pipeline.py).
"""
from __future__ import annotations

from ..spec.model import ModelSpec

GIB = 1024 ** 3
RESERVED_GIB = {"cpu": 0.5}          # per-process runtime overhead: CUDA/HCCL context, comm buffers, fragments
DEFAULT_RESERVED_GIB = 3.0
ADAM_MOMENT_BYTES = 8                # exp_avg + exp_avg_sq, fp32
FP32 = 4


def grad_buffer_bytes(dtype_bytes: int, settings) -> int:
    """Element size of DDP's gradient buffer: fp32 unless the plan reduces in the training precision."""
    return FP32 if settings.grad_reduce_dtype == "fp32" else dtype_bytes


def state_bytes_per_param(dtype_bytes: int, dp: int, settings) -> dict[str, float]:
    """Bytes per parameter held for weights, the gradient buffer and the optimizer (see the module docstring)."""
    shard = dp if settings.distributed_optimizer else 1
    grad = grad_buffer_bytes(dtype_bytes, settings)
    master = FP32 if dtype_bytes < FP32 else 0
    fp32_grad_copy = FP32 if grad < FP32 else 0
    return {"weights": float(dtype_bytes), "gradients": float(grad),
            "optimizer": (master + ADAM_MOMENT_BYTES + fp32_grad_copy) / shard}


def _activation_parts(model: ModelSpec, micro_batch_size: int, recompute: str, s: int) -> tuple[float, float]:
    """(replicated, split) activation bytes of one layer and micro-batch at 2 bytes per element: the part that
    only sequence parallelism divides by TP, and the part inside the tensor-parallel regions."""
    b = micro_batch_size
    sbh = s * b * model.hidden_size
    sbf = s * b * model.ffn_hidden_size
    attn_rep, attn_split = 3 * sbh, 4 * sbh + 4 * s * b * model.kv_hidden
    norms = 4 * sbh
    mlp_rep, mlp_split = 3 * sbh, (8 if model.gated_mlp else 4) * sbf
    if recompute == "none":
        return attn_rep + norms + mlp_rep, attn_split + mlp_split
    if recompute == "selective":     # the MLP is re-run: only its input (2sbh, replicated without SP) is kept
        return attn_rep + norms + 2 * sbh, attn_split
    return 2 * sbh, 0.0              # full: the layer's input


def layer_activation_bytes(model: ModelSpec, tp: int, micro_batch_size: int, recompute: str, *,
                           sequence_parallel: bool, seq_length: int | None = None, dtype_bytes: int = 2) -> float:
    s = seq_length or model.seq_length
    rep, split = _activation_parts(model, micro_batch_size, recompute, s)
    return dtype_bytes / 2 * ((rep / tp if sequence_parallel else rep) + split / tp)


def stage_params(model: ModelSpec, tp: int, layers: int, first: bool, last: bool) -> float:
    """Parameters one device of a stage holds. Linear weights and the vocabulary are split over TP; norms and a
    learned position table are replicated on every TP rank (Megatron-Core's layout). With tied embeddings the
    last stage keeps its own copy of the table, except when it is also the first stage."""
    h = model.hidden_size
    norms = 2 * h
    params = layers * ((model.layer_params - norms) / tp + norms)
    if first:
        pos = model.embedding_params - model.vocab_size * h
        params += model.vocab_size * h / tp + pos
    if last:
        params += h                                   # the final norm
        if not (first and model.tie_embeddings):
            params += model.vocab_size * h / tp        # the output head (or the tied table's copy)
    return params


def stage_memory_bytes(model: ModelSpec, *, layers: int, tp: int, dp: int, micro_batch_size: int,
                       recompute: str, in_flight: int, first: bool, last: bool, settings, vendor: str = "nvidia",
                       seq_length: int | None = None, dtype_bytes: int = 2,
                       boundary_buffers: int = 0) -> dict[str, float]:
    """Bytes on the busiest device of a stage; keys: params, weights, gradients, optimizer,
    weights_grads_optimizer, activations, reserved, total. `model.vocab_size` is the padded vocabulary that
    runs (plan.settings.padded_vocab_size); `settings` the mesh's RuntimeSettings. boundary_buffers: whole
    (sequence x micro-batch x hidden) tensors the stage holds for an overlapped cross-cluster boundary
    (activations received ahead, a gradient in flight; plan/simulate.py counts them)."""
    sp = settings.sequence_parallel
    params = stage_params(model, tp, layers, first, last)
    per = state_bytes_per_param(dtype_bytes, dp, settings)
    parts = {k: params * v for k, v in per.items()}
    state = sum(parts.values())
    s = seq_length or model.seq_length
    per_layer = layer_activation_bytes(model, tp, micro_batch_size, recompute, sequence_parallel=sp,
                                       seq_length=s, dtype_bytes=dtype_bytes)
    acts = in_flight * layers * per_layer
    if recompute == "full" and layers:
        acts += layer_activation_bytes(model, tp, micro_batch_size, "none", sequence_parallel=sp, seq_length=s,
                                       dtype_bytes=dtype_bytes)
    if first:   # the embedding's output, kept for its backward (scattered over TP under sequence parallelism)
        acts += in_flight * dtype_bytes * s * micro_batch_size * model.hidden_size / (tp if sp else 1)
    if last:  # fp32 logits and their gradient for one micro-batch at a time, split over TP by vocabulary
        acts += 2 * FP32 * s * micro_batch_size * model.vocab_size / tp
    acts += boundary_buffers * dtype_bytes * s * micro_batch_size * model.hidden_size
    reserved = RESERVED_GIB.get(vendor, DEFAULT_RESERVED_GIB) * GIB
    return {"params": params, **parts, "weights_grads_optimizer": state, "activations": acts, "reserved": reserved,
            "total": state + acts + reserved}
