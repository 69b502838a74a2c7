"""Gradient rules that keep a heterogeneous pipeline numerically equal to one process running the model.

1. Parameter gradients are reduced over DP inside each mesh: Megatron's DDP / finalize_model_grads on the
   mesh's own DP group (`ctx.pg.dp`): an all-reduce with the plain optimizer, a reduce-scatter with the
   distributed optimizer (then each DP rank holds the reduced gradient of its own shard only).
2. Loss normalisation. Every replica averages its loss over its own micro-batch (mbs samples) and DDP
   averages over the mesh's replicas, so after its DP reduction a mesh holds the mean gradient over ITS
   samples, and the activation gradient of one sample is 1 / mbs times that sample's loss gradient (times 1 /
   micro-batches, the same everywhere). Where an activation crosses from a mesh with micro-batch size mbs_src
   to one with mbs_dst, its gradient going back is rescaled by mbs_dst / mbs_src (`activation_grad_scale`,
   per block: the meshes holding a stage side by side may differ). Between single meshes that is
   k_src / k_dst for DP degrees k, since dp * mbs is the same everywhere. Meshes side by side at a stage each
   hold the mean over their own samples; replica_sync.py then sums each parameter over its holders weighted
   by their share of the batch (`RankContext.batch_share`), which gives the global-batch mean.
3. Tied input/output embeddings: the first stage's word embeddings and the last stage's output layer are two
   holders of one table (the same global name), possibly in different meshes with different TP and DP and in
   different clusters. replica_sync.py sums them like any parameter several mesh stages hold (one pipeline:
   each with weight 1, the whole batch), shard to shard: the two ranks owning an element send it to each
   other at once and both compute the sum, so a step moves twice the (padded) table in the gradient-reduce
   dtype, once in each direction.
4. The global gradient norm counts each parameter once: Megatron already skips TP duplicates and the tied
   output copy; with the distributed optimizer every DP rank contributes the shard it owns, with the plain
   one only DP rank 0 of each mesh (the replicas hold copies); the sum runs over all ranks
   (`count_grad_norm_once`). Clipping then uses the same global norm everywhere.
"""
from __future__ import annotations


def activation_grad_scale(src_mesh, dst_mesh) -> float:
    """Factor for the activation gradient flowing back from dst_mesh to src_mesh (forward direction src->dst):
    each side's per-sample gradient is 1 / its micro-batch size of the sample's loss gradient (rule 2)."""
    return dst_mesh.micro_batch_size / src_mesh.micro_batch_size


# ---- pure: which part of a parameter a DP rank holds after the reduce-scatter -----------------------------------

def owned_interval(param_start: int, param_end: int, bucket_numel: int, dp_size: int, dp_rank: int) -> tuple[int, int]:
    """The part [lo, hi) of a parameter (in its own flattened coordinates) whose reduced gradient DP rank
    `dp_rank` holds after Megatron's reduce-scatter: the parameter sits at [param_start, param_end) of a
    bucket of `bucket_numel` elements, and rank r gets the r-th of `dp_size` equal pieces of the bucket.
    Empty (lo == hi) when the rank's piece misses the parameter."""
    shard = bucket_numel // dp_size
    lo, hi = max(param_start, dp_rank * shard), min(param_end, (dp_rank + 1) * shard)
    return (lo - param_start, hi - param_start) if lo < hi else (0, 0)


# ---- the finalize function Megatron calls after the backward pass ----------------------------------------------

def make_finalize_model_grads(ctx, replicas=None):
    """A drop-in for `config.finalize_model_grads_func`: Megatron's finalize_model_grads with this rank's
    groups, then (`replicas`, a replica_sync.ReplicaSync, for plans whose parameters several mesh stages hold,
    tied embeddings across stages included) the sum across those holders."""
    from megatron.core.distributed import finalize_model_grads

    def finalize(model, num_tokens=None, pg_collection=None, force_all_reduce=False):
        finalize_model_grads(model, num_tokens, pg_collection=pg_collection or ctx.pg,
                             force_all_reduce=force_all_reduce)
        if replicas is not None:
            replicas.reduce(model)

    return finalize


def _sharded_ownership(chunk, weight):
    """(lo, hi) of `weight` whose reduced gradient this rank holds when `chunk` is a Megatron DDP with the
    distributed optimizer; None when every DP replica holds the whole reduced gradient."""
    if not getattr(getattr(chunk, "ddp_config", None), "use_distributed_optimizer", False):
        return None
    group = chunk.param_to_bucket_group[weight]
    bucket = next(b for b in group.buckets if weight in b.params)
    start, end = bucket.param_to_index[weight]
    return owned_interval(start, end, bucket.grad_data.numel(), group.intra_distributed_optimizer_instance_size,
                          group.intra_distributed_optimizer_instance_rank)


def count_grad_norm_once(optimizer, ctx, replicas=None) -> None:
    """Make Megatron's optimizer compute the global grad norm over every mesh, counting each parameter once.

    Sets the optimizer's gradient-statistics group to all ranks. With the distributed optimizer every DP rank
    contributes the shard it owns (the shards of a mesh partition its parameters); with the plain optimizer
    only DP rank 0 of each mesh contributes (the other replicas hold identical, already-reduced gradients).
    With several meshes holding the same parameters (`replicas`, a replica_sync.ReplicaSync) only the ranks of
    each parameter's first holder contribute: after the exchange every holder has the same global gradient.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    for sub in subs:
        sub.grad_stats_parallel_group = ctx.world_gloo
        left_out = replicas is not None and not replicas.counts_in_norm
        sub.hetauto_counts_in_norm = not (left_out or (ctx.coords.dp_rank != 0 and
                                                         not isinstance(sub, DistributedOptimizer)))
        if not sub.hetauto_counts_in_norm:
            sub.get_grads_for_grad_norm = lambda *args, **kwargs: []
    # --log-num-zeros-in-grad: Megatron's count_zeros reads every rank's parameters whatever the rule above, so over
    # the world it counted each DP replica (without the distributed optimizer) and each holder again
    optimizer.count_zeros = lambda: zeros_once(optimizer, ctx)


def _counted_once(optimizer):
    """The parameters of the ranks that count (count_grad_norm_once), by Megatron's own filter of the optimizer's
    parameters: TP duplicates and shared copies left out."""
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
    from megatron.core.transformer.module import param_is_not_shared

    for sub in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        if getattr(sub, "hetauto_counts_in_norm", True):
            for p in sub.get_parameters():
                if param_is_not_shared(p) and param_is_not_tensor_parallel_duplicate(p):
                    yield p


def zeros_once(optimizer, ctx) -> float:
    """The zeros in the gradients, each parameter counted once over every mesh by the rule the global gradient
    norm counts them, summed over the world's gloo group: what Megatron-LM logs with --log-num-zeros-in-grad
    (count_zeros_fp32 over one replica's model-parallel group in Megatron)."""
    import torch
    import torch.distributed as dist

    total = torch.zeros(1, dtype=torch.float64)
    for p in _counted_once(optimizer):
        if getattr(p, "grad", None) is not None:
            total += (p.grad.detach() == 0).sum().cpu().double()
    dist.all_reduce(total, group=ctx.world_gloo)
    return total.item()


def params_norm_once(optimizer, ctx) -> float:
    """The L2 norm of the parameters, each counted once over every mesh by the rule the global gradient norm counts
    them (count_grad_norm_once: the ranks that count, and on them Megatron's own filter of the optimizer's
    parameters, which leaves out TP duplicates and shared copies), summed over the world's gloo group. What
    Megatron-LM logs with --log-params-norm: its calc_params_l2_norm ends with a reduction over the model-parallel
    group, one replica's TP x PP in Megatron, under --hetauto the world (runtime/groups.py `pg.mp`), where it counted
    every DP replica and every pipeline's copy again."""
    import torch
    import torch.distributed as dist

    total = torch.zeros(1, dtype=torch.float64)
    for p in _counted_once(optimizer):
        total += p.detach().double().square().sum().cpu()
    dist.all_reduce(total, group=ctx.world_gloo)
    return total.item() ** 0.5
