"""Search time and plan quality at growing scale, on one core and on all cores.

    .venv/bin/python benchmarks/search_scale.py [--seed N] [--skip-8] [--shapes-only | --replan-only |
                                                 --replan-random N]

For each instance it prints, once pinned to one core (--workers 1) and once on every core the machine gives
this process (--workers = that count): wall seconds, CPU seconds (this process and its workers), layouts
evaluated and layouts per second, the plan's predicted iteration time, tokens/s and MFU, and two references:
the best plan on the single fastest cluster alone (what a homogeneous job would do), and where the tree is
small enough the exhaustive optimum of the same search space. The load average is printed first: on a
shared machine wall times are pessimistic, CPU seconds less so.
Targets (issue 15): 2 clusters / 512 devices <= 0.5 s, 4 clusters / 736 devices <= 1 s, 8 clusters / 16,384
devices <= 30 s. Then re-planning: the 736-device example after its busiest cluster leaves, cold and with
--from the old plan (target: <= 20 % of the cold search's time, the same plan quality); `--replan-only` runs
just re-planning, with every cluster of the 736-device and the 3-cluster example removed in turn;
`--replan-random N` re-plans N random instances of benchmarks/search_quality.py the same way (plan quality).

Then, for the README's 2-cluster plan and the 4-cluster / 736-device example, the boundary schedules
(docs/search.md): the plan searched with blocking cross-cluster transfers (what the runtime does today) and with
overlapped ones (asynchronous, depth chosen per boundary): predicted tokens/s, speed-up over the fastest single
cluster, the clusters that take part and each cross-cluster boundary's schedule.

Last, the new shapes (`--shapes-only` runs just this; issue 14's targets: <= 10 s on one core at 736 devices,
<= 60 s at 16,384, with them; and a chain of 20 clusters, 600 devices, where the partitions' bound matters): the
search with several pipelines and mixed replica groups (the default of
`hetauto plan`), its plan, speed-up over the fastest cluster alone, the clusters taking part, the partitions of the
clusters into pipelines bounded and searched, the best partition bound, and two partitions searched regardless
of their bound (the best-bound one, one pipeline per cluster of the plan) with their gradient exchange.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import time

from hetauto_megatron.plan.layout_pricing import layout_to_plan
from hetauto_megatron.plan.replan import warm_layouts
from hetauto_megatron.plan.search import SearchConfig, search
from hetauto_megatron.plan.simulate import simulate
from hetauto_megatron.plan.space import SearchSpace
from hetauto_megatron.cost.analytic import AnalyticCostModel
from hetauto_megatron.spec.inventory import inventory_from_dict, load_inventory
from hetauto_megatron.spec.model import PRESETS

HERE = os.path.dirname(os.path.abspath(__file__))
EX = os.path.join(HERE, "..", "examples", "llama")
EX8 = os.path.join(HERE, "..", "examples", "gpt3", "inventory-8clusters-16k.yaml")


def two_clusters(h800_nodes: int, other: str, other_nodes: int, bw: float) -> dict:
    return {"clusters": [
        {"name": "h800", "device": "h800", "nodes": h800_nodes, "devices_per_node": 8,
         "intra_node": {"bandwidth_gbps": 1600, "latency_us": 5}, "inter_node": {"bandwidth_gbps": 400, "latency_us": 10}},
        {"name": other, "device": other, "nodes": other_nodes, "devices_per_node": 8,
         "inter_node": {"bandwidth_gbps": 200, "latency_us": 15}}],
        "links": [{"between": ["h800", other], "bandwidth_gbps": bw, "latency_ms": 2}]}


def chain(n: int = 20, seed: int = 1) -> dict:
    """n clusters in a chain (cluster i linked to i + 1 only): 2-4 device types, 8-64 devices each, 10-100 Gbit/s
    links, drawn from random.Random(seed). With seed 1 the partition bound let one partition of 3 | 17 clusters
    through, whose search took most of the plan's time and lost (docs/search.md, "Measured")."""
    rng = random.Random(seed)
    types = rng.sample(["h800", "a100-80gb", "ascend-910b", "mi300x", "h100-sxm", "a100-40gb"], rng.choice([2, 3, 4]))
    clusters = []
    for i in range(n):
        device, per_node = rng.choice(types), rng.choice([4, 8])
        nodes = rng.choice([k for k in (1, 2, 4, 8, 16) if 8 <= k * per_node <= 64])
        clusters.append({"name": f"c{i:02d}", "device": device, "nodes": nodes, "devices_per_node": per_node})
    links = [{"between": [f"c{i:02d}", f"c{i + 1:02d}"], "bandwidth_gbps": rng.choice([10, 25, 40, 50, 100]),
              "latency_ms": rng.choice([1, 2, 5])} for i in range(n - 1)]
    return {"clusters": clusters, "links": links}


def timed(model, inv, gbs, cfg):
    """(result, wall s, CPU s of this process and its finished workers)."""
    c0, w0 = os.times(), time.perf_counter()
    r = search(model, inv, gbs, config=cfg)
    c1 = os.times()
    return r, time.perf_counter() - w0, (c1.user + c1.system + c1.children_user + c1.children_system
                                         - c0.user - c0.system - c0.children_user - c0.children_system)


def without(inv, name: str):
    d = inv.to_dict()
    d["clusters"] = [c for c in d["clusters"] if c["name"] != name]
    d["links"] = [link for link in d.get("links", []) if name not in link["between"]]
    return inventory_from_dict(d)


def pin(cores) -> None:
    """Run this process (and the workers it starts) on `cores` only, where the platform allows."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))


def all_cores() -> list:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def fastest_alone(model, inv, gbs: int, seed: int):
    """(the cluster with the most peak FLOP/s, the search's result on it alone): what a homogeneous job would do."""
    fastest = max(inv.clusters, key=lambda c: c.num_devices * c.device.peak_tflops)
    alone_inv = inventory_from_dict({"clusters": [c for c in inv.to_dict()["clusters"] if c["name"] == fastest.name]})
    return fastest, search(model, alone_inv, gbs, config=SearchConfig(seed=seed, workers=1))


def as_plan(model, inv, gbs: int, r):
    """A search result as the plan file `hetauto plan --from` reads."""
    return layout_to_plan(model, gbs, r.choices, r.stage_layers, inv, boundaries=r.boundaries)


def cold_and_warm(model, inv, gbs: int, old, seed: int, need_warm: bool = False):
    """The search on `inv` (one worker) cold and with --from `old`, each as `timed` gives it: ((cold, wall s,
    CPU s), (from old, wall s, CPU s)); None when `need_warm` and the old plan leaves no legal warm start on
    `inv` (then nothing is searched: random instances skip those removals)."""
    warm = warm_layouts(old, SearchSpace(model, inv, gbs, AnalyticCostModel()))
    if need_warm and not warm:
        return None
    cold = timed(model, inv, gbs, SearchConfig(seed=seed, workers=1))
    return cold, timed(model, inv, gbs, SearchConfig(seed=seed, workers=1, warm_start=tuple(warm)))


def gap(r, ref) -> float:
    """How much slower (%) result `r`'s plan is than result `ref`'s (--from against cold, search against exhaustive)."""
    return (r.iteration_time_s / ref.iteration_time_s - 1) * 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-8", action="store_true", help="leave out the 8-cluster / 16,384-device instance")
    ap.add_argument("--shapes-only", action="store_true",
                    help="only the new shapes' report (several pipelines, mixed replica groups; one core)")
    ap.add_argument("--replan-only", action="store_true",
                    help="only re-planning, one core: every cluster of the 736-device and the 3-cluster example "
                         "removed in turn, cold search vs --from the full inventory's plan")
    ap.add_argument("--replan-random", type=int, default=0, metavar="N",
                    help="only re-planning on N random instances of benchmarks/search_quality.py (each cluster "
                         "removed in turn), one core: --from against the cold search's plan")
    args = ap.parse_args()
    if args.replan_only:
        replan_all(args.seed)
        return
    if args.replan_random:
        replan_random(args.replan_random, args.seed)
        return
    if args.shapes_only:
        shapes_report(args.seed, args.skip_8)
        return
    cores = all_cores()
    print(f"load average {load_average()} on {os.cpu_count()} cores; all cores = {len(cores)}")
    llama = PRESETS["llama2-70b"]
    instances = [
        ("2 clusters / 64 devices", llama, inventory_from_dict(two_clusters(4, "ascend-910b", 4, 25)), 256, True),
        ("2 clusters / 512 devices", llama, inventory_from_dict(two_clusters(32, "a100-80gb", 32, 100)), 1024, False),
        ("4 clusters / 736 devices", llama, load_inventory(os.path.join(EX, "inventory-4clusters-736.yaml")), 1024,
         False),
    ]
    if not args.skip_8:
        instances.append(("8 clusters / 16,384 devices", PRESETS["gpt3-175b"], load_inventory(EX8), 4096, False))
    print(f"{'instance':28} {'cores':>5} {'wall s':>7} {'CPU s':>6} {'layouts':>7} {'layouts/s':>9} {'iter s':>8} "
          f"{'tokens/s':>10} {'MFU':>6} {'fastest-alone s':>15} {'speed-up':>8} {'exhaustive s':>12} {'gap':>6}")
    plans = {}
    for name, model, inv, gbs, exhaustive in instances:
        _, alone = fastest_alone(model, inv, gbs, args.seed)
        ex_s, ex_gap = "-", "-"
        for n in sorted({1, len(cores)}):
            pin(cores[:n])
            r, wall, cpu = timed(model, inv, gbs, SearchConfig(seed=args.seed, workers=n))
            est = simulate(as_plan(model, inv, gbs, r), inv)
            if exhaustive and ex_s == "-":
                ex = search(model, inv, gbs, config=SearchConfig(method="exhaustive"))
                ex_s, ex_gap = f"{ex.iteration_time_s:.3f}", f"{gap(r, ex):+.2f}%"
            print(f"{name:28} {n:5d} {wall:7.2f} {cpu:6.2f} {r.candidates_evaluated:7d} "
                  f"{r.candidates_evaluated / wall:9.0f} {r.iteration_time_s:8.3f} {est.tokens_per_s:10.0f} "
                  f"{est.mfu:6.1%} {alone.iteration_time_s:15.3f} {alone.iteration_time_s / r.iteration_time_s:7.2f}x "
                  f"{ex_s:>12} {ex_gap:>6}", flush=True)
        plans[name] = (model, inv, gbs, r)
        print("    " + "  ->  ".join(f"{c.cluster}: tp{c.tp} dp{c.dp} mb{c.micro_batch_size} x{c.num_stages} "
                                     f"{c.recompute}" for c in r.choices))
    pin(cores[:1])
    replan(*plans["4 clusters / 736 devices"], args.seed)
    pin(cores)
    schedules(llama, args.seed)
    shapes_report(args.seed, args.skip_8)


def replan(model, inv, gbs, r, seed: int) -> None:
    """The 736-device plan after a cluster leaves: cold search vs --from. The cluster is the plan's last mesh
    if the plan has several, else the largest cluster the plan leaves out."""
    if len(r.choices) > 1:
        used = r.choices[-1].cluster
    else:
        used = max((c for c in inv.clusters if c.name != r.choices[0].cluster), key=lambda c: c.num_devices).name
    (cold, cold_wall, cold_cpu), (hot, hot_wall, hot_cpu) = cold_and_warm(model, without(inv, used), gbs,
                                                                          as_plan(model, inv, gbs, r), seed)
    print(f"\nre-plan, 736 devices without {used} (one core, old plan {'+'.join(c.cluster for c in r.choices)}): cold {cold_wall:.2f} s wall / {cold_cpu:.2f} s CPU, "
          f"{cold.candidates_evaluated} layouts, {cold.iteration_time_s:.3f} s/iteration; --from {hot_wall:.2f} s / "
          f"{hot_cpu:.2f} s CPU ({hot_cpu / cold_cpu:.0%} of cold), {hot.candidates_evaluated} layouts, "
          f"{hot.iteration_time_s:.3f} s/iteration ({gap(hot, cold):+.2f}%)")


def replan_all(seed: int) -> None:
    """Each cluster of the 736-device example (global batch 1024) and of the 3-cluster one (512) removed in
    turn: cold search vs --from the full inventory's plan, CPU seconds on one core, and the plans' values."""
    pin(all_cores()[:1])
    print(f"load average {load_average()}; one core, CPU seconds")
    model = PRESETS["llama2-70b"]
    for path, gbs in (("inventory-4clusters-736.yaml", 1024), ("inventory-3clusters.yaml", 512)):
        inv = load_inventory(os.path.join(EX, path))
        r = search(model, inv, gbs, config=SearchConfig(seed=seed, workers=1))
        print(f"{path}: old plan {'+'.join(c.cluster for c in r.choices)}")
        old = as_plan(model, inv, gbs, r)
        for gone in [c.name for c in inv.clusters]:
            (cold, _, cold_cpu), (hot, _, hot_cpu) = cold_and_warm(model, without(inv, gone), gbs, old, seed)
            print(f"  without {gone:8} cold {cold_cpu:5.2f} s {cold.iteration_time_s:8.3f} s/it   --from {hot_cpu:5.2f} s "
                  f"({hot_cpu / cold_cpu:4.0%}) {hot.iteration_time_s:8.3f} s/it ({gap(hot, cold):+.2f}%)", flush=True)


def replan_random(count: int, seed: int) -> None:
    """--from against a cold search on `count` random instances of search_quality.py (2-4 clusters, 16-32
    devices, LLaMA 7B-13B; drawn from random.Random(7)), each cluster of each removed in turn (where the old
    plan leaves a legal warm start): the gap of the plans' values and the CPU seconds, one core."""
    from search_quality import random_instance
    from hetauto_megatron.errors import InfeasibleError

    pin(all_cores()[:1])
    print(f"load average {load_average()}; one core, CPU seconds")
    rng, done, gaps, cold_s, hot_s = random.Random(7), 0, [], 0.0, 0.0
    while done < count:
        inv, model, gbs = random_instance(rng)
        try:
            r = search(model, inv, gbs, config=SearchConfig(seed=seed, workers=1))
        except InfeasibleError:
            continue
        done += 1
        old = as_plan(model, inv, gbs, r)
        for gone in [c.name for c in inv.clusters]:
            try:
                runs = cold_and_warm(model, without(inv, gone), gbs, old, seed, need_warm=True)
            except InfeasibleError:     # the cold search finds nothing feasible without that cluster
                continue
            if runs is None:
                continue
            (cold, _, cold_cpu), (hot, _, hot_cpu) = runs
            gaps.append(gap(hot, cold))
            cold_s, hot_s = cold_s + cold_cpu, hot_s + hot_cpu
            print(f"  {done:2} {model.name:10} gbs {gbs:3} {'+'.join(c.device.name for c in inv.clusters):38} "
                  f"without {gone}: cold {cold_cpu:5.2f} s --from {hot_cpu:5.2f} s {gaps[-1]:+.2f}%", flush=True)
    print(f"{len(gaps)} removals: {sum(g <= 0.005 for g in gaps)} at the cold plan's value or better, "
          f"{sum(g <= 1 for g in gaps)} within 1 %, worst {max(gaps):+.2f}%; CPU cold {cold_s:.2f} s, "
          f"--from {hot_s:.2f} s ({hot_s / cold_s:.0%})")


def schedules(model, seed: int) -> None:
    """Blocking vs overlapped cross-cluster boundaries on the README's 2-cluster plan and the 736-device example."""
    cases = [("README 2 clusters (64 H800 + 32 910B, 25 Gbit/s)", "inventory-2clusters.yaml", 512),
             ("4 clusters / 736 devices", "inventory-4clusters-736.yaml", 1024)]
    print(f"\n{'instance':50} {'schedule':10} {'search s':>8} {'iter s':>8} {'tokens/s':>9} {'speed-up':>8}  clusters "
          "(boundary schedules)")
    for name, path, gbs in cases:
        inv = load_inventory(os.path.join(EX, path))
        fastest, alone = fastest_alone(model, inv, gbs, seed)
        for schedule in ("blocking", "overlapped"):
            t0 = time.perf_counter()
            r = search(model, inv, gbs, config=SearchConfig(seed=seed, schedule=schedule))
            secs = time.perf_counter() - t0
            est = simulate(as_plan(model, inv, gbs, r), inv)
            used = " -> ".join(c.cluster + ("" if i == len(r.choices) - 1 else
                                            " [blocking]" if r.boundaries[i] is None else f" [overlapped d={r.boundaries[i]}]")
                               for i, c in enumerate(r.choices))
            print(f"{name:50} {schedule:10} {secs:8.2f} {est.iteration_time_s:8.3f} {est.tokens_per_s:9.0f} "
                  f"{alone.iteration_time_s / est.iteration_time_s:7.2f}x  {used}")
        print(f"{'':50} {fastest.name + ' alone':10} {'':8} {alone.iteration_time_s:8.3f} "
              f"{gbs * model.seq_length / alone.iteration_time_s:9.0f}")


def shapes_report(seed: int, skip_8: bool) -> None:
    """The new shapes (plan/multi_search.py, the default of `hetauto plan`): on one core, the search with them
    (wall and CPU s), the plan, the clusters it uses, its speed-up over the fastest cluster alone; how many
    partitions of the clusters into pipelines were bounded and searched; and what several pipelines give: the
    best partition bound, and the priced plan of the best-bound partition and of one pipeline per cluster used
    (searched even when the bound rules them out)."""
    from hetauto_megatron.plan.constraints import Constraints
    from hetauto_megatron.plan.multi_search import ShapesResult, _search_partition, search_shapes
    from hetauto_megatron.plan.partition_bound import PartitionBound, set_partitions
    import itertools
    cases = [("4 clusters / 736 devices", PRESETS["llama2-70b"],
              load_inventory(os.path.join(EX, "inventory-4clusters-736.yaml")), 1024)]
    if not skip_8:
        cases.append(("8 clusters / 16,384 devices", PRESETS["gpt3-175b"], load_inventory(EX8), 4096))
    cases.append(("20-cluster chain / 600 devices", PRESETS["llama2-70b"], inventory_from_dict(chain(20, 1)), 512))
    cores = all_cores()
    pin(cores[:1])
    print("\nnew shapes (several pipelines, mixed replica groups), one core:")
    cost = AnalyticCostModel()
    for name, model, inv, gbs in cases:
        fastest, alone = fastest_alone(model, inv, gbs, seed)
        c0, w0 = os.times(), time.perf_counter()
        r = search_shapes(model, inv, gbs, cost, SearchConfig(seed=seed, workers=1))
        c1 = os.times()
        wall, cpu = time.perf_counter() - w0, c1.user + c1.system - c0.user - c0.system
        est = simulate(r.plan, inv)
        used = sorted({m.cluster for m in r.plan.meshes})
        print(f"{name}: search {wall:.2f} s wall / {cpu:.2f} s CPU (single-pipeline part {r.simple.seconds:.2f} s); "
              f"{r.iteration_time_s:.3f} s/iteration, {est.tokens_per_s:,.0f} tokens/s, "
              f"{alone.iteration_time_s / r.iteration_time_s:.2f}x the fastest cluster alone ({fastest.name}, "
              f"{alone.iteration_time_s:.3f} s); {r.plan.num_pipelines} pipeline(s), clusters {', '.join(used)} "
              f"({len(used)} of {len(inv.clusters)}), {sum(m.alongside for m in r.plan.meshes)} replica group(s) "
              f"alongside; partitions bounded {r.partitions}, searched {r.partitions_searched}, replica groups "
              f"priced {r.alongside_tried}")
        if len(inv.clusters) > 8:      # (every partition of every subset: Bell numbers, hours for 20 clusters)
            continue
        # what several pipelines give: the best bound, and two partitions searched regardless of it
        bound = PartitionBound(model, inv, gbs)
        names = [c.name for c in inv.clusters]
        best_b = min(((bound(p), p) for k in range(2, len(names) + 1) for sub in itertools.combinations(names, k)
                      for p in set_partitions(list(sub)) if len(p) >= 2), key=lambda x: x[0])
        print(f"    best partition bound {best_b[0]:.3f} s ({' | '.join('+'.join(b) for b in best_b[1])}) against "
              f"the plan's {r.iteration_time_s:.3f} s")
        each = [[c] for c in used] if len(used) > 1 else [[fastest.name], [r.simple.choices[0].cluster]]
        for label, blocks in (("best-bound partition", best_b[1]), ("one pipeline per cluster of the plan", each)):
            if len({c for b in blocks for c in b}) < 2 or not math.isfinite(bound(blocks)):
                continue
            t0 = time.perf_counter()
            out = ShapesResult(None, math.inf, None, 0.0)
            found = _search_partition(model, inv, gbs, cost, SearchConfig(seed=seed, workers=1), Constraints(), names,
                                      blocks, {}, out)
            if found is None:
                print(f"    {label} {' | '.join('+'.join(b) for b in blocks)}: no feasible plan")
                continue
            t, plan = found
            e = simulate(plan, inv)
            print(f"    {label} {' | '.join('+'.join(b) for b in blocks)}: {t:.3f} s/iteration "
                  f"(gradient sync {e.replica_sync_s:.3f} s, samples {list(plan.samples_per_pipeline)}; "
                  f"{time.perf_counter() - t0:.1f} s to search)")
    pin(cores)


if __name__ == "__main__":
    main()
