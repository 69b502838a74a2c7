"""Process groups from a plan: every rank gets Megatron's groups for its mesh and the plan's cross-mesh groups.

Rank layout (the plan's, docs/plan-format.md; the arithmetic is ranks.py's): meshes own consecutive rank ranges;
inside a mesh Megatron's order applies (tp fastest, then dp, then pipeline stage). Each mesh is therefore an
ordinary Megatron grid with a rank offset, and its TP / DP / CP groups come from Megatron's own
`HyperCommGrid(rank_offset=...)` on the cluster's native backend.

What Megatron cannot express is the pipeline across meshes whose stages have different sizes (and stages held
by several meshes side by side, runtime/layout.py). The schedule only asks its pipeline group for rank()
(= stage) and size() (= stages), so each rank gets a "chain": one rank per stage, chain j taking the
(j mod n)-th rank of a stage with n ranks (all meshes of the stage counted). The data itself moves through
`HeteroP2PCommunicator`, which knows the real partners. Each pair of meshes at consecutive stages in different
clusters gets its own gloo group (host-staged traffic); tied embeddings get a gloo group over the first and last
stage.

With several pipelines every pipeline gets its chains and boundary groups, pipeline after pipeline; the
parameters they all hold are summed across them on one more gloo group over all ranks (replica_sync.py).

Every rank creates every group in the same order (torch.distributed requires it), after joining the world
(rendezvous.py). A plan that does not fit the launched world fails in `ranks.validate_launch` before any group
exists.
"""
from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass, field

from ..errors import InputError
from . import device as devlayer
from .layout import PipelineLayout
from .ranks import RankCoords, mesh_stage_ranks, rank_coords, validate_launch


@dataclass
class RankContext:
    """Everything one rank needs to run its share of a plan with Megatron-Core.

    `pg` is the `ProcessGroupCollection` to hand to GPTModel, DDP, the optimizer, finalize_model_grads and
    the schedule. `boundary_groups[(i, j)]` is the gloo group of the pipeline boundary from mesh i to mesh j
    (consecutive stages) when they are in different clusters (absent when in the same cluster; None on a rank
    outside it). `layout` says which meshes hold each stage of the rank's pipeline and which samples each replica
    holds. `replica_group` is the gloo group over all ranks on which replica_sync.py sums the gradients of
    parameters that several mesh stages hold: other pipelines, meshes side by side, and the tied ends of the
    embedding table (None when no parameter has two holders: a simple plan without tied embeddings across stages).
    """
    plan: object
    coords: RankCoords
    world_size: int
    pg: object
    world_gloo: object
    boundary_groups: dict = field(default_factory=dict)
    timeout_s: float = 60.0
    dry_run: bool = False
    replica_group: object = None
    dp_gloo: dict = field(default_factory=dict)    # {"dp", "dp_cp", "expt_dp"}: gloo copies of the DP groups
                                                   # where those run on an accelerator's backend (else empty)

    @property
    def mesh_index(self) -> int:
        return self.coords.mesh_index

    @property
    def batch_share(self) -> float:
        """The share of each iteration's global batch this rank's mesh trains, the weight of its gradients in the
        sum across the meshes holding a parameter (replica_sync.py): its pipeline's share of the batch (1 with one
        pipeline) times the mesh's share of its stage's samples (1 for a mesh alone at its stage)."""
        layout = self.layout
        return layout.samples / self.plan.global_batch_size * layout.sample_share(self.coords.mesh_index)

    @property
    def mesh(self):
        return self.plan.meshes[self.coords.mesh_index]

    @functools.cached_property
    def precision(self) -> str:
        """The precision this rank trains in: fp32 in a dry run and on CPU processes (exact parity with the
        single-process reference), else the plan's for its mesh (Plan.mesh_precision). fp8 is refused: the
        runtime's layers are Megatron's local spec, and fp8 runs on Transformer Engine's (Megatron-LM's launch)."""
        if self.dry_run or self.device == "cpu":
            return "fp32"
        precision = self.plan.mesh_precision(self.coords.mesh_index)
        every = {self.plan.mesh_precision(i) for i in range(len(self.plan.meshes))}
        if len(every) > 1:
            raise InputError(f"the plan's meshes would train in {' and '.join(sorted(every))} (CPU processes train "
                             "in fp32): the runtime passes one element type between stages",
                             field="meshes[*].device_type",
                             fix="run such a plan as a dry run ('hetauto dryrun'), or give every mesh an accelerator")
        if precision == "fp8":
            raise InputError("hetauto's own runtime trains Megatron's local layer spec, which has no fp8; fp8 runs "
                             "on Transformer Engine's layers", field="precision",
                             fix="run the plan through Megatron-LM ('hetauto emit megatron', --hetauto), or plan "
                                 "with --precision bf16")
        return precision

    @functools.cached_property
    def layout(self) -> PipelineLayout:
        # built once: the communicator, batch_share and layer_offset read it on every step (the plan is frozen)
        return PipelineLayout(self.plan, self.mesh.pipeline)

    @property
    def num_stages(self) -> int:
        return self.layout.num_stages

    @property
    def is_first_stage(self) -> bool:
        return self.coords.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coords.stage == self.num_stages - 1

    @property
    def device(self) -> str:
        """torch device of this rank's tensors ('cpu' in a dry run)."""
        return "cpu" if self.dry_run else devlayer.torch_device_for(self.coords.device_type)

    @property
    def layer_offset(self) -> int:
        """Global index of this stage's first transformer layer."""
        return sum(self.layout.stage_layers[: self.coords.stage])


def build_groups(plan, rank: int, world_size: int, *, timeout_s: float = 60.0, dry_run: bool = False,
                 host_dp_copies: bool = False) -> RankContext:
    """Create all of the plan's process groups (collective: every rank calls it) and return this rank's context.
    `host_dp_copies`: also gloo copies of the DP groups of meshes on accelerators (RankContext.dp_gloo), which
    Megatron-LM's distributed optimizer looks up (the --hetauto hook; hetauto's own runtime does not use them).

    torch.distributed must be initialised (rendezvous.init_distributed).
    """
    import torch.distributed as dist
    from megatron.core.hyper_comm_grid import HyperCommGrid
    from megatron.core.process_groups_config import ProcessGroupCollection

    validate_launch(plan, world_size)
    me = rank_coords(plan, rank)
    timeout = datetime.timedelta(seconds=timeout_s)
    pg = ProcessGroupCollection()
    dp_gloo = {}

    # 1. per mesh, Megatron's own grid with the mesh's rank offset, on the cluster's backend
    for i, mesh in enumerate(plan.meshes):
        backend = "gloo" if dry_run else devlayer.backend_for(mesh.device_type)

        def groups_on(backend, names):
            grid = HyperCommGrid([mesh.tp, 1, 1, mesh.dp, mesh.num_stages], ["tp", "cp", "ep", "dp", "pp"],
                                 rank_offset=plan.rank_offset(i), backend=backend)
            dims = {"tp": ["tp"], "cp": ["cp"], "ep": ["ep"], "dp": ["dp"], "dp_cp": ["dp", "cp"],
                    "tp_cp": ["tp", "cp"]}
            return {name: grid.create_pg(dims[name], timeout=timeout) for name in names}

        made = groups_on(backend, ("tp", "cp", "ep", "dp", "dp_cp", "tp_cp"))
        if i == me.mesh_index:
            for name, group in made.items():
                setattr(pg, name, group)
        if host_dp_copies:
            # Host copies of the DP groups, as Megatron's initialize_model_parallel makes them beside the device's
            # (Megatron-LM's default --enable-gloo-process-groups): its distributed optimizer looks them up when
            # it is built and gathers its state over them for checkpoints (megatron/mpu_globals.py). A gloo
            # mesh's own groups are their copies; the expert DP group of a dense model is the DP group.
            host = made if backend == "gloo" else groups_on("gloo", ("dp", "dp_cp"))
            if i == me.mesh_index:
                dp_gloo = {"dp": host["dp"], "dp_cp": host["dp_cp"], "expt_dp": host["dp"]}

    # 2. and 3., pipeline after pipeline (every rank creates every pipeline's groups, in the same order)
    my_chain, boundary_groups = None, {}
    for p in range(plan.num_pipelines):
        layout = PipelineLayout(plan, p)
        chain, groups = _pipeline_groups(plan, layout, rank, me.stage if p == me.pipeline else None, timeout)
        my_chain = my_chain or chain
        boundary_groups.update(groups)
    pg.pp = my_chain

    world_gloo = dist.new_group(list(range(world_size)), backend="gloo", timeout=timeout)
    # 4. parameters held by several mesh stages (other pipelines, meshes side by side, the tied embedding table
    # at both ends of a pipeline) are summed across their holders by replica_sync.py on this group
    tied = plan.model.tie_embeddings and layout.num_stages > 1
    replica_group = (dist.new_group(list(range(world_size)), backend="gloo", timeout=timeout)
                     if tied or not plan.is_simple else None)

    pg.embd = None        # tied embeddings are summed by replica_sync.py across meshes
    pg.pos_embd = None    # learned positions live on the first stage only
    pg.mp = world_gloo    # gradient statistics: summed over all ranks, see gradients.count_grad_norm_once
    # Expert and distributed-optimizer groups exactly as Megatron's initialize_model_parallel makes them for a
    # dense model (expert parallelism 1, expert TP = TP, one distributed-optimizer instance). DDP, the
    # optimizer, the RNG seeding and Megatron-LM's training loop look them up even without experts, so they
    # are set here, once, for every user of the collection (the --hetauto hook copies them to parallel_state).
    pg.expt_tp = pg.tp
    pg.tp_ep = pg.tp
    pg.expt_dp = pg.dp
    pg.tp_ep_pp = pg.mp
    pg.intra_dist_opt = pg.dp_cp
    return RankContext(plan=plan, coords=me, world_size=world_size, pg=pg, world_gloo=world_gloo,
                       boundary_groups=boundary_groups, timeout_s=timeout_s, dry_run=dry_run,
                       replica_group=replica_group, dp_gloo=dp_gloo)


def _pipeline_groups(plan, layout, rank: int, stage, timeout):
    """One pipeline's chains and cross-cluster boundary groups (collective: every rank of the world calls it).
    Returns (this rank's chain group or None, {(i, j): boundary group or None}); `stage` is this rank's stage
    when the pipeline is its own, else None."""
    import torch.distributed as dist

    # 2. pipeline chains across meshes (only rank()/size() are used by Megatron); a stage held by several meshes
    #    side by side contributes all their ranks
    per_stage = [layout.stage_ranks(s) for s in range(layout.num_stages)]
    chains = []
    for j in range(max(len(r) for r in per_stage)):
        chain = [r[j % len(r)] for r in per_stage]
        if chain not in chains:
            chains.append(chain)
    my_chain = None
    for chain in chains:
        group = dist.new_group(chain, backend="gloo", timeout=timeout)
        if my_chain is None and stage is not None and chain[stage] == rank:
            my_chain = group

    # 3. cross-cluster boundaries: a host-staged gloo group per pair of meshes at consecutive stages in
    #    different clusters (the last stage of one, the first of the other)
    boundary_groups = {}
    for before, after in zip(layout.positions, layout.positions[1:]):
        for i in before:
            for j in after:
                a, b = plan.meshes[i], plan.meshes[j]
                if a.cluster == b.cluster:
                    continue
                ranks = mesh_stage_ranks(plan, i, a.num_stages - 1) + mesh_stage_ranks(plan, j, 0)
                group = dist.new_group(sorted(ranks), backend="gloo", timeout=timeout)
                boundary_groups[(i, j)] = group if rank in ranks else None
    return my_chain, boundary_groups


def set_megatron_globals(ctx: RankContext) -> None:
    """Set the globals Megatron-Core 0.19.2 still reads despite explicit groups. Safe per process because a
    process belongs to exactly one stage of one mesh."""
    from megatron.core import parallel_state as ps

    ps.set_pipeline_model_parallel_rank(ctx.coords.stage)            # read by the pipeline layout path
    ps.set_pipeline_model_parallel_world_size(ctx.num_stages)
    ps._TENSOR_MODEL_PARALLEL_GROUP = ctx.pg.tp                     # read by vocab_parallel_cross_entropy
    if ps._GLOBAL_MEMORY_BUFFER is None:
        ps._set_global_memory_buffer()                              # attention scratch space (local spec)
