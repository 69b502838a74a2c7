"""hetauto-torchrun (the launch scripts' launcher) given arguments that torch parses and then refuses with a traceback
(exit 1): a rendezvous timeout that is not whole seconds (int('1.5') in torch's static rendezvous), a --master-port
outside the TCP ports (the endpoint's ValueError), a --nproc-per-node below 1 (an AssertionError). Each is one
paragraph naming the flag and the fix, exit 2, and no worker starts."""
import os
import subprocess
import sys

import pytest

HETAUTO_TORCHRUN = os.path.join(os.path.dirname(sys.executable), "hetauto-torchrun")


@pytest.mark.parametrize("given, field", [
    (["--rdzv-conf", "timeout=1.5"], "--rdzv-conf timeout"),
    (["--rdzv-conf", "timeout=abc"], "--rdzv-conf timeout"),
    (["--master-port", "70000"], "--master-port"),
    (["--master-port", "-5"], "--master-port"),
    (["--nproc-per-node", "0"], "--nproc-per-node"),
])
def test_an_argument_torch_refuses_is_one_paragraph(tmp_path, given, field):
    script = tmp_path / "worker.py"
    script.write_text("print('worker ran')\n")
    argv = {"--nnodes": "1", "--nproc-per-node": "1", "--node-rank": "0", "--master-addr": "127.0.0.1",
            "--master-port": "29517"}
    argv[given[0]] = given[1]       # (the value under test replaces the launch's own; --rdzv-conf is added)
    r = subprocess.run([HETAUTO_TORCHRUN, *[f"{k}={v}" for k, v in argv.items()], str(script)],
                       capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "worker ran" not in out, out[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hetauto-torchrun: error: "), out[-3000:]
    assert f"field '{field}'" in lines[0] and "Fix: " in lines[0], lines[0]
