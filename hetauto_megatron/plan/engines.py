"""The engine dimension of the runtime settings: what each pipeline engine does with a mesh's settings.

Apart from plan/settings.py (the settings a plan asks for per mesh, their defaults and overrides) because this is
the other axis of the same table: one row per engine that runs (Megatron, DeepSpeed's pipeline engine) or that a
published run ran (an older Megatron-Core), saying which settings it runs as set, how it reduces gradients, what
its layers keep and which recomputation it runs. Everything that prices or emits a plan for an engine reads its row
here (`ENGINES`, `as_run_by`, `recompute_as_run_by`, `selective_runs`), so the settings a plan asks for and the
settings its engine runs stay one table.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InputError

if TYPE_CHECKING:
    from .settings import RuntimeSettings


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
    loss: str = "vocab_parallel"    # its cross entropy, priced by its passes over the logits (cost/analytic.py
                                    # LOSS_BYTES): Megatron-Core's unfused vocabulary-parallel one (hetauto emits no
                                    # --cross-entropy-loss-fusion) or torch's F.cross_entropy ("torch")
    result_checks: int = 0          # scalar all-reduces over the world each iteration, besides the global norm,
                                    # that check the step's results: Megatron-LM's result validation (its default
                                    # --rerun-mode validate_results) asks every rank whether its loss was rejected,
                                    # after the pipeline drains (Megatron-Core's rerun_state_machine.py `_reduce_any`,
                                    # from core 0.10 on); plan/tail_costs.py result_check_time
    tied_reduce_first: bool = False     # sums a tied table's gradients across its holders (the first and the last
                                    # stage) before its DP reduction, so the last stage's reduction waits for the
                                    # first stage's last backward (DeepSpeed's ReduceTiedGrads before ReduceGrads);
                                    # else after it (Megatron: finalize_model_grads reduces over DP first)
    grad_buffer_passes: bool = True     # Megatron-Core's DDP passes over each bucket before reducing it: reads it
                                    # for its gradient norm's check (check_for_nan_in_grad) and, at DP > 1, scales it
                                    # by 1/DP in place (gradient_scaling_factor, --ddp-average-in-collective being
                                    # off); param_and_grad_buffer.py start_grad_sync, tail_costs.grad_buffer_passes
    fp16_fp32_accumulation: bool = True     # fp16 gradients accumulate and reduce in fp32 with the distributed
                                    # optimizer as grad_reduce_dtype fp32 asks (else in fp16: as_run_by)


ENGINES = {
    # hetauto's runtime and Megatron-LM: every setting as set (Megatron-Core's DDP buckets, distributed optimizer).
    # Its layers are Transformer Engine's (Megatron-LM's default --transformer-impl), whose FlashAttention and
    # FusedAttention (cuDNN) backends take fp16/bf16 (and fp8) Q, K and V only and need NVIDIA sm80+: in fp32, or
    # on a V100, it runs UnfusedDotProductAttention (TransformerEngine pytorch/attention/dot_product_attention/
    # utils.py, get_attention_backend, "Filter: Compute capability" and "Filter: Data type"), which computes and
    # keeps the s x s softmax output, as Megatron's local spec does (the CPU dry runs' layers, cost/activations.py
    # DRY_RUN_IMPL).
    # Megatron-LM's training loop checks each step's results with its rerun state machine, and hetauto's dry run
    # runs the same (runtime/train.py).
    "megatron": Engine("megatron", True, True, True, True, False, False, False, result_checks=1),
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
    # kernel takes fp32 and runs on a V100 (and its flash kernel on CPU): no s x s matrix at any precision. Its loss
    # is torch's F.cross_entropy on the fp32 logits (lm_loss).
    # fp16 with ZeRO-1 and an fp32 grad_accum_dtype builds DeepSpeedZeroOptimizer (engine.py:2297-2311: only bf16
    # gets the BF16 optimizer there), whose backward hook adds each fp16 `.grad` into an fp32 `grad_accum` attribute
    # and sets `.grad` to None (zero/stage_1_and_2.py:397-404, :1234-1240, :2288-2289); the pipeline engine's
    # ReduceTiedGrads sums only `weight.grad` and skips None (pipe/engine.py:281-285), so a tied table's two copies
    # would never be summed and drift apart. So fp16 with ZeRO-1 runs grad_reduce_dtype "param" here (as_run_by):
    # ZeRO-1 accumulating and reducing in fp16, whose `.grad` the tied reduction sums (measured:
    # tests/test_deepspeed_tied_accumulation.py). bf16 with fp32 accumulation builds BF16_Optimizer, whose tied
    # reduction reads its fp32 `_hp_grad`; fp16 without ZeRO accumulates in fp16 (FP16_UnfusedOptimizer).
    "deepspeed": Engine("deepspeed", False, False, False, False, True, True, True,
                        fp32_accumulation_needs_zero=True, optimizer_state="deepspeed",
                        reduce_bucket_elements=40_000_000, attention="sdpa", layers="torch",
                        selective_recompute=False, fp8=False, loss="torch", tied_reduce_first=True,
                        grad_buffer_passes=False,
                        fp16_fp32_accumulation=False),
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


def as_run_by(s: RuntimeSettings, engine: str = DEFAULT_ENGINE, precision: str = "") -> RuntimeSettings:
    """A mesh's settings as `engine` runs them: a setting the engine does not run is off (what it then does is what
    the cost model prices and the engine's emitter writes). The Megatron engine runs them all, unchanged.
    `precision`: the mesh's training precision (Plan.mesh_precision, the device's at the job's precision; "" where
    unknown: no rule that depends on it applies), for DeepSpeed's fp16 with ZeRO-1, which reduces in fp16
    (Engine.fp16_fp32_accumulation)."""
    e = ENGINES[engine]
    reduce_dtype = s.grad_reduce_dtype
    if precision == "fp16" and s.distributed_optimizer and not e.fp16_fp32_accumulation:
        reduce_dtype = "param"
    if e.overlaps_grad_reduce and e.overlaps_param_gather and e.sequence_parallel and reduce_dtype == s.grad_reduce_dtype:
        return s if s.engine == engine else dataclasses.replace(s, engine=engine)
    return dataclasses.replace(s, overlap_grad_reduce=s.overlap_grad_reduce and e.overlaps_grad_reduce,
                               overlap_param_gather=s.overlap_param_gather and e.overlaps_param_gather,
                               sequence_parallel=s.sequence_parallel and e.sequence_parallel,
                               grad_reduce_dtype=reduce_dtype, engine=engine)


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
