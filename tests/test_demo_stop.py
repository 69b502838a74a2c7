"""`hetauto demo` stopped while a step runs, with real processes: the demo (a fresh interpreter, in a session of its
own) is sent SIGTERM alone, as `kill`, `timeout` and batch schedulers send it, once its first step (`hetauto plan`, a
process of its own) is under way. Before, the demo died (exit 143) and the step, reparented to init, kept planning
and writing into --out; now the step is stopped too and nothing of the session is left. And a step killed by a
signal (here SIGKILL, as the out-of-memory killer) ends the demo with the shell's 128 + N, naming the signal: it was
subprocess's -9, which the exit status wrapped to 247."""
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT

pytestmark = pytest.mark.ranks     # starts several processes: one such module at a time (conftest)


def _session(sid: int) -> dict[int, str]:
    """{pid: command line} of the running processes of session `sid` (a process reparented to init keeps it)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found[int(entry)] = cmd
    return found


def _children(pid: int, sid: int) -> list[int]:
    out = []
    for p in _session(sid):
        try:
            with open(f"/proc/{p}/stat") as fh:
                if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(p)
        except OSError:
            pass
    return out


def _start_demo(out, workers: bool = False) -> tuple[subprocess.Popen, int]:
    """The demo, and the pid of its planning step once that has run a quarter of a second of CPU (under way: it
    runs about 2 s of CPU on this 2-core machine, a machine several times faster still passes the mark), or with
    `workers` once it has forked processes of its own (the search's workers; on a fast machine they are gone before
    the step has run a second of CPU, which is what this waited for before)."""
    run = subprocess.Popen([sys.executable, "-m", "hetauto_megatron.cli", "demo", "--skip-training", "--out", str(out)],
                           cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and run.poll() is None:
        steps = [p for p, cmd in _session(run.pid).items() if "hetauto_megatron.cli plan" in cmd and p != run.pid]
        if steps:
            try:
                with open(f"/proc/{steps[0]}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            if int(fields[1]) == run.pid and (_children(steps[0], run.pid) if workers else cpu_s > 0.25):
                return run, steps[0]
        time.sleep(0.05)
    _end(run)
    pytest.fail(f"the demo's planning step did not get under way (exit {run.poll()}): {run.communicate()}")


def _end(run: subprocess.Popen) -> None:
    """Kill whatever of the demo's session is left, whatever the test found."""
    for pid in _session(run.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        run.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


@pytest.mark.parametrize("workers", [False, True], ids=["step", "step with its workers"])
def test_sigterm_to_the_demo_stops_its_running_step(tmp_path, workers):
    """Also once the planning step has forked its search's workers (its --explain re-plans): a signal passed on to
    the step alone left them running, reparented to init, printing BrokenPipeError tracebacks."""
    if workers and len(os.sched_getaffinity(0)) < 2:      # (the cores the search counts: search_jobs)
        pytest.skip("the search forks workers only with two cores or more")
    run, step = _start_demo(tmp_path / "demo", workers)
    try:
        run.send_signal(signal.SIGTERM)
        code = run.wait(timeout=30)
        # (the step's group got the signal together: what is left dies within a moment; a worker left running had
        # seconds of re-planning to do)
        time.sleep(0.3)
        left = _session(run.pid)
        assert not left, f"still running after the demo was stopped: {left}"
        assert code == 128 + signal.SIGTERM
        err = run.stderr.read()
        assert "stopped by SIGTERM" in err and "Traceback" not in err, err
    finally:
        _end(run)


def test_a_step_killed_by_a_signal_is_128_plus_its_number(tmp_path):
    run, step = _start_demo(tmp_path / "demo")
    try:
        os.kill(step, signal.SIGKILL)
        code = run.wait(timeout=30)
        assert code == 128 + signal.SIGKILL, code
        assert "killed by SIGKILL (exit 137)" in run.stderr.read()
    finally:
        _end(run)
