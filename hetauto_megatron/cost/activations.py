"""Activations one transformer layer keeps for its backward pass, per micro-batch, as the layers that run keep them.

Apart from cost/memory.py, which sums a whole stage (state, activations in flight, the runtime's overheads), because
this is the per-layer rule alone: what each layer keeps between its forward and its backward (Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models", generalised to GQA and gated MLPs), for the
layers that run (`LayerImpl`: Transformer Engine by default, flash attention so no s^2 score matrix; the dry run's
local spec of torch modules keeps more, `DRY_RUN_IMPL`); see `_layer_parts`. The parts outside the tensor-parallel
regions (the norms' inputs and outputs, the dropout masks: Korthikanti's 10sbh of 34sbh) are divided by TP only
under sequence parallelism; without it every TP rank holds them in full, Table 2's sbh(10 + 24/t). Recompute
'selective' re-runs the MLP and keeps its checkpoint's input (under Transformer Engine the second norm runs inside
that checkpoint); 'full' keeps each layer's input; either re-materialises one layer (or MLP) at a time in the
backward pass (`recompute_buffer_bytes`). Unfused attention's backward holds s x s gradients beyond what a layer keeps
(`attention_backward_bytes`), and Megatron's local attention keeps a score buffer for the run (`score_buffer_bytes`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..spec.model import ModelSpec
from .model_state import FP32
from ..cache_keys import cached_hash


@dataclass(frozen=True)
class LayerImpl:
    """How the layers that run keep their activations for the backward pass. Transformer Engine on accelerators
    (the default) and Megatron's local spec of torch modules that CPU dry runs build (runtime/model.py) differ:
    measured with saved-tensor hooks (runtime/memory_meter.py), the local spec keeps more per layer."""
    __hash__ = cached_hash                 # a cache key of the planner: hashed once (cache_keys.py)
    flash_attention: bool = True   # no s x s score matrix; K and V at their GQA width. Unfused attention keeps
                                   # the softmax output (a*s*s*b) and K, V repeated to every head
    fused_norm: bool = True        # the norm keeps its input and a per-row statistic; torch's RMSNorm is a
                                   # composite that also keeps the normalised input before the weight
    fused_rope: bool = True        # unfused rotary embedding keeps its cos and sin for Q and K: 4*s*head_dim
    gated_mlp_tensors: int = 3     # s*b*f tensors a gated MLP keeps (fc1's output counts two: gate and up).
                                   # 3: Megatron's fused SwiGLU, which accelerator launches run (bias_swiglu_fusion,
                                   # turned off only on CPU: plan/megatron_flags.py CPU_LAYER_ARGS), saves fc1's
                                   # output alone (core/fusions/fused_bias_swiglu.py SwiGLUFunction) and fc2 its
                                   # input; 4: torch's silu(gate) * up also keeps silu's output; 5: Megatron's
                                   # unfused GLU (core/transformer/mlp.py glu) also adds its linear offset (0) to
                                   # the up half, one more tensor the product keeps
    pre_mlp_norm_in_fc1: bool = True   # the second norm runs inside fc1 (Transformer Engine's spec:
                                   # TELayerNormColumnParallelLinear, pre_mlp_layernorm IdentityOp,
                                   # models/gpt/gpt_layer_specs.py), so recompute 'selective' checkpoints it with
                                   # the MLP: the checkpoint keeps the norm's input and its output is recomputed
    dropout_mask_bytes: int | None = 1   # what a dropout keeps per element when the settings turn it on
                                   # (settings.hidden_dropout / attention_dropout > 0; at 0 PyTorch keeps nothing):
                                   # a 1-byte mask from the fused kernel on accelerators; None = the element size:
                                   # on CPU PyTorch draws the mask as a tensor of the input's dtype
    kv_repeated: bool = False      # with flash attention and GQA: K and V repeated to every head before a kernel
                                   # that takes no grouped K and V (the memory-efficient one), kept at the query's
                                   # width
    grouped_kv_max_head_dim: int | None = None   # K and V taken grouped only up to this head dim (repeated
                                   # above it, as kv_repeated); None: at any head dim
    query_views_qkv: bool = False  # Megatron's local attention: on a TP rank holding one key/value group and more
                                   # than one head, with no rotary embedding to copy Q, Q reaches the score GEMM
                                   # as a view of the fused QKV output at micro-batch 1 (its reshape to
                                   # [s, b x heads, head_dim] merges a dimension of one; from 2 on it copies), so
                                   # the Q kept for the backward keeps that whole output
    checkpoint_bytes: int = 0      # what a full recomputation's checkpoint keeps in the device's memory beside the
                                   # layer's input, per layer and micro-batch; its backward holds as much again while
                                   # it re-runs the layer (DeepSpeed's on CPU: two RNG states, below)
    score_grad_tensors: int = 0    # unfused attention: s x s tensors (b x heads/TP x s x s, element size) its
                                   # backward holds at once. 4 under Megatron's local DotProductAttention: its mask is
                                   # applied in place to a view of the score GEMM's output (attention_mask_func's
                                   # masked_fill_), so autograd's CopySlices node holds the incoming gradient, its copy
                                   # of it, that copy's clone and masked_fill's output (measured on CPU: 4.05 s x s
                                   # tensors at the backward's peak, 3.05 with the fill out of place). 0: not priced
    score_buffer: bool = False     # Megatron's local attention takes the score GEMM's (beta = 0) input from
                                   # parallel_state's global memory buffer: one s x s tensor per rank kept for the run
    position_ids_per_sample: bool = True   # learned positions: the embedding keeps its position ids (int64) per
                                   # micro-batch, one row per sample as Megatron-LM's batch has them ([b, s], its
                                   # get_batch; the dry run's batch too); False: one row of s (hetauto's DeepSpeed
                                   # pipeline module makes it per micro-batch, runtime/deepspeed_pipeline.py)


TRANSFORMER_ENGINE = LayerImpl()
# Transformer Engine in fp32 or on a V100: its fused attention backends take 16-bit inputs on sm80+ only, so it runs
# its UnfusedDotProductAttention, which keeps the s x s softmax output (plan/engines.py ENGINES,
# RuntimeSettings.fused_attention). In 16 bits its scaled masked softmax kernel runs and writes the gradient in place
# into the incoming one (TransformerEngine csrc softmax.cpp: "Produce gradients in place"): the backward holds that
# gradient beside the kept probabilities, 2 s x s tensors.
TRANSFORMER_ENGINE_UNFUSED_ATTENTION = LayerImpl(flash_attention=False, score_grad_tensors=2)
# In fp32 that kernel does not run (16-bit inputs only) and torch's softmax does, behind the same in-place mask on
# a view of the score GEMM's output as Megatron's local attention (attention_mask_func's masked_fill_): 4 at once,
# as measured there (score_grad_tensors). Its score GEMM's input is a fresh tensor, not a kept buffer.
TRANSFORMER_ENGINE_UNFUSED_ATTENTION_FP32 = LayerImpl(flash_attention=False, score_grad_tensors=4)
# What the dry run builds (runtime/model.py): Megatron's local spec (torch attention, torch norms, unfused rope
# and GLU) on CPU processes.
DRY_RUN_IMPL = LayerImpl(flash_attention=False, fused_norm=False, fused_rope=False, gated_mlp_tensors=5,
                         pre_mlp_norm_in_fc1=False, dropout_mask_bytes=None, query_views_qkv=True,
                         score_grad_tensors=4, score_buffer=True)


def mask_bytes(impl: LayerImpl, E: int) -> int:
    """The bytes a dropout keeps per element of its input under `impl` (element size E)."""
    return E if impl.dropout_mask_bytes is None else impl.dropout_mask_bytes


def _layer_parts(model: ModelSpec, b: int, s: int, E: int, impl: LayerImpl, hidden_dropout: float,
                 attention_dropout: float, tp: int) -> dict[str, float]:
    """Bytes one layer keeps for one micro-batch, by how TP divides them (element size E):
    rep     outside the TP regions: divided by TP only under sequence parallelism. The two norms' inputs and
            outputs (each output is the next linear's input: QKV, MLP), their fp32 row statistics, the
            composite RMSNorm's normalised input, the hidden-dropout masks after attention and MLP
    attn    inside TP: Q, K and V (GQA width with flash attention, repeated to every head without), the
            context (projection input); unfused: the softmax output (+ the attention dropout's mask and output)
    mlp     inside TP: plain, fc1 output and activation output; gated, `impl.gated_mlp_tensors` (fc1's
            output, 2f: gate and up, the product fc2 keeps, and what the GLU keeps beside them)
    fixed   not divided by TP nor by the micro-batch: unfused rope's cos/sin for Q and K"""
    h, f, a = model.hidden_size, model.ffn_hidden_size, model.num_attention_heads
    sbh, sbf = s * b * h, s * b * f
    composite_norm = not impl.fused_norm and model.gated_mlp      # gated models run RMSNorm (runtime/model.py)
    # fused norms keep a per-row fp32 statistic too; Korthikanti's count leaves it out (h/4 times smaller
    # than one norm's input): counted where it was measured, the torch norms of the dry run
    stats = 0 if impl.fused_norm else 2 * FP32 * s * b
    mask = mask_bytes(impl, E)
    rep = (4 + (2 if composite_norm else 0)) * sbh * E + stats + (2 * sbh * mask if hidden_dropout else 0)
    attn = 2 * sbh * E
    if impl.flash_attention:
        attn += 2 * s * b * model.kv_hidden * E
        repeated = impl.kv_repeated or (impl.grouped_kv_max_head_dim is not None
                                        and model.head_dim > impl.grouped_kv_max_head_dim)
        if repeated and model.num_query_groups != a:
            # K and V repeated to every head (rope rotates them before, at their GQA width); without rope Q is a
            # view of the fused QKV output, which keeps its K and V (GQA width) beside the repeated ones
            attn += 2 * s * b * (h - (model.kv_hidden if model.position_embedding == "rope" else 0)) * E
    else:
        scores = a * s * s * b
        kept_scores = scores * E + (scores * (E + mask) if attention_dropout else 0)
        attn += 2 * sbh * E + kept_scores
        if model.num_query_groups == a and model.position_embedding == "rope" and not impl.fused_rope:
            # without GQA Megatron's local attention repeats nothing: V stays a view of the fused QKV output,
            # so that whole tensor (h + 2 kv wide) is kept beside the rotated Q and K: s b (3 kv - h) more
            attn += s * b * (3 * model.kv_hidden - h) * E
        if impl.query_views_qkv and b == 1 and model.position_embedding != "rope" and model.num_query_groups == tp < a:
            # one key/value group per TP rank (`tp` ranks share the groups), no rotation: the kept Q is a view of
            # the fused QKV output, which keeps K and V at one group's width beside it (per rank, once divided by TP)
            attn += 2 * s * b * model.kv_hidden * E
    mlp = (impl.gated_mlp_tensors if model.gated_mlp else 2) * sbf * E
    fixed = 4 * s * model.head_dim * E if model.position_embedding == "rope" and not impl.fused_rope else 0
    return {"rep": rep, "attn": attn, "mlp": mlp, "fixed": fixed, "input": sbh * E,
            "scores": 0 if impl.flash_attention else a * s * s * b * E, "kept_scores": 0 if impl.flash_attention
            else kept_scores}


@lru_cache(maxsize=65536)     # pure; every memory reading of a stage asks for the same layer
def layer_activation_bytes(model: ModelSpec, tp: int, micro_batch_size: int, recompute: str, *,
                           sequence_parallel: bool, seq_length: int | None = None, dtype_bytes: int = 2,
                           impl: LayerImpl = TRANSFORMER_ENGINE, hidden_dropout: float = 0.0,
                           attention_dropout: float = 0.0) -> float:
    """Bytes one layer keeps for one micro-batch between its forward and its backward. 'selective' re-runs the
    MLP in the backward pass and keeps the checkpoint's input: the second norm's output where that norm runs
    before the MLP (the local spec), its input where it runs inside fc1 (Transformer Engine's spec:
    `impl.pre_mlp_norm_in_fc1`), so there the norm's output, one of the four norm tensors, is recomputed too;
    'full' keeps the layer's input. The dropouts are the mesh's settings (plan/settings.py; 0 = off, the
    default)."""
    p = _layer_parts(model, micro_batch_size, seq_length or model.seq_length, dtype_bytes, impl, hidden_dropout,
                     attention_dropout, tp)
    rep_tp = tp if sequence_parallel else 1
    if recompute == "full":
        return p["input"] / rep_tp + impl.checkpoint_bytes
    rep = p["rep"] - (p["input"] if recompute == "selective" and impl.pre_mlp_norm_in_fc1 else 0.0)
    kept = rep / rep_tp + p["attn"] / tp + p["fixed"]
    return kept + (p["mlp"] / tp if recompute == "none" else 0.0)


@lru_cache(maxsize=65536)     # pure; every memory reading of a stage asks for the same layer
def recompute_buffer_bytes(model: ModelSpec, tp: int, micro_batch_size: int, recompute: str, *,
                           sequence_parallel: bool, seq_length: int | None = None, dtype_bytes: int = 2,
                           impl: LayerImpl = TRANSFORMER_ENGINE, hidden_dropout: float = 0.0,
                           attention_dropout: float = 0.0) -> float:
    """What recomputation materialises again during the backward pass, one layer at a time: the whole layer
    ('full') or its MLP ('selective'; with the second norm's output where that norm runs inside fc1); 0 without
    recomputation. 'full' less the layer's input: the first norm
    keeps the very storage the checkpoint keeps (Megatron's CheckpointFunction re-runs the layer on a detached
    view of its saved input), which layer_activation_bytes('full') counts already."""
    if recompute == "none":
        return 0.0
    kw = dict(sequence_parallel=sequence_parallel, seq_length=seq_length, dtype_bytes=dtype_bytes, impl=impl,
              hidden_dropout=hidden_dropout, attention_dropout=attention_dropout)
    full = layer_activation_bytes(model, tp, micro_batch_size, "none", **kw)
    if recompute == "full":     # (the backward's own checkpoint bytes while it re-runs the layer)
        return full - layer_activation_bytes(model, tp, micro_batch_size, "full", **kw) + 2 * impl.checkpoint_bytes
    return full - layer_activation_bytes(model, tp, micro_batch_size, "selective", **kw)


@lru_cache(maxsize=65536)     # pure; every memory reading of a stage asks for the same layer
def attention_backward_bytes(model: ModelSpec, tp: int, micro_batch_size: int, recompute: str, *,
                             sequence_parallel: bool, seq_length: int | None = None, dtype_bytes: int = 2,
                             impl: LayerImpl = TRANSFORMER_ENGINE, hidden_dropout: float = 0.0,
                             attention_dropout: float = 0.0) -> float:
    """What one layer's unfused attention backward holds at its peak beyond what the stage's count has for that
    layer (its kept activations, and under recomputation the recompute buffer): `impl.score_grad_tensors` s x s
    tensors, less the s x s ones the layer kept (the softmax output, the attention dropout's mask and output: freed
    once the score GEMM's and the softmax's backward nodes have run) and less the MLP's (its backward runs first;
    under 'selective' the recomputed MLP, the recompute buffer). 0 where it holds no more, or not priced (flash)."""
    if not impl.score_grad_tensors:
        return 0.0
    s = seq_length or model.seq_length
    p = _layer_parts(model, micro_batch_size, s, dtype_bytes, impl, hidden_dropout, attention_dropout, tp)
    if recompute == "selective":
        freed = recompute_buffer_bytes(model, tp, micro_batch_size, recompute, sequence_parallel=sequence_parallel,
                                       seq_length=s, dtype_bytes=dtype_bytes, impl=impl,
                                       hidden_dropout=hidden_dropout, attention_dropout=attention_dropout)
    else:
        freed = p["mlp"] / tp
    return max(0.0, (impl.score_grad_tensors * p["scores"] - p["kept_scores"]) / tp - freed)


def score_buffer_bytes(model: ModelSpec, tp: int, micro_batch_size: int, *, seq_length: int | None = None,
                       dtype_bytes: int = 2, impl: LayerImpl = TRANSFORMER_ENGINE) -> float:
    """The global memory buffer Megatron's local attention allocates for the score GEMM's input (`impl.score_buffer`):
    one b x heads/TP x s x s tensor per rank, kept from the first forward on; 0 for other layers."""
    if not impl.score_buffer or impl.flash_attention:
        return 0.0
    s = seq_length or model.seq_length
    return model.num_attention_heads * s * s * micro_batch_size * dtype_bytes / tp
