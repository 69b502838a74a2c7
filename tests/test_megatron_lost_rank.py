"""A rank that goes away after training started, inside one of Megatron's own collectives across the clusters (the
gradient-norm all-reduce, the closing barrier), under NVIDIA's pretrain_gpt.py (patched) with --hetauto: two real
processes, one cluster each, joined through the world store as separately launched clusters. The rank that dies
exits abruptly (os._exit, as a crash or the out-of-memory killer ends a process) at the chosen point; nothing else is
changed. Before: the other rank stopped with gloo's traceback ("Read error [127.0.0.1]:3472: Connection reset by
peer"), naming no rank. Now it stops with one paragraph naming the rank and the cluster that went away and the
Megatron function whose collective failed (exit 1, not a user error), without a traceback."""
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


@pytest.mark.parametrize("where, dead, function", [("grad-norm", 1, "get_grad_norm_fp32"),
                                                   ("barrier", 0, "print_datetime")])
def test_a_rank_gone_in_megatrons_own_collective_is_named(nvidia_script, tmp_path, where, dead,  # noqa: F811
                                                          function):
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN_YAML)
    (tmp_path / "dying.py").write_text(DYING)
    argv = demo.hetauto_argv(str(plan_file), load_plan(str(plan_file)), iters=3, seed=1)
    port, procs, logs = free_port(), [], []
    start = time.monotonic()
    for rank, cluster in enumerate(["cluster-a", "cluster-b"]):
        env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", HETAUTO_RANK_OFFSET=str(rank),
                   HETAUTO_WORLD_SIZE="2", HETAUTO_CLUSTER=cluster, HETAUTO_MASTER_ADDR="127.0.0.1",
                   HETAUTO_MASTER_PORT=str(port), HETAUTO_TIMEOUT_S="120", CUDA_DEVICE_MAX_CONNECTIONS="1",
                   PYTHONWARNINGS="ignore")
        cmd = ([sys.executable, str(tmp_path / "dying.py"), where] if rank == dead else [sys.executable])
        logs.append(tmp_path / f"rank{rank}.log")
        with open(logs[-1], "w") as fh:
            procs.append(subprocess.Popen(cmd + [nvidia_script, *argv], env=env, stdout=fh, stderr=subprocess.STDOUT,
                                          start_new_session=True, cwd=str(tmp_path)))
    codes = wait_all(procs, timeout=240)
    took = time.monotonic() - start
    out = [log.read_text() for log in logs]
    survivor = 1 - dead
    assert codes[dead] == 9, out[dead][-3000:]
    assert codes[survivor] == 1 and took < 200, (took, out[survivor][-3000:])
    assert "Traceback" not in out[survivor], out[survivor][-3000:]
    paragraph = [line for line in out[survivor].splitlines() if line.startswith("hetauto: error:")]
    assert len(paragraph) == 1, out[survivor][-3000:]
    cluster = ["cluster-a", "cluster-b"][dead]
    assert f"rank {survivor} (cluster cluster-{'ab'[survivor]}, stage {survivor}) stopped: one of Megatron's " \
           f"collectives across the clusters ({function} in megatron/" in paragraph[0], paragraph[0]
    assert f": rank {dead} (cluster {cluster}, stage {dead}) went away; that process is gone or stuck. See the log " \
           f"of rank {dead} (cluster {cluster}, stage {dead}) for why" in paragraph[0], paragraph[0]
