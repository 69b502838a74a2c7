"""The peer scenarios (issues 12 and 14): 16 A100-40 + 16 V100-16, OPT-350M and GPT-Neo-2.7B, global batch 1024 x
2048 tokens, fp32, same zone and cross-region (examples/peers/). For each model x network: our plan (`hetauto plan
--precision fp32 --cost-model <fitted on the packaged Sailor data> --memory-job sailor-deepspeed`), with and
without the new shapes when the planner has them (`--shapes simple|all`), planned for DeepSpeed's pipeline engine
(`--engine deepspeed`: Sailor's measured jobs ran its Megatron-DeepSpeed fork, i.e. that engine), and the peers'
plans, each priced
  - by our simulator (plan/simulate.py, plan/multi_simulate.py): iteration time, it/s, memory per stage vs capacity;
  - by Sailor's simulator terms (benchmarks/sailor_terms.py, docs/peers.md): it/s and whether every stage fits.
The peers' plans are the ones their own planners chose, run from Sailor's artifact (benchmarks/peer_plans.json: the
plans as data, with repository, commit, command and the it/s Sailor's simulator gave each; docs/peers.md).

    python benchmarks/peer_scenarios.py [--links] [--layers] [--quick] [--sailor-best [--terms]] [--analytic]

--links prints the inventory figures derived from Sailor's network curves. --layers prints the planner's layer time
(forward + backward, TP all-reduces on the inventory's links included) of both GPUs in fp32 against Sailor's
measurements (the median transformer layer of each configuration; in-sample: the model is fitted on these runs,
benchmarks/learned_cost.py gives the leave-one-model-out figures). --quick plans OPT-350M same zone only.
--analytic plans and prices with the analytic model (no --cost-model: what a user gets without the fit on Sailor's
data), and with --layers prints its layer times against Sailor's measurements (out of sample: nothing of Sailor's
is fitted into it). --sailor-best also prints the best simple plan under Sailor's terms (brute force, 15-30 s per
scenario), to see how far our planner's choice is from the best that simulator would score, and our plan for
blocking boundaries (`--boundary-schedule blocking`, as that simulator runs every transfer; where it is several
pipelines in two zones, also priced with their gradient exchange on the curve between the zones, which Sailor's
simulator does not do); --terms then prices both plans term by
term under Sailor's terms and under our simulator (as our runtime runs it, every boundary blocking, and as
DeepSpeed's pipeline engine runs it).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sailor_terms as S  # noqa: E402

from hetauto_megatron.cost.learned.sailor import read_allreduce_fits  # noqa: E402
from hetauto_megatron.cost.learned.sailor_links import fit_ring_allreduce  # noqa: E402
from hetauto_megatron.cost.memory import GIB  # noqa: E402
from hetauto_megatron.cost.sailor_job import SAILOR_JOB_PRECISION  # noqa: E402
from hetauto_megatron.plan.plan import Mesh, Plan  # noqa: E402

# The scenarios train as Sailor's jobs did (cost/sailor_job.py): fp32, the A100s' GEMMs on TF32 (their default).
MODELS = {"OPT-350": "examples/peers/models/opt-350m.yaml", "GPT-Neo-2.7": "examples/peers/models/gpt-neo-2.7b.yaml"}
NETWORKS = {"same-zone": ("us-central1-a", "us-central1-a"), "cross-region": ("us-central1-a", "us-west1-b")}
GPU = {"a100-40gb": "A100-40", "v100-16gb": "V100-16"}
HETAUTO = [os.path.join(ROOT, ".venv", "bin", "hetauto")] if os.path.exists(
    os.path.join(ROOT, ".venv", "bin", "hetauto")) else [sys.executable, "-m", "hetauto_megatron.cli"]


# ---- the inventory figures, from Sailor's measured curves ------------------------------------------------------
def fit_alpha_beta(times, sizes):
    """(GB/s, latency us) of least absolute log error against measured transfer times: bandwidth on a 0.05 GB/s
    grid, latency on a 50 us grid up to 50 ms, then to the microsecond around the best (the first least error in
    latency-major order). Latencies go in blocks; a block whose lower bound (each size's error is at least its
    distance to the log-times the block's first and last latency give, the time growing with the latency) is above
    the best error found is not evaluated: the same result, a fraction of the logarithms."""
    import numpy as np
    times, sizes = np.asarray(times, dtype=float), np.asarray(sizes, dtype=float)
    bws = 0.05e9 * np.arange(2, 4000)
    log_t = np.log(times)

    def best(lats):
        lats = np.asarray(list(lats))
        out = None
        for k in range(0, len(lats), 32):
            block = lats[k:k + 32]
            if out is not None:
                lo = np.log(sizes[None, :] / bws[:, None] + block[0] * 1e-6)
                hi = np.log(sizes[None, :] / bws[:, None] + block[-1] * 1e-6)
                bound = (np.maximum(0.0, lo - log_t) + np.maximum(0.0, log_t - hi)).sum(axis=1).min()
                if bound > out[0] * (1 + 1e-9):       # (the margin covers the two forms' rounding)
                    continue
            e = np.abs(np.log((sizes[None, None, :] / bws[None, :, None] + block[:, None, None] * 1e-6)
                              / times[None, None, :])).sum(axis=2)
            i = int(e.argmin())
            if out is None or e.flat[i] < out[0]:
                out = (e.flat[i], bws[i % len(bws)], int(block[i // len(bws)]))
        return out
    coarse = best(range(0, 50_000, 50))
    fine = best(range(max(0, coarse[2] - 50), coarse[2] + 51))
    return fine[1] / 1e9, fine[2]


def print_links() -> None:
    """The inventory figures. A curve of N GPUs per VM is the bandwidth of N pairs sending at once (Sailor's
    test_sendrecv.py: total bytes over the time), so N pairs of s bytes each take N s / curve(s): fitted as such
    (bytes N s), the latency is the VM pair's; a link of 4 VM pairs carries 4 times its bandwidth."""
    sizes = [2 ** (k / 2) * 1e6 for k in range(21)]          # 1 MB .. 1 GB per pair
    for name, (sz, sg, c, rz, rg, mult) in {
            "a100 inter_node (one GPU per VM)": ("us-central1-a", "A100-40", "1", "us-central1-a", "A100-40", 1),
            "v100 inter_node (one GPU per VM)": ("us-central1-a", "V100-16", "1", "us-central1-a", "V100-16", 1),
            "a100 inter_node node_gbps (4 GPUs per VM)": ("us-central1-a", "A100-40", "4", "us-central1-a", "A100-40", 1),
            "v100 inter_node node_gbps (4 GPUs per VM)": ("us-central1-a", "V100-16", "4", "us-central1-a", "V100-16", 1),
            "link same zone (4 VM pairs x 4 GPUs)": ("us-central1-a", "A100-40", "4", "us-central1-a", "V100-16", 4),
            "link cross-region (4 VM pairs x 4 GPUs)": ("us-central1-a", "A100-40", "4", "us-west1-b", "V100-16", 4),
            "link same zone flow_gbps (one GPU pair)": ("us-central1-a", "A100-40", "1", "us-central1-a", "V100-16", 1),
            "link cross-region flow_gbps (one GPU pair)": ("us-central1-a", "A100-40", "1", "us-west1-b", "V100-16", 1),
    }.items():
        co, n = S.CURVES[sz][sg][c][rz][rg][c][0], int(c)
        gb, lat = fit_alpha_beta([n * S.curve_time(s, co) for s in sizes], [n * s for s in sizes])
        print(f"{name:<42} {gb * 8 * mult:7.1f} Gbit/s  latency {lat:6.0f} us")
    fits = read_allreduce_fits(S.DATA)
    for gpu in ("A100-40", "V100-16"):
        bw, lat = fit_ring_allreduce({"4": fits[gpu]["4"]}, 4, sizes, max_latency_us=100)
        print(f"{gpu} intra_node (4-GPU all-reduce)            {bw * 8 / 1e9:7.0f} Gbit/s  latency {lat:6.1f} us")


def print_layers(cost_model_dir: str | None) -> None:
    """Layer forward + backward as the planner charges it against Sailor's measured median layer. With the analytic
    model (cost_model_dir None) also the layer priced with fused attention, which Megatron's engine does not run in
    fp32 (plan/engines.py ENGINES; DeepSpeed's engine does), as the planner priced it before."""
    import dataclasses
    import statistics
    from hetauto_megatron.cost.learned import SAILOR_MODELS, load_cost_model
    from hetauto_megatron.plan import costing
    from hetauto_megatron.plan.settings import default_settings
    from hetauto_megatron.spec.inventory import load_inventory
    cm = load_cost_model(cost_model_dir)
    inv = load_inventory(os.path.join(ROOT, "examples/peers/inventory-same-zone.yaml"))
    inv = inv.with_precision(SAILOR_JOB_PRECISION)
    fused = cost_model_dir is None
    print(f"{'GPU':<8} {'model':<12} {'mbs':>3} {'tp':>2} {'measured ms':>11} {'planner ms':>10} {'error':>6}  model"
          + ("   fused attention ms, error" if fused else ""))
    errors: dict[str, list] = {}
    for cluster, gpu in (("a100", "A100-40"), ("v100", "V100-16")):
        c = inv.cluster(cluster)
        for name in ("OPT-350", "GPT-Neo-2.7"):
            spec = SAILOR_MODELS[name]
            for mbs in (1, 2, 4):
                for tp in (1, 2, 4):
                    entries = S.PROFILES[name][gpu].get(str(mbs), {}).get(str(tp))
                    if not entries:
                        continue
                    meas = statistics.median(entries[str(i)][0] + entries[str(i)][1]
                                             for i in range(1, spec.num_layers + 1))
                    prof = costing.stage_profile(spec, c, tp, 1, mbs, "none", cm)
                    pred = prof.layer_fwd + prof.layer_bwd
                    errors.setdefault(gpu, []).append(pred / meas - 1)
                    line = (f"{gpu:<8} {name:<12} {mbs:>3} {tp:>2} {meas * 1e3:>11.2f} {pred * 1e3:>10.2f} "
                            f"{100 * (pred / meas - 1):>+5.0f}%  {cm.source(c.device)}")
                    if fused:
                        other = costing.stage_profile(spec, c, tp, 1, mbs, "none", cm, dataclasses.replace(
                            default_settings(tp), engine="deepspeed"))
                        f = other.layer_fwd + other.layer_bwd
                        errors.setdefault("fused", []).append(f / meas - 1)
                        line += f"   {f * 1e3:>8.2f} {100 * (f / meas - 1):>+5.0f}%"
                    print(line)
    for key, errs in list(errors.items()) + [("all", [e for k, v in errors.items() if k != "fused" for e in v])]:
        print(f"{key:<8} MAPE {100 * statistics.mean(abs(e) for e in errs):.1f} %, worst "
              f"{100 * max(errs, key=abs):+.0f} % ({len(errs)} configurations)")


# ---- plans ------------------------------------------------------------------------------------------------------
def sailor_pipelines(plan: dict, model: str, zones: dict) -> tuple[list, list[int]]:
    """Our plan (JSON) as Sailor's pipelines of stages, and the samples each trains: a position's meshes are replica
    groups of its stages; a pipeline's first stage holds the embedding (entry 0), its last the head (L+1..)."""
    L = {"OPT-350": 24, "GPT-Neo-2.7": 32}[model]
    n_entries = len(S.LLM_INFO[model]["1"])
    by_pipe: dict[int, list] = {}
    for m in plan["meshes"]:
        positions = by_pipe.setdefault(m.get("pipeline", 0), [])
        if m.get("alongside"):
            positions[-1].append(m)
        else:
            positions.append([m])
    pipelines = []
    for _, positions in sorted(by_pipe.items()):
        stages, start = [], 1
        per_stage = [(pos, k) for pos in positions for k in range(len(pos[0]["stage_layers"]))]
        for s, (pos, k) in enumerate(per_stage):
            n = pos[0]["stage_layers"][k]
            entries = list(range(start, start + n))
            start += n
            if s == 0:
                entries = [0] + entries
            if s == len(per_stage) - 1:
                entries += list(range(L + 1, n_entries))
            stages.append((entries, [S.Group(GPU[m["device_type"]], m["tp"], m["dp"], m["micro_batch_size"],
                                             zones[m["cluster"]]) for m in pos]))
        pipelines.append(stages)
    samples = [p["samples"] for p in plan["pipelines"]] if plan.get("pipelines") else [plan.get("global_batch_size",
                                                                                                 1024)]
    return pipelines, samples


def sailor_score(plan: dict, model: str, zones: dict, between_zones: bool = False) -> tuple[float, bool, list[str]]:
    """(it/s, fits, largest memory per stage in GiB) under Sailor's terms (`between_zones`: S.iteration_multi_s)."""
    pipes, samples = sailor_pipelines(plan, model, zones)
    t = S.iteration_multi_s(model, pipes, samples, between_zones)
    mem = [f"{max(r) / GIB:.1f}" for st in pipes for r in S.memory_bytes(model, st)]
    return 1 / t, all(S.fits(model, st) for st in pipes), mem


def load_peer_plans() -> list[dict]:
    """The plans the peers' own planners chose for these scenarios (benchmarks/peer_plans.json: data, with the
    repository, commit and command they came from, and the it/s Sailor's simulator gave each), each with its source."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_plans.json")) as f:
        doc = json.load(f)
    return [{**p, "source": doc["source"]} for p in doc["plans"]]


def peer_samples(meshes: list[dict], gbs: int = 1024) -> int:
    """The samples a peer plan trains per iteration: Sailor rounds the micro-batch count up (ceil(1024 / 40) = 26
    steps of 40 samples for its OPT-350M same-zone plan), a step being the first stage's replicas x micro-batch."""
    step = sum(m["dp"] * m["micro_batch_size"] for m in meshes if m is meshes[0] or m.get("alongside")
               and m["stage_layers"] == meshes[0]["stage_layers"])
    return -(-gbs // step) * step


def run_plan(model_yaml: str, inventory: str, cost_model: str, shapes: str | None, engine: str | None = None,
             boundary: str | None = None) -> dict:
    cmd = HETAUTO + ["plan", "--model", model_yaml, "--inventory", inventory, "--precision", SAILOR_JOB_PRECISION,
                     "--global-batch-size", "1024", "--memory-job", "sailor-deepspeed", "--json", "--quiet"]
    if cost_model:      # else the analytic model (--analytic)
        cmd += ["--cost-model", cost_model]
    if shapes:
        cmd += ["--shapes", shapes]
    if engine:      # the pipeline engine planned for (Sailor's measured jobs ran DeepSpeed's)
        cmd += ["--engine", engine]
    if boundary:    # the cross-cluster boundaries planned for (Sailor's simulator makes every transfer block)
        cmd += ["--boundary-schedule", boundary]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout)


def our_price(plan_json: dict, inventory_path: str, cost_model_dir: str) -> dict:
    """A plan (JSON meshes) priced by our simulator, with the sailor-deepspeed memory job."""
    from hetauto_megatron.cost.learned import load_cost_model
    from hetauto_megatron.plan.memory_fit import sailor_deepspeed_job
    from hetauto_megatron.plan.multi_simulate import shapes_estimate, shapes_of
    from hetauto_megatron.plan.simulate import simulate
    from hetauto_megatron.spec.inventory import load_inventory
    from hetauto_megatron.spec.model import load_model
    model = load_model(os.path.join(ROOT, plan_json["model_yaml"]))
    inv = load_inventory(os.path.join(ROOT, inventory_path))
    meshes = tuple(Mesh(m["cluster"], m["device_type"], m["tp"], m["dp"], m["micro_batch_size"],
                        m.get("recompute", "none"), tuple(m["stage_layers"]), alongside=m.get("alongside", False))
                   for m in plan_json["meshes"])
    gbs = peer_samples(plan_json["meshes"])        # Sailor rounds the micro-batch count up: the plan trains those
    plan = Plan(model=model, global_batch_size=gbs, meshes=meshes, inventory=inv.to_dict(),
                precision=SAILOR_JOB_PRECISION)
    cm = load_cost_model(cost_model_dir)
    cm.memory_job = sailor_deepspeed_job()
    est = simulate(plan, inv, cm) if plan.is_simple else shapes_estimate(
        model, inv.with_precision(SAILOR_JOB_PRECISION), shapes_of(plan), cm)
    return {"iteration_time_s": est.iteration_time_s, "memory_gib": est.memory_gib, "fits": est.fits,
            "caps": [r["memory_cap_gib"] for r in est.stages] if est.stages and "memory_cap_gib" in est.stages[0]
            else None}


def sailor_best_meshes(model: str, stages) -> list[dict]:
    """A simple plan of best_simple (Sailor entries per stage, one group each) as our meshes: consecutive stages on
    one GPU type are one mesh; transformer layers only (the embedding and the head go with the first and last)."""
    L = {"OPT-350": 24, "GPT-Neo-2.7": 32}[model]
    meshes = []
    for entries, (g,) in stages:
        n = sum(1 for e in entries if 1 <= e <= L)
        cluster = "a100" if g.gpu == "A100-40" else "v100"
        if meshes and meshes[-1]["cluster"] == cluster:
            meshes[-1]["stage_layers"].append(n)
        else:
            meshes.append({"cluster": cluster, "device_type": {"a100": "a100-40gb", "v100": "v100-16gb"}[cluster],
                           "tp": g.tp, "dp": g.replicas, "micro_batch_size": g.mbs, "stage_layers": [n]})
    return meshes


def print_terms(label: str, meshes: list[dict], model: str, zones: dict, yaml_path: str, inv_path: str,
                cost_model_dir: str) -> None:
    """One simple plan, term by term, under Sailor's terms and under our simulator: as our runtime runs it (each
    cross-cluster boundary overlapped at the best depth or blocking, whichever is faster), with every boundary
    blocking, and as DeepSpeed's pipeline engine runs it (plan/deepspeed_schedule.py)."""
    from hetauto_megatron.cost.learned import load_cost_model
    from hetauto_megatron.plan.memory_fit import sailor_deepspeed_job
    from hetauto_megatron.plan.simulate import simulate
    from hetauto_megatron.spec.inventory import load_inventory
    from hetauto_megatron.spec.model import load_model
    pipes, _ = sailor_pipelines({"meshes": meshes}, model, zones)
    st = pipes[0]
    step = st[0][1][0].replicas * st[0][1][0].mbs
    t = S.pipeline_terms(model, st, math.ceil(1024 / step))
    dp = S.dp_sync_s(model, st)
    per_mb = [1e3 * (c + x) for c, x in zip(t["compute_s"], t["sends_s"])]
    print(f"  {label}: {describe(meshes)}")
    print(f"    Sailor's terms {t['steady_s'] + t['fill_s'] + t['optimizer_s'] + dp:6.3f} s: per micro-batch, stage "
          f"compute + sends charged (ms) " + ", ".join(f"{1e3 * c:.0f}+{1e3 * x:.0f}" for c, x in
                                                        zip(t["compute_s"], t["sends_s"]))
          + f"; straggler x (m-1) {t['steady_s']:.3f}, fill {t['fill_s']:.3f}, DP sync {dp:.3f}, optimizer "
          f"{t['optimizer_s']:.3f}  (straggler {max(per_mb):.0f} ms)")
    cm = load_cost_model(cost_model_dir)
    cm.memory_job = sailor_deepspeed_job()
    inv = load_inventory(os.path.join(ROOT, inv_path))
    model_spec = load_model(os.path.join(ROOT, yaml_path))

    def price(schedule, depth, engine="megatron"):
        ms = []
        for i, m in enumerate(meshes):
            cross = i + 1 < len(meshes) and meshes[i + 1]["cluster"] != m["cluster"]
            ms.append(Mesh(m["cluster"], m["device_type"], m["tp"], m["dp"], m["micro_batch_size"], "none",
                           tuple(m["stage_layers"]), boundary_schedule=schedule if cross else "blocking",
                           boundary_depth=depth if cross else 0))
        plan = Plan(model=model_spec, global_batch_size=1024, meshes=tuple(ms), inventory=inv.to_dict(),
                    precision=SAILOR_JOB_PRECISION)
        return simulate(plan, inv, cm, engine=engine)
    runs = [price("blocking", 0)] + [price("overlapped", d) for d in (0, 1, 2)]
    best = min((e for e in runs if e.fits), key=lambda e: e.iteration_time_s, default=runs[0])
    ds = price("blocking", 0, "deepspeed")
    other = best.iteration_time_s - best.pipeline_s - best.dp_exposed_s
    print(f"    ours {best.iteration_time_s:6.3f} s (boundary {best.stages[0].get('send_next_schedule', '-')} depth "
          f"{best.stages[0].get('send_next_depth', 0)}): per micro-batch, stage compute (ms) "
          + ", ".join(f"{1e3 * (r['forward_s'] + r['backward_s']):.0f}" for r in best.stages)
          + f", sends (ms) " + ", ".join(f"{1e3 * r['send_next_s']:.0f}" for r in best.stages[:-1])
          + f"; pipeline {best.pipeline_s:.3f}, DP exposed {best.dp_exposed_s:.3f}, rest {other:.3f}")
    print(f"    ours, every boundary blocking {runs[0].iteration_time_s:6.3f} s; as DeepSpeed's engine runs it "
          f"{ds.iteration_time_s:6.3f} s (pipeline {ds.pipeline_s:.3f}, DP exposed {ds.dp_exposed_s:.3f})")


def describe(meshes) -> str:
    return "; ".join(f"{'P' + str(m['pipeline']) + ' ' if m.get('pipeline') else ''}{m['cluster']} tp{m['tp']} dp{m['dp']} mbs{m['micro_batch_size']} "
                     f"{'+' if m.get('alongside') else ''}{list(m['stage_layers'])}"
                     + (f" rc={m['recompute']}" if m.get("recompute", "none") != "none" else "") for m in meshes)


def has_shapes_flag() -> bool:
    out = subprocess.run(HETAUTO + ["plan", "--help"], cwd=ROOT, capture_output=True, text=True).stdout
    return "--shapes" in out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--links", action="store_true")
    ap.add_argument("--layers", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sailor-best", action="store_true")
    ap.add_argument("--terms", action="store_true", help="with --sailor-best: both plans term by term")
    ap.add_argument("--analytic", action="store_true", help="plan and price with the analytic model")
    args = ap.parse_args()
    if args.links:
        print_links()
        return 0
    work = tempfile.mkdtemp(prefix="peers-")
    cost_model = None
    if not args.analytic:
        cost_model = os.path.join(work, "gpu-model")
        subprocess.run(HETAUTO + ["fit", "--sailor", "-o", cost_model], cwd=ROOT, check=True, capture_output=True)
    if args.layers:
        print_layers(cost_model)
        return 0
    shape_runs = ["simple", "all"] if has_shapes_flag() else [None]
    if shape_runs == [None]:
        print("new shapes: this planner has no --shapes option yet; the simple-shape plan only")
    for model, yaml_path in MODELS.items():
        if args.quick and model != "OPT-350":
            continue
        for net, (za, zv) in NETWORKS.items():
            if args.quick and net != "same-zone":
                continue
            zones = {"a100": za, "v100": zv}
            inv = f"examples/peers/inventory-{net}.yaml"
            print(f"\n== {model}, {net} ({inv}) ==")
            rows, between = [], {}
            runs = [(shapes, None, None) for shapes in shape_runs] + [("simple", "deepspeed", None)]
            if args.sailor_best:        # planned for blocking boundaries, as Sailor's simulator runs every transfer
                runs.append((shape_runs[-1], None, "blocking"))
            for shapes, engine, boundary in runs:
                res = run_plan(yaml_path, inv, cost_model, shapes, engine, boundary)
                label = ("hetauto (--engine deepspeed)" if engine else "hetauto (--boundary-schedule blocking)"
                         if boundary else f"hetauto ({shapes or 'simple'} shapes)")
                if "error" in res:
                    print(f"{label}: no plan: {res['error']}")
                    continue
                meshes = res["plan"]["meshes"]
                mem = [f"{s['memory_gib']:.1f}/{s['memory_cap_gib']:.0f}" for s in res["stages"]]
                rows.append((label, meshes, 1 / res["iteration_time_s"], res["fits"], mem,
                             *sailor_score(res["plan"], model, zones)))
                print(f"{label}: {describe(meshes)}")
                print(f"  cost model: {res['cost_model']}")
                if len({m.get("pipeline", 0) for m in meshes}) > 1 and len({zones[m["cluster"]] for m in meshes}) > 1:
                    # several pipelines in two zones: their gradient exchange crosses the link between the zones
                    between[label] = sailor_score(res["plan"], model, zones, between_zones=True)[0]
            peers = [pp for pp in load_peer_plans() if pp["model"] == model and pp["network"] == net]
            peer_rows = []
            for pp in peers:
                p = {"meshes": pp["meshes"], "model_yaml": yaml_path}
                ours = our_price(p, inv, cost_model)
                mem = [f"{g:.1f}" for g in ours["memory_gib"]]
                rows.append((f"{pp['peer']}'s plan", pp["meshes"], 1 / ours["iteration_time_s"], ours["fits"], mem,
                             *sailor_score({**p, "global_batch_size": peer_samples(pp["meshes"])}, model, zones)))
                peer_rows.append((pp, rows[-1]))
                print(f"{pp['peer']}'s plan (its planner, {pp['source']['repository']} {pp['source']['commit'][:7]}): "
                      f"{describe(pp['meshes'])}; Sailor's simulator gave it {pp['sailor_simulator_it_s']:.5f} it/s")
            print(f"{'plan':<32} {'ours it/s':>9} {'fits':>5}  {'Sailor-terms it/s':>17} {'fits':>5}  "
                  f"memory per stage, ours as the sailor-deepspeed job (GiB used/cap) | Sailor's terms (GiB)")
            for label, meshes, ips, fit, mem, sips, sfit, smem in rows:
                print(f"{label:<32} {ips:>9.5f} {str(fit):>5}  {sips:>17.5f} {str(sfit):>5}  "
                      f"{' '.join(mem)} | {' '.join(smem)}")
            for label, ips in between.items():
                print(f"  {label}: Sailor's terms price the gradient exchange between its pipelines on each "
                      f"pipeline's own zone's curve, as Sailor's simulator does; on the curve between the zones "
                      f"{ips:.5f} it/s")
            if args.sailor_best:
                ips, st = S.best_simple(model, {"A100-40": za, "V100-16": zv})
                print(f"best simple plan under Sailor's terms: {ips:.5f} it/s: " + " | ".join(
                    f"entries {e[0]}-{e[-1]}: " + ", ".join(f"{g.gpu} tp{g.tp} x{g.replicas} mbs{g.mbs}" for g in gs)
                    for e, gs in st))
                if args.terms:
                    print("term by term (seconds per iteration):")
                    if rows and rows[0][0].startswith("hetauto"):
                        print_terms("ours", rows[0][1], model, zones, yaml_path, inv, cost_model)
                    for row in rows:
                        if row[0] == "hetauto (--engine deepspeed)":
                            print_terms("ours, --engine deepspeed", row[1], model, zones, yaml_path, inv, cost_model)
                    print_terms("best under Sailor's terms", sailor_best_meshes(model, st), model, zones, yaml_path,
                                inv, cost_model)
                    for pp in peers:
                        if not any(m.get("alongside") for m in pp["meshes"]):
                            print_terms(f"{pp['peer']}'s plan", pp["meshes"], model, zones, yaml_path, inv, cost_model)
            if peers:       # the same yardstick for all: Sailor's terms (Sailor's simulator's own figure beside)
                best, best_row = max(peer_rows, key=lambda x: x[1][5])
                ours_row = next((r for r in rows if r[0] == "hetauto (simple shapes)"), rows[0])
                print(f"best peer plan under Sailor's terms: {best['peer']}'s, {best_row[5]:.5f} it/s (Sailor's "
                      f"simulator {best['sailor_simulator_it_s']:.5f}); ours {ours_row[5]:.5f} = "
                      f"{100 * ours_row[5] / best_row[5]:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
