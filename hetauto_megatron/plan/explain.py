"""Why a plan is what it is: what limits its iteration, how much memory is left, what came second (`hetauto
explain`; what a faster link, a bigger cluster or another batch would buy is plan/sensitivity.py). Pure functions
over the simulator.

The iteration is cut into seven parts that add up to the predicted iteration time T:
    compute    the slowest stage's forward + backward over all micro-batches (its busy time);
    bubble     what 1F1B's fill and drain add with instant links: makespan(links = 0) - compute;
    link       what the links add on top: makespan - makespan(links = 0);
    dp_sync    the DP gradient/parameter synchronisation left after the pipeline (not hidden by compute);
    tail_sync  the job-wide synchronisation at the iteration's end: the global gradient norm's all-reduce and the
               holders' exchange of shared weights (a tied table) across meshes, whose cost is mostly the links'
               latency (not DP: a job of DP 1 has it too);
    optimizer  the optimizer step after it;
    overhead   the cost model's fixed per-iteration time (zeroing gradients, grad norm, logging, ...).
The first three are the pipeline's makespan; the last four its tail.
The bottleneck is the largest part. Each is priced by re-running the same event simulation with one thing
removed, so a part is exactly what the iteration would save without it.
"""
from __future__ import annotations

import dataclasses
import math

from .plan import Plan
from .simulate import _DEFAULT_COST, plan_choices, stage_makespan, stage_passes

PARTS = ("compute", "bubble", "link", "dp_sync", "tail_sync", "optimizer", "overhead")
PART_NAMES = {"compute": "compute of the slowest stage", "bubble": "pipeline bubble (fill and drain)",
              "link": "exposed link time", "dp_sync": "DP synchronisation",
              "tail_sync": "iteration-end sync across meshes",   # global norm, tied weights
              "optimizer": "optimizer step",
              "overhead": "fixed per-iteration overhead"}


def _is_figure(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _figure(value) -> float:
    """An optional figure of a stored estimate: 0 when absent or not a finite number."""
    return float(value) if _is_figure(value) else 0.0


def _usable_estimate(estimate) -> bool:
    """Whether a stored estimate (a plan file's `estimate`, informational and maybe edited by hand or written by
    an older hetauto) has every figure the breakdown re-simulates from, each a finite number."""
    stages = estimate.get("stages") if isinstance(estimate, dict) else None
    if not isinstance(stages, list) or not stages:
        return False
    if not (_is_figure(estimate.get("iteration_time_s")) and _is_figure(estimate.get("pipeline_s"))):
        return False
    keys = ("forward_s", "backward_s", "send_next_s", "busy_s")
    return all(isinstance(s, dict) and all(_is_figure(s.get(k)) for k in keys)
               and _is_figure(s.get("send_next_latency_s", 0.0))
               and isinstance(s.get("send_next_depth", 0), int) and not isinstance(s.get("send_next_depth", 0), bool)
               and s.get("send_next_depth", 0) >= 0 for s in stages)


# How many boundaries the bottleneck line simulates without (one simulation each)
MAX_BOUNDARIES_TRIED = 16


def breakdown(estimate: dict, num_micro_batches: int) -> dict | None:
    """The six parts of the iteration from a simulator estimate (`Estimate.to_dict()` or a plan file's
    `estimate` block); None when the estimate lacks the per-stage times (an older file)."""
    if not _usable_estimate(estimate):
        return None
    stages = estimate["stages"]
    m = num_micro_batches
    fwd, bwd = stage_passes(stages)     # as the engine runs them (DeepSpeed's with its all-gathers)
    links = [s["send_next_s"] for s in stages[:-1]]
    T = float(estimate["iteration_time_s"])
    makespan = float(estimate["pipeline_s"])
    free_links = stage_makespan(stages, m, [0.0] * len(links))
    busy = [m * (f + b) for f, b in zip(fwd, bwd)]
    slow = max(range(len(stages)), key=lambda i: busy[i])
    # The tail after the pipeline: the exposed DP sync (and the job-wide tied-table / grad-norm sync), the
    # optimizer step, and the cost model's fixed overhead, which is what remains of T.
    tail = max(0.0, T - makespan)
    per = {key: [_figure(s.get(key)) for s in stages]
           for key in ("dp_exposed_s", "optimizer_s", "dp_reduce_s", "gather_fill_s", "gather_step_s")}
    t_dp = max(range(len(stages)), key=per["dp_exposed_s"].__getitem__)
    t_opt = max(range(len(stages)), key=per["optimizer_s"].__getitem__)
    opt_s, dp_s = _figure(estimate.get("optimizer_s")), _figure(estimate.get("dp_exposed_s"))
    if all(k in s for s in stages for k in ("dp_reduce_s", "gather_fill_s", "gather_step_s", "optimizer_s")):
        # the tail as tail_costs.iteration_tail adds it up: the slowest reduction, the job-wide sync, then the
        # stage whose parameter gather after the step and step together take longest (its step is the optimizer
        # part, its gather the DP part's), and the gathers delaying the next fill; the largest step and the largest
        # DP exposure may be two stages' (ZeRO-1's gather after a short step), which took the fixed overhead's share
        t_opt = max(range(len(stages)), key=lambda i: per["gather_step_s"][i] + per["optimizer_s"][i])
        opt_s = per["optimizer_s"][t_opt]
        dp_s = max(per["dp_reduce_s"]) + sum(per["gather_fill_s"]) + per["gather_step_s"][t_opt]
    opt = min(opt_s, tail)
    dp = min(dp_s, tail - opt)
    sync = min(_figure(estimate.get("sync_s")), tail - opt - dp)
    parts = {"compute": busy[slow], "bubble": max(0.0, free_links - busy[slow]),
             "link": max(0.0, makespan - free_links), "dp_sync": dp, "tail_sync": sync, "optimizer": opt,
             "overhead": tail - opt - dp - sync}
    # Which boundary the exposed link time comes from: the one whose removal alone saves the most. Only the
    # boundaries between meshes are tried (one simulation each; inside a mesh the links are the fast ones).
    link_at, saved = None, 0.0
    link_set, set_saves = None, 0.0
    if parts["link"] > 1e-9 * T:
        between = [i for i in range(len(links)) if stages[i].get("mesh") != stages[i + 1].get("mesh")
                   or "mesh" not in stages[i]] or range(len(links))
        if len(between) > MAX_BOUNDARIES_TRIED:     # the slowest links (ties: the first): a pipeline of 200 stages
            # in one mesh took a simulation per boundary, 30 s for one summary at 2,000 micro-batches
            between = sorted(sorted(between, key=lambda i: -links[i])[:MAX_BOUNDARIES_TRIED])
        alone_saves = {}
        for i in between:
            alone = stage_makespan(stages, m, [0.0 if k == i else x for k, x in enumerate(links)])
            alone_saves[i] = makespan - alone
            if makespan - alone > saved:
                link_at, saved = i, makespan - alone
        # Where several slow boundaries bind together (each alone hides behind the others: two 25 Gbit/s links
        # in one pipeline), one boundary is not the bottleneck: the fewest boundaries, best alone first, whose
        # links made instant together save at least half of what all boundaries between meshes save.
        every = makespan - stage_makespan(stages, m, [0.0 if k in between else x for k, x in enumerate(links)])
        if link_at is not None and saved < 0.5 * every:
            chosen = []
            for i in sorted(alone_saves, key=lambda i: -alone_saves[i]):
                chosen.append(i)
                together = makespan - stage_makespan(stages, m, [0.0 if k in chosen else x
                                                                 for k, x in enumerate(links)])
                if together >= 0.5 * every:
                    break
            link_set, set_saves = sorted(chosen), together
    worst = max(PARTS, key=lambda k: parts[k])
    where = {"compute": slow, "bubble": None, "link": link_at, "dp_sync": t_dp, "tail_sync": None,
             "optimizer": t_opt, "overhead": None}[worst]
    return {"iteration_s": T, "parts": {k: {"seconds": v, "share": v / T if T > 0 else 0.0} for k, v in parts.items()},
            "bottleneck": worst, "stage": where if worst != "link" else None,
            "boundary": link_at if worst == "link" else None, "slowest_stage": slow, "link_boundary": link_at,
            "link_boundary_saves_s": saved,
            # several boundaries that bind together (None where the one above saves at least half alone)
            "link_boundaries": link_set, "link_boundaries_save_s": set_saves if link_set else None,
            # of tail_sync, the global norm's all-reduce and the result check's (the rest: the tied table's
            # exchange; 0 where an older estimate does not say)
            "grad_norm_s": min(_figure(estimate.get("grad_norm_s")), sync),
            "result_check_s": min(_figure(estimate.get("result_check_s")), sync)}


def grad_norm_note(bd: dict) -> str:
    """The note on the breakdown line that holds the global norm's all-reduce and the result check's (a breakdown's
    `grad_norm_s` and `result_check_s`; milliseconds: they are small)."""
    shown = lambda x: f"{1e3 * x:.3g} ms" if x < 1 else f"{x:.3f} s"    # noqa: E731
    check = bd.get("result_check_s") or 0.0
    return (f"  (of which the global gradient norm {shown(bd['grad_norm_s'])}"
            + (f", the result check {shown(check)}" if check else "") + ")")


def describe_bottleneck(plan: Plan, bd: dict | None, short: bool = False, of: str = "the iteration") -> str:
    """One sentence naming the bottleneck and where it sits (short: a few words, for tables); `of`: what its share
    is a share of."""
    if bd is None:
        return "-"
    k = bd["bottleneck"]
    share = bd["parts"][k]["share"]
    where = ""
    if k == "compute":
        s = bd["stage"]
        mi, _ = plan.stage_owner(s)
        where = f" (stage {s} on {plan.meshes[mi].cluster}, {plan.stage_layers[s]} layer{'s' if plan.stage_layers[s] != 1 else ''})"
    elif k == "link" and bd["boundary"] is not None:
        def named(b):
            a, c = plan.meshes[plan.stage_owner(b)[0]].cluster, plan.meshes[plan.stage_owner(b + 1)[0]].cluster
            return f"{b} -> {b + 1}, {a} -> {c}"
        if bd.get("link_boundaries"):    # several bind together: faster links on all of them, not one
            where = f" (boundaries stage {'; '.join(named(b) for b in bd['link_boundaries'])}: together)"
        else:
            where = f" (boundary stage {named(bd['boundary'])})"
    elif k in ("dp_sync", "optimizer") and bd["stage"] is not None:
        where = f" (stage {bd['stage']})"
    elif k == "bubble":
        where = f" ({plan.pipeline_parallel_size} stages over {plan.num_micro_batches} micro-batches)"
    if short:
        return f"{k.replace('_', ' ')} {share:.0%}{where}"
    return f"{PART_NAMES[k]}{where}: {share:.0%} of {of}"


def memory_headroom(estimate: dict) -> list[dict]:
    out = []
    for s in estimate.get("stages") or []:
        used, cap = s.get("memory_gib"), s.get("memory_cap_gib")
        if isinstance(used, (int, float)) and isinstance(cap, (int, float)) and cap > 0:
            out.append({"stage": s.get("stage"), "cluster": s.get("cluster"), "memory_gib": used,
                        "capacity_gib": cap, "headroom_gib": round(cap - used, 2),
                        "headroom_share": round((cap - used) / cap, 4)})
    return out


def cross_cluster_bytes(plan: Plan, inventory, cost_model=None) -> float:
    """Bytes that cross between clusters per iteration (`inventory` at the plan's precision), every plan shape:
    - at every boundary between two positions (plan/multi_simulate.py: each mesh and the meshes alongside it),
      each micro-batch step's activations of the samples whose next stage is on another cluster, and their
      gradients back, each in its sender's training precision (what link_costs prices; hetauto sends each byte
      across once);
    - the exchange that sums the gradients of parameters held on several clusters (the tied embedding table at
      both ends, the layers of other pipelines or of replica groups side by side), as runtime/replica_sync.py
      moves them (holders_exchange.holders_cross_cluster_bytes). The bytes do not depend on `cost_model`."""
    from .multi_simulate import holder_blocks, shapes_of
    from .holders_exchange import holders_cross_cluster_bytes
    per_sample = plan.model.seq_length * plan.model.hidden_size
    meshes = plan.meshes
    element = lambda i: inventory.cluster(meshes[i].cluster).device.dtype_bytes     # noqa: E731

    def ranges(position):       # each mesh's samples of a micro-batch step, replica after replica
        out, start = [], 0
        for i in position:
            out.append((i, start, start + meshes[i].dp * meshes[i].micro_batch_size))
            start = out[-1][2]
        return out
    total = 0.0
    for p in range(plan.num_pipelines):
        steps, positions = plan.pipeline_micro_batches(p), plan.positions(p)
        for a, b in zip(positions, positions[1:]):
            for i, s0, e0 in ranges(a):
                for j, s1, e1 in ranges(b):
                    both = min(e0, e1) - max(s0, s1)
                    if both > 0 and meshes[i].cluster != meshes[j].cluster:
                        total += steps * both * per_sample * (element(i) + element(j))
    holders = holder_blocks(plan.model, inventory, shapes_of(plan), cost_model or _DEFAULT_COST)
    return total + holders_cross_cluster_bytes(inventory, holders)


# ---- runners-up ---------------------------------------------------------------------------------------------
def differences(a, a_layers, b, b_layers) -> list[str]:
    """The decisions in which layout b (MeshChoice list, stage layers) differs from layout a."""
    out = []
    order_a, order_b = [m.cluster for m in a], [m.cluster for m in b]
    if order_a != order_b:
        out.append(f"clusters {' > '.join(order_a)} -> {' > '.join(order_b)}")
    sa, sb = a[0].dp * a[0].micro_batch_size, b[0].dp * b[0].micro_batch_size
    if sa != sb:
        out.append(f"samples per micro-batch step {sa} -> {sb}")
    mine = {m.cluster: m for m in a}
    for m in b:
        o = mine.get(m.cluster)
        if o is None:       # a cluster the plan leaves out: what it would run (else rows differing there look alike)
            out.append(f"{m.cluster}: TP {m.tp}, DP {m.dp}, micro-batch {m.micro_batch_size}, {m.num_stages} "
                       f"stage{'s' if m.num_stages != 1 else ''}, recompute {m.recompute}")
            continue
        changes = [f"{name} {getattr(o, key)} -> {getattr(m, key)}"
                   for key, name in (("tp", "TP"), ("dp", "DP"), ("micro_batch_size", "micro-batch"),
                                     ("num_stages", "stages"), ("recompute", "recompute"))
                   if getattr(o, key) != getattr(m, key) and not (key == "micro_batch_size" and sa != sb)]
        if o.setting_overrides != m.setting_overrides:
            changes.append("runtime settings")
        if changes:
            out.append(f"{m.cluster}: " + ", ".join(changes))
    if not out and list(a_layers) != list(b_layers):
        out.append(f"layer split {list(a_layers)} -> {list(b_layers)}")
    return out


def _as_run_by(choices, engine: str, precision: str) -> list:
    """Layout choices to compare as `engine` runs them (engines.as_run_by, recompute_as_run_by): the search ranks
    layouts with the settings asked for, a plan made for DeepSpeed's engine records those it runs (Plan.for_engine),
    and the two must compare equal where they run the same. `setting_overrides` here holds what differs from the
    engine's run of the defaults at the choice's TP (for comparing only: not a choice to price)."""
    from .engines import as_run_by, recompute_as_run_by
    from .settings import default_settings

    def deviations(c):
        run, base = (as_run_by(s, engine, precision).to_dict() for s in (c.settings, default_settings(c.tp)))
        return tuple(sorted((k, v) for k, v in run.items() if base[k] != v))
    return [dataclasses.replace(c, recompute=recompute_as_run_by(c.recompute, engine), setting_overrides=deviations(c))
            for c in choices]


def runners_up(plan: Plan, result, k: int = 5, inventory=None, constraints=None) -> list[dict]:
    """The k best layouts of a search (`SearchResult.ranked`, by time; under the cost objective by its value, the
    cost per token weighed by time, constraints.TIME_WEIGHT)
    other than the plan's own, each with its predicted throughput, its cost per 1M tokens where `inventory` prices
    every cluster it uses (else None), and what it decides differently (both as the plan's engine runs them)."""
    from .constraints import Constraints, cost_per_million_tokens, devices_by_cluster, objective_value
    mine = _as_run_by(plan_choices(plan), plan.engine, plan.precision)
    tokens = plan.global_batch_size * plan.model.seq_length

    def cost(t, choices):
        return cost_per_million_tokens(inventory, choices, t, tokens) if inventory is not None else None
    ranked = list(result.ranked)
    con = constraints or Constraints()
    if inventory is not None and (con.objective == "cost" or con.max_iteration_s is not None):
        # as the search ranked them: money weighed by time, any layout above --max-iteration-s after those within
        ranked.sort(key=lambda x: (objective_value(con, inventory, x[0], devices_by_cluster(x[1]))
                                   if con.objective != "cost" or cost(x[0], x[1]) is not None else math.inf, x[0]))
    out = []
    for t, choices, layers in ranked:
        if len(out) >= k:
            break
        choices = _as_run_by(choices, plan.engine, plan.precision)
        if choices == mine and list(layers) == plan.stage_layers:
            continue
        out.append({"iteration_time_s": t, "tokens_per_s": tokens / t,
                    "cost_per_million_tokens": cost(t, choices),
                    "clusters": [m.cluster for m in choices], "stage_layers": list(layers),
                    "differs": differences(mine, plan.stage_layers, choices, layers) or ["(same decisions)"]})
    return out


# ---- sensitivity --------------------------------------------------------------------------------------------
