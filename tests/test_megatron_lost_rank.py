"""A rank that goes away after training started, inside one of Megatron's own collectives across the clusters (the
gradient-norm all-reduce, the closing barrier), under NVIDIA's pretrain_gpt.py (patched) with --hetauto: real
processes, one per rank, each cluster's ranks launched as their own world (as separately launched clusters), joined
through the world store. The rank that dies exits abruptly (os._exit, as a crash or the out-of-memory killer ends a
process) at the chosen point; nothing else is changed. Before: the others stopped with gloo's traceback ("Read
error [127.0.0.1]:3472: Connection reset by peer"), naming no rank. Now each stops with one paragraph naming the
rank and the cluster that went away first and the Megatron function whose collective failed (exit 1, not a user
error), without a traceback. With five ranks in a ring all-reduce the survivors fail one after another, each when
the one before it exits: each must still name the rank that died, not the survivors that stopped before it (they
did, one every 6 s, while a stopping rank answered its probes only while it was alive)."""
import os
import subprocess
import sys
import time

import pytest
from helpers import wait_all
from test_job_agreement import PLAN_YAML    # two one-rank clusters, one stage each
from test_megatron_patch import nvidia_script  # noqa: F401  (fixture: NVIDIA's pretrain_gpt.py, patched)

from hetauto_megatron.megatron import demo
from hetauto_megatron.plan.plan import load_plan
from hetauto_megatron.runtime.groups import describe_rank
from hetauto_megatron.runtime.launcher import free_port

# Runs the patched script as its __main__; in the dying rank, first makes the chosen Megatron function end the
# process instead of running (the collective's other side then waits on a process that is gone).
DYING = r'''
import os, runpy, sys
where = sys.argv.pop(1)
if where == "grad-norm":                      # the 2nd iteration's gradient-norm all-reduce over every rank
    import megatron.core.optimizer.optimizer as optimizer
    calls, original = [], optimizer.get_grad_norm_fp32
    def get_grad_norm_fp32(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os._exit(9)
        return original(*args, **kwargs)
    optimizer.get_grad_norm_fp32 = get_grad_norm_fp32
elif where == "barrier":                      # the barrier of print_datetime('after training is done')
    import megatron.training.training as training
    original = training.print_datetime
    def print_datetime(string, *args, **kwargs):
        if string == "after training is done":
            os._exit(9)
        return original(string, *args, **kwargs)
    training.print_datetime = print_datetime
script = sys.argv.pop(1)
sys.path[0] = os.path.dirname(os.path.abspath(script))
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
'''


# Three clusters, five ranks: DP 2, DP 2 and DP 1 with micro-batch 2 (every rank in the gradient-norm ring).
THREE_CLUSTERS = PLAN_YAML.split("meshes:")[0] + """meshes:
- {cluster: cluster-a, device_type: cpu, tp: 1, dp: 2, micro_batch_size: 1, recompute: none, stage_layers: [2]}
- {cluster: cluster-b, device_type: cpu, tp: 1, dp: 2, micro_batch_size: 1, recompute: none, stage_layers: [1]}
- {cluster: cluster-c, device_type: cpu, tp: 1, dp: 1, micro_batch_size: 2, recompute: none, stage_layers: [1]}
"""


@pytest.mark.parametrize("plan_yaml, where, dead, function", [
    (PLAN_YAML, "grad-norm", 1, "get_grad_norm_fp32"),
    (PLAN_YAML, "barrier", 0, "print_datetime"),
    (THREE_CLUSTERS, "grad-norm", 4, "get_grad_norm_fp32")], ids=["grad-norm", "barrier", "five-ranks"])
def test_a_rank_gone_in_megatrons_own_collective_is_named(nvidia_script, tmp_path, plan_yaml, where, dead,  # noqa: F811
                                                          function):
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(plan_yaml)
    (tmp_path / "dying.py").write_text(DYING)
    plan = load_plan(str(plan_file))
    argv = demo.hetauto_argv(str(plan_file), plan, iters=3, seed=1)
    clusters = {}                               # cluster -> its ranks' count, in the plan's rank order
    for mesh in plan.meshes:
        clusters[mesh.cluster] = clusters.get(mesh.cluster, 0) + mesh.tp * mesh.dp * len(mesh.stage_layers)
    world = sum(clusters.values())
    port, procs, logs, cluster_of = free_port(), [], [], []
    start = time.monotonic()
    for cluster, size in clusters.items():
        offset, master = len(cluster_of), free_port()
        for local in range(size):
            rank = offset + local
            cluster_of.append(cluster)
            env = dict(os.environ, RANK=str(local), LOCAL_RANK=str(local), WORLD_SIZE=str(size),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master), HETAUTO_RANK_OFFSET=str(offset),
                       HETAUTO_WORLD_SIZE=str(world), HETAUTO_CLUSTER=cluster, HETAUTO_MASTER_ADDR="127.0.0.1",
                       HETAUTO_MASTER_PORT=str(port), HETAUTO_TIMEOUT_S="120", CUDA_DEVICE_MAX_CONNECTIONS="1",
                       OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
            cmd = ([sys.executable, str(tmp_path / "dying.py"), where] if rank == dead else [sys.executable])
            logs.append(tmp_path / f"rank{rank}.log")
            with open(logs[-1], "w") as fh:
                procs.append(subprocess.Popen(cmd + [nvidia_script, *argv], env=env, stdout=fh,
                                              stderr=subprocess.STDOUT, start_new_session=True, cwd=str(tmp_path)))
    codes = wait_all(procs, timeout=300)
    took = time.monotonic() - start
    out = [log.read_text() for log in logs]
    assert codes[dead] == 9, out[dead][-3000:]
    gone = describe_rank(plan, dead)          # "rank 4 (cluster cluster-c, stage 2)"
    for survivor in (r for r in range(world) if r != dead):
        log = out[survivor]
        assert codes[survivor] == 1 and took < 240, (survivor, took, log[-3000:])
        assert "Traceback" not in log, log[-3000:]
        paragraph = [line for line in log.splitlines() if line.startswith("hetauto: error:")]
        assert len(paragraph) == 1, log[-3000:]
        me = describe_rank(plan, survivor)
        assert f"{me} stopped: one of Megatron's collectives ({function} in megatron/" in paragraph[0], paragraph[0]
        assert f": {gone} went away first" in paragraph[0], paragraph[0]
        assert f"See the log of {gone} for why" in paragraph[0], paragraph[0]

