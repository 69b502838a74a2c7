"""Who this process is in a plan's job, from the launch environment, and whether the launch is the plan's (pure
functions, no torch): global rank = HETAUTO_RANK_OFFSET + torchrun's RANK, the world HETAUTO_WORLD_SIZE, and the
processes of this cluster's launch (torchrun's WORLD_SIZE) those of the plan's launch at that offset. Each mismatch
is an InputError naming the variable or flag to fix, before any process waits at the rendezvous."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from ..errors import InputError
from ..plan.plan import Plan
from ..runtime.ranks import RankCoords, check_world_size, rank_coords


# what torchrun sets for each worker (the others are the launch scripts' HETAUTO_* variables)
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


@dataclass(frozen=True)
class LaunchIdentity:
    """This process's global rank and the world size, from the launch environment (docs: launch contract)."""
    rank: int
    world_size: int
    cluster: str | None
    local_rank: int = 0
    rank_offset: int = 0
    notes: tuple[str, ...] = field(default=())
    launch_world: int | None = None     # the processes of this cluster's launch (torchrun's WORLD_SIZE), when the
                                        # clusters launch separately (HETAUTO_WORLD_SIZE set)


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
            if name in TORCHRUN_VARIABLES:
                fix = (f"let torchrun set {name} (the launch scripts of 'hetauto emit megatron' start it), or, starting "
                       f"one process by hand, give {name} a whole number (e.g. RANK=0 LOCAL_RANK=0 WORLD_SIZE=1) or "
                       "unset it")
            else:
                fix = "set it as the launch command from 'hetauto emit megatron' does"
            raise InputError(f"environment variable {name}={raw!r} is not an integer", field=name, fix=fix) from None

    offset = as_int("HETAUTO_RANK_OFFSET", 0)
    local = as_int("RANK", 0)
    world = as_int("HETAUTO_WORLD_SIZE", None)
    launch_world = None
    if world is None:
        if offset:
            raise InputError("HETAUTO_RANK_OFFSET is set but HETAUTO_WORLD_SIZE is not", field="HETAUTO_WORLD_SIZE",
                             fix="set HETAUTO_WORLD_SIZE to the plan's total number of ranks")
        world = as_int("WORLD_SIZE", 1)
    else:
        launch_world = as_int("WORLD_SIZE", None)
    return LaunchIdentity(rank=offset + local, world_size=world, cluster=env.get("HETAUTO_CLUSTER") or None,
                          local_rank=as_int("LOCAL_RANK", 0), rank_offset=offset, launch_world=launch_world)


def check_launch(plan: Plan, ident: LaunchIdentity, cluster: str | None, *, file: str | None = None) -> RankCoords:
    """The launched world must be the plan's, and this process must run on the cluster the plan puts it on."""
    check_world_size(plan, ident.world_size, file=file)
    check_launch_size(plan, ident, file=file)
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


def check_launch_size(plan: Plan, ident: LaunchIdentity, *, file: str | None = None) -> None:
    """A cluster's launch (torchrun's world: --nnodes x --nproc-per-node) starts the ranks of the plan's launch that
    begins at HETAUTO_RANK_OFFSET (Plan.launch_groups, what 'hetauto emit megatron' writes one script for), or of
    that one and the next ones together (one torchrun over several clusters' launches, up to the whole job): any
    other count would leave every cluster waiting at the rendezvous, or take other clusters' ranks."""
    if ident.launch_world is None:
        return
    groups = plan.launch_groups()
    starts = [plan.rank_offset(idx[0]) for idx in groups]
    if ident.rank_offset not in starts:
        return          # an offset inside a launch: rank_coords places the rank (or refuses it)
    first = starts.index(ident.rank_offset)
    ends = [s - ident.rank_offset for s in starts[first + 1:]] + [plan.world_size - ident.rank_offset]
    if ident.launch_world in ends:      # this launch's ranks, or those of it and the next ones together
        return
    cluster, n = plan.meshes[groups[first][0]].cluster, ends[0]
    raise InputError(f"this launch of cluster {cluster} started {ident.launch_world} processes (torchrun's "
                     f"WORLD_SIZE: --nnodes x --nproc-per-node), but the plan runs {n} there (global ranks "
                     f"{ident.rank_offset}-{ident.rank_offset + n - 1})", file=file, field="--nproc-per-node",
                     fix="start the cluster with the launch script 'hetauto emit megatron' wrote for it (its --nnodes "
                         "and --nproc-per-node)")


def check_world_rendezvous(ident: LaunchIdentity, env: Mapping[str, str] | None = None) -> None:
    """A launch that starts only some of the world's ranks (HETAUTO_WORLD_SIZE above torchrun's WORLD_SIZE: the
    clusters launch separately) needs HETAUTO_MASTER_ADDR, where every cluster's ranks meet: without it each
    launch's ranks met only at their own torchrun's rendezvous, never the others', and every rank waited the whole
    HETAUTO_TIMEOUT_S, then stopped naming HETAUTO_WORLD_SIZE. Checked as the rank joins the world, after its
    arguments (a refused argument says what is wrong with the launch first)."""
    env = os.environ if env is None else env
    if env.get("HETAUTO_MASTER_ADDR") or ident.launch_world is None or ident.launch_world >= ident.world_size:
        return
    raise InputError(f"this launch starts {ident.launch_world} of the world's {ident.world_size} ranks (torchrun's "
                     "WORLD_SIZE and HETAUTO_WORLD_SIZE), so the other clusters' ranks are started elsewhere, but "
                     "HETAUTO_MASTER_ADDR is not set: each launch's ranks would meet only at their own torchrun's "
                     "rendezvous and wait for the others until the timeout", field="HETAUTO_MASTER_ADDR",
                     fix="set HETAUTO_MASTER_ADDR to node 0 of the first cluster (where global rank 0 runs, reachable "
                         "from every cluster) and HETAUTO_MASTER_PORT to a port free there, the same on every "
                         "cluster, as the launch scripts of 'hetauto emit megatron' do")
