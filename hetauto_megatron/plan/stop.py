"""When a search stops before its end: at its --budget-s deadline, or at the user's first Ctrl-C.

Every part of the search that can end with the best it has found so far (the trees, the climbs, the
enumerations, every leaf of --search exhaustive, the new shapes' levels, the event simulation's re-check of the
best layouts) asks `out_of_time(deadline)`. `hetauto plan` runs its search under `ctrl_c_keeps_best`: the first
Ctrl-C (SIGINT) makes every such check true, as an expired --budget-s would, so the command ends normally with
the best plan found so far; a second Ctrl-C stops the command (KeyboardInterrupt, exit 130). The search's worker
processes (plan/search_jobs.py) are forked while the handler is in place, so they hold it too: a terminal's
Ctrl-C, which reaches every process of the command, stops each worker's tree or climb at its next check with what
it found, where Python's own handler would raise KeyboardInterrupt inside the workers and lose their rounds; a
SIGINT sent to the command's process alone (`kill -INT`) is passed on to them (search_jobs.run_all).

Why a flag of the process rather than an argument: a signal handler can only leave its mark in the process's
state, and the checks sit deep in the search's loops, which take a deadline already.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

_requested = False          # set by the first Ctrl-C under ctrl_c_keeps_best, in each process it reaches
_pressed_at = 0.0           # when (time.perf_counter())


def out_of_time(deadline: float | None, grace_s: float = 0.0) -> bool:
    """Whether a search part should stop now with what it found: past `deadline` (time.perf_counter(); None: no
    --budget-s), or more than `grace_s` after a Ctrl-C asked the search to stop."""
    now = time.perf_counter()
    return (_requested and now - _pressed_at > grace_s) or (deadline is not None and now > deadline)


def requested() -> bool:
    """Whether a Ctrl-C asked this process's search to stop."""
    return _requested


def _note_ctrl_c(signum=None, frame=None) -> None:
    """A Ctrl-C asked the search to stop: every out_of_time check of this process is true from now."""
    global _requested, _pressed_at
    _requested, _pressed_at = True, time.perf_counter()


def keep_best_in_worker() -> None:
    """A search worker's SIGINT handler (a pool's initializer: search_jobs.run_all, explain's what-ifs): under
    ctrl_c_keeps_best its job ends with what it found, whichever handler the worker was forked with; otherwise the
    worker leaves the Ctrl-C to the command. Forked after the first Ctrl-C, a worker held Python's own handler
    again (which the command had put back for a second Ctrl-C), and the Ctrl-C passed on to it raised
    KeyboardInterrupt in it: a traceback, and the job it held lost."""
    if ctrl_c_reaches() or (_requested and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, _note_ctrl_c)
    elif signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        # a search outside ctrl_c_keeps_best (explain's): the command stops on the Ctrl-C and its pool ends the
        # workers, which printed a KeyboardInterrupt traceback each before
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def ctrl_c_reaches() -> bool:
    """Whether a Ctrl-C would stop this process's search keeping the best found: only under ctrl_c_keeps_best,
    which is not installed when the process started with SIGINT ignored (a command started in the background of a
    script, `hetauto plan ... &`, which Python leaves ignored). Progress lines offer Ctrl-C only then."""
    return getattr(signal.getsignal(signal.SIGINT), "_keeps_best", False)


@dataclass
class CtrlC:
    """What ctrl_c_keeps_best yields: `pressed` says, once the search is over, whether a Ctrl-C cut it short."""
    pressed: bool = False


@contextmanager
def ctrl_c_keeps_best(command: str):
    """Run a search so that the first Ctrl-C stops it with the best found so far (module docstring), saying so on
    stderr in `command`'s name. Installed only where SIGINT has Python's default handler, in the main thread (an
    ignored SIGINT stays ignored; a caller's own handler stays). An InfeasibleError of a search a Ctrl-C cut before
    it found any layout that fits becomes the KeyboardInterrupt the user asked for (exit 130, not "no feasible
    plan"). Yields a CtrlC."""
    global _requested
    from ..errors import InfeasibleError
    out = CtrlC()
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield out
        return
    owner = os.getpid()

    def first(signum, frame):
        _note_ctrl_c()
        # The workers hold this handler too and keep it: they never raise KeyboardInterrupt (the command's second
        # Ctrl-C ends them with their pool), and one that already stopped is not disturbed by the signal forwarded
        # to it (search_jobs.run_all). The command says it once.
        if os.getpid() == owner:
            signal.signal(signal.SIGINT, signal.default_int_handler)    # a second Ctrl-C stops the command
            os.write(2, f"{command}: Ctrl-C: stopping the search with the best plan found so far (Ctrl-C again "
                        "stops the command)\n".encode())
    first._keeps_best = True
    _requested = False
    signal.signal(signal.SIGINT, first)
    try:
        yield out
    except InfeasibleError:
        if _requested:
            raise KeyboardInterrupt from None
        raise
    finally:
        out.pressed = _requested
        _requested = False
        signal.signal(signal.SIGINT, signal.default_int_handler)
