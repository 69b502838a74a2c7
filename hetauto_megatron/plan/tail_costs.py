"""The iteration tail: what follows the pipeline's last backward, before the next iteration starts.

Per stage, the DP gradient reduction (in the gradient-reduce dtype, exposed unless it overlaps the backward) and
the parameter all-gather of the distributed optimizer (`dp_sync_times`, `dp_exposed_times`), and the optimizer
step (`optimizer_time`); job-wide, the gradients of parameters several mesh stages hold summed across them
(`holders_sync_time`; in one pipeline of single meshes only a tied embedding table, between the first and the
last stage) and the global gradient-norm all-reduce over the world's gloo group (`grad_norm_time`).
`iteration_tail` puts them together as the runtime runs them.
"""
from __future__ import annotations

import math
from functools import lru_cache

from ..cost import comm
from ..cost.memory import adam_traffic_bytes_per_param, grad_buffer_bytes, stage_params
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from .costing import StageProfile
from .exchange_roots import exchange_weights, run_edges, source_ranks
from .link_costs import link_between
from .settings import RuntimeSettings, padded_vocab_size


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
                   links, sync: float | None = None) -> dict[str, float]:
    """What follows the last backward of the 1F1B pipeline, per stage lists of its times (pipeline order):
    the exposed gradient reduction of the slowest stage, then the job-wide terms every rank waits for (the
    tied table's holders' exchange and the global-norm all-reduce), then the optimizer step and the exposed parameter
    gather of the slowest stage. Keys: tail_s, dp_exposed_s, optimizer_s, sync_s (seconds), and per stage
    stage_dp_exposed_s, stage_optimizer_s (lists). `sync`: iteration_sync_time(model, inventory, meshes,
    profiles) when the caller has it (it depends on the layout only, not on the layer split). The search's
    leaves need tail_s alone: `tail_seconds`."""
    if sync is None:
        sync = iteration_sync_time(model, inventory, meshes, profiles)
    p = len(profiles)
    reduce_exp, after = [], []
    for i, (fw, bw) in enumerate(tail_windows(fwd, bwd, links)):
        prof, n = profiles[i], layers[i]
        reduce, gather = dp_sync_times(model, prof, n, i == 0, i == p - 1)
        r, g = _exposed(prof.settings, reduce, gather, fw, bw)
        reduce_exp.append(r)
        after.append((g, optimizer_time(model, prof, n, i == 0, i == p - 1)))
    tail = max(reduce_exp) + sync + max(g + o for g, o in after)
    exposed = [r + g for r, (g, _) in zip(reduce_exp, after)]
    opt = [o for _, o in after]
    return {"tail_s": tail, "dp_exposed_s": max(exposed), "optimizer_s": max(opt), "sync_s": sync,
            "stage_dp_exposed_s": exposed, "stage_optimizer_s": opt}


def tail_seconds(model: ModelSpec, profiles, layers, fwd, bwd, links, sync: float, memo: dict | None = None) -> float:
    """iteration_tail(...)["tail_s"], the same float, for the search's leaves: from the first stage of each run of
    identical stages (same profile, layers, ends) only, since later ones of a run see a longer window before them
    and so expose no more (the windows summed as tail_windows sums them, in one plain loop). memo: a dict the
    caller keeps for one model, remembering each stage kind's collectives and optimizer step across calls (keyed
    by the profile, without hashing the model)."""
    memo = {} if memo is None else memo
    last = len(profiles) - 1
    fwd_before = bwd_before = 0.0
    run = run_n = None
    reduce_max = after_max = -math.inf
    for i in range(last + 1):
        prof, n, f, b = profiles[i], layers[i], fwd[i], bwd[i]
        if prof is not run or n != run_n or i == 1 or i == last:   # the end stages differ from their runs
            run, run_n = prof, n
            key = (prof, n, i == 0, i == last)
            terms = memo.get(key)
            if terms is None:
                terms = memo[key] = (*dp_sync_times(model, prof, n, i == 0, i == last),
                                     optimizer_time(model, prof, n, i == 0, i == last))
            r, g = _exposed(prof.settings, terms[0], terms[1], fwd_before + f, bwd_before + b)
            if r > reduce_max:
                reduce_max = r
            if g + terms[2] > after_max:
                after_max = g + terms[2]
        if i < last:
            x = links[i]
            fwd_before += f + x
            bwd_before += b + x
    return reduce_max + sync + after_max


@lru_cache(maxsize=262144)
def optimizer_time(model: ModelSpec, prof: StageProfile, layers: int, first: bool, last: bool) -> float:
    """Adam on the local shard (the whole stage without the distributed optimizer): read/write the fp32 weight
    (the master copy in 16-bit training), two moments, read the gradient (and write the 16-bit weight):
    ~32 bytes per parameter in 16-bit mixed precision, 28 in fp32. A learned cost model may have measured the
    step on the device: then `optimizer_rate` x that traffic + `optimizer_step_s`, a fixed cost per optimizer call
    (one per stage and iteration; cost/learned/fitting.py `fit_optimizer`)."""
    per_param = adam_traffic_bytes_per_param(prof.cluster.device.dtype_bytes)
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


# ---- parameters several mesh stages hold, summed across their holders (runtime/replica_sync.py) ------------------
def owner_ranks(prof: StageProfile) -> int:
    """Ranks of a holder that own (source) a distinct part of its gradient (exchange_roots.source_ranks)."""
    return source_ranks(prof.tp, prof.dp, prof.settings.distributed_optimizer)


def holders_sync_time(inventory: Inventory, blocks, rule=exchange_weights) -> float:
    """Seconds of the exchange that sums every shared parameter's gradient across the mesh stages holding it, as
    runtime/replica_sync.py runs it, for every plan shape (one pipeline's tied embedding table included).
    `blocks`: [((parameters, of which every TP rank keeps a copy), [(cluster, StageProfile, key), ...])], each
    block's holders sorted by key (mesh index, stage).

    Two holders: one phase, each holder's source ranks send their reduced gradient of the elements they own to
    the other holder's and receive its, both directions at once. Three or more (H holders): holder j is the
    root of a run of the elements in proportion to its weight (shard_regions.root_chunks; plan/exchange_roots.py,
    the runtime's rule, weighs them by the links: equal, the roots taking turns, unless other shares make the
    busiest link less busy); in a gather phase each root's source ranks receive every other holder's reduced
    gradient of those elements, after the sums a scatter phase sends the result back to the same source ranks:
    between any two holders the root's run each way in each phase (1/H of the parameter with equal weights). The pair moves run in the gather's
    phase; the scatter starts when that phase is done. Each phase is one message per pair of ranks for all
    parameters at once. Bytes are the gradient buffer's (gradient-reduce dtype). Every link is full duplex (as
    for pipeline boundaries: each direction its own resource). Between clusters a phase's bytes in one
    direction of an inventory link add up (one transfer at the link's bandwidth), and so do all of a cluster's
    bytes out (in) over all its links where it has an uplink (`uplink_gbps`: one more resource per direction,
    without latency, which its links already pay); inside a cluster the rank
    pairs run in parallel on the inter-node network, each root rank sending or receiving its share (the side
    with fewer owner ranks sets it). A phase lasts as long as its busiest link direction or root rank
    direction. Then, inside every holder at once, the ranks that are not sources take the sum from theirs:
    without the distributed optimizer a broadcast to the DP replicas of every synced local tensor (on the
    mesh's DP link), then for what TP duplicates (the norms, a learned position table) a broadcast to the other
    TP ranks of the part each holds (on the node's link). Runs after the DP reduction, before the optimizer
    step: exposed in full. `rule(inventory, clusters, owners)`: the roots' weights of three or more holders
    (the runtime's, exchange_weights, unless explain prices another choice)."""
    if not blocks:
        return 0.0
    phases = [{}, {}]          # per phase: resource (one direction) -> bytes
    copies: dict = {}          # holder -> [DP broadcast bytes, TP broadcast bytes, its profile]

    def add(phase: int, res, nbytes: float) -> None:
        phases[phase][res] = phases[phase].get(res, 0.0) + nbytes

    for (n, dup), hs in blocks:
        if len(hs) < 2 or n == 0:
            continue
        for c, prof, key in hs:
            gb = grad_buffer_bytes(prof.cluster.device.dtype_bytes, prof.settings)
            sharded = prof.settings.distributed_optimizer
            acc = copies.setdefault(key, [0.0, 0.0, prof])
            if not sharded and prof.dp > 1:
                acc[0] += gb * ((n - dup) / prof.tp + dup)            # every rank's whole local tensor
            if prof.tp > 1:
                acc[1] += gb * dup / (prof.dp if sharded else 1)      # the part of the duplicates it holds
        roots = hs[:1] if len(hs) == 2 else hs          # two holders: the pair phase, priced as a gather both ways
        weights = ((1,) if len(hs) == 2 else
                   rule(inventory, [c for c, _, _ in hs], [owner_ranks(p) for _, p, _ in hs]))
        edges = run_edges(int(n), weights)
        for j, (rc, rp, rk) in enumerate(roots):
            run = edges[j][1] - edges[j][0]          # the elements this holder is the root of
            if not run:
                continue
            for c, prof, key in hs:
                if key == rk:
                    continue
                gb = grad_buffer_bytes(prof.cluster.device.dtype_bytes, prof.settings)
                sent = gb * run                                       # its run of the elements, once each way
                back = 0 if len(hs) == 2 else 1
                if c != rc:
                    to_root, from_root = ("link", c, rc), ("link", rc, c)
                    # every link out of (into) a cluster also crosses its uplink, where the inventory gives one
                    add(0, ("uplink", c, "out"), sent)
                    add(0, ("uplink", rc, "in"), sent)
                    add(back, ("uplink", rc, "out"), sent)
                    add(back, ("uplink", c, "in"), sent)
                else:
                    sent /= min(owner_ranks(prof), owner_ranks(rp))
                    to_root, from_root = ("ranks", rk, c, "in"), ("ranks", rk, c, "out")
                add(0, to_root, sent)
                add(back, from_root, sent)
    total = 0.0
    for phase in phases:
        times = []
        for res, nbytes in phase.items():
            if res[0] == "link":
                times.append(link_between(inventory, res[1], res[2]).transfer_time(nbytes))
            elif res[0] == "uplink":
                up = inventory.cluster(res[1]).uplink_bytes_per_s
                times.append(nbytes / up if up else 0.0)
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


def iteration_sync_time(model: ModelSpec, inventory: Inventory, meshes, profiles,
                        grad_norm: float | None = None) -> float:
    """The tail's job-wide terms of one pipeline of single meshes: the tied table summed across its two holders
    (holders_sync_time, as for any plan shape; exactly 0.0 without one) + global-norm all-reduce (`profiles`: per
    stage; `grad_norm`: grad_norm_time(inventory, meshes) when the caller has it)."""
    blocks = tied_table_blocks(model, meshes, profiles[0], profiles[-1])
    return (holders_sync_time(inventory, blocks) +
            (grad_norm_time(inventory, meshes) if grad_norm is None else grad_norm))
