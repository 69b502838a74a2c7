"""Whole heterogeneous iterations composed by hetauto's simulator against Sailor's measured runs on three GPU types.

Sailor's validation on its MIT cluster (data/sailor/validation-runs-mit.json: one node of 8 RTX 3090, two of 8
TITAN RTX, three of 8 RTX 2080 Ti; OPT-350, fp32, micro-batch 2): nine runs mixing the GPU types along the
pipeline, inside a stage as data-parallel replicas of different types, or both. Each run is written as a hetauto
plan: every node a cluster of its own, every replica group of a stage a mesh (`alongside` where a stage has
several), the job's settings as benchmarks/sailor_iterations.py takes them (no sequence parallelism, no optimizer
sharding, no overlapped gradient reduction; fp32, which none of these GPUs runs faster on TF32: Turing has none,
the RTX 3090's TF32 peak is its FP32 peak), every pipeline boundary blocking as DeepSpeed's engine runs it (its schedule itself where our simulation of it
plans the layout: `compose`). The
network is Sailor's measurement of that cluster: the all-reduce curves inside a node and between nodes of one
type (network_coeffs_all_homo.json) and the send curves between the nodes (multizone_bandwidths_het.json), fitted
as alpha-beta links over 1 MB - 1 GB messages, and each node's NIC, shared by all its links, as its cluster's
`uplink_gbps` (node_uplink). `plan/simulate.py` (plan/multi_simulate.py for the mixed stages)
composes the iteration: the layers, embedding and head from the learned model of `hetauto fit --sailor` (the TP
all-reduces at the rate the GPUs' layers ran them: LearnedCostModel.tp_link), the 1F1B pipeline and its
boundaries over those links, each mesh's DP reduction and the gradient exchange between the replica groups of a
stage, the optimizer step.

What is in and out of sample: these GPUs were profiled on OPT-350 only, so the learned model's per-layer times of
this model on them are in sample (the fit has them); nothing of the runs themselves (their iteration times, their
gradient-reduction times, their layouts) is fitted into anything, so the composition of whole heterogeneous
iterations is out of sample. The figure to compare with: Sailor's own simulator on the same nine runs (its
validate.py's `simulate_sailor`, github.com/eth-easl/sailor cf2c8e3, run outside this project): MAPE 10.3 %, worst
27.3 % (SAILOR_SIMULATOR below, per run).

Sailor's runtime sums a stage's gradients over its mixed replicas with one all-reduce (NCCL's ring); hetauto's
runtime exchanges them between the replica groups (runtime/replica_sync.py), which is what the composition prices:
the same bytes on each link for two groups and, with the roots taking turns, 1/H of a parameter each way between
any two of H >= 3 groups per phase.

    python benchmarks/sailor_hetero_iterations.py [--measured-layers] [--1f1b] [--json]

--measured-layers composes the runs with the GPUs' own measured layers (in sample, as Sailor's simulator reads
them): the composition's error alone. --1f1b composes every run with Megatron's 1F1B and blocking boundaries
(by default the runs of one mesh per stage run DeepSpeed's engine, as the fork does: `compose`).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import sailor_terms as S  # noqa: E402
from peer_scenarios import HETAUTO, fit_alpha_beta  # noqa: E402
from sailor_iterations import PRECISION, SAILOR_JOB, MeasuredLayers, measured_link  # noqa: E402

from hetauto_megatron.cost import learned as L  # noqa: E402
from hetauto_megatron.cost.learned.sailor import SAILOR_GPUS, SAILOR_MODELS  # noqa: E402
from hetauto_megatron.plan.plan import plan_from_dict  # noqa: E402
from hetauto_megatron.plan.simulate import simulate  # noqa: E402
from hetauto_megatron.spec.inventory import LinkSpec, inventory_from_dict  # noqa: E402

ZONE = "us-central1-a"          # Sailor's name for the MIT cluster's one site
GPUS_PER_NODE = 8               # sailor/Planner/simulations/configs/basic_cluster_config.json
SIZES = [2 ** (k / 2) * 1e6 for k in range(21)]      # 1 MB .. 1 GB
# Sailor's simulator on each run (iteration seconds), as its validate.py prices them (see the docstring).
SAILOR_SIMULATOR = {"mit/N2/plan_config_N2_D1.json": 120.952, "mit/N2/plan_config_N2_D2.json": 81.315,
                    "mit/N3/plan_config_N3_D1.json": 52.108, "mit/N4/plan_config_N4_D1.json": 81.437,
                    "mit/N4/plan_config_N4_D2.json": 67.661, "mit/N4/plan_config_N4_D4.json": 65.988,
                    "mit/N6/plan_config_N6_D2.json": 53.146, "mit/N6/plan_config_N6_D3.json": 52.122,
                    "mit/N6/plan_config_N6_D6.json": 51.441}


def load_runs() -> list[dict]:
    with open(os.path.join(L.SAILOR_DATA, "validation-runs-mit.json")) as f:
        return json.load(f)


@functools.lru_cache(maxsize=None)
def send_link(a: str, b: str, per_node: int) -> dict:
    """The link between a node of GPU type a and one of type b as Sailor measured it (a -> b; the types in name order,
    so one pair of nodes has one link): `per_node` GPU pairs sending at once (the curve of that many GPUs per node:
    the bandwidth of all of them together) for the link, one pair alone for its per-connection rate (`flow_gbps`).
    run_plan reads the curve of the groups' TP up to 4 GPUs, as Sailor's simulator does (`min(tp, 4)`,
    benchmarks/sailor_terms.py): between a TITAN RTX and a 2080 Ti node the 8-GPU curve reads 0.9 Gbit/s where
    the 2- and 4-GPU ones (and the 8-GPU curves inside each type) read 23; every curve of the RTX 3090 node reads
    0.9."""
    gb, lat_us = _fitted_curve(a, b, per_node)
    flow, _ = _fitted_curve(a, b, 1)   # where one pair fills the NIC alone (the same curve for 1 and 8 GPUs), the link's rate
    return {"bandwidth_gbps": round(gb * 8, 3), "latency_ms": lat_us / 1e3, "flow_gbps": round(min(flow, gb) * 8, 3)}


@functools.lru_cache(maxsize=None)
def _fitted_curve(a: str, b: str, n: int) -> tuple[float, float]:
    """(GB/s, latency us) of Sailor's send curve of `n` GPU pairs from a node of type a to one of type b (each curve
    is fitted once: every link of a pair of types reads the one-pair curve for its flow_gbps)."""
    co = S.CURVES[ZONE][a][str(n)][ZONE][b][str(n)][0]
    return fit_alpha_beta([n * S.curve_time(s, co) for s in SIZES], [n * s for s in SIZES])


@functools.lru_cache(maxsize=None)
def node_uplink(gpu: str) -> float:
    """Gbit/s a node of type `gpu` sends at, over all its links together (its NIC): the fastest any of Sailor's
    send curves from such a node reads, to a node of any type, with any number of GPUs sending (each curve is
    that node's NIC's bandwidth or less, so the fastest is the closest to it). The RTX 3090 node's curves all
    read 0.8 Gbit/s; the TITAN RTX and 2080 Ti nodes' reach 24."""
    best = 0.0
    for other in SAILOR_GPUS:
        for n in (1, 2, 4, 8):
            try:
                best = max(best, send_link(*sorted((gpu, other)), n)["bandwidth_gbps"])
            except KeyError:        # a curve Sailor did not measure
                continue
    return float(best)


def run_plan(run: dict) -> tuple[dict, dict]:
    """(plan dict, inventory dict) of one run: a cluster per node, a mesh per replica group."""
    model = SAILOR_MODELS[run["model"]].replace(tie_embeddings=False)     # the fork's OPT: its head is its own layer
    p = len(run["stages"])
    clusters, meshes, used = [], [], {}
    for i, st in enumerate(run["stages"]):
        layers = st["entries"] - (i == 0) - (i == p - 1)                    # the embedding and head are entries
        for k, rep in enumerate(st["replicas"]):
            gpu, tp = rep["gpu"], rep["tp"]
            used[gpu] = used.get(gpu, 0) + 1
            name = f"{SAILOR_GPUS[gpu]}-{used[gpu]}"
            clusters.append({"name": name, "device": SAILOR_GPUS[gpu], "nodes": 1, "devices_per_node": GPUS_PER_NODE,
                             "intra_node": measured_link("intra", tp, tp, gpu),
                             "inter_node": measured_link("inter", tp, 2, gpu), "uplink_gbps": node_uplink(gpu),
                             "_gpu": gpu, "_tp": tp})
            meshes.append({"cluster": name, "device_type": SAILOR_GPUS[gpu], "tp": tp, "dp": 1,
                           "micro_batch_size": run["micro_batch_size"], "recompute": "none",
                           "stage_layers": [layers], "settings": dict(SAILOR_JOB),
                           **({"alongside": True} if k else {})})
    links = []
    for x in range(len(clusters)):
        for y in range(x + 1, len(clusters)):
            a, b = clusters[x], clusters[y]
            links.append({"between": [a["name"], b["name"]],
                          **send_link(*sorted((a["_gpu"], b["_gpu"])), min(a["_tp"], b["_tp"], 4))})
    inv = {"clusters": [{k: v for k, v in c.items() if not k.startswith("_")} for c in clusters], "links": links}
    plan = {"version": 4, "model": model.to_dict(), "global_batch_size": run["global_batch_size"],
            "precision": PRECISION, "meshes": meshes, "inventory": inv}
    return plan, inv


def intra_link(gpu: str, tp: int) -> LinkSpec:
    """The link inside a node that run_plan gives a cluster of `gpu` at TP `tp`, as a LinkSpec."""
    x = measured_link("intra", tp, tp, gpu)
    return LinkSpec(x["bandwidth_gbps"], x["latency_us"] * 1e-6)


def compose(cost_model, measured_layers: bool = False, megatron: bool = False) -> list[dict]:
    """Per run: measured and predicted iteration and the predicted parts. The pipeline is DeepSpeed's, the engine
    the fork trains with (plan/deepspeed_schedule.py: every transfer blocking both ends in turn, TP-partitioned
    sends and their all-gathers, the DP reduction after the last backward), where our simulation of that engine
    plans the layout (one mesh per stage: the runs without replica groups side by side); the others, and all with
    `megatron`, as Megatron's 1F1B with blocking boundaries. `measured_layers`: the diagnostic of the composition
    alone, each GPU's own measured OPT-350 layers, embedding and head (Sailor's profile at the run's TP and
    micro-batch) in place of the learned ones, the layer times Sailor's simulator reads."""
    if measured_layers:
        cost_model = MeasuredLayers(cost_model, "OPT-350", {v: k for k, v in SAILOR_GPUS.items()}, intra_link)
    rows = []
    for run in load_runs():
        plan_d, inv_d = run_plan(run)
        plan, inv = plan_from_dict(plan_d), inventory_from_dict(inv_d)
        e = simulate(plan, inv, cost_model, engine="deepspeed" if plan.is_simple and not megatron else "megatron")
        rows.append({"file": run["file"], "nodes": run["nodes"], "layout": describe(run),
                     "micro_batches": plan.num_micro_batches if plan.is_simple else None,
                     "measured_s": run["measured_iteration_s"], "predicted_s": e.iteration_time_s,
                     "sailor_s": SAILOR_SIMULATOR.get(run["file"]), "pipeline_s": e.pipeline_s,
                     "dp_s": e.dp_exposed_s, "sync_s": e.sync_s, "measured_red_grads_s": run["measured_red_grads_s"],
                     "max_groups": max(len(s["replicas"]) for s in run["stages"])})
    return rows


def describe(run: dict) -> str:
    short = {"RTX-3090": "3090", "Titan-RTX": "Titan", "RTX-2080": "2080Ti"}
    return " | ".join(f"{st['entries']}: " + "+".join(short[r["gpu"]] for r in st["replicas"])
                      for st in run["stages"])


def pct(a: float, b: float) -> float:
    return 100.0 * (a / b - 1.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured-layers", action="store_true",
                    help="the GPUs' own measured layers in place of the learned ones (in sample: the composition alone)")
    ap.add_argument("--1f1b", dest="one_f_one_b", action="store_true",
                    help="compose with Megatron's 1F1B instead of DeepSpeed's pipeline schedule")
    ap.add_argument("--json", action="store_true", help="the runs and figures as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "model")
        subprocess.run(HETAUTO + ["fit", "--sailor", "-o", out], cwd=ROOT, check=True, capture_output=True)
        rows = compose(L.LearnedCostModel(out), args.measured_layers, args.one_f_one_b)
    ours = [abs(pct(r["predicted_s"], r["measured_s"])) for r in rows]
    theirs = [abs(pct(r["sailor_s"], r["measured_s"])) for r in rows]
    if args.json:
        print(json.dumps({"runs": rows, "mape_pct": sum(ours) / len(ours), "worst_pct": max(ours),
                          "sailor_mape_pct": sum(theirs) / len(theirs), "sailor_worst_pct": max(theirs)}))
        return 0
    print(f"{'run':<30} {'stages (entries: replica groups)':<44} {'measured s':>10} {'ours s':>8} {'err %':>6} "
          f"{'Sailor s':>8} {'err %':>6}  ours: pipeline / DP / sync s (measured gradient reduction s)")
    for r in rows:
        print(f"{r['file']:<30} {r['layout']:<44} {r['measured_s']:>10.2f} {r['predicted_s']:>8.2f} "
              f"{pct(r['predicted_s'], r['measured_s']):>+6.1f} {r['sailor_s']:>8.2f} "
              f"{pct(r['sailor_s'], r['measured_s']):>+6.1f}  {r['pipeline_s']:.2f} / {r['dp_s']:.2f} / "
              f"{r['sync_s']:.2f} ({r['measured_red_grads_s']:.2f})")
    print(f"\nwhole heterogeneous iterations, {len(rows)} runs: ours MAPE {sum(ours) / len(ours):.1f} %, worst "
          f"{max(ours):.1f} %; Sailor's simulator MAPE {sum(theirs) / len(theirs):.1f} %, worst {max(theirs):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
