"""Pricing a layout the search proposes (a list of `MeshChoice`, its layer split not yet known): `evaluate_layout`
solves the layer split (plan/split.py) within each stage's memory, chooses each cross-cluster boundary's warm-up
depth for the overlapped schedule (plan/overlap.py) and predicts the iteration time with the same model as
`simulate` (plan/simulate.py: the stage list, the 1F1B event simulation, the iteration tail), or with its closed
form (`exact=False`, the search's screening); `layout_to_plan` turns a priced layout into a `Plan`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..cost.memory import GIB
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import memory_fit, tail_costs
from .deepspeed_schedule import estimate_deepspeed
from .overlap import Priced, choose_depths
from .pipeline import estimate_1f1b
from .plan import Mesh, Plan
from .engines import DEFAULT_ENGINE, ENGINES
from .precision import DEFAULT_PRECISION
from .simulate import (MeshChoice, Pipeline, _finish, _iteration_overhead, _pipeline, deepspeed_passes,
                       num_micro_batches, padded_model)
from .split import split_layers


@dataclass
class LayoutResult:
    stage_layers: list[int] | None          # None: does not fit in memory
    iteration_time_s: float                 # inf when infeasible
    shortfall_gib: float = 0.0              # when infeasible: how much the worst stage misses (layers spread evenly)
    short_device: str = ""
    short_mesh: int = -1                    # when infeasible: the mesh of that stage
    boundaries: tuple | None = None         # per mesh, the boundary after it: None (blocking) or overlapped depth


SCHEDULES = ("blocking", "overlapped")


def evaluate_layout(model: ModelSpec, inventory: Inventory, choices: list[MeshChoice], gbs: int, cost_model,
                    *, exact: bool = True, schedule: str = "overlapped", depths=None,
                    engine: str = DEFAULT_ENGINE) -> LayoutResult:
    """Solve the layer split for `choices` and predict the iteration time (the search's objective).

    exact=False replaces the event simulation by the closed form (pipeline.estimate_1f1b): microseconds instead
    of milliseconds, used to screen candidates; the search re-ranks its best ones with exact=True.
    schedule="overlapped" overlaps every cross-cluster boundary and chooses its depth: no extra warm-up, or the
    link's round trip in micro-batches (2 x transfer / slowest stage, rounded up; halved until memory allows),
    whichever is faster; blocking when not even the overlapped boundary buffers fit. `depths` (per mesh: None
    or a depth) fixes the boundaries instead. engine="deepspeed": DeepSpeed's pipeline engine (every boundary
    blocking; exact: its TrainSchedule; closed form: `deepspeed_links`)."""
    m = num_micro_batches(choices, gbs)
    model = padded_model(model, choices)
    pipe = _pipeline(model, inventory, choices, cost_model, engine)
    n = len(choices)
    if ENGINES[engine].blocking_boundaries:
        return _evaluate(model, gbs, pipe, m, [None] * n, choices, cost_model, exact, inventory, engine=engine)[0]
    if depths is not None or schedule == "blocking":
        return _evaluate(model, gbs, pipe, m, list(depths) if depths is not None else [None] * n, choices,
                         cost_model, exact, inventory, engine=engine)[0]

    def price(depths, reuse) -> Priced:
        # exact: the split now, the event simulation when choose_depths needs its time (pending), so that a depth
        # that loses to a deeper one is simulated only until it is proven slower
        res, tail = _evaluate(model, gbs, pipe, m, depths, choices, cost_model, exact, inventory, reuse=reuse,
                              simulate=False, engine=engine)
        if res.stage_layers is None:
            return Priced(res.iteration_time_s, False, None, None, None, None, res)
        p = len(pipe.profs)
        fb = [prof.times(res.stage_layers[i], i == 0, i == p - 1) for i, prof in enumerate(pipe.profs)]
        fwd, bwd = [f for f, _ in fb], [b for _, b in fb]
        if not exact:
            return Priced(res.iteration_time_s, True, fwd, bwd, None, (res.stage_layers, tail), res)

        def simulated(above: float) -> Priced | None:
            est = _finish(model, gbs, pipe, res.stage_layers, m, depths, choices, cost_model, inventory, engine,
                          above=above)
            if est is None:
                return None
            out = LayoutResult(res.stage_layers, est.iteration_time_s, boundaries=tuple(depths))
            return Priced(out.iteration_time_s, True, fwd, bwd, None, (res.stage_layers, None), out)
        return Priced(math.nan, True, fwd, bwd, None, (res.stage_layers, None), None, simulated)

    return choose_depths(pipe.cross, pipe.owners, pipe.links, pipe.latency, m, n, price, pipe.uplinks).result


def _evaluate(model, gbs, pipe: Pipeline, m, depths, choices, cost_model, exact, inventory, reuse=None,
              engine: str = DEFAULT_ENGINE, simulate: bool = True):
    """(LayoutResult, its closed-form tail or None). reuse: (layers, tail) of the same layout under looser memory
    caps (a shallower overlapped depth): when those layers fit these caps they are this split too (the greedy
    split is optimal for the looser caps and feasible for these), and the tail, which depends on the layers
    and on which boundaries block (the same at every overlapped depth), is the same. simulate=False with exact:
    the split alone (its time NaN, for `_finish` to fill in)."""
    profs, owners = pipe.profs, pipe.owners
    p = len(profs)
    blocking, depth = pipe.boundary_schedule(depths)
    in_flight, buffers = pipe.memory_terms(m, depths)
    L = model.num_layers
    lo = [0 if i in (0, p - 1) else 1 for i in range(p)]
    caps, per, fixed = [], [], []
    for i, prof in enumerate(profs):
        first, last = i == 0, i == p - 1
        caps.append(memory_fit.max_layers_in_memory(model, prof, in_flight[i], first, last, buffers[i]))
        f0, b0 = prof.times(0, first, last)
        per.append(prof.layer_fwd + prof.layer_bwd)
        fixed.append(f0 + b0)
    tail = None
    if reuse is not None and reuse[0] is not None and all(x <= c for x, c in zip(reuse[0], caps)):
        layers, tail = reuse
    else:
        layers = split_layers(per, fixed, lo, caps, L) if min(caps) >= 0 else None
    if layers is None:
        # Report how far from fitting: spread layers by speed ignoring memory, find the worst overshoot.
        rough = split_layers(per, fixed, lo, [L] * p, L) or [L // p] * p
        worst, dev, mesh = 0.0, "", -1
        for i, prof in enumerate(profs):
            if rough[i] <= caps[i] and mesh >= 0:
                continue            # this stage fits its share: no need to price it
            need = memory_fit.stage_memory(model, prof, rough[i], in_flight[i], i == 0, i == p - 1,
                                        buffers[i])["total"]
            if need - prof.memory_cap > worst or mesh < 0:
                worst, mesh = need - prof.memory_cap, owners[i]
                dev = f"{prof.cluster.name} ({prof.cluster.device.name}, {prof.memory_cap / GIB:.0f} GiB): needs " \
                      f"{need / GIB:.1f} GiB"
        return LayoutResult(None, float("inf"), max(worst, 0.0) / GIB, dev, mesh), None
    if not exact:
        fwd, bwd = [], []
        for i, prof in enumerate(profs):
            f, b = prof.times(layers[i], i == 0, i == p - 1)
            fwd.append(f)
            bwd.append(b)
        if tail is None:
            tail = tail_costs.iteration_tail(model, inventory, choices, profs, layers, fwd, bwd, pipe.links,
                                             blocking, engine=engine)["tail_s"]
        if engine == "deepspeed":
            t = estimate_deepspeed(*deepspeed_passes(model, profs, fwd, bwd), pipe.links, m, pipe.uplinks,
                                   blocking=blocking, depth=depth)
        else:
            t = estimate_1f1b(fwd, bwd, pipe.links, m, latency=pipe.latency, blocking=blocking, depth=depth,
                              uplinks=pipe.uplinks)
        return (LayoutResult(layers, t + tail + _iteration_overhead(cost_model, profs), boundaries=tuple(depths)),
                tail)
    if not simulate:
        return LayoutResult(layers, math.nan, boundaries=tuple(depths)), None
    est = _finish(model, gbs, pipe, layers, m, depths, choices, cost_model, inventory, engine)
    return LayoutResult(layers, est.iteration_time_s, boundaries=tuple(depths)), None


def layout_to_plan(model: ModelSpec, gbs: int, choices: list[MeshChoice], stage_layers: list[int],
                   inventory: Inventory, estimate: dict | None = None, boundaries=None) -> Plan:
    """boundaries: per mesh, the boundary after it: None (blocking) or an overlapped depth (LayoutResult's)."""
    meshes, k = [], 0
    for i, c in enumerate(choices):
        d = None if boundaries is None else boundaries[i]
        meshes.append(Mesh(c.cluster, inventory.cluster(c.cluster).device.name, c.tp, c.dp, c.micro_batch_size,
                           c.recompute, tuple(stage_layers[k:k + c.num_stages]), c.setting_overrides,
                           boundary_schedule="blocking" if d is None else "overlapped", boundary_depth=d or 0))
        k += c.num_stages
    return Plan(model=model, global_batch_size=gbs, meshes=tuple(meshes), inventory=inventory.to_dict(),
                estimate=estimate, precision=inventory.precision or DEFAULT_PRECISION)
