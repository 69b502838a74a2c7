"""Gradient rules that keep a heterogeneous pipeline numerically equal to one process running the model.

1. Parameter gradients are reduced over DP inside each mesh: Megatron's DDP / finalize_model_grads on the
   mesh's own DP group (`ctx.pg.dp`).
2. Loss normalisation. Every replica of a mesh with DP degree k averages its loss over its own samples and DDP
   averages over the k replicas, so inside that mesh an activation gradient is k times the gradient of the
   global mean loss. Where an activation crosses from a mesh with DP k_src to one with DP k_dst, its
   gradient going back is therefore rescaled by k_src / k_dst (`activation_grad_scale`). Equal DP: 1.
3. Tied input/output embeddings whose first and last stage sit in different meshes (possibly different TP
   sizes, possibly different clusters): both sides gather their TP shards to the full matrix, the two full
   gradients are summed over the tie group (gloo, host-staged), and each rank takes back its own shard.
4. The global gradient norm counts each parameter once: Megatron already skips TP duplicates and the tied
   output copy; across meshes with different DP degrees only DP rank 0 of each mesh contributes, and the sum
   runs over all ranks (`count_grad_norm_once`). Clipping then uses the same global norm everywhere.
"""
from __future__ import annotations


def activation_grad_scale(src_mesh, dst_mesh) -> float:
    """Factor for the activation gradient flowing back from dst_mesh to src_mesh (forward direction src->dst)."""
    return src_mesh.dp / dst_mesh.dp


def make_finalize_model_grads(ctx, counter: dict | None = None):
    """A drop-in for `config.finalize_model_grads_func`: Megatron's finalize_model_grads with this rank's
    groups, then the cross-stage tied-embedding reduction. `counter` (e.g. a communicator's `bytes_sent`)
    receives the bytes the tie reduction sends."""
    from megatron.core.distributed import finalize_model_grads

    def finalize(model, num_tokens=None, pg_collection=None, force_all_reduce=False):
        finalize_model_grads(model, num_tokens, pg_collection=pg_collection or ctx.pg,
                             force_all_reduce=force_all_reduce)
        reduce_tied_embeddings(model, ctx, counter)

    return finalize


def _tied_weight(model_chunks, ctx):
    from megatron.core.utils import get_attr_wrapped_model

    if ctx.is_first_stage:
        module = get_attr_wrapped_model(model_chunks[0], "pre_process", return_model_obj=True)
        return module.embedding.word_embeddings.weight
    module = get_attr_wrapped_model(model_chunks[-1], "pre_process", return_model_obj=True)
    return module.output_layer.weight


def reduce_tied_embeddings(model_chunks, ctx, counter: dict | None = None) -> None:
    """Sum the word-embedding gradient of the first stage and the output-layer gradient of the last stage."""
    import torch
    import torch.distributed as dist

    if ctx.tie_group is None:
        return
    weight = _tied_weight(model_chunks, ctx)
    grad = getattr(weight, "main_grad", None)
    if grad is None:
        grad = weight.grad
    tp, tp_rank = ctx.mesh.tp, ctx.coords.tp_rank
    if tp > 1:
        shards = [torch.empty_like(grad) for _ in range(tp)]
        dist.all_gather(shards, grad.contiguous(), group=ctx.pg.tp)
        full = torch.cat(shards, dim=0)
    else:
        full = grad
    # One contribution per side (its TP rank 0 of DP replica 0); everyone else adds zeros, which is exact.
    leader = tp_rank == 0 and ctx.coords.dp_rank == 0
    staged = full.detach().to("cpu", copy=True) if leader else torch.zeros(full.shape, dtype=full.dtype)
    dist.all_reduce(staged, group=ctx.tie_group)
    rows = staged.shape[0] // tp
    grad.copy_(staged[tp_rank * rows:(tp_rank + 1) * rows].to(grad.device))
    if counter is not None and leader:
        first, last = ctx.plan.meshes[0], ctx.plan.meshes[-1]
        key = "inter_cluster" if first.cluster != last.cluster else "intra_cluster"
        counter[key] = counter.get(key, 0) + staged.numel() * staged.element_size()


def count_grad_norm_once(optimizer, ctx) -> None:
    """Make Megatron's optimizer compute the global grad norm over every mesh, counting each parameter once.

    Sets the optimizer's gradient-statistics group to all ranks and lets only DP rank 0 of each mesh
    contribute (the other replicas hold identical, already-reduced gradients).
    """
    subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    for sub in subs:
        sub.grad_stats_parallel_group = ctx.world_gloo
        if ctx.coords.dp_rank != 0:
            sub.get_grads_for_grad_norm = lambda *args, **kwargs: []
