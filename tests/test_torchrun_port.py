"""hetauto-torchrun, the launch scripts' launcher, on a node whose rendezvous port (CLUSTER_MASTER_PORT, torchrun's
--master-port) another process holds: one paragraph naming the port and the variable, exit 2 (a user's environment),
not torchrun's 40-line DistNetworkError traceback and exit 1."""
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

HETAUTO_TORCHRUN = os.path.join(os.path.dirname(sys.executable), "hetauto-torchrun")


def test_a_taken_cluster_master_port_is_one_paragraph(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text("print('worker ran')\n")
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run([HETAUTO_TORCHRUN, "--nnodes=1", "--nproc-per-node=1", "--node-rank=0",
                            "--master-addr=127.0.0.1", f"--master-port={port}", str(script)],
                           capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "worker ran" not in out, out[-3000:]
    assert f"port {port}" in out and "CLUSTER_MASTER_PORT" in out and "--master-port" in out, out[-3000:]
