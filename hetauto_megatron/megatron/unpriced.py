"""Megatron-LM features a plan does not price, refused under --hetauto (pure, no torch).

A plan's time and memory are those of a dense GPT model of the plan's layers, trained with Megatron's
distributed optimizer over each mesh's DP group, activations kept on the device. A Megatron argument that builds
something else (more layers or heads, other attention projections, another sharding of weights or optimizer
state, activations moved off the device) would train a job the plan never priced, or stop every rank with one of
Megatron's own assertions deep in validate_args: each is refused by name before Megatron validates anything.

What the launch scripts may add to the planned shapes because the plan's time and memory hardly depend on it
(the Hugging Face reader names them: --add-qkv-bias, --rotary-percent, --norm-epsilon, --use-rope-scaling,
spec/hf_notes.py not_carried) is not in the table. Neither is --no-align-grad-reduce: under the 1F1B schedule
the plan runs (the interleaved one is refused) it only decides whether a pipeline rank after the first starts its
gradient reduction from its bucket's hook as its last backward ends or after the cool-down, once its last
send_backward has returned (Megatron-Core 0.19 schedules.py forward_backward_pipelining_without_interleaving,
`config.grad_sync_func is None or is_pp_first_stage`; such a rank holds one bucket, distributed_data_parallel.py
`disable_bucketing or pp_rank > 0`, complete only when that backward ends). The plan prices the default, the
later start (plan/tail_costs.py tail_windows): where that send blocks, the flag starts the reduction earlier by
at most the link time, which the plan over-prices. The DP gradient buckets themselves are priced
(`check_ddp_bucket_args`). Nor is --fused-residual-rmsnorm: Megatron-Core 0.19 reads it only in Transformer Engine's
TENorm built for a norm followed by a residual (extensions/transformer_engine.py, has_residual), which the plan's
layers never build: Transformer Engine's dense spec fuses both norms into the QKV and fc1 linears
(gpt_layer_specs.py; only the refused MoE and MLA layers ask for such a norm), the block's final norm is
LayerNormImpl, and the local spec ignores has_residual. It builds nothing priced; beside a LayerNorm model
Megatron's TransformerConfig raises, so the rewrite refuses it there (model_checks.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InputError
from .unpriced_table import UNPRICED, Unpriced  # noqa: F401  (the table, data: unpriced_table.py)

if TYPE_CHECKING:
    from ..plan.plan import Plan
    from ..runtime.ranks import RankCoords


def check_unpriced(args, *, file: str | None = None) -> None:
    """InputError naming every argument of UNPRICED given a value other than Megatron's default."""
    given = [u for u in UNPRICED if getattr(args, u.dest, u.default) not in (u.default, *u.allowed)]
    if given:
        raise InputError("the Megatron arguments ask for what the plan does not price: " + "; ".join(
            f"{u.flag} {getattr(args, u.dest)!r} ({u.what})" for u in given), file=file, field=given[0].flag,
            fix="drop " + ", ".join(u.flag for u in given) + " (--hetauto runs the plan's dense GPT layers with "
                "Megatron's distributed optimizer; docs/megatron-integration.md)")


def check_timing_args(args, *, file: str | None = None) -> None:
    """Megatron-LM's timers past level 0 (core/timers.py: each timer's start and stop synchronizes the device, and
    with barrier=True first barriers its group, the world: Megatron never sets the timers' barrier group).
    Level 2 times every micro-batch's forward and backward compute (core/pipeline_parallel/schedules.py
    forward-compute, backward-compute): the device is drained before and after each, so the host no longer runs
    ahead of it and nothing in flight (a pipeline transfer, a DP bucket's reduction) overlaps the next compute as
    priced. Refused, naming the flag.
    Level 1 times the iteration's phases: the forward-backward run, finalize_model_grads' four gradient syncs, the
    optimizer step and its parts, and the distributed optimizer's parameter gather where it is not overlapped. With
    Megatron's default barrier_with_L1_time (on unless --no-barrier-with-level-1-timing) each of those eleven to
    thirteen timers first barriers the whole world (gloo's dissemination barrier: log2(ranks) rounds, each
    crossing the slow links between clusters), and how many there are differs between meshes (the parameter
    gather's: settings.overlap_param_gather and distributed_optimizer; the fp16 optimizer's unscaling), so ranks
    of two meshes would pair different barriers: refused, naming the flag. Level 1 with
    --no-barrier-with-level-1-timing runs: its timers drain the device at the phases' boundaries, where each rank
    waits for that work before the next phase anyway (the gradient syncs, the step); what it adds is a kernel
    launch's latency at each, within the iteration overhead the plan prices."""
    level = getattr(args, "timing_log_level", 0) or 0
    barrier = getattr(args, "barrier_with_L1_time", True)
    if level < 1 or (level == 1 and not barrier):
        return
    fix = "drop --timing-log-level, or give --timing-log-level 1" + \
          (" with --no-barrier-with-level-1-timing" if barrier else "")
    if level >= 2:
        why = ("synchronizes the device before and after every micro-batch's forward and backward compute: the "
               "plan prices the host running ahead of the device and transfers overlapping the compute")
    else:
        why = ("barriers every rank of the world before each of about a dozen timed phases an iteration (Megatron's "
               "default, barrier_with_L1_time), a number that differs between meshes of different settings: the "
               "plan prices no such barrier")
    raise InputError(f"--timing-log-level {level} {why}", file=file, field="--timing-log-level", fix=fix)


# What Megatron-LM's --transformer-impl values other than its default build (NVIDIA's gpt_builders.py
# _get_transformer_layer_spec)
_OTHER_LAYERS = {
    "local": "Megatron's local layers (unfused attention keeping each layer's s x s scores, unfused norms and rotary "
             "embedding)",
    "inference_optimized": "Megatron-Core's inference-optimized layers (get_gpt_layer_with_inference_spec), built "
                           "for serving",
}


def check_attention_args(args, plan: Plan, placement: RankCoords, *, file: str | None = None) -> None:
    """The attention the rank's mesh was priced with (plan/memory_fit.py layers_of, RuntimeSettings.fused_attention):
    on a device whose Transformer Engine runs fused attention at the plan's precision, no s x s score matrix is
    kept. Megatron's --attention-backend unfused (or local) makes Transformer Engine run its unfused attention,
    which keeps the softmax of every layer's s x s scores per micro-batch in flight: refused there, naming the
    flag. On meshes priced with unfused attention (fp32, a V100, CPU processes) the backend changes nothing priced.
    An accelerator mesh is priced with Transformer Engine's layers (Megatron-LM's default --transformer-impl; a CPU
    mesh with Megatron's local spec, the dry runs' layers): --transformer-impl local there builds the local spec,
    whose attention keeps the s x s scores at every precision and whose norms, rotary embedding and GLU keep more
    (cost/activations.py DRY_RUN_IMPL against TRANSFORMER_ENGINE): refused, naming the flag; so is
    --transformer-impl inference_optimized, which builds Megatron-Core's inference layers
    (gpt_layer_specs.py get_gpt_layer_with_inference_spec), priced nowhere. (--spec, which NVIDIA's gpt_builders.py
    builds the layers from whatever --transformer-impl says, is refused on every mesh: unpriced_table.py.)"""
    from ..plan.engines import as_run_by
    from ..spec.devices import get_device

    k = placement.mesh_index
    mesh = plan.meshes[k]
    impl = getattr(args, "transformer_impl", None)
    if mesh.device_type != "cpu" and impl not in (None, "transformer_engine"):
        builds = _OTHER_LAYERS.get(impl, "layers other than Transformer Engine's")
        raise InputError(f"--transformer-impl {impl} builds {builds}; the plan priced meshes[{k}] "
                         f"({mesh.device_type}) with Transformer Engine's layers, Megatron-LM's default",
                         file=file, field="--transformer-impl",
                         fix=f"drop --transformer-impl {impl} (Megatron-LM's default, transformer_engine, runs what "
                             "the plan priced); the local layers are priced only for meshes of cpu processes")
    device = get_device(mesh.device_type).at_precision(plan.mesh_precision(k), field="precision")
    if not as_run_by(mesh.settings, plan.engine).fused_attention(device):
        return
    backend = getattr(args, "attention_backend", None)
    name = getattr(backend, "name", backend)
    if name in ("unfused", "local"):
        raise InputError(f"--attention-backend {name} runs unfused attention, which keeps each layer's s x s "
                         f"attention scores; the plan priced meshes[{k}] ({mesh.device_type}, "
                         f"{plan.mesh_precision(k)}) with Transformer Engine's fused attention, which keeps none",
                         file=file, field="--attention-backend",
                         fix="drop --attention-backend (auto: Transformer Engine picks flash or cuDNN attention, as "
                             "priced), or give flash or fused")


def check_ddp_bucket_args(args, plan: Plan, placement: RankCoords, *, file: str | None = None) -> None:
    """The DP gradient buckets the rank's mesh was priced with (plan/tail_costs.py ddp_buckets): with
    overlap_grad_reduce the first pipeline rank reduces its stage bucket by bucket during its last backward and the
    last bucket's reduction is exposed after it. Megatron-Core cuts buckets of max(40M, 1M x DP) parameters unless
    --ddp-bucket-size or --ddp-num-buckets says otherwise (training.py resolve_ddp_bucket_size): another size, or
    a number of buckets, is refused, naming the flag; the priced size typed out passes. Without
    overlap_grad_reduce Megatron makes one bucket whatever the flags say; at DP 1 there is nothing to reduce, but
    the distributed optimizer pads every bucket's end (cost/ddp_buffer.py), so the flags are refused there too
    unless the mesh runs without it. A rank past
    the first pipeline rank holds one bucket whatever the flags say; its mesh's first-stage ranks do not, and a
    launch gives every rank of a mesh the same arguments, so the flags are refused on each rank of the mesh."""
    from ..cost.ddp_buffer import ddp_bucket_params

    k = placement.mesh_index
    mesh = plan.meshes[k]
    if not mesh.settings.overlap_grad_reduce or (mesh.dp == 1 and not mesh.settings.distributed_optimizer):
        return
    priced = ddp_bucket_params(mesh.dp)
    where = f"the plan priced meshes[{k}] ({mesh.cluster}, DP {mesh.dp}) with Megatron-Core's default bucket of " \
            f"{priced} parameters (max(40M, 1M x DP)): the reduction of the last bucket, exposed after the " \
            f"backward, and the padding of every bucket's end"
    size = getattr(args, "ddp_bucket_size", None)
    if size is not None and int(size) != priced:
        raise InputError(f"--ddp-bucket-size {size} cuts the DP gradient reduction into buckets of {size} "
                         f"parameters; {where}", file=file, field="--ddp-bucket-size",
                         fix=f"drop --ddp-bucket-size (Megatron's default, as priced), or give {priced}")
    num = getattr(args, "ddp_num_buckets", None)
    if num is not None:
        raise InputError(f"--ddp-num-buckets {num} cuts the DP gradient reduction into {num} buckets; {where}",
                         file=file, field="--ddp-num-buckets",
                         fix="drop --ddp-num-buckets (Megatron's default buckets, as priced)")


def static_loss_scale_builds(precision: str, distributed_optimizer: bool) -> str | None:
    """What Megatron-LM builds for a static --loss-scale on ranks training in `precision`, that the plan does not
    price; None where it builds nothing. Megatron-Core's get_megatron_optimizer gives every mixed-precision
    optimizer (fp16, bf16, and fp32 under the distributed optimizer) a ConstantGradScaler for it, and
    Megatron's FP32Optimizer (fp32 without the distributed optimizer) ignores it."""
    if precision == "fp16":
        # validate_args turns the gradient check off only for fp16's dynamic scaler (`if not args.loss_scale`):
        # with a static scale DDP's check_for_nan_in_grad stays on, priced off (plan/tail_costs.py checks_gradients)
        return ("Megatron-LM then keeps --check-for-nan-in-loss-and-grad on for fp16 (validate_args turns it off "
                "only for the dynamic loss scaler): a read of the gradient buffer before each DP reduction that "
                "the plan prices off for fp16 (tail_costs.grad_buffer_passes)")
    if precision != "fp32" or distributed_optimizer:
        # MixedPrecisionOptimizer.prepare_grads unscales the main gradients and checks them when it has a scaler
        # (torch._amp_foreach_non_finite_check_and_unscale_), then all-reduces found_inf and reads it on the host
        return ("Megatron-Core then gives the optimizer a constant loss scaler, which scales every loss and, "
                "before each step, unscales and checks the main gradients (a read and a write of them), "
                "all-reduces the overflow flag and waits for it on the host: passes and a collective the plan "
                f"prices none of in {precision} training, which needs no loss scaling")
    return None


def check_loss_scale(args, plan: Plan, placement: RankCoords, *, file: str | None = None) -> None:
    """--loss-scale (Megatron-LM's static loss scale) where it builds what the rank's mesh was not priced with
    (static_loss_scale_builds): refused, naming the flag. 0, like no flag, is Megatron's dynamic scaler
    (`if config.loss_scale` / `if not args.loss_scale`). The dynamic scaler's own flags (--initial-loss-scale,
    --min-loss-scale, --loss-scale-window, --hysteresis) only set when it grows and backs off its scale and skips
    a step: nothing the plan prices, so they pass."""
    scale = getattr(args, "loss_scale", None)
    if not scale:
        return
    k = placement.mesh_index
    precision = plan.mesh_precision(k)
    why = static_loss_scale_builds(precision, plan.meshes[k].settings.distributed_optimizer)
    if why is None:
        return
    fix = ("drop --loss-scale: the plan runs fp16 with Megatron's dynamic loss scaler (tune it with "
           "--initial-loss-scale, --loss-scale-window, --hysteresis or --min-loss-scale, which change nothing priced)"
           if precision == "fp16" else f"drop --loss-scale: {precision} training runs without a loss scale, as priced")
    raise InputError(f"--loss-scale {scale:g} (a static loss scale) on meshes[{k}] ({plan.meshes[k].cluster}, "
                     f"{precision}): {why}", file=file, field="--loss-scale", fix=fix)


# Megatron-LM arguments that add a collective over the world to every iteration (training.py
# checkpoint_and_decide_exit): the exit's time limit (a MAX all-reduce of whether any rank's time is up) and the
# exit signal (an all-gather of whether each rank received it); and the logged parameter norm (train: every
# iteration, an all-reduce over the world under --hetauto, runtime/gradients.py params_norm_once, after a pass over
# the rank's parameters); and the logged count of zero gradients (core/optimizer/clip_grads.py count_zeros_fp32, in
# every optimizer step: a pass over the rank's gradients, then a SUM all-reduce over the gradient-statistics group,
# the world under --hetauto, runtime/gradients.py count_grad_norm_once). Legitimate in production launches, so not
# refused;
# the plan's iteration time counts the world's result check and global norm only, so the launch says what each adds.
PER_ITERATION_WORLD = (
    ("exit_duration_in_mins", "--exit-duration-in-mins", "all-reduces whether any rank's time is up", 1.0),
    ("exit_signal_handler", "--exit-signal-handler", "all-gathers whether each rank received the exit signal", 0.5),
    ("log_params_norm", "--log-params-norm", "all-reduces the parameters' squared norm", 1.0),
    ("log_num_zeros_in_grad", "--log-num-zeros-in-grad", "all-reduces the gradients' count of zeros", 1.0),
)


def unpriced_world_collectives(args, plan: Plan) -> str | None:
    """The note a launch prints when its Megatron-LM arguments add collectives over the world to every iteration
    that the plan does not price (PER_ITERATION_WORLD), with their seconds as the plan's inventory prices the
    world's ring (plan/tail_costs.py world_scalar_time: an all-reduce walks it twice, an all-gather once); None
    when there are none, or the plan carries no inventory."""
    from ..plan.tail_costs import world_scalar_time
    from ..spec.inventory import inventory_from_dict

    given = [(flag, what, walks) for dest, flag, what, walks in PER_ITERATION_WORLD if getattr(args, dest, None)]
    if not given or not plan.inventory:
        return None
    ring = world_scalar_time(inventory_from_dict(plan.inventory), plan.meshes)
    parts = [f"{flag} ({what} over the {plan.world_size} ranks: {1e3 * walks * ring:.3g} ms)"
             for flag, what, walks in given]
    total = sum(walks for _, _, walks in given) * ring
    return ("[hetauto] note: Megatron-LM runs a collective over the world every iteration for " + "; ".join(parts)
            + f": {1e3 * total:.3g} ms an iteration that the plan's iteration time does not count")
