"""Per-stage costs of one mesh configuration, the shared currency of the simulator, the layer split and the search.

A `StageProfile` answers, for a cluster running (tp, dp, micro_batch_size, recompute): how long one transformer
layer takes forward and backward on one micro-batch (TP collectives and recomputation included), what the
embedding and the output head add on the first and last stage, how many bytes a layer costs in memory, and how
long DP gradient synchronisation and the optimizer step take per parameter. Stage time is then linear in its
layer count, which is what makes the exact layer split cheap (plan/split.py).

Every term is priced under the mesh's runtime settings (plan/settings.py, `StageProfile.settings`), the same
table the emitted arguments and the runtime read: memory (cost/memory.py) with or without sequence parallelism
and the distributed optimizer, the DP gradient reduction in the gradient-reduce dtype and exposed unless it
overlaps, and the iteration tail: the gradients of parameters several mesh stages hold summed across them
(`holders_sync_time`; in one pipeline of single meshes only a tied embedding table, between the first and the
last stage) and the global gradient-norm all-reduce over the world's gloo group.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from functools import lru_cache

from ..cost import comm
from ..cost.memory import (GIB, JobMemory, LayerImpl, grad_buffer_bytes, job_stage_memory_bytes, stage_memory_bytes,
                           stage_params)
from ..spec.inventory import Cluster, Inventory, LinkSpec
from ..spec.model import ModelSpec
from .settings import MEGATRON_DEFAULT_DROPOUT, RuntimeSettings, default_settings, padded_vocab_size


@dataclass(frozen=True, eq=False)      # identity hash: profiles are unique (cached) and used as cache keys
class StageProfile:
    cluster: Cluster
    tp: int
    dp: int
    micro_batch_size: int
    recompute: str
    layer_fwd: float            # seconds per micro-batch, TP all-reduces included
    layer_bwd: float            # recompute included
    emb_fwd: float
    emb_bwd: float
    head_fwd: float
    head_bwd: float
    dp_link: LinkSpec           # the link DP collectives of this mesh run on
    memory_cap: float           # usable bytes per device
    settings: RuntimeSettings   # what this mesh runs with (plan/settings.py)
    optimizer_rate: float = 1.0     # the optimizer step: rate x its memory traffic + optimizer_step_s
    optimizer_step_s: float = 0.0   # (the cost model's optimizer_calibration; analytic: 1, 0)
    memory_job: JobMemory | None = None   # every stage must also fit as this job holds memory (--memory-job)

    def times(self, layers: int, first: bool, last: bool) -> tuple[float, float]:
        f = layers * self.layer_fwd + (self.emb_fwd if first else 0.0) + (self.head_fwd if last else 0.0)
        b = layers * self.layer_bwd + (self.emb_bwd if first else 0.0) + (self.head_bwd if last else 0.0)
        return f, b


@lru_cache(maxsize=65536)
def stage_profile(model: ModelSpec, cluster: Cluster, tp: int, dp: int, micro_batch_size: int, recompute: str,
                  cost_model, settings: RuntimeSettings | None = None) -> StageProfile:
    """`settings`: the mesh's runtime settings; None = the defaults for its TP (what `hetauto plan` emits)."""
    settings = settings or default_settings(tp)
    if tp > 1:     # (at TP 1 there is nothing to split)
        cost_model = _with_sequence_parallel(cost_model, settings.sequence_parallel)
    dev = cluster.device
    lf, lb = cost_model.layer_times(model, dev, tp, micro_batch_size)
    lb += cost_model.recompute_time(model, dev, tp, micro_batch_size, recompute)
    # Two all-reduces (or reduce-scatter + all-gather with sequence parallel) per layer forward, two backward,
    # two more when a full recompute re-runs the forward. TP stays inside a node (enforced by the search).
    act = dev.dtype_bytes * micro_batch_size * model.seq_length * model.hidden_size
    ar = comm.allreduce_time(act, tp, cluster.intra_node)
    lf += 2 * ar
    lb += 2 * ar + (2 * ar if recompute == "full" else 0.0)
    ef, eb = cost_model.embedding_times(model, dev, tp, micro_batch_size)
    hf, hb = cost_model.head_times(model, dev, tp, micro_batch_size)
    dp_link = dp_ring_link(cluster, tp, dp)
    opt_rate, opt_step = cost_model.optimizer_calibration(dev)
    return StageProfile(cluster, tp, dp, micro_batch_size, recompute, lf, lb, ef, eb, hf, hb, dp_link,
                        dev.memory_gib * GIB, settings, opt_rate, opt_step, memory_job_of(cost_model, dev))


def memory_job_of(cost_model, device):
    """The job a stage on `device` must also fit as (StageProfile.memory_job): the one asked for (--memory-job),
    else Sailor's Megatron-DeepSpeed job for an fp32 plan whose device the cost model prices from Sailor's
    measurements: those are that fp32 job's layers (unfused attention, its framework), so the plan must also hold
    in memory as that job does (docs/peers.md). None: this plan's runtime alone."""
    job = getattr(cost_model, "memory_job", None)
    if job is None and device.precision == "fp32" and hasattr(cost_model, "coverage"):
        info = cost_model.coverage(device)[0]
        if info is not None and info.source == "sailor":
            return sailor_deepspeed_job()
    return job


def resolve_memory_job(cost_model, inventory: Inventory) -> list[str]:
    """Decide the memory job of a whole plan on `inventory` (at the plan's precision) before it is priced: one
    job, so once any device is priced from Sailor's fp32 measurements (memory_job_of), every cluster's stages,
    also those another model prices, must fit as Sailor's Megatron-DeepSpeed job holds memory. Sets
    `cost_model.memory_job` and returns those devices' names (sorted; empty if a job was already asked for or
    none is priced so). Every command that prices a plan calls it, so they all give the same verdict."""
    if getattr(cost_model, "memory_job", None) is not None:
        return []
    names = sorted({c.device.name for c in inventory.clusters if memory_job_of(cost_model, c.device) is not None})
    if names:
        cost_model.memory_job = sailor_deepspeed_job()
    return names


def _with_sequence_parallel(cost_model, sequence_parallel: bool):
    """The cost model pricing element-wise work as the mesh runs it: a model that has the switch (the analytic
    one: without sequence parallelism every TP rank repeats the norms, dropout and residuals of the whole
    sequence) gets the mesh's setting."""
    if getattr(cost_model, "sequence_parallel", sequence_parallel) == sequence_parallel:
        return cost_model
    other = copy.copy(cost_model)
    other.sequence_parallel = sequence_parallel
    return other


def dp_ring_link(cluster: Cluster, tp: int, dp: int) -> LinkSpec:
    """The link a DP group's ring runs at. Inside one node: the intra-node link. Across nodes, the group has
    k = min(dp, devices_per_node / tp) members per node, each with its own NIC (the inventory's inter_node
    bandwidth is per device); NCCL runs one ring channel per NIC, so each node crossing carries k NICs'
    bandwidth, up to the intra-node link's, and up to the node's own (`node_gbps`: one NIC for the node)."""
    if tp * dp <= cluster.devices_per_node:
        return cluster.intra_node
    k = max(1, min(dp, cluster.devices_per_node // tp))
    inter = cluster.inter_node
    return LinkSpec(min(k * inter.bandwidth_gbps, inter.node_gbps or math.inf, cluster.intra_node.bandwidth_gbps),
                    inter.latency_s)


def stage_memory(model: ModelSpec, prof: StageProfile, layers: int, in_flight: int, first: bool,
                 last: bool, boundary_buffers: int = 0) -> dict[str, float]:
    """Bytes on the busiest device of the stage (cost/memory.py). With a memory job (`--memory-job`), `total` is
    the larger of what this plan's runtime holds and what that job would hold (`job_total`): the stage must fit
    both ways."""
    mem = stage_memory_bytes(model, layers=layers, tp=prof.tp, dp=prof.dp, micro_batch_size=prof.micro_batch_size,
                             recompute=prof.recompute, in_flight=in_flight, first=first, last=last,
                             settings=prof.settings, vendor=prof.cluster.device.vendor,
                             dtype_bytes=prof.cluster.device.dtype_bytes,
                             boundary_buffers=boundary_buffers, overhead=prof.cluster.overhead)
    if prof.memory_job is not None:
        job = job_stage_memory_bytes(prof.memory_job, model, layers=layers, tp=prof.tp, dp=prof.dp,
                                     micro_batch_size=prof.micro_batch_size, recompute=prof.recompute,
                                     in_flight=in_flight, first=first, last=last,
                                     vendor=prof.cluster.device.vendor, overhead=prof.cluster.overhead)
        mem = {**mem, "job_total": job["total"], "total": max(mem["total"], job["total"])}
    return mem


def sailor_deepspeed_job() -> JobMemory:
    """Sailor's Megatron-DeepSpeed fork as its simulator counts memory (sailor/Planner/simulations/
    runtime_simulator.py `check_config_fits`; docs/peers.md): fp32 training, Adam state on every DP rank (no ZeRO),
    no sequence parallelism, unfused attention keeping the s x s softmax output, hidden dropout (Megatron's 0.1) but
    no attention dropout (what Sailor's per-layer measurements show: 360 MB per OPT-350 layer at micro-batch 1 in
    fp32, less than the scores with a dropout mask and output would take alone), and 8 bytes per parameter beyond
    weights + gradients + Adam: DeepSpeed's gradient communication buffer (4) and its extra model copy (4)."""
    return JobMemory("sailor-deepspeed",
                     RuntimeSettings(sequence_parallel=False, distributed_optimizer=False, overlap_grad_reduce=False,
                                     overlap_param_gather=False, hidden_dropout=MEGATRON_DEFAULT_DROPOUT,
                                     attention_dropout=0.0),
                     LayerImpl(flash_attention=False), 4, 8.0)


MEMORY_JOBS = {"sailor-deepspeed": sailor_deepspeed_job}


@lru_cache(maxsize=262144)
def max_layers_in_memory(model: ModelSpec, prof: StageProfile, in_flight: int, first: bool, last: bool,
                         boundary_buffers: int = 0) -> int:
    """Largest layer count a stage can hold, -1 if even zero layers do not fit.

    Memory is affine in the layer count from one layer on, not from zero: under full recomputation the first
    layer also brings the buffer one layer's recomputed activations need. So the slope is taken between one and
    two layers (between zero and one it would count that buffer once per layer and understate the cap), and the
    count is checked against the memory model at its edge so that rounding never overstates it."""
    def need(n: int) -> float:
        return stage_memory(model, prof, n, in_flight, first, last, boundary_buffers)["total"]

    return layers_that_fit(need, prof.memory_cap, model.num_layers)


def layers_that_fit(need, limit: float, num_layers: int, per: float | None = None) -> int:
    """The largest n with need(n) <= limit, -1 if even need(0) exceeds it; `need` (bytes for n layers) grows
    affinely from one layer on: a step from the slope between one and two layers (`per`, when the caller knows
    it), then checked against `need` at its edge so that rounding never overstates it (need(n) > limit for n
    above). need(0) is only asked when not even one layer fits. (`num_layers` when a layer costs nothing.)"""
    one = need(1)
    if one > limit:
        return -1 if need(0) > limit else 0
    if per is None:
        per = need(2) - one
    if per <= 0:
        return num_layers
    n = 1 + int((limit - one) // per)
    while n > 1 and need(n) > limit:
        n -= 1
    while need(n + 1) <= limit:
        n += 1
    return n


@lru_cache(maxsize=262144)     # pure; the search asks for the same stage under many layouts
def dp_sync_times(model: ModelSpec, prof: StageProfile, layers: int, first: bool, last: bool) -> tuple[float, float]:
    """(gradient reduction, parameter all-gather) seconds of one iteration on the ring of the DP group's link.

    With the distributed optimizer the gradients are reduce-scattered (all-reduced where the mesh's engine does
    so: settings.py ENGINES) and the updated parameters all-gathered; without it the gradients are all-reduced and
    nothing is gathered. Gradients travel in the gradient
    buffer's dtype (fp32 by default, settings.grad_reduce_dtype), parameters in the training precision."""
    params = stage_params(model, prof.tp, layers, first, last)
    dtype = prof.cluster.device.dtype_bytes
    grads = grad_buffer_bytes(dtype, prof.settings) * params
    # The engine's row of the settings table says which collective reduces (settings.py ENGINES: DeepSpeed's ZeRO-1
    # all-reduces whole buckets before each rank keeps its shard).
    reduce = (comm.reduce_scatter_time if prof.settings.sharded_grad_reduce else comm.allreduce_time)(
        grads, prof.dp, prof.dp_link)
    if prof.settings.distributed_optimizer:
        return reduce, comm.all_gather_time(dtype * params, prof.dp, prof.dp_link)
    return reduce, 0.0


def dp_exposed_times(model: ModelSpec, prof: StageProfile, layers: int, first: bool, last: bool, fwd_window: float,
                     bwd_window: float) -> tuple[float, float]:
    """(gradient reduction, parameter gather) seconds DP synchronisation adds to the iteration for one stage.

    With overlap_grad_reduce Megatron reduces bucket by bucket as the last micro-batch's backward produces the
    gradients, so the reduction hides behind `bwd_window`: that backward plus the pipeline's drain after it (the
    stages before this one still running theirs). With overlap_param_gather the gather of the updated parameters
    runs during the next iteration's first forward (`fwd_window`: this stage's, after the earlier stages').
    Only what sticks out costs time; without the overlap the collective is exposed in full."""
    reduce, gather = dp_sync_times(model, prof, layers, first, last)
    return _exposed(prof.settings, reduce, gather, fwd_window, bwd_window)


def _exposed(s: RuntimeSettings, reduce: float, gather: float, fwd_window: float,
             bwd_window: float) -> tuple[float, float]:
    return (max(0.0, reduce - bwd_window) if s.overlap_grad_reduce else reduce,
            max(0.0, gather - fwd_window) if s.overlap_param_gather else gather)


def tail_windows(fwd, bwd, links):
    """(forward window, backward window) of each stage of a pipeline (pipeline order): its own pass plus those
    of the stages before it, links included. The backward window is what its gradient reduction can hide behind
    (its last backward and the drain of the stages before it), the forward one its parameter gather
    (dp_exposed_times)."""
    fwd_before = bwd_before = 0.0
    last = len(fwd) - 1
    for i, (f, b) in enumerate(zip(fwd, bwd)):
        yield fwd_before + f, bwd_before + b
        link = links[i] if i < last else 0.0
        fwd_before += f + link
        bwd_before += b + link


def iteration_tail(model: ModelSpec, inventory: Inventory, meshes, profiles, layers, fwd, bwd,
                   links, sync: float | None = None, per_stage: bool = True,
                   memo: dict | None = None) -> dict[str, float]:
    """What follows the last backward of the 1F1B pipeline, per stage lists of its times (pipeline order):
    the exposed gradient reduction of the slowest stage, then the job-wide terms every rank waits for (the
    tied table's holders' exchange and the global-norm all-reduce), then the optimizer step and the exposed parameter
    gather of the slowest stage. Keys: tail_s, dp_exposed_s, optimizer_s, sync_s (seconds), and per stage
    stage_dp_exposed_s, stage_optimizer_s (lists). `sync`: iteration_sync_time(model, inventory, meshes,
    profiles) when the caller has it (it depends on the layout only, not on the layer split).
    per_stage=False: only tail_s (the search's leaves), from the first stage of each run of identical stages
    (same profile, layers, ends): later ones of a run see a longer window before them, so they expose no more.
    memo: a dict the caller keeps for one model, remembering each stage kind's collectives and optimizer step
    across calls (keyed by the profile, without hashing the model)."""
    p = len(profiles)
    reduce_exp, after = [], []
    run = None
    for i, (fw, bw) in enumerate(tail_windows(fwd, bwd, links)):
        prof, n = profiles[i], layers[i]
        if prof is not run or n != run_n or i == 1 or i == p - 1:   # a mesh's stages repeat: priced once per run
            run, run_n, first, last = prof, n, i == 0, i == p - 1
            terms = None if memo is None else memo.get((prof, n, first, last))
            if terms is None:
                terms = (*dp_sync_times(model, prof, n, first, last), optimizer_time(model, prof, n, first, last))
                if memo is not None:
                    memo[(prof, n, first, last)] = terms
            reduce, gather, o = terms
            new = True
        if new or per_stage:
            r, g = _exposed(prof.settings, reduce, gather, fw, bw)
            reduce_exp.append(r)
            after.append((g, o))
            new = False
    if sync is None:
        sync = iteration_sync_time(model, inventory, meshes, profiles)
    tail = max(reduce_exp) + sync + max(g + o for g, o in after)
    if not per_stage:
        return {"tail_s": tail}
    exposed = [r + g for r, (g, _) in zip(reduce_exp, after)]
    opt = [o for _, o in after]
    return {"tail_s": tail, "dp_exposed_s": max(exposed), "optimizer_s": max(opt), "sync_s": sync,
            "stage_dp_exposed_s": exposed, "stage_optimizer_s": opt}


@lru_cache(maxsize=262144)
def optimizer_time(model: ModelSpec, prof: StageProfile, layers: int, first: bool, last: bool) -> float:
    """Adam on the local shard (the whole stage without the distributed optimizer): read/write the fp32 weight
    (the master copy in 16-bit training), two moments, read the gradient (and write the 16-bit weight):
    ~32 bytes per parameter in 16-bit mixed precision, 28 in fp32. A learned cost model may have measured the
    step on the device: then `optimizer_rate` x that traffic + `optimizer_step_s`, a fixed cost per optimizer call
    (one per stage and iteration; cost/learned/fitting.py `fit_optimizer`)."""
    per_param = 28 if prof.cluster.device.dtype_bytes == 4 else 32
    shard = prof.dp if prof.settings.distributed_optimizer else 1
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


def _cross_link(inventory: Inventory, a: str, b: str) -> LinkSpec:
    link = inventory.link(a, b)
    if link is None:    # not adjacent in the inventory: the slowest listed link carries it (conservative)
        link = min(inventory.links.values(), key=lambda x: x.bytes_per_s, default=inventory.cluster(a).inter_node)
    return link


# ---- parameters several mesh stages hold, summed across their holders (runtime/replica_sync.py) ------------------
def _owners(prof: StageProfile) -> int:
    """Ranks of a holder that own (source) a distinct part of its gradient: TP x DP shards with the distributed
    optimizer, the TP slices of DP rank 0 without it."""
    return prof.tp * (prof.dp if prof.settings.distributed_optimizer else 1)


def holders_sync_time(inventory: Inventory, blocks) -> float:
    """Seconds of the exchange that sums every shared parameter's gradient across the mesh stages holding it, as
    runtime/replica_sync.py runs it, for every plan shape (one pipeline's tied embedding table included).
    `blocks`: [((parameters, of which every TP rank keeps a copy), [(cluster, StageProfile, key), ...])], each
    block's holders sorted by key (mesh index, stage): the first is the root.

    Two holders: one phase, each holder's source ranks send their reduced gradient of the elements they own to
    the other holder's and receive its, both directions at once. Three or more: the root's source ranks
    receive, in a gather phase, every other holder's reduced gradient for the elements they own; after the
    sums, a scatter phase sends the result back to the same source ranks. The pair moves run in the gather's
    phase; the scatter starts when that phase is done. Each phase is one message per pair of ranks for all
    parameters at once. Bytes are the gradient buffer's (gradient-reduce dtype). Every link is full duplex (as
    for pipeline boundaries: each direction its own resource). Between clusters a phase's bytes in one
    direction of an inventory link add up (one transfer at the link's bandwidth); inside a cluster the rank
    pairs run in parallel on the inter-node network, each root rank sending or receiving its share (the side
    with fewer owner ranks sets it). A phase lasts as long as its busiest link direction or root rank
    direction. Then, inside every holder at once, the ranks that are not sources take the sum from theirs:
    without the distributed optimizer a broadcast to the DP replicas of every synced local tensor (on the
    mesh's DP link), then for what TP duplicates (the norms, a learned position table) a broadcast to the other
    TP ranks of the part each holds (on the node's link). Runs after the DP reduction, before the optimizer
    step: exposed in full."""
    phases = [{}, {}]          # per phase: resource (one direction) -> bytes
    copies: dict = {}          # holder -> [DP broadcast bytes, TP broadcast bytes, its profile]

    def add(phase: int, res, nbytes: float) -> None:
        phases[phase][res] = phases[phase].get(res, 0.0) + nbytes

    for (n, dup), hs in blocks:
        if len(hs) < 2 or n == 0:
            continue
        rc, rp, rk = hs[0]
        for c, prof, key in hs:
            gb = grad_buffer_bytes(prof.cluster.device.dtype_bytes, prof.settings)
            sharded = prof.settings.distributed_optimizer
            acc = copies.setdefault(key, [0.0, 0.0, prof])
            if not sharded and prof.dp > 1:
                acc[0] += gb * ((n - dup) / prof.tp + dup)            # every rank's whole local tensor
            if prof.tp > 1:
                acc[1] += gb * dup / (prof.dp if sharded else 1)      # the part of the duplicates it holds
            if key == rk:
                continue
            sent = gb * n                                             # every element once each way
            if c != rc:
                to_root, from_root = ("link", c, rc), ("link", rc, c)
            else:
                sent /= min(_owners(prof), _owners(rp))
                to_root, from_root = ("ranks", rk, c, "in"), ("ranks", rk, c, "out")
            add(0, to_root, sent)
            add(0 if len(hs) == 2 else 1, from_root, sent)
    total = 0.0
    for phase in phases:
        times = []
        for res, nbytes in phase.items():
            if res[0] == "link":
                times.append(_cross_link(inventory, res[1], res[2]).transfer_time(nbytes))
            else:
                times.append(inventory.cluster(res[2]).inter_node.transfer_time(nbytes))
        total += max(times, default=0.0)
    total += max(((prof.dp_link.transfer_time(dp) if dp else 0.0) +
                  (prof.cluster.intra_node.transfer_time(tp) if tp else 0.0) for dp, tp, prof in copies.values()),
                 default=0.0)
    return total


def tied_table_blocks(model: ModelSpec, meshes, first: StageProfile, last: StageProfile) -> list:
    """One pipeline of single meshes: its only parameter with two holders is a tied embedding table, held by the
    first stage (word embeddings, the root) and the last stage (output layer). The block for holders_sync_time
    (none untied or with one stage). `meshes`: the plan's mesh list or MeshChoices (cluster, tp, dp,
    num_stages), pipeline order; the table has the plan's padded vocabulary, as every mesh builds it."""
    if not model.tie_embeddings or sum(m.num_stages for m in meshes) == 1:
        return []
    table = padded_vocab_size(model.vocab_size, [m.tp for m in meshes]) * model.hidden_size
    return [((table, 0), [(meshes[0].cluster, first, (0, 0)),
                          (meshes[-1].cluster, last, (len(meshes) - 1, meshes[-1].num_stages - 1))])]


def grad_norm_time(inventory: Inventory, meshes) -> float:
    """The global gradient norm: a scalar all-reduced over the gloo group of every rank (ranks mesh after
    mesh). gloo's ring takes 2(n - 1) steps, each waiting for its left neighbour, so the message walks the ring
    about twice: twice the sum of the hop latencies (each rank to the next, the last back to the first), where
    hops inside a cluster cost its inter-node latency and hops between clusters their link's. Bandwidth does
    not matter for a few bytes."""
    ring = 0.0
    for i, m in enumerate(meshes):
        ring += (m.tp * m.dp * m.num_stages - 1) * inventory.cluster(m.cluster).inter_node.latency_s
        ring += _hop_latency(inventory, m.cluster, meshes[(i + 1) % len(meshes)].cluster)
    return GRAD_NORM_ALLREDUCES * 2 * ring


def iteration_sync_time(model: ModelSpec, inventory: Inventory, meshes, profiles) -> float:
    """The tail's job-wide terms of one pipeline of single meshes: the tied table summed across its two holders
    (holders_sync_time, as for any plan shape) + global-norm all-reduce (`profiles`: per stage)."""
    blocks = tied_table_blocks(model, meshes, profiles[0], profiles[-1])
    return holders_sync_time(inventory, blocks) + grad_norm_time(inventory, meshes)


def boundary_pairs(senders, receivers, seq: int) -> int:
    """How many (sending rank, receiving rank) pairs a boundary's transfers use at once: the runtime's
    `compute_transfers` blocks, one connection per pair (runtime/communicator.py). `senders` / `receivers`:
    (first sample, end sample, tp, dp) of each mesh of the two sides in one micro-batch step. A pair of
    replicas whose samples overlap exchanges one block per piece of the sequence cut at both TP shardings."""
    pairs = 0
    for s0, s1, stp, sdp in senders:
        for r0, r1, rtp, rdp in receivers:
            lo, hi = max(s0, r0), min(s1, r1)
            if lo >= hi:
                continue
            ms, mr = (s1 - s0) // sdp, (r1 - r0) // rdp
            cuts = {x for x in range(s0, s1, ms) if lo < x < hi} | {x for x in range(r0, r1, mr) if lo < x < hi}
            seq_cuts = {t * seq // stp for t in range(stp)} | {t * seq // rtp for t in range(rtp)} | {seq}
            pairs += (len(cuts) + 1) * (len(seq_cuts) - 1)
    return pairs


def boundary_transfer_time(model: ModelSpec, a: StageProfile, b: StageProfile, link: LinkSpec, same_cluster: bool,
                           samples_per_step: int, partitions: int = 1) -> float:
    """One micro-batch's activation (or its gradient) crossing a stage boundary.

    Inside a cluster every sending device has its own path: it sends its 1/tp sequence shard of its replica's
    activation (or, `partitions` > 1, its 1/partitions slice of the whole activation: DeepSpeed's engine,
    plan/deepspeed_schedule.py). Between clusters the inventory's link is the whole site-to-site bandwidth, shared by all
    replicas; hetauto sends each byte across once, so the whole step's activation crosses it, over as many
    concurrent connections as the boundary has rank pairs (a link with `flow_gbps` gives each its rate, up to
    the link's bandwidth)."""
    B = a.cluster.device.dtype_bytes   # what the sender computes in (the receiver casts if it differs)
    if same_cluster:
        # Without sequence parallelism every TP rank of the sender holds (and sends) the whole activation.
        shards = max(a.tp, b.tp) if a.settings.sequence_parallel else partitions
        nbytes = B * a.micro_batch_size * model.seq_length * model.hidden_size / shards
        if link.node_gbps is not None:   # the node's devices send at once through its one NIC
            senders = min(a.tp * a.dp, a.cluster.devices_per_node)
            return link.latency_s + nbytes / (min(link.bandwidth_gbps, link.node_gbps / senders) * 1e9 / 8)
    else:
        nbytes = B * samples_per_step * model.seq_length * model.hidden_size
        if link.flow_gbps is not None:
            S = samples_per_step
            return link.transfer_time(nbytes, boundary_pairs([(0, S, a.tp, a.dp)], [(0, S, b.tp, b.dp)],
                                                             model.seq_length))
    return link.transfer_time(nbytes)
