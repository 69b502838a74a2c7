"""What a rank learns when it probes another's listener after a collective failed (runtime/liveness.py), with real
sockets and a real (one-rank) gloo group, in a process of its own: an answering rank is alive, a rank stopping on
the loss passes on whom it found gone, and a rank whose process is gone refuses the connection, also while a
child it forked (Megatron's data-loader workers) lives on. Before the listener was closed in forked children, the
child's inherited socket accepted the probe and nobody answered: a crashed rank read as "silent", i.e. as a node
that does not answer. And where a failed collective ran: Megatron's code, or hetauto's own, not both called
Megatron's (a path under hetauto_megatron/megatron/ matched "/megatron/")."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from hetauto_megatron.runtime import liveness

SCRIPT = textwrap.dedent("""
    import json, os, sys, time, types
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from hetauto_megatron.runtime.liveness import Liveness, _ask
    lv = Liveness(types.SimpleNamespace(world_size=1, world_gloo=dist.group.WORLD), "127.0.0.1")
    host, port = lv.addresses[0]
    out = {"port": port, "alive": _ask(host, port)}
    lv.answer = b"S3 5"
    out["stopping"] = _ask(host, port)
    child = os.fork()
    if child == 0:              # a data-loader worker: outlives the rank's process
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)        # (the test reads the parent's output to its end)
        time.sleep(60)
        os._exit(0)
    out["child"] = child
    print(json.dumps(out), flush=True)
    os._exit(0)                 # the rank's process is gone
""")


def test_probe_answers_with_real_sockets():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    try:
        assert out["alive"] == "alive"
        assert out["stopping"] == ["stopping", [3, 5]]
        t = time.monotonic()
        gone = liveness._ask("127.0.0.1", out["port"])
        assert gone == "gone" and time.monotonic() - t < liveness.PROBE_S, gone
    finally:
        os.kill(out["child"], signal.SIGKILL)


def _raised_in(path: str, inner: str | None = None) -> BaseException:
    """A real exception whose traceback runs through code compiled as `path` (and, inside it, `inner`)."""
    code = "def collective():\n    raise RuntimeError('gloo: Connection closed by peer')\n"
    scope: dict = {}
    if inner is not None:
        exec(compile(code, inner, "exec"), scope)
        code = "def caller():\n    collective()\n"
    else:
        code += "def caller():\n    collective()\n"
    exec(compile(code, path, "exec"), scope)
    try:
        scope["caller"]()
    except RuntimeError as exc:
        return exc
    raise AssertionError("did not raise")


def test_where_a_failed_collective_ran():
    megatron = "/venv/site-packages/megatron/core/optimizer/clip_grads.py"
    ours = "/repo/hetauto_megatron/megatron/plan_data.py"
    redirect = "/repo/hetauto_megatron/runtime/device.py"
    assert liveness._where(_raised_in(megatron)) == (
        "Megatron's", " (collective in megatron/core/optimizer/clip_grads.py:2)")
    assert liveness._where(_raised_in(ours)) == ("hetauto's", " (collective in hetauto_megatron/megatron/plan_data.py:2)")
    # the CPU redirections call the collective for the code above them: that code is named
    assert liveness._where(_raised_in(megatron, inner=redirect)) == (
        "Megatron's", " (caller in megatron/core/optimizer/clip_grads.py:2)")
    assert liveness._where(_raised_in("/elsewhere/train.py")) == ("the job's", "")
