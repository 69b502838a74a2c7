"""DeepSpeed configs for a plan: one per mesh, each validated by DeepSpeed's own parser before it is written.

DeepSpeed's pipeline engine runs on one uniform Cartesian topology (one TP and one DP size for the whole job)
and one communication backend, so a heterogeneous plan maps onto it only partly. What maps:
- batch arithmetic per mesh: train_batch_size = micro-batch x accumulation steps x the mesh's DP, which is the
  plan's global batch in every mesh (dp x micro-batch is equal everywhere, so the step counts agree);
- the mesh's runtime settings as DeepSpeed's engine runs them (plan/settings.py, the one table Megatron's
  arguments are read from too, its `deepspeed` row: plan/engines.py `as_run_by`): the distributed optimizer is
  ZeRO stage 1 (the pipeline engine refuses stages 2/3, one pipeline stage too), grad_reduce_dtype is the
  communication and gradient-accumulation dtype (fp16 with ZeRO-1 runs it as "param": engines.py); the pipeline engine reduces gradients after the last backward
  whatever overlap_comm says, so overlap_comm is the table's (off) and a plan asking for overlap_grad_reduce gets
  it listed as unsupported;
- the precision the mesh trains in (the plan's; fp32 on CPU; fp8 as bf16); activation checkpointing from the
  mesh's recompute mode;
- the explicit stage partition, under our own top-level key "hetauto" (DeepSpeed ignores unknown top-level
  keys, and never reads pipeline.partition/stages): PipelineModule takes only named partition methods, so an
  explicit list needs a subclass overriding _partition_layers (docs/deepspeed.md).
What does not map is listed by `unsupported_features`, only for the features the given plan uses; meshes of
different DP (and so of different micro-batch) are no DeepSpeed job at all, and `check_one_grid` refuses them
(exit 2, no config written), the same rule the launch checks its rank count by.

`deepspeed` (and torch) are imported only inside `validate`, quietly. `check_hand_edits` is also what the launch
(runtime/deepspeed_pipeline.py `initialize`) checks of a config edited by hand.
"""
from __future__ import annotations

import contextlib
import copy
import io
import logging
import os

from ..errors import InputError, first_line
from ..plan.plan import Plan
from ..plan.precision import sixteen_bit_dtype
from ..plan.shapes import require_simple, uniform_topology_gaps
from ..spec.devices import get_device
from .launches import file_stems
from .vendor_env import fp32_tf32

# Top-level keys we emit, each one DeepSpeed reads (its parser ignores unknown top-level keys, so we check).
_DS_TOP_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "gradient_clipping", "steps_per_print", "bf16", "fp16", "zero_optimization",
                "activation_checkpointing", "pipeline", "wall_clock_breakdown", "communication_data_type",
                "data_types"}
OUR_KEY = "hetauto"
# The `pipeline` keys the 0.19 pipeline engine reads; its parser keeps any others (stages, partition, typos)
# without effect.
_PIPELINE_KEYS_READ = {"activation_checkpoint_interval", "pipe_partitioned", "grad_partitioned", "use_reentrant"}


# fp16's dynamic loss scaler as Megatron-LM's parser sets it for a launch that gives no loss-scale flag
# (megatron/training/arguments.py: --initial-loss-scale 2**32, --loss-scale-window 1000, --hysteresis 2,
# --min-loss-scale 1; --loss-scale unset, dynamic): a plan trained in fp16 starts from the same scale, and skips
# the same first overflowing steps, under either engine. DeepSpeed's own default starts at 2**16
# (runtime/precision_config.py initial_scale_power 16); its other defaults are already Megatron's.
MEGATRON_FP16_LOSS_SCALER = {"loss_scale": 0, "initial_scale_power": 32, "loss_scale_window": 1000,
                             "hysteresis": 2, "min_loss_scale": 1}


def stage_partition(stage_layers: list[int]) -> list[int]:
    """PipelineModule `parts` boundaries for a layer list [embedding, L transformer layers, output head]:
    stage s owns layers parts[s]..parts[s+1]-1; the embedding sits on stage 0 and the head on the last."""
    parts = [0]
    acc = 1   # the embedding is layer 0
    for s, n in enumerate(stage_layers):
        acc += n
        parts.append(acc + (1 if s == len(stage_layers) - 1 else 0))
    return parts


def deepspeed_config(plan: Plan, mesh_index: int) -> dict:
    """The ds_config for the ranks of one mesh (a plain dict, not yet validated)."""
    mesh = plan.meshes[mesh_index]
    settings = plan.settings_as_run(mesh_index, ENGINE)     # what DeepSpeed's engine runs of the mesh's settings
    # 'selective' recompute (the MLP re-run) has no DeepSpeed equivalent; checkpoint every layer instead so
    # the memory the plan budgeted is not exceeded (listed by unsupported_features).
    checkpoint = mesh.recompute in ("full", "selective")
    # The precision this mesh trains in, as the cost model prices it: the plan's (fp8 is bf16 here: DeepSpeed
    # has no fp8 setting, Transformer Engine's layers do it), fp32 on CPU.
    low = sixteen_bit_dtype(plan.mesh_precision(mesh_index))   # None: fp32
    # The DP gradient reduction's element type (Megatron's grad_reduce_in_fp32): DeepSpeed reduces in
    # communication_data_type and accumulates in data_types.grad_accum_dtype.
    reduce_dtype = low if low and settings.grad_reduce_dtype == "param" else "fp32"
    # The distributed optimizer is ZeRO-1 (optimizer state and master weights sharded over DP; DeepSpeed's
    # pipeline engine, which runs every mesh, allows stages 0 and 1 only). overlap_comm: the table's row for
    # DeepSpeed's engine (off: under the pipeline engine ZeRO reduces in ReduceGrads after the last backward either
    # way, engines.py).
    zero = {"stage": 1 if settings.distributed_optimizer else 0}
    if settings.distributed_optimizer:
        zero["overlap_comm"] = settings.overlap_grad_reduce
        # the reduce bucket ZeRO-1 allocates (the table's, Megatron-Core's bucket size), which the memory model prices
        zero["reduce_bucket_size"] = settings.reduce_bucket_elements
    cfg = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": mesh.micro_batch_size,
        "gradient_accumulation_steps": plan.num_micro_batches,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "bf16": {"enabled": low == "bf16"},
        "fp16": {"enabled": True, **MEGATRON_FP16_LOSS_SCALER} if low == "fp16" else {"enabled": False},
        "communication_data_type": reduce_dtype,
        # bf16 with fp32 accumulation needs ZeRO in DeepSpeed (its BF16 optimizer); without the distributed
        # optimizer gradients accumulate in the training precision (listed by unsupported_features). The table's
        # rule (settings.grad_accum_fp32), which the memory model prices too.
        "data_types": {"grad_accum_dtype": "fp32" if settings.grad_accum_fp32 or not low else low},
        "zero_optimization": zero,
        "activation_checkpointing": {"partition_activations": False, "contiguous_memory_optimization": False,
                                     "cpu_checkpointing": False},
        # With TP > 1 each rank sends its 1/TP slice of an activation or gradient and the receiver all-gathers it,
        # as the cost model prices it (plan/deepspeed_schedule.py); DeepSpeed's defaults, written so the file says so.
        # Written for one stage too: the pipeline engine (and runtime/deepspeed_pipeline.py) reads the checkpoint
        # interval from here whatever the stage count, and a one-stage plan priced with recomputation must run it.
        "pipeline": {"activation_checkpoint_interval": 1 if checkpoint else 0, "pipe_partitioned": True,
                     "grad_partitioned": True},
        "wall_clock_breakdown": False,
        OUR_KEY: {
            "mesh": mesh_index, "cluster": mesh.cluster, "device_type": mesh.device_type,
            "tensor_parallel_size": mesh.tp, "data_parallel_size": mesh.dp,
            "pipeline_parallel_size": plan.pipeline_parallel_size,
            "first_stage": plan.first_stage(mesh_index), "num_stages": mesh.num_stages,
            "recompute": mesh.recompute, "rank_offset": plan.rank_offset(mesh_index),
            "settings": settings.to_dict(),
            "stage_layers": plan.stage_layers, "partition": stage_partition(plan.stage_layers),
            # the embedding and output tables the cost model priced (Plan.padded_vocab_size), which the model's
            # layers build; DeepSpeed pads nothing itself
            "padded_vocab_size": plan.padded_vocab_size,
        },
    }
    if plan.precision == "fp32":
        # whether this mesh's fp32 GEMMs run on the TF32 tensor cores, as priced: DeepSpeed's layers are torch's,
        # so the runtime sets PyTorch's switch from it (runtime/deepspeed_pipeline.py initialize)
        cfg[OUR_KEY]["tf32"] = bool(fp32_tf32(plan, mesh.cluster))
    return cfg


ENGINE = "deepspeed"     # the row of the settings table (plan/engines.py ENGINES) these configs run as
# What a mesh loses of a setting DeepSpeed's engine does not run (as_run_by turns it off).
_SETTING_GAPS = {
    "overlap_grad_reduce": "overlap of the DP gradient reduction with the backward pass (overlap_grad_reduce): "
                           "DeepSpeed's pipeline engine turns its backward all-reduce off and reduces in its ReduceGrads "
                           "instruction after the stage's last backward, with ZeRO-0 and ZeRO-1 alike (overlap_comm "
                           "changes nothing there); 'hetauto simulate --engine deepspeed' prices it so",
    "overlap_param_gather": "overlap of the parameter all-gather with the next forward pass (overlap_param_gather): "
                            "ZeRO-1 gathers the updated parameters at the end of the optimizer step",
    "sequence_parallel": "sequence parallelism: not a DeepSpeed setting; the model's own tensor-parallel layers (e.g. "
                         "Megatron's, through the mpu) must split the sequence",
}


# DeepSpeed's pipeline engine lays the whole launch out as one grid (PipelineModule's ProcessTopology), one DP size
# for every stage: a plan whose meshes differ in DP is no job DeepSpeed runs, however its configs are written. The one
# rule, and its one wording, for the emit (every mesh's config) and the launch (its own config and rank count).
ONE_GRID = ("DeepSpeed's pipeline engine lays the whole job out as one grid of stages x data-parallel size (its "
            "PipelineModule's ProcessTopology), one DP size for every stage")
ONE_GRID_FIX = ("plan with the same DP in every mesh ('hetauto plan --engine deepspeed' plans equal TP, DP and "
                "micro-batch), or run this plan with Megatron-LM ('hetauto emit megatron') or hetauto's runtime")


def check_one_grid(blocks: list[dict], world: int | None = None, *, file: str | None = None) -> None:
    """Raise InputError unless DeepSpeed's one grid holds the meshes of these configs' `hetauto` blocks: at emit
    every mesh's (`file` the plan; field meshes[k].dp, the first mesh of another DP than mesh 0), at launch the rank's
    own with `world` the launch's rank count (field hetauto.data_parallel_size: stages x DP ranks; the layers are
    not tensor-parallel, TP is 1 there). A launch of every mesh's configs has another rank count than stages x DP for
    at least one mesh when their DPs differ, so each side catches the same plans."""
    odd = [b for b in blocks if b["data_parallel_size"] != blocks[0]["data_parallel_size"]]
    if odd:
        sizes = ", ".join(f"mesh {b['mesh']} ({b['cluster']}) DP {b['data_parallel_size']}" for b in blocks)
        raise InputError(f"the meshes have different data-parallel sizes ({sizes}): {ONE_GRID}, so no DeepSpeed "
                         "launch can run this plan", file=file,
                         field=f"meshes[{odd[0]['mesh']}].dp", fix=ONE_GRID_FIX)
    for b in blocks if world is not None else ():
        stages, dp = b["pipeline_parallel_size"], b["data_parallel_size"]
        if world != stages * dp:
            raise InputError(f"the launch has {world} ranks, but {ONE_GRID}: {stages} stages x DP {dp} "
                             f"({stages * dp} ranks) as mesh {b['mesh']} ({b['cluster']}) of the plan gives it, so "
                             "every mesh must have that data-parallel size", file=file,
                             field="hetauto.data_parallel_size", fix=ONE_GRID_FIX)


def unsupported_features(plan: Plan) -> list[str]:
    """Plain sentences, one per feature of this plan that one DeepSpeed job cannot express but runs without (a
    difference in DP, and so in micro-batch, is no job at all: `check_one_grid` refuses it)."""
    out = []
    meshes = plan.meshes

    def per_mesh(attr):
        return ", ".join(f"{m.cluster}={getattr(m, attr)}" for m in meshes)

    vendors = [get_device(m.device_type).vendor for m in meshes]
    gaps = uniform_topology_gaps(meshes, vendors)
    if "tp" in gaps:
        out.append(f"different tensor-parallel sizes per mesh ({per_mesh('tp')}): DeepSpeed's ProcessTopology is "
                   "one grid with a single TP size")
    if "vendor" in gaps:
        out.append(f"cross-vendor communication ({', '.join(sorted(set(vendors)))}): DeepSpeed runs one backend for the whole job "
                   "(NCCL, HCCL or gloo) and has no bridge between the clusters' collective libraries")
    if "selective" in gaps:
        out.append("selective recomputation (the MLP re-run): DeepSpeed checkpoints whole layers; the configs use "
                   "activation_checkpoint_interval 1 for those meshes, full recomputation, which 'hetauto simulate "
                   "--engine deepspeed' prices (more compute, less memory than the plan's 1F1B estimate)")
    for key, why in _SETTING_GAPS.items():     # settings the plan asks for that the engine's row turns off
        # (an overlap of the DP collectives where a mesh has DP 1 overlaps nothing, so loses nothing)
        if any(getattr(m.settings, key) != getattr(plan.settings_as_run(i, ENGINE), key)
               and (m.dp > 1 or not key.startswith("overlap_")) for i, m in enumerate(meshes)):
            out.append(why)
    if any(not m.settings.distributed_optimizer and m.settings.grad_reduce_dtype == "fp32"
           and plan.mesh_precision(i) != "fp32" for i, m in enumerate(meshes)):
        out.append("fp32 gradient accumulation without the distributed optimizer: DeepSpeed accumulates bf16/fp16 "
                   "gradients in that precision unless ZeRO is on")
    if any(m.settings.grad_reduce_dtype != plan.settings_as_run(i, ENGINE).grad_reduce_dtype
           for i, m in enumerate(meshes)):
        # engines.py ENGINES["deepspeed"]: DeepSpeedZeroOptimizer keeps fp32-accumulated fp16 gradients in a
        # grad_accum attribute that the pipeline engine's tied-weight reduction never reads
        out.append("fp16 gradients accumulated and reduced in fp32 with the distributed optimizer (grad_reduce_dtype "
                   "fp32): DeepSpeed's ZeRO-1 then moves each fp16 gradient into an fp32 grad_accum attribute that its "
                   "pipeline engine's tied-weight reduction never reads, so the configs accumulate and reduce in fp16 "
                   "(grad_reduce_dtype param), which 'hetauto simulate --engine deepspeed' prices")
    if plan.model.tie_embeddings and plan.pipeline_parallel_size > 1 and any(
            not plan.settings_as_run(i, ENGINE).distributed_optimizer and plan.mesh_precision(i) != "bf16"
            for i, m in enumerate(meshes)):
        # DeepSpeed 0.19.8 without ZeRO: fp32 clips with runtime/utils.py clip_grad_norm_ and fp16 with its
        # FP16 optimizers' norm of the stage's gradients, each summing the tied table's copy on the first and on
        # the last stage alike; bf16 builds BF16_Optimizer (engine.py _do_optimizer_sanity_check), whose norm skips
        # the copy the pipeline module marks ds_pipe_replicated, as ZeRO-1's counts it once
        out.append("gradient clipping of the tied embedding without the distributed optimizer: in fp32 or fp16, "
                   "ZeRO-0 clips by a norm that counts the tied table's gradient on the first and the last stage, so "
                   "the updates differ slightly from one model's when the clip binds (ZeRO-1, the distributed "
                   "optimizer, and bf16 count it once)")
    if plan.precision == "fp8" and any(plan.mesh_precision(i) == "fp8" for i in range(len(meshes))):
        out.append("fp8 training: DeepSpeed has no fp8 setting (the configs say bf16); the model's layers must "
                   "run their GEMMs in fp8 themselves (Transformer Engine)")
    if len(set(plan.stage_layers)) > 1:
        out.append("the uneven layer split: ds_config cannot carry it (pipeline.partition is never read); it is in "
                   "the 'hetauto.partition' key and needs a PipelineModule subclass overriding _partition_layers "
                   "(a private API of the pinned DeepSpeed version)")
    overlapped = [m.cluster for m in meshes if m.boundary_schedule == "overlapped"]
    if overlapped:
        out.append(f"the overlapped cross-cluster boundar{'ies' if len(overlapped) > 1 else 'y'} after "
                   f"{', '.join(overlapped)}: DeepSpeed's pipeline engine blocks both stages on every transfer; "
                   "'hetauto simulate --engine deepspeed' prices the plan as it runs there, 'hetauto explain' what "
                   "the overlap is worth")
    return out


# ---- validation -------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet():
    """DeepSpeed prints banners and warnings on import and logs every parsed config."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        yield buf


@contextlib.contextmanager
def _data_parallel_world(ds_comm, dp: int):
    """DeepSpeedConfig takes the DP size from deepspeed.comm, which answers 1 (or fails) when no process group
    exists; validating offline therefore means answering for it, for the duration of the parse only."""
    saved = ds_comm.get_rank, ds_comm.get_world_size
    ds_comm.get_rank = lambda *a, **k: 0
    ds_comm.get_world_size = lambda *a, **k: dp
    try:
        yield
    finally:
        ds_comm.get_rank, ds_comm.get_world_size = saved


def _import_deepspeed():
    if "DS_ACCELERATOR" not in os.environ:
        import torch
        if not torch.cuda.is_available():
            os.environ["DS_ACCELERATOR"] = "cpu"   # the parser needs no device; avoid probing for one
    with _quiet():
        import deepspeed  # noqa: F401
        import deepspeed.comm as ds_comm
        from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT_DEFAULT
        from deepspeed.runtime.config import DeepSpeedConfig
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    return ds_comm, DeepSpeedConfig, set(ACT_CHKPT_DEFAULT)


def check_hand_edits(cfg: dict, *, file: str | None = None) -> None:
    """What a hand edit of an emitted config can write that DeepSpeed 0.19.8 lets through to a run the plan did not
    price, or refuses only by an assert deep inside deepspeed.initialize: a `data_types` key its parser does not
    read (ignored silently: a misspelt grad_accum_dtype accumulates in DeepSpeed's default, not as priced), and a ZeRO
    stage its pipeline engine refuses. Run by `validate` and, before the launch builds anything, by
    runtime/deepspeed_pipeline.py `initialize`; `deepspeed` is imported already."""
    from deepspeed.runtime import constants as ds
    from deepspeed.runtime.zero.config import ZeroStageEnum, get_zero_config

    # the keys runtime/config.py reads from data_types (DeepSpeedConfig._initialize_params), DeepSpeed's own names
    known = sorted((ds.GRAD_ACCUM_DTYPE, ds.PARAM_DTYPE, ds.BUFFER_DTYPE, ds.KEEP_IN_FP32_MODULES))
    fix = f"use the keys DeepSpeed 0.19.8 reads there: {', '.join(known)} (the emitted config has grad_accum_dtype)"
    data_types = cfg.get(ds.DATA_TYPES, {})
    if not isinstance(data_types, dict):
        raise InputError(f"is {data_types!r}, not a mapping of keys", file=file, field=ds.DATA_TYPES, fix=fix)
    unknown = sorted(set(data_types) - set(known))
    if unknown:
        one = len(unknown) == 1
        field = f"{ds.DATA_TYPES}.{unknown[0]}" if one else ds.DATA_TYPES
        raise InputError(f"{', '.join(unknown)}: not {'a key' if one else 'keys'} DeepSpeed reads under data_types "
                         f"(its parser ignores {'it' if one else 'them'} silently, so the run is not the one the "
                         "plan priced)", file=file, field=field, fix=fix)
    try:
        stage = get_zero_config(cfg).stage       # as DeepSpeed reads it ("2" and 2.0 are stage 2)
    except Exception:      # malformed: DeepSpeed's parser names it (validate parses next; at launch, initialize)
        return
    # PipelineEngine.__init__ (runtime/pipe/engine.py) asserts stage < ZeroStageEnum.gradients whatever the stage
    # count, and every mesh runs as a PipelineModule (runtime/deepspeed_pipeline.py), a one-stage plan too
    if stage >= ZeroStageEnum.gradients:
        raise InputError(f"ZeRO stage {int(stage)}: DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 (its "
                         "assert in runtime/pipe/engine.py), with one pipeline stage too, since every mesh runs as a "
                         "PipelineModule; and the planner prices ZeRO-0 and ZeRO-1 only", file=file,
                         field="zero_optimization.stage",
                         fix="set it to 1 (the distributed optimizer) or 0, as 'hetauto emit deepspeed' writes it from "
                             "the mesh's distributed_optimizer setting")


def validate(cfg: dict, dp: int, *, where: str = "the DeepSpeed config", file: str | None = None):
    """Parse `cfg` with DeepSpeed's own DeepSpeedConfig as a job of data-parallel size `dp` would, then check
    what that parser lets through. Returns the parsed DeepSpeedConfig; raises InputError naming the problem."""
    ds_comm, DeepSpeedConfig, act_keys = _import_deepspeed()
    problems = []
    unknown = sorted(set(cfg) - _DS_TOP_KEYS - {OUR_KEY})
    if unknown:
        problems.append(f"unknown top-level key(s) {', '.join(unknown)} (DeepSpeed would ignore them silently)")
    bad = sorted(set(cfg.get("activation_checkpointing", {})) - act_keys)
    if bad:
        problems.append(f"unknown activation_checkpointing key(s) {', '.join(bad)}")
    bad = sorted(set(cfg.get("pipeline", {})) - _PIPELINE_KEYS_READ)
    if bad:
        problems.append(f"pipeline key(s) {', '.join(bad)} that DeepSpeed's engine never reads (stages and partition "
                        "are PipelineModule arguments)")
    if problems:
        raise InputError("; ".join(problems), file=file, field=where)
    check_hand_edits(cfg, file=file)
    try:
        with _quiet(), _data_parallel_world(ds_comm, dp):
            parsed = DeepSpeedConfig(copy.deepcopy(cfg))
    except Exception as exc:   # DeepSpeed raises AssertionError/ValueError/pydantic errors: all mean "invalid"
        first = first_line(exc)
        raise InputError(f"rejected by DeepSpeed's parser with data-parallel size {dp}: {first}", file=file,
                         field=where) from None
    if parsed.world_size != dp:
        raise InputError(f"DeepSpeed parsed it for data-parallel size {parsed.world_size}, expected {dp}", file=file,
                         field=where)
    return parsed


def emit_deepspeed(plan: Plan, *, file: str | None = None) -> list[dict]:
    """Per mesh: name, the validated config, and what DeepSpeed derived (launches.only_cluster keeps one
    cluster's)."""
    require_simple(plan, "hetauto emit deepspeed", file)
    names = file_stems([m.cluster for m in plan.meshes], list(range(len(plan.meshes))), file)
    configs = [deepspeed_config(plan, i) for i in range(len(plan.meshes))]
    check_one_grid([cfg[OUR_KEY] for cfg in configs], file=file)     # before any is parsed: none is written
    out = []
    for i, cfg in enumerate(configs):
        mesh = plan.meshes[i]
        name = names[i]
        parsed = validate(cfg, mesh.dp, where=f"meshes[{i}] ({name})")
        out.append({"name": name, "mesh": i, "cluster": mesh.cluster, "data_parallel_size": mesh.dp,
                    "config": cfg,
                    "parsed": {"train_batch_size": parsed.train_batch_size,
                               "train_micro_batch_size_per_gpu": parsed.train_micro_batch_size_per_gpu,
                               "gradient_accumulation_steps": parsed.gradient_accumulation_steps,
                               "zero_stage": parsed.zero_optimization_stage,
                               "overlap_comm": bool(parsed.zero_config.overlap_comm),
                               "communication_data_type": str(parsed.communication_data_type).replace("torch.", ""),
                               "grad_accum_dtype": parsed.grad_accum_dtype,
                               "bf16": bool(parsed.bfloat16_config.enabled)}})
    return out
