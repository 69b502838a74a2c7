"""Where each rank sits in a plan: pure rank arithmetic (no torch, no processes).

Rank layout (the plan's, docs/plan-format.md): meshes own consecutive rank ranges; inside a mesh Megatron's
order applies (tp fastest, then dp, then pipeline stage). From it: a rank's coordinates (`rank_coords`, for
messages `describe_rank`) and their inverse (`global_rank`), the ranks of one mesh stage or of one pipeline stage,
and the checks that the launched world is the plan's (`check_world_size`, `validate_launch`: exit 2 before any
group exists).

Apart from groups.py, which creates the torch.distributed groups from these rank lists, as Megatron-Core's
RankGenerator keeps its arithmetic apart from group creation: the launch checks of Megatron-LM's --hetauto, the
boundary and message bookkeeping and the tests use it without torch or a process group.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError


@dataclass(frozen=True)
class RankCoords:
    """Where one rank sits in a plan. `stage` is the pipeline stage inside the rank's own pipeline (the global
    stage in a plan of one pipeline). `position` is the index, inside that pipeline, of the rank's position (its
    mesh and the meshes alongside it: they hold the same stages); `sample_start`/`sample_stop` are this rank's
    replica's samples inside one micro-batch step of its pipeline (docs/plan-format.md, version 3)."""
    rank: int
    mesh_index: int
    cluster: str
    device_type: str
    stage: int
    stage_in_mesh: int
    tp_rank: int
    dp_rank: int
    pipeline: int = 0
    position: int = 0
    sample_start: int = 0
    sample_stop: int = 0


def rank_coords(plan, rank: int, *, file: str | None = None) -> RankCoords:
    """Pure: the mesh, stage, TP rank and DP rank of a global rank. A rank outside the plan is an InputError
    (the launch gave a process a rank the plan does not have)."""
    if not 0 <= rank < plan.world_size:
        sizes = ", ".join(f"{m.cluster}: ranks {plan.rank_offset(i)}-{plan.rank_offset(i) + m.num_devices - 1}"
                          for i, m in enumerate(plan.meshes))
        raise InputError(f"global rank {rank} is outside the plan's {plan.world_size} ranks ({sizes})", file=file,
                         field="meshes", fix="launch each cluster with the rank offset and world size "
                                             "'hetauto emit megatron' prints (HETAUTO_RANK_OFFSET + RANK must be "
                                             f"below {plan.world_size})")
    for i, mesh in enumerate(plan.meshes):
        local = rank - plan.rank_offset(i)
        if local < mesh.num_devices:
            tp_rank = local % mesh.tp
            dp_rank = (local // mesh.tp) % mesh.dp
            sim = local // (mesh.tp * mesh.dp)
            pipeline, position, first = plan.locate(i)
            start, stop = plan.sample_range(i, dp_rank)
            return RankCoords(rank, i, mesh.cluster, mesh.device_type, first + sim, sim, tp_rank, dp_rank,
                              pipeline, position, start, stop)
    raise AssertionError("unreachable")


def describe_rank(plan, rank: int) -> str:
    """'rank 5 (pipeline 1, cluster b, stage 0)' for messages; the pipeline is named only when there are several."""
    c = rank_coords(plan, rank)
    where = f"pipeline {c.pipeline}, " if plan.num_pipelines > 1 else ""
    return f"rank {rank} ({where}cluster {c.cluster}, stage {c.stage})"


def global_rank(plan, mesh_index: int, stage_in_mesh: int, dp: int, tp: int) -> int:
    """Pure inverse of rank_coords."""
    mesh = plan.meshes[mesh_index]
    return plan.rank_offset(mesh_index) + (stage_in_mesh * mesh.dp + dp) * mesh.tp + tp


def cluster_first_ranks(plan) -> dict[str, int]:
    """Each cluster's lowest global rank, by cluster: the rank that writes what Megatron-LM writes once per job
    (global rank 0's files) on its cluster's file system, where the clusters share none."""
    first: dict[str, int] = {}
    for i, mesh in enumerate(plan.meshes):
        first[mesh.cluster] = min(first.get(mesh.cluster, plan.world_size), plan.rank_offset(i))
    return first


def mesh_stage_ranks(plan, mesh_index: int, stage_in_mesh: int) -> list[int]:
    """Global ranks of one stage of one mesh, in Megatron's order (dp-major, tp fastest)."""
    mesh = plan.meshes[mesh_index]
    return [global_rank(plan, mesh_index, stage_in_mesh, d, t) for d in range(mesh.dp) for t in range(mesh.tp)]


def stage_ranks(plan, stage: int, pipeline: int = 0) -> list[int]:
    """Global ranks of one pipeline stage of one pipeline: in Megatron order (dp-major, tp fastest) for each mesh
    holding it, mesh after mesh (a mesh and the meshes alongside it). IndexError for a stage the pipeline lacks."""
    if stage < 0:
        raise IndexError(stage)
    first = 0
    for pos in plan.positions(pipeline):
        n = plan.meshes[pos[0]].num_stages
        if stage < first + n:
            return [r for i in pos for r in mesh_stage_ranks(plan, i, stage - first)]
        first += n
    raise IndexError(stage)


def check_world_size(plan, world_size: int, *, file: str | None = None) -> None:
    """The launched world must be the plan's (InputError, exit 2, before any group exists). Pure: both launch
    paths call it, hetauto's runtime (`validate_launch`) and Megatron-LM's --hetauto (megatron/launch_identity.py)."""
    if world_size != plan.world_size:
        detail = ", ".join(f"{m.cluster}: tp{m.tp} x dp{m.dp} x {m.num_stages} stage(s) = {m.num_devices}"
                           for m in plan.meshes)
        raise InputError(f"the job was launched with {world_size} processes but the plan needs {plan.world_size} "
                         f"({detail})", file=file, field="meshes",
                         fix=f"launch {plan.world_size} processes, every cluster with the commands 'hetauto emit "
                             "megatron --plan' prints (they set HETAUTO_WORLD_SIZE and HETAUTO_RANK_OFFSET), or "
                             "pass the plan made for this job, or re-plan for the devices you have")


def validate_launch(plan, world_size: int, *, device_types: list[str] | None = None, file: str | None = None) -> None:
    """Fail (InputError, exit 2) when the launched job does not match the plan.

    `device_types`, when given, is the device type each launched rank really has (index = rank).
    """
    check_world_size(plan, world_size, file=file)
    if device_types is not None:
        from ..spec.devices import canonical_device_name
        for rank, have in enumerate(device_types):
            c = rank_coords(plan, rank)
            if canonical_device_name(have) != c.device_type:
                raise InputError(f"rank {rank} runs on {have} but the plan puts it in mesh {c.mesh_index} "
                                 f"(cluster {c.cluster}) on {c.device_type}", file=file,
                                 field=f"meshes[{c.mesh_index}].device_type",
                                 fix="order the launch so each cluster's ranks get the plan's rank range "
                                     f"(mesh {c.mesh_index} starts at rank {plan.rank_offset(c.mesh_index)})")
