"""The --hetauto hook's clean exit (runtime/clean_exit.py destroy_groups_at_exit): the process groups are destroyed
in an atexit handler, also where Python refuses new threads there (3.12.0-3.12.1: every rank of a torchrun launch
printed "Exception ignored in atexit callback ... can't create new thread at interpreter shutdown")."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import atexit, sys, threading
import torch.distributed as dist
from hetauto_megatron.runtime.clean_exit import destroy_groups_at_exit

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
atexit.register(lambda: print("initialized after the handler:", dist.is_initialized(), flush=True))
atexit.register(destroy_groups_at_exit, 30.0)
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
hook._take_charge_of_exit(600.0)     # as parse_and_validate_args does under --hetauto or on CPU
class Teardown:                     # says so if the interpreter is torn down (os._exit skips it)
    def __del__(self):
        print(" and went on to the interpreter's teardown", flush=True)
teardown = Teardown()
print("trained", end="")            # unflushed, as Megatron's last log line may be
metrics = open(sys.argv[3], "w")    # a file the script never closes, its last line still in Python's buffer
metrics.write("iteration 4 loss 5.17")
import ctypes                       # a line native code printed with C stdio (NCCL_DEBUG's go to stdout so): in the
ctypes.CDLL(None).printf(b" native line")   # C library's buffer, block-buffered on a pipe, until flushed
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
"""


@pytest.mark.parametrize("end, code", [("returned", 0), ("early-exit", 3)])
def test_the_process_ends_right_after_training_with_its_groups_destroyed(tmp_path, end, code):
    """After pretrain() returned, a process whose groups the hook owns ends there: its atexit handlers run (the
    groups destroyed), its output flushed, exit 0, and no interpreter teardown, in which a gloo worker thread
    could abort a finished run (SIGABRT). Where the hook does not own them (an accelerator without --hetauto),
    the script goes on as NVIDIA's does (the tests above). Megatron's early exits (--exit-interval and the like
    sys.exit() inside pretrain()) end the same way, with their exit code. As Python's own exit, it first lets the
    non-daemon threads finish (Megatron deletes old checkpoints in one), then runs the atexit handlers, and what
    the script wrote to a file it never closed is on disk, and what native code printed with C stdio is out."""
    metrics = tmp_path / "metrics.txt"
    # buffered as a launcher's pipe is (PYTHONUNBUFFERED would leave Python's and the C library's streams unbuffered)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    r = subprocess.run([sys.executable, "-c", AFTER_TRAINING, str(tmp_path / "store"), end, str(metrics)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == code, r.stderr
    assert metrics.read_text() == "iteration 4 loss 5.17"     # flushed as finalisation would have, not lost
    assert r.stdout.startswith("trained") and "initialized after the handler: False" in r.stdout
    assert "teardown" not in r.stdout
    assert " old checkpoint removed" in r.stdout, r.stdout      # not killed by the exit
    assert " native line" in r.stdout, r.stdout                 # the C library's buffer flushed too
    assert r.stdout.index("old checkpoint removed") < r.stdout.index("initialized after the handler"), r.stdout
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


UNDER_MAIN_GUARD = r"""
import os, sys
from hetauto_megatron.megatron import hook

end, unwound = sys.argv[2], sys.argv[3]
class Teardown:                     # says so if the interpreter is torn down (os._exit skips it)
    def __del__(self):
        print("teardown", flush=True)
teardown = Teardown()
if end == "train-exits":
    import torch.distributed as dist
    import megatron.training
    from megatron.training import training
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    def train(*args, **kwargs):     # Megatron's train() at --exit-interval: saves, then sys.exit(exit_code)
        sys.exit(3)
    training.train = train
if end != "not-in-charge":
    hook._take_charge_of_exit(600.0)     # as parse_and_validate_args does under --hetauto or on CPU
if end == "train-exits":
    # the hook wrapped the module attribute that pretrain() reads by name when it calls train()
    print("wrapped:", training.train.__wrapped__ is train and training.train._hetauto_ends_cleanly,
          megatron.training.pretrain is training.pretrain and "train" in training.pretrain.__code__.co_names
          and training.pretrain.__globals__ is vars(training), flush=True)

def main():
    try:
        if end == "train-exits":
            training.train()        # as pretrain() calls it
        elif end == "main-exits":
            sys.exit("the script's own stop")
        elif end == "input-error":
            from hetauto_megatron.errors import InputError
            raise InputError("the launch's own mistake, one paragraph")
        sys.exit(3)
    finally:                        # the user's clean-up, which an exit inside train() used to skip
        with open(unwound, "w") as f:
            f.write("unwound")

hook.main_guard(main)
print("went on after main_guard", flush=True)
"""


@pytest.mark.parametrize("end, code", [("train-exits", 3), ("main-exits", 1), ("input-error", 2),
                                       ("not-in-charge", 3)])
def test_under_main_guard_an_exit_unwinds_main_then_ends_cleanly(tmp_path, end, code):
    """An entry script run by hook.main_guard (its main a function): Megatron's early exit (sys.exit(3) inside
    train(), --exit-interval and the like) or the script's own sys.exit() first unwinds main (its finally block
    writes a file), then the process ends as after training (exit_after_training: no interpreter teardown) with
    the status Python's own exit gives (a message: printed, 1). The hook wrapped the `train` that Megatron's
    pretrain() looks up. Where the hook does not own the exit, the SystemExit goes on to Python's own exit."""
    unwound = tmp_path / "unwound"
    r = subprocess.run([sys.executable, "-c", UNDER_MAIN_GUARD, str(tmp_path / "store"), end, str(unwound)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == code, r.stdout + r.stderr
    assert unwound.exists(), r.stdout                     # main's finally block ran
    assert "went on after main_guard" not in r.stdout
    assert ("teardown" in r.stdout) == (end == "not-in-charge"), r.stdout
    if end == "train-exits":
        assert "wrapped: True True" in r.stdout, r.stdout
    if end == "main-exits":
        assert r.stderr.strip().endswith("the script's own stop"), r.stderr
    if end == "input-error":        # the paragraph, then exit 2 as cleanly as any other end
        assert "hetauto: error: the launch's own mistake" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


AT_MODULE_LEVEL = r"""
import os, sys
import torch.distributed as dist
from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import hook, script_guard

script_guard.guard_script_errors()  # the patch's first line in NVIDIA's pretrain_gpt.py, whose main is not a function
class Teardown:                     # says so if the interpreter is torn down (os._exit skips it): held by sys
    def __del__(self, write=os.write):  # (the traceback holds this module), said late, to the descriptor
        write(1, b"teardown\n")
sys.hetauto_teardown = Teardown()
# the refusal comes after torch.distributed is up (the world's join, the plan and job checks), whose own excepthook
# then calls the guard's with stderr pointed at a buffer
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
if sys.argv[2] == "in-charge":
    hook._take_charge_of_exit(600.0)     # as pretrain_kwargs does before the world's join under --hetauto
raise InputError("another cluster's launch typed other job arguments", field="--train-iters", fix="type the same")
"""


@pytest.mark.parametrize("charge", ["in-charge", "not-in-charge"])
def test_a_refusal_in_nvidias_script_ends_as_the_hook_ends_a_rank(tmp_path, charge):
    """NVIDIA's pretrain_gpt.py (patched) has no main function: a refusal raised by the hook there (a rank started
    twice, another plan or job on another cluster) ends in the guard's excepthook, which exited through interpreter
    finalisation with the groups and the store alive, where a gloo or store thread can abort the rank after its
    paragraph (SIGABRT, pytorch#190489; a test rank that ended so aborted in CI). Where the hook owns the exit it
    now ends as main_guard ends a refusal: the paragraph, exit 2, no teardown; elsewhere as before."""
    r = subprocess.run([sys.executable, "-c", AT_MODULE_LEVEL, str(tmp_path / "store"), charge], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "hetauto: error: field '--train-iters': another cluster's launch typed other job arguments" in r.stderr, \
        r.stderr
    assert ("teardown" in r.stdout) == (charge == "not-in-charge"), r.stdout
    assert "Traceback" not in r.stderr, r.stderr
