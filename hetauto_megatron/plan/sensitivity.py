"""What a faster link, a bigger cluster or another batch would buy a plan (`hetauto explain`'s sensitivity), and
what its overlapped boundaries are worth: each input at x0.5 and x2, priced on the plan as it is or re-planned
(a link the plan does not cross, a cluster's size), and a re-plan never reported worse than the plan itself where
the plan still runs. Pure functions over the simulator and the search."""
from __future__ import annotations

import dataclasses
import math

from ..errors import InfeasibleError, InputError
from ..spec.whatif import link_spelling
from .batch_split import split_batch
from .plan import Plan
from .simulate import check_plan_against_inventory, simulate


def _tokens(plan: Plan, inventory, cost_model) -> float:
    return simulate(plan, inventory, cost_model).tokens_per_s


def uplink_rows(plan: Plan, inventory, tokens, base: float, factors) -> list[dict]:
    """Sensitivity rows of the uplinks (`uplink_gbps`) of the clusters a plan of several clusters uses, its own
    layout re-simulated (`tokens(inventory) -> tokens/s`). An uplink caps each of its cluster's links and is
    shared by them (docs/inputs.md), so it may be what binds where a link's own row shows no change."""
    used = {m.cluster for m in plan.meshes}
    rows = []
    for cl in inventory.clusters:
        if len(used) < 2 or cl.name not in used or cl.uplink_gbps is None:
            continue
        row = {"what": f"cluster {cl.name} uplink", "key": f"cluster.{cl.name}.uplink_gbps", "base": cl.uplink_gbps,
               "method": "same layout", "base_tokens_per_s": base, "cases": []}
        for f in factors:
            inv = dataclasses.replace(inventory, clusters=tuple(
                dataclasses.replace(c, uplink_gbps=cl.uplink_gbps * f) if c is cl else c for c in inventory.clusters))
            row["cases"].append(_case(f, cl.uplink_gbps * f, tokens(inv), base))
        rows.append(row)
    return rows


def links_crossed(plan: Plan, inventory) -> list[tuple[frozenset, str]]:
    """(link key, name) of the inter-cluster links a plan's traffic crosses. One pipeline: each boundary between
    clusters, named in stage order (`a-b` for a -> b). Other shapes: every link between the plan's clusters, named
    in sorted order: the pipelines' boundaries and the gradient exchange across holders on different clusters
    cross them (a link only the exchange could take shows no change where it does not bind)."""
    if not plan.is_simple:
        clusters = {m.cluster for m in plan.meshes}
        return [(k, "-".join(sorted(k))) for k in sorted((k for k in inventory.links if k <= clusters), key=sorted)]
    used = []
    for a, b in zip(plan.meshes, plan.meshes[1:]):
        key = frozenset((a.cluster, b.cluster))
        if a.cluster != b.cluster and key in inventory.links and key not in [k for k, _ in used]:
            used.append((key, "-".join(m.cluster for m in plan.meshes if m.cluster in key)))
    return used


def _link_key(inventory, key: frozenset) -> str | None:
    """The --set key of a link's bandwidth that reads back as that link alone (spec/whatif.py link_spelling: with
    '-' in cluster names a joined pair can spell another pair); None where no spelling does."""
    spelled = link_spelling(inventory, key)
    return f"link.{spelled}.bandwidth_gbps" if spelled else None


def with_batch(plan: Plan, gbs: int) -> Plan:
    """The plan's layout at another global batch (InputError where its micro-batch steps cannot make it up); the
    pipelines of a plan of several keep their shares (in proportion, whole micro-batch steps each)."""
    samples = plan.pipeline_samples
    if samples:
        samples = tuple(split_batch(gbs, [plan.pipeline_step(p) for p in range(plan.num_pipelines)],
                                    [1 / n for n in samples]))
    return dataclasses.replace(plan, global_batch_size=gbs, pipeline_samples=samples, estimate=None)


def _link_at(inventory, key, factor: float):
    """The inventory with link `key` at `factor` times its bandwidth."""
    link = inventory.links[key]
    return dataclasses.replace(inventory, links={**inventory.links,
                                                 key: dataclasses.replace(link, bandwidth_gbps=link.bandwidth_gbps * factor)})


def _cluster_at(inventory, cluster, nodes: int):
    """The inventory with `cluster` (one of its clusters) at `nodes` nodes."""
    return dataclasses.replace(inventory, clusters=tuple(
        dataclasses.replace(c, nodes=nodes) if c is cluster else c for c in inventory.clusters))


def _excluded(plan: Plan) -> set:
    """The clusters the plan's search was told not to use (--exclude-clusters, as its estimate records it): what
    they are, or are linked by, cannot change a re-plan under the same constraints."""
    from .constraints import Constraints
    search = (plan.estimate or {}).get("search") if isinstance(plan.estimate, dict) else None
    try:
        return set(Constraints.from_record(search).exclude_clusters)
    except InputError:
        return set()


def _unused_links(plan: Plan, inventory) -> list:
    used, excluded = {k for k, _ in links_crossed(plan, inventory)}, _excluded(plan)
    return sorted((k for k in set(inventory.links) - used if not k & excluded), key=sorted)


def _replanned_clusters(plan: Plan, inventory) -> list:
    excluded = _excluded(plan)
    return [cl for cl in inventory.clusters if cl.name not in excluded]


def replanned_inventories(plan: Plan, inventory, factors=(0.5, 2.0)) -> list:
    """Every inventory `sensitivity` calls `replan` with, the unchanged one first: a caller can search them ahead
    (in parallel: each search is independent) and answer `replan` from the results."""
    out = [inventory] + [_link_at(inventory, key, max(factors)) for key in _unused_links(plan, inventory)]
    return out + [_cluster_at(inventory, cl, int(cl.nodes * f)) for cl in _replanned_clusters(plan, inventory)
                  for f in factors if int(cl.nodes * f) >= 1]


def sensitivity(plan: Plan, inventory, cost_model, *, replan=None, factors=(0.5, 2.0)) -> list[dict]:
    """Throughput when one input changes by each factor, for a plan of any shape.

    Links (the inter-cluster links the plan crosses: `links_crossed`), the uplinks of the clusters it joins (where
    the inventory gives them) and the global batch: the plan's own layout re-simulated.
    Cluster sizes change which layouts exist, so they are re-planned with `replan(inventory) -> tokens/s`
    (None skips them), and so are links the plan does not cross (at the larger factor only: a slower unused link
    changes nothing); their change is against `replan` of the unchanged inventory (`replanned_inventories` lists
    the inventories `replan` gets)."""
    base = _tokens(plan, inventory, cost_model)
    rows = []
    for key, name in links_crossed(plan, inventory):
        link = inventory.links[key]
        row = {"what": f"link {name} bandwidth", "key": _link_key(inventory, key), "base": link.bandwidth_gbps,
               "method": "same layout", "base_tokens_per_s": base, "cases": []}
        for f in factors:
            row["cases"].append(_case(f, link.bandwidth_gbps * f, _tokens(plan, _link_at(inventory, key, f),
                                                                          cost_model), base))
        rows.append(row)
    rows += uplink_rows(plan, inventory, lambda inv: _tokens(plan, inv, cost_model), base, factors)
    row = {"what": "global batch", "key": "--global-batch-size", "base": plan.global_batch_size,
           "method": "same layout", "base_tokens_per_s": base, "cases": []}
    for f in factors:
        gbs = int(plan.global_batch_size * f)
        try:
            other = with_batch(plan, gbs)
        except InputError as exc:
            row["cases"].append({"factor": f, "value": gbs, "tokens_per_s": None, "change": None,
                                 "note": exc.reason})
            continue
        row["cases"].append(_case(f, gbs, _tokens(other, inventory, cost_model), base))
    rows.append(row)
    if replan is not None:
        # the unchanged inventory's re-plan, never worse than the plan itself (the what-ifs compare with it)
        try:
            found = _outcome(replan(inventory))
        except InfeasibleError:
            found = None
        # (None, None) where neither the re-plan nor the plan fits the unchanged inventory: the what-ifs then
        # report their own throughput with no change to compare
        ref, ref_cost = (at_least_the_plan(plan, inventory, cost_model, found)[0] or (None, None))[:2]
        # A link the plan does not cross can only matter if a faster one brings other clusters in: re-planned at x2.
        for key in _unused_links(plan, inventory):
            link = inventory.links[key]
            name = "-".join(sorted(key))
            f = max(factors)
            rows.append({"what": f"link {name} bandwidth (unused)", "key": _link_key(inventory, key),
                         "base": link.bandwidth_gbps, "method": "re-planned", "base_tokens_per_s": ref,
                         "base_cost_per_million_tokens": ref_cost,
                         "cases": [_replanned(replan, _link_at(inventory, key, f), f, link.bandwidth_gbps * f, ref,
                                              plan, cost_model, ref_cost)]})
        for cl in _replanned_clusters(plan, inventory):       # (not the clusters the plan was told not to use)
            row = {"what": f"cluster {cl.name} size (nodes)", "key": f"cluster.{cl.name}.nodes", "base": cl.nodes,
                   "method": "re-planned", "base_tokens_per_s": ref, "base_cost_per_million_tokens": ref_cost,
                   "cases": []}
            for f in factors:
                nodes = int(cl.nodes * f)
                if nodes < 1:
                    row["cases"].append({"factor": f, "value": nodes, "tokens_per_s": None, "change": None,
                                         "note": "fewer than one node"})
                    continue
                row["cases"].append(_replanned(replan, _cluster_at(inventory, cl, nodes), f, nodes, ref, plan,
                                               cost_model, ref_cost))
            rows.append(row)
    return rows


def blocking_boundaries(plan: Plan, inventory, cost_model, base: float) -> dict | None:
    """What the plan's throughput (`base` tokens/s, its simulation's) owes to its overlapped cross-cluster
    boundaries: the same layout with every boundary blocking (the sender waits for each transfer, as Megatron's own
    P2P does and as simulators of such runtimes price it). None when no boundary of the plan is overlapped."""
    if not any(m.boundary_schedule == "overlapped" for m in plan.meshes):
        return None
    meshes = tuple(dataclasses.replace(m, boundary_schedule="blocking", boundary_depth=0) for m in plan.meshes)
    est = simulate(dataclasses.replace(plan, meshes=meshes, estimate=None), inventory, cost_model)
    names = []     # each overlapped boundary, from a mesh of one position to those of the next, in every pipeline
    for p in range(plan.num_pipelines):
        positions = plan.positions(p)
        for here, there in zip(positions, positions[1:]):
            names += [f"{plan.meshes[i].cluster} -> {plan.meshes[j].cluster}" for i in here for j in there
                      if plan.meshes[i].boundary_schedule == "overlapped"]
    return {"boundaries": list(dict.fromkeys(names)),
            "tokens_per_s": est.tokens_per_s, "change": est.tokens_per_s / base - 1.0 if base > 0 else None,
            "fits": est.fits}


def _outcome(found):
    """A re-plan's (tokens/s, cost per 1M tokens or None, devices used per cluster or None); `replan` may give
    tokens/s alone, or with its cost."""
    found = tuple(found) if isinstance(found, tuple) else (found,)
    return found + (None,) * (3 - len(found))


def _plan_runs_on(plan: Plan, inventory) -> bool:
    """Whether the plan's own layout still runs on a what-if inventory, as simulate and emit check it (its clusters'
    devices, and its launches on whole nodes: a halved cluster may keep the devices but not a node per launch)."""
    try:
        check_plan_against_inventory(plan, inventory)
    except InputError:
        return False
    return True


def at_least_the_plan(plan: Plan, inventory, cost_model, found):
    """A re-planned what-if is never worse than the plan itself where the plan still runs there (a bigger cluster,
    a faster link, a smaller cluster the plan does not use): a search that misses it would report its own noise as
    the what-if's effect. `found` is the re-plan's (tokens/s, cost per 1M tokens, devices used per cluster) or None
    (no feasible plan); returns the better of the two under the plan's objective, and whether it is the plan's own
    layout.

    Both are judged by the search's own objective (constraints.objective_value: under --objective cost the money
    weighed by time, a plan above --max-iteration-s worse than any within it, equal money told apart by time), so
    the report keeps what the search would have kept. Arithmetic of its own on the cost per token judged devices
    priced 0 equal whatever their speed (a re-plan twice as slow was kept) and a cheaper re-plan above the floor
    better than the plan within it. Where a cost the objective needs is unknown (a re-plan without its devices, a
    cluster without a price) both are judged by time."""
    from .constraints import Constraints, cost_per_million_tokens, devices_by_cluster, objective_value, \
        price_per_second
    if not _plan_runs_on(plan, inventory):
        return found, False
    con = Constraints.from_record((plan.estimate or {}).get("search") if isinstance(plan.estimate, dict) else None)
    est = simulate(dataclasses.replace(plan, estimate=None), inventory, cost_model)
    if not est.fits or (con.max_iteration_s is not None and est.iteration_time_s > con.max_iteration_s):
        return found, False
    tokens = plan.global_batch_size * plan.model.seq_length
    used = devices_by_cluster(plan.meshes)
    mine = (est.tokens_per_s, cost_per_million_tokens(inventory, plan.meshes, est.iteration_time_s, tokens), used)
    if found is None:
        return mine, True
    found = _outcome(found)
    if con.objective == "cost" and any(x[2] is None or price_per_second(inventory, x[2]) is None
                                       for x in (mine, found)):
        con = dataclasses.replace(con, objective="throughput")

    def value(outcome):
        seconds = tokens / outcome[0] if outcome[0] and outcome[0] > 0 else math.inf
        return objective_value(con, inventory, seconds, outcome[2] or {})
    better = value(mine) < value(found) * (1 - 1e-9)
    return (mine, True) if better else (found, False)


def _replanned(replan, inv, factor, value, ref, plan=None, cost_model=None, ref_cost=None) -> dict:
    try:
        found = _outcome(replan(inv))
    except InfeasibleError:
        found = None
    kept = False
    if plan is not None:
        found, kept = at_least_the_plan(plan, inv, cost_model, found)
    if found is None:
        return {"factor": factor, "value": value, "tokens_per_s": None, "change": None, "note": "no feasible plan"}
    case = _case(factor, value, found[0], ref)
    case["cost_per_million_tokens"] = found[1]
    case["cost_change"] = found[1] / ref_cost - 1.0 if found[1] is not None and ref_cost else None
    if kept:
        case["note"] = "the plan itself: the re-plan found nothing better"
    return case


def _case(factor, value, tokens, base) -> dict:
    return {"factor": factor, "value": value, "tokens_per_s": tokens,
            "change": tokens / base - 1.0 if base and math.isfinite(tokens) else None}
