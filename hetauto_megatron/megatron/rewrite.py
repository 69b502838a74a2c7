"""Per-rank rewrite of Megatron-LM's arguments from a hetauto plan (pure functions, no torch).

Megatron-LM assumes one TP degree, one DP degree and one micro-batch size for the whole job. Under a
heterogeneous plan those are properties of a mesh, so every rank gets the values of ITS mesh, while the
values that are global by nature (pipeline depth, per-stage layer layout, global batch) are the plan's:

    tensor_model_parallel_size   <- mesh.tp
    data_parallel_size           <- mesh.dp   (Megatron derives it from world_size; see `validation_world_size`)
    micro_batch_size             <- mesh.micro_batch_size
    recompute_*                  <- mesh.recompute (plan.plan.RECOMPUTE_SETTINGS: selective = the MLP)
    sequence_parallel            <- mesh.settings.sequence_parallel (plan/settings.py)
    pipeline_model_parallel_size <- plan.pipeline_parallel_size
    pipeline_model_parallel_layout <- the plan's stage_layers, e.g. "Et*4|t*4L"
    global_batch_size            <- plan.global_batch_size

The plan's invariant dp * micro_batch_size = const makes Megatron compute the same number of micro-batches
on every rank, which the 1F1B schedule needs. Model-shape arguments are checked against the plan's model:
a value the user left unset is filled in, a contradicting one is an error (the plan was made for another
model, so its layout and memory estimate do not apply).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from ..errors import InputError
from ..plan.plan import Plan
from ..runtime.groups import RankCoords, rank_coords
from ..plan.plan import recompute_settings
from ..runtime.model import pipeline_layout

# Megatron argument -> ModelSpec attribute; checked (or filled in) on every rank.
MODEL_ARGS = {
    "num_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "ffn_hidden_size": "ffn_hidden_size",
    "seq_length": "seq_length",
}

# Arguments that choose a pipeline split some other way; the plan's layout replaces them.
_OTHER_SPLIT_ARGS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                     "num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank")


@dataclass(frozen=True)
class LaunchIdentity:
    """This process's global rank and the world size, from the launch environment (docs: launch contract)."""
    rank: int
    world_size: int
    cluster: str | None
    local_rank: int = 0
    rank_offset: int = 0
    notes: tuple[str, ...] = field(default=())


def identity_from_env(env: Mapping[str, str] | None = None) -> LaunchIdentity:
    """Global rank = HETAUTO_RANK_OFFSET + RANK (torchrun's RANK is relative to its cluster's launch);
    world size = HETAUTO_WORLD_SIZE, else WORLD_SIZE when one launch covers every rank."""
    env = os.environ if env is None else env

    def as_int(name: str, default: int | None) -> int | None:
        raw = env.get(name)
        if raw in (None, ""):
            return default
        try:
            return int(raw)
        except ValueError:
            raise InputError(f"environment variable {name}={raw!r} is not an integer", field=name,
                             fix="set it as the launch command from 'hetauto emit megatron' does") from None

    offset = as_int("HETAUTO_RANK_OFFSET", 0)
    local = as_int("RANK", 0)
    world = as_int("HETAUTO_WORLD_SIZE", None)
    if world is None:
        if offset:
            raise InputError("HETAUTO_RANK_OFFSET is set but HETAUTO_WORLD_SIZE is not", field="HETAUTO_WORLD_SIZE",
                             fix="set HETAUTO_WORLD_SIZE to the plan's total number of ranks")
        world = as_int("WORLD_SIZE", 1)
    return LaunchIdentity(rank=offset + local, world_size=world, cluster=env.get("HETAUTO_CLUSTER") or None,
                          local_rank=as_int("LOCAL_RANK", 0), rank_offset=offset)


def check_launch(plan: Plan, ident: LaunchIdentity, cluster: str | None, *, file: str | None = None) -> RankCoords:
    """The launched world must be the plan's, and this process must run on the cluster the plan puts it on."""
    if ident.world_size != plan.world_size:
        sizes = ", ".join(f"{m.cluster}: {m.num_devices}" for m in plan.meshes)
        raise InputError(f"the job was launched with {ident.world_size} processes but the plan needs "
                         f"{plan.world_size} ({sizes})", file=file, field="meshes",
                         fix="launch every cluster with the commands from 'hetauto emit megatron --plan' "
                             "(HETAUTO_WORLD_SIZE, HETAUTO_RANK_OFFSET), or pass the plan made for this job")
    placement = rank_coords(plan, ident.rank, file=file)  # the range check (InputError) lives there
    names = sorted({m.cluster for m in plan.meshes})
    if cluster and cluster not in names:
        raise InputError(f"the plan has no cluster '{cluster}' (its clusters: {', '.join(names)})", file=file,
                         field="--hetauto-cluster",
                         fix="pass --hetauto-cluster (or HETAUTO_CLUSTER) with the name the plan gives this cluster")
    if cluster and cluster != placement.cluster:
        raise InputError(f"global rank {ident.rank} runs on cluster '{cluster}', but the plan puts it on mesh "
                         f"{placement.mesh_index} of cluster '{placement.cluster}'", file=file,
                         field=f"meshes[{placement.mesh_index}].cluster",
                         fix="check HETAUTO_RANK_OFFSET and the launch order of the clusters "
                             "('hetauto emit megatron' prints both)")
    return placement


def model_arg_values(plan: Plan) -> dict:
    """The plan model's values of Megatron's model-shape arguments."""
    m = plan.model
    values = {arg: getattr(m, attr) for arg, attr in MODEL_ARGS.items()}
    values["group_query_attention"] = m.num_query_groups != m.num_attention_heads
    values["num_query_groups"] = m.num_query_groups if values["group_query_attention"] else None
    return values


def check_model_args(args, plan: Plan, *, file: str | None = None) -> dict:
    """Compare Megatron's model-shape arguments with the plan's model. Returns the values to fill in (the ones
    the user left unset); raises InputError listing every contradiction."""
    want = model_arg_values(plan)
    fill, clashes = {}, []
    for arg in MODEL_ARGS:
        have = getattr(args, arg, None)
        if have is None:
            fill[arg] = want[arg]
        elif int(have) != want[arg]:
            clashes.append(f"--{arg.replace('_', '-')} {have} (plan: {want[arg]})")
    # Key/value heads: Megatron spells "no GQA" by leaving --group-query-attention off, so an absent flag
    # counts as unset and takes the plan's value; an explicit --num-query-groups must agree.
    if getattr(args, "group_query_attention", False):
        have_kv = getattr(args, "num_query_groups", None)
        if have_kv is None:
            fill["num_query_groups"] = plan.model.num_query_groups
        elif int(have_kv) != plan.model.num_query_groups:
            clashes.append(f"--num-query-groups {have_kv} (plan: {plan.model.num_query_groups})")
    elif want["group_query_attention"]:
        fill["group_query_attention"] = True
        fill["num_query_groups"] = want["num_query_groups"]
    if clashes:
        raise InputError(f"the Megatron arguments describe another model than the plan's '{plan.model.name}': "
                         + "; ".join(clashes), file=file, field="model",
                         fix="pass the plan's model arguments (or drop them: --hetauto fills them in), or make a "
                             "plan for this model with 'hetauto plan'")
    return fill


def layout_overrides(plan: Plan, placement: RankCoords) -> dict:
    """The per-rank parallel-layout arguments (see the module docstring)."""
    mesh = plan.meshes[placement.mesh_index]
    out = {
        "tensor_model_parallel_size": mesh.tp,
        "pipeline_model_parallel_size": plan.pipeline_parallel_size,
        "context_parallel_size": 1,
        "micro_batch_size": mesh.micro_batch_size,
        "global_batch_size": plan.global_batch_size,
        "pipeline_model_parallel_layout": pipeline_layout(plan.stage_layers),
        **recompute_settings(mesh.recompute),
        # what the mesh's activations look like at its boundaries: the communicator cuts them by this setting
        "sequence_parallel": mesh.settings.sequence_parallel,
        "account_for_embedding_in_pipeline_split": False,
        "account_for_loss_in_pipeline_split": False,
    }
    out.update({k: None for k in _OTHER_SPLIT_ARGS})
    return out


def validation_world_size(plan: Plan, placement: RankCoords) -> int:
    """The world size Megatron's validate_args must see so that it derives this rank's mesh DP
    (data_parallel_size = world_size / (tp * pp)): the homogeneous job this mesh would be on its own."""
    mesh = plan.meshes[placement.mesh_index]
    return mesh.tp * mesh.dp * plan.pipeline_parallel_size


def check_checkpoint_format(args, plan: Plan, *, file: str | None = None) -> None:
    """Checkpointing under a plan whose meshes have different TP sizes needs Megatron's per-rank `torch` format.

    The default `torch_dist` format describes every tensor as one global tensor with one sharding for the
    whole job; a layer sharded TP 2 in one mesh and TP 1 in another fails Megatron's sharding-integrity check
    at the first save (an AssertionError naming the tensor's two local shapes). With `--ckpt-format torch`
    every (TP rank, pipeline stage) writes its own file (mp_rank_TT_PPP, the stage being global and unique),
    so each mesh saves and loads its own shards; resuming gives the uninterrupted run's losses."""
    if not (getattr(args, "save", None) or getattr(args, "load", None)):
        return
    fmt = getattr(args, "ckpt_format", "torch_dist")
    tps = sorted({m.tp for m in plan.meshes})
    if len(tps) > 1 and fmt != "torch":
        raise InputError(f"--ckpt-format {fmt} cannot checkpoint this plan: its meshes shard the layers with "
                         f"different TP sizes ({', '.join(map(str, tps))}), and that format needs one sharding "
                         "for the whole job", file=file, field="--ckpt-format",
                         fix="add --ckpt-format torch (each mesh saves and loads its own shards; "
                             "docs/megatron-integration.md, Checkpoints)")


def rewrite_args(args, plan: Plan, placement: RankCoords, *, file: str | None = None) -> dict:
    """Rewrite a parsed (not yet validated) Megatron argument namespace in place for this rank.
    Returns {argument: (old, new)} for every value that changed, for the start-up log."""
    if getattr(args, "context_parallel_size", 1) not in (None, 1):
        raise InputError(f"--context-parallel-size {args.context_parallel_size} is not supported with --hetauto",
                         file=file, field="--context-parallel-size", fix="drop the flag (plans use no context parallelism)")
    if getattr(args, "num_experts", None):
        raise InputError("mixture-of-experts models are not supported with --hetauto", field="--num-experts",
                         fix="plan and run a dense model")
    check_checkpoint_format(args, plan, file=file)
    new = {**check_model_args(args, plan, file=file), **layout_overrides(plan, placement)}
    new["rank"] = placement.rank
    new["world_size"] = validation_world_size(plan, placement)
    changed = {}
    for key, value in new.items():
        old = getattr(args, key, None)
        if old != value:
            changed[key] = (old, value)
        setattr(args, key, value)
    return changed
