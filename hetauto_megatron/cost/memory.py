"""Memory per device of one pipeline stage under the runtime settings that run (plan/settings.py).

Everything here is priced with the mesh's `RuntimeSettings` (passed in; this module does not choose them) and
the element size of the job's precision (`dtype_bytes`). What a stage holds per parameter (weights, gradient
buffer, optimizer state) is cost/model_state.py; what one layer keeps for its backward pass per micro-batch is
cost/activations.py; this module sums a stage: its parameters, the activations of its layers and micro-batches in
flight, unfused attention's backward gradients and score buffer (cost/activations.py), the first and last stages'
extras (token ids, the loss's tensors over the logits: `cross_entropy_bytes`),
in fp8 Transformer Engine's fp8 copies of the GEMM weights, DeepSpeed's pipe buffers and the runtime's
overheads. The state held through the micro-batches is summed with the activations; what only the gradient
reduction after the last backward or the optimizer's step holds (cost/model_state.py) is a candidate for the peak of
its own, once the activations are gone. Under 1F1B stage i of p holds min(p - i, m) micro-batches in flight, more
before an overlapped cross-cluster boundary (its warm-up depth, plan/pipeline.py). tests/test_memory_dryrun.py
checks every stage of real dry runs (TP 1/2, DP 1/2, every recompute mode, the production settings) against what
the ranks hold, measured (runtime/memory_meter.py).

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
from .activations import (TRANSFORMER_ENGINE, LayerImpl, attention_backward_bytes, layer_activation_bytes, mask_bytes,
                          recompute_buffer_bytes, score_buffer_bytes)
from .deepspeed_state import (deepspeed_held_at_reduction_pieces, deepspeed_padding_elements,
                              deepspeed_reduction_terms, largest_param_tensor, stage_param_tensors)
from .model_state import (FP32, FP8_WEIGHT_COPY_BYTES, precision_of, state_bytes_at_step_per_param,
                          state_bytes_per_element, state_counts, state_fixed_bytes, state_fixed_bytes_at_step,
                          state_padding_per_element)
from .pipe_buffers import NONE as NO_PIPE_BUFFERS, deepspeed_pipe_buffers


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


def cross_entropy_bytes(loss: str, dtype_bytes: int) -> tuple[float, float]:
    """Bytes per element of the loss's input (the logits on one TP rank) that the engine's cross entropy keeps from
    its forward to its backward, and what it holds beyond that at its peaks (the same in the forward and the
    backward), at element size `dtype_bytes`. Megatron-Core's vocabulary-parallel loss ("vocab_parallel",
    core/tensor_parallel/cross_entropy.py; hetauto emits no --cross-entropy-loss-fusion) turns the logits to fp32
    (`.float()`: a copy beside the 16-bit logits, which the model's forward holds until the loss returns; in fp32
    the logits themselves), then works in place into the softmax it keeps (4 bytes), and its backward writes the
    gradient into that softmax in place, which autograd casts back to a 16-bit gradient beside it: 4 kept, the
    element size more at either peak in 16 bits, nothing more in fp32. torch's F.cross_entropy ("torch", DeepSpeed's
    engine): the fp32 log-softmax kept and a gradient of its size formed in the backward."""
    if loss == "vocab_parallel":
        return float(FP32), float(dtype_bytes if dtype_bytes < FP32 else 0)
    return float(FP32), float(FP32)


@lru_cache(maxsize=65536)     # pure; a stage configuration's every memory reading asks for the same terms
def _stage_terms(model: ModelSpec, tp: int, dp: int, b: int, recompute: str, first: bool, last: bool, settings,
                 seq_length: int | None, E: int, impl: LayerImpl, precision: str | None = None) -> tuple:
    """stage_memory_bytes' terms that do not depend on the layer count, the in-flight count or the buffers: (bytes per
    element of the state as (key, value) pairs (state_bytes_per_element), the fixed state bytes as (key, value)
    pairs (state_fixed_bytes), the state at the optimizer's step as (bytes per element as pairs:
    state_bytes_at_step_per_param, (E, settings, precision, the stage's largest tensors) for the bytes of its
    straddling tensors: state_fixed_bytes_at_step; empty: the same set), (DP, the bytes per element of
    DeepSpeed's flat-buffer padding held and at the step as pairs: state_padding_per_element; empty: none), one
    layer's kept activations per micro-batch, (the recompute buffer, a layer's attention backward transients beyond
    its count, the local attention's score buffer), the first stage's bytes per micro-batch in
    flight, the last stage's head and logits gradient, the pipe buffers of an engine that keeps them:
    settings.pipe_buffers, cost/pipe_buffers.py; what the last stage's previous micro-batch keeps per layer under
    that engine; the fp8 weight copies per layer (0 outside fp8); the state held at the gradient reduction as (its
    terms, the largest parameter tensor), or None: state_bytes_at_reduction)."""
    sp = settings.sequence_parallel
    per = tuple(state_bytes_per_element(E, dp, settings, precision).items())
    fixed = tuple(state_fixed_bytes(E, settings, precision).items())
    at_step = tuple((state_bytes_at_step_per_param(E, dp, settings, precision) or {}).items())
    if at_step:     # with the whole gradients of the tensors straddling the rank's partition boundaries
        at_step = (at_step, (E, settings, precision, stage_param_tensors(model, tp, first, last)))
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
    # unfused attention's backward transients on top of a layer's count, and Megatron's local attention's score
    # buffer, held for the run (cost/activations.py)
    backward = (attention_backward_bytes(model, tp, b, recompute, **kw),
                score_buffer_bytes(model, tp, b, seq_length=s, dtype_bytes=E, impl=impl))
    rep_tp = tp if sp else 1
    first_saved = head = logits_grad = 0.0
    if first:
        # the token ids (int64) the embedding keeps, and its dropout mask; with learned positions their ids (int64,
        # LayerImpl.position_ids_per_sample); at TP > 1 the bool mask with which Megatron's vocabulary-parallel
        # embedding zeroes the rows of the ids outside its part, which the backward of that fill keeps (Megatron-Core
        # tensor_parallel/layers.py VocabParallelEmbedding.forward: output_parallel[input_mask, :] = 0.0)
        mask = mask_bytes(impl, E) if settings.hidden_dropout else 0
        positions = 8 * s * (b if impl.position_ids_per_sample else 1) if model.position_embedding == "learned" else 0
        first_saved = 8 * s * b + positions + (s * b if tp > 1 else 0) + s * b * model.hidden_size * mask / rep_tp
    if last:
        # the final norm (as a layer's norms: input, output, statistic, the composite's normalised input), the
        # labels (int64), and what the cross entropy keeps over the logits (cross_entropy_bytes: the fp32
        # softmax), split over TP by vocabulary; one micro-batch at a time (the last stage runs each backward right
        # after its forward). Without an output layer the loss reads the norm's output itself, which the norm does
        # not keep (its input does), and the softmax is over that output (model.logits_width)
        kept = 2 if model.output_layer else 1
        norm = (kept + (1 if not impl.fused_norm and model.gated_mlp else 0)) * s * b * model.hidden_size * E \
            + (0 if impl.fused_norm else FP32 * s * b)
        loss_kept, loss_peak = cross_entropy_bytes(settings.loss, E)
        head = norm / rep_tp + 8 * s * b + loss_kept * s * b * model.logits_width(tp)
        logits_grad = loss_peak * s * b * model.logits_width(tp)     # beside it at its peaks, not kept
    pipe = NO_PIPE_BUFFERS
    previous = 0.0
    if settings.pipe_buffers:                         # DeepSpeed's engine (plan/engines.py ENGINES)
        pipe = deepspeed_pipe_buffers(tp, s * b * model.hidden_size * E, s * b * model.logits_width(tp) * E,
                                      first, last)
        if last and recompute == "full":
            # the previous micro-batch's graph, which the last stage's logits slot keeps (cost/pipe_buffers.py),
            # keeps its checkpoints' own bytes (not their inputs), per layer
            previous = impl.checkpoint_bytes
    # fp8: Transformer Engine's fp8 copies of each layer's GEMM weights (their TP shard), kept for the whole run
    fp8_copies = FP8_WEIGHT_COPY_BYTES * model.layer_linear_weights / tp if precision == "fp8" else 0.0
    return per, fixed, at_step, padding, act, (buffer, *backward), first_saved, head, logits_grad, pipe, previous, \
        fp8_copies, reduction


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
    """stage_memory_bytes without its dict: (params, the state held through the micro-batches as (bytes per element,
    elements per part or None: per parameter, fixed bytes, DeepSpeed's flat-buffer padding bytes per part), state,
    activations kept, activations, reserved, pipe buffers, gradient reduction, optimizer step, the state at the
    step, fp8 weight copies: in the state, the candidates for the peak) of a configuration (`_configuration`)
    holding `layers`, `in_flight` micro-batches and `boundary_buffers` boundary tensors. The peak is state +
    activations + gradient reduction + optimizer step, the largest of the candidates: (state + activations,), the
    pieces of the state at the gradient reduction (the smallest of them: deepspeed_held_at_reduction_pieces; none
    without a reduction), (the state at the step,), the last two each + what DeepSpeed's engine holds then; each
    piece affine in the layers, the in-flight count and the buffers (but for DeepSpeed's few padding elements and
    straddling tensors), their largest not. The search reads only the peak or the candidates, many thousand times
    (stage_memory_reader, job_stage_memory_reader, stage_memory_candidates_reader)."""
    (params_terms, first, last, per, fixed, at_step, (dp, pad_held, pad_step), act, (buffer, backward, scratch),
     first_saved, head,
     logits_grad, pipe, previous, fp8_copies, reduction, tensor, overhead, ddp) = cfg
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
    fp8 = layers * fp8_copies       # held through the micro-batches and the step alike
    state += fp8
    stepping = state
    if at_step:                                      # a different set while the optimizer steps
        step_per, (E, step_settings, precision, tensors) = at_step
        # the straddling tensors' gradients: which can cross a boundary depends on the partition's size
        step_fixed = tuple(state_fixed_bytes_at_step(E, dp, step_settings, params, tensors, precision).items())
        stepping = sum([(params if counts is None else counts[k]) * v for k, v in step_per]) \
            + sum(v for _, v in step_fixed) + fp8
        if pad_step:
            stepping += sum(pad * v for _, v in pad_step)
    saved = in_flight * layers * act + layers * previous
    # Recomputation re-materialises one layer (or its MLP) at a time in the backward pass; on the last stage
    # that happens after the head's backward has freed the logits, so the two do not add (max below)
    buffer = buffer if layers else 0.0
    # a layer's unfused attention backward holds s x s gradients beyond its count (cost/activations.py
    # attention_backward_bytes); the local attention's score buffer is held from the first forward on
    backward, scratch = (backward, scratch) if layers else (0.0, 0.0)
    if first:   # what the embedding keeps (first_saved above)
        saved += in_flight * first_saved
    workspace = 0.0     # transient: not kept for a backward pass, but allocated at the peak
    if last:    # the layers' backward runs after the head's has freed the logits
        saved += max(head, buffer)
        workspace = max(head + logits_grad, buffer + backward) - max(head, buffer)
    else:
        saved += buffer
        workspace = backward
    workspace += scratch
    saved += boundary_buffers * tensor
    pipe_kept = in_flight * pipe.per_in_flight + pipe.fixed       # 0 unless the engine keeps pipe buffers
    saved += pipe_kept
    workspace += pipe.workspace
    acts = saved + workspace
    # Two more candidates for the peak, each when the activations are gone: the state held while the gradient
    # reduction after the last backward runs, with its buffers (state_bytes_at_reduction), and the state at the
    # step after it (state_bytes_at_step_per_param: the fp32 gradient copies it makes and frees), each beside what
    # DeepSpeed's engine holds from the last backward on (cost/pipe_buffers.py at_step: nothing frees a slot between
    # them; 0 under Megatron's). Each is reported as what it holds above the candidates before it (0 when less)
    after_backward = pipe.at_step + 2 * layers * previous
    above = 0.0
    reducing = ()
    if reduction is not None:
        reducing = tuple(x + after_backward for x in deepspeed_held_at_reduction_pieces(*reduction, params))
        above = max(0.0, min(reducing) - (state + acts))
    step_peak = stepping + after_backward
    step_above = max(0.0, step_peak - (state + acts + above))
    reserved = overhead.bytes(state + acts + above + step_above)
    candidates = ((state + acts,), reducing, (step_peak,)) if reducing else ((state + acts,), (step_peak,))
    return params, held, state, saved, acts, reserved, pipe_kept + pipe.workspace, above, step_above, stepping, fp8, \
        candidates


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
        _, _, state, _, acts, reserved, _, above, step_above, _, _, _ = _reading(cfg, layers, in_flight,
                                                                               boundary_buffers)
        return state + acts + above + step_above + reserved
    return total


def _candidate_totals(candidates: tuple, overhead: RuntimeOverhead, extra: float = 0.0) -> tuple:
    """_reading's candidates as totals, each piece with the runtime overhead it would bring as the peak and `extra`
    bytes beside it: the overhead is affine and grows with what it is taken on (RuntimeOverhead.bytes), so the
    largest candidate's total (the smallest of its pieces') is the stage's total, and each piece stays affine."""
    return tuple(tuple(x + overhead.bytes(x) + extra for x in pieces) for pieces in candidates)


def stage_memory_candidates_reader(model: ModelSpec, *, tp: int, dp: int, micro_batch_size: int, recompute: str,
                                   first: bool, last: bool, settings, vendor: str = "nvidia",
                                   seq_length: int | None = None, dtype_bytes: int = 2,
                                   impl: LayerImpl = TRANSFORMER_ENGINE, overhead: RuntimeOverhead | None = None,
                                   precision: str | None = None):
    """stage_memory_reader's total as its candidates for the peak, a function of (layers, in_flight,
    boundary_buffers) giving a tuple of candidates, each a tuple of pieces, each affine (_reading): the total is
    the largest candidate's smallest piece (with its overhead: _candidate_totals). The memory caps
    (plan/memory_caps.py) fit each piece's line, as the largest of lines is not one line."""
    cfg = _configuration(model, tp, dp, micro_batch_size, recompute, first, last, settings, vendor, seq_length,
                         dtype_bytes, impl, overhead, precision=precision)
    over = cfg[-2]

    def candidates(layers: int, in_flight: int, boundary_buffers: int = 0) -> tuple:
        return _candidate_totals(_reading(cfg, layers, in_flight, boundary_buffers)[-1], over)
    return candidates


def stage_memory_bytes(model: ModelSpec, *, layers: int, tp: int, dp: int, micro_batch_size: int,
                       recompute: str, in_flight: int, first: bool, last: bool, settings, vendor: str = "nvidia",
                       seq_length: int | None = None, dtype_bytes: int = 2,
                       boundary_buffers: int = 0, impl: LayerImpl = TRANSFORMER_ENGINE,
                       overhead: RuntimeOverhead | None = None, precision: str | None = None) -> dict[str, float]:
    """Bytes on the busiest device of a stage; keys: params, weights, gradients, optimizer (as held through the
    micro-batches, beside the activations), fp8_weight_copies (Transformer Engine's, in fp8 training:
    cost/model_state.py FP8_WEIGHT_COPY_BYTES; 0 otherwise), weights_grads_optimizer (these four), activations,
    gradient_reduction, optimizer_step, reserved, total (weights_grads_optimizer + activations + gradient_reduction +
    optimizer_step + reserved: the peak). `model.vocab_size` is the padded vocabulary
    that runs (plan.vocab_padding.padded_vocab_size); `settings` the mesh's RuntimeSettings (sequence parallelism, the
    optimizer's sharding, the gradient buffer's dtype and the dropouts are read from it). boundary_buffers: whole
    (sequence x micro-batch x hidden) tensors the stage holds for an overlapped cross-cluster boundary beyond its
    activations: the messages it has received ahead, their pieces and, on CPU, its sends in flight
    (plan/pipeline_memory.py `side_buffers` counts them; not the one it runs on, its input, which the activations
    count). `overhead`: the device's
    measured runtime overheads (the inventory cluster's); None: the vendor's estimates. `pipe_buffers`: what
    DeepSpeed's pipeline engine keeps (included in the activations; 0 under the Megatron engine);
    `pipe_buffers_at_step`, `pipe_buffers_at_reduction`: what it still holds through the step and the gradient
    reduction before it, as their candidates count it. `gradient_reduction`: what the state held while DeepSpeed's
    gradient reduction runs, with its buffers and the engine's, exceeds the state and activations
    (state_bytes_at_reduction; 0 when it does not, and under the Megatron engine).
    `optimizer_step`: what the state held while the optimizer steps exceeds those three (0 when it does not):
    the fp32 gradient copies Megatron-Core's optimizer steps on when the gradient buffer is not fp32, DeepSpeed's
    FP16 and BF16 optimizers' and its ZeRO optimizer's step set (state_bytes_at_step_per_param), which exist only
    inside the step, after the activations are gone, with what DeepSpeed's pipeline engine still holds then
    (cost/pipe_buffers.py `at_step`, and the last stage's checkpoints of two micro-batches under full
    recomputation). `state_at_step`: the bytes of that set (weights, gradients,
    optimizer state and fp8 copies; weights_grads_optimizer when the step allocates nothing more).
    `precision`: the training precision (precision_of: None = what dtype_bytes implies), which only DeepSpeed's
    optimizers read (fp16 and bf16 build different ones)."""
    cfg = _configuration(model, tp, dp, micro_batch_size, recompute, first, last, settings, vendor, seq_length,
                         dtype_bytes, impl, overhead, precision=precision)
    return _stage_dict(cfg, layers, in_flight, boundary_buffers)


def _stage_dict(cfg: tuple, layers: int, in_flight: int, boundary_buffers: int) -> dict[str, float]:
    """stage_memory_bytes' dict of a configuration (`_configuration`)."""
    params, (per, counts, fixed, padding), state, saved, acts, reserved, pipe, above, step_above, stepping, fp8, \
        candidates = _reading(cfg, layers, in_flight, boundary_buffers)
    parts = {k: (params if counts is None else counts[k]) * v for k, v in per}
    for k, v in fixed + padding:
        parts[k] += v
    at_step = candidates[-1][0] - stepping
    # what the engine holds at the reduction is what it holds at the step (_reading adds the same buffers to both)
    at_reduction = at_step if len(candidates) == 3 else 0.
    return {"params": params, **parts, "fp8_weight_copies": fp8, "weights_grads_optimizer": state,
            "activations": acts, "activations_saved": saved, "pipe_buffers": pipe,
            "pipe_buffers_at_step": at_step, "pipe_buffers_at_reduction": at_reduction,
            "gradient_reduction": above, "optimizer_step": step_above, "state_at_step": stepping, "reserved": reserved,
            "total": state + acts + above + step_above + reserved}


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
        params, _, state, _, acts, reserved, _, above, step_above, _, _, _ = _reading(cfg, layers, in_flight, 0)
        return state + acts + above + step_above + reserved + extra * params
    return total


def job_stage_memory_candidates_reader(job: JobMemory, model: ModelSpec, *, tp: int, dp: int, micro_batch_size: int,
                                       recompute: str, first: bool, last: bool, vendor: str = "nvidia",
                                       seq_length: int | None = None, overhead: RuntimeOverhead | None = None):
    """job_stage_memory_reader's total as its candidates (stage_memory_candidates_reader), the framework's bytes
    per parameter beside each (outside the overhead, as job_stage_memory_bytes adds them)."""
    cfg = _configuration(model, tp, dp, micro_batch_size, recompute, first, last, job.settings, vendor, seq_length,
                         job.dtype_bytes, job.impl, overhead, gradient_reduction=False)
    extra, over = job.extra_bytes_per_param, cfg[-2]

    def candidates(layers: int, in_flight: int, boundary_buffers: int = 0) -> tuple:
        r = _reading(cfg, layers, in_flight, 0)
        return _candidate_totals(r[-1], over, extra * r[0])
    return candidates
