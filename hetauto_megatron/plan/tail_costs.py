"""The iteration tail: what follows the pipeline's last backward, before the next iteration starts.

Per stage, the DP gradient reduction (in the gradient-reduce dtype, exposed unless it overlaps the backward) and
the parameter all-gather of the distributed optimizer (`dp_sync_times`, `dp_exposed_times`), and the optimizer
step (`optimizer_time`); job-wide, the gradients of parameters several mesh stages hold summed across them
(`holders_sync_time`, holders_exchange.py; in one pipeline of single meshes only a tied embedding table, between
the first and the last stage) and the scalars all-reduced over the world's gloo group: the global gradient norm (`grad_norm_time`)
and, under an engine that checks each step's results, whether any rank's were rejected (`result_check_time`).
`iteration_tail` puts them together as the runtime runs them.
"""
from __future__ import annotations

import math
from functools import lru_cache

from ..cost import comm
# Megatron-Core's DDP buckets: max(40M, 1M x DP) parameters, one bucket for the whole stage on every pipeline rank
# but the first (a tied table aside), laid out as cost/ddp_buffer.py lays out the buffer
from ..cost.ddp_buffer import DDP_BUCKET_PARAMS, DDP_BUCKET_PARAMS_PER_DP_RANK, ddp_bucket_params  # noqa: F401
from ..cost.ddp_buffer import stage_buckets
from ..cost.deepspeed_state import deepspeed_shards_optimizer
from ..cost.memory import stage_params
from ..cost.model_state import adam_traffic_bytes_per_param, grad_buffer_bytes
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from .bucket_exposure import Buckets, buckets_of
from .costing import StageProfile
# the job-wide exchange of parameters several mesh stages hold, part of the tail
from .holders_exchange import holders_sync_time, tied_table_blocks
from .engines import DEFAULT_ENGINE, ENGINES


@lru_cache(maxsize=262144)     # pure; the search asks for the same stage under many layouts
def dp_sync_times(model: ModelSpec, prof: StageProfile, layers: int, first: bool, last: bool) -> tuple[float, float]:
    """(gradient reduction, parameter all-gather) seconds of one iteration on the ring of the DP group's link.

    With the distributed optimizer the gradients are reduce-scattered (all-reduced where the mesh's engine does
    so: engines.py ENGINES) and the updated parameters all-gathered; without it the gradients are all-reduced and
    nothing is gathered (optimizer_sharded: under DeepSpeed, whichever optimizer its engine builds). Gradients travel
    in the gradient buffer's dtype (fp32 by default, settings.grad_reduce_dtype), parameters in the training
    precision."""
    params = stage_params(model, prof.tp, layers, first, last)
    dtype = prof.cluster.device.dtype_bytes
    grads = grad_buffer_bytes(dtype, prof.settings) * params
    # The engine's row of the settings table says which collective reduces (engines.py ENGINES: DeepSpeed's ZeRO-1
    # all-reduces whole buckets before each rank keeps its shard).
    reduce = (comm.reduce_scatter_time if prof.settings.sharded_grad_reduce else comm.allreduce_time)(
        grads, prof.dp, prof.dp_link)
    reduce += grad_buffer_passes(prof) * grads / (prof.cluster.device.hbm_gbps * 1e9)
    if optimizer_sharded(prof):
        return reduce, comm.all_gather_time(dtype * params, prof.dp, prof.dp_link)
    return reduce, 0.0


def checks_gradients(precision: str) -> bool:
    """Megatron-LM's --check-for-nan-in-loss-and-grad (DDP's check_for_nan_in_grad) as its validate_args leaves it
    for a launch of `precision` without --loss-scale (the launches set none, and --hetauto refuses one: a static scale
    keeps the check on in fp16, megatron/unpriced.py check_loss_scale): on, but off under fp16's dynamic loss
    scaler, whose skipped steps are its check (arguments.py). runtime/train.py ddp_settings runs the same."""
    return precision != "fp16"


def grad_buffer_passes(prof: StageProfile) -> int:
    """How many times Megatron-Core's DDP reads or writes the stage's gradient buffer before reducing it, in
    start_grad_sync (param_and_grad_buffer.py): one read for each bucket's gradient norm, validated against NaN and
    Inf (checks_gradients), and at DP > 1 a read and a write scaling it by 1/DP (gradient_scaling_factor; the
    launches leave --ddp-average-in-collective off). Memory-bound passes, priced at the device's HBM rate as part
    of the reduction (each runs just before its bucket's collective); none under an engine of other buckets
    (Engine.grad_buffer_passes)."""
    if not ENGINES[prof.settings.engine].grad_buffer_passes:
        return 0
    return int(checks_gradients(prof.cluster.device.precision)) + (2 if prof.dp > 1 else 0)


def optimizer_sharded(prof: StageProfile) -> bool:
    """The mesh's optimizer steps on a 1/DP partition of the stage and all-gathers the updated weights: Megatron's
    distributed optimizer; under DeepSpeed's engine, the optimizer it builds for the mesh's precision and ZeRO
    stage (cost/deepspeed_state.py deepspeed_shards_optimizer: its BF16 optimizer partitions with ZeRO-0 too, fp16
    without ZeRO does not), as the memory model holds it."""
    if prof.settings.optimizer_state == "deepspeed":
        return deepspeed_shards_optimizer(prof.cluster.device.precision, prof.settings)
    return prof.settings.distributed_optimizer


def ddp_buckets(model: ModelSpec, prof: StageProfile, layers: int, first: bool,
                last: bool) -> tuple[tuple[int, float], ...]:
    """The buckets Megatron-Core's DDP cuts a stage's gradients (and, with the distributed optimizer, its
    parameters) into, in the order their reductions start: cost/ddp_buffer.py stage_buckets, (elements, the
    share of the stage's work done once the bucket's gradients are produced) each. Several on the first pipeline
    rank (buckets of max(40M, 1M x DP) parameters), one elsewhere, but for a tied table of a pipeline of several
    stages, a bucket of its own with the distributed optimizer (the first stage's last, the last stage's first)."""
    s = prof.settings
    return stage_buckets(model, prof.tp, prof.dp, layers, first, last, s.distributed_optimizer,
                         s.overlap_grad_reduce)


def dp_exposed_times(model: ModelSpec, prof: StageProfile, layers: int, first: bool, last: bool,
                     own_fwd: float, own_bwd: float, drain: float, fill: float = 0.0) -> tuple[float, float, float]:
    """(gradient reduction, parameter gather delaying the next fill, parameter gather after the step) seconds DP
    synchronisation adds to the iteration for the stage (`first`: pipeline rank 0), as Megatron-Core 0.19 runs them.

    With overlap_grad_reduce each bucket's reduction starts once the last micro-batch's backward has produced its
    gradients, in layout order, one after the other (plan/bucket_exposure.py): what is still running after the
    stage's own backward (`own_bwd`), at least the last bucket's (the first layers', or the first stage's tied
    table's), hides behind `drain`, the last backwards of the stages before it (and the links between), still
    running when it may start (tail_windows: a later stage's once its last gradient send returned). With overlap_param_gather (the non-interleaved schedule leaves align_param_gather off) the next
    iteration's first forward pre-hook starts the gather of the layout's last bucket and waits for it, each later
    pre-hook the next one's, which hides behind the forward of the bucket before it (`own_fwd` split by the
    buckets' work): the first is exposed in full; on later ranks, after the stage received its input, so it
    delays every later stage too: the caller adds these delays up along the pipeline. Without the overlaps the
    gather is exposed in full, right after the optimizer step. The published runs' Megatron-Core
    (0.6-0.8, engines.py ENGINES "megatron-core-0.8", the same buckets and chain: core_r0.8.0
    param_and_grad_buffer.py, distrib_optimizer.py `_finish_param_sync_helper`) started the first gather at the
    step's start instead: it hides behind `fill`, the forwards of the stages before this one and the links
    between.

    Without overlap_grad_reduce the whole reduction starts once the stage's own schedule has returned, after its
    cool-down (Megatron-Core's finalize_model_grads, called at the end of each rank's
    forward_backward_pipelining_without_interleaving; Megatron-LM 2021's train_step alike; DeepSpeed's ReduceGrads
    at its schedule's last step), so it too hides behind `drain`; but where the engine first sums a tied table
    across its holders (Engine.tied_reduce_first), the last stage starts it only once the first stage is done."""
    reduce, gather = dp_sync_times(model, prof, layers, first, last)
    return _exposure(prof.settings, reduce, gather, buckets_of(ddp_buckets(model, prof, layers, first, last)),
                     own_fwd, own_bwd, _reduce_window(model, prof.settings, first, last, drain), fill)


def _reduce_window(model: ModelSpec, s, first: bool, last: bool, drain: float) -> float:
    """What the stage's gradient reduction may hide behind (dp_exposed_times): the drain, but none for the last
    stage of a tied table whose engine sums the table across its holders first (it waits for the first stage)."""
    if last and not first and model.tie_embeddings and ENGINES[s.engine].tied_reduce_first:
        return 0.0
    return drain


def _exposure(s, reduce: float, gather: float, b: Buckets, own_fwd: float, own_bwd: float, drain: float,
              fill: float) -> tuple[float, float, float]:
    """dp_exposed_times from the stage's collectives and its buckets (tail_seconds calls it with its memo)."""
    if s.overlap_grad_reduce:
        reduce = max(0.0, b.reduce_left(reduce, own_bwd) - drain)
    else:
        reduce = max(0.0, reduce - drain)
    if s.overlap_param_gather:
        chain = b.gather_chain(gather, own_fwd)
        if ENGINES[s.engine].param_gather_dispatch == "step_start":
            return reduce, 0.0, max(0.0, gather * b.last - fill) + chain
        return reduce, gather * b.last + chain, 0.0
    return reduce, 0.0, gather


def tail_windows(fwd, bwd, links, blocking):
    """(own forward, own backward, drain, fill) of each stage of a pipeline (pipeline order, its rank): the drain is
    what runs after the stage may start its reduction, the last backwards of the stages before it and the links
    between, but for a stage after the first its own last gradient send where it blocks (`blocking`: per boundary):
    Megatron-Core 0.19 calls `grad_sync_func` (set with overlap_grad_reduce) after the cool-down, once that send
    has returned (schedules.py forward_backward_pipelining_without_interleaving); an overlapped one returns at
    once. The fill is what runs before its first forward, their forwards and the links (dp_exposed_times)."""
    drain = fill = 0.0
    last = len(fwd) - 1
    for i, (f, b) in enumerate(zip(fwd, bwd)):
        yield f, b, drain - (links[i - 1] if i and blocking[i - 1] else 0.0), fill
        link = links[i] if i < last else 0.0
        drain += b + link
        fill += f + link


def iteration_tail(model: ModelSpec, inventory: Inventory, meshes, profiles, layers, fwd, bwd,
                   links, blocking, sync: float | None = None, engine: str = DEFAULT_ENGINE) -> dict[str, float]:
    """What follows the last backward of the 1F1B pipeline, per stage lists of its times (pipeline order): the
    exposed gradient reduction of the slowest stage, then the job-wide terms every rank waits for (the tied table's
    holders' exchange, the engine's result check and the global-norm all-reduce), then the optimizer step (with a
    gather not overlapped: the slowest stage's step and gather), then what the parameter gathers in the forward
    pre-hooks add to the next iteration's fill (each stage's, one after the other along the pipeline); `blocking`:
    per boundary, its schedule (tail_windows). Keys: tail_s,
    dp_exposed_s, optimizer_s, sync_s (seconds), and per stage stage_dp_exposed_s, stage_optimizer_s (lists).
    `sync`: iteration_sync_time(model, inventory, meshes, profiles, engine=engine) when the caller has it (it
    depends on the layout only, not on the layer split). The search's leaves need tail_s alone: `tail_seconds`."""
    if sync is None:
        sync = iteration_sync_time(model, inventory, meshes, profiles, engine=engine)
    p = len(profiles)
    reduce_exp, after, opt, fill, exposed, g_fills, g_steps = [], [], [], 0.0, [], [], []
    for i, (f, b, drain, before) in enumerate(tail_windows(fwd, bwd, links, blocking)):
        prof, n = profiles[i], layers[i]
        r, g_fill, g_step = dp_exposed_times(model, prof, n, i == 0, i == p - 1, f, b, drain, before)
        opt.append(optimizer_time(model, prof, n, i == 0, i == p - 1))
        reduce_exp.append(r)
        after.append(g_step + opt[-1])
        fill += g_fill
        g_fills.append(g_fill)
        g_steps.append(g_step)
        exposed.append(r + g_fill + g_step)
    tail = max(reduce_exp) + sync + max(after) + fill
    # the whole iteration's DP exposure: the slowest reduction, the fill's gathers, a gather after the step
    dp = max(max(exposed), max(reduce_exp) + fill + max(a - o for a, o in zip(after, opt)))
    return {"tail_s": tail, "dp_exposed_s": dp, "optimizer_s": max(opt), "sync_s": sync,
            "stage_dp_exposed_s": exposed, "stage_optimizer_s": opt, "stage_dp_reduce_s": reduce_exp,
            "stage_gather_fill_s": g_fills, "stage_gather_step_s": g_steps}


def tail_seconds(model: ModelSpec, profiles, layers, fwd, bwd, links, blocking, sync: float,
                 memo: dict | None = None) -> float:
    """iteration_tail(...)["tail_s"], the same float, for the search's leaves: the stage terms remembered across
    calls in `memo`, a dict the caller keeps for one model (each stage kind's collectives, buckets and optimizer
    step, keyed by the profile, without hashing the model)."""
    memo = {} if memo is None else memo
    last = len(profiles) - 1
    reduce_max = after_max = -math.inf
    fill = 0.0
    for i, (f, b, drain, before) in enumerate(tail_windows(fwd, bwd, links, blocking)):
        prof, n = profiles[i], layers[i]
        key = (prof, n, i == 0, i == last)
        terms = memo.get(key)
        if terms is None:
            reduce, gather = dp_sync_times(model, prof, n, i == 0, i == last)
            terms = memo[key] = (reduce, gather, optimizer_time(model, prof, n, i == 0, i == last),
                                 buckets_of(ddp_buckets(model, prof, n, i == 0, i == last)))
        reduce, gather, opt, buckets = terms
        r, g_fill, g_step = _exposure(prof.settings, reduce, gather, buckets, f, b,
                                      _reduce_window(model, prof.settings, i == 0, i == last, drain), before)
        if r > reduce_max:
            reduce_max = r
        fill += g_fill
        if g_step + opt > after_max:
            after_max = g_step + opt
    return reduce_max + sync + after_max + fill


@lru_cache(maxsize=262144)
def optimizer_time(model: ModelSpec, prof: StageProfile, layers: int, first: bool, last: bool) -> float:
    """Adam on the local shard (the whole stage without the distributed optimizer): read/write the fp32 weight
    (the master copy in 16-bit training), two moments, read the gradient (and write the 16-bit weight):
    ~32 bytes per parameter in 16-bit mixed precision, 28 in fp32. A learned cost model may have measured the
    step on the device: then `optimizer_rate` x that traffic + `optimizer_step_s`, a fixed cost per optimizer call
    (one per stage and iteration; cost/learned/optimizer_step.py `fit_optimizer`)."""
    per_param = adam_traffic_bytes_per_param(prof.cluster.device.dtype_bytes)
    shard = prof.dp if optimizer_sharded(prof) else 1
    traffic = stage_params(model, prof.tp, layers, first, last) / shard * per_param / (prof.cluster.device.hbm_gbps * 1e9)
    return prof.optimizer_rate * traffic + prof.optimizer_step_s


# ---- the iteration tail: after the pipeline drains, before the optimizer step --------------------------------
GRAD_NORM_ALLREDUCES = 1     # the global gradient norm (one fp32 scalar): all-reduced once per iteration


def _hop_latency(inventory: Inventory, a: str, b: str) -> float:
    """Latency of one message between clusters a and b (a's inter-node network when a == b). Clusters with no
    link of their own in the inventory reach each other through the slowest link it lists."""
    link = inventory.link(a, b)
    if link is None:
        link = max(inventory.links.values(), key=lambda x: x.latency_s, default=inventory.cluster(a).inter_node)
    return link.latency_s


def world_scalar_time(inventory: Inventory, meshes) -> float:
    """One scalar all-reduced over the gloo group of every rank (ranks mesh after mesh). gloo's ring takes
    2(n - 1) steps, each waiting for its left neighbour, so the message walks the ring about twice: twice the sum
    of the hop latencies (each rank to the next, the last back to the first), where hops inside a cluster cost its
    inter-node latency and hops between clusters their link's. Bandwidth does not matter for a few bytes."""
    ring = 0.0
    for m, nxt in _ring_neighbours(meshes):
        ring += (m.tp * m.dp * m.num_stages - 1) * inventory.cluster(m.cluster).inter_node.latency_s
        ring += _hop_latency(inventory, m.cluster, nxt)
    return 2 * ring


def world_scalar_between_clusters(inventory: Inventory, meshes) -> float:
    """The part of world_scalar_time its hops between clusters take: what a dry run's emulated links hold each such
    all-reduce for (runtime/train.py), its "clusters" sharing one machine, where gloo's hops between them are the
    loopback's."""
    return 2 * sum(_hop_latency(inventory, m.cluster, nxt) for m, nxt in _ring_neighbours(meshes) if nxt != m.cluster)


def grad_norm_time(inventory: Inventory, meshes) -> float:
    """The global gradient norm: a scalar all-reduced over every rank (world_scalar_time), once an iteration."""
    return GRAD_NORM_ALLREDUCES * world_scalar_time(inventory, meshes)


def result_check_time(inventory: Inventory, meshes, engine: str = DEFAULT_ENGINE,
                      grad_norm: float | None = None) -> float:
    """The engine's check of the step's results (Engine.result_checks): under Megatron-LM's result validation each
    rank's "rejected" flag, an int32 all-reduced over every rank after the pipeline drains, before the optimizer
    step and its norm (on host memory and gloo, as every collective over the world: runtime/world_collectives.py).
    `grad_norm`: grad_norm_time(inventory, meshes) when the caller has it (the same ring, not walked again)."""
    ring = world_scalar_time(inventory, meshes) if grad_norm is None else grad_norm / GRAD_NORM_ALLREDUCES
    return ENGINES[engine].result_checks * ring


def _ring_neighbours(meshes):
    """(mesh, the cluster of the next mesh) around the world's ring, ranks mesh after mesh, the last back to the
    first."""
    return ((m, meshes[(i + 1) % len(meshes)].cluster) for i, m in enumerate(meshes))


def iteration_sync_time(model: ModelSpec, inventory: Inventory, meshes, profiles,
                        grad_norm: float | None = None, engine: str = DEFAULT_ENGINE) -> float:
    """The tail's job-wide terms of one pipeline of single meshes: the tied table summed across its two holders
    (holders_sync_time, as for any plan shape; exactly 0.0 without one) + the engine's result check + global-norm
    all-reduce (`profiles`: per stage; `grad_norm`: grad_norm_time(inventory, meshes) when the caller has it; the
    check is a scalar over the same ring)."""
    blocks = tied_table_blocks(model, meshes, profiles[0], profiles[-1])
    norm = grad_norm_time(inventory, meshes) if grad_norm is None else grad_norm
    return holders_sync_time(inventory, blocks) + result_check_time(inventory, meshes, engine, norm) + norm
