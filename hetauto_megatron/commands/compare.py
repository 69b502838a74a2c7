"""`hetauto compare`: several plans side by side, the rows where they differ marked."""
from __future__ import annotations

import json
import math
import sys

from ..outputs import json_text
from ..spec._fields import MAX_FIGURE
from .explain import add_plan_input_args

DESCRIPTION = """\
Put plans side by side: predicted iteration time, tokens/s, tokens/s per device, model TFLOP/s per
device, the peak memory of the busiest device against its capacity, the clusters and devices used, the
pipeline shape, the bytes that cross between clusters per iteration (activations forward and their
gradients back, every micro-batch, and the gradients of parameters held on several clusters: a tied embedding
table, the layers of other pipelines or of replica groups side by side), the bottleneck, and the cost per
million tokens when prices are known. Every plan shape: several pipelines, replica groups side by side.

Every plan is simulated afresh with the current cost model, on the inventory stored in it (or --inventory
for all of them, with --set what-ifs applied). Rows where the plans differ are marked with '*', the best
value of a numeric row with '<'.

Prices are per device-hour, per cluster: a cluster's price_per_device_hour in the inventory (docs/inputs.md),
or --price NAME=PRICE (repeatable, wins). Only the devices a plan uses are counted.

exit codes: 0 ok, 2 invalid input."""

EPILOG = """\
examples:
  hetauto plan --model llama2-70b --inventory examples/llama/inventory-2clusters.yaml -o a.yaml
  hetauto plan --model llama2-70b --inventory examples/llama/inventory-2clusters.yaml \\
      --set link.h800-ascend.bandwidth_gbps=100 -o b.yaml
  hetauto compare a.yaml b.yaml --price h800=2.5 --price ascend=1.2
  hetauto compare a.yaml b.yaml --inventory inv.yaml --json"""


def add_arguments(parser) -> None:
    parser.add_argument("plans", nargs="+", metavar="PLAN", help="plan files (YAML or JSON)")
    add_plan_input_args(parser)
    parser.add_argument("--price", action="append", default=[], metavar="CLUSTER=PRICE",
                        help="price of one device-hour on a cluster, any currency (repeatable; overrides the "
                             "inventory's price_per_device_hour)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _prices(args, inventories) -> dict:
    """--price NAME=PRICE as {cluster: price}: each a number, each naming a cluster of at least one plan's inventory
    (plans of different inventories are compared; each counts only the clusters it uses). An error here is the
    option's, not a plan file's."""
    from ..errors import InputError
    from ..plan.constraints import parse_pins
    names = sorted({c.name for inv in inventories for c in inv.clusters})
    prices = {}
    for name, value in parse_pins(args.price, "--price", "h800=2.5"):
        try:
            ok = 0 <= float(value) <= MAX_FIGURE      # NaN fails too; a huge one made the cost inf (bad JSON)
        except ValueError:
            ok = False
        if not ok:
            raise InputError(f"{name}={value}: the price must be a number from 0 to {MAX_FIGURE:g}", field="--price",
                             fix=f"write e.g. --price {name}=2.5")
        if name not in names:
            raise InputError(f"no plan's inventory has a cluster {name!r}", field="--price",
                             fix=f"price one of: {', '.join(names)}")
        prices[name] = float(value)
    return prices


def _priced(inventory, prices: dict):
    """The inventory with the --price prices of its clusters applied (they win over its price_per_device_hour)."""
    import dataclasses
    clusters = [dataclasses.replace(c, price_per_device_hour=prices.get(c.name, c.price_per_device_hour))
                for c in inventory.clusters]
    return dataclasses.replace(inventory, clusters=clusters)


def _pipelines(plan) -> str:
    """'4 stages x 32 micro-batches', one such part per pipeline of a plan of several."""
    from ..emit.summary import count_noun
    several = plan.num_pipelines > 1
    parts = []
    for p in range(plan.num_pipelines):
        stages = plan.pipeline_stages(p)
        m = plan.pipeline_micro_batches(p)
        parts.append(f"{'P%d: ' % p if several else ''}{count_noun(stages, 'stage')} x {count_noun(m, 'micro-batch')}")
    side = any(m.alongside for m in plan.meshes)
    return "; ".join(parts) + (" (replica groups side by side)" if side else "")


def _bottleneck(plan, est: dict) -> str:
    from ..plan.explain import breakdown, describe_bottleneck
    from ..plan.multi_explain import PARTS, shapes_breakdown
    if plan.is_simple:
        return describe_bottleneck(plan, breakdown(est, plan.num_micro_batches), short=True)
    bd = shapes_breakdown(est)
    k = bd["bottleneck"]
    where = f" (pipeline {bd['slowest_pipeline']})" if k in ("pipeline", "dp_sync") and plan.num_pipelines > 1 else ""
    return f"{PARTS[k]} {bd['parts'][k]['share']:.0%}{where}"


def _machine(stored) -> object:
    """A plan's stored inventory without its prices (which --price and the cost row handle): what its figures
    depend on."""
    if not isinstance(stored, dict):
        return stored
    clusters = [{k: v for k, v in c.items() if k != "price_per_device_hour"} if isinstance(c, dict) else c
                for c in stored.get("clusters") or []]
    return {**stored, "clusters": clusters, "name": None, "description": None}


def plan_row(path: str, plan, inventory, cost_model) -> dict:
    from ..plan.constraints import cost_per_million_tokens
    from ..plan.explain import cross_cluster_bytes
    from ..plan.simulate import simulate
    priced = simulate(plan, inventory, cost_model)
    est = priced.to_dict()
    several = plan.num_pipelines > 1
    used: dict[str, int] = {}
    for m in plan.meshes:
        used[m.cluster] = used.get(m.cluster, 0) + m.num_devices
    # (a capacity that rounds to 0 GiB, e.g. --set memory_gib=0.004: infinitely over it)
    mem = [(s["memory_gib"] / s["memory_cap_gib"] if s["memory_cap_gib"] > 0 else math.inf, s["memory_gib"],
            s["memory_cap_gib"]) for s in est["stages"]]
    peak = max(mem)
    share = peak[0] if math.isfinite(peak[0]) else None     # (JSON has no infinity)
    tokens = plan.global_batch_size * plan.model.seq_length
    row = {"plan": path, "iteration_time_s": est["iteration_time_s"], "tokens_per_s": est["tokens_per_s"],
           "tokens_per_s_per_device": est["tokens_per_s"] / plan.world_size,
           "tflops_per_device": est["tflops_per_device"], "peak_memory_share": share,
           "peak_memory": f"{peak[1]:.1f} / {peak[2]:g} GiB" + (f" ({share:.0%})" if share is not None else ""),
           "peak_memory_gib": peak[1],
           "peak_memory_capacity_gib": peak[2], "fits": bool(est["fits"]),
           "engine": plan.engine, "precision": plan.precision, "devices": plan.world_size, "clusters": ", ".join(f"{k} {v}" for k, v in used.items()),
           "pipeline": _pipelines(plan),
           # '+': a replica group alongside the mesh before it (as the simulate table marks it)
           "meshes": ", ".join(f"{'P%d ' % m.pipeline if several else ''}{'+' if m.alongside else ''}{m.cluster} "
                               f"TP{m.tp} DP{m.dp} mbs{m.micro_batch_size} {m.recompute}" for m in plan.meshes),
           "cross_cluster_bytes": cross_cluster_bytes(plan, inventory.with_precision(plan.precision), cost_model),
           "bottleneck": _bottleneck(plan, est),
           # (of the unrounded time, as simulate and explain give it)
           "cost_per_million_tokens": cost_per_million_tokens(inventory, plan.meshes, priced.iteration_time_s,
                                                              tokens)}
    return row


# (key, label, format, better: "max" | "min" | None)
ROWS = [("iteration_time_s", "iteration s", "{:.3f}", "min"), ("tokens_per_s", "tokens/s", "{:,.0f}", "max"),
        ("tokens_per_s_per_device", "tokens/s per device", "{:,.1f}", "max"),
        ("tflops_per_device", "TFLOP/s per device", "{:.1f}", "max"),
        ("cost_per_million_tokens", "cost per 1M tokens", "{:.3f}", "min"),
        ("peak_memory", "peak memory", "{}", None), ("fits", "fits in memory", "{}", None),
        ("engine", "engine", "{}", None), ("precision", "precision", "{}", None),
        ("devices", "devices", "{}", None), ("clusters", "clusters (devices)", "{}", None),
        ("meshes", "meshes", "{}", None), ("pipeline", "pipeline", "{}", None),
        ("cross_cluster_bytes", "cross-cluster GB/iteration", "{:.2f}", "min"), ("bottleneck", "bottleneck", "{}", None)]


def format_table(rows: list[dict]) -> str:
    import os
    names = [os.path.basename(r["plan"]) for r in rows]
    # two plans of the same file name in different folders: their columns show the paths as given
    header = ["", ""] + [r["plan"] if names.count(n) > 1 else n for n, r in zip(names, rows)]
    lines = []
    for key, label, fmt, better in ROWS:
        vals = [r[key] for r in rows]
        if key == "cost_per_million_tokens" and all(v is None for v in vals):
            continue
        shown = ["-" if v is None else ("yes" if v else "NO") if key == "fits" else
                 fmt.format(v / 1e9 if key == "cross_cluster_bytes" else v) for v in vals]
        differ = len(set(shown)) > 1        # as shown, too
        if better and len(rows) > 1:
            # the best of the figures as shown (marks on unrounded ones put '<' on one of three equal "0.0"s), among
            # the plans that fit (a plan over its memory was marked the fastest) and have the figure (a cost)
            figures = [float(x.replace(",", "")) if v is not None and r["fits"] else None
                       for x, v, r in zip(shown, vals, rows)]
            known = [f for f in figures if f is not None]
            if len(set(known)) > 1 or (known and len(known) < len(figures)):
                best = (max if better == "max" else min)(known)
                shown = [x + (" <" if f == best else "") for x, f in zip(shown, figures)]
        lines.append(["*" if differ else "", label] + shown)
    widths = [max(len(str(r[i])) for r in [header, *lines]) for i in range(len(header))]
    fmt_line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
    return "\n".join([fmt_line(header), fmt_line(["-" * w for w in widths]), *map(fmt_line, lines),
                      "('*': the plans differ; '<': the best value of the plans that fit)"])


def run(args) -> int:
    from ..errors import InputError
    from .explain import plan_inputs
    rows, jobs, inputs = [], {}, []
    for path in args.plans:
        try:
            plan, inventory, cost_model = plan_inputs(args, path)
        except InputError as exc:
            if exc.field == "--set" and exc.file is None and len(args.plans) > 1 and not args.inventory:
                # a key of one plan's inventory and not another's: say whose inventory refused it
                raise InputError(f"{exc.reason} (in the inventory {path} is priced on)", field="--set",
                                 fix=f"{exc.fix}; compare the plans whose inventories have it, or give "
                                     "--inventory one inventory for all") from None
            raise
        jobs[path] = (plan.model.name, plan.model.num_layers, plan.model.hidden_size, plan.model.seq_length,
                      plan.global_batch_size, plan.precision)
        inputs.append((path, plan, inventory, cost_model))
    if not args.inventory:      # each on its own: a faster network is no better plan
        groups: dict[str, list[str]] = {}
        for path, plan, *_ in inputs:
            groups.setdefault(json.dumps(_machine(plan.inventory), sort_keys=True), []).append(path)
        if len(groups) > 1:
            print("hetauto compare: the plans are priced on different inventories, each on the one it stores ("
                  + "; ".join(" and ".join(g) for g in groups.values()) + "), so their figures compare different "
                  "machines too; --inventory INV prices them all on one", file=sys.stderr)
    prices = _prices(args, [inv for _, _, inv, _ in inputs])
    for path, plan, inventory, cost_model in inputs:
        try:
            rows.append(plan_row(path, plan, _priced(inventory, prices), cost_model))
        except InputError as exc:
            from ._common import plan_error
            raise plan_error(exc, path, args.set) from None
    if args.price or any(r["cost_per_million_tokens"] is not None for r in rows):
        # a plan left without a cost row: say which of its clusters has no price, rather than drop it in silence
        for path, plan, inventory, _ in inputs:
            unpriced = sorted({m.cluster for m in plan.meshes} - {c.name for c in _priced(inventory, prices).clusters
                                                                 if c.price_per_device_hour is not None})
            if unpriced:
                print(f"hetauto compare: {path} has no cost per 1M tokens: cluster(s) {', '.join(unpriced)} it uses "
                      f"have no price (--price {unpriced[0]}=PRICE, or price_per_device_hour in the inventory)",
                      file=sys.stderr)
    if len(set(jobs.values())) > 1:     # (the '<' marks then compare different work)
        print("hetauto compare: the plans train different jobs (" + "; ".join(
            f"{p}: {n}, {layers} layers, hidden {h}, sequence {s}, batch {b}, {pr}"
            for p, (n, layers, h, s, b, pr) in jobs.items())
              + "): time per iteration and tokens/s compare different work", file=sys.stderr)
    if args.json:
        differ = [k for k, *_ in ROWS if len({str(r[k]) for r in rows}) > 1]
        # (JSON for scripts: `fits` a boolean, the peak memory also as numbers; the table shows them in words)
        from ._common import json_document
        print(json_text(json_document("compare", {"plans": rows, "differ": differ}), indent=2))
    else:
        print(format_table(rows))
    return 0
