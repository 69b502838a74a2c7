"""Memory per device of one pipeline stage under the runtime settings that run (plan/settings.py).

Everything here is priced with the mesh's `RuntimeSettings` (passed in; this module does not choose them) and
the element size of the job's precision (`dtype_bytes`). What a stage holds per parameter (weights, gradient
buffer, optimizer state) is cost/model_state.py; this module adds the activations and the runtime's overheads.

Activations: what each layer keeps for its backward pass per micro-batch (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", generalised to GQA and gated MLPs), for the layers that
run (`LayerImpl`: Transformer Engine by default, flash attention so no s^2 score matrix; the dry run's local
spec of torch modules keeps more, `DRY_RUN_IMPL`); see `_layer_parts`. The parts outside the tensor-parallel
regions (the norms' inputs and outputs, the dropout masks: Korthikanti's 10sbh of 34sbh) are divided by TP
only under sequence parallelism; without it every TP rank holds them in full, Table 2's sbh(10 + 24/t).
Recompute 'selective' re-runs the MLP and keeps its input; 'full' keeps each layer's input; either
re-materialises one layer (or MLP) at a time in the backward pass. Under 1F1B stage i of p holds
min(p - i, m) micro-batches in flight, more before an overlapped cross-cluster boundary (its warm-up depth,
plan/pipeline.py). tests/test_memory_dryrun.py checks every stage of real dry runs (TP 1/2, DP 1/2, every
recompute mode, the production settings) against what the ranks hold, measured (runtime/memory_meter.py).

Beyond the tensors, a real job holds its runtime's context, the collective library's buffers, workspaces and
the allocator's fragmentation (spec/overheads.py): a cluster's measured figures when its inventory entry gives
them (`overheads:`, from `hetauto profile --overheads`), else `RUNTIME_OVERHEADS` per vendor (docs/cost-model.md
gives each constant's basis).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..spec.model import ModelSpec
from ..spec.overheads import GIB, RuntimeOverhead, vendor_overhead
from .deepspeed_state import (deepspeed_held_at_reduction, deepspeed_padding_elements, deepspeed_reduction_terms,
                              largest_param_tensor)
from .model_state import (FP32, precision_of, state_bytes_at_reduction, state_bytes_at_step_per_param,
                          state_bytes_per_element, state_counts, state_fixed_bytes, state_padding_per_element)
from .pipe_buffers import NONE as NO_PIPE_BUFFERS, deepspeed_pipe_buffers
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
    fused_glu: bool = True         # Megatron's unfused GLU adds its linear offset (0) to the linear half: one
                                   # more s*b*f tensor
    dropout_mask_bytes: int | None = 1   # what a dropout keeps per element when the settings turn it on
                                   # (settings.hidden_dropout / attention_dropout > 0; at 0 PyTorch keeps nothing):
                                   # a 1-byte mask from the fused kernel on accelerators; None = the element size:
                                   # on CPU PyTorch draws the mask as a tensor of the input's dtype
    kv_repeated: bool = False      # with flash attention and GQA: K and V repeated to every head before a kernel
                                   # that takes no grouped K and V (the memory-efficient one), kept at the query's
                                   # width
    grouped_kv_max_head_dim: int | None = None   # K and V taken grouped only up to this head dim (repeated
                                   # above it, as kv_repeated); None: at any head dim
    checkpoint_bytes: int = 0      # what a full recomputation's checkpoint keeps in the device's memory beside the
                                   # layer's input, per layer and micro-batch; its backward holds as much again while
                                   # it re-runs the layer (DeepSpeed's on CPU: two RNG states, below)


TRANSFORMER_ENGINE = LayerImpl()
# Transformer Engine in fp32: its fused attention backends take 16-bit inputs only, so it runs its unfused
# attention, which keeps the s x s softmax output (plan/settings.py ENGINES, RuntimeSettings.fused_attention).
TRANSFORMER_ENGINE_UNFUSED_ATTENTION = LayerImpl(flash_attention=False)
# What the dry run builds (runtime/model.py): Megatron's local spec (torch attention, torch norms, unfused rope
# and GLU) on CPU processes.
DRY_RUN_IMPL = LayerImpl(flash_attention=False, fused_norm=False, fused_rope=False, fused_glu=False,
                         dropout_mask_bytes=None)


def _mask_bytes(impl: LayerImpl, E: int) -> int:
    return E if impl.dropout_mask_bytes is None else impl.dropout_mask_bytes


def _layer_parts(model: ModelSpec, b: int, s: int, E: int, impl: LayerImpl, hidden_dropout: float,
                 attention_dropout: float) -> dict[str, float]:
    """Bytes one layer keeps for one micro-batch, by how TP divides them (element size E):
    rep     outside the TP regions: divided by TP only under sequence parallelism. The two norms' inputs and
            outputs (each output is the next linear's input: QKV, MLP), their fp32 row statistics, the
            composite RMSNorm's normalised input, the hidden-dropout masks after attention and MLP
    attn    inside TP: Q, K and V (GQA width with flash attention, repeated to every head without), the
            context (projection input); unfused: the softmax output (+ the attention dropout's mask and output)
    mlp     inside TP: fc1 output (2f gated: gate and up), activation output, product (gated); Megatron's
            unfused GLU offset add
    fixed   not divided by TP nor by the micro-batch: unfused rope's cos/sin for Q and K"""
    h, f, a = model.hidden_size, model.ffn_hidden_size, model.num_attention_heads
    sbh, sbf = s * b * h, s * b * f
    composite_norm = not impl.fused_norm and model.gated_mlp      # gated models run RMSNorm (runtime/model.py)
    # fused norms keep a per-row fp32 statistic too; Korthikanti's count leaves it out (h/4 times smaller
    # than one norm's input): counted where it was measured, the torch norms of the dry run
    stats = 0 if impl.fused_norm else 2 * FP32 * s * b
    mask = _mask_bytes(impl, E)
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
        attn += 2 * sbh * E + scores * E + (scores * (E + mask) if attention_dropout else 0)
        if model.num_query_groups == a and model.position_embedding == "rope" and not impl.fused_rope:
            # without GQA Megatron's local attention repeats nothing: V stays a view of the fused QKV output,
            # so that whole tensor (h + 2 kv wide) is kept beside the rotated Q and K: s b (3 kv - h) more
            attn += s * b * (3 * model.kv_hidden - h) * E
    mlp = (4 if model.gated_mlp else 2) * sbf * E + (sbf * E if model.gated_mlp and not impl.fused_glu else 0)
    fixed = 4 * s * model.head_dim * E if model.position_embedding == "rope" and not impl.fused_rope else 0
    return {"rep": rep, "attn": attn, "mlp": mlp, "fixed": fixed, "input": sbh * E}


@lru_cache(maxsize=65536)     # pure; every memory reading of a stage asks for the same layer
def layer_activation_bytes(model: ModelSpec, tp: int, micro_batch_size: int, recompute: str, *,
                           sequence_parallel: bool, seq_length: int | None = None, dtype_bytes: int = 2,
                           impl: LayerImpl = TRANSFORMER_ENGINE, hidden_dropout: float = 0.0,
                           attention_dropout: float = 0.0) -> float:
    """Bytes one layer keeps for one micro-batch between its forward and its backward. 'selective' re-runs the
    MLP in the backward pass (its input, the second norm's output, stays), 'full' keeps the layer's input.
    The dropouts are the mesh's settings (plan/settings.py; 0 = off, the default)."""
    p = _layer_parts(model, micro_batch_size, seq_length or model.seq_length, dtype_bytes, impl, hidden_dropout,
                     attention_dropout)
    rep_tp = tp if sequence_parallel else 1
    if recompute == "full":
        return p["input"] / rep_tp + impl.checkpoint_bytes
    kept = p["rep"] / rep_tp + p["attn"] / tp + p["fixed"]
    return kept + (p["mlp"] / tp if recompute == "none" else 0.0)


@lru_cache(maxsize=65536)     # pure; every memory reading of a stage asks for the same layer
def recompute_buffer_bytes(model: ModelSpec, tp: int, micro_batch_size: int, recompute: str, *,
                           sequence_parallel: bool, seq_length: int | None = None, dtype_bytes: int = 2,
                           impl: LayerImpl = TRANSFORMER_ENGINE, hidden_dropout: float = 0.0,
                           attention_dropout: float = 0.0) -> float:
    """What recomputation materialises again during the backward pass, one layer at a time: the whole layer
    ('full') or its MLP ('selective'); 0 without recomputation. 'full' less the layer's input: the first norm
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


def stage_params(model: ModelSpec, tp: int, layers: int, first: bool, last: bool) -> float:
    """Parameters one device of a stage holds. Linear weights (and the column-parallel biases) and the vocabulary
    are split over TP; norms, the row-parallel biases and a learned position table are replicated on every TP rank
    (Megatron-Core's layout). With tied embeddings the
    last stage keeps its own copy of the table, except when it is also the first stage."""
    return _params(_param_terms(model, tp, first, last), layers)


@lru_cache(maxsize=65536)     # pure; every new stage configuration of a search asks for one of a few
def _param_terms(model: ModelSpec, tp: int, first: bool, last: bool) -> tuple:
    """stage_params' terms that do not depend on the layer count: (parameters per layer, what the first and the
    last stage add, in the order they are added)."""
    h = model.hidden_size
    whole = model.layer_replicated_params            # the norms and the row-parallel biases
    adds = []
    if first:
        pos = model.embedding_params - model.vocab_size * h
        adds.append(model.vocab_size * h / tp + pos)
    if last:
        adds.append(model.norm_params)                # the final norm
        if model.output_layer and not (first and model.tie_embeddings):
            adds.append(model.vocab_size * h / tp)     # the output head (or the tied table's copy)
    return (model.layer_params - whole) / tp + whole, tuple(adds)


def _params(terms: tuple, layers: int) -> float:
    params = layers * terms[0]
    for add in terms[1]:
        params += add
    return params


@lru_cache(maxsize=65536)     # pure; a stage configuration's every memory reading asks for the same terms
def _stage_terms(model: ModelSpec, tp: int, dp: int, b: int, recompute: str, first: bool, last: bool, settings,
                 seq_length: int | None, E: int, impl: LayerImpl, precision: str | None = None) -> tuple:
    """stage_memory_bytes' terms that do not depend on the layer count, the in-flight count or the buffers: (bytes per
    element of the state as (key, value) pairs (state_bytes_per_element), the fixed state bytes as (key, value)
    pairs (state_fixed_bytes), the bytes per parameter at the optimizer's step as pairs
    (state_bytes_at_step_per_param; empty: the same set), (DP, the bytes per element of DeepSpeed's flat-buffer
    padding held and at the step as pairs: state_padding_per_element; empty: none), one layer's kept activations per
    micro-batch, the recompute buffer, the first stage's bytes per micro-batch in flight, the last stage's head and
    logits gradient, the pipe buffers of an engine that keeps them: settings.pipe_buffers, cost/pipe_buffers.py;
    what the last stage's previous micro-batch keeps per layer under that engine; the state held at the gradient
    reduction as (its terms, the largest parameter tensor), or None: state_bytes_at_reduction)."""
    sp = settings.sequence_parallel
    per = tuple(state_bytes_per_element(E, dp, settings, precision).items())
    fixed = tuple(state_fixed_bytes(E, settings, precision).items())
    at_step = tuple((state_bytes_at_step_per_param(E, dp, settings, precision) or {}).items())
    # DeepSpeed's flat-buffer padding, bytes per padding element: held through the micro-batches, at the step
    padding = (dp, tuple(state_padding_per_element(E, dp, settings, precision).items()),
               tuple(state_padding_per_element(E, dp, settings, precision, at_step=True).items()))
    reduction = None
    if settings.optimizer_state == "deepspeed":
        reduction = (deepspeed_reduction_terms(precision_of(E, precision), dp, settings),
                     largest_param_tensor(model, tp, first, last))
    s = seq_length or model.seq_length
    kw = dict(sequence_parallel=sp, seq_length=s, dtype_bytes=E, impl=impl, hidden_dropout=settings.hidden_dropout,
              attention_dropout=settings.attention_dropout)
    act = layer_activation_bytes(model, tp, b, recompute, **kw)
    buffer = recompute_buffer_bytes(model, tp, b, recompute, **kw)
    rep_tp = tp if sp else 1
    first_saved = head = logits_grad = 0.0
    if first:
        mask = _mask_bytes(impl, E) if settings.hidden_dropout else 0
        first_saved = 8 * s * b + s * b * model.hidden_size * mask / rep_tp
    if last:
        # the final norm (as a layer's norms: input, output, statistic, the composite's normalised input), the
        # labels (int64), and the fp32 softmax the vocabulary-parallel cross entropy keeps, split over TP by
        # vocabulary; one micro-batch at a time (the last stage runs each backward right after its forward).
        # Without an output layer the loss reads the norm's output itself, which the norm does not keep (its
        # input does), and the softmax is over that output (model.logits_width)
        kept = 2 if model.output_layer else 1
        norm = (kept + (1 if not impl.fused_norm and model.gated_mlp else 0)) * s * b * model.hidden_size * E \
            + (0 if impl.fused_norm else FP32 * s * b)
        head = norm / rep_tp + 8 * s * b + FP32 * s * b * model.logits_width(tp)
        logits_grad = FP32 * s * b * model.logits_width(tp)     # formed in the head's backward pass
    pipe = NO_PIPE_BUFFERS
    previous = 0.0
    if settings.pipe_buffers:                         # DeepSpeed's engine (plan/settings.py ENGINES)
        pipe = deepspeed_pipe_buffers(tp, s * b * model.hidden_size * E, s * b * model.logits_width(tp) * E,
                                      first, last)
        if last and recompute == "full":
            # the previous micro-batch's graph, which the last stage's logits slot keeps (cost/pipe_buffers.py),
            # keeps its checkpoints' own bytes (not their inputs), per layer
            previous = impl.checkpoint_bytes
    return per, fixed, at_step, padding, act, buffer, first_saved, head, logits_grad, pipe, previous, reduction


def _configuration(model: ModelSpec, tp: int, dp: int, b: int, recompute: str, first: bool, last: bool, settings,
                   vendor: str, seq_length: int | None, E: int, impl: LayerImpl,
                   overhead: RuntimeOverhead | None, gradient_reduction: bool = True,
                   precision: str | None = None) -> tuple:
    """What every reading of one stage configuration shares (`_reading`'s first argument): the parameters' terms
    (stage_params), first, last, _stage_terms' terms (without the gradient reduction's unless
    `gradient_reduction`), the bytes of one boundary tensor, the runtime overhead, the elements of its state by
    layer count (model_state.state_counts)."""
    terms = _stage_terms(model, tp, dp, b, recompute, first, last, settings, seq_length, E, impl, precision)
    if not gradient_reduction:
        terms = terms[:-1] + (None,)
    ddp = state_counts(settings, model, tp, dp, first, last)
    # a boundary tensor is this rank's piece: split over TP by sequence under sequence parallelism (Megatron's
    # p2p tensor shape is (s / t, b, h) then)
    tensor = E * (seq_length or model.seq_length) * b * model.hidden_size / (tp if settings.sequence_parallel else 1)
    return (_param_terms(model, tp, first, last), first, last, *terms, tensor, overhead or vendor_overhead(vendor),
            ddp)


def _reading(cfg: tuple, layers: int, in_flight: int, boundary_buffers: int) -> tuple:
    """stage_memory_bytes without its dict: (params, the state held as (bytes per element, elements per part or None:
    per parameter, fixed bytes, DeepSpeed's flat-buffer padding bytes per part), state, activations kept,
    activations, reserved, pipe buffers, gradient reduction) of a configuration (`_configuration`) holding `layers`,
    `in_flight` micro-batches and `boundary_buffers` boundary tensors. The search reads only the total, many
    thousand times (stage_memory_reader, job_stage_memory_reader)."""
    (params_terms, first, last, per, fixed, at_step, (dp, pad_held, pad_step), act, buffer, first_saved, head,
     logits_grad, pipe, previous, reduction, tensor, overhead, ddp) = cfg
    params = _params(params_terms, layers)
    counts = None if ddp is None else ddp(layers)    # None: every part per parameter
    if counts is None:
        state = sum([params * v for _, v in per])    # (the order stage_memory_bytes' dict sums in)
    else:
        state = sum([counts[k] * v for k, v in per])
    # DeepSpeed's flat buffer padded to a multiple of 2 x DP (cost/deepspeed_state.py deepspeed_padding_elements)
    pad = deepspeed_padding_elements(params, dp) if pad_held else 0
    if pad_held:
        pad_held = tuple((k, pad * v) for k, v in pad_held)
        state += sum(v for _, v in pad_held)
    held = (per, counts, fixed, pad_held)
    if fixed:
        state += sum(v for _, v in fixed)
    if at_step:                                      # a different set while the optimizer steps: the larger
        stepping = sum([params * v for _, v in at_step])
        if pad_step:
            pad_step = tuple((k, pad * v) for k, v in pad_step)
            stepping += sum(v for _, v in pad_step)
        if stepping > state:
            state, held = stepping, (at_step, None, (), pad_step)
    saved = in_flight * layers * act + layers * previous
    # Recomputation re-materialises one layer (or its MLP) at a time in the backward pass; on the last stage
    # that happens after the head's backward has freed the logits, so the two do not add (max below)
    buffer = buffer if layers else 0.0
    if first:   # the token ids (int64) the embedding keeps, and its dropout mask
        saved += in_flight * first_saved
    workspace = 0.0     # transient: not kept for a backward pass, but allocated at the peak
    if last:
        saved += max(head, buffer)
        workspace = max(head + logits_grad, buffer) - max(head, buffer)
    else:
        saved += buffer
    saved += boundary_buffers * tensor
    pipe_kept = in_flight * pipe.per_in_flight + pipe.fixed       # 0 unless the engine keeps pipe buffers
    saved += pipe_kept
    workspace += pipe.workspace
    acts = saved + workspace
    # The third candidate for the peak: the state held while the gradient reduction after the last backward
    # runs, with its buffers, when the activations are gone (state_bytes_at_reduction): what it holds above the
    # state and activations of the other two, 0 when they hold more
    above = 0.0
    if reduction is not None:
        above = max(0.0, deepspeed_held_at_reduction(*reduction, params) - (state + acts))
    reserved = overhead.bytes(state + acts + above)
    return params, held, state, saved, acts, reserved, pipe_kept + pipe.workspace, above


def stage_memory_reader(model: ModelSpec, *, tp: int, dp: int, micro_batch_size: int, recompute: str, first: bool,
                        last: bool, settings, vendor: str = "nvidia", seq_length: int | None = None,
                        dtype_bytes: int = 2, impl: LayerImpl = TRANSFORMER_ENGINE,
                        overhead: RuntimeOverhead | None = None, precision: str | None = None):
    """stage_memory_bytes(...)["total"] of one stage configuration as a function of (layers, in_flight,
    boundary_buffers), the same floats, with the configuration's terms looked up once: the search's memory caps
    (plan/memory_caps.py) read each configuration several times."""
    cfg = _configuration(model, tp, dp, micro_batch_size, recompute, first, last, settings, vendor, seq_length,
                         dtype_bytes, impl, overhead, precision=precision)

    def total(layers: int, in_flight: int, boundary_buffers: int = 0) -> float:
        _, _, state, _, acts, reserved, _, above = _reading(cfg, layers, in_flight, boundary_buffers)
        return state + acts + above + reserved
    return total


def stage_memory_bytes(model: ModelSpec, *, layers: int, tp: int, dp: int, micro_batch_size: int,
                       recompute: str, in_flight: int, first: bool, last: bool, settings, vendor: str = "nvidia",
                       seq_length: int | None = None, dtype_bytes: int = 2,
                       boundary_buffers: int = 0, impl: LayerImpl = TRANSFORMER_ENGINE,
                       overhead: RuntimeOverhead | None = None, precision: str | None = None) -> dict[str, float]:
    """Bytes on the busiest device of a stage; keys: params, weights, gradients, optimizer,
    weights_grads_optimizer, activations, reserved, total. `model.vocab_size` is the padded vocabulary that
    runs (plan.settings.padded_vocab_size); `settings` the mesh's RuntimeSettings (sequence parallelism, the
    optimizer's sharding, the gradient buffer's dtype and the dropouts are read from it). boundary_buffers: whole
    (sequence x micro-batch x hidden) tensors the stage holds for an overlapped cross-cluster boundary beyond its
    activations: the messages it has received ahead (plan/pipeline.py `boundary_buffers` counts them; not the one
    it runs on, its input, which the activations count). `overhead`: the device's
    measured runtime overheads (the inventory cluster's); None: the vendor's estimates. `pipe_buffers`: what
    DeepSpeed's pipeline engine keeps (included in the activations; 0 under the Megatron engine).
    `gradient_reduction`: what the state held while DeepSpeed's gradient reduction runs, with its buffers, exceeds
    the state and activations (state_bytes_at_reduction; 0 when it does not, and under the Megatron engine).
    `precision`: the training precision (precision_of: None = what dtype_bytes implies), which only DeepSpeed's
    optimizers read (fp16 and bf16 build different ones)."""
    cfg = _configuration(model, tp, dp, micro_batch_size, recompute, first, last, settings, vendor, seq_length,
                         dtype_bytes, impl, overhead, precision=precision)
    return _stage_dict(cfg, layers, in_flight, boundary_buffers)


def _stage_dict(cfg: tuple, layers: int, in_flight: int, boundary_buffers: int) -> dict[str, float]:
    """stage_memory_bytes' dict of a configuration (`_configuration`)."""
    params, (per, counts, fixed, padding), state, saved, acts, reserved, pipe, above = _reading(
        cfg, layers, in_flight, boundary_buffers)
    parts = {k: (params if counts is None else counts[k]) * v for k, v in per}
    for k, v in fixed + padding:
        parts[k] += v
    return {"params": params, **parts, "weights_grads_optimizer": state, "activations": acts,
            "activations_saved": saved, "pipe_buffers": pipe, "gradient_reduction": above, "reserved": reserved,
            "total": state + acts + above + reserved}


# ---- a job another framework runs ------------------------------------------------------------------------
@dataclass(frozen=True)
class JobMemory:
    """How another framework's job holds memory, for planning a job that must also fit as that framework runs it
    (`hetauto plan --memory-job`, docs/peers.md). Every figure is a documented fact of that framework, never
    fitted to a measurement.
      settings           the runtime settings the job runs with (optimizer sharding, sequence parallelism)
      impl               how its layers keep activations
      dtype_bytes        the element size of its parameters and activations
      extra_bytes_per_param   what the framework keeps per parameter beyond weights, gradients and Adam state
    The fixed per-process reserve stays ours (spec/overheads.py)."""
    name: str
    settings: object                # a plan.settings.RuntimeSettings (cost/ does not import plan/)
    impl: LayerImpl
    dtype_bytes: int
    extra_bytes_per_param: float


def job_stage_memory_bytes(job: JobMemory, model: ModelSpec, *, layers: int, tp: int, dp: int, micro_batch_size: int,
                           recompute: str, in_flight: int, first: bool, last: bool, vendor: str = "nvidia",
                           seq_length: int | None = None, overhead: RuntimeOverhead | None = None) -> dict[str, float]:
    """stage_memory_bytes of the same stage as `job` runs it, plus the framework's bytes per parameter. These
    replace our engine's gradient-reduction transient: Sailor's job counts its gradient communication buffer among
    them, held throughout, which is what that transient is (docs/peers.md)."""
    cfg = _configuration(model, tp, dp, micro_batch_size, recompute, first, last, job.settings, vendor, seq_length,
                         job.dtype_bytes, job.impl, overhead, gradient_reduction=False)
    b = _stage_dict(cfg, layers, in_flight, 0)
    extra = job.extra_bytes_per_param * b["params"]
    return {**b, "framework": extra, "total": b["total"] + extra}


def job_stage_memory_reader(job: JobMemory, model: ModelSpec, *, tp: int, dp: int, micro_batch_size: int,
                            recompute: str, first: bool, last: bool, vendor: str = "nvidia",
                            seq_length: int | None = None, overhead: RuntimeOverhead | None = None):
    """job_stage_memory_bytes(...)["total"] of one stage configuration as a function of (layers, in_flight,
    boundary_buffers: ignored, as there), the same floats (stage_memory_reader's reason)."""
    cfg = _configuration(model, tp, dp, micro_batch_size, recompute, first, last, job.settings, vendor, seq_length,
                         job.dtype_bytes, job.impl, overhead, gradient_reduction=False)
    extra = job.extra_bytes_per_param

    def total(layers: int, in_flight: int, boundary_buffers: int = 0) -> float:
        params, _, state, _, acts, reserved, _, above = _reading(cfg, layers, in_flight, 0)
        return state + acts + above + reserved + extra * params
    return total
