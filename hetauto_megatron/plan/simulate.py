"""Predict a plan's iteration: stage times, 1F1B pipeline, DP synchronisation, optimizer step, memory.

`simulate(plan, inventory)` evaluates a finished plan (its layer split given). `evaluate_layout`
(plan/layout_pricing.py) is the search's evaluator: the same model, but it solves the layer split itself
(plan/split.py) for a list of mesh choices and, for the overlapped schedule, chooses each cross-cluster boundary's
warm-up depth. Both simulate every micro-batch (plan/pipeline.py); memory counts the extra in-flight micro-batches
and boundary buffers of overlapped boundaries.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..cost.analytic import AnalyticCostModel
from ..cost.memory import GIB
from ..cost.priced_by import sources_and_why
from ..errors import InputError
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import costing, link_costs, memory_fit, shared_uplinks, tail_costs
from .deepspeed_schedule import deepspeed_transfer_time, partition_gather_time, partitioned_passes, simulate_deepspeed
from .pipeline import simulate_1f1b
from .pipeline_memory import memory_terms
from .plan import Plan
from .engines import DEFAULT_ENGINE, ENGINES, recompute_as_run_by
from .settings import resolve_settings, settings_as_run
from .vocab_padding import model_padded_vocab_size
from .shapes import boundary_depth
from .staged_pieces import BoundarySides, boundary_staging

_DEFAULT_COST = AnalyticCostModel()


@dataclass(frozen=True, order=True)
class MeshChoice:
    """A mesh before its layer split is known: what the search decides per cluster."""
    cluster: str
    tp: int
    dp: int
    micro_batch_size: int
    recompute: str
    num_stages: int
    setting_overrides: tuple = ()     # the plan's overrides of the mesh's runtime settings (Mesh.setting_overrides)

    @property
    def settings(self):
        return resolve_settings(self.tp, dict(self.setting_overrides))

    @property
    def samples_per_step(self) -> int:
        """Samples one micro-batch step moves through this mesh (S: the same for every mesh of a pipeline)."""
        return self.dp * self.micro_batch_size


def num_micro_batches(layout, gbs: int) -> int:
    """Micro-batches per iteration of a layout (meshes of one pipeline, which all step dp x micro-batch samples)."""
    return gbs // layout[0].samples_per_step


@dataclass
class Estimate:
    iteration_time_s: float
    tokens_per_s: float
    tflops_per_device: float          # model FLOPs (no recompute) per device per second / 1e12
    mfu: float                        # model FLOPs utilisation against the devices' summed peak
    memory_gib: list[float]           # per stage, busiest device
    fits: bool
    pipeline_s: float                 # 1F1B makespan
    dp_exposed_s: float               # DP synchronisation not hidden behind compute
    optimizer_s: float
    sync_s: float = 0.0               # tied table's holders' exchange + result check + global-norm all-reduce
    grad_norm_s: float = 0.0          # of which the global-norm all-reduce (tail_costs.grad_norm_time)
    result_check_s: float = 0.0       # and the engine's result check over the world (tail_costs.result_check_time)
    stages: list[dict] = field(default_factory=list)
    # device type (priced_by.cluster_key per cluster where a type's clusters differ) -> "analytic" | "learned"
    cost_model: dict = field(default_factory=dict)
    cost_model_why: dict = field(default_factory=dict)   # device type -> why that model prices it (learned only)
    # several pipelines / mixed replica groups (plan/multi_simulate.py): per pipeline its samples and times, and
    # the exchange that sums gradients across the mesh stages holding the same parameters
    pipelines: list = field(default_factory=list)
    replica_sync_s: float = 0.0
    # each set of three or more holders and the weights by which they root the elements (plan/exchange_roots.py)
    exchange_roots: list = field(default_factory=list)

    def to_dict(self) -> dict:
        r = lambda x: round(x, 6) + 0.0      # + 0.0: no -0.0 from a -5e-9 cancellation in the JSON
        return {"iteration_time_s": r(self.iteration_time_s), "tokens_per_s": _rate(self.tokens_per_s, 1),
                "tflops_per_device": _rate(self.tflops_per_device, 2), "mfu": _rate(self.mfu, 4),
                "memory_gib": [round(x, 2) for x in self.memory_gib], "fits": self.fits,
                "pipeline_s": r(self.pipeline_s), "dp_exposed_s": r(self.dp_exposed_s),
                "optimizer_s": r(self.optimizer_s), "sync_s": r(self.sync_s),
                "grad_norm_s": r(self.grad_norm_s), "result_check_s": r(self.result_check_s), "stages": self.stages,
                "cost_model": self.cost_model, **({"cost_model_why": self.cost_model_why} if self.cost_model_why else {}),
                # present or absent together, as the plan's shape decides (docs/explain.md): [] with two holders
                **({"pipelines": self.pipelines, "replica_sync_s": r(self.replica_sync_s),
                    "exchange_roots": self.exchange_roots} if self.pipelines or self.exchange_roots else {})}


def _rate(x: float, decimals: int) -> float:
    """A rate to `decimals` places, or to 4 significant digits where those places would make it 0 (a plan of a
    link of 1e-6 Gbit/s trains 0.007 tokens/s: written 0.0 beside an iteration time that says otherwise)."""
    rounded = round(x, decimals)
    return rounded if rounded != 0 or x == 0 else float(f"{x:.4g}")


@dataclass(frozen=True)
class Pipeline:
    """The stage list of a layout (pipeline order) and what joins its stages."""
    profs: list                 # StageProfile per stage
    owners: list                # mesh index per stage
    links: list                 # per boundary: one micro-batch's transfer time, latency included
    latency: list               # per boundary: the part of it that does not occupy the link
    cross: list                 # per boundary: True where it joins two clusters (the only ones that may overlap)
    uplinks: tuple | None = None    # per boundary the shared uplinks its transfers cross (plan/shared_uplinks.py)
    staged: list | None = None      # per boundary the shares of a message each side receives in pieces if it
                                    # overlaps (plan/staged_pieces.py: CPU processes only); None: none

    def memory_terms(self, m: int, depths) -> tuple[list, list]:
        """pipeline_memory.memory_terms of this stage list with the per-mesh boundary depths (None: blocking)."""
        blocking, depth = self.boundary_schedule(depths)
        return memory_terms(len(self.profs), m, blocking, depth, self.staged)

    def boundary_schedule(self, depths) -> tuple[list, list]:
        """(blocking, depth) per boundary from the per-mesh boundary depths (None: blocking)."""
        blocking, depth = [], []
        for l, crosses in enumerate(self.cross):
            d = depths[self.owners[l]] if crosses and depths is not None else None
            blocking.append(d is None)
            depth.append(d or 0)
        return blocking, depth


def _pipeline(model, inventory, choices, cost_model, engine: str = DEFAULT_ENGINE) -> Pipeline:
    """Profiles and boundary links for the stage list of `choices` (pipeline order); each mesh's settings as
    `engine` runs them (settings.py `settings_as_run`), and so its recomputation (`recompute_as_run_by`)."""
    profs, owners = [], []
    for mi, c in enumerate(choices):
        cl = inventory.cluster(c.cluster)
        recompute = recompute_as_run_by(c.recompute, engine)
        prof = costing.stage_profile(model, cl, c.tp, c.dp, c.micro_batch_size, recompute, cost_model,
                                     settings_as_run(c.tp, c.setting_overrides, engine, cl.device.precision))
        profs += [prof] * c.num_stages
        owners += [mi] * c.num_stages
    p = len(profs)
    samples = choices[0].samples_per_step
    links, latency, cross = [], [], []
    for i in range(p - 1):
        if links and owners[i - 1] == owners[i] == owners[i + 1]:
            links.append(links[-1])    # inside a mesh every boundary costs the same
            latency.append(latency[-1])
            cross.append(False)
            continue
        a, b = choices[owners[i]], choices[owners[i + 1]]
        if a.cluster == b.cluster:
            cl = inventory.cluster(a.cluster)
            single_node = owners[i] == owners[i + 1] and a.tp * a.dp * a.num_stages <= cl.devices_per_node
            link = cl.intra_node if single_node else cl.inter_node
        else:
            link = inventory.link(a.cluster, b.cluster)
            if link is None:
                raise InputError(f"clusters {a.cluster} and {b.cluster} are adjacent in the pipeline but the "
                                 "inventory has no link between them", file=inventory.source, field="links",
                                 fix=f"add a links entry between: [{a.cluster}, {b.cluster}] or reorder the meshes")
        links.append(boundary_transfer(engine)(model, profs[i], profs[i + 1], link, a.cluster == b.cluster, samples))
        latency.append(min(link.latency_s, links[-1]))
        cross.append(a.cluster != b.cluster)
    staged = [boundary_staging(profs[i], profs[i + 1], model.seq_length, _on_cpu(profs[i]), _on_cpu(profs[i + 1]))
              if cross[i] else BoundarySides() for i in range(p - 1)]
    return Pipeline(profs, owners, links, latency, cross,
                    link_costs.pipeline_uplinks(model, inventory, profs, samples), staged)


def _on_cpu(prof) -> bool:
    return prof.cluster.device.vendor == "cpu"


def _iteration_overhead(cost_model, profs) -> float:
    """The fixed per-iteration time outside the pipeline (cost model's `iteration_overhead_s`): the slowest
    device type's, as every rank waits for the others at the iteration's end."""
    return max(cost_model.iteration_overhead_s(prof.cluster.device) for prof in profs)


def boundary_transfer(engine: str):
    """The pricing of one boundary's send under `engine` (the search's evaluator uses it too): DeepSpeed's
    engine sends its TP-partitioned slices (deepspeed_schedule.deepspeed_transfer_time)."""
    return deepspeed_transfer_time if engine == "deepspeed" else link_costs.boundary_transfer_time


def deepspeed_passes(model, profs, fwd, bwd) -> tuple[list[float], list[float]]:
    """The passes as DeepSpeed's engine runs them: with the all-gathers of its TP-partitioned transfers."""
    return partitioned_passes(fwd, bwd, [partition_gather_time(model, prof) for prof in profs])


def _finish(model, gbs, pipe: Pipeline, layers, m, depths, choices, cost_model, inventory,
            engine: str = "megatron", above: float = math.inf) -> Estimate | None:
    """The estimate of a layer split; None where the event simulation proves the iteration slower than `above`
    (pipeline.simulate_1f1b: a caller choosing between two depths needs no more of the slower one)."""
    profs, owners, links = pipe.profs, pipe.owners, pipe.links
    p = len(profs)
    blocking, depth = pipe.boundary_schedule(depths)
    in_flight, buffers = pipe.memory_terms(m, depths)
    fwd, bwd, mem = [], [], []
    for i, prof in enumerate(profs):
        first, last = i == 0, i == p - 1
        f, b = prof.times(layers[i], first, last)
        fwd.append(f)
        bwd.append(b)
        mem.append(memory_fit.stage_memory(model, prof, layers[i], in_flight[i], first, last, buffers[i])["total"])
    # DP sync exposed as each mesh's settings say, the tied table's holders' exchange, the engine's result check,
    # global norm, optimizer.
    norm = tail_costs.grad_norm_time(inventory, choices)
    check = tail_costs.result_check_time(inventory, choices, engine, norm)
    tail = tail_costs.iteration_tail(model, inventory, choices, profs, layers, fwd, bwd, links, blocking,
                                     tail_costs.iteration_sync_time(model, inventory, choices, profs, norm, engine))
    overhead = _iteration_overhead(cost_model, profs)
    if engine == "deepspeed":     # DeepSpeed's pipeline engine: its lock-step schedule, blocking sends
        makespan, busy = simulate_deepspeed(*deepspeed_passes(model, profs, fwd, bwd), links, m, pipe.uplinks)
    else:
        sim = simulate_1f1b(fwd, bwd, links, m, latency=pipe.latency, blocking=blocking, depth=depth,
                            uplinks=pipe.uplinks, above=above - tail["tail_s"] - overhead)
        if sim is None:
            return None
        makespan, busy = sim.makespan, sim.busy
    T = makespan + tail["tail_s"] + overhead
    tokens = gbs * model.seq_length
    world = sum(c.tp * c.dp * c.num_stages for c in choices)
    flops = model.model_flops_per_token() * tokens
    peak = sum(prof.cluster.device.peak_tflops * 1e12 * prof.tp * prof.dp for prof in profs)
    fits = all(mm <= prof.memory_cap for mm, prof in zip(mem, profs))
    stages = []
    for i, prof in enumerate(profs):
        stages.append({
            "stage": i, "mesh": owners[i], "cluster": prof.cluster.name, "device_type": prof.cluster.device.name,
            "devices": prof.tp * prof.dp, "tp": prof.tp, "dp": prof.dp, "micro_batch_size": prof.micro_batch_size,
            "recompute": prof.recompute, "layers": layers[i], "compute_s": round(m * (fwd[i] + bwd[i]), 6),
            "forward_s": round(fwd[i], 6),
            "backward_s": round(bwd[i], 6), "busy_s": round(busy[i], 6), "bubble_s": round(max(makespan - busy[i], 0), 6),
            "memory_gib": round(mem[i] / GIB, 2), "memory_cap_gib": round(prof.memory_cap / GIB, 2),
            "utilisation": round(busy[i] / T, 4) if T > 0 else 0.0,
            "send_next_s": round(links[i], 6) if i < p - 1 else 0.0,
            "dp_exposed_s": round(tail["stage_dp_exposed_s"][i], 6),
            "optimizer_s": round(tail["stage_optimizer_s"][i], 6),
            "dp_reduce_s": round(tail["stage_dp_reduce_s"][i], 6),
            "gather_fill_s": round(tail["stage_gather_fill_s"][i], 6),
            "gather_step_s": round(tail["stage_gather_step_s"][i], 6),
        })
        if engine == "deepspeed":   # its passes' all-gathers and its schedule (stage_makespan re-runs it)
            stages[-1].update({"engine": engine, "partition_gather_s": round(partition_gather_time(model, prof), 9)})
        if i < p - 1:   # the boundary to the next stage, as simulated (stage_makespan re-runs it)
            stages[-1].update({"send_next_latency_s": round(pipe.latency[i], 9),
                               "send_next_schedule": "blocking" if blocking[i] else "overlapped",
                               "send_next_depth": depth[i]})
            stages[-1].update(shared_uplinks.to_row(pipe.uplinks[i] if pipe.uplinks else None))
    sources, why = sources_and_why([(prof.cluster.name, prof.cluster.device) for prof in profs], cost_model)
    return Estimate(iteration_time_s=T, tokens_per_s=tokens / T, tflops_per_device=flops / T / world / 1e12,
                    mfu=flops / T / peak, memory_gib=[x / GIB for x in mem], fits=fits, pipeline_s=makespan,
                    dp_exposed_s=tail["dp_exposed_s"], optimizer_s=tail["optimizer_s"], sync_s=tail["sync_s"],
                    grad_norm_s=norm, result_check_s=check, stages=stages, cost_model=sources, cost_model_why=why)


def stage_schedule(stages: list[dict], links: list | None = None) -> dict:
    """simulate_1f1b's boundary keywords (latency, blocking, depth, uplinks) from an estimate's `stages`
    (Estimate.stages / a plan file's estimate): the boundaries as simulated, blocking when an older estimate does
    not say; a link given as 0 (priced away) crosses no uplink."""
    links = [s["send_next_s"] for s in stages[:-1]] if links is None else links
    blocking = [s.get("send_next_schedule", "blocking") == "blocking" for s in stages[:-1]]
    return {"latency": [min(s.get("send_next_latency_s", 0.0), x) for s, x in zip(stages, links)],
            "blocking": blocking,
            "depth": [0 if b else int(s.get("send_next_depth", 0)) for s, b in zip(stages, blocking)],
            "uplinks": shared_uplinks.without_links(shared_uplinks.from_rows(stages), links)}


def stage_passes(stages: list[dict]) -> tuple[list[float], list[float]]:
    """(forward, backward) per stage of an estimate's `stages` as their engine runs them: under DeepSpeed's, with
    the all-gathers of its TP-partitioned transfers (rows it priced say so: "engine", "partition_gather_s")."""
    fwd = [s["forward_s"] for s in stages]
    bwd = [s["backward_s"] for s in stages]
    if stages and stages[0].get("engine") == "deepspeed":
        return partitioned_passes(fwd, bwd, [float(s.get("partition_gather_s", 0.0)) for s in stages])
    return fwd, bwd


def stage_makespan(stages: list[dict], m: int, links: list | None = None) -> float:
    """The pipeline's makespan of an estimate's `stages` as their engine schedules it (Megatron's 1F1B, or
    DeepSpeed's TrainSchedule where the rows say so), optionally with other link times (e.g. 0 to price the links
    away); boundaries keep their simulated schedule."""
    fwd, bwd = stage_passes(stages)
    links = [s["send_next_s"] for s in stages[:-1]] if links is None else list(links)
    schedule = stage_schedule(stages, links)
    if stages and stages[0].get("engine") == "deepspeed":
        return simulate_deepspeed(fwd, bwd, links, m, schedule["uplinks"])[0]
    return simulate_1f1b(fwd, bwd, links, m, **schedule, with_busy=False).makespan


def plan_choices(plan: Plan) -> list[MeshChoice]:
    return [MeshChoice(x.cluster, x.tp, x.dp, x.micro_batch_size, x.recompute, x.num_stages, x.setting_overrides)
            for x in plan.meshes]


def padded_model(model: ModelSpec, choices) -> ModelSpec:
    """The model as it runs: its vocabulary padded once for every mesh's TP (plan.vocab_padding.padded_vocab_size)."""
    return model.with_padded_vocab(model_padded_vocab_size(model, [c.tp for c in choices]))


def check_plan_against_inventory(plan: Plan, inventory: Inventory) -> None:
    """A plan may only use clusters the inventory has, with the device type, node size and count it has: its
    launches start on whole nodes, no more than the cluster has, as `hetauto emit` checks them (Plan.check_whole_nodes;
    `hetauto dryrun` accepted a plan of two pipelines on one single-node cluster that emit refused)."""
    check_plan_clusters(plan, inventory)
    used: dict[str, int] = {}
    for i, mesh in enumerate(plan.meshes):
        cl = inventory.cluster(mesh.cluster)
        if cl.device.name != mesh.device_type:
            raise InputError(f"mesh on cluster {mesh.cluster} says device_type {mesh.device_type} but the inventory "
                             f"has {cl.device.name} there", field=f"meshes[{i}].device_type",
                             fix=f"set device_type: {cl.device.name}")
        used[mesh.cluster] = used.get(mesh.cluster, 0) + mesh.num_devices
    plan.check_tp_inside_nodes(lambda c: inventory.cluster(c).devices_per_node)
    for name, n in used.items():
        have = inventory.cluster(name).num_devices
        if n > have:
            raise InputError(f"the plan uses {n} devices of cluster {name}, which has {have}", field="meshes",
                             fix="reduce tp, dp or the number of stages on that cluster")
    plan.check_whole_nodes(lambda c: (inventory.cluster(c).devices_per_node, inventory.cluster(c).nodes))
    check_plan_links(plan, inventory)


def check_plan_clusters(plan: Plan, inventory: Inventory) -> None:
    """Every mesh's cluster is one the inventory has (before its links are checked: a missing link to a cluster
    the inventory lacks is the mesh's cluster at fault, and "add a links entry" to it failed next)."""
    names = [c.name for c in inventory.clusters]
    for i, mesh in enumerate(plan.meshes):
        if mesh.cluster not in names:
            which = ("the plan's inventory" if inventory.stored_in_plan else
                     f"the inventory {inventory.source}" if inventory.source else "the inventory")
            raise InputError(f"names cluster {mesh.cluster!r}, which {which} does not have",
                             field=f"meshes[{i}].cluster", fix=f"use one of: {', '.join(names)}")


def check_plan_links(plan: Plan, inventory: Inventory) -> None:
    """A link in the inventory between every two clusters next to each other in a pipeline (checked up front:
    explain re-planned its what-ifs before the simulation found one missing)."""
    for p in range(plan.num_pipelines):
        positions = plan.positions(p)
        for here, there in zip(positions, positions[1:]):
            for a, b in sorted({(plan.meshes[i].cluster, plan.meshes[j].cluster) for i in here for j in there}):
                if a != b and inventory.link(a, b) is None:
                    raise InputError(f"clusters {a} and {b} are next to each other in pipeline {p}, but the "
                                     "inventory has no link between them", file=inventory.source, field="links",
                                     fix=f"add a links entry between: [{a}, {b}], or re-plan")


def plan_boundaries(plan: Plan) -> list:
    """Per mesh of a plan of one pipeline of single meshes, the boundary after it: None (blocking) or the
    overlapped depth (shapes.boundary_depth)."""
    m = plan.meshes
    return [boundary_depth([a], [b]) for a, b in zip(m, m[1:])] + [None]


def tail_sync_terms(plan: Plan, priced: dict, engine: str):
    """(the inventory priced on, the holders' blocks for holders_exchange.holders_sync_steps, the result check's seconds,
    the global norm's seconds) of a plan of one pipeline of single meshes: the terms its `sync_s` sums
    (tail_costs.iteration_sync_time: a tied table held by the first and the last stage, none otherwise), as simulate
    prices them, from what it priced them with (`simulate(..., priced=)`)."""
    inventory, model, profs = priced["inventory"], priced["model"], priced["pipe"].profs
    choices = plan_choices(plan)
    norm = tail_costs.grad_norm_time(inventory, choices)
    return (inventory, tail_costs.tied_table_blocks(model, choices, profs[0], profs[-1]),
            tail_costs.result_check_time(inventory, choices, engine, norm), norm)


def simulate(plan: Plan, inventory: Inventory, cost_model=None, engine: str | None = None, *,
             priced: dict | None = None) -> Estimate:
    """The plan's iteration as `engine` runs its pipeline: "megatron" (hetauto's runtime and Megatron-LM: 1F1B,
    plan/pipeline.py) or "deepspeed" (DeepSpeed's pipeline engine, the configs `hetauto emit deepspeed` writes:
    its lock-step TrainSchedule, plan/deepspeed_schedule.py; one pipeline of single meshes, every boundary
    blocking; the DP reduction as that engine runs it, engines.py ENGINES). Every other term is the same. None: the
    engine the plan was made for (`Plan.engine`), so every command prices a plan as it runs. `priced`: a simple
    plan's padded model, pipeline and inventory (at the plan's precision) as priced go in it ("model", "pipe",
    "inventory"), for a caller that replays the pipeline (plan/timeline.py) without building it again."""
    engine = engine or plan.engine
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: one of {tuple(ENGINES)}")
    cost_model = cost_model or _DEFAULT_COST
    check_plan_against_inventory(plan, inventory)
    inventory = inventory.with_precision(plan.precision)   # the plan's precision prices every device
    if not plan.is_simple:     # several pipelines, or mixed replica groups in a stage
        if engine != "megatron":
            raise ValueError("only a plan of one pipeline of single meshes runs on DeepSpeed's pipeline engine")
        from .multi_simulate import shapes_estimate, shapes_of
        return shapes_estimate(plan.model, inventory, shapes_of(plan), cost_model)
    choices = plan_choices(plan)
    model = padded_model(plan.model, choices)
    pipe = _pipeline(model, inventory, choices, cost_model, engine)
    if priced is not None:
        priced.update(model=model, pipe=pipe, inventory=inventory)
    return _finish(model, plan.global_batch_size, pipe, plan.stage_layers, plan.num_micro_batches,
                   plan_boundaries(plan) if engine == "megatron" else None, choices, cost_model, inventory, engine)
