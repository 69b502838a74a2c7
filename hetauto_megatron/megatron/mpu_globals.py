"""Megatron's parallel_state globals filled from the plan's process groups (a ProcessGroupCollection).

Megatron-LM 0.19 passes `pg_collection` to the model and the schedule, but DDP, the optimizer, the data loader
and the loss reduction still read parallel_state's globals. Under --hetauto each process belongs to exactly one
mesh, so this rank's own mesh groups are what those globals must hold (megatron/hook.py calls this once the
runtime has built the groups).
"""
from __future__ import annotations

# parallel_state global -> ProcessGroupCollection field. Megatron's own mapping the other way round is
# ProcessGroupCollection.use_mpu_process_groups(); the GTP_remat variants equal the plain groups (no GTP).
# The expert and distributed-optimizer fields are filled by runtime.groups.build_groups as Megatron makes
# them for a dense model; this table only copies.
_MPU_GROUPS = {
    "_TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "_PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "_MODEL_PARALLEL_GROUP": "mp",
    "_EMBEDDING_GROUP": "embd",
    "_POSITION_EMBEDDING_GROUP": "pos_embd",
    "_CONTEXT_PARALLEL_GROUP": "cp",
    "_TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp_cp",
    "_DATA_PARALLEL_GROUP": "dp",
    "_DATA_PARALLEL_GROUP_WITH_GTP_REMAT": "dp",
    "_DATA_PARALLEL_GROUP_WITH_CP": "dp_cp",
    "_DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT": "dp_cp",
    "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "dp_cp",
    "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT": "dp_cp",
    "_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "tp_dp_cp",
    "_EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "_EXPERT_TENSOR_PARALLEL_GROUP": "expt_tp",
    "_EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": "tp_ep",
    "_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": "tp_ep_pp",
    "_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP": "tp_ep_pp",
    "_EXPERT_DATA_PARALLEL_GROUP": "expt_dp",
    "_EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT": "expt_dp",
    "_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP": "expt_dp",
    "_INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP": "intra_dist_opt",
}
# parallel_state rank-list global -> ProcessGroupCollection field
_MPU_RANKS = {
    "_TENSOR_MODEL_PARALLEL_GLOBAL_RANKS": "tp",
    "_PIPELINE_GLOBAL_RANKS": "pp",
    "_MODEL_PARALLEL_GLOBAL_RANKS": "mp",
    "_EMBEDDING_GLOBAL_RANKS": "embd",
    "_POSITION_EMBEDDING_GLOBAL_RANKS": "pos_embd",
    "_CONTEXT_PARALLEL_GLOBAL_RANKS": "cp",
    "_DATA_PARALLEL_GLOBAL_RANKS": "dp",
    "_DATA_PARALLEL_GLOBAL_RANKS_WITH_CP": "dp_cp",
}
# Same group on a gloo backend, read by the distributed optimizer (RankContext.dp_gloo).
_MPU_GLOO_GROUPS = {
    "_DATA_PARALLEL_GROUP_GLOO": "dp",
    "_DATA_PARALLEL_GROUP_WITH_CP_GLOO": "dp_cp",
    "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO": "dp_cp",
    "_EXPERT_DATA_PARALLEL_GROUP_GLOO": "expt_dp",
    "_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP_GLOO": "expt_dp",
}



def populate_parallel_state(pg, dp_gloo: dict | None = None) -> list[str]:
    """Fill megatron.core.parallel_state with this rank's groups from a ProcessGroupCollection.

    Megatron-LM 0.19 passes `pg_collection` to the model and the schedule, but DDP (model_provider path),
    `get_megatron_optimizer`, the data loader and the loss reduction still read the globals. The gloo DP
    globals get the gloo copies `dp_gloo` (RankContext.dp_gloo: build_groups(host_dp_copies=True); a CPU mesh's
    own groups). Returns the names set (for tests)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    def field(name):  # a field the collection leaves unset is simply not copied
        return getattr(pg, name, None)

    done = []
    for glob, name in _MPU_GROUPS.items():
        group = field(name)
        if group is not None and hasattr(ps, glob):
            setattr(ps, glob, group)
            done.append(glob)
    for glob, name in _MPU_RANKS.items():
        group = field(name)
        if group is not None and hasattr(ps, glob):
            setattr(ps, glob, dist.get_process_group_ranks(group))
            done.append(glob)
    for glob, name in _MPU_GLOO_GROUPS.items():
        group = (dp_gloo or {}).get(name)
        if group is not None and hasattr(ps, glob):
            setattr(ps, glob, group)
            done.append(glob)
    return done
