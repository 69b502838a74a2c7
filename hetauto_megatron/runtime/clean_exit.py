"""How a process that joined torch.distributed ends: its groups destroyed while the interpreter is whole, then exit
without interpreter finalisation.

Left to finalisation, a gloo worker thread that still drops a finished operation's tensor, or the rendezvous
store's, needs the interpreter lock once Python has begun to tear down, and the process aborted ("terminate called
without an active exception", SIGABRT) after its work had succeeded (pytorch/pytorch#190489; seen on CPU runs of
NVIDIA's pretrain_gpt.py with the groups destroyed already in an atexit handler). So the code that joins a world
takes charge of the process's exit (`take_charge_of_exit`), and whoever owns the process's end (an entry script's
last line, megatron/script_guard.py; the `hetauto` command line, cli.py; a child process's own function) ends it
with `end_process` where `in_charge_of_exit()`. Used by Megatron-LM's --hetauto hook and its CPU runs
(megatron/hook.py), DeepSpeed runs (deepspeed_pipeline.initialize) and `hetauto probe-link` (measure/probe_link.py).
Nothing here imports torch: a process that never did has no groups.
"""
from __future__ import annotations

import _io
import atexit
import ctypes
import gc
import os
import sys
import threading
from typing import NoReturn, Optional

# The process (pid) that took charge of its exit, or None. Keyed by pid: a forked child inherits the value, not the
# charge (its parent's groups are not its own).
_IN_CHARGE: Optional[int] = None


def take_charge_of_exit(timeout_s: float) -> None:
    """This process holds (or is about to hold) torch.distributed's groups: destroy them at a clean exit
    (`destroy_groups_at_exit`, bounded by `timeout_s`), and let its owner end it with `end_process`."""
    global _IN_CHARGE
    if not in_charge_of_exit():
        _IN_CHARGE = os.getpid()
        atexit.register(destroy_groups_at_exit, timeout_s)


def in_charge_of_exit() -> bool:
    return _IN_CHARGE == os.getpid()


def give_up_charge() -> None:
    """Undo `take_charge_of_exit` where the process is not the command's own (cli.main called from Python, after a
    probe-link that destroyed its group): the caller's later script ending (`main_guard`, `exit_after_training`)
    then returns as before, instead of ending the caller's process."""
    global _IN_CHARGE
    if in_charge_of_exit():
        _IN_CHARGE = None
        atexit.unregister(destroy_groups_at_exit)


def destroy_groups_at_exit(timeout_s: float) -> None:
    """At a clean exit, destroy the process groups while the interpreter is still alive. Left to interpreter
    finalisation, a gloo worker thread still releasing a finished operation's tensor can abort the process
    ("terminate called without an active exception", pytorch/pytorch#190489) after training succeeded. Skipped
    after an uncaught exception (other ranks may still wait in a collective); bounded by `timeout_s`, after which
    the exit goes on as before."""
    if getattr(sys, "last_exc", None) is not None or getattr(sys, "last_type", None) is not None:
        return
    dist = sys.modules.get("torch.distributed")    # never imported: no groups (importing torch here took seconds)
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return
    worker = threading.Thread(target=dist.destroy_process_group, name="hetauto-destroy-groups", daemon=True)
    try:
        worker.start()
    except RuntimeError:
        # Python 3.12.0-3.12.1 refuse new threads in atexit handlers ("can't create new thread at interpreter
        # shutdown", python/cpython#113964): destroy them here, unbounded.
        dist.destroy_process_group()
        return
    worker.join(timeout_s)
    if worker.is_alive():
        print(f"hetauto: warning: the process groups were not destroyed within {timeout_s:g} s at exit",
              file=sys.stderr, flush=True)


def end_process(code: int) -> NoReturn:
    """Exit `code` as Python's own exit would, less the interpreter's finalisation: what Python's exit does, in its
    order, here while every thread can still take the lock: the threading module's exit callbacks (concurrent.futures'
    executors told to stop) and every non-daemon thread joined (Megatron deletes old checkpoints in one after a save,
    checkpointing.py remove_iter_ckpts and _async_delete_checkpoint_impl; os._exit would kill it mid-rmtree), then
    the atexit handlers (the groups destroyed, logging flushed), then every file still open flushed."""
    threading._shutdown()
    atexit._run_exitfuncs()
    flush_open_files()
    os._exit(code)


def flush_open_files() -> None:
    """Flush every Python file object still open for writing (the streams, and a log or metrics file the script
    opened and never closed), as finalisation would have when it dropped them: os._exit then loses nothing
    written through Python, nor what native code wrote with C stdio. Each is flushed, not closed (another handler
    may still hold it); one that cannot be flushed (a closed pipe) is left as it is."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    # io's C base class, not the abstract io.IOBase: every file object derives from it, and the abstract class's
    # isinstance over the 400,000-odd objects of a process that imported Megatron took 0.3 s of CPU per rank
    # (three times the C check), paid by every rank of every launch at its exit. The object's type, not isinstance:
    # isinstance also asks an object for its __class__, and torch.distributed's deprecated `reduce_op` answers
    # that with a FutureWarning on stderr (every `hetauto probe-link` printed two)
    for obj in gc.get_objects():
        if issubclass(type(obj), _io._IOBase) and obj not in (sys.stdout, sys.stderr):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError):
                pass
    # and the C library's own streams, which os._exit does not flush either: what native code printed with C stdio
    # (NCCL_DEBUG's lines go to stdout so, block-buffered when a launcher pipes it to a log) would be lost
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
