"""Per-rank rewrite of Megatron-LM's arguments from a hetauto plan (pure functions, no torch).

Megatron-LM assumes one TP degree, one DP degree and one micro-batch size for the whole job. Under a
heterogeneous plan those are properties of a mesh, so every rank gets the values of ITS mesh, while the
values that are global by nature (pipeline depth, per-stage layer layout, global batch) are the plan's:

    tensor_model_parallel_size   <- mesh.tp
    data_parallel_size           <- mesh.dp   (Megatron derives it from world_size; see `validation_world_size`)
    micro_batch_size             <- mesh.micro_batch_size
    recompute_*                  <- mesh.recompute (plan.mesh.RECOMPUTE_SETTINGS: selective = the MLP)
    sequence_parallel            <- mesh.settings.sequence_parallel (plan/settings.py)
    pipeline_model_parallel_size <- the stages of the rank's pipeline (plan.layout.PipelineLayout)
    pipeline_model_parallel_layout <- that pipeline's stage layers, e.g. "Et*4|t*4L"
    global_batch_size            <- the samples the rank's mesh trains per iteration: its pipeline's micro-batches
                                    x the mesh's dp x micro_batch_size (= plan.global_batch_size for a plan of
                                    one pipeline; the user's --global-batch-size must be the plan's, the job's)
    sequence_parallel, use_distributed_optimizer, overlap_grad_reduce, overlap_param_gather,
    grad_reduce_in_bf16 / accumulate_allreduce_grads_in_fp32, hidden_dropout, attention_dropout
                                 <- mesh.settings (plan/settings.py, the table the cost model priced)
    bf16, fp16, fp8 (+ transformer_impl) <- plan.precision
    padded_vocab_size, make_vocab_size_divisible_by
                                 <- one padded vocabulary for every mesh (Plan.padded_vocab_size)

Megatron computes micro-batches = global_batch_size / (dp * micro_batch_size), so every rank of a pipeline
(all meshes of its stages, side by side or not) computes its pipeline's number, which the 1F1B schedule needs.
Several pipelines each run their own Megatron pipeline (depth, layout, micro-batches); what joins them (each
pipeline's samples, the gradient sum across them, the logged loss of the whole batch) is hook.py's.

Before the layout is written, the launch's own arguments are checked against the plan: the model's shape and
architecture (model_checks.py: unset shape values filled in, contradictions refused), the runtime settings,
precision and vocabulary (settings_args.py: given per mesh, a flag no mesh of the rank's cluster runs refused), the
job-wide ones here (the global batch, sample-based schedules, the checkpoint format, a typed parallel layout, a
typed recomputation), the features the plan never priced (unpriced.py), the fused kernels an accelerator mesh
was priced with (fusion_args.py) and how Megatron would build its own process groups (group_args.py).
"""
from __future__ import annotations

import re

from ..errors import InputError
from ..plan.layout import mesh_layout, megatron_layout
from ..plan.plan import Plan, recompute_settings
from ..runtime.ranks import RankCoords
from .args import ParserDefaultInt
from .fusion_args import check_fusion_args
from .group_args import check_group_args
from .model_checks import check_model_args
from .settings_args import runtime_setting_overrides
from .training_inputs import check_training_args
from .unpriced import (check_attention_args, check_ddp_bucket_args, check_loss_scale, check_timing_args,
                       check_unpriced)

# Arguments that choose a pipeline split some other way; the plan's layout replaces them.
# (the interleaved schedule's virtual stages are refused: megatron/unpriced.py)
_OTHER_SPLIT_ARGS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")


def layout_overrides(plan: Plan, placement: RankCoords) -> dict:
    """The per-rank parallel-layout arguments (see the module docstring)."""
    mesh = plan.meshes[placement.mesh_index]
    layout = mesh_layout(plan, placement.mesh_index)
    out = {
        "tensor_model_parallel_size": mesh.tp,
        "pipeline_model_parallel_size": layout.num_stages,
        "context_parallel_size": 1,
        "micro_batch_size": mesh.micro_batch_size,
        "global_batch_size": mesh_batch_size(plan, placement.mesh_index),
        "pipeline_model_parallel_layout": megatron_layout(layout.stage_layers),
        **recompute_settings(mesh.recompute),
        # Megatron's legacy spelling of selective recomputation, which its validate_args would turn into
        # recompute_granularity after this rewrite: the plan's recomputation is what runs
        "recompute_activations": False,
        # what the mesh's activations look like at its boundaries: the communicator cuts them by this setting
        "sequence_parallel": mesh.settings.sequence_parallel,
        "account_for_embedding_in_pipeline_split": False,
        "account_for_loss_in_pipeline_split": False,
    }
    out.update({k: None for k in _OTHER_SPLIT_ARGS})
    return out


def mesh_batch_size(plan: Plan, mesh_index: int) -> int:
    """Samples one mesh trains per iteration, Megatron's --global-batch-size on its ranks: its pipeline's
    micro-batches x dp x micro_batch_size (the plan's global batch for a plan of one pipeline of single meshes)."""
    mesh = plan.meshes[mesh_index]
    return mesh_layout(plan, mesh_index).num_micro_batches * mesh.samples_per_step


# Megatron arguments counted in samples: under several pipelines (or meshes side by side) Megatron's sample count
# is the mesh's share of the batch, so a schedule in samples would end or decay at a different iteration on each.
_SAMPLE_ARGS = (("train_samples", "--train-samples", "--train-iters"),
                ("lr_warmup_samples", "--lr-warmup-samples", "--lr-warmup-iters"),
                ("lr_decay_samples", "--lr-decay-samples", "--lr-decay-iters"),
                ("lr_wsd_decay_samples", "--lr-wsd-decay-samples", "--lr-wsd-decay-iters"),
                ("rampup_batch_size", "--rampup-batch-size", None),
                ("step_batch_size_schedule", "--step-batch-size-schedule", None))


def check_job_args(args, plan: Plan, *, file: str | None = None) -> None:
    """The user's job-wide arguments against the plan: --global-batch-size must be the plan's (its time and memory
    were priced for it); a plan that is not one pipeline of single meshes takes iteration-based schedules only
    (and checkpoints in the per-rank `torch` format: `check_checkpoint_format`)."""
    check_checkpoint_format(args, plan, file=file)
    have = getattr(args, "global_batch_size", None)
    if have is not None and int(have) != plan.global_batch_size:
        split = ""
        if plan.num_pipelines > 1:
            split = f" (pipelines: {' + '.join(map(str, plan.samples_per_pipeline))} samples)"
        raise InputError(f"--global-batch-size {have} is not the plan's global batch of {plan.global_batch_size} "
                         f"samples{split}", file=file, field="global_batch_size",
                         fix=f"pass --global-batch-size {plan.global_batch_size} (or drop it: --hetauto sets each "
                             "mesh's share), or make a plan for this batch with 'hetauto plan'")
    if plan.is_simple:
        if getattr(args, "step_batch_size_schedule", None):
            check_batch_schedule(args.step_batch_size_schedule, plan, file=file)
        return
    for arg, flag, instead in _SAMPLE_ARGS:
        if getattr(args, arg, None):
            raise InputError(f"{flag} is not supported with a plan of several pipelines or meshes side by side: "
                             "Megatron counts samples per mesh there", file=file, field=flag,
                             fix=f"use {instead}" if instead else "drop the flag (a plan has one global batch)")
    for arg in ("eval_global_batch_size", "eval_micro_batch_size", "full_validation", "calculate_per_token_loss"):
        if getattr(args, arg, None):
            flag = "--" + arg.replace("_", "-")
            raise InputError(f"{flag} is not supported with a plan of several pipelines or meshes side by side: "
                             "evaluation reads the global batch as training does, and losses and gradients are "
                             "weighted by each mesh's share of the samples", file=file, field=flag,
                             fix="drop the flag")


def check_batch_schedule(schedule: str, plan: Plan, *, file: str | None = None) -> None:
    """Megatron-Core 0.19's --step-batch-size-schedule "THRESHOLD:BATCH ..." on a plan of one pipeline: the global
    batch it trains at from its last threshold on must be the plan's (its time and memory were priced for that
    batch; the earlier ones ramp up to it: Megatron-Core 0.19 ignores the older --rampup-batch-size, with a
    warning), and every batch a whole number of the pipeline's micro-batch steps (each mesh's DP x micro-batch
    size). Megatron takes the schedule's batches instead of --global-batch-size, so a schedule ending elsewhere
    trained the whole run at a batch the plan never priced."""
    step = mesh_layout(plan, 0).step
    pairs = []
    for entry in schedule.replace(",", " ").split():
        threshold, _, batch = entry.partition(":")
        try:
            pairs.append((_count(threshold), _count(batch)))
        except ValueError:
            raise InputError(f"--step-batch-size-schedule entry {entry!r} is not THRESHOLD:BATCH (numbers, "
                             "thresholds with an optional K, M, B or T)", file=file,
                             field="--step-batch-size-schedule",
                             fix=f'e.g. --step-batch-size-schedule "0:{step} 1B:{plan.global_batch_size}"') from None
    if not pairs:
        return
    last = max(pairs)[1]
    odd = [b for _, b in pairs if b <= 0 or b % step]
    if last != plan.global_batch_size or odd:
        why = (f"ends at a global batch of {last} samples; the plan priced {plan.global_batch_size}"
               if last != plan.global_batch_size else
               f"has batches of {', '.join(map(str, odd))} samples, not multiples of the {step} samples of the "
               "plan's micro-batch step (each mesh's DP x micro-batch size)")
        raise InputError(f"--step-batch-size-schedule {schedule!r} {why}", file=file,
                         field="--step-batch-size-schedule",
                         fix=f"end the schedule at {plan.global_batch_size} with batches that are multiples of "
                             f"{step}, or make a plan for the batch it ends at ('hetauto plan --global-batch-size')")


def _count(text: str) -> int:
    """A number of Megatron's batch schedule, with its K, M, B or T suffix (num_microbatches_calculator.py
    _parse_numeric_value)."""
    text = text.strip().upper()
    scale = {"K": 10 ** 3, "M": 10 ** 6, "B": 10 ** 9, "T": 10 ** 12}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def checkpoint_stage(plan: Plan, placement: RankCoords) -> int:
    """The stage number in this rank's checkpoint file name (Megatron's mp_rank_TT_SSS): the index of its mesh
    stage counted over every mesh of the plan in order, so that stages of different pipelines (each has a stage
    0) and meshes side by side at one stage (each with its own TP shards) never share a file. For a plan of one
    pipeline of single meshes it is the pipeline stage, Megatron's own name."""
    return sum(m.num_stages for m in plan.meshes[:placement.mesh_index]) + placement.stage_in_mesh


def validation_world_size(plan: Plan, placement: RankCoords) -> int:
    """The world size Megatron's validate_args must see so that it derives this rank's mesh DP
    (data_parallel_size = world_size / (tp * pp)): the homogeneous job this mesh would be on its own."""
    mesh = plan.meshes[placement.mesh_index]
    return mesh.tp * mesh.dp * mesh_layout(plan, placement.mesh_index).num_stages


def check_checkpoint_format(args, plan: Plan, *, file: str | None = None) -> None:
    """Checkpointing a plan whose meshes shard a parameter differently needs Megatron's per-rank `torch` format:
    meshes with different TP sizes, and any plan of several pipelines or meshes side by side (several meshes hold
    each parameter, each with its own sharding).

    The default `torch_dist` format describes every tensor as one global tensor with one sharding for the
    whole job; a layer sharded TP 2 in one mesh and TP 1 in another fails Megatron's sharding-integrity check
    at the first save (an AssertionError naming the tensor's two local shapes). With `--ckpt-format torch`
    every (TP rank, mesh stage) writes its own file (mp_rank_TT_SSS, the stage unique across meshes:
    `checkpoint_stage`), so each mesh saves and loads its own shards; resuming gives the uninterrupted run's
    losses."""
    fmt = getattr(args, "ckpt_format", "torch_dist")
    if not (getattr(args, "save", None) or getattr(args, "load", None)) or fmt == "torch":
        return
    tps = sorted({m.tp for m in plan.meshes})
    if len(tps) > 1:
        why = (f"its meshes shard the layers with different TP sizes ({', '.join(map(str, tps))}), and that format "
               "needs one sharding for the whole job")
    elif not plan.is_simple:
        why = "it has several pipelines or meshes side by side: several meshes hold each parameter"
    else:
        return
    raise InputError(f"--ckpt-format {fmt} cannot checkpoint this plan: {why}", file=file, field="--ckpt-format",
                     fix="add --ckpt-format torch (each mesh stage saves and loads its own shards; "
                         "docs/megatron-integration.md, Checkpoints)")


def check_layout_args(args, plan: Plan, placement: RankCoords, *, file: str | None = None) -> None:
    """A parallel layout the launch gave must be one the plan runs there, or the user meant another job: TP, the
    micro-batch and the recomputation of some mesh of the rank's cluster in its pipeline (a launch script lists one
    of them where meshes share a node; the rewrite then gives each rank its own), the stages of its pipeline and
    their layers (the interleaved schedule is refused first: megatron/unpriced.py). Megatron's default (1 for the
    degrees, marked: args.py ParserDefaultInt; unset or off for the others) passes; a typed value is checked, and
    passes where it is the plan's (the launch scripts type the plan's). Before, a contradicting recomputation or
    split was replaced by the plan's without a word, as if the launch had asked for it."""
    mesh = plan.meshes[placement.mesh_index]
    here = [plan.meshes[i] for i in plan.launch_meshes(placement.mesh_index)]
    clashes = []
    for dest, values in (("tensor_model_parallel_size", sorted({m.tp for m in here})),
                         ("micro_batch_size", sorted({m.micro_batch_size for m in here})),
                         ("pipeline_model_parallel_size", [mesh_layout(plan, placement.mesh_index).num_stages])):
        have = getattr(args, dest, None)
        if have is not None and not isinstance(have, ParserDefaultInt) and int(have) not in values:
            clashes.append(f"--{dest.replace('_', '-')} {have} (plan: {' or '.join(map(str, values))} on cluster "
                           f"{mesh.cluster})")
    clashes += _recompute_clashes(args, here) + _split_clashes(args, plan, placement)
    if clashes:
        raise InputError("the launch asks for another parallel layout than the plan's: " + "; ".join(clashes),
                         file=file, field="meshes",
                         fix="drop those flags (the --hetauto hook sets each rank's layout from the plan), or make "
                             "a plan of that layout")


_RECOMPUTE_ARGS = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules")


def _recompute_clashes(args, here: list) -> list[str]:
    """The recomputation flags the launch typed (Megatron's defaults: unset; --recompute-activations is its older
    spelling of --recompute-granularity selective), unless some mesh of `here` runs all of them."""
    from ..emit.megatron import recompute_args
    typed = {dest: getattr(args, dest) for dest in _RECOMPUTE_ARGS if getattr(args, dest, None) is not None}
    shown = [f"--{dest.replace('_', '-')} " + (" ".join(map(str, value)) if isinstance(value, list) else str(value))
             for dest, value in typed.items()]
    if getattr(args, "recompute_activations", False):
        typed["recompute_granularity"] = "selective"
        shown.append("--recompute-activations")
    if not typed or any(all(recompute_settings(m.recompute)[dest] == value for dest, value in typed.items())
                        for m in here):
        return []
    shown = " ".join(shown)
    modes = sorted({m.recompute for m in here})
    runs = " or ".join(f"{mode} ({' '.join(recompute_args(mode))})" if recompute_args(mode) else mode
                       for mode in modes)
    return [f"{shown} (plan: recompute {runs} on cluster {here[0].cluster})"]


def _layout_stages(text: str) -> list[str]:
    """Megatron-Core's reading of a --pipeline-model-parallel-layout, as text per stage (PipelineParallelLayerLayout
    .parse_str_to_list: commas dropped, '(...)*n' and 'x*n' unrolled, '|' between stages): 'Et*2|t*2L' and
    'Ett|ttL' are one layout."""
    text = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda found: found.group(1) * int(found.group(2)), text)
    return text.split("|")


def _split_clashes(args, plan: Plan, placement: RankCoords) -> list[str]:
    """The pipeline split flags the launch typed, against the stage layers of the rank's pipeline: its layout
    (compared as Megatron reads it), the first and last stage's layers, and the embedding and the loss, which the
    plan's layout places on the first and last stage without counting them as layers."""
    layers = mesh_layout(plan, placement.mesh_index).stage_layers
    plan_text = megatron_layout(layers) or f"E{'t' * layers[0]}L"
    out = []
    have = getattr(args, "pipeline_model_parallel_layout", None)
    if have is not None and _layout_stages(str(have)) != _layout_stages(plan_text):
        out.append(f"--pipeline-model-parallel-layout {have} (plan: {plan_text}, stage layers {list(layers)})")
    for dest, stage, which in (("decoder_first_pipeline_num_layers", 0, "first"),
                               ("decoder_last_pipeline_num_layers", -1, "last")):
        have = getattr(args, dest, None)
        if have is not None and int(have) != layers[stage]:
            out.append(f"--{dest.replace('_', '-')} {have} (plan: {layers[stage]} layers on the {which} stage, "
                       f"stage layers {list(layers)})")
    for dest, what in (("account_for_embedding_in_pipeline_split", "the embedding"),
                       ("account_for_loss_in_pipeline_split", "the loss")):
        if getattr(args, dest, False):
            out.append(f"--{dest.replace('_', '-')} (plan: stage layers {list(layers)}, {what} not counted as a "
                       "layer)")
    return out


def rewrite_args(args, plan: Plan, placement: RankCoords, *, file: str | None = None) -> dict:
    """Rewrite a parsed (not yet validated) Megatron argument namespace in place for this rank.
    Returns {argument: (old, new)} for every value that changed, for the start-up log."""
    check_unpriced(args, file=file)
    check_timing_args(args, file=file)
    check_group_args(args, file=file)
    check_job_args(args, plan, file=file)
    check_training_args(args, plan, placement.rank)
    check_layout_args(args, plan, placement, file=file)
    check_attention_args(args, plan, placement, file=file)
    fusions = check_fusion_args(args, plan, placement, file=file)
    check_ddp_bucket_args(args, plan, placement, file=file)
    check_loss_scale(args, plan, placement, file=file)
    new = {**check_model_args(args, plan, file=file), **layout_overrides(plan, placement),
           **runtime_setting_overrides(args, plan, placement, file=file), **fusions}
    new["rank"] = placement.rank
    new["world_size"] = validation_world_size(plan, placement)
    changed = {}
    for key, value in new.items():
        old = getattr(args, key, None)
        if old != value:
            changed[key] = (old, value)
        setattr(args, key, value)
    return changed
