"""A rank that goes away after training started, inside one of Megatron's own collectives across the clusters (the
gradient-norm all-reduce, the closing barrier), under NVIDIA's pretrain_gpt.py (patched) with --hetauto: real
processes, one per rank, each cluster's ranks launched as their own world (as separately launched clusters), joined
through the world store; or each cluster under hetauto-torchrun, as the launch scripts start it. The rank that dies
exits abruptly (os._exit, as a crash or the out-of-memory killer ends a process) at the chosen point, or is stopped
(SIGSTOP); nothing else is changed. Before: the others stopped with gloo's traceback ("Read error
[127.0.0.1]:3472: Connection reset by peer"), naming no rank. Now each stops with one paragraph naming the rank and
the cluster that went away first and the Megatron function whose collective failed (exit 4: not a user error, and
not 1, any crash's), without a traceback. With five ranks in a ring all-reduce the survivors fail one after
another, each when the one before it exits: each must still name the rank that died, not the survivors that
stopped before it (they did, one every 6 s, while a stopping rank answered its probes only while it was alive)."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers import kill_launches, wait_all
from test_job_agreement import PLAN_YAML    # two one-rank clusters, one stage each
from test_megatron_patch import nvidia_script  # noqa: F401  (fixture: NVIDIA's pretrain_gpt.py, patched)
from test_torchrun_port import HETAUTO_TORCHRUN

from hetauto_megatron.megatron import demo
from hetauto_megatron.plan.plan import load_plan
from hetauto_megatron.runtime.launcher import free_port
from hetauto_megatron.runtime.liveness import LOST_PEER_EXIT
from hetauto_megatron.runtime.ranks import describe_rank

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

# Runs the patched script as its __main__; in the dying rank, first makes the chosen Megatron function end the
# process instead of running (the collective's other side then waits on a process that is gone).
DYING = r'''
import os, runpy, signal, sys
where = sys.argv.pop(1)
if where in ("grad-norm", "grad-norm-stop"):  # the 2nd iteration's gradient-norm all-reduce over every rank
    import megatron.core.optimizer.optimizer as optimizer
    calls, original = [], optimizer.get_grad_norm_fp32
    def get_grad_norm_fp32(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2 and where == "grad-norm-stop":
            with open("stopped.pid", "w") as fh:    # for the test to end it: torchrun's workers have own sessions
                fh.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)    # stopped, not gone: the process stays, its sockets open
        elif len(calls) == 2:
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


def launch(tmp_path, script: str, plan_yaml: str, where: str, dead: int, torchrun: bool = False,
           timeout_s: int = 600) -> tuple:
    """Start every rank of the plan, rank `dead` under dying.py stopping at `where`: one process per rank with the
    environment torchrun gives a worker, or (`torchrun`) one hetauto-torchrun per cluster as the launch scripts
    start it, the dying rank's cluster running dying.py. Returns (plan, [(process, log, its global
    ranks)], start time). `timeout_s`: HETAUTO_TIMEOUT_S, long by default, so that a survivor that waited it out
    instead of stopping at once ends well past the tests' bounds (240 s), or is ended by their wait."""
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(plan_yaml)
    (tmp_path / "dying.py").write_text(DYING)
    plan = load_plan(str(plan_file))
    argv = [script, *demo.hetauto_argv(str(plan_file), plan, iters=3, seed=1)]
    clusters = {}                               # cluster -> its ranks' count, in the plan's rank order
    for mesh in plan.meshes:
        clusters[mesh.cluster] = clusters.get(mesh.cluster, 0) + mesh.tp * mesh.dp * len(mesh.stage_layers)
    world = sum(clusters.values())
    port, offset, started = free_port(), 0, []
    start = time.monotonic()
    for cluster, size in clusters.items():
        master = free_port()
        env = dict(os.environ, HETAUTO_RANK_OFFSET=str(offset), HETAUTO_WORLD_SIZE=str(world), HETAUTO_CLUSTER=cluster,
                   HETAUTO_MASTER_ADDR="127.0.0.1", HETAUTO_MASTER_PORT=str(port), HETAUTO_TIMEOUT_S=str(timeout_s),
                   CUDA_DEVICE_MAX_CONNECTIONS="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        ranks = range(offset, offset + size)
        dying = [str(tmp_path / "dying.py"), where]
        if not torchrun:
            runs = [([sys.executable] + (dying if rank == dead else []), [rank],
                     dict(env, RANK=str(rank - offset), LOCAL_RANK=str(rank - offset), WORLD_SIZE=str(size),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master))) for rank in ranks]
        else:
            runs = [([HETAUTO_TORCHRUN, "--nnodes=1", f"--nproc-per-node={size}", "--node-rank=0",
                      "--master-addr=127.0.0.1", f"--master-port={master}"] + (dying if dead in ranks else []),
                     list(ranks), env)]
        for cmd, its_ranks, its_env in runs:
            log = tmp_path / f"{cluster}.{its_ranks[0]}.log"
            with open(log, "w") as fh:
                try:
                    started.append((subprocess.Popen(cmd + argv, env=its_env, stdout=fh, stderr=subprocess.STDOUT,
                                                     start_new_session=True, cwd=str(tmp_path)), log, its_ranks))
                except BaseException:
                    kill_launches([proc for proc, _, _ in started])
                    raise
        offset += size
    return plan, started, start


def paragraph(log: str) -> str:
    """The one 'hetauto: error:' paragraph of a rank's log."""
    lines = [line for line in log.splitlines() if line.startswith("hetauto: error:")]
    assert len(lines) == 1, log[-3000:]
    return lines[0]


# (two one-rank clusters, the gradient-norm all-reduce: test_a_launch_that_lost_a_rank_ends_with_one_line)
@pytest.mark.parametrize("plan_yaml, where, dead, function", [
    (PLAN_YAML, "barrier", 0, "print_datetime"),
    (THREE_CLUSTERS, "grad-norm", 4, "get_grad_norm_fp32")], ids=["barrier", "five-ranks"])
def test_a_rank_gone_in_megatrons_own_collective_is_named(nvidia_script, tmp_path, plan_yaml, where, dead,  # noqa: F811
                                                          function):
    plan, started, start = launch(tmp_path, nvidia_script, plan_yaml, where, dead)
    try:
        codes = wait_all([proc for proc, _, _ in started], timeout=300)
    finally:
        kill_launches([proc for proc, _, _ in started])
    took = time.monotonic() - start
    out = [log.read_text() for _, log, _ in started]
    assert codes[dead] == 9, out[dead][-3000:]
    gone = describe_rank(plan, dead)          # "rank 4 (cluster cluster-c, stage 2)"
    for survivor in (r for r in range(len(started)) if r != dead):
        log = out[survivor]
        assert codes[survivor] == LOST_PEER_EXIT and took < 240, (survivor, took, log[-3000:])
        assert "Traceback" not in log, log[-3000:]
        text = paragraph(log)
        me = describe_rank(plan, survivor)
        assert f"{me} stopped: one of Megatron's collectives ({function} in megatron/" in text, text
        # the dead rank among those named first, this survivor not; a survivor that stopped on the loss and had
        # gone before this one probed it may be named beside it (as test_dryrun_stop's survivors on a loaded machine)
        first = re.search(r": ((?:rank \d+ \([^)]*\)(?:, )?)+) went away first", text)
        assert first and gone in first.group(1) and me not in first.group(1), text
        assert gone in text.split("See the log of ", 1)[-1].split(" for why", 1)[0], text


def test_a_launch_that_lost_a_rank_ends_with_one_line(nvidia_script, tmp_path):  # noqa: F811
    """Each cluster under hetauto-torchrun, as the launch scripts start it, cluster-b's rank crashing (exit 9) in
    the gradient-norm all-reduce: cluster-a's launch ends with its rank's paragraph and one line pointing at it,
    exit 1 (before: torchrun's 40-line ChildFailedError traceback after the paragraph); cluster-b's, a genuine
    crash, keeps torchrun's own report naming the worker's exit code. The paragraph names the survivor, the
    Megatron function whose collective failed and the rank that went away, as in the test above."""
    plan, started, start = launch(tmp_path, nvidia_script, PLAN_YAML, "grad-norm", 1, torchrun=True)
    try:
        codes = wait_all([proc for proc, _, _ in started], timeout=300)
    finally:
        kill_launches([proc for proc, _, _ in started])
    assert time.monotonic() - start < 240       # at once, not at the 600 s timeout of a wait
    survivor, crashed = (log.read_text() for _, log, _ in started)
    assert codes == [1, 1], (survivor[-3000:], crashed[-3000:])
    text, gone = paragraph(survivor), describe_rank(plan, 1)
    assert f"{describe_rank(plan, 0)} stopped: one of Megatron's collectives (get_grad_norm_fp32 in megatron/" in text
    assert f": {gone} went away first" in text and f"See the log of {gone} for why" in text, text
    assert "Traceback" not in survivor and "ChildFailedError" not in survivor, survivor[-3000:]
    last = survivor.rstrip().splitlines()[-1]
    assert last.startswith("hetauto-torchrun: worker rank(s) 0 of this launch stopped") and "paragraph above" in last, \
        survivor[-3000:]
    assert f"(exit {LOST_PEER_EXIT})" in last, last      # the survivor's worker ended as a lost peer, not a crash
    assert "ChildFailedError" in crashed and re.search(r"exitcode\s*:\s*9\b", crashed), crashed[-3000:]
    assert "hetauto-torchrun:" not in crashed, crashed[-3000:]


def test_a_stopped_rank_is_not_said_to_have_gone(nvidia_script, tmp_path):  # noqa: F811
    """cluster-b's rank SIGSTOPped in the gradient-norm all-reduce: its process stays, sockets open, so cluster-a's
    rank fails only at gloo's timeout (HETAUTO_TIMEOUT_S) and finds it connected but not answering. The paragraph
    says so and where to look, not that it "went away first" with a log that would say why (before: it did, and
    "that process is gone or stuck"); the launch ends with the one line."""
    plan, started, start = launch(tmp_path, nvidia_script, PLAN_YAML, "grad-norm-stop", 1,
                                  torchrun=True, timeout_s=15)
    try:
        code = wait_all([started[0][0]], timeout=300)[0]
    finally:
        stopped_pid = tmp_path / "stopped.pid"
        if stopped_pid.exists():
            try:
                os.kill(int(stopped_pid.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            wait_all([started[1][0]], timeout=60)       # its launcher, which then stops
        finally:
            kill_launches([proc for proc, _, _ in started])
    took = time.monotonic() - start
    log = started[0][1].read_text()
    # gloo's 15 s timeout, then the paragraph: 37 s on a loaded machine, 45 s on one core beside another job; 240 s
    # leaves room for a CI runner twice as slow and is still far from any longer wait (Megatron's own: 10 minutes)
    assert code == 1 and took < 240, (took, log[-3000:])
    text = paragraph(log)
    stopped = describe_rank(plan, 1)
    assert "went away" not in text and "gone" not in text and "See the log of" not in text, text
    assert f": {stopped} did not go away but stopped answering" in text and "SIGSTOP" in text, text
    assert "Traceback" not in log and "ChildFailedError" not in log, log[-3000:]
    assert log.rstrip().splitlines()[-1].startswith("hetauto-torchrun: worker rank(s) 0 of this launch stopped"), \
        log[-3000:]


def test_which_failed_launches_end_with_one_line(tmp_path):
    """hetauto-torchrun's reading of torchrun's failures (real ProcessFailure records, as ChildFailedError holds
    them): a worker that stopped on its paragraph beside workers torchrun then stopped (SIGTERM) ends with one line;
    any crash beside it (exit 1: a traceback; the out-of-memory killer's SIGKILL; a segmentation fault) keeps
    torchrun's report, and so do the two kinds of paragraph mixed."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from hetauto_megatron.megatron.torchrun import USER_ERROR, reported

    def failures(*codes):
        return {rank: ProcessFailure(rank, 1000 + rank, code, str(tmp_path / "none")) for rank, code in
                enumerate(codes)}

    assert reported(failures(LOST_PEER_EXIT, -signal.SIGTERM))[1] == 1
    assert reported(failures(-signal.SIGTERM, LOST_PEER_EXIT, LOST_PEER_EXIT))[0].startswith("worker rank(s) 1, 2 ")
    assert reported(failures(USER_ERROR, -signal.SIGTERM))[1] == USER_ERROR
    for crash in (1, -signal.SIGKILL, -signal.SIGSEGV, 9, USER_ERROR):
        assert reported(failures(LOST_PEER_EXIT, crash)) is None, crash
    assert reported(failures(USER_ERROR, -signal.SIGKILL)) is None
    assert reported(failures(-signal.SIGTERM)) is None
