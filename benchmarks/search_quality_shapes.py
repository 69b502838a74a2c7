"""Plan quality of the search over the new shapes (plan/multi_search.py) against the exhaustive optimum.

    .venv/bin/python benchmarks/search_quality_shapes.py [--instances 20] [--seeds 3] [--draw 2027]

Draws small random instances (2-3 clusters of 4-8 devices of different types, 10-400 Gbit/s links, LLaMA-width
models of 4-8 layers, global batch 16-256) and some built to favour the new shapes (two equal sites on a fast
link with a model whose gradients are small next to its compute; Sailor-like pairs where one device type is
short of memory). For each, the exhaustive optimum (`exhaustive`) is the best plan, priced by the same
simulator (plan/simulate.py, plan/multi_simulate.py), of this decision space:

  * one pipeline: every leaf of the single-pipeline tree (plan/space.py; recomputation, layer split and
    boundary depths as the evaluator chooses them), i.e. `search(method="exhaustive")`;
  * several pipelines: every partition of every subset of >= 2 clusters into >= 2 blocks x every block as
    pipeline 0 (the root of the gradient exchange) x every split of the global batch into positive
    per-pipeline samples in multiples of a 64th of it for two pipelines, a 32nd for three (of 1 below) x,
    per block, every leaf of the single-pipeline tree over exactly the block's clusters at its share. Branch
    and bound over the product: a pipeline priced alone (its vocabulary padded for its own TPs only, never
    more than the plan's) bounds the plan's `before sync + after + overhead` terms from below (asserted on
    every plan priced). Every plan priced here is also checked against its partition's bound
    (plan/partition_bound.py): none may be faster;
  * a replica group: every leaf of every cluster alone (at the global batch) x one group alongside its mesh
    from any linked cluster's devices (or the same cluster's left-over ones): every TP, every DP up to the free
    devices, the step kept or grown 2/4/8 times, every split of the step into whole micro-batches, the least
    recomputation that fits (none, selective, full in turn), as alongside_search.groups_alongside builds it.

The search (`search_shapes`, default settings) is run with seeds 0..seeds-1; the script reports per instance the
exhaustive best, the search's best, the gap per seed, which shape won, and the search time (target: every
instance and seed within 1 %).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import random
import time

from hetauto_megatron.cost.analytic import AnalyticCostModel
from hetauto_megatron.errors import InfeasibleError, InputError
from hetauto_megatron.plan import alongside_search, space as space_mod
from hetauto_megatron.plan.constraints import Constraints, restrict
from hetauto_megatron.plan.evaluator import LayoutEvaluator
from hetauto_megatron.plan.layout_pricing import layout_to_plan
from hetauto_megatron.plan.multi_search import search_shapes
from hetauto_megatron.plan.shapes_result import block_constraints
from hetauto_megatron.plan.multi_simulate import price_pipeline, shapes_of
from hetauto_megatron.plan.partition_bound import PartitionBound, set_partitions
from hetauto_megatron.plan.engines import selective_runs
from hetauto_megatron.plan.plan import Plan
from hetauto_megatron.plan.search import SearchConfig, search
from hetauto_megatron.plan.simulate import padded_model, simulate
from hetauto_megatron.plan.space import SearchSpace, tp_degrees
from hetauto_megatron.spec.inventory import inventory_from_dict
from hetauto_megatron.spec.model import PRESETS, load_model

HERE = os.path.dirname(os.path.abspath(__file__))

DEVICES = ["a100-80gb", "a100-40gb", "h100-sxm", "h800", "h20", "l40s", "v100", "ascend-910b", "mi250x", "mi300x"]


def make_inventory(clusters, links):
    """clusters: (name, device, nodes, devices per node); links: (a, b, Gbit/s, ms). The job trains in bf16,
    or fp16 where a device has no bf16 (as `hetauto plan --precision` would be told)."""
    inv = inventory_from_dict({
        "clusters": [{"name": n, "device": d, "nodes": nodes, "devices_per_node": dpn,
                      "inter_node": {"bandwidth_gbps": 200, "latency_us": 10}} for n, d, nodes, dpn in clusters],
        "links": [{"between": [a, b], "bandwidth_gbps": bw, "latency_ms": lat} for a, b, bw, lat in links]})
    try:
        return inv.with_precision("bf16")
    except InputError:
        return inv.with_precision("fp16")


def random_instance(rng: random.Random):
    k = rng.choice([2, 2, 3])
    names = "abcd"[:k]
    clusters = [(n, rng.choice(DEVICES), 1, 4 if k > 2 else rng.choice([4, 8])) for n in names]
    links = [(a, b, rng.choice([10, 25, 50, 100, 200, 400]), rng.choice([1, 2])) for i, a in enumerate(names)
             for b in names[i + 1:] if k == 2 or rng.random() < 0.8]
    model = PRESETS[rng.choice(["llama2-7b", "llama2-13b"])].replace(num_layers=rng.choice([4, 6, 8]),
                                                                      seq_length=rng.choice([1024, 2048, 4096]))
    # small batches favour one pipeline, large ones (many tokens per gradient) the new shapes
    return "random", make_inventory(clusters, links), model, rng.choice([16, 32, 128, 256])


def built_instances():
    """Cases where several pipelines or replica groups should win."""
    opt = load_model(os.path.join(HERE, "..", "examples", "peers", "models", "opt-350m.yaml"))
    llama = PRESETS["llama2-7b"]
    return [
        # two equal sites on a fast link, a model whose gradients are small next to its compute (large batch)
        ("twin sites", make_inventory([("a", "a100-80gb", 1, 8), ("b", "a100-80gb", 1, 8)], [("a", "b", 400, 1)]),
         llama.replace(num_layers=4), 256),
        ("twin sites", make_inventory([("a", "h100-sxm", 1, 4), ("b", "h100-sxm", 1, 4)], [("a", "b", 400, 1)]),
         llama.replace(num_layers=4), 256),
        ("twin sites", make_inventory([("a", "h100-sxm", 1, 4), ("b", "h100-sxm", 1, 4)], [("a", "b", 400, 1)]),
         llama.replace(num_layers=8), 512),
        ("twin sites", make_inventory([("a", "a100-80gb", 1, 4), ("b", "a100-80gb", 1, 4), ("c", "a100-80gb", 1, 4)],
                                      [("a", "b", 400, 1), ("b", "c", 200, 1), ("a", "c", 100, 2)]),
         llama.replace(num_layers=4), 256),
        # two device types on a fast link, large batches: the second type's devices as replicas beside the first
        ("mixed types", make_inventory([("a", "h100-sxm", 1, 4), ("b", "a100-80gb", 1, 4)], [("a", "b", 400, 1)]),
         llama.replace(num_layers=4), 512),
        ("mixed types", make_inventory([("a", "a100-80gb", 1, 8), ("b", "l40s", 1, 8)], [("a", "b", 400, 1)]),
         llama.replace(num_layers=2), 256),
        # Sailor-like: one device type short of memory next to a roomy one
        ("sailor-like", make_inventory([("a", "a100-40gb", 1, 4), ("b", "v100-16gb", 1, 8)], [("a", "b", 100, 1)]),
         opt, 64),
        ("sailor-like", make_inventory([("a", "h100-sxm", 1, 4), ("b", "v100-16gb", 1, 4)], [("a", "b", 200, 1)]),
         llama.replace(num_layers=4), 32),
    ]


# ---- the exhaustive optimum ---------------------------------------------------------------------------------
class Exhaustive:
    def __init__(self, model, inv, gbs, cost):
        self.model, self.inv, self.gbs, self.cost = model, inv, gbs, cost
        self.names = [c.name for c in inv.clusters]
        self._layouts: dict = {}
        self.priced = 0
        self.partition_bound = PartitionBound(model, inv, gbs)
        self.bound_violations = 0      # multi-pipeline plans priced below the partition bound (must stay 0)

    def block_layouts(self, block, share) -> list:
        """Every feasible leaf of the single-pipeline tree over exactly `block` at `share` samples, priced by the
        event simulation: [(lower-bound terms (before sync, after, overhead), choices, stage_layers, boundaries)]
        sorted by the first term."""
        key = (tuple(block), share)
        if key in self._layouts:
            return self._layouts[key]
        con = block_constraints(Constraints(), list(block), self.names)
        inv = restrict(self.inv, con)
        out = []
        try:
            # (a pipeline of several runs steps of at most the devices, as the search offers them: space.step_sizes)
            sp = SearchSpace(self.model, inv, share, self.cost, 16, con, steps_above_devices=False)
            ev = LayoutEvaluator(self.model, inv, share, self.cost, "overlapped")
            seen = set()
            for leaf in space_mod.leaves(sp):
                order, _, _, meshes, _ = sp.decode(leaf)
                if not meshes or len(meshes) != len(order) or min(m.num_stages for m in meshes) < 1:
                    continue
                t, resolved = ev.resolve(meshes)
                if not math.isfinite(t) or resolved in seen:
                    continue
                seen.add(resolved)
                res = ev.exact(resolved)
                if res.stage_layers is None:
                    continue
                plan = layout_to_plan(self.model, share, list(resolved), res.stage_layers, self.inv,
                                      boundaries=res.boundaries)
                pinv = self.inv.with_precision(plan.precision)
                timing = price_pipeline(padded_model(self.model, resolved), pinv, shapes_of(plan)[0], self.cost)
                out.append(((timing.before_sync, timing.after_s, timing.overhead_s), resolved, res.stage_layers,
                            res.boundaries))
        except (InfeasibleError, InputError):
            pass
        out.sort(key=lambda x: x[0][0])
        self._layouts[key] = out
        return out

    def single(self):
        try:
            r = search(self.model, self.inv, self.gbs, config=SearchConfig(method="exhaustive"))
        except (InfeasibleError, InputError):
            return None
        plan = layout_to_plan(self.model, self.gbs, r.choices, r.stage_layers, self.inv, boundaries=r.boundaries)
        return r.iteration_time_s, plan

    def pipelines(self, best):
        usable = [c.name for c in self.inv.clusters if tp_degrees(self.model, c)]
        for r in range(2, len(usable) + 1):
            for subset in itertools.combinations(usable, r):
                for blocks in set_partitions(list(subset)):
                    k = len(blocks)
                    if k < 2:
                        continue
                    for shares in _compositions(self.gbs, k):
                        lists = [self.block_layouts(b, s) for b, s in zip(blocks, shares)]
                        if not all(lists):
                            continue
                        for root in range(k):
                            order = [root] + [i for i in range(k) if i != root]
                            best = self._product([blocks[i] for i in order], [shares[i] for i in order],
                                                 [lists[i] for i in order], best)
        return best

    def _product(self, blocks, shares, lists, best):
        floor = self.partition_bound(blocks)
        for combo in itertools.product(*lists):
            lb = max(c[0][0] for c in combo) + max(c[0][1] for c in combo) + max(c[0][2] for c in combo)
            if best is not None and lb >= best[0] * (1 - 1e-9):
                continue
            meshes = []
            for p, ((_, choices, layers, bnd), share) in enumerate(zip(combo, shares)):
                part = layout_to_plan(self.model, share, list(choices), layers, self.inv, boundaries=bnd)
                meshes += [dataclasses.replace(m, pipeline=p) for m in part.meshes]
            plan = Plan(model=self.model, global_batch_size=self.gbs, meshes=tuple(meshes),
                        inventory=self.inv.to_dict(), precision=part.precision, pipeline_samples=tuple(shares))
            est = simulate(plan, self.inv, self.cost)
            self.priced += 1
            assert est.iteration_time_s >= lb * (1 - 1e-9), "the product's lower bound is not one"
            self.bound_violations += est.iteration_time_s < floor * (1 - 1e-9)
            if est.fits and (best is None or est.iteration_time_s < best[0]):
                best = (est.iteration_time_s, plan)
        return best

    def groups(self, best):
        for c in self.inv.clusters:
            for _, choices, layers, bnd in self.block_layouts([c.name], self.gbs):
                plan = layout_to_plan(self.model, self.gbs, list(choices), layers, self.inv, boundaries=bnd)
                best = self._groups_of(plan, best)
        return best

    def _groups_of(self, plan, best):
        mesh = plan.meshes[0]
        k, S = mesh.num_stages, mesh.samples_per_step
        for cl in self.inv.clusters:
            free = cl.num_devices - (mesh.num_devices * k if cl.name == mesh.cluster else 0)
            if cl.name != mesh.cluster and self.inv.link(cl.name, mesh.cluster) is None:
                continue
            for tp in tp_degrees(self.model, cl):
                for dp in range(1, free // (tp * k) + 1):
                    for scale in (1, 2, 4, 8):
                        step = S * scale
                        if self.gbs % step:
                            continue
                        for m0 in range(1, step // mesh.dp + 1):
                            rest = step - mesh.dp * m0
                            if rest < dp or rest % dp or max(m0, rest // dp) > 16:
                                continue
                            for rc in ("none", "selective", "full"):
                                if rc == "selective" and not selective_runs(self.model):
                                    continue
                                extra = dataclasses.replace(mesh, cluster=cl.name, device_type=cl.device.name, tp=tp,
                                                            dp=dp, micro_batch_size=rest // dp, recompute=rc,
                                                            setting_overrides=(), alongside=True,
                                                            boundary_schedule="blocking", boundary_depth=0)
                                main = dataclasses.replace(mesh, micro_batch_size=m0)
                                cand = alongside_search.with_group(plan, 0, main, extra, [], scale, self.inv)
                                if cand is None:
                                    break
                                est = simulate(cand, self.inv, self.cost)
                                self.priced += 1
                                if not est.fits:
                                    continue
                                if best is None or est.iteration_time_s < best[0]:
                                    best = (est.iteration_time_s, cand)
                                break
        return best

    def optimum(self):
        best = self.single()
        best = self.pipelines(best)
        return self.groups(best)


def _compositions(n: int, k: int):
    """Every way to write n as an ordered sum of k positive multiples of n / 64 for two parts, n / 32 for more
    (of 1 below that)."""
    g = max(1, n // (64 if k == 2 else 32))
    for cuts in itertools.combinations(range(g, n, g), k - 1):
        yield [b - a for a, b in zip((0,) + cuts, cuts + (n,))]


def shape_of(plan) -> str:
    if plan.is_simple:
        return "1 pipeline " + "+".join(m.cluster for m in plan.meshes)
    if plan.num_pipelines > 1:
        return " | ".join("+".join(plan.meshes[i].cluster for i in plan.pipeline_mesh_indices(p))
                          for p in range(plan.num_pipelines)) + f" {list(plan.samples_per_pipeline)}"
    return "groups " + "+".join(f"{m.cluster}{'*' if m.alongside else ''}" for m in plan.meshes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--draw", type=int, default=2027, help="seed of the random instances")
    args = ap.parse_args()
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    cost = AnalyticCostModel()
    rng = random.Random(args.draw)
    todo = built_instances()
    within = runs = violations = bounded = 0
    worst = 0.0
    done = 0
    print(f"{'#':>2} {'kind':>11} {'clusters':>30} {'model':>16} {'gbs':>3} {'exhaustive s':>12} {'priced':>6} "
          f"{'exh s':>5} {'search s':>9} {'gaps per seed':>24} {'time s':>6}  shape (exhaustive / search)")
    while done < args.instances:
        kind, inv, model, gbs = todo.pop(0) if todo else random_instance(rng)
        t0 = time.perf_counter()
        ex = Exhaustive(model, inv, gbs, cost)
        opt = ex.optimum()
        ex_s = time.perf_counter() - t0
        violations += ex.bound_violations
        bounded += ex.priced
        if opt is None:
            continue
        done += 1
        gaps, secs, found = [], [], None
        for seed in range(args.seeds):
            r = search_shapes(model, inv, gbs, cost, SearchConfig(seed=seed))
            gap = r.iteration_time_s / opt[0] - 1
            gaps.append(gap)
            secs.append(r.seconds)
            found = found or r
            runs += 1
            within += gap <= 0.01
            worst = max(worst, gap)
        desc = " ".join(f"{c.name}:{c.device.name}x{c.num_devices}" for c in inv.clusters)
        print(f"{done:2d} {kind:>11} {desc:>30} {f'{model.num_layers}L/{model.hidden_size}/{model.seq_length}':>16} "
              f"{gbs:3d} {opt[0]:12.4f} {ex.priced:6d} {ex_s:5.1f} {found.iteration_time_s:9.4f} "
              f"{' '.join(f'{g * 100:+.2f}%' for g in gaps):>24} {max(secs):6.2f}  {shape_of(opt[1])} / "
              f"{shape_of(found.plan)}", flush=True)
    print(f"within 1% of the exhaustive optimum: {within} of {runs} runs ({done} instances x {args.seeds} seeds); "
          f"worst gap {worst * 100:+.2f}%")
    print(f"plans priced by the exhaustive enumeration: {bounded}; multi-pipeline plans priced below their "
          f"partition's bound (plan/partition_bound.py): {violations}")


if __name__ == "__main__":
    main()
