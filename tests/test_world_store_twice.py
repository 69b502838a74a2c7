"""The same global rank started twice (a cluster's launch run twice, two nodes of a cluster given one NODE_RANK): the
world store counted the second process as another rank, so the world "joined" without its real ranks and the extra
process waited in gloo's connection mesh, then failed with torch's traceback (measured with NVIDIA's pretrain_gpt.py
and HETAUTO_TIMEOUT_S=30: 'Gloo connectFullMesh failed ... Connect timeout' after 150 s, exit 1). Now the second
process of a rank stops at once with a paragraph naming NODE_RANK (exit 2), and the world of the others joins."""
import os
import subprocess
import sys
import time

import pytest

from hetauto_megatron.runtime.launcher import free_port

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)


def test_a_rank_started_twice_is_refused_at_once_and_the_others_join():
    port = free_port()
    code = ("import sys, time\n"
            "from hetauto_megatron.megatron import world_store as w\n"
            "from hetauto_megatron.errors import InputError\n"
            "rank = int(sys.argv[1])\n"
            "try:\n"
            f"    store = w.join(rank, 2, '127.0.0.1', {port}, 20.0)\n"
            "except InputError as exc:\n"
            "    print('field', exc.field, '|', exc.message, flush=True)\n"
            "    raise SystemExit(2)\n"
            "print('joined', flush=True)\n"
            "time.sleep(3)\n")                     # rank 0 hosts the store a little longer
    start = time.monotonic()
    procs = []
    for rank in (0, 1, 1):
        procs.append(subprocess.Popen([sys.executable, "-c", code, str(rank)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=dict(os.environ)))
        time.sleep(1.5)
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=60)
            out.append((p.returncode, o + e))
    finally:
        for p in procs:
            p.kill()
    assert time.monotonic() - start < 40
    assert out[0][0] == 0 and "joined" in out[0][1], out
    codes = sorted(code for code, _ in out[1:])
    assert codes == [0, 2], out
    refused = next(text for code, text in out[1:] if code == 2)
    assert "field NODE_RANK" in refused and "global rank 1 was started twice" in refused, refused
