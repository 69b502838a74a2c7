"""`hetauto explain` for plans of several pipelines or with replica groups side by side (plan/multi_simulate.py).

The iteration of such a plan is the slowest pipeline (its 1F1B and exposed DP reduction), then the exchange that
sums the gradients across the mesh stages holding the same parameters, then the rest of the tail (global norm,
optimizer step, parameter gather, fixed overhead). The report splits it that way, names the largest part, gives
each pipeline's own bottleneck (a pipeline of single meshes is explained as a plan of its own), the memory
headroom of every stage and group, and (plan/sensitivity.py `sensitivity`, as for one pipeline) the throughput at
half and twice each link between the plan's clusters, uplink and the global batch (the same layout re-simulated;
the shares of the pipelines kept in proportion) and each cluster's size (re-planned, every shape searched).
"""
from __future__ import annotations

from . import explain as X
from . import sensitivity as S
from .exchange_roots import describe_roots
from .simulate import simulate

# (the exposed DP time is the job's: the reduction of the pipeline the exchange waits for and the parameter gathers
# of the one whose tail ends last, which may be another pipeline: multi_simulate.py)
PARTS = {"pipeline": "slowest pipeline (1F1B)", "dp_sync": "exposed DP reduction and gathers",
         "holders_sync": "gradients summed across holders", "rest": "norm, optimizer, overhead"}


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
    parts = {"pipeline": pipes[slow]["pipeline_s"], "dp_sync": est["dp_exposed_s"],
             "holders_sync": est["replica_sync_s"]}
    parts["rest"] = max(0.0, T - sum(parts.values()))
    worst = max(parts, key=parts.get)
    return {"parts": {k: {"seconds": v, "share": v / T if T > 0 else 0.0} for k, v in parts.items()},
            "bottleneck": worst, "slowest_pipeline": slow,
            "grad_norm_s": min(X._figure(est.get("grad_norm_s")), parts["rest"]),     # of the rest, the global norm
            "result_check_s": min(X._figure(est.get("result_check_s")), parts["rest"]),   # and the result check
            "text": f"{PARTS[worst]} ({parts[worst]:.3f} s, {parts[worst] / T:.0%} of the iteration)"
                    + (f", pipeline {slow}" if worst == "pipeline" else "")}


def shapes_report(plan, inventory, cost_model, factors=(0.5, 2.0), replan=None) -> dict:
    """explain's report of a plan of any shape but one pipeline of single meshes; `replan(inventory) -> tokens/s`
    (a search of every shape) re-plans the cluster sizes and the unused links (None: they are left out)."""
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
            # the pipeline trained alone: its parts are shares of its own iteration, not of the plan's
            why = X.describe_bottleneck(sub, X.breakdown(sub_est, sub.num_micro_batches), of="its own iteration")
        rows.append({**info, "clusters": sorted({plan.meshes[i].cluster for i in plan.pipeline_mesh_indices(p)}),
                     "meshes": plan.pipeline_mesh_indices(p), "bottleneck": why})
    sens = S.sensitivity(plan, inventory, cost_model, replan=replan, factors=factors)
    return {"shape": "pipelines", "model": plan.model.name, "devices": plan.world_size,
            "pipelines": rows, "global_batch_size": plan.global_batch_size, "iteration_time_s": T,
            "tokens_per_s": est["tokens_per_s"], "fits": est["fits"],
            "breakdown": {k: bd[k] for k in ("parts", "bottleneck", "slowest_pipeline", "grad_norm_s",
                                             "result_check_s")},
            "bottleneck": bd["text"],
            "exchange_roots": est.get("exchange_roots", []), "exchange_choices": _choices(plan, inventory, cost_model),
            "memory": X.memory_headroom(est), "runners_up": None, "sensitivity": sens,
            "blocking_boundaries": S.blocking_boundaries(plan, inventory, cost_model, est["tokens_per_s"])}


def alternatives(result, seconds: float, k: int) -> list[dict]:
    """The plans the whole search weighed against this one (shapes_result.ShapesResult): the best single pipeline
    of single meshes, each partition of the clusters into pipelines it searched and each cluster's pipeline with
    groups alongside, the fastest first (the infeasible last), at most `k`: {"what", "iteration_time_s" (None:
    none fits), "note", "vs_plan"}."""
    simple = result.simple
    rows = [{"what": "one pipeline of single meshes", "iteration_time_s": simple.iteration_time_s,
             "note": f"{len(simple.choices)} mesh{'' if len(simple.choices) == 1 else 'es'}"} if simple is not None
            else {"what": "one pipeline of single meshes", "iteration_time_s": None,
                  "note": "none follows the constraints"}]
    rows += [{"what": f"pipelines {what}" if "|" in what else what, "iteration_time_s": t, "note": why}
             for what, t, why in result.tried]
    for r in rows:
        # this plan's throughput against the alternative's (the same tokens per iteration), both to the 6 decimals
        # of every time in the report (`seconds` is the report's own: the plan itself among them compares as 0)
        t = r["iteration_time_s"]
        r["iteration_time_s"] = None if t is None else round(t, 6)
        r["vs_plan"] = None if t is None else r["iteration_time_s"] / seconds - 1
    rows.sort(key=lambda r: (r["iteration_time_s"] is None, r["iteration_time_s"] or 0.0))
    return rows[:k]


def format_shapes_report(rep: dict) -> str:
    n = len(rep["pipelines"])
    out = [f"plan: {rep['model']} on {rep['devices']} devices, {n} pipeline{'s' if n != 1 else ''}; predicted "
           f"{rep['iteration_time_s']:.3f} s per iteration, {rep['tokens_per_s']:,.0f} tokens/s"
           + (f", {rep['cost_per_million_tokens']:.4f} per 1M tokens" if rep.get("cost_per_million_tokens") is not None
              else "") + ("" if rep["fits"] else "  (DOES NOT FIT in memory)"), "", f"bottleneck: {rep['bottleneck']}"]
    bd = rep["breakdown"]
    for k, v in bd["parts"].items():
        out.append(f"  {PARTS[k]:<34} {v['seconds']:>10.3f} s {100 * v['share']:>6.1f}%"
                   + ("  <- bottleneck" if k == bd["bottleneck"] else "")
                   + (X.grad_norm_note(bd) if k == "rest" and bd.get("grad_norm_s") else ""))
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
    if rep.get("runners_up") is not None and rep.get("runners_up_requested", 1) > 0:
        out += ["", "alternatives the search weighed (predicted; throughput of this plan against each):"]
        for r in rep["runners_up"]:
            t = r["iteration_time_s"]
            out.append(f"  {r['what']:<44} " + (f"{t:.3f} s/iteration, this plan {100 * r['vs_plan']:+.1f}%"
                                                 if t is not None else "none feasible") + f"  ({r['note']})")
    return "\n".join(out)
