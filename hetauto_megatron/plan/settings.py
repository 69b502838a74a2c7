"""Runtime settings per mesh: the one table the cost model, the emitted arguments, the `--hetauto` rewrite,
the dry run and the DeepSpeed emitter all read.

A plan is only worth what its predictions are worth, and a prediction is only right if it prices what runs.
So every setting that changes time or memory lives here, once, with its default and its Megatron spelling;
nothing else in hetauto decides them:

    sequence_parallel       on for TP > 1: activations and element-wise work outside the TP regions are split
                            over the TP ranks (Megatron's --sequence-parallel)
    distributed_optimizer   Adam state and fp32 master weights sharded over the mesh's DP group (ZeRO-1,
                            Megatron's --use-distributed-optimizer); gradients are reduce-scattered
    overlap_grad_reduce     the DP gradient reduce-scatter runs bucket by bucket during the backward pass
    overlap_param_gather    the parameter all-gather of the distributed optimizer runs during the next forward
    grad_reduce_dtype       the element type of the DP gradient reduction: fp32 (Megatron's default,
                            grad_reduce_in_fp32) or the training precision ("param")
    hidden_dropout          dropout probability after the embedding and after each layer's attention and MLP
                            (Megatron's --hidden-dropout); above 0 every such dropout keeps its mask for the
                            backward pass
    attention_dropout       dropout probability on the attention probabilities (--attention-dropout); above 0 an
                            unfused attention keeps its mask and the dropped probabilities (flash attention
                            regenerates them)

Dropout defaults to 0: LLM pre-training runs without it (LLaMA, GPT-NeoX; Megatron-LM's own LLaMA examples pass
--attention-dropout 0.0 --hidden-dropout 0.0). Megatron's own default is 0.1 for both, so the emitted arguments
and the --hetauto rewrite always state the plan's values.

A mesh may override any of them in the plan file (`settings:` in a mesh, docs/plan-format.md); the defaults
are what `hetauto plan` assumes and what production Megatron jobs run.

Two job-wide properties sit beside the table because the same readers need them: the training precision
(`Plan.precision`, its Megatron flags in `precision_args`) and the padded vocabulary (`padded_vocab_size`): Megatron
pads the embedding table to a multiple of make_vocab_size_divisible_by x TP, and TP differs per mesh, so the plan
pads once, to a size every mesh's multiple divides, and every mesh is told that size.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..errors import InputError
from ..spec.devices import PRECISIONS
from ..spec.model import MAKE_VOCAB_SIZE_DIVISIBLE_BY
from ..cache_keys import cached_hash

GRAD_REDUCE_DTYPES = ("fp32", "param")
DROPOUT_KEYS = ("hidden_dropout", "attention_dropout")
MEGATRON_DEFAULT_DROPOUT = 0.1      # Megatron-LM's --hidden-dropout and --attention-dropout when not given


@dataclass(frozen=True)
class RuntimeSettings:
    __hash__ = cached_hash                 # a cache key of the planner: hashed once (cache_keys.py)
    sequence_parallel: bool
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    grad_reduce_dtype: str = "fp32"
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    # The engine these settings are run by (`as_run_by`): not a setting a plan overrides, the engine dimension of
    # the table that decides what the cost model prices (e.g. the collective of the DP gradient reduction).
    engine: str = "megatron"

    def __post_init__(self):
        for f in ("sequence_parallel", "distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather"):
            if not isinstance(getattr(self, f), bool):
                raise InputError(f"must be true or false, got {getattr(self, f)!r}", field=f"settings.{f}",
                                 fix=f"write {f}: true or {f}: false")
        for f in DROPOUT_KEYS:
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise InputError(f"must be a probability from 0 up to (not including) 1, got {value!r}",
                                 field=f"settings.{f}", fix=f"write {f}: 0.0 (no dropout, the default) or e.g. 0.1")
            object.__setattr__(self, f, float(value))
        if self.grad_reduce_dtype not in GRAD_REDUCE_DTYPES:
            raise InputError(f"must be one of {', '.join(GRAD_REDUCE_DTYPES)}, got {self.grad_reduce_dtype!r}",
                             field="settings.grad_reduce_dtype",
                             fix="write grad_reduce_dtype: fp32 (reduce gradients in fp32, Megatron's default) "
                                 "or param (in the training precision)")
        if self.overlap_param_gather and not self.overlap_grad_reduce:
            raise InputError("overlap_param_gather needs overlap_grad_reduce (Megatron asserts it)",
                             field="settings.overlap_param_gather",
                             fix="set overlap_param_gather: false, or overlap_grad_reduce: true")
        if self.overlap_param_gather and not self.distributed_optimizer:
            raise InputError("overlap_param_gather needs the distributed optimizer (there is no parameter "
                             "all-gather without it)", field="settings.overlap_param_gather",
                             fix="set overlap_param_gather: false, or distributed_optimizer: true")

    def to_dict(self) -> dict:
        """The settings (the keys a plan may override), without the engine."""
        return {k: getattr(self, k) for k in SETTING_KEYS}

    @property
    def sharded_grad_reduce(self) -> bool:
        """The DP gradient reduction is a reduce-scatter (distributed optimizer, run as its engine runs it)."""
        return self.distributed_optimizer and ENGINES[self.engine].sharded_grad_reduce

    @property
    def pipe_buffers(self) -> bool:
        """The engine keeps DeepSpeed's pipe buffers, which the memory model adds (cost/pipe_buffers.py)."""
        return ENGINES[self.engine].pipe_buffers

    @property
    def grad_accum_fp32(self) -> bool:
        """16-bit training accumulates its gradients in fp32 (the engine's gradient buffer is fp32):
        grad_reduce_dtype fp32, and under an engine that accumulates in fp32 only through ZeRO (DeepSpeed: its
        BF16 optimizer without ZeRO accumulates in bf16), the distributed optimizer too. What the DeepSpeed emitter
        writes as data_types.grad_accum_dtype and the memory model prices (cost/deepspeed_state.py)."""
        return self.grad_reduce_dtype == "fp32" and (self.distributed_optimizer
                                                     or not ENGINES[self.engine].fp32_accumulation_needs_zero)

    @property
    def optimizer_state(self) -> str:
        """Whose weights, gradients and optimizer state the memory model prices: "megatron" (Megatron-Core's
        DDP buffers and optimizer, cost/model_state.py) or "deepspeed" (DeepSpeed's optimizer wrappers,
        cost/deepspeed_state.py)."""
        return ENGINES[self.engine].optimizer_state

    def fused_attention(self, device) -> bool:
        """The engine's attention keeps no s x s score matrix (flash or memory-efficient attention) on `device` (a
        spec.devices.DeviceType at the job's precision): Transformer Engine's in 16 bits on a device that has it
        (DeviceType.fused_attention: not a V100), torch's scaled_dot_product_attention always (Engine.attention).
        The analytic time model and the memory model both price the layer this way (plan/costing.py,
        plan/memory_fit.py)."""
        if ENGINES[self.engine].attention == "sdpa":
            return True
        return device.dtype_bytes <= 2 and device.fused_attention

    @property
    def reduce_bucket_elements(self) -> int:
        """Elements of the engine's gradient reduce bucket (DeepSpeed's zero_optimization.reduce_bucket_size, which
        the emitter writes; 0: the engine reduces in its gradient buffer, Megatron)."""
        return ENGINES[self.engine].reduce_bucket_elements


SETTING_KEYS = tuple(f.name for f in dataclasses.fields(RuntimeSettings) if f.name != "engine")


# ---- the engine dimension: what each pipeline engine does with a mesh's settings -----------------------------
@dataclass(frozen=True)
class Engine:
    """How a pipeline engine runs a mesh's settings. Everything that prices or emits a plan for an engine reads
    its row here (`as_run_by`, `reduce_collective`): the settings a plan asks for and the settings that engine
    runs are one table."""
    name: str
    overlaps_grad_reduce: bool      # overlap_grad_reduce runs as set (else the reduction follows the last backward)
    overlaps_param_gather: bool     # overlap_param_gather runs as set (else the gather ends the optimizer step)
    sequence_parallel: bool         # sequence_parallel runs as set (else every TP rank holds the whole sequence)
    sharded_grad_reduce: bool       # with the distributed optimizer the gradients are reduce-scattered (else
                                    # all-reduced whole, each rank then keeping its shard)
    blocking_boundaries: bool       # every pipeline transfer blocks (else the plan's boundary schedule runs)
    simple_only: bool               # one pipeline of single meshes only
    pipe_buffers: bool              # keeps DeepSpeed's pipe buffers: each stage's output (or its 1/TP slice) and
                                    # received input per micro-batch in flight, the last stage's logits of two
                                    # micro-batches (cost/pipe_buffers.py; else Megatron's schedule: none)
    fp32_accumulation_needs_zero: bool = False   # 16-bit gradients accumulate in fp32 only with the distributed
                                    # optimizer (RuntimeSettings.grad_accum_fp32)
    optimizer_state: str = "megatron"   # the weights, gradients and optimizer state it holds: Megatron-Core's
                                    # buffers (cost/model_state.py) or DeepSpeed's optimizer wrappers (cost/deepspeed_state.py)
    reduce_bucket_elements: int = 0     # the gradient reduce bucket a ZeRO optimizer allocates (0: none)
    attention: str = "transformer_engine"   # its layers' attention: Transformer Engine's (fused in 16 bits on
                                    # sm80+) or torch's scaled_dot_product_attention ("sdpa", memory-efficient at
                                    # any precision); RuntimeSettings.fused_attention
    selective_recompute: bool = True    # runs recompute "selective" (else it checkpoints whole layers: "full";
                                    # recompute_as_run_by)
    layers: str = "megatron"        # whose layers run: Megatron's (Transformer Engine on accelerators, the local
                                    # spec on CPU processes) or hetauto's DeepSpeed pipeline module ("torch"), which
                                    # the memory model counts as it keeps activations (plan/memory_fit.py layer_impl)
    param_gather_dispatch: str = "first_forward"    # when overlap_param_gather starts a stage's first bucket's
                                    # all-gather: in the next iteration's first forward pre-hook (Megatron-Core
                                    # 0.19), or at the step's start ("step_start": 0.6-0.8; plan/tail_costs.py)
    runs_here: bool = True          # hetauto plans, emits and runs it (else a published run's engine, priced only)
    fp8: bool = True                # trains in fp8 (Transformer Engine's layers); DeepSpeed's config has no setting


ENGINES = {
    # hetauto's runtime and Megatron-LM: every setting as set (Megatron-Core's DDP buckets, distributed optimizer).
    # Its layers are Transformer Engine's (Megatron-LM's default --transformer-impl), whose FlashAttention and
    # FusedAttention (cuDNN) backends take fp16/bf16 (and fp8) Q, K and V only and need NVIDIA sm80+: in fp32, or
    # on a V100, it runs UnfusedDotProductAttention (TransformerEngine pytorch/attention/dot_product_attention/
    # utils.py, get_attention_backend, "Filter: Compute capability" and "Filter: Data type"), which computes and
    # keeps the s x s softmax output, as Megatron's local spec does (the CPU dry runs' layers, cost/memory.py
    # DRY_RUN_IMPL).
    "megatron": Engine("megatron", True, True, True, True, False, False, False),
    # DeepSpeed 0.19.8's PipelineEngine with the configs emit/deepspeed.py writes (docs/deepspeed.md, measured by
    # tests/test_deepspeed_pipeline.py): it sets enable_backward_allreduce = False (runtime/pipe/engine.py:80) and
    # reduces the DP gradients in its ReduceGrads instruction after the stage's last backward (pipe/engine.py:287,
    # pipe/schedule.py:238-241), with ZeRO-0 and ZeRO-1 alike: ZeRO-1's gradient hooks reduce only at a gradient-
    # accumulation boundary (zero/stage_1_and_2.py:2293), which the pipeline engine raises only inside ReduceGrads
    # (pipe/engine.py:659-668), so overlap_comm changes nothing there. ZeRO-1 all-reduces each bucket whole
    # (use_multi_rank_bucket_allreduce, on by default: stage_1_and_2.py:1695) and all-gathers the updated parameters
    # in its optimizer step. DeepSpeed has no sequence-parallel setting; every transfer is a blocking instruction
    # and, with TP > 1, a 1/TP slice the receiver all-gathers (pipe_partitioned, grad_partitioned: pipe/engine.py:
    # 137-138; plan/deepspeed_schedule.py); one uniform topology (emit/deepspeed.py unsupported_features). Its
    # PipelineEngine keeps pipe buffers the memory model counts (cost/pipe_buffers.py, measured by
    # tests/test_memory_deepspeed.py). Its optimizer wrappers hold other state than Megatron's buffers
    # (cost/deepspeed_state.py, measured by tests/test_memory_deepspeed_state.py): 16-bit gradients accumulate in fp32
    # only with ZeRO (engine.py:2294-2324 picks the BF16 optimizer with the data_types.grad_accum_dtype the emitter
    # writes), and its ZeRO-1 optimizer holds a reduce bucket of reduce_bucket_size elements, which the emitter
    # writes: 40M, Megatron-Core's DDP bucket (its default at DP <= 40), instead of DeepSpeed's default of 5e8
    # (zero/config.py:113), which holds 2 GB (fp32) or 1 GB (bf16) per GPU whatever the stage's size, through the
    # micro-batches: 160 / 80 MB instead. Under the pipeline engine ZeRO-1 reduces after the last backward
    # (above), so the bucket sets only how many all-reduces that reduction issues (a 40M-element all-reduce is
    # bandwidth-bound on every link in the catalog).
    # Its layers (runtime/deepspeed_pipeline.py) call torch's scaled_dot_product_attention, whose memory-efficient
    # kernel takes fp32 and runs on a V100 (and its flash kernel on CPU): no s x s matrix at any precision.
    "deepspeed": Engine("deepspeed", False, False, False, False, True, True, True,
                        fp32_accumulation_needs_zero=True, optimizer_state="deepspeed",
                        reduce_bucket_elements=40_000_000, attention="sdpa", layers="torch",
                        selective_recompute=False, fp8=False),
    # The Megatron-LM the published 2024 runs trained with (plan/calibration.py; Megatron-Core 0.6-0.8): the same
    # settings, but its distributed optimizer started the first bucket's parameter all-gather in zero_grad, at the
    # step's start (core_r0.7.0 distrib_optimizer.py `zero_grad`: `_dispatch_gather_model_params(0)`), so a later
    # stage's gather ran while it waited for its first input; Megatron-Core 0.19 starts it in the first forward's
    # pre-hook (param_and_grad_buffer.py `finish_param_sync`). Not an engine hetauto runs: only to price those runs.
    "megatron-core-0.8": Engine("megatron-core-0.8", True, True, True, True, False, False, False,
                                param_gather_dispatch="step_start", runs_here=False),
}
DEFAULT_ENGINE = "megatron"


def check_engine(engine: str, *, field: str = "--engine", file: str | None = None) -> Engine:
    if engine not in ENGINES or not ENGINES[engine].runs_here:
        raise InputError(f"must be one of {', '.join(e for e in ENGINES if ENGINES[e].runs_here)}, got {engine!r}",
                         file=file, field=field,
                         fix="write megatron (hetauto's runtime and Megatron-LM, the default) or deepspeed "
                             "(DeepSpeed's pipeline engine)")
    return ENGINES[engine]


def check_engine_precision(engine: str, precision: str, *, field: str, command: str) -> None:
    """InputError naming `field` where `engine` cannot train in `precision` (Engine.fp8: DeepSpeed's config has no
    fp8 setting); `command`: the hetauto command whose flags the fix names."""
    if precision == "fp8" and not ENGINES[engine].fp8:
        raise InputError(f"engine {engine} has no fp8 setting", field=field,
                         fix=f"{command} --engine {engine} with bf16, fp16 or fp32, or fp8 with --engine megatron")


def as_run_by(s: RuntimeSettings, engine: str = DEFAULT_ENGINE) -> RuntimeSettings:
    """A mesh's settings as `engine` runs them: a setting the engine does not run is off (what it then does is what
    the cost model prices and the engine's emitter writes). The Megatron engine runs them all, unchanged."""
    e = ENGINES[engine]
    if e.overlaps_grad_reduce and e.overlaps_param_gather and e.sequence_parallel:
        return s if s.engine == engine else dataclasses.replace(s, engine=engine)
    return dataclasses.replace(s, overlap_grad_reduce=s.overlap_grad_reduce and e.overlaps_grad_reduce,
                               overlap_param_gather=s.overlap_param_gather and e.overlaps_param_gather,
                               sequence_parallel=s.sequence_parallel and e.sequence_parallel,
                               engine=engine)


def recompute_as_run_by(recompute: str, engine: str = DEFAULT_ENGINE) -> str:
    """A mesh's recomputation as `engine` runs it: DeepSpeed's pipeline engine checkpoints whole layers only
    (activation_checkpoint_interval 1, which emit/deepspeed.py writes for "selective" too), so "selective" runs, and
    is priced, as "full"."""
    if recompute == "selective" and not ENGINES[engine].selective_recompute:
        return "full"
    return recompute


def selective_runs(model, engine: str = DEFAULT_ENGINE) -> bool:
    """Whether recompute "selective" (the MLP re-run, plan/mesh.py RECOMPUTE_SETTINGS) runs for `model` under
    `engine`. Not with Megatron's layers for a model with linear biases (GPT-2, GPT-3, OPT, GPT-NeoX): Megatron-Core
    0.19's TransformerLayer checkpoints the MLP with tensor_parallel.checkpoint, and the MLP returns its output
    projection's bias parameter itself (skip_bias_add); autograd then takes that parameter as the checkpoint's
    output, so the backward re-enters the checkpoint without end (measured on CPU: a RecursionError after minutes
    of recomputation, every rank of the stage stuck until then; Transformer Engine's layers take the same path
    outside fp8). The rule is the biases, not the MLP kind: a plain MLP without them (Falcon, Nemotron:
    linear_biases false) checkpoints and trains (tests/test_selective_with_biases.py). DeepSpeed's pipeline
    engine runs "selective" as "full" (recompute_as_run_by); a published run's engine (runs_here False) is priced
    as it ran."""
    e = ENGINES[engine]
    return not (e.runs_here and e.layers == "megatron" and model.linear_biases)


def default_settings(tp: int) -> RuntimeSettings:
    """What production Megatron jobs run: SP whenever TP shards the layers, the distributed optimizer with both
    overlaps, gradients reduced in fp32."""
    return RuntimeSettings(sequence_parallel=tp > 1)


def resolve_settings(tp: int, overrides: dict | None = None) -> RuntimeSettings:
    """The defaults for a mesh of this TP, with a plan's per-mesh overrides applied (validated)."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(SETTING_KEYS))
    if unknown:
        raise InputError(f"unknown setting(s) {', '.join(unknown)}", field="settings",
                         fix=f"use only: {', '.join(SETTING_KEYS)}")
    if overrides.get("sequence_parallel") and tp == 1:
        raise InputError("sequence_parallel needs tp > 1 (it splits the sequence over the TP ranks)",
                         field="settings.sequence_parallel", fix="drop the override or raise tp")
    if "overlap_param_gather" not in overrides:
        # Its default follows what it needs: there is no parameter gather to overlap without the distributed
        # optimizer, and Megatron overlaps it only together with the gradient reduction.
        overrides["overlap_param_gather"] = (overrides.get("distributed_optimizer", True)
                                             and overrides.get("overlap_grad_reduce", True))
    return dataclasses.replace(default_settings(tp), **overrides)


def minimal_overrides(tp: int, overrides) -> tuple:
    """The overrides that change something, as sorted (key, value) pairs: a key whose value the others already
    imply is dropped, so equal settings give equal overrides (and equal meshes)."""
    items = dict(overrides)
    settings = resolve_settings(tp, items)      # validates
    keep = {}
    for key in sorted(items):
        rest = {k: v for k, v in items.items() if k != key}
        try:
            implied = getattr(resolve_settings(tp, rest), key)
        except InputError:
            implied = None          # the others alone are not a valid combination: this key is needed
        if implied != items[key]:
            keep[key] = items[key]
    if resolve_settings(tp, keep) != settings:      # dropping keys one at a time changed the whole: keep all
        keep = items
    return tuple(sorted(keep.items()))


# Every Megatron-LM argument the plan decides: attribute (args.<name>) -> (its flag, what in the plan decides it:
# a setting of the mesh, or the job's "precision"). The emitted flags and the --hetauto rewrite's values and
# checks all come from `megatron_values`, which fills this table for one mesh.
MEGATRON_ARGS = {
    "sequence_parallel": ("--sequence-parallel", "sequence_parallel"),
    "use_distributed_optimizer": ("--use-distributed-optimizer", "distributed_optimizer"),
    "overlap_grad_reduce": ("--overlap-grad-reduce", "overlap_grad_reduce"),
    "overlap_param_gather": ("--overlap-param-gather", "overlap_param_gather"),
    "grad_reduce_in_bf16": ("--grad-reduce-in-bf16", "grad_reduce_dtype"),
    "hidden_dropout": ("--hidden-dropout", "hidden_dropout"),
    "attention_dropout": ("--attention-dropout", "attention_dropout"),
    "accumulate_allreduce_grads_in_fp32": ("--accumulate-allreduce-grads-in-fp32", "grad_reduce_dtype"),
    "bf16": ("--bf16", "precision"),
    "fp16": ("--fp16", "precision"),
    "fp8": ("--fp8-format", "precision"),
    "transformer_impl": ("--transformer-impl", "precision"),
}
DEFAULT_PRECISION = "bf16"
# fp8 runs Transformer Engine's GEMMs in fp8 ("hybrid": E4M3 forward, E5M2 gradients) on bf16 parameters.
FP8_FORMAT = "hybrid"


def megatron_values(s: RuntimeSettings, precision: str = DEFAULT_PRECISION) -> dict:
    """{Megatron attribute: value} for one mesh's settings at the job's precision (keys of MEGATRON_ARGS; a
    switch is True/False, the dropouts are probabilities (floats, always given: Megatron's default is not 0), fp8
    and transformer_impl are strings or None). The gradient dtype's spelling depends
    on the precision: bf16 (and fp8, which trains on bf16 parameters) reduces in fp32 unless
    --grad-reduce-in-bf16; fp16 reduces in fp16 unless --accumulate-allreduce-grads-in-fp32; fp32 training has
    fp32 gradients either way (neither attribute is decided)."""
    sixteen_bit = sixteen_bit_dtype(check_precision(precision))
    out = {"sequence_parallel": s.sequence_parallel, "use_distributed_optimizer": s.distributed_optimizer,
           "overlap_grad_reduce": s.overlap_grad_reduce, "overlap_param_gather": s.overlap_param_gather}
    if sixteen_bit == "bf16":
        out["grad_reduce_in_bf16"] = s.grad_reduce_dtype == "param"
    elif sixteen_bit == "fp16":
        out["accumulate_allreduce_grads_in_fp32"] = s.grad_reduce_dtype == "fp32"
    out["hidden_dropout"] = s.hidden_dropout
    out["attention_dropout"] = s.attention_dropout
    out["bf16"] = sixteen_bit == "bf16"
    out["fp16"] = sixteen_bit == "fp16"
    out["fp8"] = FP8_FORMAT if precision == "fp8" else None
    if precision == "fp8":
        out["transformer_impl"] = "transformer_engine"
    return out


def _flags(values: dict, from_precision: bool) -> list[str]:
    out = []
    for attr, value in values.items():
        flag, source = MEGATRON_ARGS[attr]
        if (source == "precision") != from_precision or value is False or value is None:
            continue
        out += [flag] if value is True else [flag, str(value)]
    return out


def megatron_setting_args(s: RuntimeSettings, precision: str = DEFAULT_PRECISION) -> list[str]:
    """Megatron-LM flags for one mesh's settings (the gradient dtype's spelling depends on the precision)."""
    return _flags(megatron_values(s, precision), from_precision=False)


# ---- precision --------------------------------------------------------------------------------------------
def check_precision(precision: str, *, field: str = "precision", file: str | None = None) -> str:
    if precision not in PRECISIONS:
        raise InputError(f"must be one of {', '.join(PRECISIONS)}, got {precision!r}", file=file, field=field,
                         fix="write bf16 (the default), fp16, fp8 (Transformer Engine, Hopper/Ada/MI300) or fp32")
    return precision


def sixteen_bit_dtype(precision: str) -> str | None:
    """The 16-bit type a precision keeps its parameters and gradients in: bf16 for bf16 and fp8 (Transformer
    Engine runs fp8 GEMMs on bf16 parameters), fp16 for fp16; None for fp32."""
    return {"bf16": "bf16", "fp8": "bf16", "fp16": "fp16"}.get(precision)


def precision_args(precision: str) -> list[str]:
    """Megatron-LM flags for the job's training precision (fp32: none, Megatron's default)."""
    return _flags(megatron_values(default_settings(1), precision), from_precision=True)


# ---- vocabulary padding -----------------------------------------------------------------------------------
def padded_vocab_size(vocab_size: int, tps, divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> int:
    """One padded vocabulary for the whole plan: the smallest size >= vocab_size that divisible_by x tp divides
    for every mesh's tp (Megatron pads to one such multiple per job; here each mesh gets the common size).
    E.g. 50257 with TP 1 and TP 2 -> 50432; Megatron alone would pad to 50304 at TP 1 and 50432 at TP 2."""
    step = math.lcm(*(int(divisible_by) * int(tp) for tp in tps))
    return -(-int(vocab_size) // step) * step


def model_padded_vocab_size(model, tps) -> int:
    """padded_vocab_size of a model (spec.model.ModelSpec) with its own divisor (make_vocab_size_divisible_by):
    the table the cost model prices and every mesh builds."""
    return padded_vocab_size(model.vocab_size, tps, model.make_vocab_size_divisible_by)
