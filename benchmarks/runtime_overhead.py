"""What hetauto's runtime costs compared with plain Megatron-Core (CPU, gloo, forked ranks).

1. Iteration time: the same homogeneous layout (one mesh, TP 2 x PP 2, 4 ranks) trained through hetauto's
   groups + HeteroP2PCommunicator + gradient rules, and through Megatron's own initialize_model_parallel +
   P2PCommunicator. Prints the median per-iteration time of each and the ratio (target <= 1.05).
2. Inter-cluster path: one activation-sized tensor per message across a cluster boundary, through the
   communicator's host-staged gloo path vs a raw gloo send/recv of the same bytes. Prints both throughputs and
   the ratio (target >= 0.8).

    python benchmarks/runtime_overhead.py [--steps 8] [--mbytes 16] [--reps 10]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hetauto_megatron.plan.plan import plan_from_dict  # noqa: E402
from hetauto_megatron.runtime.dryrun import preload_megatron, prepare_plan  # noqa: E402
from hetauto_megatron.runtime.launcher import launch  # noqa: E402
from hetauto_megatron.spec.model import PRESETS  # noqa: E402


def homogeneous_plan(model):
    return plan_from_dict({"version": 1, "model": model, "global_batch_size": 8, "meshes": [
        {"cluster": "a", "device_type": "cpu", "tp": 2, "dp": 1, "micro_batch_size": 2, "stage_layers": [4, 4]}]})


def megatron_baseline(rank, world, plan, steps, seed):
    """The same training loop on Megatron's own groups; the schedule makes its own P2PCommunicator."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel.schedules import forward_backward_pipelining_without_interleaving
    from megatron.core.process_groups_config import ProcessGroupCollection

    from hetauto_megatron.runtime.device import enable_cpu_redirects
    from hetauto_megatron.runtime.groups import RankContext
    from hetauto_megatron.runtime.model import build_model, transformer_config
    from hetauto_megatron.runtime.ranks import rank_coords
    from hetauto_megatron.runtime.train import CLIP_GRAD, LEARNING_RATE, ddp_settings, step_tokens

    enable_cpu_redirects()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = plan.meshes[0]
    ps.initialize_model_parallel(tensor_model_parallel_size=mesh.tp, pipeline_model_parallel_size=mesh.num_stages)
    pg = ProcessGroupCollection.use_mpu_process_groups()
    ctx = RankContext(plan=plan, coords=rank_coords(plan, rank), world_size=world, pg=pg, world_gloo=None,
                      dry_run=True)
    config = transformer_config(plan, ctx, plan.model)
    model = build_model(ctx, plan.model, config, seed=seed)
    # the mesh's runtime settings, as the hetauto run uses them (distributed optimizer, overlaps, SP in `config`)
    ddp = DistributedDataParallel(config=config, module=model,
                                  ddp_config=DistributedDataParallelConfig(**ddp_settings(mesh.settings)))
    config.no_sync_func = ddp.no_sync
    if mesh.settings.overlap_grad_reduce:
        config.grad_sync_func = ddp.start_grad_sync
    config.finalize_model_grads_func = finalize_model_grads
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=LEARNING_RATE, clip_grad=CLIP_GRAD,
                                                 params_dtype=torch.float32,
                                                 use_distributed_optimizer=mesh.settings.distributed_optimizer),
                                 [ddp])
    spec, mbs = plan.model, mesh.micro_batch_size
    pos = torch.arange(spec.seq_length).unsqueeze(0).expand(mbs, -1)
    mask = torch.tril(torch.ones(1, 1, spec.seq_length, spec.seq_length)) < 0.5

    def forward_step(it, module):
        tok = next(it)
        out = module(tok[:, :-1].contiguous(), pos, mask, labels=tok[:, 1:].contiguous())
        return out, lambda o: (o.float().mean(), {"lm loss": o.float().mean().detach()})

    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        ddp.zero_grad_buffer()
        opt.zero_grad()
        data = [step_tokens(spec, seed=seed, step=step, micro=m, batch=plan.samples_per_step)
                for m in range(plan.num_micro_batches)]
        forward_backward_pipelining_without_interleaving(
            forward_step_func=forward_step, data_iterator=iter(data), model=[ddp],
            num_microbatches=plan.num_micro_batches, seq_length=spec.seq_length, micro_batch_size=mbs)
        opt.step()
        times.append(time.perf_counter() - t0)
    dist.barrier()
    dist.destroy_process_group()
    return {"step_times": times}


def transfer_path(rank, world, plan, shape, reps):
    """Rank 0 (cluster a) sends `reps` activations to rank 1 (cluster b): communicator vs raw gloo."""
    from hetauto_megatron.runtime.communicator import HeteroP2PCommunicator
    from hetauto_megatron.runtime.groups import build_groups, set_megatron_globals
    from hetauto_megatron.runtime.model import transformer_config
    from hetauto_megatron.runtime.rendezvous import init_distributed

    init_distributed(plan, rank, world, timeout_s=120, dry_run=True)
    ctx = build_groups(plan, rank, world, timeout_s=120, dry_run=True)
    set_megatron_globals(ctx)
    comm = HeteroP2PCommunicator(ctx, transformer_config(plan, ctx, plan.model))
    group = ctx.boundary_groups[(0, 1)]
    x = torch.randn(shape)
    out = {}
    for kind in ("raw", "communicator", "raw", "communicator"):  # interleaved, second round counts
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(reps):
            if kind == "raw":
                if rank == 0:
                    dist.send(x, 1, group=group)
                else:
                    dist.recv(torch.empty(shape), 0, group=group)
            elif rank == 0:
                comm.send_forward(x, False)
            else:
                comm.recv_forward(shape, False)
        dist.barrier(group=group)
        out[kind] = time.perf_counter() - t0
    dist.destroy_process_group()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--mbytes", type=float, default=16.0, help="size of one transferred activation, MB")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    preload_megatron()
    from hetauto_megatron.runtime.train import train_rank

    plan = prepare_plan(homogeneous_plan(PRESETS["tiny"].to_dict()), tiny=True)
    het = launch(train_rank, plan.world_size, args=(plan, a.steps, 1, 120.0), timeout_s=600)
    base = launch(megatron_baseline, plan.world_size, args=(plan, a.steps, 1), timeout_s=600)

    def per_iter(results):  # slowest rank per step (the step ends when the pipeline drains), skip warm-up
        return statistics.median(max(r["step_times"][s] for r in results) for s in range(1, a.steps))

    t_het, t_base = per_iter(het), per_iter(base)
    print(f"iteration time, TP2 x PP2 tiny GPT, 4 ranks: hetauto runtime {t_het * 1e3:.1f} ms, "
          f"Megatron-Core groups+communicator {t_base * 1e3:.1f} ms, ratio {t_het / t_base:.3f} (target <= 1.05)")

    hidden = 1024
    seq = max(1, int(a.mbytes * 1e6 / 4 / hidden / 2))
    shape = (seq, 2, hidden)
    tplan = plan_from_dict({"version": 1, "model": {**PRESETS["tiny"].to_dict(), "hidden_size": hidden,
                                                    "seq_length": seq}, "global_batch_size": 2, "meshes": [
        {"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 2, "stage_layers": [4]},
        {"cluster": "b", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 2, "stage_layers": [4]}]})
    res = launch(transfer_path, 2, args=(tplan, shape, a.reps), timeout_s=600)
    nbytes = seq * 2 * hidden * 4 * a.reps
    t_raw = max(r["raw"] for r in res)
    t_comm = max(r["communicator"] for r in res)
    print(f"inter-cluster path, {nbytes / a.reps / 1e6:.1f} MB x {a.reps}: communicator {nbytes / t_comm / 1e9:.2f} "
          f"GB/s, raw gloo send {nbytes / t_raw / 1e9:.2f} GB/s, ratio {t_raw / t_comm:.3f} (target >= 0.8)")


if __name__ == "__main__":
    main()
