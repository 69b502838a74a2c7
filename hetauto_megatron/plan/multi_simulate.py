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
  (overlapped or blocking, plan field `boundary`; shapes.boundary_depth); one with several groups on either side
  is blocking.
- **Each pipeline** runs 1F1B over its own stages (plan/pipeline.py), then each mesh's own DP reduction
  (exposed as its settings say and Megatron-Core runs it, tail_costs.dp_exposed_times).
- **Gradients across holders** (`_holders`, priced by holders_exchange.holders_sync_time, which also prices the
  tied table of one pipeline of single meshes in plan/simulate.py): every parameter's gradient is then summed
  across every mesh stage that holds it (the other pipelines, the alongside groups; with tied embeddings the
  output head's copies too), as runtime/replica_sync.py runs it: two holders send each other their reduced
  gradient (gradient-reduce dtype) at once, in one phase; with three or more each holder is the root of a run
  of the elements (in proportion to plan/exchange_roots.py's weights), a gather phase brings every other
  holder's reduced gradient of each run to its root's ranks, a scatter phase sends the sums back to the same
  ranks; then each holder's other ranks take it from theirs by broadcasts
  inside the mesh (DP replicas without the distributed optimizer, TP duplicates). Between clusters a phase's
  bytes in one direction of an inventory link add up (links are full duplex; different links run at once);
  inside a cluster the rank pairs run in parallel on the inter-node network. It runs after the DP reduction and
  before the optimizer step, so it is exposed in full.
- **The iteration** = the slowest pipeline's pipeline + exposed DP reduction, the holders' gradient sync, the result
  check of Megatron-LM's loop and the global gradient norm over every rank, the slowest stage's optimizer step and
  exposed parameter gather, and the fixed per-iteration overhead.

A plan with one pipeline and no alongside mesh is priced by plan/simulate.py as before; on such a plan this
module gives the same figures (a test checks it), so the two can never drift apart unnoticed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..cost.memory import GIB
from ..cost.priced_by import sources_and_why
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import costing, holders_exchange, link_costs, memory_fit, tail_costs
from .exchange_roots import exchange_weights
from .pipeline import simulate_1f1b
from .pipeline_memory import memory_terms
from .vocab_padding import model_padded_vocab_size
from .shapes import boundary_depth
from .shared_uplinks import boundary_uplinks, to_row
from .staged_pieces import BoundarySides, boundary_staging
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
    samples = plan.samples_per_pipeline
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
    after_s: float             # the slowest stage's optimizer step (+ gather), + the gathers delaying the fill
    overhead_s: float
    stages: list               # per stage and group: the Estimate-style dict
    fits: bool
    fill_s: float = 0.0        # of after_s: the parameter gathers delaying the next fill (tail_costs)
    events: tuple | None = None   # its 1F1B's every operation (record=True; plan/timeline.py draws them)
    optimizer_s: float = 0.0      # the slowest stage's optimizer step: of after_s, what is not a gather

    @property
    def before_sync(self) -> float:
        return self.makespan + self.reduce_s

    @property
    def gathers_s(self) -> float:      # the parameter gathers its tail exposes: after_s less its optimizer step
        return self.after_s - self.optimizer_s


def _stages(model, inventory, shape: PipelineShape, cost_model) -> list[_Stage]:
    out = []
    n_pos = len(shape.positions)
    for q, pos in enumerate(shape.positions):
        layers = pos[0][1].stage_layers
        profs = [(idx, mesh, costing.stage_profile(model, inventory.cluster(mesh.cluster), mesh.tp, mesh.dp,
                                                   mesh.micro_batch_size, mesh.recompute, cost_model, mesh.settings))
                 for idx, mesh in pos]
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
    """(transfer time, latency part, overlapped depth or None: shapes.boundary_depth, flows) of one micro-batch
    step's activations from stage a to stage b (the gradients go back the same way); flows: the bytes leaving and
    entering each cluster, {(cluster, "out" | "in"): bytes} (shared_uplinks.boundary_uplinks)."""
    if a.position == b.position:        # inside a position: each group to its own next stage
        best = (0.0, 0.0)
        for idx, mesh, prof in a.groups:
            cl = inventory.cluster(mesh.cluster)
            link = cl.intra_node if mesh.num_devices <= cl.devices_per_node else cl.inter_node
            t = link_costs.boundary_transfer_time(model, prof, prof, link, True, mesh.dp * mesh.micro_batch_size)
            best = max(best, (t, min(link.latency_s, t)))
        return best[0], best[1], None, None
    per_link: dict = {}                 # cross-cluster link -> [bytes of this step, rank pairs]; same-cluster apart
    uplink: dict = {}                   # (cluster, "out" / "in") -> bytes of this step over all its links
    inside = []
    for s0, e0, ma, pa in _ranges(a.groups):
        for s1, e1, mb, pb in _ranges(b.groups):
            o = min(e0, e1) - max(s0, s1)
            if o <= 0:
                continue
            if ma.cluster == mb.cluster:
                link = inventory.cluster(ma.cluster).inter_node
                t = link_costs.boundary_transfer_time(model, pa, pb, link, True, o)
                inside.append((t, min(link.latency_s, t)))
            else:
                key = frozenset((ma.cluster, mb.cluster))
                nbytes = pa.cluster.device.dtype_bytes * o * model.seq_length * model.hidden_size
                pairs = link_costs.boundary_pairs([(s0, e0, ma.tp, ma.dp)], [(s1, e1, mb.tp, mb.dp)], model.seq_length)
                acc = per_link.setdefault(key, [0.0, 0])
                acc[0] += nbytes
                acc[1] += pairs
                for end in ((ma.cluster, "out"), (mb.cluster, "in")):
                    uplink[end] = uplink.get(end, 0.0) + nbytes
    times = list(inside)
    for key, (nbytes, pairs) in per_link.items():
        link = link_costs.link_between(inventory, *sorted(key))
        t = link.transfer_time(nbytes, pairs)
        times.append((t, min(link.latency_s, t)))
    # a cluster sending to (receiving from) several clusters at once: all of it crosses its uplink, where given
    for (name, _), nbytes in uplink.items():
        up = inventory.cluster(name).uplink_bytes_per_s
        if up:
            times.append((nbytes / up, 0.0))
    t, lat = max(times)
    return t, lat, boundary_depth([m for _, m, _ in a.groups], [m for _, m, _ in b.groups]), uplink


def price_pipeline(model: ModelSpec, inventory: Inventory, shape: PipelineShape, cost_model,
                   stages: list[_Stage] | None = None, record: bool = False) -> PipelineTiming:
    """One pipeline's 1F1B, memory and its own tail terms (`model`: the padded model of the whole plan; `stages`:
    _stages(model, inventory, shape, cost_model) when the caller already built them; record: keep the 1F1B's
    operations)."""
    if stages is None:
        stages = _stages(model, inventory, shape, cost_model)
    p = len(stages)
    m = shape.samples // shape.step
    fwd, bwd, per_group = [], [], []
    for st in stages:
        times = [prof.times(st.layers, st.first, st.last) for _, _, prof in st.groups]
        per_group.append(times)
        fwd.append(max(f for f, _ in times))
        bwd.append(max(b for _, b in times))
    links, latency, blocking, depth, flows, staged = [], [], [], [], [], []
    for a, b in zip(stages, stages[1:]):
        t, lat, d, flow = _boundary(model, inventory, a, b)
        links.append(t)
        latency.append(lat)
        blocking.append(d is None)
        depth.append(d or 0)
        flows.append(flow)
        # an overlapped boundary joins one mesh each side: the pieces it receives (plan/staged_pieces.py)
        pa, pb = a.groups[0][2], b.groups[0][2]
        staged.append(BoundarySides() if d is None else
                      boundary_staging(pa, pb, model.seq_length, pa.cluster.device.vendor == "cpu",
                                       pb.cluster.device.vendor == "cpu"))
    # a cluster at two of this pipeline's boundaries: its uplink carries both (plan/shared_uplinks.py)
    uplinks = boundary_uplinks(flows, lambda name: inventory.cluster(name).uplink_bytes_per_s)
    sim = simulate_1f1b(fwd, bwd, links, m, latency=latency, blocking=blocking, depth=depth, uplinks=uplinks,
                        record=record, with_busy=False)     # (the rows take m x (f + b), per group)
    in_flight, buffers = memory_terms(p, m, blocking, depth, staged)
    # the tail as tail_costs.iteration_tail prices it, over every group of every stage
    reduce_s = after_s = fill_s = opt_s = 0.0
    rows, fits = [], True
    overhead = 0.0
    for i, (st, (_, _, drain, before)) in enumerate(zip(stages, tail_costs.tail_windows(fwd, bwd, links, blocking))):
        stage_fill = 0.0        # a position's groups wait for their gathers side by side
        for (idx, mesh, prof), (f, b) in zip(st.groups, per_group[i]):
            r, g_fill, g_step = tail_costs.dp_exposed_times(model, prof, st.layers, st.first, st.last, f, b, drain,
                                                            before)
            g = g_fill + g_step
            o = tail_costs.optimizer_time(model, prof, st.layers, st.first, st.last)
            reduce_s, after_s, stage_fill = max(reduce_s, r), max(after_s, g_step + o), max(stage_fill, g_fill)
            opt_s = max(opt_s, o)
            overhead = max(overhead, cost_model.iteration_overhead_s(prof.cluster.device))
            mem = memory_fit.stage_memory(model, prof, st.layers, in_flight[i], st.first, st.last, buffers[i])["total"]
            fits &= mem <= prof.memory_cap
            row = {"stage": i, "mesh": idx, "position": st.position, "cluster": prof.cluster.name,
                   "device_type": prof.cluster.device.name, "devices": prof.tp * prof.dp, "tp": prof.tp,
                   "dp": prof.dp, "micro_batch_size": prof.micro_batch_size, "recompute": prof.recompute,
                   "layers": st.layers, "compute_s": round(m * (f + b), 6), "forward_s": round(f, 6),
                   "backward_s": round(b, 6), "busy_s": round(m * (f + b), 6),
                   "bubble_s": round(max(sim.makespan - m * (f + b), 0), 6), "memory_gib": round(mem / GIB, 2),
                   "memory_cap_gib": round(prof.memory_cap / GIB, 2),
                   "send_next_s": round(links[i], 6) if i < p - 1 else 0.0,
                   "dp_exposed_s": round(r + g, 6), "optimizer_s": round(o, 6), "dp_reduce_s": round(r, 6),
                   "gather_fill_s": round(g_fill, 6), "gather_step_s": round(g_step, 6), "_memory": mem}
            if i < p - 1:
                row.update({"send_next_latency_s": round(latency[i], 9),
                            "send_next_schedule": "blocking" if blocking[i] else "overlapped",
                            "send_next_depth": depth[i], **to_row(uplinks[i] if uplinks else None)})
            rows.append(row)
        fill_s += stage_fill
    return PipelineTiming(shape.samples, m, sim.makespan, reduce_s, after_s + fill_s, overhead, rows, fits, fill_s,
                          sim.events, opt_s)


# ---- gradients across holders ----------------------------------------------------------------------------------
def _holders(model, stage_lists: list, tie: bool) -> list:
    """Per parameter block: ((its parameters, those TP duplicates), its holders [(cluster, StageProfile, key)]),
    holders in plan order
    (key = (mesh index, pipeline stage): the first is the root of the exchange, as runtime/replica_sync.py orders
    them). Blocks: every transformer layer; the embedding (first stage of each pipeline); the final norm and
    output head (last stage of each pipeline). With `tie` the output head is the embedding's word table: its
    copies on the last stages are holders of that block (the runtime sums the tied copies with the others); a
    learned position table is a block of the first stages only."""
    L = model.num_layers
    by_layer: list = [[] for _ in range(L)]
    emb, head = [], []
    for stages in stage_lists:
        layer = 0
        for si, st in enumerate(stages):
            for idx, mesh, prof in st.groups:
                h = (mesh.cluster, prof, (idx, si))
                for l in range(layer, layer + st.layers):
                    by_layer[l].append(h)
                if st.first:
                    emb.append(h)
                if st.last:
                    head.append(h)
            layer += st.layers
    h = model.hidden_size
    pos = model.embedding_params - model.vocab_size * h        # a learned position table (0 with rope)
    norm = model.norm_params
    # (parameters, of which every TP rank keeps a copy: the norms, the row-parallel biases, a learned position table)
    blocks = [((model.layer_params, model.layer_replicated_params), hs) for hs in by_layer]
    if tie:     # the word table is tied; a learned position table stays on the first stages
        blocks += [((model.embedding_params - pos, 0), emb + [x for x in head if x not in emb]), ((pos, pos), emb),
                   ((norm, norm), head)]
    else:
        blocks += [((model.embedding_params, pos), emb), ((model.output_params, norm), head)]
    return [(n, sorted(hs, key=lambda x: x[2])) for n, hs in blocks]


# ---- the whole plan --------------------------------------------------------------------------------------------
@dataclass
class ShapesResult:
    iteration_time_s: float
    pipelines: list            # PipelineTiming per pipeline
    replica_sync_s: float
    grad_norm_s: float
    fits: bool
    extra: dict = field(default_factory=dict)
    result_check_s: float = 0.0


def price_shapes(model: ModelSpec, inventory: Inventory, shapes: list[PipelineShape], cost_model,
                 record: bool = False) -> ShapesResult:
    """The iteration of a plan's pipelines (`inventory` at the plan's precision; `model` unpadded; record: keep
    each pipeline's operations, PipelineTiming.events)."""
    meshes = [m for s in shapes for m in s.meshes]
    pm = _padded(model, shapes)
    stage_lists = [_stages(pm, inventory, s, cost_model) for s in shapes]
    timings = [price_pipeline(pm, inventory, s, cost_model, stages, record) for s, stages in zip(shapes, stage_lists)]
    # every shape, one pipeline of single meshes too, sums the tied copies in the holders' exchange with every
    # other shared parameter (runtime/replica_sync.py)
    holders = _holders(pm, stage_lists, model.tie_embeddings)
    sync = holders_exchange.holders_sync_time(inventory, holders)
    norm = tail_costs.grad_norm_time(inventory, meshes)
    check = tail_costs.result_check_time(inventory, meshes, grad_norm=norm)    # Megatron-LM's loop (the default engine)
    T = (max(t.before_sync for t in timings) + sync + check + norm
         + max(t.after_s for t in timings) + max(t.overhead_s for t in timings))
    return ShapesResult(T, timings, sync, norm, all(t.fits for t in timings),
                        extra={"holders": holders}, result_check_s=check)


def _padded(model: ModelSpec, shapes: list[PipelineShape]) -> ModelSpec:
    """The model with the vocabulary every rank of the plan builds (padded for every TP degree in it)."""
    return model.with_padded_vocab(model_padded_vocab_size(model, [m.tp for s in shapes for m in s.meshes]))


def holder_blocks(model: ModelSpec, inventory: Inventory, shapes: list[PipelineShape], cost_model) -> list:
    """The holders' exchange blocks of price_shapes (`extra["holders"]`) without pricing the pipelines (`model`
    unpadded; the blocks depend on the shapes and the stage profiles' settings, not on the cost model's times)."""
    pm = _padded(model, shapes)
    return _holders(pm, [_stages(pm, inventory, s, cost_model) for s in shapes], model.tie_embeddings)


def exchange_choices(inventory: Inventory, blocks) -> dict | None:
    """What the exchange of three or more holders would take with other roots' weights (explain): the chosen
    weights' seconds, the roots taking turns', and the fastest single root's (its cluster); None where no
    parameter has three or more holders."""
    holders = sorted({c for _, hs in blocks if len(hs) >= 3 for c, _, _ in hs})
    if not holders:
        return None
    price = lambda rule: holders_exchange.holders_sync_time(inventory, blocks, rule)     # noqa: E731
    def one_root(c):        # c's holders root everything (blocks not held on c keep the turns)
        return lambda inv, cl, own: tuple(int(x == c) for x in cl) if c in cl else (1,) * len(cl)
    one = {c: price(one_root(c)) for c in holders}
    root = min(one, key=lambda c: (one[c], c))
    return {"chosen_s": price(exchange_weights), "turns_s": price(lambda inv, cl, own: (1,) * len(cl)),
            "one_root": root, "one_root_s": one[root]}


def exchange_roots(inventory: Inventory, blocks) -> list[dict]:
    """Each distinct set of three or more holders of the plan's exchange (holders_sync_time's `blocks`) and the
    weights by which its holders root the elements (plan/exchange_roots.py), in plan order."""
    seen: dict = {}
    for _, hs in blocks:
        key = (tuple(c for c, _, _ in hs), tuple(holders_exchange.owner_ranks(p) for _, p, _ in hs))
        if len(hs) >= 3 and key not in seen:
            seen[key] = list(exchange_weights(inventory, *map(list, key)))
    out = []
    for (c, _), w in seen.items():
        if {"holders": list(c), "weights": w} not in out:
            out.append({"holders": list(c), "weights": w})
    return out


def shapes_estimate(model: ModelSpec, inventory: Inventory, shapes: list[PipelineShape], cost_model) -> Estimate:
    """price_shapes as simulate() reports it: an Estimate whose `stages` has one row per stage and replica group
    (keys `pipeline`, `position`), and `pipelines` / `replica_sync_s` besides."""
    res = price_shapes(model, inventory, shapes, cost_model)
    T = res.iteration_time_s
    gbs = sum(s.samples for s in shapes)
    tokens = gbs * model.seq_length
    world = sum(m.num_devices for s in shapes for m in s.meshes)
    flops = model.model_flops_per_token() * tokens
    rows, peak, priced = [], 0.0, []
    for p, (s, t) in enumerate(zip(shapes, res.pipelines)):
        for row in t.stages:
            mem = row.pop("_memory")
            row.update(pipeline=p, utilisation=round(row["busy_s"] / T, 4) if T > 0 else 0.0)
            rows.append((row, mem))
        for m in s.meshes:
            dev = inventory.cluster(m.cluster).device
            peak += dev.peak_tflops * 1e12 * m.num_devices
            priced.append((m.cluster, dev))
    sources, why = sources_and_why(priced, cost_model)
    est = Estimate(iteration_time_s=T, tokens_per_s=tokens / T, tflops_per_device=flops / T / world / 1e12,
                   mfu=flops / T / peak, memory_gib=[mem / GIB for _, mem in rows], fits=res.fits,
                   pipeline_s=max(t.makespan for t in res.pipelines),
                   # the DP time on the iteration's critical path: the reduction of the pipeline the exchange
                   # waits for, and the gathers of the pipeline whose tail ends last (after its step; its fill)
                   dp_exposed_s=(max(res.pipelines, key=lambda t: t.before_sync).reduce_s
                                 + max(res.pipelines, key=lambda t: t.after_s).gathers_s),
                   optimizer_s=max(t.optimizer_s for t in res.pipelines),
                   sync_s=res.replica_sync_s + res.result_check_s + res.grad_norm_s, grad_norm_s=res.grad_norm_s,
                   result_check_s=res.result_check_s, stages=[r for r, _ in rows], cost_model=sources,
                   cost_model_why=why)
    est.pipelines = [{"samples": t.samples, "micro_batches": t.micro_batches, "pipeline_s": round(t.makespan, 6),
                      "reduce_s": round(t.reduce_s, 6),
                      "dp_exposed_s": round(t.reduce_s + t.gathers_s, 6),
                      "before_sync_s": round(t.before_sync, 6)}
                     for t in res.pipelines]
    est.replica_sync_s = res.replica_sync_s
    est.exchange_roots = exchange_roots(inventory, res.extra["holders"])
    return est
