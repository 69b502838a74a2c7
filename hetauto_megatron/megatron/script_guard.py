"""How an entry script running under the hook ends (hook.py re-exports these, the names the scripts call): once
training returned or Megatron's train() sys.exit()ed, at once and cleanly (exit_after_training; under main_guard
after the script's main has unwound, its finally blocks run); a user mistake (InputError) prints one paragraph
and exits 2, also posting the refusal to the other clusters' ranks (world_store.post_refusal) so they stop now,
not at their rendezvous timeout; a rank that went away under this one (a pipeline transfer's PeerError, gloo's
error in a collective across the clusters) is one paragraph naming it, exit 4 (runtime/liveness.py
LOST_PEER_EXIT). Anything else keeps its traceback."""
from __future__ import annotations

import io
import os
import sys
import threading
from typing import Callable, Optional

from ..errors import InputError, first_line
from ..runtime.clean_exit import end_process, in_charge_of_exit
from . import launch_identity


def exit_for_user(exc: InputError):
    print(f"hetauto: error: {exc.message}", file=sys.stderr, flush=True)
    if not getattr(exc, "from_world_store", False):
        # clusters launched separately: the others learn of it now, not when their rendezvous times out
        from .world_store import post_refusal
        post_refusal(exc.message)
    sys.exit(exc.exit_code)


def _liveness():
    """This rank's listener (hook._STATE, once pretrain_kwargs built the groups), or None before."""
    from .hook import current_plan_state
    state = current_plan_state()
    return state.liveness if state is not None else None


def _lost_peer(exc: BaseException) -> Optional[str]:
    """The paragraph for a rank that went away under this one (runtime/liveness.py), or None."""
    from ..runtime.liveness import lost_peer
    return lost_peer(_liveness(), exc)


def _exit_for_lost_peer(text: str):
    from ..runtime.liveness import exit_for_lost_peer
    exit_for_lost_peer(text, _liveness())


# The (process, thread) running main_guard's fn, or None: there `ending_cleanly` lets Megatron's early exit unwind
# the user's main (its finally blocks, its context managers) for main_guard to end the process after it. Keyed as
# runtime/clean_exit.py's charge of the exit is: a forked child inherits the value, not the guard; another thread
# is not the guard's.
_GUARDED: Optional[tuple] = None


def _guarded_here() -> bool:
    return _GUARDED == (os.getpid(), threading.get_ident())


def main_guard(fn: Callable[[], None]) -> None:
    """Run an entry script's main so that a user mistake prints one paragraph and exits 2, not a traceback, and a
    rank that went away under this one is one paragraph naming it (exit 4). Where the hook owns the exit, main
    ends the process cleanly (exit_after_training) after it returned, and after a sys.exit() inside it once the
    stack has unwound (Megatron's early exits in train(), the script's own), with that exit's status."""
    global _GUARDED
    previous, _GUARDED = _GUARDED, (os.getpid(), threading.get_ident())
    try:
        try:
            fn()
        except InputError as exc:
            exit_for_user(exc)       # its exit 2 ends below like any other, not through teardown
        except RuntimeError as exc:
            lost = _lost_peer(exc)
            if lost is None:
                raise
            _exit_for_lost_peer(lost)
    except SystemExit as exc:
        if in_charge_of_exit():
            exit_after_training(_exit_status(exc))
        raise
    finally:
        _GUARDED = previous
    exit_after_training()


def _exit_status(exc: SystemExit) -> int:
    """The status Python's own exit gives a SystemExit: None 0, an int its low byte (what a process can return),
    anything else printed to stderr and 1 (sys.exit("a message"))."""
    code = exc.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        return 1
    return (code or 0) & 0xFF


def exit_after_training(code: int = 0) -> None:
    """End the process now that training returned (the patched pretrain_gpt.py's last line; main_guard after
    main), where the process groups are the package's (the hook's under --hetauto, gloo's on CPU, a DeepSpeed run's
    through deepspeed_pipeline.initialize: runtime/clean_exit.py took charge of the exit; elsewhere this returns and
    the script ends as before): TensorBoard's writer closed, the non-daemon threads joined and the atexit handlers
    run while the interpreter is whole (the groups destroyed, logging flushed), files still open flushed, then
    exit `code` (0) without interpreter finalisation. Left to finalisation, a gloo worker thread that still drops a
    finished operation's tensor needs the interpreter lock once Python has begun to tear down, and the process aborted
    ("terminate called without an active exception", SIGABRT) after its last iteration had trained, so its
    torchrun reported a failure (pytorch/pytorch#190489; seen on CPU runs of NVIDIA's script with the groups
    destroyed already in the atexit handler). Megatron's own early exits (--exit-interval,
    --exit-duration-in-mins, --exit-signal-handler) sys.exit() inside pretrain() and never reach this line:
    `ending_cleanly` brings them here with their exit code (under main_guard, once main's stack has unwound).
    A DeepSpeed run's process (runtime/deepspeed_pipeline.py initialize took the charge) ends here the same way."""
    if not in_charge_of_exit():
        return
    # a rank of separately launched clusters: its store's watcher stopped, and at a normal end the host stays until
    # no other rank's watcher reads its store (world_store.end_of_job); a process that never joined has none
    world_store = sys.modules.get("hetauto_megatron.megatron.world_store")
    if world_store is not None:
        world_store.end_of_job(clean=code == 0)
    # a script that never imported Megatron's globals has no writer (importing Megatron here took seconds)
    global_vars = sys.modules.get("megatron.training.global_vars")
    try:
        writer = global_vars.get_tensorboard_writer() if global_vars is not None else None
    except AssertionError:
        writer = None
    if writer is not None:
        writer.close()
    # Python's own exit less the interpreter's teardown (the non-daemon threads joined, the atexit handlers run,
    # open files flushed): runtime/clean_exit.py
    end_process(code)


def ending_cleanly(train: Callable) -> Callable:
    """Megatron's train() wrapped so that its early exits end the process as exit_after_training does, with their
    exit code: at --exit-interval, --exit-duration-in-mins or the exit signal it saves, then sys.exit()s inside
    pretrain() (training.py train, "if should_exit: ... sys.exit(exit_code)"), and the process went through the
    interpreter teardown exit_after_training avoids. Under main_guard (an entry script whose main is a function)
    the SystemExit goes on, so that main's finally blocks and context managers run, and main_guard ends the
    process; elsewhere (NVIDIA's pretrain_gpt.py, whose main is not a function) it ends here. Where the hook does
    not own the exit, the SystemExit goes on."""
    import functools

    @functools.wraps(train)
    def wrapper(*args, **kwargs):
        try:
            return train(*args, **kwargs)
        except SystemExit as exc:
            if in_charge_of_exit() and not _guarded_here():
                exit_after_training(_exit_status(exc))
            raise

    wrapper._hetauto_ends_cleanly = True
    return wrapper


def guard_script_errors() -> None:
    """The same for a script whose `__main__` block is not a function (NVIDIA's pretrain_gpt.py; the patch
    calls this right after importing the hook, before the script's first line): from now on an InputError that
    ends the script prints one paragraph and exits 2. Any other exception keeps its traceback (the previous
    sys.excepthook handles it).

    Under --hetauto it also checks the launch environment's numbers first (launch_identity.identity_from_env):
    NVIDIA's script converts RANK with int() on its 16th line and Megatron's parser WORLD_SIZE before the hook
    parses anything, so 'RANK=abc' was a ValueError traceback from either."""
    previous = sys.excepthook
    if getattr(previous, "_hetauto", False):
        return
    stream = sys.stderr

    def excepthook(kind, exc, tb):
        lost = _lost_peer(exc) if isinstance(exc, RuntimeError) else None
        if isinstance(exc, InputError) or lost is not None:
            # After init_process_group, torch's own excepthook calls this one with sys.stderr pointed at a buffer
            # (an io.StringIO) it prints once this hook returns; this one exits instead, so the paragraph went
            # nowhere (every rank stopped with exit 2 and no word). The script's stderr takes it.
            if isinstance(sys.stderr, io.StringIO):
                sys.stderr = stream
            if lost is not None:
                _exit_for_lost_peer(lost)
            try:
                exit_for_user(exc)   # SystemExit raised inside an excepthook sets the exit code
            except SystemExit as end:
                # where the hook owns the exit (after the world's join under --hetauto, or gloo's groups on CPU)
                # the refusal ends as main_guard ends it, not through interpreter finalisation, in which a gloo or
                # store thread can abort the process after its paragraph (SIGABRT, pytorch#190489)
                if in_charge_of_exit():
                    exit_after_training(_exit_status(end))
                raise
        previous(kind, exc, tb)

    excepthook._hetauto = True
    sys.excepthook = excepthook
    if "--hetauto" in sys.argv[1:]:
        launch_identity.identity_from_env()      # InputError (the hook above prints it) for a variable not a number


def assertion_text(exc: AssertionError) -> str:
    """An assertion's message, or for a bare `assert` (Megatron's `assert args.min_lr <= args.lr`) its line and
    where it stands, which is what names the flags then."""
    import traceback

    if str(exc).strip():
        return first_line(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames or not frames[-1].line:
        return "an assertion without a message"
    where = frames[-1]
    return f"`{where.line.strip()}` ({where.filename.split('site-packages/')[-1]}, line {where.lineno})"
