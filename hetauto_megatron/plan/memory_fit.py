"""A stage's memory, the layers that fit in it, and the memory job a plan must also fit as.

What a stage holds comes from the memory model (cost/memory.py) under the mesh's runtime settings; with a memory
job (`--memory-job`, or Sailor's Megatron-DeepSpeed job for devices priced from Sailor's fp32 measurements) the
stage must also fit as that job would hold memory. Kept apart from the stage profile (plan/costing.py) because
it is the planner's one memory verdict: the simulator, the layer split's caps (plan/memory_caps.py) and the
search's screening all ask it.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from ..cost.activations import (DRY_RUN_IMPL, TRANSFORMER_ENGINE, TRANSFORMER_ENGINE_UNFUSED_ATTENTION,
                                TRANSFORMER_ENGINE_UNFUSED_ATTENTION_FP32, LayerImpl)
from ..cost.deepspeed_layers import deepspeed_pipeline_impl
from ..cost.memory import (JobMemory, job_stage_memory_bytes, job_stage_memory_candidates_reader,
                           job_stage_memory_reader, stage_memory_bytes,
                           stage_memory_candidates_reader as _stage_candidates_reader,
                           stage_memory_reader as _stage_reader)
from ..cost.sailor_job import SAILOR_ELEMENT_BYTES
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from .engines import ENGINES
from .settings import MEGATRON_DEFAULT_DROPOUT, RuntimeSettings

if TYPE_CHECKING:     # (costing imports this module: the profile is only named here)
    from .costing import StageProfile


def memory_job_of(cost_model, device):
    """The job a stage on `device` must also fit as (StageProfile.memory_job): the one asked for (--memory-job),
    else Sailor's Megatron-DeepSpeed job for an fp32 plan whose device the cost model prices from Sailor's
    measurements: those are that fp32 job's layers (unfused attention, its framework), so the plan must also hold
    in memory as that job does (docs/peers.md). None: this plan's runtime alone."""
    job = getattr(cost_model, "memory_job", None)
    if job is None and device.precision == "fp32" and hasattr(cost_model, "coverage"):
        info = cost_model.coverage(device)[0]
        if info is not None and info.source == "sailor":
            return sailor_deepspeed_job()
    return job


def resolve_memory_job(cost_model, inventory: Inventory) -> list[str]:
    """Decide the memory job of a whole plan on `inventory` (at the plan's precision) before it is priced: one
    job, so once any device is priced from Sailor's fp32 measurements (memory_job_of), every cluster's stages,
    also those another model prices, must fit as Sailor's Megatron-DeepSpeed job holds memory. Sets
    `cost_model.memory_job` and returns those devices' names (sorted; empty if a job was already asked for or
    none is priced so). Every command that prices a plan calls it, so they all give the same verdict."""
    if getattr(cost_model, "memory_job", None) is not None:
        return []
    names = sorted({c.device.name for c in inventory.clusters if memory_job_of(cost_model, c.device) is not None})
    if names:
        cost_model.memory_job = sailor_deepspeed_job()
    return names


def layer_impl(prof: StageProfile) -> LayerImpl:
    """How the mesh's layers keep their activations (layers_of)."""
    return layers_of(prof.settings, prof.cluster.device)


def layers_of(settings: RuntimeSettings, device) -> LayerImpl:
    """How the layers the settings' engine runs keep their activations on `device` (a DeviceType at the job's
    precision): DeepSpeed's engine runs hetauto's pipeline module of torch layers (deepspeed_pipeline_impl: K and V
    at their GQA width or repeated to every head, by what torch's attention kernel on the device takes; on CPU its
    checkpoints' RNG states); Megatron with fused attention (RuntimeSettings.fused_attention) Transformer Engine's
    count, with unfused attention (Transformer Engine in fp32 or on a V100) its unfused count (by the precision: its
    softmax's backward differs), and on CPU processes
    Megatron's local spec, which the dry runs build (DRY_RUN_IMPL, what they predict and measure)."""
    if ENGINES[settings.engine].layers == "torch":
        return deepspeed_pipeline_impl(device)
    if settings.fused_attention(device):
        return TRANSFORMER_ENGINE
    if device.vendor == "cpu":
        return DRY_RUN_IMPL
    # its softmax's backward holds 4 s x s tensors in fp32 (torch's), 2 in 16 bits (its kernel)
    return TRANSFORMER_ENGINE_UNFUSED_ATTENTION_FP32 if device.dtype_bytes == 4 else TRANSFORMER_ENGINE_UNFUSED_ATTENTION


def stage_memory(model: ModelSpec, prof: StageProfile, layers: int, in_flight: int, first: bool,
                 last: bool, boundary_buffers: int = 0) -> dict[str, float]:
    """Bytes on the busiest device of the stage (cost/memory.py). With a memory job (`--memory-job`), `total` is
    the larger of what this plan's runtime holds and what that job would hold (`job_total`): the stage must fit
    both ways."""
    mem = stage_memory_bytes(model, layers=layers, tp=prof.tp, dp=prof.dp, micro_batch_size=prof.micro_batch_size,
                             recompute=prof.recompute, in_flight=in_flight, first=first, last=last,
                             settings=prof.settings, vendor=prof.cluster.device.vendor,
                             dtype_bytes=prof.cluster.device.dtype_bytes, impl=layer_impl(prof),
                             boundary_buffers=boundary_buffers, overhead=prof.cluster.overhead,
                             precision=prof.cluster.device.precision)
    if prof.memory_job is not None:
        job = job_stage_memory_bytes(prof.memory_job, model, layers=layers, tp=prof.tp, dp=prof.dp,
                                     micro_batch_size=prof.micro_batch_size, recompute=prof.recompute,
                                     in_flight=in_flight, first=first, last=last,
                                     vendor=prof.cluster.device.vendor, overhead=prof.cluster.overhead)
        mem = {**mem, "job_total": job["total"], "total": max(mem["total"], job["total"])}
    return mem


def stage_memory_reader(model: ModelSpec, prof: StageProfile, first: bool, last: bool):
    """stage_memory(...)["total"] of a stage as a function of (layers, in_flight, boundary_buffers), the same
    floats, with the stage configuration's terms looked up once: what the memory caps (plan/memory_caps.py) read,
    several times per configuration and thousands of configurations per search."""
    dev = prof.cluster.device
    total = _stage_reader(model, tp=prof.tp, dp=prof.dp, micro_batch_size=prof.micro_batch_size,
                          recompute=prof.recompute, first=first, last=last, settings=prof.settings, vendor=dev.vendor,
                          dtype_bytes=dev.dtype_bytes, impl=layer_impl(prof), overhead=prof.cluster.overhead,
                          precision=dev.precision)
    if prof.memory_job is None:
        return total
    job = job_stage_memory_reader(prof.memory_job, model, tp=prof.tp, dp=prof.dp,
                                  micro_batch_size=prof.micro_batch_size, recompute=prof.recompute, first=first,
                                  last=last, vendor=dev.vendor, overhead=prof.cluster.overhead)

    def larger(layers: int, in_flight: int, boundary_buffers: int = 0) -> float:     # it must fit both ways
        return max(total(layers, in_flight, boundary_buffers), job(layers, in_flight))
    return larger


def stage_memory_candidates(model: ModelSpec, prof: StageProfile, first: bool, last: bool):
    """stage_memory_reader's total as its candidates for the peak (cost/memory.py stage_memory_candidates_reader):
    a function of (layers, in_flight, boundary_buffers) giving a tuple of candidates, each a tuple of pieces that
    are each affine in the three; the total is the largest candidate's smallest piece. With a memory job, that
    job's candidates too (the stage must fit both ways). What the memory caps (plan/memory_caps.py) fit: the total
    is the largest of several lines, and one line fitted through it misses the kinks between them."""
    dev = prof.cluster.device
    own = _stage_candidates_reader(model, tp=prof.tp, dp=prof.dp, micro_batch_size=prof.micro_batch_size,
                                   recompute=prof.recompute, first=first, last=last, settings=prof.settings,
                                   vendor=dev.vendor, dtype_bytes=dev.dtype_bytes, impl=layer_impl(prof),
                                   overhead=prof.cluster.overhead, precision=dev.precision)
    if prof.memory_job is None:
        return own
    job = job_stage_memory_candidates_reader(prof.memory_job, model, tp=prof.tp, dp=prof.dp,
                                             micro_batch_size=prof.micro_batch_size, recompute=prof.recompute,
                                             first=first, last=last, vendor=dev.vendor,
                                             overhead=prof.cluster.overhead)

    def both(layers: int, in_flight: int, boundary_buffers: int = 0) -> tuple:
        return own(layers, in_flight, boundary_buffers) + job(layers, in_flight)
    return both


def sailor_deepspeed_job() -> JobMemory:
    """Sailor's Megatron-DeepSpeed fork as its simulator counts memory (sailor/Planner/simulations/
    runtime_simulator.py `check_config_fits`; docs/peers.md): fp32 training, Adam state on every DP rank (no ZeRO),
    no sequence parallelism, unfused attention keeping the s x s softmax output, hidden dropout (Megatron's 0.1) but
    no attention dropout (what Sailor's per-layer measurements show: 360 MB per OPT-350 layer at micro-batch 1 in
    fp32, less than the scores with a dropout mask and output would take alone), and 8 bytes per parameter beyond
    weights + gradients + Adam: DeepSpeed's gradient communication buffer (4) and its extra model copy (4). Run by
    DeepSpeed's pipeline engine (the settings' engine, plan/engines.py ENGINES): the memory model adds the pipe
    buffers that engine keeps (cost/pipe_buffers.py), as it does for a plan made with --engine deepspeed."""
    return JobMemory("sailor-deepspeed",
                     RuntimeSettings(sequence_parallel=False, distributed_optimizer=False, overlap_grad_reduce=False,
                                     overlap_param_gather=False, hidden_dropout=MEGATRON_DEFAULT_DROPOUT,
                                     attention_dropout=0.0, engine="deepspeed"),
                     LayerImpl(flash_attention=False), SAILOR_ELEMENT_BYTES, 8.0)   # fp32: cost/sailor_job.py


MEMORY_JOBS = {"sailor-deepspeed": sailor_deepspeed_job}


@lru_cache(maxsize=262144)
def max_layers_in_memory(model: ModelSpec, prof: StageProfile, in_flight: int, first: bool, last: bool,
                         boundary_buffers: int = 0) -> int:
    """Largest layer count a stage can hold, -1 if even zero layers do not fit.

    Memory is affine in the layer count from one layer on, not from zero: under full recomputation the first
    layer also brings the buffer one layer's recomputed activations need. So the slope is taken between one and
    two layers (between zero and one it would count that buffer once per layer and understate the cap), and the
    count is checked against the memory model at its edge so that rounding never overstates it."""
    reading = stage_memory_reader(model, prof, first, last)

    def need(n: int) -> float:
        return reading(n, in_flight, boundary_buffers)

    return layers_that_fit(need, prof.memory_cap, model.num_layers)


def cap_ceiling(num_layers: int) -> int:
    """The largest layer cap `layers_that_fit` reports: twice the model's layers, and at least 400 (past it a cap
    no longer binds any stage of the model)."""
    return max(2 * num_layers, 400)


def layers_that_fit(need, limit: float, num_layers: int) -> int:
    """The largest n with need(n) <= limit, -1 if even need(0) exceeds it; `need` (bytes for n layers) grows
    with n, mostly affinely from one layer on: a step from the slope between one and two layers, then bisected
    against `need` to the exact edge so that rounding or a bend never overstates it (need(n) > limit for n
    above). need(0) is only asked when not even one layer fits. (`num_layers` when a layer costs nothing.)
    A cap above `cap_ceiling(num_layers)` is that ceiling: the stage then holds every layer of the model with room to
    spare, and each reading of `need` walks its n layers (a memory_gib of 1e9 asked for a billion-layer edge)."""
    one = need(1)
    if one > limit:
        return -1 if need(0) > limit else 0
    per = need(2) - one
    if per <= 0:
        return num_layers
    ceiling = cap_ceiling(num_layers)
    n = min(1 + int((limit - one) // per), ceiling)
    # need is not affine everywhere (DeepSpeed's state is the largest of three affine sets, one with a fixed
    # bucket), so the step may miss by far: a small model's cap is tens of thousands of layers, which a walk
    # one layer at a time took 250,000 readings to reach. Bisect between a count that fits and one that does not.
    if need(n) > limit:
        lo, hi = 1, n
    else:
        lo, step = n, 1
        while lo + step < ceiling and need(lo + step) <= limit:
            lo, step = lo + step, 2 * step
        hi = min(lo + step, ceiling)
        if hi == ceiling and need(ceiling) <= limit:
            return ceiling
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid) <= limit else (lo, mid)
    return lo
