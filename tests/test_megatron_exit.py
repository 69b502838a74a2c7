"""The --hetauto hook's clean exit (hook._destroy_groups_at_exit): the process groups are destroyed in an atexit
handler, also where Python refuses new threads there (3.12.0-3.12.1: every rank of a torchrun launch printed
"Exception ignored in atexit callback ... can't create new thread at interpreter shutdown")."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import atexit, sys, threading
import torch.distributed as dist
from hetauto_megatron.megatron.hook import _destroy_groups_at_exit

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
atexit.register(lambda: print("initialized after the handler:", dist.is_initialized(), flush=True))
atexit.register(_destroy_groups_at_exit, 30.0)
from hetauto_megatron.megatron import hook
hook.exit_after_training()  # the hook did not take charge of this process's exit (an accelerator without --hetauto)
print("went on after training", flush=True)
if sys.argv[2] == "refuse-threads":
    def refuse_threads():  # runs first (atexit is last in, first out), as Python 3.12.0-3.12.1 do at shutdown
        def start(self):
            raise RuntimeError("can't create new thread at interpreter shutdown")
        threading.Thread.start = start
    atexit.register(refuse_threads)
"""


@pytest.mark.parametrize("mode", ["threads", "refuse-threads"])
def test_groups_destroyed_at_exit_without_a_traceback(tmp_path, mode):
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "store"), mode], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "initialized after the handler: False" in r.stdout and "went on after training" in r.stdout
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


AFTER_TRAINING = r"""
import atexit, sys, threading, time
import torch.distributed as dist
from hetauto_megatron.megatron import hook

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
atexit.register(lambda: print("initialized after the handler:", dist.is_initialized(), flush=True))
hook._take_charge_of_exit()         # as parse_and_validate_args does under --hetauto or on CPU
print("trained", end="")            # unflushed, as Megatron's last log line may be
def remove_old_checkpoint():        # as Megatron's non-daemon thread after a save (checkpointing.py remove_iter_ckpts),
    threading.main_thread().join()  # still at work when the main thread ends
    time.sleep(0.2)
    print(" old checkpoint removed", flush=True)
threading.Thread(target=remove_old_checkpoint).start()
if sys.argv[2] == "early-exit":     # Megatron's train() at --exit-interval: saves, then sys.exit() in pretrain()
    def train():
        sys.exit(3)
    hook.ending_cleanly(train)()
hook.exit_after_training()          # the patched script's last line
print(" and went on to the interpreter's teardown")
"""


@pytest.mark.parametrize("end, code", [("returned", 0), ("early-exit", 3)])
def test_the_process_ends_right_after_training_with_its_groups_destroyed(tmp_path, end, code):
    """After pretrain() returned, a process whose groups the hook owns ends there: its atexit handlers run (the
    groups destroyed), its output flushed, exit 0, and no interpreter teardown, in which a gloo worker thread
    could abort a finished run (SIGABRT). Where the hook does not own them (an accelerator without --hetauto),
    the script goes on as NVIDIA's does (the tests above). Megatron's early exits (--exit-interval and the like
    sys.exit() inside pretrain()) end the same way, with their exit code. As Python's own exit, it first lets the
    non-daemon threads finish (Megatron deletes old checkpoints in one), then runs the atexit handlers."""
    r = subprocess.run([sys.executable, "-c", AFTER_TRAINING, str(tmp_path / "store"), end], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == code, r.stderr
    assert r.stdout.startswith("trained") and "initialized after the handler: False" in r.stdout
    assert "teardown" not in r.stdout
    assert " old checkpoint removed" in r.stdout, r.stdout      # not killed by the exit
    assert r.stdout.index("old checkpoint removed") < r.stdout.index("initialized after the handler"), r.stdout
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
