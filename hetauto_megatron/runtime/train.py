"""The dry-run training loop: a plan's real Megatron-Core layout trained for a few steps on synthetic tokens.

Per rank: groups from the plan, the rank's GPTModel stage, Megatron's DDP (on the mesh's DP group), Megatron's
optimizer (Adam + gradient clipping), Megatron's 1F1B schedule with `HeteroP2PCommunicator`. DDP and optimizer
are configured from the mesh's runtime settings (plan/settings.py; by default the distributed optimizer with
the gradient reduce-scatter and the parameter all-gather overlapped, as production Megatron jobs run). The same
code with `reference_plan(plan)` (one process, whole model, the whole micro-batch step in one micro-batch,
plain optimizer) is the single-device reference the heterogeneous run must match.

Data: for optimizer step s and micro-batch m, the step's samples are drawn from a generator seeded by
(seed, s, m); a DP replica takes its contiguous share (`Plan.sample_range`: mesh after mesh when several meshes
hold a stage side by side). Every layout therefore sees the same samples. With several pipelines the
iteration's whole global batch is one draw (micro-batch 0 of all its samples) and pipeline p trains the
samples after those of pipelines < p (`pipeline_samples`); their reference trains the whole batch as one
micro-batch: the same samples again.
"""
from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager

from ..plan.plan import Mesh, Plan
from .model import TORCH_DTYPES

# Small enough that Adam's sign-like first steps do not amplify fp32 summation-order noise between layouts.
LEARNING_RATE = 1e-3
CLIP_GRAD = 1.0


def reference_plan(plan: Plan) -> Plan:
    """The same model, batch and micro-batch count on one CPU process (tp 1, dp 1, one stage), with the plain
    optimizer and no overlap: the simplest way Megatron trains the model, not the code path under test."""
    from .layout import PipelineLayout

    step = PipelineLayout(plan).step if plan.num_pipelines == 1 else plan.global_batch_size
    mesh = Mesh(cluster="reference", device_type="cpu", tp=1, dp=1, micro_batch_size=step,
                recompute="none", stage_layers=(plan.model.num_layers,),
                setting_overrides={"distributed_optimizer": False, "overlap_grad_reduce": False,
                                   "overlap_param_gather": False})
    return dataclasses.replace(plan, meshes=(mesh,), pipeline_samples=(), inventory=None, estimate=None)


def pipeline_samples(plan, pipeline: int, *, seed: int, step: int):
    """With several pipelines: the (samples_p, seq + 1) token ids pipeline `pipeline` trains in optimizer step
    `step`, its slice of the one draw of the whole global batch (samples in pipeline order)."""
    start = sum(plan.samples_per_pipeline[:pipeline])
    whole = step_tokens(plan.model, seed=seed, step=step, micro=0, batch=plan.global_batch_size)
    return whole[start:start + plan.samples_per_pipeline[pipeline]]


def step_tokens(spec, *, seed: int, step: int, micro: int, batch: int):
    """(batch, seq + 1) token ids of one micro-batch step: the same for every layout."""
    import torch

    g = torch.Generator().manual_seed(((seed * 100_003 + step) * 10_007 + micro) % (2 ** 63))
    return torch.randint(0, spec.vocab_size, (batch, spec.seq_length + 1), generator=g)


def ddp_settings(settings, precision: str = "fp32") -> dict:
    """Megatron's DistributedDataParallelConfig fields for a mesh's runtime settings (plan/settings.py) at the
    precision its ranks train in, spelled as Megatron-LM's `get_megatron_ddp_config` derives them from the command
    line. Its gradient check (each bucket's norm validated before the bucket is reduced) follows
    --check-for-nan-in-loss-and-grad, on by default, which validate_args turns off for fp16's dynamic loss scaler
    (the launches set no --loss-scale, which --hetauto refuses: megatron/unpriced.py check_loss_scale);
    plan/tail_costs.py prices its pass over the gradients."""
    from ..plan.tail_costs import checks_gradients
    return dict(use_distributed_optimizer=settings.distributed_optimizer,
                overlap_grad_reduce=settings.overlap_grad_reduce,
                overlap_param_gather=settings.overlap_param_gather,
                grad_reduce_in_fp32=settings.grad_reduce_dtype == "fp32",
                check_for_nan_in_grad=checks_gradients(precision))


def train_rank(rank: int, world_size: int, plan: Plan, steps: int, seed: int, timeout_s: float = 60.0,
               dry_run: bool = True, vocab_size: int | None = None, emulate_links: float | None = None,
               timeout_flag: str | None = None) -> dict:
    """Train `steps` optimizer steps as `rank` of `plan` (whose model is used as is: shrink it first for
    `--tiny`). `vocab_size`: the padded table size (default the plan's; a reference run passes the size of the
    plan it checks). `emulate_links`: cross-cluster transfers take the plan inventory's link time x this scale
    (runtime/cross_link.py). Returns {"losses", "grad_norms", "bytes", "step_times", "exposed_s", "ops",
    "settings", "shared"}; "exposed_s" is per step the time this rank waited on cross-cluster transfers
    (pipeline boundaries, and the emulated holders' exchange); losses and norms are global, "settings" are this
    rank's runtime settings as Megatron built them (`settings_that_ran`), "shared" its values of the parameters
    other mesh stages also hold, after the last step (replica_sync.ReplicaSync.held_values)."""
    from .groups import build_groups
    from .liveness import Liveness, naming_lost_peers
    from .rendezvous import init_distributed

    init_distributed(plan, rank, world_size, timeout_s=timeout_s, dry_run=dry_run, timeout_flag=timeout_flag)
    ctx = build_groups(plan, rank, world_size, timeout_s=timeout_s, dry_run=dry_run)
    # every rank's listener address, learnt while every rank is there: a rank that goes away later is named, not
    # gloo's socket (runtime/liveness.py, as under Megatron-LM's --hetauto)
    liveness = Liveness.start(ctx)
    with naming_lost_peers(liveness):
        return _train(ctx, plan, steps, seed, timeout_s, vocab_size, emulate_links)


def _train(ctx, plan: Plan, steps: int, seed: int, timeout_s: float, vocab_size: int | None,
           emulate_links: float | None) -> dict:
    """train_rank's training, once this rank's groups (`ctx`) are built."""
    import torch
    import torch.distributed as dist
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel.schedules import (forward_backward_no_pipelining,
                                                           forward_backward_pipelining_without_interleaving)

    from .communicator import HeteroP2PCommunicator
    from .gradients import count_grad_norm_once, make_finalize_model_grads
    from .groups import set_megatron_globals
    from .memory_meter import state_storages
    from .model import build_model, causal_mask, transformer_config
    from .op_timing import OpClock

    set_megatron_globals(ctx)
    spec, mesh, c = plan.model, ctx.mesh, ctx.coords
    on_device = ctx.device == "cuda"
    if on_device and ctx.precision == "fp32":
        # an fp32 plan's GEMMs on TF32 or not, as it was priced and as its launch scripts set it (before any GEMM)
        from .device import set_fp32_arithmetic
        set_fp32_arithmetic(plan, mesh.cluster, mesh.device_type)
    if on_device:       # what the device holds before any tensor of ours: the runtime's context, a first kernel's
        (torch.ones(1, device="cuda") + 1).item()
        free, total = torch.cuda.mem_get_info()
        context = total - free - torch.cuda.memory_reserved()
    config = transformer_config(plan, ctx, spec)
    model = build_model(ctx, spec, config, seed=seed, vocab_size=vocab_size)
    settings = mesh.settings
    ddp = DistributedDataParallel(config=config, module=model, pg_collection=ctx.pg,
                                  ddp_config=DistributedDataParallelConfig(**ddp_settings(settings, ctx.precision)))
    comm = HeteroP2PCommunicator(ctx, config, timeout_s=timeout_s)
    links, scalar_hold = None, 0.0
    if emulate_links is not None:      # the inventory's links, for the pipeline's and the exchange's emulation
        from ..plan.tail_costs import world_scalar_between_clusters
        from ..spec.inventory import inventory_from_dict
        links = inventory_from_dict(plan.inventory)
        comm.emulate_links(emulate_links, links)
        # and the scalars all-reduced over the world (the result check, the global norm), which cross every link
        # of the world's ring: on one machine its hops between "clusters" are the loopback's, so each rank holds
        # for theirs once the result is known (every rank is past the all-reduce then: the same as the all-reduce
        # taking that much longer)
        scalar_hold = world_scalar_between_clusters(links, plan.meshes) * emulate_links
    config.no_sync_func = ddp.no_sync
    if settings.overlap_grad_reduce:
        # As Megatron-LM does (align_grad_reduce, its default): stages other than the first launch their last
        # gradient reductions in the pipeline bubble.
        config.grad_sync_func = ddp.start_grad_sync
    replicas = None
    if ctx.replica_group is not None:
        # parameters that several mesh stages hold (meshes side by side at a stage, other pipelines, the tied
        # embedding table at both ends): summed across them after each mesh's DP reduction, weighted by their
        # share of the batch (replica_sync.py)
        from .replica_sync import ReplicaSync
        replicas = ReplicaSync(ctx, [ddp], counter=comm.bytes_sent)
        if emulate_links is not None:       # the exchange's messages between clusters over the emulated links too
            replicas.emulate_links(emulate_links, links)
    config.finalize_model_grads_func = make_finalize_model_grads(ctx, replicas)
    # 16-bit parameters train with fp32 main parameters in the optimizer, as Megatron-LM's --bf16 / --fp16 do
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=LEARNING_RATE, clip_grad=CLIP_GRAD,
                                                 params_dtype=config.params_dtype, bf16=config.bf16,
                                                 fp16=config.fp16,
                                                 use_distributed_optimizer=settings.distributed_optimizer),
                                 [ddp], pg_collection=ctx.pg, use_gloo_process_groups=False)
    if config.fp16:     # Megatron-LM's: the loss is scaled by the optimizer's loss scaler, which unscales it
        config.grad_scale_func = opt.scale_loss
    count_grad_norm_once(opt, ctx, replicas)
    clock = OpClock().install(comm, config)   # per-operation stamps for measured timelines (op_timing.py)

    layout = ctx.layout
    seq, mbs, batch = spec.seq_length, mesh.micro_batch_size, layout.step
    first, last = c.sample_start, c.sample_stop   # this replica's samples of every step
    dev = ctx.device
    causal = causal_mask(seq, dev)

    # Megatron-LM's result validation (its default --rerun-mode validate_results), as its training loop runs it:
    # the loss function rejects a NaN or infinite loss, and after each forward-backward pass every rank learns
    # whether any rank rejected its loss, one scalar all-reduced over the world (plan/tail_costs.py
    # result_check_time); a rejected step is run again, and a rejection it reproduces stops the run
    rerun = result_validation()

    def loss_func(per_token_loss):
        loss = per_token_loss.float().mean()
        for rejected, what in ((torch.isnan, "NaN"), (torch.isinf, "Inf")):
            rerun.validate_result(result=loss, rejection_func=rejected, tolerance=0.0, fatal=True,
                                  message=f"found {what} in local forward loss calculation")
        return loss, {"lm loss": loss.detach().clone()}

    def forward_step(data_iterator, module):
        tokens = next(data_iterator)
        # one row of position ids per sample, each micro-batch its own, as Megatron-LM's batch (its get_batch):
        # learned positions keep them for the backward (cost/activations.py LayerImpl.position_ids_per_sample)
        positions = torch.arange(seq, device=dev).repeat(mbs, 1)
        out = module(tokens[:, :-1].contiguous(), positions, causal, labels=tokens[:, 1:].contiguous())
        return out, loss_func

    losses, norms, times, exposed = [], [], [], []

    def waited() -> float:
        """Seconds this rank has waited on cross-cluster transfers: the pipeline's, the holders' exchange's."""
        return comm.exposed_s() + (replicas.emulated_s if replicas is not None else 0.0)

    meter, alloc = None, {}
    for step in range(steps):
        t0 = time.perf_counter()
        clock.begin_step(t0)
        if plan.num_pipelines == 1:
            step_batches = [step_tokens(spec, seed=seed, step=step, micro=m, batch=batch)
                            for m in range(layout.num_micro_batches)]
        else:
            mine = pipeline_samples(plan, c.pipeline, seed=seed, step=step)
            step_batches = [mine[m * batch:(m + 1) * batch] for m in range(layout.num_micro_batches)]
        data = [tokens[first:last].to(dev) for tokens in step_batches]
        with _metered(step == 0, model, ddp, opt, alloc, ctx.device) as meter_now:   # memory: the first step only (untimed)
            meter = meter_now or meter
            comm.meter = meter_now      # the boundary buffers an overlapped link holds count too (measured step)
            before = waited()
            while rerun.should_run_forward_backward(None):     # the result check after the pass, as Megatron-LM's
                ddp.zero_grad_buffer()
                opt.zero_grad()
                common = dict(forward_step_func=forward_step, data_iterator=iter(data), model=[ddp],
                              num_microbatches=layout.num_micro_batches, seq_length=seq, micro_batch_size=mbs,
                              forward_only=False, pg_collection=ctx.pg)
                if layout.num_stages > 1:
                    comm.begin_step(layout.num_micro_batches)
                    results = forward_backward_pipelining_without_interleaving(p2p_communicator=comm, **common)
                    comm.end_step()
                else:
                    results = forward_backward_no_pipelining(**common)
            if scalar_hold:
                time.sleep(scalar_hold)
            if layout.num_stages > 1 or replicas is not None:
                exposed.append(waited() - before)
        if rerun.should_checkpoint_and_exit()[1]:
            raise RuntimeError(f"step {step}: a loss rejected as NaN or infinite, again when the step was run again "
                               "(Megatron-LM's result validation stops the job here)")
        with clock.span("optimizer"):
            _, grad_norm, _ = opt.step()
            if scalar_hold:
                time.sleep(scalar_hold)
        if on_device:
            torch.cuda.synchronize()
        t_end = time.perf_counter()
        times.append(t_end - t0)
        clock.end_step(t_end)
        # The loss lives on the last stage; weight each replica by its share of the step's samples (1 / dp for a
        # mesh alone at the stage) and its pipeline's share of the global batch, and give the sum to everyone.
        value = 0.0
        if ctx.is_last_stage and c.tp_rank == 0:
            value = sum(r["lm loss"].item() for r in results) / len(results) * mbs / batch * layout.samples / \
                plan.global_batch_size
        total = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(total, group=ctx.world_gloo)
        losses.append(total.item())
        norms.append(float(grad_norm))
    clock.uninstall()
    comm.staging.close()       # the communication thread (accelerators): every send completed in end_step
    shared = replicas.held_values([ddp]) if replicas is not None else []
    # after a step (Adam's moments exist), as the next step's forward holds it: zero_grad frees the fp32 gradient
    # copies the step made (16-bit gradient buffers), as train_step does before each forward; the memory model
    # prices those copies in the step's set, apart from the activations (cost/memory.py)
    opt.zero_grad()
    state = state_storages(model, ddp, opt)
    memory = {k: state[k] for k in ("weights", "gradients", "optimizer")}
    memory.update(activations=meter.peak, allocator_peak=alloc.get("peak", 0))
    if on_device:       # the device's own readings (this process alone on it): the allocator's peaks from the
                        # first step on (allocator_peak resets them there), the bytes in use at the end
        free, total = torch.cuda.mem_get_info()
        memory["device"] = {"context": context, "allocated_peak": torch.cuda.max_memory_allocated(),
                            "reserved_peak": torch.cuda.max_memory_reserved(), "in_use": total - free}
    dist.barrier(group=ctx.world_gloo)
    dist.destroy_process_group()
    return {"losses": losses, "grad_norms": norms, "bytes": dict(comm.bytes_sent), "step_times": times,
            "exposed_s": exposed,
            "ops": clock.steps, "memory": memory,
            "settings": settings_that_ran(config, ddp.ddp_config, opt, ddp.buffers), "shared": shared}


def result_validation():
    """Megatron-Core's rerun state machine in the mode Megatron-LM's training loop runs by default (validate_results),
    set up as Megatron-LM's initialize does it: a step run again starts from the same RNG states."""
    from megatron.core import tensor_parallel
    from megatron.core.rerun_state_machine import (RerunMode, get_rerun_state_machine,
                                                   initialize_rerun_state_machine)

    tracker = tensor_parallel.get_cuda_rng_tracker
    initialize_rerun_state_machine(state_save_func=lambda: {"rng_tracker_states": tracker().get_states()},
                                   state_restore_func=lambda s: tracker().set_states(s["rng_tracker_states"]),
                                   mode=RerunMode.VALIDATE_RESULTS)
    return get_rerun_state_machine()


@contextmanager
def _metered(on: bool, model, ddp, opt, alloc: dict, device: str = "cpu"):
    """Measure the memory of the step it wraps (runtime/memory_meter.py) when `on`: the saved-tensor peak
    (yields the meter) and the allocator's peak (into `alloc`); yields None and measures nothing otherwise."""
    if not on:
        yield None
        return
    from .memory_meter import SavedTensorMeter, allocator_peak, state_storages
    meter = SavedTensorMeter(exclude=state_storages(model, ddp, opt)["_storages"])
    with allocator_peak(alloc, device), meter.metering():
        yield meter


_DTYPE_NAMES = {f"torch.{name}": precision for precision, name in TORCH_DTYPES.items()}


def settings_that_ran(config, ddp_config, optimizer, grad_buffers=()) -> dict:
    """The runtime settings (plan/settings.py keys) read back from the objects Megatron built, so a report
    says what ran rather than what was asked for; plus "grad_buffer_dtype", the element type of the DDP gradient
    buffers the reduction runs in (`grad_buffers`: DistributedDataParallel.buffers), which names the dtype that
    grad_reduce_dtype "param" stands for."""
    subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    dtypes = sorted({_DTYPE_NAMES.get(str(b.grad_dtype), str(b.grad_dtype)) for b in grad_buffers})
    return {"sequence_parallel": bool(config.sequence_parallel),
            "distributed_optimizer": all(s.config.use_distributed_optimizer for s in subs),
            "overlap_grad_reduce": bool(ddp_config.overlap_grad_reduce),
            "overlap_param_gather": bool(ddp_config.overlap_param_gather),
            "grad_reduce_dtype": "fp32" if ddp_config.grad_reduce_in_fp32 else "param",
            "grad_buffer_dtype": "/".join(dtypes) or None,
            "hidden_dropout": float(config.hidden_dropout), "attention_dropout": float(config.attention_dropout)}
