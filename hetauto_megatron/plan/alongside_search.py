"""The second level of the search over the new plan shapes (plan/multi_search.py): mixed replica groups in a
stage (Sailor style). The devices a cluster leaves over, or a cluster no pipeline uses, may stand alongside a mesh
as more data-parallel replicas of its stages (same layers, their own TP, DP and micro-batch); the step's samples
are split across the groups in proportion to their speed (closed form, rounded to whole micro-batches), and a
group is kept when the priced plan is faster."""
from __future__ import annotations

import dataclasses

from ..errors import InfeasibleError, InputError
from . import costing
from .constraints import devices_by_cluster
from .layout_pricing import layout_to_plan
from .partition_bound import PartitionBound
from .plan import Plan
from .search import search
from .shapes_result import (ShapesResult, block_constraints, objective_bound, plan_score, progress,
                            within_budget)
from .engines import selective_runs
from .settings import job_settings
from .simulate import check_plan_links, simulate
from .space import tp_degrees
from .space_bounds import COMPUTE_SLACK
from .stop import out_of_time


def _split(S: int, groups: list) -> list | None:
    """Micro-batch per group of two so that dp_0 * mbs_0 + dp_1 * mbs_1 = S, the shares following the groups'
    speeds: a group takes mbs / v seconds per step (v: samples per second of one of its replicas), and the step
    takes the slower group's. The continuous optimum gives each group S * dp_g v_g / sum(dp v) samples; among the
    whole micro-batches that add up to S the split with the smallest max(mbs_g / v_g) is that optimum rounded
    (ties: more samples on the first group). groups: [(dp, v)] x 2. None when no split of whole micro-batches."""
    (dp0, v0), (dp1, v1) = groups
    best = None
    for m0 in range(1, S // dp0 + 1):
        rest = S - dp0 * m0
        if rest < dp1 or rest % dp1:
            continue
        key = (max(m0 / v0, rest // dp1 / v1), -m0)
        if best is None or key < best[0]:
            best = (key, [m0, rest // dp1])
    return None if best is None else best[1]


def _speed(model, inventory, cost, cluster, tp, dp, mbs, recompute) -> float:
    prof = costing.stage_profile(model, inventory.cluster(cluster), tp, dp, mbs, recompute, cost)
    return mbs / (prof.layer_fwd + prof.layer_bwd)


def groups_alongside(model, inventory, cost, con, best, out: ShapesResult, max_mb: int = 16, deadline=None):
    """Greedy, mesh by mesh: the best extra replica group from free devices, kept if the plan gains. The group
    takes part of the mesh's micro-batch step (the step stays), or the pipeline's step grows 2, 4 or 8 times (the
    other meshes of the pipeline scale their micro-batch alike) and the two groups share it by speed: a slow
    group needs a large step to take a small share of it. No micro-batch grows past `max_mb`
    (SearchConfig.max_micro_batch)."""
    inv = inventory.with_precision(best[2].precision)
    for _ in range(2):                                   # a second pass may use what the first left free
        plan = best[2]
        improved = False
        for idx, mesh in enumerate(plan.meshes):
            if out_of_time(deadline):      # --budget-s: the best plan so far (hundreds of meshes take seconds)
                return best
            if mesh.alongside or (idx + 1 < len(plan.meshes) and plan.meshes[idx + 1].alongside):
                continue
            p = mesh.pipeline
            mates = [i for i in plan.pipeline_mesh_indices(p) if i != idx]
            used = devices_by_cluster(plan.meshes)
            k, S = mesh.num_stages, mesh.samples_per_step
            v0 = _speed(model, inv, cost, mesh.cluster, mesh.tp, mesh.dp, mesh.micro_batch_size, mesh.recompute)
            # a group on another cluster exchanges the mesh's layers' gradients (at least 2 bytes per parameter)
            # with the mesh over the link between them, two holders in one phase, both directions at once: no
            # faster than that alone. With other pipelines holding them too (three or more holders) the exchange
            # may route around that link (plan/exchange_roots.py): no bound then
            grads = 2 * model.layer_params * sum(mesh.stage_layers) if plan.num_pipelines == 1 else 0.0
            job = job_settings(mesh.setting_overrides)   # (a group trains the mesh's job: its dropouts)
            for cl in inv.clusters:
                free = cl.num_devices - used.get(cl.name, 0)
                if cl.name in con.exclude_clusters or free < k or (
                        cl.name != mesh.cluster and inv.link(cl.name, mesh.cluster) is None):
                    continue
                if cl.name != mesh.cluster and objective_bound(
                        con, inv, grads / inv.link(cl.name, mesh.cluster).bytes_per_s,
                        {m.cluster for m in plan.meshes} | {cl.name}) >= best[0]:
                    continue
                for tp in tp_degrees(model, cl):
                    if con.tp_of(cl.name) not in (None, tp) or tp * k > free:
                        continue
                    most = free // (tp * k)
                    # all the free devices, or a power of two fewer replicas (a slow device type takes a few)
                    for dp in sorted({most} | {1 << j for j in range(most.bit_length()) if 1 << j < most}):
                        for scale in (1, 2, 4, 8):
                            step = S * scale
                            if plan.samples_per_pipeline[p] % step or (scale > 1 and any(
                                    plan.meshes[i].micro_batch_size * scale > max_mb for i in mates)):
                                continue
                            v1 = _speed(model, inv, cost, cl.name, tp, dp, max(1, step // (2 * dp)), "none")
                            mbs = _split(step, [(mesh.dp, v0), (dp, v1)])
                            if mbs is None or max(mbs) > max_mb or (con.micro_batch_size and set(mbs) != {
                                    con.micro_batch_size}):
                                continue
                            for rc in ("none", "selective", "full"):
                                if con.recompute_of(cl.name) not in (None, rc) or (
                                        rc == "selective" and not selective_runs(model)):
                                    continue
                                # (the rest of its settings at its own TP's defaults)
                                extra = dataclasses.replace(mesh, cluster=cl.name, device_type=cl.device.name,
                                                            tp=tp, dp=dp, micro_batch_size=mbs[1], recompute=rc,
                                                            setting_overrides=job, alongside=True,
                                                            boundary_schedule="blocking", boundary_depth=0)
                                main = dataclasses.replace(mesh, micro_batch_size=mbs[0])
                                cand = with_group(plan, idx, main, extra, mates, scale, inv)
                                if cand is None:
                                    break
                                out.alongside_tried += 1
                                est = simulate(cand, inventory, cost)
                                if not est.fits:
                                    continue                 # more recomputation may fit
                                sc = plan_score(con, inventory, cand, est.iteration_time_s)
                                if sc < best[0] - 1e-12:
                                    best = (sc, est.iteration_time_s, cand)
                                    improved = True
                                break
        if not improved:
            break
    return best


def mixed_starts(model, inventory, gbs, cost, cfg, con, usable, best, out: ShapesResult, deadline=None):
    """Sailor's shape: one cluster's pipeline with another cluster's devices as replica groups of its stages.
    Start from the best plan on each cluster alone, when a linked cluster could stand alongside it: the two
    groups would at least swap the model's gradients over the link between the two (one phase, both directions
    at once: plan/holders_exchange.py holders_sync_time), on top of the model's FLOPs at both clusters' peak; clusters
    where that bound cannot beat the best plan are skipped."""
    bound = PartitionBound(model, inventory, gbs)
    names = [c.name for c in inventory.clusters]
    for c in usable:
        if out_of_time(deadline):
            break
        partners = [d for d in usable if d != c and inventory.link(c, d) is not None
                    and objective_bound(con, inventory, COMPUTE_SLACK * bound.flops / (bound.rate[c] + bound.rate[d])
                                         + bound.grad_bytes / inventory.link(c, d).bytes_per_s, (c, d)) < best[0]]
        if not partners:
            continue
        progress(out, f"{c}'s pipeline with groups of {'+'.join(partners)} alongside")
        try:
            # (under --max-iteration-s the cluster alone may be slower than it: the groups alongside may bring
            # the plan under it)
            r = search(model, inventory, gbs, cost, dataclasses.replace(
                within_budget(cfg, deadline), constraints=block_constraints(con, [c], names)))
        except (InfeasibleError, InputError):
            continue
        out.levels_cut |= r.cut_by_budget
        out.pipelines_searched += 1
        start = layout_to_plan(model, gbs, r.choices, r.stage_layers, inventory, boundaries=r.boundaries)
        # a group is kept where the plan gains on the cluster alone (its score: above --max-iteration-s it is worth
        # less than any plan within it, so groups that bring it under are kept); from no score at all the first
        # group was kept however slow, and the row below named a plan slower than the cluster alone
        held = (plan_score(con, inventory, start, r.iteration_time_s), r.iteration_time_s, start)
        found = groups_alongside(model, inventory, cost, con, held, out, cfg.max_micro_batch, deadline)
        if found is not held and not all(u in {m.cluster for m in found[2].meshes} for u in con.use_clusters):
            found = held                 # --use-clusters: a cluster pinned in is missing
        if found is not held and found[0] < best[0] - 1e-12:
            best = found
        out.tried.append((f"{c} with groups alongside", found[1], f"partners {'+'.join(partners)}")
                         if found is not held else
                         (f"{c} alone", r.iteration_time_s, f"no group of {'+'.join(partners)} alongside gains"))
    return best


def with_group(plan: Plan, idx: int, main, extra, mates, scale: int, inventory) -> Plan | None:
    """The plan with `extra` alongside mesh `idx` (now `main`); the pipeline's other meshes (`mates`) scale their
    micro-batch by `scale`. None when the launches would not start on whole nodes (Plan.check_whole_nodes), when
    a cluster of the group has no link to a cluster at a neighbouring position (simulate.check_plan_links), or
    when no order of the two groups keeps every TP group inside a node: on one
    cluster the two share a launch, ranks in mesh order, so e.g. one TP 1 device before four TP 2 groups would put
    a TP group across two 8-device nodes, the other order not. Both orders are tried (the two hold the same
    stages, so their order changes nothing else)."""
    meshes = list(plan.meshes)
    for i in mates:
        if scale != 1:
            meshes[i] = dataclasses.replace(meshes[i], micro_batch_size=meshes[i].micro_batch_size * scale)
    # the boundaries around a position with several groups are blocking (plan/shapes.py)
    if idx > 0 and meshes[idx - 1].pipeline == main.pipeline:
        meshes[idx - 1] = dataclasses.replace(meshes[idx - 1], boundary_schedule="blocking", boundary_depth=0)
    main = dataclasses.replace(main, boundary_schedule="blocking", boundary_depth=0)
    orders = [(main, extra)]
    if extra.cluster == main.cluster:
        orders.append((dataclasses.replace(extra, alongside=False), dataclasses.replace(main, alongside=True)))
    for first, second in orders:
        try:
            cand = dataclasses.replace(plan, meshes=(*meshes[:idx], first, second, *meshes[idx + 1:]), estimate=None)
            cand.check_tp_inside_nodes(lambda c: inventory.cluster(c).devices_per_node)
            cand.check_whole_nodes(lambda c: (inventory.cluster(c).devices_per_node, inventory.cluster(c).nodes))
            check_plan_links(cand, inventory)     # the group's cluster sends to and receives from every neighbour
            return cand
        except InputError:
            continue
    return None
