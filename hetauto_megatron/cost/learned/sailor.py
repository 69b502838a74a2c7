"""The Sailor project's per-layer GPU measurements (packaged under data/sailor): loading, the arithmetic each
run used, the TP all-reduces a measured layer contains, and the training rows made of them."""
from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
from dataclasses import dataclass
from functools import lru_cache

from ...errors import InputError
from ...spec.devices import CATALOG
from ...spec.files import read_json_file
from ...spec.model import ModelSpec
from .. import features as F
from ..sailor_job import SAILOR_ELEMENT_BYTES
from .sailor_host_floor import config_key, config_times, host_bound_times
from .sailor_links import sailor_allreduce_s
from .samples import DeviceInfo, Sample, allreduce_rate_at, measured_time, tp_allreduce_key, warn_zero_times


# ---- Sailor per-layer GPU measurements ---------------------------------------------------------------------
# The shapes of the four models as Sailor ran them, checked against llm_info.json's parameter counts
# (tests/test_learned_sailor.py): OPT and GPT-Neo are plain-MLP GPTs with learned positions; Sailor's
# "LLAMA-3-8" layer holds 268.5M parameters, i.e. full multi-head attention and a 16384-wide SwiGLU, and its
# activations are 8192 tokens per micro-batch. The fork builds GPT-Neo without an output layer
# (third_party/Megatron-DeepSpeed/megatron/model/gpt_neo_model.py, GPTNeoModelPipe: the transformer layers, then a
# LayerNorm, and the loss's vocab-parallel cross-entropy over that norm's outputs): its last entry in llm_info.json
# holds the norm's 5,120 parameters, and its measured head times do not shrink with TP (0.4-0.7 ms forward at
# micro-batch 8 on the GH200, TP 1-4, where OPT-350's logits GEMM goes 14.9 -> 4.0 ms).
SAILOR_MODELS = {
    "OPT-350": ModelSpec("OPT-350", 24, 1024, 16, 4096, 50272, 2048, gated_mlp=False, position_embedding="learned"),
    "GPT-Neo-2.7": ModelSpec("GPT-Neo-2.7", 32, 2560, 20, 10240, 50257, 2048, gated_mlp=False,
                             position_embedding="learned", output_layer=False),
    "OPT-30": ModelSpec("OPT-30", 48, 7168, 56, 28672, 50272, 2048, gated_mlp=False, position_embedding="learned"),
    "LLAMA-3-8": ModelSpec("LLAMA-3-8", 32, 4096, 32, 16384, 128256, 8192, gated_mlp=True, position_embedding="rope"),
}
# Sailor GPU names -> our catalog (datasheet figures: the 16-bit tensor peak with FP32 accumulation, the FP32 peak
# without tensor cores, the TF32 peak where the GPU has TF32, memory bandwidth). Sailor's "RTX-2080" is the 2080 Ti:
# its cluster configuration gives those GPUs 11 GiB (sailor/Planner/simulations/configs/basic_cluster_config.json;
# a 2080 has 8), and its measured fp32 OPT-350 layers run at 8.2-8.5 TFLOP/s forward, 84 % of a 2080's FP32 peak
# (10.1) where the TITAN RTX's and the V100's run at 55-60 % of theirs; 63 % of the 2080 Ti's 13.4.
SAILOR_GPUS = {"A100-40": "a100-40gb", "A100-80": "a100-80gb", "V100-16": "v100-16gb", "GH-96": "gh200",
               "Titan-RTX": "titan-rtx", "RTX-2080": "rtx-2080-ti", "RTX-3090": "rtx-3090"}
# Every run was an fp32 job (cost/sailor_job.py gives the evidence): 4-byte activations, TP all-reduces and softmax
# passes, whether its GEMMs ran on the TF32 tensor cores or on the CUDA cores (sailor_precisions).
# Datasheet FP32 throughput without tensor cores (TF32 off), TFLOP/s: the ceiling of a run in plain FP32.
SAILOR_FP32_TFLOPS = {gpu: CATALOG[name].peak_tflops_at("fp32") for gpu, name in SAILOR_GPUS.items()}


@lru_cache(maxsize=None)
def sailor_tf32_tflops(gpu: str) -> float | None:
    """The dense TF32 tensor peak of a Sailor GPU, the ceiling of an fp32 run whose GEMMs ran on TF32; None
    where the GPU has no TF32 (V100, Turing)."""
    return CATALOG[SAILOR_GPUS[gpu]].peak_tflops_at("tf32") if gpu in SAILOR_GPUS else None
# The measurements ship inside the package (with their MIT attribution), so `hetauto fit --sailor` works from an
# installed copy without a path.
SAILOR_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "sailor")


@dataclass(frozen=True)
class SailorLayer:
    model: str
    gpu: str
    device: str
    peak_tflops: float
    hbm_gbps: float
    shape: F.LayerShape
    index: int            # layer index in Sailor's list (transformer layers 1..L)
    fwd_s: float
    bwd_s: float
    precision: str = "tf32"   # the arithmetic: "tf32" (GEMMs on the TF32 tensor cores) or "fp32" (sailor_precisions)
    tp_comm_s: float = 0.0    # TP all-reduce time the measurement contains, per pass (see tp_allreduces_s)

    @property
    def dtype_bytes(self) -> int:
        """The element size of the run's tensors: the job's (fp32), whatever unit ran its GEMMs."""
        return SAILOR_ELEMENT_BYTES

    @property
    def compute_tflops(self) -> float:
        """The compute ceiling of this run: the TF32 tensor peak, or the FP32 peak for a run on the CUDA cores."""
        return SAILOR_FP32_TFLOPS[self.gpu] if self.precision == "fp32" else sailor_tf32_tflops(self.gpu)


def sailor_device(gpu: str) -> tuple[str, float, float]:
    if gpu in SAILOR_GPUS:
        d = CATALOG[SAILOR_GPUS[gpu]]
        return d.name, d.peak_tflops, d.hbm_gbps
    return "", 0.0, 0.0


def _profiled_runs(data: dict, unknown: list | None = None):
    """(model name, its ModelSpec, GPU name, sailor_device(GPU), {micro-batch: {TP: entries}}) of every run in
    profiles_tmp.json whose model and GPU we know; the others are named in `unknown` (where given)."""
    for mname, per_gpu in data.items():
        spec = SAILOR_MODELS.get(mname)
        if spec is None:
            if unknown is not None:
                unknown.append(f"model {mname}")
            continue
        for gpu, per_mb in per_gpu.items():
            device = sailor_device(gpu)
            if device[0]:
                yield mname, spec, gpu, device, per_mb
            elif unknown is not None:
                unknown.append(f"GPU {gpu} ({mname})")


def load_sailor(directory: str, *, quiet: bool = False) -> list[SailorLayer]:
    """Every transformer-layer and head measurement of profiles_tmp.json as a SailorLayer (`quiet`: without the
    warning of the readings of time 0 left out, for a second read of the file by one command).

    Layout: [model][gpu][micro_batch][tp][layer_index] = [forward_s, backward_s, update_s]; index 0 is the
    embedding (not used: its sub-millisecond times are launch noise), 1..L the transformer layers, the
    remaining one or two indices the final norm and output head (summed into one head row).
    """
    path = os.path.join(directory, "profiles_tmp.json")
    if os.path.isfile(directory):
        raise InputError("is a file, --sailor takes the directory holding profiles_tmp.json", file=directory,
                         field="--sailor", fix="write '--sailor' after the profile files (alone it means the "
                                               "packaged measurements) or '--sailor=DIR'")
    if not os.path.isfile(path):
        raise InputError("profiles_tmp.json not found in the Sailor data directory", file=directory,
                         field="--sailor", fix="pass the directory holding Sailor's profiles_tmp.json and llm_info.json, "
                                               "or '--sailor' alone for the packaged copy")
    zeros: list[str] = []
    unknown: list[str] = []
    try:
        out = _load_sailor(path, zeros, unknown)
    except (AttributeError, TypeError, ValueError, IndexError, KeyError, ZeroDivisionError) as exc:
        # the layout below, [model][gpu][micro_batch][tp][layer] = [fwd_s, bwd_s, update_s], broken somewhere
        raise InputError(f"is not laid out as Sailor's profiles_tmp.json ({type(exc).__name__}: {str(exc)[:120]})",
                         file=path, field="--sailor",
                         fix="pass Sailor's file unchanged: {model: {gpu: {micro_batch: {tp: {layer: [fwd_s, bwd_s, "
                             "update_s]}}}}}, micro-batch, TP and layer keys whole numbers (TP at least 1)") from None
    if not out:
        raise InputError("holds no usable measurements", file=path, field="--sailor",
                         fix="pass Sailor's profiles_tmp.json (models OPT-350, GPT-Neo-2.7, OPT-30, LLAMA-3-8)")
    # (every reader of the layers leaves a pass of time 0 out: sailor_samples, sailor_layer_samples, ...)
    if not quiet:
        warn_zero_times(path, zeros, "the fit and the validation use the other readings")
        if unknown:     # (they were left out without a word)
            print(f"hetauto: warning: {path}: left out {', '.join(unknown[:6])}"
                  f"{f' and {len(unknown) - 6} more' if len(unknown) > 6 else ''}: this reader knows the models "
                  f"{', '.join(SAILOR_MODELS)} and the GPUs {', '.join(SAILOR_GPUS)}", file=sys.stderr)
    prec = sailor_precisions(out)
    out = [dataclasses.replace(r, precision=prec[(r.model, r.gpu)]) for r in out]
    return with_tp_comm(out, out, read_allreduce_fits(directory))


def _load_sailor(path: str, zeros: list[str], unknown: list[str]) -> list[SailorLayer]:
    """The layers of profiles_tmp.json at `path` (load_sailor checks the layout and finishes them); each forward or
    backward time of 0 is named in `zeros` (samples.measured_time refuses a negative or non-finite one), each model
    or GPU this reader does not know in `unknown`."""
    out = []

    def reading(entry: list, where: str) -> tuple[float, float]:
        times = [measured_time(entry[k], file=path, field=name, row=where, fix="pass Sailor's measurements "
                               "unchanged, or delete the entry") for k, name in enumerate(("forward_s", "backward_s"))]
        zeros.extend(f"{where} {name}" for t, name in zip(times, ("forward_s", "backward_s")) if t == 0)
        return times[0], times[1]

    for mname, spec, gpu, (dev, peak, bw), per_mb in _profiled_runs(read_json_file(path, field="--sailor"), unknown):
        for mb, per_tp in per_mb.items():
            for tp, layers in per_tp.items():
                mb_i, tp_i = int(mb), int(tp)
                if spec.num_attention_heads % tp_i or spec.ffn_hidden_size % tp_i:
                    continue
                common = dict(hidden=spec.hidden_size, heads=spec.num_attention_heads,
                              kv_heads=spec.num_query_groups, ffn=spec.ffn_hidden_size, vocab=spec.vocab_size,
                              seq=spec.seq_length, micro_batch=mb_i, tp=tp_i, gated=int(spec.gated_mlp),
                              rope=int(spec.position_embedding == "rope"))
                idx = sorted(int(i) for i in layers)
                L = spec.num_layers
                where = f"{mname} {gpu} micro-batch {mb} TP {tp} entry"
                for i in idx:
                    if 1 <= i <= L:
                        f, b = reading(layers[str(i)], f"{where} {i}")
                        out.append(SailorLayer(mname, gpu, dev, peak, bw, F.LayerShape("transformer", **common),
                                               i, f, b))
                tail = [reading(layers[str(i)], f"{where} {i}") for i in idx if i > L]
                if tail:     # a pass of 0 in one of its entries is a part missing: that pass is left out (0)
                    f, b = (0.0 if 0 in ts else sum(ts) for ts in zip(*tail))
                    out.append(SailorLayer(mname, gpu, dev, peak, bw, F.LayerShape("head", **common),
                                           max(i for i in idx if i > L), f, b))
    return out


def with_tp_comm(layers: list[SailorLayer], rates_from: list[SailorLayer], fits: dict) -> list[SailorLayer]:
    """`layers` with their TP all-reduces set apart (`tp_comm_s`) at the rates `rates_from`'s layers ran them
    (sailor_tp_allreduce_rates, where slower than the curves `fits`). A fit leaving a model out reads the rates
    from the models it trains on only, for its held-out rows too (benchmarks/learned_cost.py)."""
    rates = sailor_tp_allreduce_rates(rates_from)
    return [dataclasses.replace(r, tp_comm_s=tp_allreduces_s(r, fits, rates)) for r in layers]


def leave_model_out(layers: list[SailorLayer], model: str, directory: str = SAILOR_DATA, fits: dict | None = None
                    ) -> tuple[list[SailorLayer], list[SailorLayer]]:
    """(training layers, held-out layers) of a fit without `model`, the TP all-reduces' rates read from the
    training models only, for the held-out rows too: load_sailor sets them from every model, the held-out one
    included, so its rows alone would let its own measurements into its prediction. `fits`: the directory's
    all-reduce curves (read_allreduce_fits), when the caller has them."""
    train = [r for r in layers if r.model != model]
    fits = read_allreduce_fits(directory) if fits is None else fits
    return with_tp_comm(train, train, fits), with_tp_comm([r for r in layers if r.model == model], train, fits)


def forward_tflops(r: SailorLayer) -> float:
    """The FLOP rate a measured transformer layer achieved in its forward pass (attention scores counted in
    full, as the unfused runs compute them)."""
    ops = r.shape.ops()
    flops = sum(o.flops() for o in ops) + sum(o.flops() for o in ops if o.kind == "attention")
    return flops / r.fwd_s / 1e12


def sailor_precisions(layers: list[SailorLayer]) -> dict[tuple, str]:
    """The arithmetic each (model, GPU) run used, which the data does not record: every run is an fp32 job
    (cost/sailor_job.py), its GEMMs on the TF32 tensor cores or on the CUDA cores.

    Rule: a run is FP32 (CUDA cores) when no transformer layer of it ever beat the GPU's FP32 (non-tensor-core)
    peak or the GPU has no TF32; one that did must have used the tensor cores, TF32 in an fp32 job ("tf32"),
    whose ceiling is the TF32 peak (`SailorLayer.compute_tflops`). A run's arithmetic is a fact of how it was launched,
    like its micro-batch, so it is recovered once per run from the whole run and never fitted.
    docs/cost-model-learned.md gives the evidence (the same project's fp16/fp32-labelled operator profiles)."""
    best: dict[tuple, float] = {}
    for r in layers:
        if r.shape.kind == "transformer" and r.fwd_s > 0:
            k = (r.model, r.gpu)
            best[k] = max(best.get(k, 0.0), forward_tflops(r))
    return {(r.model, r.gpu): ("fp32" if best.get((r.model, r.gpu), math.inf) <= SAILOR_FP32_TFLOPS[r.gpu]
                               or sailor_tf32_tflops(r.gpu) is None else "tf32")
            for r in layers}


def sailor_samples(layers: list[SailorLayer], score_bwd_weight: float = 1.0,
                   gemm_bwd_weight: float = 1.0) -> list[Sample]:
    """One row per (model, GPU, micro-batch, TP, phase) of the transformer layers: the median over the identical
    layers, so a 48-layer model does not outweigh a 24-layer one and per-layer jitter does not become signal.
    Host-bound configurations (`host_bound_times`) are left out: the calibration describes the GPU's work, and the
    host floor (`sailor_host_floors`) prices what they measured.

    The output-head rows are left out: they do not measure the same thing in every model. GPT-Neo-2.7's last
    entry is the final norm alone (0.3 ms on a GH200, 3-30 % of a logits GEMM's roofline), OPT-350's includes
    the logits and the loss, LLAMA-3-8's is split over two entries. A learned head would be whichever model it
    was fitted on; the planner prices the head (and the embedding) with the analytic model instead."""
    host = host_bound_times(layers)
    out = []
    for key, (r0, times) in config_times(layers).items():
        for phase, t in times.items():
            if t <= 0 or (key, phase) in host:
                continue
            out.append(_sailor_sample(r0, phase, t, score_bwd_weight, gemm_bwd_weight))
    return out


def read_allreduce_fits(directory: str) -> dict:
    """Sailor's measured all-reduce bandwidth per GPU and group size (intra_node_bandwidths.json) from the data
    directory, else from the packaged copy."""
    path = os.path.join(directory, "intra_node_bandwidths.json")
    if not os.path.isfile(path):
        path = os.path.join(SAILOR_DATA, "intra_node_bandwidths.json")
    return read_json_file(path, field="--sailor")


def tp_allreduces_s(r: SailorLayer, fits: dict, rates: dict | None = None) -> float:
    """The tensor-parallel all-reduces a measured layer contains, per pass (Megatron: two in the forward, two
    in the backward, each of the layer's activations), which the compute roofline does not price: on Sailor's
    all-reduce curve of the GPU, or at the bus bandwidth its layers ran them at (`rates`,
    sailor_tp_allreduce_rates) where that is slower."""
    if r.shape.kind != "transformer" or r.shape.tp <= 1:
        return 0.0
    n = r.shape.tp
    nbytes = r.shape.micro_batch * r.shape.seq * r.shape.hidden * r.dtype_bytes
    t = sailor_allreduce_s(fits.get(r.gpu, {}), nbytes, n)
    points = (rates or {}).get(tp_allreduce_key(r.device, n))
    if points:
        t = max(t, 2 * (n - 1) / n * nbytes / allreduce_rate_at(points, nbytes))
    return 2 * t


def sailor_tp_allreduce_rates(layers: list[SailorLayer]) -> dict[str, tuple]:
    """tp_allreduce_key -> ((message bytes, bus bandwidth in bytes/s), ...): the rates a GPU's TP all-reduces ran
    at inside its measured layers, by message size (samples.allreduce_rate_at reads them at any size).

    With the same model and micro-batch measured at TP 1 and TP n, the TP n pass is its compute, read as the TP 1
    pass's time per unit of roofline prior applied to the TP n shape's prior (how Megatron's split shrinks each
    GEMM), plus two all-reduces of the layer's activation, each taking half the rest: a bus bandwidth of
    2(n-1)/n x its bytes over that (the reading test_tp_all_reduces_set_apart_match_what_the_tp4_layers_measure
    checks on the A100). Read at every micro-batch measured at both; at each message size the median over the
    models and the two passes. By size because on a PCIe GPU whose all-reduces go through host memory they do not
    run at one rate: the RTX 3090's at TP 8 ran 8 MB messages (micro-batch 1) at 2.0 GB/s and 34 MB ones
    (micro-batch 4) at 1.5; one rate, read at the largest message as before, priced that GPU's micro-batch 1 and 2
    layers 39 % and 12 % slower than they ran (in sample: the fit could not take it back, a layer's compute is never
    negative).
    The fit sets a layer's all-reduces apart at this rate where it is slower than Sailor's all-reduce curve of the
    GPU (tp_allreduces_s), and the planner adds them back as set apart (sailor_set_apart_rates,
    LearnedCostModel.tp_link). It is on the PCIe GPUs
    of Sailor's MIT cluster that this matters: their layers ran the all-reduces 1.5-6x slower than Sailor's curves
    of the same nodes give (TITAN RTX at TP 8: 5.2 GB/s against 24.3; RTX 3090 at TP 8: 1.5 against 5.3), so a
    fit that set the curve's time apart left the rest to a compute roofline that cannot hold it: 31 % MAPE, worst
    122 %, over these GPUs' OPT-350 layers at TP 1-8 (in sample); 5 %, worst 45 % (micro-batch 1), at the layers'
    rate. On the A100, V100 and GH200 the readings sit around the curve (0.9-2x; A100-80 at TP 2: 0.4)."""
    groups: dict[tuple, list[SailorLayer]] = {}
    for r in layers:
        if r.shape.kind == "transformer":
            groups.setdefault((r.model, r.gpu, r.device, r.shape.tp, r.shape.micro_batch), []).append(r)
    largest: dict[tuple, int] = {}      # (model, GPU, device, TP) -> its largest micro-batch measured at TP 1 too
    for (m, g, dev, tp, mb) in groups:
        if tp > 1 and (m, g, dev, 1, mb) in groups:
            largest[(m, g, dev, tp)] = max(largest.get((m, g, dev, tp), 0), mb)
    by_size: dict[str, dict[int, list[float]]] = {}
    at_largest: dict[str, list[float]] = {}     # the readings at each model's largest micro-batch
    for (m, g, dev, tp, mb), many in sorted(groups.items()):
        if (m, g, dev, tp) not in largest or (m, g, dev, 1, mb) not in groups:
            continue
        one = groups[(m, g, dev, 1, mb)]
        nbytes = mb * many[0].shape.seq * many[0].shape.hidden * many[0].dtype_bytes
        key = tp_allreduce_key(dev, tp)
        for phase in ("fwd", "bwd"):
            t_n = statistics.median(getattr(r, f"{phase}_s") for r in many)
            t_1 = statistics.median(getattr(r, f"{phase}_s") for r in one)
            prior = {k: _layer_row(grp[0].shape, phase, grp[0].dtype_bytes, grp[0].compute_tflops, grp[0].hbm_gbps,
                                   1.0, 1.0)[1] for k, grp in ((1, one), (tp, many))}
            each = (t_n - t_1 / prior[1] * prior[tp]) / 2
            if each > 0:
                rate = 2 * (tp - 1) / tp * nbytes / each
                by_size.setdefault(key, {}).setdefault(nbytes, []).append(rate)
                if mb == largest[(m, g, dev, tp)]:
                    at_largest.setdefault(key, []).append(rate)
    out = {}
    for key, sizes in sorted(by_size.items()):
        points = tuple((float(b), statistics.median(v)) for b, v in sorted(sizes.items()))
        # Where the rate rises with the message, the small messages' time is mostly a fixed cost per call (launch,
        # latency, the host), not bandwidth: no rate to read by size (the host floor prices that cost), and such
        # readings did not carry over between models (leaving one out, A100-40 9.3 % per pass against 5.2). There
        # one rate holds for every size: each model's largest message's reading (the least latency and host time
        # in it), the median over the models and the two passes.
        if points[0][1] < points[-1][1]:
            if key not in at_largest:
                continue
            points = ((points[-1][0], statistics.median(at_largest[key])),)
        out[key] = points
    return out


@lru_cache(maxsize=8192)
def _layer_row(shape: F.LayerShape, phase: str, dtype_bytes: int, peak_tflops: float, hbm_gbps: float,
               score_bwd_weight: float, gemm_bwd_weight: float) -> tuple[tuple, float, float]:
    """F.layer_row of one configuration and its unfused softmax passes: the identical layers of a measured
    configuration share them, and the weight choice (backward_weights.choose_weights) builds every sample many times over."""
    feats, prior = F.layer_row(shape, phase, dtype_bytes=dtype_bytes, peak_tflops=peak_tflops, hbm_gbps=hbm_gbps,
                               score_bwd_weight=score_bwd_weight, gemm_bwd_weight=gemm_bwd_weight)
    return tuple(feats), prior, F.unfused_softmax_s(shape, phase, dtype_bytes, hbm_gbps)


def _sailor_sample(r: SailorLayer, phase: str, t: float, score_bwd_weight: float = 1.0,
                   gemm_bwd_weight: float = 1.0, index: str | None = None) -> Sample:
    g = F.backward_gemm_weight(r.device, r.precision, gemm_bwd_weight)
    feats, prior, softmax_s = _layer_row(r.shape, phase, r.dtype_bytes, r.compute_tflops, r.hbm_gbps,
                                         score_bwd_weight, g)
    label = (f"{r.model} {r.gpu} {r.shape.kind} mb={r.shape.micro_batch} tp={r.shape.tp} #{index or r.index} "
             f"{r.precision}")
    # known, not learned: the TP all-reduces and, past the fused softmax kernel's reach, PyTorch's softmax passes
    known = r.tp_comm_s + softmax_s
    return Sample("layer", phase, r.device, feats, prior, t, r.model, label, known, r.precision, r.shape.tp)


def sailor_device_infos(layers: list[SailorLayer]) -> dict[str, DeviceInfo]:
    """One DeviceInfo per GPU, in the arithmetic the model can price it in: fp32 with TF32 GEMMs when any run of
    that GPU used the tensor cores, else fp32 on the CUDA cores (a GPU measured only so, like the V100-16 here, is
    priced in that arithmetic only: its rate is never taken from other GPUs' tensor-core runs). No Sailor GPU
    prices a 16-bit plan: none was measured in one."""
    count: dict[str, int] = {}
    tensor: set[str] = set()
    for r in layers:
        count[r.device] = count.get(r.device, 0) + 1
        if r.precision == "tf32":
            tensor.add(r.device)
    # the figures the features of that arithmetic were computed with (an fp32 run's compute ceiling is the FP32 peak)
    first = {r.device: r for r in layers if (r.device in tensor) == (r.precision == "tf32")}
    return {d: DeviceInfo(d, "layer", first[d].dtype_bytes, first[d].compute_tflops, first[d].hbm_gbps, n, "sailor",
                          first[d].precision)
            for d, n in count.items()}


def sailor_layer_samples(layers: list[SailorLayer], score_bwd_weight: float = 1.0,
                         gemm_bwd_weight: float = 1.0) -> list[Sample]:
    """Every measured layer as its own row (validation compares per layer, not per configuration median)."""
    return [_sailor_sample(r, ph, getattr(r, f"{ph}_s"), score_bwd_weight, gemm_bwd_weight) for r in layers
            for ph in ("fwd", "bwd") if getattr(r, f"{ph}_s") > 0]


def _index_ranges(indices: list[int]) -> str:
    """2, 3, 4, 6 -> '2-4,6'."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def sailor_reading_samples(layers: list[SailorLayer], score_bwd_weight: float = 1.0,
                           gemm_bwd_weight: float = 1.0) -> list[Sample]:
    """One row per distinct reading: the layers of one configuration and phase whose times are equal to the last
    digit are one reading that profiles_tmp.json repeats for the model's identical layers (5,665 of the packaged
    6,067 transformer layers repeat another of their configuration's: copies, not measurements), and would be
    as many identical rows of a validation; its row names the layers it stands for ('#2-24')."""
    groups: dict[tuple, list[SailorLayer]] = {}
    for r in layers:
        for ph in ("fwd", "bwd"):
            if getattr(r, f"{ph}_s") > 0:
                groups.setdefault((config_key(r), ph, getattr(r, f"{ph}_s")), []).append(r)
    return [_sailor_sample(rs[0], ph, t, score_bwd_weight, gemm_bwd_weight, _index_ranges([r.index for r in rs]))
            for (_, ph, t), rs in groups.items()]
