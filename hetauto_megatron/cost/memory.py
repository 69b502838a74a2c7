"""Memory per device of one pipeline stage: weights, gradients, optimizer state, activations.

Bytes per parameter, by the device's training precision (`DeviceType.dtype_bytes`), with the distributed
optimizer (Adam state sharded over the DP group):
    bf16 mixed precision (accelerators): 2 (bf16 weight) + 4 (fp32 main gradient) + 12 / dp (fp32 master
        weight and two Adam moments)
    fp32 (cpu dry runs): 4 (weight, which is its own master copy) + 4 (gradient) + 8 / dp (two Adam moments)

Activations per transformer layer and micro-batch, in bytes at 2 bytes per element (Korthikanti et al. 2022,
generalised to GQA and gated MLPs; flash attention, so no s^2 score matrix is stored; everything divided by TP
with sequence parallelism), scaled by dtype_bytes / 2 for fp32:
    attention  s*b*(7h + 4*kv_hidden)   (QKV input, Q, K, V, context, projection input, dropout mask)
    norms      4*s*b*h
    mlp        3*s*b*h + 4*s*b*f        (plain: input, up output, activation output, dropout mask)
               3*s*b*h + 8*s*b*f        (gated: input, gate and up outputs, activation output, product)
Recompute 'selective' re-runs the MLP and keeps only its input; 'full' keeps each layer's input (2sbh)
plus one layer's full activations while it is recomputed. Under 1F1B stage i of p holds min(p - i, m)
micro-batches in flight.
"""
from __future__ import annotations

from ..spec.model import ModelSpec

GIB = 1024 ** 3
RESERVED_GIB = {"cpu": 0.5}          # per-process runtime overhead: CUDA/HCCL context, comm buffers, fragments
DEFAULT_RESERVED_GIB = 3.0


def state_bytes_per_param(dtype_bytes: int, dp: int) -> float:
    """Weights, gradients and (DP-sharded) Adam state per parameter."""
    if dtype_bytes == 4:
        return 4 + 4 + 8 / dp
    return 2 + 4 + 12 / dp


def layer_activation_bytes(model: ModelSpec, tp: int, micro_batch_size: int, recompute: str,
                           seq_length: int | None = None, dtype_bytes: int = 2) -> float:
    s = seq_length or model.seq_length
    scale = dtype_bytes / 2
    sbh = s * micro_batch_size * model.hidden_size
    sbf = s * micro_batch_size * model.ffn_hidden_size
    attn = s * micro_batch_size * (7 * model.hidden_size + 4 * model.kv_hidden)
    mlp = 3 * sbh + (8 if model.gated_mlp else 4) * sbf
    full = attn + 4 * sbh + mlp
    if recompute == "none":
        return scale * full / tp
    if recompute == "selective":
        return scale * (full - mlp + 2 * sbh) / tp
    return scale * 2 * sbh / tp


def stage_params(model: ModelSpec, tp: int, layers: int, first: bool, last: bool) -> float:
    """Parameters one device of a stage holds: its 1/tp shard of the layers, the embedding, the output head."""
    params = layers * model.layer_params
    if first:
        params += model.embedding_params
    if last:
        params += model.output_params
    return params / tp


def stage_memory_bytes(model: ModelSpec, *, layers: int, tp: int, dp: int, micro_batch_size: int,
                       recompute: str, in_flight: int, first: bool, last: bool, vendor: str = "nvidia",
                       seq_length: int | None = None, dtype_bytes: int = 2) -> dict[str, float]:
    """Bytes on the busiest device of a stage; keys: params, weights_grads_optimizer, activations, reserved, total."""
    params = stage_params(model, tp, layers, first, last)
    state = params * state_bytes_per_param(dtype_bytes, dp)
    s = seq_length or model.seq_length
    per_layer = layer_activation_bytes(model, tp, micro_batch_size, recompute, s, dtype_bytes)
    acts = in_flight * layers * per_layer
    if recompute == "full" and layers:
        acts += layer_activation_bytes(model, tp, micro_batch_size, "none", s, dtype_bytes)
    if first:   # the embedding's output, kept for its backward
        acts += in_flight * dtype_bytes * s * micro_batch_size * model.hidden_size / tp
    if last:  # fp32 logits and their gradient for one micro-batch at a time
        acts += 2 * 4 * s * micro_batch_size * model.vocab_size / tp
    reserved = RESERVED_GIB.get(vendor, DEFAULT_RESERVED_GIB) * GIB
    return {"params": params, "weights_grads_optimizer": state, "activations": acts, "reserved": reserved,
            "total": state + acts + reserved}
