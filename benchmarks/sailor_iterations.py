"""Whole iterations composed by hetauto's simulator against Sailor's measured GH200 runs, leave one model out.

For every measured run of data/sailor/validation-runs.json (Sailor's validation on the Clariden GH200 cluster,
OPT-350 and GPT-Neo-2.7), the learned model is fitted as `hetauto fit --sailor` fits it, on the packaged Sailor
data without the run's model (every GPU's rows of that model removed), and `plan/simulate.py` composes the run's
real layout with it: the embedding and head, the 1F1B pipeline with its flush, the TP all-reduces, the DP
gradient all-reduce over the nodes' network, the optimizer step and the fixed per-iteration cost. The embedding
and the output layer are not tied: the fork's OPT builds its head as a layer of its own (megatron/model/opt_model.py,
OPTLMHeadPipe), so no tied table is summed across stages. The fork's GPT-Neo has no output layer at all (its last layer is
the final norm, and its loss takes the cross-entropy over the norm's output: gpt_neo_model.py), and the model says so
(SAILOR_MODELS, ModelSpec.output_layer): its last stage runs no logits GEMM and holds and updates no vocabulary-wide
weights. The job's settings are Sailor's (benchmarks/memory_sailor.py): no sequence parallelism, no
optimizer sharding, no overlapped gradient reduction, and fp32 as the job trained (no --fp16 or --bf16, no fp16
section in its DeepSpeed config) inside NVIDIA's PyTorch container, whose TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 ran its
GEMMs on the TF32 tensor cores (docs/peers.md): the plans are fp32 and the cluster says `tf32: true`, so the learned
model prices the GH200 from its tensor-core runs (cost/learned/model.py, `coverage`), while every transfer,
all-reduce and all-gather moves the 4-byte elements DeepSpeed sent (docs/deepspeed.md) and the optimizer step keeps
no separate fp32 master copy. The cluster: 4 GH200 per node, the inventory's default network (one 200 Gbit/s NIC per
GPU, as on Clariden), with the links inside and between nodes as Sailor measured them (measured_link). Nothing is
fitted to the runs.

The pipeline is DeepSpeed's (plan/deepspeed_schedule.py): the fork trains with DeepSpeed's pipeline engine; `--1f1b`
composes the same runs with Megatron's 1F1B instead. `--measured-layers` is a diagnostic of the composition alone,
in sample: the run's model's own measured layer, embedding and head times (Sailor's profile at the run's TP and
micro-batch) in place of the learned ones.

A run whose recorded layout does not hold its model's layers is listed and left out (GPT-Neo N4 D4 records
OPT-350's 26 entries for GPT-Neo's 34).

    python benchmarks/sailor_iterations.py [--1f1b] [--measured-layers]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hetauto_megatron.cost import comm  # noqa: E402
from hetauto_megatron.cost import learned as L  # noqa: E402
from hetauto_megatron.cost.learned.sailor import SAILOR_MODELS  # noqa: E402
from hetauto_megatron.cost.learned.sailor_links import fit_ring_allreduce  # noqa: E402
from hetauto_megatron.cost.sailor_job import SAILOR_ELEMENT_BYTES, SAILOR_JOB_PRECISION  # noqa: E402
from hetauto_megatron.plan.costing import tp_collective_link  # noqa: E402
from hetauto_megatron.plan.plan import Mesh, Plan  # noqa: E402
from hetauto_megatron.plan.simulate import simulate  # noqa: E402
from hetauto_megatron.spec.inventory import inventory_from_dict  # noqa: E402

SAILOR_JOB = {"sequence_parallel": False, "distributed_optimizer": False, "overlap_grad_reduce": False}
SAILOR_SIMULATOR_MAPE = 8.9    # Sailor's own simulator on its OPT-350 runs (the figure)
PRECISION = SAILOR_JOB_PRECISION   # the job's: fp32 storage and transfers, GEMMs on TF32 (the inventory's tf32)


def load_runs() -> list[dict]:
    with open(os.path.join(L.SAILOR_DATA, "validation-runs.json")) as f:
        return json.load(f)


def fit_without(model_name: str, out_dir: str) -> L.LearnedCostModel:
    """`hetauto fit --sailor` on the packaged data with every row of `model_name` removed."""
    data = os.path.join(out_dir, "data")
    os.makedirs(data, exist_ok=True)
    for f in ("intra_node_bandwidths.json", "llm_info.json"):
        shutil.copy(os.path.join(L.SAILOR_DATA, f), data)
    with open(os.path.join(L.SAILOR_DATA, "profiles_tmp.json")) as f:
        prof = json.load(f)
    with open(os.path.join(data, "profiles_tmp.json"), "w") as f:
        json.dump({k: v for k, v in prof.items() if k != model_name}, f)
    L.fit([], os.path.join(out_dir, "model"), sailor_dir=data, holdout=0.0)
    return L.LearnedCostModel(os.path.join(out_dir, "model"))


@functools.lru_cache(maxsize=None)
def measured_link(kind: str, per_node: int, n: int, gpu: str = "GH-96") -> dict:
    """A link as Sailor measured it (network_coeffs_all_homo.json: the all-reduce bandwidth inside a node, `kind`
    "intra", or between nodes, "inter", with `per_node` GPUs of each node taking part), for an all-reduce of `n`
    ranks, as the inventory's alpha-beta entry:
    bandwidth and latency of least absolute log error against Sailor's curve for messages of 1 MB to 1 GB (a grid,
    0.5 us and 0.5 GB/s steps).
    The curve is read at the whole message, as Sailor measured it (cost/learned/sailor_links.py sailor_allreduce_s).
    - intra (GH200, 4 GPUs): 228 GB/s, 2.5 us (206 GB/s, 8 us read at the ring's chunk, as Sailor's simulator reads
      it). The learned layer times were fitted with this curve's all-reduces set apart, so the planner must add them
      back at the same speed; the catalog's NVLink figure (450 GB/s) is about twice as fast at these sizes.
    - inter (GH200, one GPU per node, as each DP ring of a TP 4 layout has; 2 nodes): 23 GB/s, 26 us (the
      inventory's default: 25 GB/s, 10 us)."""
    with open(os.path.join(L.SAILOR_DATA, "network_coeffs_all_homo.json")) as f:
        curve = json.load(f)[kind][gpu][str(per_node)]
    fits = {str(n): curve}     # fit_ring_allreduce looks the curve up by the group's size
    bw, lat_us = fit_ring_allreduce(fits, n, [2 ** (k / 2) * 1e6 for k in range(21)], max_latency_us=200)
    return {"bandwidth_gbps": bw * 8 / 1e9, "latency_us": lat_us}


def run_plan(run: dict) -> tuple[Plan, object] | None:
    """The run as a hetauto plan on its cluster (None when its recorded layout does not hold the model)."""
    model = SAILOR_MODELS[run["model"]].replace(tie_embeddings=False)     # as the fork builds them (see above)
    entries = run["stage_layers"]
    if sum(entries) != model.num_layers + 2:
        return None
    p = len(entries)
    layers = tuple(n - (i == 0) - (i == p - 1) for i, n in enumerate(entries))   # embedding, head: not layers
    inv = inventory_from_dict({"clusters": [{"name": "clariden", "device": "gh200", "nodes": run["nodes"],
                                             "devices_per_node": 4, "tf32": True,    # the job's TF32 GEMMs
                                             "intra_node": measured_link("intra", 4, 4),
                                             "inter_node": measured_link("inter", 1, 2)}]})
    mesh = Mesh("clariden", "gh200", run["tp"][0], run["dp"][0], run["micro_batch_size"], "none", layers, SAILOR_JOB)
    return Plan(model=model, global_batch_size=run["global_batch_size"], meshes=(mesh,), inventory=inv.to_dict(),
                precision=PRECISION), inv


class MeasuredLayers:
    """Diagnostic (in sample): the learned model with the transformer layers, the embedding and the head replaced
    by Sailor's measured times of `sailor_model` at the asked TP and micro-batch (the median layer), on the Sailor
    GPU each catalog device stands for (`gpus`: {device name: Sailor GPU}); its TP all-reduces, which the planner adds
    back on the link its TP collectives run on (costing.tp_collective_link of the cluster's link inside a node,
    `intra_node(gpu, tp)`, a LinkSpec), taken out on that link in the job's element, SAILOR_ELEMENT_BYTES, as the fit
    takes them out."""

    def __init__(self, cost_model, sailor_model: str, gpus: dict, intra_node):
        self.cost_model, self.gpus, self.intra_node = cost_model, gpus, intra_node
        with open(os.path.join(L.SAILOR_DATA, "profiles_tmp.json")) as f:
            self.entries = json.load(f)[sailor_model]

    def __getattr__(self, name):
        if name.startswith("__") or name == "cost_model":     # copy.copy looks these up before __init__ has run
            raise AttributeError(name)
        return getattr(self.cost_model, name)

    def _entries(self, device, tp: int, mb: int) -> list:
        e = self.entries[self.gpus[device.name]][str(mb)][str(tp)]
        return [e[str(i)] for i in range(len(e))]

    def layer_times(self, model, device, tp, mb, seq=None):
        layers = self._entries(device, tp, mb)[1:-1]
        nbytes = SAILOR_ELEMENT_BYTES * mb * model.seq_length * model.hidden_size
        link = tp_collective_link(self.cost_model, device, tp, self.intra_node(self.gpus[device.name], tp), nbytes)
        ar = comm.allreduce_time(nbytes, tp, link)
        med = lambda xs: sorted(xs)[len(xs) // 2]
        return med([x[0] for x in layers]) - 2 * ar, med([x[1] for x in layers]) - 2 * ar

    def embedding_times(self, model, device, tp, mb, seq=None):
        return tuple(self._entries(device, tp, mb)[0][:2])

    def head_times(self, model, device, tp, mb, seq=None):
        return tuple(self._entries(device, tp, mb)[-1][:2])


def whole_iterations(workdir: str, engine: str = "deepspeed", measured_layers: bool = False
                     ) -> tuple[list[dict], list[dict]]:
    """(rows, skipped): per run, measured and predicted iteration and the predicted parts, each model left out.
    `engine`: the pipeline schedule (the fork's: DeepSpeed's); `measured_layers`: the in-sample diagnostic above."""
    runs = load_runs()
    rows, skipped = [], []
    for held in sorted({r["model"] for r in runs}):
        cm = fit_without(held, os.path.join(workdir, held))
        for r in runs:
            if r["model"] != held:
                continue
            built = run_plan(r)
            if built is None:
                skipped.append(r)
                continue
            plan, inv = built
            intra = inv.clusters[0].intra_node
            model = MeasuredLayers(cm, held, {"gh200": "GH-96"}, lambda gpu, tp: intra) if measured_layers else cm
            e = simulate(plan, inv, model, engine=engine)
            rows.append({"run": r, "micro_batches": plan.num_micro_batches, "measured_s": r["measured_iteration_s"],
                         "predicted_s": e.iteration_time_s, "pipeline_s": e.pipeline_s, "dp_s": e.dp_exposed_s,
                         "optimizer_s": e.optimizer_s, "sync_s": e.sync_s, "cost_model": e.cost_model})
    return rows, skipped


def error_pct(row: dict) -> float:
    return 100.0 * (row["predicted_s"] / row["measured_s"] - 1.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--1f1b", dest="one_f_one_b", action="store_true",
                    help="compose with Megatron's 1F1B instead of DeepSpeed's pipeline schedule")
    ap.add_argument("--measured-layers", action="store_true",
                    help="the run's model's own measured layers, embedding and head (in sample: the composition alone)")
    args = ap.parse_args()
    engine = "megatron" if args.one_f_one_b else "deepspeed"
    with tempfile.TemporaryDirectory() as tmp:
        rows, skipped = whole_iterations(tmp, engine, args.measured_layers)
    print(f"{'model':<12} {'nodes':>5} {'entries per stage':<26} {'tp':>2} {'dp':>3} {'mbs':>3} {'m':>4} "
          f"{'measured s':>10} {'predicted s':>11} {'error %':>8}  pipeline / dp / optimizer / sync s")
    for x in rows:
        r = x["run"]
        print(f"{r['model']:<12} {r['nodes']:>5} {str(r['stage_layers']):<26} {r['tp'][0]:>2} {r['dp'][0]:>3} "
              f"{r['micro_batch_size']:>3} {x['micro_batches']:>4} {x['measured_s']:>10.4f} {x['predicted_s']:>11.4f} "
              f"{error_pct(x):>+8.1f}  {x['pipeline_s']:.3f} / {x['dp_s']:.3f} / {x['optimizer_s']:.4f} / "
              f"{x['sync_s']:.4f}")
    for r in skipped:
        print(f"left out: {r['model']} {r['file']}: {sum(r['stage_layers'])} layer entries recorded, the model has "
              f"{SAILOR_MODELS[r['model']].num_layers + 2}")
    groups = {"all": rows, **{m: [x for x in rows if x["run"]["model"] == m] for m in sorted({x["run"]["model"]
                                                                                                 for x in rows})},
              "1-2 micro-batches or 1 node": [x for x in rows if x["micro_batches"] <= 2 or x["run"]["nodes"] == 1],
              "micro-batch size 1-2": [x for x in rows if x["run"]["micro_batch_size"] <= 2],
              "micro-batch size 4-8": [x for x in rows if x["run"]["micro_batch_size"] >= 4]}
    what = ("the run's model's own measured layers (in sample)" if args.measured_layers
            else "learned model fitted without the run's model")
    print(f"\nwhole-iteration error, pipeline of {engine}, {what}:")
    for name, sel in groups.items():
        errs = [abs(error_pct(x)) for x in sel]
        print(f"  {name:<28} {len(sel):>3} runs  MAPE {sum(errs) / len(errs):5.1f} %  worst {max(errs):5.1f} %")
    print(f"target: MAPE <= {SAILOR_SIMULATOR_MAPE} % (Sailor's own simulator on its OPT-350 runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
