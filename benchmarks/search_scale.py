"""Search time and plan quality at growing scale (LLaMA-2-70B), pinned to one core.

    .venv/bin/python benchmarks/search_scale.py [--seed N]

For each instance it prints: devices, search wall time, layouts evaluated, the plan's predicted iteration time,
tokens/s and MFU, and two references: the best plan on the single fastest cluster alone (what a homogeneous
job would do), and where the tree is small enough the exhaustive optimum of the same search space.
Targets: <= 1 s for 512 devices, <= 10 s for 736 devices on one core; MCTS within 1% of exhaustive.

Then, for the README's 2-cluster plan and the 4-cluster / 736-device example, the boundary schedules
(docs/search.md): the plan searched with blocking cross-cluster transfers (what the runtime does today) and with
overlapped ones (asynchronous, depth chosen per boundary): predicted tokens/s, speed-up over the fastest single
cluster, the clusters that take part and each cross-cluster boundary's schedule.
"""
from __future__ import annotations

import argparse
import os
import time

from hetauto_megatron.plan.search import SearchConfig, search
from hetauto_megatron.plan.simulate import layout_to_plan, simulate
from hetauto_megatron.spec.inventory import inventory_from_dict, load_inventory
from hetauto_megatron.spec.model import PRESETS

HERE = os.path.dirname(os.path.abspath(__file__))
EX = os.path.join(HERE, "..", "examples", "llama")


def two_clusters(h800_nodes: int, other: str, other_nodes: int, bw: float) -> dict:
    return {"clusters": [
        {"name": "h800", "device": "h800", "nodes": h800_nodes, "devices_per_node": 8,
         "intra_node": {"bandwidth_gbps": 1600, "latency_us": 5}, "inter_node": {"bandwidth_gbps": 400, "latency_us": 10}},
        {"name": other, "device": other, "nodes": other_nodes, "devices_per_node": 8,
         "inter_node": {"bandwidth_gbps": 200, "latency_us": 15}}],
        "links": [{"between": ["h800", other], "bandwidth_gbps": bw, "latency_ms": 2}]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    model = PRESETS["llama2-70b"]
    instances = [
        ("2 clusters / 64 devices", inventory_from_dict(two_clusters(4, "ascend-910b", 4, 25)), 256, True),
        ("2 clusters / 512 devices", inventory_from_dict(two_clusters(32, "a100-80gb", 32, 100)), 1024, False),
        ("4 clusters / 736 devices", load_inventory(os.path.join(EX, "inventory-4clusters-736.yaml")), 1024, False),
    ]
    print(f"{'instance':26} {'search s':>8} {'layouts':>7} {'iter s':>8} {'tokens/s':>10} {'MFU':>6} "
          f"{'fastest-alone s':>15} {'speed-up':>8} {'exhaustive s':>12} {'gap':>6}")
    for name, inv, gbs, exhaustive in instances:
        t0 = time.perf_counter()
        r = search(model, inv, gbs, config=SearchConfig(seed=args.seed))
        secs = time.perf_counter() - t0
        est = simulate(layout_to_plan(model, gbs, r.choices, r.stage_layers, inv), inv)
        fastest = max(inv.clusters, key=lambda c: c.num_devices * c.device.peak_tflops)
        alone_inv = inventory_from_dict({"clusters": [c for c in inv.to_dict()["clusters"] if c["name"] == fastest.name]})
        alone = search(model, alone_inv, gbs, config=SearchConfig(seed=args.seed))
        ex_s, gap = "-", "-"
        if exhaustive:
            ex = search(model, inv, gbs, config=SearchConfig(method="exhaustive"))
            ex_s, gap = f"{ex.iteration_time_s:.3f}", f"{(r.iteration_time_s / ex.iteration_time_s - 1) * 100:+.2f}%"
        print(f"{name:26} {secs:8.2f} {r.candidates_evaluated:7d} {r.iteration_time_s:8.3f} {est.tokens_per_s:10.0f} "
              f"{est.mfu:6.1%} {alone.iteration_time_s:15.3f} {alone.iteration_time_s / r.iteration_time_s:7.2f}x "
              f"{ex_s:>12} {gap:>6}")
        print("    " + "  ->  ".join(f"{c.cluster}: tp{c.tp} dp{c.dp} mb{c.micro_batch_size} x{c.num_stages} "
                                     f"{c.recompute}" for c in r.choices))
    schedules(model, args.seed)


def schedules(model, seed: int) -> None:
    """Blocking vs overlapped cross-cluster boundaries on the README's 2-cluster plan and the 736-device example."""
    cases = [("README 2 clusters (64 H800 + 32 910B, 25 Gbit/s)", "inventory-2clusters.yaml", 512),
             ("4 clusters / 736 devices", "inventory-4clusters-736.yaml", 1024)]
    print(f"\n{'instance':50} {'schedule':10} {'search s':>8} {'iter s':>8} {'tokens/s':>9} {'speed-up':>8}  clusters "
          "(boundary schedules)")
    for name, path, gbs in cases:
        inv = load_inventory(os.path.join(EX, path))
        fastest = max(inv.clusters, key=lambda c: c.num_devices * c.device.peak_tflops)
        alone_inv = inventory_from_dict({"clusters": [c for c in inv.to_dict()["clusters"] if c["name"] == fastest.name]})
        alone = search(model, alone_inv, gbs, config=SearchConfig(seed=seed))
        for schedule in ("blocking", "overlapped"):
            t0 = time.perf_counter()
            r = search(model, inv, gbs, config=SearchConfig(seed=seed, schedule=schedule))
            secs = time.perf_counter() - t0
            est = simulate(layout_to_plan(model, gbs, r.choices, r.stage_layers, inv, boundaries=r.boundaries), inv)
            used = " -> ".join(c.cluster + ("" if i == len(r.choices) - 1 else
                                            " [blocking]" if r.boundaries[i] is None else f" [overlapped d={r.boundaries[i]}]")
                               for i, c in enumerate(r.choices))
            print(f"{name:50} {schedule:10} {secs:8.2f} {est.iteration_time_s:8.3f} {est.tokens_per_s:9.0f} "
                  f"{alone.iteration_time_s / est.iteration_time_s:7.2f}x  {used}")
        print(f"{'':50} {fastest.name + ' alone':10} {'':8} {alone.iteration_time_s:8.3f} "
              f"{gbs * model.seq_length / alone.iteration_time_s:9.0f}")


if __name__ == "__main__":
    main()
