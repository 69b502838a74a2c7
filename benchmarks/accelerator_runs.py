"""hetauto's runtime on one accelerator, measured, against the cost and memory model's predictions.

Two halves, so that the comparison runs anywhere once the measurement exists:

1. `--measure` (on a machine with the accelerator; torch and Megatron-Core): for each configuration below, a
   one-device plan of the model is trained by hetauto's runtime (runtime/train.py, the code the dry runs run,
   here on the device: the plan's precision, bf16 parameters with fp32 main parameters and fp32 gradient
   buffers, Megatron's DDP and distributed optimizer, the plan's recomputation) for a few steps. Each run is its
   own process, alone on the device. Measured: the tensors' bytes (weights, gradient buffer, optimizer state:
   runtime/memory_meter.py; activations as the saved-tensor peak through the step), the caching allocator's
   peak of allocated and reserved bytes over the run, the device's bytes in use at the end (cudaMemGetInfo:
   context, collective buffers and the allocator's cache included), the runtime's context before any tensor,
   and the step times. Also measured once: the element-wise facts of the layers that run there (whether
   torch's RMSNorm is one fused kernel on that device, which changes what it keeps for the backward pass).
   Writes one JSON file.
2. The comparison (torch-free): the memory model (cost/memory.py) for the same stage as the runtime's layers
   keep activations on the device (Megatron's local spec: unfused attention, rope and GLU; the norm as
   measured), at the plan's precision and runtime settings; the runtime overheads as the vendor's documented
   estimates, and as measured by `hetauto profile --overheads` when --overheads gives that file. The time model
   (analytic, without flash attention, as the local spec's attention runs) for the iteration.
   Prints, per run, predicted against measured: each tensor part, the allocator's peak against the tensors
   the model prices (state + activations + transients), the device's bytes in use against the model's total
   (with the overheads), and the iteration time. Targets: the tensor parts and the allocator peak within 10 %.

    python benchmarks/accelerator_runs.py --measure --device-type h200 -o runtime-h200.json   # on the device
    python benchmarks/accelerator_runs.py --measured hetauto_megatron/data/h200/runtime-h200.json \\
        [--overheads hetauto_megatron/data/h200/overheads-h200.json] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hetauto_megatron.plan.plan_file import plan_from_dict  # noqa: E402

GIB = 1024 ** 3
TARGET = 0.10

# A LLaMA-style model (RMSNorm, SwiGLU, RoPE, GQA, untied) and a GPT-style one (LayerNorm, GELU, learned
# positions, tied table), sized so one step takes a fraction of a second on a current accelerator.
MODELS = {
    "llama-1b": dict(name="llama-1b", num_layers=16, hidden_size=2048, num_attention_heads=16, num_query_groups=8,
                     ffn_hidden_size=5632, vocab_size=32000, seq_length=2048, max_position_embeddings=2048,
                     gated_mlp=True, tie_embeddings=False, position_embedding="rope"),
    "gpt-760m": dict(name="gpt-760m", num_layers=24, hidden_size=1536, num_attention_heads=16, num_query_groups=16,
                     ffn_hidden_size=6144, vocab_size=50257, seq_length=1024, max_position_embeddings=1024,
                     gated_mlp=False, tie_embeddings=True, position_embedding="learned"),
}
# (model, micro-batch size, recomputation, global batch, precision). The GPT-style model recomputes whole layers:
# Megatron-Core 0.19 cannot run selective (the MLP) with linear biases (plan/engines.py selective_runs; the H200
# record left that run, then the fifth, out)
RUNS = [("llama-1b", 1, "none", 8, "bf16"), ("llama-1b", 2, "none", 8, "bf16"),
        ("llama-1b", 4, "selective", 8, "bf16"), ("llama-1b", 4, "full", 8, "bf16"),
        ("gpt-760m", 4, "none", 16, "bf16"), ("gpt-760m", 8, "full", 16, "bf16"),
        ("llama-1b", 1, "none", 4, "fp32")]


def one_device_plan(device_type: str, model: dict, mbs: int, recompute: str, gbs: int, precision: str = "bf16"):
    """A plan of one mesh of one device, the production runtime settings (plan/settings.py defaults)."""
    return plan_from_dict({
        "version": 4, "model": model, "global_batch_size": gbs, "precision": precision,
        "meshes": [{"cluster": "one", "device_type": device_type, "tp": 1, "dp": 1, "micro_batch_size": mbs,
                    "recompute": recompute, "stage_layers": [model["num_layers"]]}],
        "inventory": {"clusters": [{"name": "one", "device": device_type, "nodes": 1, "devices_per_node": 1}],
                      "links": []}})


# ---- 1. on the device ------------------------------------------------------------------------------------------
def saved_bytes(fn):
    """(fn(), the storage bytes of every tensor autograd saves for the backward pass while it runs, once per save).
    Not runtime/memory_meter.py's SavedTensorMeter, which counts each storage once: the recorded facts count per
    save."""
    import torch

    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.untyped_storage().nbytes()) or t,
                                                  lambda t: t):
        out = fn()
    return out, sum(saved)


def _device_facts(rank: int, world_size: int) -> dict:
    """What the layers that run on this device keep for the backward pass where torch picks the kernel."""
    import torch

    x = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y, rms_saved = saved_bytes(lambda: torch.nn.functional.rms_norm(x, (64,), w))
    z, ln_saved = saved_bytes(lambda: torch.nn.functional.layer_norm(x, (64,), w))
    return {"torch": torch.__version__, "device_name": torch.cuda.get_device_name(),
            "layer_norm_grad_fn": type(z.grad_fn).__name__, "layer_norm_saved_bytes": ln_saved,
            "device_memory": torch.cuda.get_device_properties(0).total_memory,
            "rms_norm_grad_fn": type(y.grad_fn).__name__, "rms_norm_saved_bytes": rms_saved}


def _train_with_breakdown(rank: int, world_size: int, plan, steps: int) -> dict:
    """train_rank, with the first step's saved tensors also tallied by where they were saved (the innermost
    Megatron or torch.nn frame), their dtype and size: what to look at when a part is off."""
    import collections
    import traceback

    from hetauto_megatron.runtime import memory_meter
    from hetauto_megatron.runtime.train import train_rank

    tally = collections.Counter()
    pack = memory_meter.SavedTensorMeter._pack

    def tallying_pack(meter, t):
        st = t.untyped_storage()
        if st.nbytes() and st.data_ptr() not in meter.exclude and st.data_ptr() not in meter.refs:
            frames = [f for f in traceback.extract_stack(limit=12)[:-1]
                      if "/megatron/" in f.filename or "/torch/nn/" in f.filename]
            where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].name}" if frames else "?"
            tally[(where, str(t.dtype).replace("torch.", ""), st.nbytes())] += 1
        return pack(meter, t)

    memory_meter.SavedTensorMeter._pack = tallying_pack
    out = train_rank(rank, world_size, plan, steps, 1234, 300.0, False)
    out["saved_by_site"] = [[*k, n] for k, n in sorted(tally.items(), key=lambda kv: -kv[0][2] * kv[1])]
    return out


def measure(device_type: str, steps: int, runs, output: str | None = None) -> dict:
    from hetauto_megatron.runtime.launcher import launch

    # Megatron-Core is imported in each child, not here: importing it initialises CUDA, which a forked child
    # cannot use then
    out = {"device_type": device_type, "steps": steps,
           "facts": launch(_device_facts, 1, timeout_s=300)[0], "runs": []}
    print(f"device: {out['facts']}", flush=True)
    for name, mbs, recompute, gbs, precision in runs:
        plan = one_device_plan(device_type, MODELS[name], mbs, recompute, gbs, precision)
        r = launch(_train_with_breakdown, 1, args=(plan, steps), timeout_s=1200)[0]
        row = {"model": name, "micro_batch_size": mbs, "recompute": recompute, "global_batch_size": gbs,
               "precision": plan.precision, "step_times_s": r["step_times"], "losses": r["losses"],
               "memory": r["memory"], "settings": r["settings"], "saved_by_site": r["saved_by_site"]}
        out["runs"].append(row)
        print(json.dumps({k: row[k] for k in ("model", "micro_batch_size", "recompute", "step_times_s", "memory")}),
              flush=True)
        if output:              # after every run: a later one that fails or runs out of time keeps these
            with open(output, "w") as fh:
                json.dump(out, fh, indent=1)
    return out


# ---- 2. the comparison -------------------------------------------------------------------------------------------
def layer_impl(facts: dict):
    """How Megatron's local spec keeps activations on the device: unfused attention, rope and GLU (as on CPU),
    a 1-byte dropout mask; torch's RMSNorm is one kernel keeping its input and a statistic where the device's
    torch runs it fused (its autograd node says so), else the composite CPU one."""
    from hetauto_megatron.cost.activations import DRY_RUN_IMPL
    import dataclasses

    fused = "fused" in facts.get("rms_norm_grad_fn", "").lower()
    return dataclasses.replace(DRY_RUN_IMPL, fused_norm=fused, dropout_mask_bytes=1)


def predict(device_type: str, row: dict, facts: dict, overheads=None, cost_model=None) -> dict:
    from hetauto_megatron.cost.analytic import AnalyticCostModel
    from hetauto_megatron.cost.memory import stage_memory_bytes
    from hetauto_megatron.plan.simulate import simulate
    from hetauto_megatron.spec.inventory import inventory_from_dict
    from hetauto_megatron.spec.overheads import vendor_overhead

    plan = one_device_plan(device_type, MODELS[row["model"]], row["micro_batch_size"], row["recompute"],
                           row["global_batch_size"], row["precision"])
    inv = inventory_from_dict(plan.inventory)
    dev = inv.clusters[0].device.at_precision(plan.precision)
    mesh = plan.meshes[0]
    vendor = vendor_overhead(dev.vendor)
    out = {}
    for label, overhead in [("vendor", vendor)] + ([("measured", overheads)] if overheads else []):
        b = stage_memory_bytes(plan.model.replace(vocab_size=plan.padded_vocab_size), layers=mesh.stage_layers[0],
                               tp=1, dp=1, micro_batch_size=mesh.micro_batch_size, recompute=mesh.recompute,
                               in_flight=1, first=True, last=True, settings=mesh.settings, vendor=dev.vendor,
                               dtype_bytes=dev.dtype_bytes, impl=layer_impl(facts), overhead=overhead,
                               precision=plan.precision)
        out[label] = b
    est = simulate(plan, inv, AnalyticCostModel(flash_attention=False, sequence_parallel=False))
    learned = simulate(plan, inv, cost_model).iteration_time_s if cost_model is not None else None
    return {"memory": out, "iteration_s": est.iteration_time_s, "learned_iteration_s": learned}


def compare(measured: dict, overheads: str | None, cost_model=None) -> list[dict]:
    """`overheads`: the file 'hetauto profile --overheads' wrote (its missing figures the vendor's), or None."""
    from hetauto_megatron.spec.devices import get_device
    from hetauto_megatron.spec.overheads import overhead_from_value
    if overheads:
        overheads = overhead_from_value(overheads, device=get_device(measured["device_type"]), file=None,
                                        field="--overheads")
    rows = []
    for row in measured["runs"]:
        p = predict(measured["device_type"], row, measured["facts"], overheads, cost_model)
        m, b = row["memory"], p["memory"]["vendor"]
        dev = m["device"]
        state = m["weights"] + m["gradients"] + m["optimizer"]
        times = row["step_times_s"][2:] or row["step_times_s"]
        entry = {"run": f"{row['model']} mbs {row['micro_batch_size']} {row['recompute']} {row['precision']}",
                 "parts": {k: (b[k], m[k]) for k in ("weights", "gradients", "optimizer")}
                 | {"activations": (b["activations_saved"], m["activations"])},
                 # the allocator's peak over the run: the state, the activations and their transients, or what
                 # the gradient reduction or the optimizer's step hold above them once the activations are gone
                 "allocated_peak": (b["weights_grads_optimizer"] + b["activations"] + b["gradient_reduction"]
                                    + b["optimizer_step"], dev["allocated_peak"]),
                 "measured_state": state,
                 "in_use": {k: (v["total"], dev["in_use"]) for k, v in p["memory"].items()},
                 "context_gib": dev["context"] / GIB,
                 "fragmentation": dev["reserved_peak"] / dev["allocated_peak"] - 1,
                 "iteration_s": (p["iteration_s"], statistics.median(times)),
                 "learned_iteration_s": p["learned_iteration_s"]}
        rows.append(entry)
    return rows


def err(pred: float, got: float) -> float:
    return (pred - got) / got if got else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true", help="run the configurations on this machine's device")
    ap.add_argument("--device-type", default="h200", help="catalog type of this machine's device (with --measure)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="with --measure: the first two runs only")
    ap.add_argument("--runs", help="with --measure: these runs only (indices into RUNS, e.g. 0,2,4)")
    ap.add_argument("-o", "--output", help="with --measure: write the measurement here")
    ap.add_argument("--measured", help="a measurement file (--measure's output) to compare with the model")
    ap.add_argument("--overheads", help="the device's overheads file from 'hetauto profile --overheads'")
    ap.add_argument("--cost-model", metavar="DIR", help="a learned cost model ('hetauto fit') whose iteration "
                                                       "times to print beside the analytic model's")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.measure:
        runs = [RUNS[int(i)] for i in a.runs.split(",")] if a.runs else RUNS[:2] if a.quick else RUNS
        data = measure(a.device_type, a.steps, runs, a.output)
    elif a.measured:
        with open(a.measured) as fh:
            data = json.load(fh)
    else:
        ap.error("give --measure (on the device) or --measured FILE")
    cost_model = None
    if a.cost_model:
        from hetauto_megatron.cost.learned.model import load_cost_model
        cost_model = load_cost_model(a.cost_model)
    rows = compare(data, a.overheads, cost_model)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    f = data["facts"]
    print(f"{f['device_name']} ({data['device_type']}), torch {f['torch']}; RMSNorm backward node "
          f"{f['rms_norm_grad_fn']}; {data['steps']} steps per run")
    worst = 0.0
    for r in rows:
        print(f"\n{r['run']}")
        for k, (pred, got) in r["parts"].items():
            e = err(pred, got)
            worst = max(worst, abs(e))
            print(f"  {k:<12} predicted {pred / GIB:7.3f} GiB  measured {got / GIB:7.3f} GiB  {e:+6.1%}")
        pred, got = r["allocated_peak"]
        worst = max(worst, abs(err(pred, got)))
        print(f"  {'alloc peak':<12} predicted {pred / GIB:7.3f} GiB  measured {got / GIB:7.3f} GiB  "
              f"{err(pred, got):+6.1%}  (state + activations + transients)")
        for label, (pred, got) in r["in_use"].items():
            print(f"  {'in use':<12} predicted {pred / GIB:7.3f} GiB  measured {got / GIB:7.3f} GiB  "
                  f"{err(pred, got):+6.1%}  (overheads: {label})")
        print(f"  context {r['context_gib']:.2f} GiB, allocator reserved/allocated - 1 = {r['fragmentation']:+.1%}")
        pred, got = r["iteration_s"]
        print(f"  iteration  predicted {pred:.3f} s  measured {got:.3f} s  {err(pred, got):+6.1%} "
              "(analytic, attention without flash)")
        if r["learned_iteration_s"] is not None:
            pred = r["learned_iteration_s"]
            print(f"  iteration  predicted {pred:.3f} s  measured {got:.3f} s  {err(pred, got):+6.1%} (learned)")
    print(f"\nworst tensor or allocator-peak error {worst:.1%} (target {TARGET:.0%})")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
