"""What the sum across a parameter's holders (runtime/replica_sync.py) costs per step (CPU, gloo, forked ranks).

Builds every rank of a plan as the dry run does (groups, the model, Megatron's DDP with the mesh's settings,
`ReplicaSync`), fills the gradient buffers with fixed values and times `ReplicaSync.reduce` `--reps` times.
Prints, per plan, the median wall time of one reduce (slowest rank of each call) and the median host time of
one reduce on the busiest rank: the CPU time of the rank's main thread during the reduce (its own Python and
copies; waiting for messages costs none), which a loaded machine disturbs far less than wall time.

    python benchmarks/replica_sync_overhead.py [--reps 40] [--hidden 64] [PLAN.yaml ...]

Default plans: examples/llama/plans/tiny-2pipelines-cpu.yaml (two holders of every parameter: the pair phase)
and tiny-alongside-cpu.yaml (three holders of the tied table: gather and scatter).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

from hetauto_megatron.plan.plan import load_plan  # noqa: E402
from hetauto_megatron.runtime.dryrun import preload_megatron, prepare_plan  # noqa: E402
from hetauto_megatron.runtime.launcher import launch  # noqa: E402

PLANS = ("examples/llama/plans/tiny-2pipelines-cpu.yaml", "examples/llama/plans/tiny-alongside-cpu.yaml")


def bench_rank(rank, world, plan, reps):
    import torch
    import torch.distributed as dist
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from hetauto_megatron.runtime import replica_sync
    from hetauto_megatron.runtime.groups import build_groups, set_megatron_globals
    from hetauto_megatron.runtime.model import build_model, transformer_config
    from hetauto_megatron.runtime.rendezvous import init_distributed
    from hetauto_megatron.runtime.train import ddp_settings

    init_distributed(plan, rank, world, timeout_s=120, dry_run=True)
    ctx = build_groups(plan, rank, world, timeout_s=120, dry_run=True)
    set_megatron_globals(ctx)
    config = transformer_config(plan, ctx, plan.model)
    model = build_model(ctx, plan.model, config, seed=1)
    ddp = DistributedDataParallel(config=config, module=model, pg_collection=ctx.pg,
                                  ddp_config=DistributedDataParallelConfig(**ddp_settings(ctx.mesh.settings)))
    sync = replica_sync.ReplicaSync(ctx, [ddp])
    g = torch.Generator().manual_seed(rank)
    total, host = [], []
    for rep in range(reps + 2):                  # two untimed calls first
        with torch.no_grad():
            for param in ddp.module.parameters():
                param.main_grad.copy_(torch.rand(param.main_grad.shape, generator=g))
        dist.barrier(group=ctx.world_gloo)
        t0, c0 = time.perf_counter(), time.thread_time()
        sync.reduce([ddp])
        if rep >= 2:
            total.append(time.perf_counter() - t0)
            host.append(time.thread_time() - c0)
    dist.barrier(group=ctx.world_gloo)
    dist.destroy_process_group()
    return {"total": total, "host": host}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plans", nargs="*", default=list(PLANS))
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--hidden", type=int, default=None, help="hidden size of the tiny model (ffn 4x); default 64")
    a = ap.parse_args()
    preload_megatron()
    for path in a.plans:
        plan = prepare_plan(load_plan(Path(path)), tiny=True)
        if a.hidden:
            plan = dataclasses.replace(plan, model=plan.model.replace(hidden_size=a.hidden,
                                                                      ffn_hidden_size=4 * a.hidden))
        res = launch(bench_rank, plan.world_size, args=(plan, a.reps), timeout_s=900)
        per_call = statistics.median(max(r["total"][k] for r in res) for k in range(a.reps))
        host = max(statistics.median(r["host"]) for r in res)
        print(f"{Path(path).name} (hidden {plan.model.hidden_size}, {plan.world_size} ranks, {a.reps} calls): "
              f"reduce {per_call * 1e3:.2f} ms per step (slowest rank), host time {host * 1e3:.2f} ms "
              f"(CPU time of the busiest rank's main thread)")


if __name__ == "__main__":
    main()
