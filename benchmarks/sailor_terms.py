"""The terms Sailor's simulator prices a plan with, re-derived in our own code from its documented behaviour
(docs/peers.md gives each term with its file in github.com/eth-easl/sailor, commit cf2c8e3), from the data it
uses, packaged in hetauto_megatron/data/sailor/: profiles_tmp.json (per-layer forward, backward and optimizer
times), llm_info.json (per-layer parameters and activation memory) and an extract of
multizone_bandwidths_het.json (network curves per zone pair). It is a cross-check for the peer scenarios, not a
replacement for running Sailor's simulator: where its code makes a choice that our plans do not express (one
micro-batch size for the whole plan), the reading used is said where it is made.

A plan here: stages, each a list of replica groups (gpu, tp, replicas, micro-batch, zone) holding the same
Sailor layer entries (0 = embedding, 1..L transformer layers, L+1.. the head).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hetauto_megatron", "data", "sailor")
GPU_MEMORY_GB = {"A100-40": 40, "V100-16": 16}        # constants.py, compared in GiB (x 1024^3)
BYTES_PER_PARAM = 8 + 4 + 4 + 4 + 4      # Adam (2 x 4), fp32 model, gradients, DeepSpeed comm buffer, DS copies
BUCKET_BYTES = 500_000_000               # DeepSpeed's all-reduce bucket, as Sailor prices the DP sync
FLOAT = 4                                # fp16=False: the simulator's element size


def _load(name: str):
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


PROFILES = _load("profiles_tmp.json")
LLM_INFO = _load("llm_info.json")
CURVES = _load("multizone_bandwidths_het.json")


@dataclass(frozen=True)
class Group:
    gpu: str          # Sailor's name: A100-40, V100-16
    tp: int
    replicas: int
    mbs: int
    zone: str


def curve_time(nbytes: float, coeffs) -> float:
    """Seconds to move nbytes at Sailor's fitted bandwidth (GB/s = a x^2 + b x + c, x = log2 of megabytes)."""
    if nbytes <= 0:
        return 0.0
    x = math.log2(nbytes / 1e6)
    a, b, c = coeffs
    return nbytes / 1e9 / (a * x * x + b * x + c)


def _coeffs(src: Group, dst: Group, count_src: int, count_dst: int):
    return CURVES[src.zone][src.gpu][str(count_src)][dst.zone][dst.gpu][str(count_dst)][0]


def allreduce_buckets(nbytes: float, n: int, coeffs) -> float:
    """Ring all-reduce bucket by bucket: 2(n-1) steps of bucket/n each."""
    if n <= 1:
        return 0.0
    t, left = 0.0, nbytes
    while left > 0:
        b = min(BUCKET_BYTES, left)
        t += 2 * (n - 1) * curve_time(b / n, coeffs)
        left -= b
    return t


def _replicas(stage: list[Group]) -> list[Group]:
    return [g for g in stage for _ in range(g.replicas)]


def layer_times(model: str, g: Group, layers) -> tuple[float, float, float] | None:
    """(forward + backward of the stage's entries, the optimizer time Sailor charges (its first entry's), None if
    the profile has no such configuration."""
    try:
        prof = PROFILES[model][g.gpu][str(g.mbs)][str(g.tp)]
    except KeyError:
        return None
    fb = sum(prof[str(i)][0] + prof[str(i)][1] for i in layers)
    return fb, prof[str(layers[0])][2], 0.0


def memory_bytes(model: str, stages: list[tuple[list[int], list[Group]]]) -> list[list[float]]:
    """Per stage, per group: parameters x 24 bytes + activation memory x micro-batch x 4 bytes x (stages - i) +
    2 GB (TP 1) or 3 GB (TP > 1) of framework memory (check_config_fits)."""
    p = len(stages)
    out = []
    for i, (layers, groups) in enumerate(stages):
        row = []
        for g in groups:
            info = LLM_INFO[model][str(g.tp)]
            params = sum(info[str(l)]["params_floats"] for l in layers)
            act = sum(info[str(l)]["act_mem_floats"] for l in layers) * g.mbs * FLOAT
            row.append(params * BYTES_PER_PARAM + act * (p - i) + (2e9 if g.tp == 1 else 3e9))
        out.append(row)
    return out


def fits(model: str, stages) -> bool:
    mem = memory_bytes(model, stages)
    return all(m <= GPU_MEMORY_GB[g.gpu] * 1024 ** 3 for (_, groups), row in zip(stages, mem)
               for g, m in zip(groups, row))


def pipeline_s(model: str, stages: list[tuple[list[int], list[Group]]], m: int) -> float:
    """One pipeline's time for m micro-batches: (m - 1) x the straggler stage (compute + its sends) + the sum of all
    stages' compute and sends + the largest optimizer time."""
    t = pipeline_terms(model, stages, m)
    return t["steady_s"] + t["fill_s"] + t["optimizer_s"]


def pipeline_terms(model: str, stages: list[tuple[list[int], list[Group]]], m: int) -> dict:
    """pipeline_s's terms: per stage its compute and the sends charged to it per micro-batch (seconds), the
    straggler's (m - 1) micro-batches (`steady_s`), the sum of every stage's compute and sends (`fill_s`) and the
    largest optimizer time."""
    p = len(stages)
    info1 = LLM_INFO[model]["1"]
    comp, upd = [], []
    for layers, groups in stages:
        t = [layer_times(model, g, layers) for g in groups]
        if any(x is None for x in t):
            return {"compute_s": [], "sends_s": [], "steady_s": math.inf, "fill_s": 0.0, "optimizer_s": 0.0}
        comp.append(max(x[0] for x in t))
        upd.append(max(x[1] for x in t))
    comm = []
    for i, (layers, groups) in enumerate(stages):
        reps = _replicas(groups)
        act_t = grad_t = 0.0
        if i < p - 1:
            nxt = _replicas(stages[i + 1][1])
            for j, g in enumerate(reps):
                h = nxt[j % len(nxt)]
                size = info1[str(layers[-1])]["act_output_floats"] * FLOAT * g.mbs
                act_t = max(act_t, curve_time(size, _coeffs(g, h, min(g.tp, 4), min(h.tp, 4))))
        if i > 0:
            prv = _replicas(stages[i - 1][1])
            for j, g in enumerate(reps):
                h = prv[j % len(prv)]
                size = info1[str(layers[0])]["act_output_floats"] * FLOAT * g.mbs
                grad_t = max(grad_t, curve_time(size, _coeffs(g, h, min(g.tp, 4), min(h.tp, 4))))
        if 0 < i < p - 1:
            comm.append(act_t + grad_t)
        elif i == p - 1 and p > 1:
            comm.append(2 * grad_t)
        elif i == 0 and p > 1:
            comm.append(act_t if p <= 3 else 2 * act_t)
        else:
            comm.append(0.0)
    straggler = max(c + s for c, s in zip(comp, comm))
    return {"compute_s": comp, "sends_s": comm, "steady_s": (m - 1) * straggler, "fill_s": sum(comm) + sum(comp),
            "optimizer_s": max(upd)}


def dp_sync_s(model: str, stages) -> float:
    """The DP gradient sync inside a pipeline, not overlapped: per stage, its parameters x 4 bytes / the smallest
    TP (at most 4) in DeepSpeed buckets over the replicas' ring; each neighbouring pair of replicas is priced as if it
    bounded the ring (the slowest pair sets the time); the slowest stage."""
    info1 = LLM_INFO[model]["1"]
    sync = 0.0
    for layers, groups in stages:
        reps = _replicas(groups)
        if len(reps) < 2:
            continue
        tp_min = min(4, min(g.tp for g in groups))
        size = sum(info1[str(l)]["params_floats"] * FLOAT for l in layers) / tp_min
        for a, b in zip(reps, reps[1:]):
            sync = max(sync, allreduce_buckets(size, len(reps), _coeffs(a, b, 1, 1)))
    return sync


def iteration_s(model: str, stages: list[tuple[list[int], list[Group]]], gbs: int) -> float:
    """One pipeline: pipeline_s + dp_sync_s. m = global batch / samples per micro-batch step of the first stage
    (Sailor: ceil(gbs / (mbs x dp)); with per-group micro-batches, the sum over its replicas)."""
    return iteration_multi_s(model, [stages], [gbs])


def iteration_multi_s(model: str, pipelines: list, samples: list[int], between_zones: bool = False) -> float:
    """Several pipelines: the slowest pipeline, the slowest pipeline's DP sync, and the sync across pipelines: for
    each stage of the pipeline with most stages, its parameters x 4 bytes all-reduced over the pipelines, bucket by
    bucket, on its own zone's curve (one GPU per VM), as Sailor's simulator prices it even where the pipelines are in
    different zones (runtime_simulator.py estimate_sync_time, marked TODO there). `between_zones`: on the curve
    between the slowest pair of the pipelines' zones instead, what that exchange crosses. Pipeline p runs samples_p /
    its step micro-batches (Sailor gives every pipeline ceil(gbs / (mbs x dp x pipelines)): the same where the batch
    splits evenly)."""
    t_pp = 0.0
    for stages, n in zip(pipelines, samples):
        step = sum(g.replicas * g.mbs for g in stages[0][1])
        t_pp = max(t_pp, pipeline_s(model, stages, math.ceil(n / step)))
    intra = max(dp_sync_s(model, stages) for stages in pipelines)
    inter = 0.0
    if len(pipelines) > 1:
        info1 = LLM_INFO[model]["1"]
        longest = max(pipelines, key=len)
        others = [g for p in pipelines for _, gs in p for g in gs]
        for layers, groups in longest:
            size = sum(info1[str(l)]["params_floats"] * FLOAT for l in layers)
            for g in groups:
                pairs = [(g, o) for o in others] + [(o, g) for o in others] if between_zones else [(g, g)]
                inter = max(inter, max(allreduce_buckets(size, len(pipelines), _coeffs(a, b, 1, 1)) for a, b in pairs))
    return t_pp + intra + inter


def best_simple(model: str, zones: dict, gbs: int = 1024, devices: int = 16) -> tuple[float, list]:
    """The best simple plan under these terms (brute force): the two GPU types in either order, each one mesh of
    one or two stages at TP 1/2/4 over its `devices`, micro-batches 1-8 with equal samples per step, every layer
    split, within memory. Returns (it/s, stages)."""
    import itertools
    n = len(LLM_INFO[model]["1"])
    best = (0.0, [])
    for order in (("V100-16", "A100-40"), ("A100-40", "V100-16")):
        for tpa, sa, tpb, sb in itertools.product((1, 2, 4), (1, 2), (1, 2, 4), (1, 2)):
            dpa, dpb = devices // (tpa * sa), devices // (tpb * sb)
            for mba in (1, 2, 4, 8):
                if (dpa * mba) % dpb or dpa * mba // dpb not in (1, 2, 4, 8):
                    continue
                ga = Group(order[0], tpa, dpa, mba, zones[order[0]])
                gb = Group(order[1], tpb, dpb, dpa * mba // dpb, zones[order[1]])
                for cuts in itertools.combinations(range(1, n), sa + sb - 1):
                    bounds = (0,) + cuts + (n,)
                    stages = [(list(range(bounds[i], bounds[i + 1])), [ga if i < sa else gb])
                              for i in range(sa + sb)]
                    if not fits(model, stages):
                        continue
                    t = iteration_s(model, stages, gbs)
                    if 0 < t < math.inf and 1 / t > best[0]:
                        best = (1 / t, stages)
    return best


if __name__ == "__main__":
    print(__doc__.strip() + "\n\nThese are the terms, not a benchmark: `python benchmarks/peer_scenarios.py --sailor-best "
          "--terms` prices plans with them, and tests/test_sailor_terms.py checks them against Sailor's simulator.")
