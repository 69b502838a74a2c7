"""How a dry run's ranks end when the run is stopped or one of them goes away, with real rank processes.

Stopping: `hetauto dryrun` (a fresh interpreter, as a user starts it) sent SIGTERM while its ranks train, as `kill`,
`timeout` and batch schedulers stop a job, or SIGKILL. Before, the launch ended its ranks only on its own clean way
out, which a signal's death skips: every rank, reparented to init, kept training. Now they are all gone within
seconds, and on SIGTERM the command exits 143 (128 + SIGTERM).

A lost rank: one rank of a 4-rank run is SIGKILLed at its second gradient-norm all-reduce over every rank (Megatron's
get_grad_norm_fp32, the point a crash or the out-of-memory killer ends it: nothing else changed). Before, the ranks
waiting on it reported gloo's raw text ("[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer
[127.0.0.1]:26811"), naming no rank. Now each survivor names the rank, cluster and stage that went away first, as the
Megatron-LM path does (runtime/liveness.py; tests/test_megatron_lost_rank.py)."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT, wait_all
from test_job_agreement import PLAN_YAML

from hetauto_megatron.plan.plan import load_plan
from hetauto_megatron.runtime.launcher import LaunchError, launch
from hetauto_megatron.runtime.ranks import describe_rank

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)


def _ranks(pid: int) -> set[int]:
    """The rank processes of the dry run `pid`: its running children that are forks of it (the same command line).
    Its short-lived helpers (ctypes' `ldconfig -p`, an import's `git rev-parse`) are not ranks: counted as such, a
    slow machine that caught one in the act waited forever for a third rank to train."""
    def cmdline(p):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                return fh.read()
        except OSError:
            return None
    own = cmdline(pid)
    kids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and _running(int(entry)) and cmdline(entry) == own:
                kids.add(int(entry))
    return kids


def _running(pid: int) -> bool:
    """Whether `pid` is a process that still runs (a zombie waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cpu_s(pid: int) -> float:
    """CPU seconds `pid` has used (user + system), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _kill_group(run: subprocess.Popen) -> None:
    """SIGKILL whatever of the dry run's session is left (it was started in a session of its own)."""
    try:
        os.killpg(run.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    run.wait(timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_a_dry_run_ends_every_rank(sig):
    """SIGTERM: the command ends its ranks and exits 143, and under --json its stdout is one error object (kind
    "interrupted", as a Ctrl-C's; it was empty: the launch's SystemExit passed the CLI's error reporting by). SIGKILL
    (no handler runs: the out-of-memory killer, `kill -9`): each rank dies with it."""
    plan = os.path.join(ROOT, "examples", "llama", "plans", "cpu-small-pp2.yaml")
    run = subprocess.Popen([sys.executable, "-m", "hetauto_megatron.cli", "dryrun", "--plan", plan, "--tiny",
                            "--steps", "100000", "--timeout", "60", "--json"], cwd=ROOT, start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks: set[int] = set()
    try:
        # training: both ranks there, each past its start-up (a few CPU seconds: imports are the parent's)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and run.poll() is None:
            ranks = _ranks(run.pid)
            if len(ranks) == 2 and all(_cpu_s(r) > 3 for r in ranks):
                break
            time.sleep(0.2)
        if run.poll() is not None or len(ranks) != 2:
            _kill_group(run)
            pytest.fail(f"the dry run did not reach two training ranks (ranks {sorted(ranks)}, exit {run.poll()}): "
                        f"{run.communicate(timeout=30)}")
        run.send_signal(sig)
        code = wait_all([run], timeout=30)[0]
        until = time.monotonic() + 5
        while any(map(_running, ranks)) and time.monotonic() < until:
            time.sleep(0.1)
        left = [r for r in ranks if _running(r)]
        assert not left, f"rank processes {left} still run after the dry run was stopped"
        if sig == signal.SIGTERM:
            assert code == 128 + signal.SIGTERM
            assert "stopped by SIGTERM" in run.stderr.read()
            lines = run.stdout.read().strip().splitlines()
            assert lines, "--json printed nothing on stdout"
            error = json.loads(lines[-1])["error"]
            assert error["kind"] == "interrupted" and error["exit_code"] == 143, error
            assert "SIGTERM" in error["message"], error
    finally:
        _kill_group(run)         # (never leave the run or a rank behind, whatever failed above)


# Two clusters of two ranks each, one stage each: every rank is in the gradient-norm all-reduce over the world, and
# rank 3 shares its DP group (the gradients' reduce-scatter) with rank 2.
FOUR_RANKS = PLAN_YAML.split("meshes:")[0] + """meshes:
- {cluster: cluster-a, device_type: cpu, tp: 1, dp: 2, micro_batch_size: 1, recompute: none, stage_layers: [2]}
- {cluster: cluster-b, device_type: cpu, tp: 1, dp: 2, micro_batch_size: 1, recompute: none, stage_layers: [2]}
"""


def _dies_at_second_norm(rank, world_size, dead, *train_args):
    """The dry run's rank (train.train_rank); rank `dead` is SIGKILLed at its second gradient-norm all-reduce."""
    if rank == dead:
        import megatron.core.optimizer.optimizer as optimizer
        calls, original = [], optimizer.get_grad_norm_fp32

        def get_grad_norm_fp32(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)
        optimizer.get_grad_norm_fp32 = get_grad_norm_fp32
    from hetauto_megatron.runtime.train import train_rank
    return train_rank(rank, world_size, *train_args)


@pytest.mark.parametrize("dead", [3, 0])
def test_survivors_name_the_rank_that_went_away(tmp_path, dead):
    (tmp_path / "plan.yaml").write_text(FOUR_RANKS)
    plan = load_plan(str(tmp_path / "plan.yaml"))
    with pytest.raises(LaunchError) as info:
        launch(_dies_at_second_norm, 4, args=(dead, plan, 100, 1, 30.0), timeout_s=240, grace_s=40)
    failures = info.value.failures
    assert "SIGKILL" in failures[dead]
    gone = describe_rank(plan, dead)
    for rank in sorted(set(range(4)) - {dead}):
        text = failures[rank]
        # the dead rank is named among those that went away first; a survivor that stopped on its loss and had
        # exited before this rank probed it is named beside it (on a loaded machine rank 1 was, beside rank 0)
        first = re.search(r"\): ((?:rank \d+ \([^)]*\)(?:, )?)+) went away first", text)
        assert first and gone in first.group(1) and describe_rank(plan, rank) not in first.group(1), text
        assert "pair.cc" not in text and "Traceback" not in text and "GLHF" not in text, text
        assert text.startswith(f"PeerError: {describe_rank(plan, rank)}"), text


def test_a_rank_named_first_that_stopped_on_a_loss_itself_is_named(tmp_path):
    """The probe answers a word for most ranks, but ("stopping", [ranks it named]) for a rank that stopped on a loss
    itself; naming such a rank among those that went away first looked its answer up as a key, and the survivor's
    paragraph became "TypeError: unhashable type: 'list'" (seen once in the test above, rank 0 lost: which answer a
    survivor meets depends on the order the ranks fail in)."""
    from types import SimpleNamespace

    from hetauto_megatron.runtime.liveness import _named
    (tmp_path / "plan.yaml").write_text(FOUR_RANKS)
    plan = load_plan(str(tmp_path / "plan.yaml"))
    text = _named(SimpleNamespace(plan=plan), [0, 1], {0: ("stopping", [3]), 1: "silent", 2: "gone"})
    assert text == f"{describe_rank(plan, 0)}, {describe_rank(plan, 1)} (its node does not answer)", text
