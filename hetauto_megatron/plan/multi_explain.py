"""`hetauto explain` for plans of several pipelines or with replica groups side by side (plan/multi_simulate.py).

The iteration of such a plan is the slowest pipeline (its 1F1B and exposed DP reduction), then the exchange that
sums the gradients across the mesh stages holding the same parameters, then the rest of the tail (global norm,
optimizer step, parameter gather, fixed overhead). The report splits it that way, names the largest part, gives
each pipeline's own bottleneck (a pipeline of single meshes is explained as a plan of its own), the memory
headroom of every stage and group, and the throughput at half and twice each link between the plan's clusters
and the global batch (the same layout re-simulated; the shares of the pipelines kept in proportion).
"""
from __future__ import annotations

import dataclasses

from ..errors import InputError
from . import explain as X
from .batch_split import split_batch
from .exchange_roots import describe_roots
from .simulate import simulate

PARTS = {"pipeline": "slowest pipeline (1F1B)", "dp_sync": "its exposed DP reduction",
         "holders_sync": "gradients summed across holders", "rest": "norm, optimizer, overhead"}


def _with_batch(plan, gbs: int):
    samples = plan.pipeline_samples
    if samples:
        samples = tuple(split_batch(gbs, [plan.pipeline_step(p) for p in range(plan.num_pipelines)],
                                    [1 / n for n in samples]))
    return dataclasses.replace(plan, global_batch_size=gbs, pipeline_samples=samples, estimate=None)


def _choices(plan, inventory, cost_model) -> dict | None:
    """multi_simulate.exchange_choices for this plan's holders."""
    from .multi_simulate import exchange_choices, price_shapes, shapes_of
    return exchange_choices(inventory, price_shapes(plan.model, inventory, shapes_of(plan), cost_model).extra["holders"])


def shapes_breakdown(est: dict) -> dict:
    """The iteration of a plan of any shape (simulate's estimate, with `pipelines`) in the parts PARTS names:
    {"parts": {part: {"seconds", "share"}}, "bottleneck": the largest, "slowest_pipeline", "text": in words}."""
    T = est["iteration_time_s"]
    pipes = est["pipelines"]
    slow = max(range(len(pipes)), key=lambda p: pipes[p]["before_sync_s"])
    parts = {"pipeline": pipes[slow]["pipeline_s"], "dp_sync": pipes[slow]["dp_exposed_s"],
             "holders_sync": est["replica_sync_s"]}
    parts["rest"] = max(0.0, T - sum(parts.values()))
    worst = max(parts, key=parts.get)
    return {"parts": {k: {"seconds": v, "share": v / T if T > 0 else 0.0} for k, v in parts.items()},
            "bottleneck": worst, "slowest_pipeline": slow,
            "text": f"{PARTS[worst]} ({parts[worst]:.3f} s, {parts[worst] / T:.0%} of the iteration)"
                    + (f", pipeline {slow}" if worst in ("pipeline", "dp_sync") else "")}


def shapes_report(plan, inventory, cost_model, factors=(0.5, 2.0)) -> dict:
    inventory = inventory.with_precision(plan.precision)
    est = simulate(plan, inventory, cost_model).to_dict()
    T = est["iteration_time_s"]
    pipes = est["pipelines"]
    bd = shapes_breakdown(est)
    rows = []
    for p, info in enumerate(pipes):
        sub = plan.pipeline(p)
        why = None
        if sub.is_simple:
            sub_est = simulate(sub, inventory, cost_model).to_dict()
            why = X.describe_bottleneck(sub, X.breakdown(sub_est, sub.num_micro_batches))
        rows.append({**info, "clusters": sorted({plan.meshes[i].cluster for i in plan.pipeline_mesh_indices(p)}),
                     "meshes": plan.pipeline_mesh_indices(p), "bottleneck": why})
    tokens = plan.global_batch_size * plan.model.seq_length
    sens = []
    clusters = sorted({m.cluster for m in plan.meshes})
    for key in sorted((k for k in inventory.links if k <= set(clusters)), key=sorted):
        link = inventory.links[key]
        name = "-".join(sorted(key))
        row = {"what": f"link {name} bandwidth", "base": link.bandwidth_gbps, "method": "same layout", "cases": []}
        for f in factors:
            inv = dataclasses.replace(inventory, links={**inventory.links,
                                                        key: dataclasses.replace(link, bandwidth_gbps=link.bandwidth_gbps * f)})
            t = tokens / simulate(plan, inv, cost_model).iteration_time_s
            row["cases"].append({"factor": f, "tokens_per_s": t, "change": t / est["tokens_per_s"] - 1})
        sens.append(row)
    sens += X.uplink_rows(plan, inventory, lambda inv: tokens / simulate(plan, inv, cost_model).iteration_time_s,
                          est["tokens_per_s"], factors)
    row = {"what": "global batch", "base": plan.global_batch_size, "method": "same layout", "cases": []}
    for f in factors:
        gbs = int(plan.global_batch_size * f)
        try:
            other = _with_batch(plan, gbs)
            t = gbs * plan.model.seq_length / simulate(other, inventory, cost_model).iteration_time_s
            row["cases"].append({"factor": f, "tokens_per_s": t, "change": t / est["tokens_per_s"] - 1})
        except InputError as exc:
            row["cases"].append({"factor": f, "tokens_per_s": None, "change": None, "note": exc.reason})
    sens.append(row)
    return {"shape": "pipelines", "model": plan.model.name, "devices": plan.world_size,
            "pipelines": rows, "global_batch_size": plan.global_batch_size, "iteration_time_s": T,
            "tokens_per_s": est["tokens_per_s"], "fits": est["fits"],
            "breakdown": {k: bd[k] for k in ("parts", "bottleneck", "slowest_pipeline")}, "bottleneck": bd["text"],
            "exchange_roots": est.get("exchange_roots", []), "exchange_choices": _choices(plan, inventory, cost_model),
            "memory": X.memory_headroom(est), "runners_up": None, "sensitivity": sens}


def alternatives(result, seconds: float, k: int) -> list[dict]:
    """The plans the whole search weighed against this one (multi_search.ShapesResult): the best single pipeline
    of single meshes, each partition of the clusters into pipelines it searched and each cluster's pipeline with
    groups alongside, the fastest first (the infeasible last), at most `k`: {"what", "iteration_time_s" (None:
    none fits), "note", "vs_plan"}."""
    rows = [{"what": "one pipeline of single meshes", "iteration_time_s": result.simple.iteration_time_s,
             "note": f"{len(result.simple.choices)} mesh(es)"}]
    rows += [{"what": f"pipelines {what}" if "|" in what else what, "iteration_time_s": t, "note": why}
             for what, t, why in result.tried]
    for r in rows:
        # this plan's throughput against the alternative's (the same tokens per iteration)
        r["vs_plan"] = None if r["iteration_time_s"] is None else r["iteration_time_s"] / seconds - 1
    rows.sort(key=lambda r: (r["iteration_time_s"] is None, r["iteration_time_s"] or 0.0))
    return rows[:k]


def format_shapes_report(rep: dict) -> str:
    out = [f"plan: {rep['model']} on {rep['devices']} devices, {len(rep['pipelines'])} pipeline(s); predicted "
           f"{rep['iteration_time_s']:.3f} s per iteration, {rep['tokens_per_s']:,.0f} tokens/s"
           + ("" if rep["fits"] else "  (DOES NOT FIT in memory)"), "", f"bottleneck: {rep['bottleneck']}"]
    bd = rep["breakdown"]
    for k, v in bd["parts"].items():
        out.append(f"  {PARTS[k]:<34} {v['seconds']:>10.3f} s {100 * v['share']:>6.1f}%"
                   + ("  <- bottleneck" if k == bd["bottleneck"] else ""))
    if rep.get("exchange_roots"):
        out.append(describe_roots(rep["exchange_roots"]))
    ch = rep.get("exchange_choices")
    if ch:
        out.append(f"  the exchange takes {ch['chosen_s']:.3f} s with these shares; with the roots taking turns "
                   f"{ch['turns_s']:.3f} s, with {ch['one_root']} the one root {ch['one_root_s']:.3f} s")
    out += ["", "pipelines:"]
    for p, r in enumerate(rep["pipelines"]):
        out.append(f"  {p}: {', '.join(r['clusters'])}; {r['samples']} samples in {r['micro_batches']} micro-batch "
                   f"steps; 1F1B {r['pipeline_s']:.3f} s + DP {r['dp_exposed_s']:.3f} s"
                   + (f"; its own bottleneck: {r['bottleneck']}" if r["bottleneck"] else ""))
    out += ["", "memory headroom per stage and replica group (busiest device):"]
    for m in rep["memory"]:
        out.append(f"  stage {m['stage']:>3}  {str(m['cluster']):<14} {m['memory_gib']:>8.1f} of "
                   f"{m['capacity_gib']:.1f} GiB ({100 * m['headroom_share']:.0f}% free)")
    if rep.get("runners_up") is not None:
        out += ["", "alternatives the search weighed (predicted; throughput of this plan against each):"]
        for r in rep["runners_up"]:
            t = r["iteration_time_s"]
            out.append(f"  {r['what']:<44} " + (f"{t:.3f} s/iteration, this plan {100 * r['vs_plan']:+.1f}%"
                                                 if t is not None else "none feasible") + f"  ({r['note']})")
    out += ["", "sensitivity of throughput (the same layout re-simulated):"]
    for row in rep["sensitivity"]:
        cells = [f"x{c['factor']:g}: " + (f"{c['tokens_per_s']:,.0f} ({100 * c['change']:+.1f}%)"
                                          if c["tokens_per_s"] else c.get("note", "-")) for c in row["cases"]]
        out.append(f"  {row['what']:<36} base {row['base']:g}: " + ";  ".join(cells))
    return "\n".join(out)
