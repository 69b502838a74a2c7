"""Predict an iteration of a plan with several pipelines and/or mixed replica groups in a stage (plan version 3).

The shapes (docs/plan-format.md): pipeline p trains `samples_p` samples per iteration on its own devices; a
*position* of a pipeline is a mesh plus the `alongside` meshes that follow it: more data-parallel replicas of
the same stages (same `stage_layers`), possibly another device type, TP and micro-batch. Priced as they run:

- **A position's stage** runs one micro-batch step when its slowest replica group has: the stage's forward and
  backward per step are the largest of its groups' (each at its own micro-batch size and TP).
- **Boundaries.** Inside a position every group sends to its own next stage (as inside a mesh). Between two
  positions each replica's samples go to the replicas of the next position that hold them
  (`Plan.sample_range`): a pair of groups on different clusters moves its overlapping samples over the
  inventory's link, and every pair on one link shares it; on one cluster each device sends its own shard. The
  boundary takes as long as its slowest link. A boundary between two single-mesh positions keeps its schedule
  (overlapped or blocking, plan field `boundary`); one with several groups on either side is blocking.
- **Each pipeline** runs 1F1B over its own stages (plan/pipeline.py), then each mesh's own DP reduction
  (exposed as its settings say, costing.dp_exposed_times).
- **Gradients across holders** (`replica_sync_time`): every parameter's gradient is then summed across every
  mesh stage that holds it (the other pipelines, the alongside groups), shard interval to shard interval as
  runtime/replica_sync.py exchanges them: for each pair of holders each element crosses once each way, in the
  gradient-reduce dtype. Pairs on different clusters share the inventory's link between them (concurrent flows
  on one link add up; different links run at once); two holders on one cluster exchange between their owner
  ranks in parallel on the inter-node network, so the side with fewer owners sets the time. It runs after the
  DP reduction and before the optimizer step, so it is exposed in full.
- **The iteration** = the slowest pipeline's pipeline + exposed DP reduction, the holders' gradient sync, each
  pipeline's tied-embedding exchange (the slowest), the global gradient norm over every rank, the slowest
  stage's optimizer step and exposed parameter gather, and the fixed per-iteration overhead.

A plan with one pipeline and no alongside mesh is priced by plan/simulate.py as before; on such a plan this
module gives the same figures (a test checks it), so the two can never drift apart unnoticed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..cost.memory import GIB, grad_buffer_bytes
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import costing
from .pipeline import simulate_1f1b, warmup_counts
from .settings import padded_vocab_size
from .simulate import Estimate


@dataclass
class PipelineShape:
    """One pipeline of a plan: its positions (each a list of plan.Mesh: the mesh and its alongside meshes, in
    plan order, with their flat indices into the plan's meshes) and the samples it trains per iteration."""
    positions: list            # [[(mesh index, Mesh), ...], ...]
    samples: int

    @property
    def meshes(self) -> list:
        return [m for pos in self.positions for _, m in pos]

    @property
    def step(self) -> int:
        return sum(m.dp * m.micro_batch_size for _, m in self.positions[0])


def shapes_of(plan) -> list[PipelineShape]:
    """The pipelines of a plan (plan/plan.py's version-3 API) as PipelineShapes."""
    samples = plan.pipeline_samples or (plan.global_batch_size,)
    return [PipelineShape([[(i, plan.meshes[i]) for i in pos] for pos in plan.positions(p)], samples[p])
            for p in range(plan.num_pipelines)]


@dataclass
class _Stage:
    position: int
    groups: list               # [(mesh index, Mesh, StageProfile)]
    layers: int
    first: bool
    last: bool


@dataclass
class PipelineTiming:
    """What one pipeline contributes to the iteration."""
    samples: int
    micro_batches: int
    makespan: float            # its 1F1B
    reduce_s: float            # the slowest stage's exposed DP reduction after it
    after_s: float             # the slowest stage's optimizer step + exposed parameter gather
    tied_s: float              # its tied-embedding exchange
    overhead_s: float
    stages: list               # per stage and group: the Estimate-style dict
    fits: bool

    @property
    def before_sync(self) -> float:
        return self.makespan + self.reduce_s


def _stages(model, inventory, shape: PipelineShape, cost_model) -> list[_Stage]:
    out = []
    n_pos = len(shape.positions)
    for q, pos in enumerate(shape.positions):
        layers = pos[0][1].stage_layers
        profs = []
        for idx, mesh in pos:
            cl = inventory.cluster(mesh.cluster)
            profs.append((idx, mesh, costing.stage_profile(model, cl, mesh.tp, mesh.dp, mesh.micro_batch_size,
                                                           mesh.recompute, cost_model, mesh.settings)))
        for j, n in enumerate(layers):
            out.append(_Stage(q, profs, n, q == 0 and j == 0, q == n_pos - 1 and j == len(layers) - 1))
    return out


def _ranges(pos) -> list:
    """Sample range of each group of a position inside one micro-batch step (Plan.sample_range, mesh-wise)."""
    out, start = [], 0
    for idx, mesh, prof in pos:
        out.append((start, start + mesh.dp * mesh.micro_batch_size, mesh, prof))
        start = out[-1][1]
    return out


def _boundary(model, inventory, a: _Stage, b: _Stage):
    """(transfer time, latency part, crosses clusters, schedule depth or None) of one micro-batch step's
    activations from stage a to stage b (the gradients go back the same way)."""
    if a.position == b.position:        # inside a position: each group to its own next stage
        best = (0.0, 0.0)
        for idx, mesh, prof in a.groups:
            cl = inventory.cluster(mesh.cluster)
            link = cl.intra_node if mesh.num_devices <= cl.devices_per_node else cl.inter_node
            t = costing.boundary_transfer_time(model, prof, prof, link, True, mesh.dp * mesh.micro_batch_size)
            best = max(best, (t, min(link.latency_s, t)))
        return best[0], best[1], False, None
    per_link: dict = {}                 # cross-cluster link -> bytes of this step; same-cluster pairs apart
    inside = []
    for s0, e0, ma, pa in _ranges(a.groups):
        for s1, e1, mb, pb in _ranges(b.groups):
            o = min(e0, e1) - max(s0, s1)
            if o <= 0:
                continue
            if ma.cluster == mb.cluster:
                link = inventory.cluster(ma.cluster).inter_node
                t = costing.boundary_transfer_time(model, pa, pb, link, True, o)
                inside.append((t, min(link.latency_s, t)))
            else:
                key = frozenset((ma.cluster, mb.cluster))
                nbytes = pa.cluster.device.dtype_bytes * o * model.seq_length * model.hidden_size
                per_link[key] = per_link.get(key, 0.0) + nbytes
    times = list(inside)
    for key, nbytes in per_link.items():
        link = costing._cross_link(inventory, *sorted(key))
        t = link.transfer_time(nbytes)
        times.append((t, min(link.latency_s, t)))
    t, lat = max(times)
    single = len(a.groups) == 1 and len(b.groups) == 1
    mesh = a.groups[0][1]
    cross = single and mesh.cluster != b.groups[0][1].cluster
    depth = mesh.boundary_depth if cross and mesh.boundary_schedule == "overlapped" else None
    return t, lat, cross, depth


def price_pipeline(model: ModelSpec, inventory: Inventory, shape: PipelineShape, cost_model) -> PipelineTiming:
    """One pipeline's 1F1B, memory and its own tail terms (`model`: the padded model of the whole plan)."""
    stages = _stages(model, inventory, shape, cost_model)
    p = len(stages)
    m = shape.samples // shape.step
    fwd, bwd, per_group = [], [], []
    for st in stages:
        times = [prof.times(st.layers, st.first, st.last) for _, _, prof in st.groups]
        per_group.append(times)
        fwd.append(max(f for f, _ in times))
        bwd.append(max(b for _, b in times))
    links, latency, blocking, depth = [], [], [], []
    for a, b in zip(stages, stages[1:]):
        t, lat, cross, d = _boundary(model, inventory, a, b)
        links.append(t)
        latency.append(lat)
        blocking.append(d is None)
        depth.append(d or 0)
    sim = simulate_1f1b(fwd, bwd, links, m, latency=latency, blocking=blocking, depth=depth)
    in_flight = [min(w + 1, m) for w in warmup_counts(p, m, depth)]
    buffers = [0] * p
    for l, (blk, d) in enumerate(zip(blocking, depth)):
        if not blk:
            buffers[l] += d + 2
            buffers[l + 1] += d + 2
    # the tail as costing.iteration_tail prices it, over every group of every stage
    reduce_s = after_s = 0.0
    fwd_before = bwd_before = 0.0
    rows, fits = [], True
    overhead = 0.0
    for i, st in enumerate(stages):
        for (idx, mesh, prof), (f, b) in zip(st.groups, per_group[i]):
            r, g = costing.dp_exposed_times(model, prof, st.layers, st.first, st.last, fwd_before + fwd[i],
                                            bwd_before + bwd[i])
            o = costing.optimizer_time(model, prof, st.layers, st.first, st.last)
            reduce_s, after_s = max(reduce_s, r), max(after_s, g + o)
            overhead = max(overhead, cost_model.iteration_overhead_s(prof.cluster.device))
            mem = costing.stage_memory(model, prof, st.layers, in_flight[i], st.first, st.last, buffers[i])["total"]
            fits &= mem <= prof.memory_cap
            row = {"stage": i, "mesh": idx, "position": st.position, "cluster": prof.cluster.name,
                   "device_type": prof.cluster.device.name, "devices": prof.tp * prof.dp, "tp": prof.tp,
                   "dp": prof.dp, "micro_batch_size": prof.micro_batch_size, "recompute": prof.recompute,
                   "layers": st.layers, "compute_s": round(m * (f + b), 6), "forward_s": round(f, 6),
                   "backward_s": round(b, 6), "busy_s": round(m * (f + b), 6),
                   "bubble_s": round(max(sim.makespan - m * (f + b), 0), 6), "memory_gib": round(mem / GIB, 2),
                   "memory_cap_gib": round(prof.memory_cap / GIB, 2),
                   "send_next_s": round(links[i], 6) if i < p - 1 else 0.0,
                   "dp_exposed_s": round(r + g, 6), "optimizer_s": round(o, 6), "_memory": mem}
            if i < p - 1:
                row.update({"send_next_latency_s": round(latency[i], 9),
                            "send_next_schedule": "blocking" if blocking[i] else "overlapped",
                            "send_next_depth": depth[i]})
            rows.append(row)
        link = links[i] if i < p - 1 else 0.0
        fwd_before += fwd[i] + link
        bwd_before += bwd[i] + link
    firsts = [pos[0][1] for pos in shape.positions]
    tied = costing.tied_embedding_time(model, inventory, firsts, stages[0].groups[0][2], stages[-1].groups[0][2])
    return PipelineTiming(shape.samples, m, sim.makespan, reduce_s, after_s, tied, overhead, rows, fits)


# ---- gradients across holders ----------------------------------------------------------------------------------
def _holders(model, shapes: list[PipelineShape], stage_lists: list) -> list:
    """Per parameter block: (its parameters, its holders [(cluster, Mesh, StageProfile, (pipeline, stage, mesh
    index))]). Blocks: every transformer layer, the embedding (first stage of each pipeline),
    the output head and final norm (last stage of each pipeline; with tied embeddings the last stage's own copy
    of the table is a parameter of its own too)."""
    blocks = []
    L = model.num_layers
    by_layer: list = [[] for _ in range(L)]
    emb, head = [], []
    for pi, stages in enumerate(stage_lists):
        layer = 0
        for si, st in enumerate(stages):
            for idx, mesh, prof in st.groups:
                h = (mesh.cluster, mesh, prof, (pi, si, idx))
                for l in range(layer, layer + st.layers):
                    by_layer[l].append(h)
                if st.first:
                    emb.append(h)
                if st.last:
                    head.append(h)
            layer += st.layers
    blocks += [(model.layer_params, hs) for hs in by_layer]
    blocks.append((model.embedding_params, emb))
    blocks.append((model.output_params, head))
    return blocks


def replica_sync_time(model: ModelSpec, inventory: Inventory, shapes: list[PipelineShape], stage_lists) -> float:
    """Seconds of the exchange that sums every parameter's gradient across the mesh stages holding it.

    For each pair of holders of a block, its gradients cross once each way (both directions at once) in the
    gradient-reduce dtype. Pairs on different clusters share the inventory's link between them (all blocks'
    bytes on one link add up: one transfer at the full bandwidth); pairs on one cluster run between owner
    ranks in parallel, the side with fewer owners setting the time, one block after another on those ranks.
    Different links and different rank pairs run at once: the slowest sets the time. Holders without the
    distributed optimizer then broadcast their summed TP shard to their DP replicas."""
    link_bytes: dict = {}
    pair_time: dict = {}
    bcast = 0.0
    for params, hs in _holders(model, shapes, stage_lists):
        for i in range(len(hs)):
            for j in range(i + 1, len(hs)):
                (ca, ma, pa, ka), (cb, mb, pb, kb) = hs[i], hs[j]
                gb = max(grad_buffer_bytes(p.cluster.device.dtype_bytes, p.settings) for p in (pa, pb))
                nbytes = gb * params
                if ca != cb:
                    key = frozenset((ca, cb))
                    link_bytes[key] = link_bytes.get(key, 0.0) + nbytes
                else:
                    owners = min(p.tp * (p.dp if p.settings.distributed_optimizer else 1) for p in (pa, pb))
                    key = (ka, kb, ca)       # the two holders' owner ranks
                    pair_time[key] = pair_time.get(key, 0.0) + nbytes / owners / \
                        inventory.cluster(ca).inter_node.bytes_per_s
        if len(hs) > 1:
            for _, mesh, prof, *_ in hs:
                if prof.dp > 1 and not prof.settings.distributed_optimizer:
                    gb = grad_buffer_bytes(prof.cluster.device.dtype_bytes, prof.settings)
                    bcast = max(bcast, prof.dp_link.transfer_time(gb * params / prof.tp))
    times = [costing._cross_link(inventory, *sorted(k)).transfer_time(b) for k, b in link_bytes.items()]
    times += [t + inventory.cluster(k[2]).inter_node.latency_s for k, t in pair_time.items()]
    return max(times, default=0.0) + bcast


# ---- the whole plan --------------------------------------------------------------------------------------------
@dataclass
class ShapesResult:
    iteration_time_s: float
    pipelines: list            # PipelineTiming per pipeline
    replica_sync_s: float
    grad_norm_s: float
    fits: bool
    extra: dict = field(default_factory=dict)


def price_shapes(model: ModelSpec, inventory: Inventory, shapes: list[PipelineShape], cost_model) -> ShapesResult:
    """The iteration of a plan's pipelines (`inventory` at the plan's precision; `model` unpadded)."""
    meshes = [m for s in shapes for m in s.meshes]
    pm = model.replace(vocab_size=padded_vocab_size(model.vocab_size, [m.tp for m in meshes]))
    timings, stage_lists = [], []
    for s in shapes:
        stage_lists.append(_stages(pm, inventory, s, cost_model))
        timings.append(price_pipeline(pm, inventory, s, cost_model))
    sync = replica_sync_time(pm, inventory, shapes, stage_lists)
    norm = costing.grad_norm_time(inventory, meshes)
    T = (max(t.before_sync for t in timings) + sync + max(t.tied_s for t in timings) + norm
         + max(t.after_s for t in timings) + max(t.overhead_s for t in timings))
    return ShapesResult(T, timings, sync, norm, all(t.fits for t in timings))


def shapes_estimate(model: ModelSpec, inventory: Inventory, shapes: list[PipelineShape], cost_model) -> Estimate:
    """price_shapes as simulate() reports it: an Estimate whose `stages` has one row per stage and replica group
    (keys `pipeline`, `position`), and `pipelines` / `replica_sync_s` besides."""
    res = price_shapes(model, inventory, shapes, cost_model)
    T = res.iteration_time_s
    gbs = sum(s.samples for s in shapes)
    tokens = gbs * model.seq_length
    world = sum(m.num_devices for s in shapes for m in s.meshes)
    flops = model.model_flops_per_token() * tokens
    rows, peak, sources, why = [], 0.0, {}, {}
    for p, (s, t) in enumerate(zip(shapes, res.pipelines)):
        for row in t.stages:
            mem = row.pop("_memory")
            row.update(pipeline=p, utilisation=round(row["busy_s"] / T, 4) if T > 0 else 0.0)
            rows.append((row, mem))
        for m in s.meshes:
            dev = inventory.cluster(m.cluster).device
            peak += dev.peak_tflops * 1e12 * m.num_devices
            sources[dev.name] = cost_model.source(dev)
            if hasattr(cost_model, "coverage"):
                why[dev.name] = cost_model.coverage(dev)[1]
    est = Estimate(iteration_time_s=T, tokens_per_s=tokens / T, tflops_per_device=flops / T / world / 1e12,
                   mfu=flops / T / peak, memory_gib=[mem / GIB for _, mem in rows], fits=res.fits,
                   pipeline_s=max(t.makespan for t in res.pipelines),
                   dp_exposed_s=max(max(r["dp_exposed_s"] for r in t.stages) for t in res.pipelines),
                   optimizer_s=max(max(r["optimizer_s"] for r in t.stages) for t in res.pipelines),
                   sync_s=res.replica_sync_s + res.grad_norm_s + max(t.tied_s for t in res.pipelines),
                   stages=[r for r, _ in rows], cost_model=sources, cost_model_why=why)
    est.pipelines = [{"samples": t.samples, "micro_batches": t.micro_batches, "pipeline_s": round(t.makespan, 6),
                      "dp_exposed_s": round(t.reduce_s, 6), "before_sync_s": round(t.before_sync, 6)}
                     for t in res.pipelines]
    est.replica_sync_s = res.replica_sync_s
    return est
