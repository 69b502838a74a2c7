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
3. Tied input/output embeddings whose first and last stage sit in different meshes (possibly different TP
   and DP, possibly different clusters) are summed shard to shard. In the coordinates of the whole
   (padded vocabulary x hidden) table, flattened row-major, every rank of each side owns one interval: with
   the distributed optimizer the part of its TP shard its DP rank owns after the reduce-scatter, with the
   plain optimizer the whole TP shard on DP rank 0 (the other replicas hold copies). The owners of one side
   partition the table, so each element is sent once in each direction between the two ranks that own it
   (`tie_blocks`); nothing goes around a ring and no rank sends zeros. With the plain optimizer DP rank 0
   then broadcasts the sum to its replicas inside its mesh. (When several meshes hold a stage side by side, or
   there are several pipelines, replica_sync.py sums the tied copies with every other shared parameter and
   this exchange does not run.)
4. The global gradient norm counts each parameter once: Megatron already skips TP duplicates and the tied
   output copy; with the distributed optimizer every DP rank contributes the shard it owns, with the plain
   one only DP rank 0 of each mesh (the replicas hold copies); the sum runs over all ranks
   (`count_grad_norm_once`). Clipping then uses the same global norm everywhere.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass


def activation_grad_scale(src_mesh, dst_mesh) -> float:
    """Factor for the activation gradient flowing back from dst_mesh to src_mesh (forward direction src->dst):
    each side's per-sample gradient is 1 / its micro-batch size of the sample's loss gradient (rule 2)."""
    return dst_mesh.micro_batch_size / src_mesh.micro_batch_size


# ---- pure: who owns what of the tied table, who sends what to whom ------------------------------------------

def owned_interval(param_start: int, param_end: int, bucket_numel: int, dp_size: int, dp_rank: int) -> tuple[int, int]:
    """The part [lo, hi) of a parameter (in its own flattened coordinates) whose reduced gradient DP rank
    `dp_rank` holds after Megatron's reduce-scatter: the parameter sits at [param_start, param_end) of a
    bucket of `bucket_numel` elements, and rank r gets the r-th of `dp_size` equal pieces of the bucket.
    Empty (lo == hi) when the rank's piece misses the parameter."""
    shard = bucket_numel // dp_size
    lo, hi = max(param_start, dp_rank * shard), min(param_end, (dp_rank + 1) * shard)
    return (lo - param_start, hi - param_start) if lo < hi else (0, 0)


@dataclass(frozen=True)
class TieBlock:
    """Elements [start, stop) of the flattened whole table: owned by `first` on the first stage and `last` on
    the last stage (global ranks); each sends its values to the other."""
    first: int
    last: int
    start: int
    stop: int


def tie_blocks(first_owners, last_owners) -> list[TieBlock]:
    """Pair the two sides' owners. `*_owners` are (global rank, start, stop) intervals of the flattened table;
    each side's non-empty intervals must partition the same table. Deterministic order (by start)."""
    first = sorted((s, e, r) for r, s, e in first_owners if s < e)
    last = sorted((s, e, r) for r, s, e in last_owners if s < e)
    for name, side in (("first", first), ("last", last)):
        covered = 0
        for s, e, _ in side:
            if s != covered:
                raise ValueError(f"the {name} stage's owners do not partition the table (gap or overlap at {covered})")
            covered = e
    if first[-1][1] != last[-1][1]:
        raise ValueError(f"the tied tables differ in size: {first[-1][1]} vs {last[-1][1]} elements")
    out, i, j = [], 0, 0
    while i < len(first) and j < len(last):
        lo, hi = max(first[i][0], last[j][0]), min(first[i][1], last[j][1])
        if lo < hi:
            out.append(TieBlock(first[i][2], last[j][2], lo, hi))
        if first[i][1] <= last[j][1]:
            i += 1
        else:
            j += 1
    return out


# ---- the finalize function Megatron calls after the backward pass ----------------------------------------------

def make_finalize_model_grads(ctx, counter: dict | None = None, replicas=None):
    """A drop-in for `config.finalize_model_grads_func`: Megatron's finalize_model_grads with this rank's
    groups, then the cross-stage tied-embedding reduction, then (`replicas`, a replica_sync.ReplicaSync, for
    plans whose parameters several meshes hold) the sum across those meshes. `counter` (e.g. a communicator's
    `bytes_sent`) receives the bytes the tie reduction sends."""
    from megatron.core.distributed import finalize_model_grads

    tie = TiedEmbeddingExchange(ctx, counter) if ctx.tie_group is not None else None

    def finalize(model, num_tokens=None, pg_collection=None, force_all_reduce=False):
        finalize_model_grads(model, num_tokens, pg_collection=pg_collection or ctx.pg,
                             force_all_reduce=force_all_reduce)
        if tie is not None:
            tie.reduce(model)
        if replicas is not None:
            replicas.reduce(model)

    return finalize


def _tied_weight(model_chunks, ctx):
    from megatron.core.utils import get_attr_wrapped_model

    if ctx.is_first_stage:
        module = get_attr_wrapped_model(model_chunks[0], "pre_process", return_model_obj=True)
        return module.embedding.word_embeddings.weight
    module = get_attr_wrapped_model(model_chunks[-1], "pre_process", return_model_obj=True)
    return module.output_layer.weight


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


class TiedEmbeddingExchange:
    """Sums the word-embedding gradient of the first stage and the output-layer gradient of the last stage,
    shard to shard (rule 3 of the module docstring). The owners' intervals are exchanged once, on the first
    call (a few bytes per rank over the tie group, not counted); every later step only moves gradient blocks."""

    def __init__(self, ctx, counter: dict | None = None):
        self.ctx, self.counter = ctx, counter
        first, last = ctx.plan.meshes[0], ctx.plan.meshes[-1]
        self.key = "inter_cluster" if first.cluster != last.cluster else "intra_cluster"
        self.blocks = None
        self.local = None      # this rank's (lo, hi) in its own flattened shard, or None when it owns nothing
        self.sharded = False

    def _plan_blocks(self, chunk, weight):
        import torch
        import torch.distributed as dist

        c = self.ctx.coords
        owned = _sharded_ownership(chunk, weight)
        self.sharded = owned is not None
        if owned is None:
            owned = (0, weight.numel()) if c.dp_rank == 0 else (0, 0)
        base = c.tp_rank * weight.numel()     # TP shards are equal row blocks of the (padded) table
        mine = torch.tensor([c.rank, int(self.ctx.is_first_stage), base + owned[0], base + owned[1]],
                            dtype=torch.int64)
        size = dist.get_world_size(self.ctx.tie_group)
        rows = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(rows, mine, group=self.ctx.tie_group)
        owners = [r.tolist() for r in rows]
        self.blocks = tie_blocks([(r, s, e) for r, f, s, e in owners if f],
                                 [(r, s, e) for r, f, s, e in owners if not f])
        self.local = (base, owned) if owned[0] < owned[1] else None

    def reduce(self, model_chunks) -> None:
        import torch
        import torch.distributed as dist

        weight = _tied_weight(model_chunks, self.ctx)
        grad = getattr(weight, "main_grad", None)
        if grad is None:
            grad = weight.grad
        if self.blocks is None:
            self._plan_blocks(model_chunks[0] if self.ctx.is_first_stage else model_chunks[-1], weight)
        me, first = self.ctx.coords.rank, self.ctx.is_first_stage
        flat = grad.view(-1)
        works, received = [], []
        if self.local is not None:
            base = self.local[0]
            for k, b in enumerate(self.blocks):
                mine, peer = (b.first, b.last) if first else (b.last, b.first)
                if mine != me:
                    continue
                view = flat[b.start - base:b.stop - base]
                out = view.detach().to("cpu", copy=True)
                inbox = torch.empty_like(out)
                # tags: even = first -> last, odd = last -> first, so both directions of a block never mix
                works.append((dist.isend(out, peer, group=self.ctx.tie_group, tag=2 * k + (0 if first else 1)), peer))
                works.append((dist.irecv(inbox, peer, group=self.ctx.tie_group, tag=2 * k + (1 if first else 0)), peer))
                received.append((view, inbox))
                if self.counter is not None:
                    self.counter[self.key] = self.counter.get(self.key, 0) + out.numel() * out.element_size()
        _wait(works, self.ctx, "exchange tied-embedding gradients")
        with torch.no_grad():
            for view, inbox in received:
                view.add_(inbox.to(view.device))
        if not self.sharded and self.ctx.mesh.dp > 1:
            # plain optimizer: every replica must step with the summed gradient; DP rank 0 received it
            dist.broadcast(grad, src=dist.get_global_rank(self.ctx.pg.dp, 0), group=self.ctx.pg.dp)


def copy_tied_weights(model_chunks, ctx, counter: dict | None = None) -> None:
    """Give the last stage's output layer the first stage's word embeddings, once, after the model is built and
    before the optimizer copies its parameters.

    Megatron does this with an all-reduce over its embedding group (the last stage's copy starts at zero), which
    needs equal TP shards on both sides; across meshes that group does not exist (`ctx.pg.embd` is None), so
    without this copy the output layer would start at zero. Shard to shard as the gradient exchange: DP rank 0 of
    each first-stage TP rank sends its rows to every last-stage replica's ranks that hold them (the dry run needs
    none of this: it draws both copies from the same global name)."""
    import torch
    import torch.distributed as dist

    if ctx.tie_group is None:
        return
    c, first = ctx.coords, ctx.is_first_stage
    weight = _tied_weight(model_chunks, ctx)
    base = c.tp_rank * weight.numel()
    owns = not first or c.dp_rank == 0      # senders: one replica of the first stage; receivers: every replica
    mine = torch.tensor([c.rank, int(first), c.dp_rank, base, base + weight.numel() if owns else base],
                        dtype=torch.int64)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(ctx.tie_group))]
    dist.all_gather(rows, mine, group=ctx.tie_group)
    table = [r.tolist() for r in rows]
    senders = [(r, s, e) for r, f, _, s, e in table if f]
    blocks = []
    for d in sorted({dp for _, f, dp, _, _ in table if not f}):
        blocks += tie_blocks(senders, [(r, s, e) for r, f, dp, s, e in table if not f and dp == d])
    first_mesh, last_mesh = ctx.plan.meshes[0], ctx.plan.meshes[-1]
    key = "inter_cluster" if first_mesh.cluster != last_mesh.cluster else "intra_cluster"
    flat, works, received = weight.data.view(-1), [], []
    for k, b in enumerate(blocks):
        view = flat[b.start - base:b.stop - base]
        if first and b.first == c.rank:
            out = view.detach().to("cpu", copy=True)
            works.append((dist.isend(out, b.last, group=ctx.tie_group, tag=k), b.last))
            if counter is not None:
                counter[key] = counter.get(key, 0) + out.numel() * out.element_size()
        elif not first and b.last == c.rank:
            inbox = torch.empty(view.shape, dtype=view.dtype)
            works.append((dist.irecv(inbox, b.first, group=ctx.tie_group, tag=k), b.first))
            received.append((view, inbox))
    _wait(works, ctx, "copy the tied embeddings")
    with torch.no_grad():
        for view, inbox in received:
            view.copy_(inbox.to(view.device))


def _wait(works, ctx, what: str) -> None:
    """Wait for (work, peer) pairs with the context's timeout; a peer that is gone or silent is named."""
    from .communicator import PeerError
    from .groups import describe_rank

    timeout = datetime.timedelta(seconds=ctx.timeout_s)
    for work, peer in works:
        try:
            ok = work.wait(timeout)
            how = None if ok is not False else f"timed out after {ctx.timeout_s:.0f}s"
        except RuntimeError as exc:   # gloo: the connection was closed or timed out
            how = f"failed: {str(exc).splitlines()[0]}"
        if how:
            raise PeerError(f"{describe_rank(ctx.plan, ctx.coords.rank)} could not {what} with "
                            f"{describe_rank(ctx.plan, peer)}: {how}; that process is gone or stuck")


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
        if left_out or (ctx.coords.dp_rank != 0 and not isinstance(sub, DistributedOptimizer)):
            sub.get_grads_for_grad_norm = lambda *args, **kwargs: []
