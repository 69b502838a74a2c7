"""A rank joining the world store (megatron/world_store.py join) while something other than the store holds
HETAUTO_MASTER_PORT on rank 0's node: a program that accepts connections but never speaks the store's protocol (any
other service, or a frozen earlier run, whose kernel still accepts). torch's TCPStore client pings the server
when it is made and waits for the answer without a timeout, so the rank waited for ever, whatever HETAUTO_TIMEOUT_S
said (measured with NVIDIA's pretrain_gpt.py: cluster-b's rank still waiting after 190 s with HETAUTO_TIMEOUT_S=30).
Now it stops after the timeout with a paragraph naming HETAUTO_MASTER_PORT (exit 2)."""
import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_port_held_by_a_silent_program_is_a_paragraph_within_the_timeout():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(16)                 # accepts (the kernel's backlog), never answers
        port = held.getsockname()[1]
        code = ("from hetauto_megatron.megatron import world_store as w\n"
                "from hetauto_megatron.errors import InputError\n"
                "try:\n"
                f"    w.join(1, 2, '127.0.0.1', {port}, 4.0)\n"
                "except InputError as exc:\n"
                "    print('field', exc.field, '|', exc.message, flush=True)\n"
                "    raise SystemExit(2)\n")
        start = time.monotonic()
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
        except subprocess.TimeoutExpired:
            raise AssertionError("the join waited past 60 s with an 4 s timeout") from None
        took = time.monotonic() - start
    assert r.returncode == 2, r.stdout + r.stderr
    assert took < 30, took
    assert "field HETAUTO_MASTER_PORT" in r.stdout and "does not answer as the world's rendezvous store" in r.stdout, \
        r.stdout + r.stderr
