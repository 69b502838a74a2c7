"""A local launcher: one process per rank, forked after the parent imported torch and Megatron once.

Importing torch + Megatron costs ~3 s per process on a small machine; forking after one import costs
nothing, so an 8-rank dry run starts in about the time of one import. Each child gets the usual
torch.distributed environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK), runs
`fn(rank, world_size, *args)` and sends back its JSON-able result over a pipe (no pickle).

Failures never hang the caller: a rank that raises or dies is reported with its rank number and message;
the other ranks get `grace_s` to notice (their collectives time out or see the closed connection) and exit
with their own error, then whatever is left is killed. The whole launch has a deadline (`timeout_s`).
An `InputError` raised by any rank is re-raised as itself, so the CLI prints it and exits 2. A rank that returned
its result stays until the launch ends it (rank 0 hosts the rendezvous store its peers may still read).

Stopping the launch stops its ranks: SIGTERM or SIGHUP (what `kill`, `timeout`, a batch scheduler and a closed
terminal send) terminates every rank, kills those still there after STOP_GRACE_S, and exits 128 + the signal's
number; Ctrl-C (SIGINT) reaches the ranks themselves and the launch kills what is left. A forked rank is not ended
by its parent's death on its own (daemon=True acts only at a clean interpreter exit), so each rank also asks the
kernel to kill it when the launch process dies by any other means (SIGKILL, the out-of-memory killer).

`drop_lines`: the ranks' stderr passes through the launch, line by line, leaving out the lines it matches (gloo
writes every retried connection to stderr itself, with no setting to stop it; the dry run drops those, as the
failure they precede reaches the user as one paragraph).
"""
from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import random
import signal
import socket
import sys
import threading
import time

from ..errors import InputError, StoppedBySignal


class LaunchError(RuntimeError):
    """One or more ranks failed; `failures` maps rank -> one-paragraph reason."""

    def __init__(self, failures: dict[int, str]):
        self.failures = dict(sorted(failures.items()))
        lines = [f"rank {r}: {msg}" for r, msg in self.failures.items()]
        super().__init__(f"{len(self.failures)} rank(s) failed:\n" + "\n".join(lines))


# Where the kernel hands out ports of its own (outgoing connections, and listeners bound to port 0 such as gloo's
# per-pair ones); Linux says it in this file, other systems default to IANA's 49152-65535.
_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST_PORT = 10000     # below: well-known and registered services are common


def _ephemeral_low() -> int:
    try:
        with open(_EPHEMERAL_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port nobody listens on now, for a rendezvous that binds it a moment later.

    Drawn at random below the kernel's ephemeral range: between this check and the rendezvous's bind, the kernel
    may give a port of that range to any other process's connection or port-0 listener (another launch's gloo
    pairs, say), whereas a port below it is taken only by someone choosing that very number. Falls back to a port
    the kernel picks where the range leaves no room.
    """
    low = _ephemeral_low()
    if low - _LOWEST_PORT >= 1000:
        draw = random.Random()       # its own generator: a caller's random state (seeds) stays untouched
        for _ in range(64):
            port = draw.randrange(_LOWEST_PORT, low)
            if _bindable(port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The signals that ask the launch to stop (SIGINT is Python's KeyboardInterrupt, which the ranks receive too: they
# share the terminal's process group), and how long a rank has to end on SIGTERM before it is killed.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 3.0
_PR_SET_PDEATHSIG = 1       # linux/prctl.h


class StopRequested(BaseException):
    """A stop signal reached the launch (BaseException: no rank-result handling may swallow it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def catch_stop_signals() -> dict:
    """Turn the stop signals into `StopRequested` in this process; {signal: previous handler} of those changed. Only
    signals with the default action (an ignored one, e.g. SIGHUP under nohup, stays ignored; a caller's handler
    stays), and only in the main thread (the only one Python lets set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    fired = []

    def stop(signum, frame):
        if not fired:       # once: a second signal must not cut short the stopping of the ranks
            fired.append(signum)
            raise StopRequested(signum)

    previous = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, stop)
    return previous


def _die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this rank when the launch process dies (Linux; elsewhere nothing), and end now if it
    died already (between the fork and this call)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def _end(procs: list, grace_s: float) -> None:
    """End every rank still running: SIGTERM and up to `grace_s` to exit first when `grace_s` > 0, then SIGKILL."""
    if grace_s > 0:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
        until = time.monotonic() + grace_s
        for p in procs:
            p.join(max(0.0, until - time.monotonic()))
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        p.join()


def _child(fn, rank, world_size, args, env, conn, parent, stop_handlers, relay, linger_s):
    for sig, handler in stop_handlers.items():     # the launch's stop handlers are the parent's, not a rank's
        signal.signal(sig, handler)
    if relay is not None:       # fd 2 itself: native libraries (gloo) write there, not to sys.stderr
        sys.stderr.flush()
        os.dup2(relay[1], 2)
        os.close(relay[0])
        os.close(relay[1])
    _die_with_parent(parent)
    os.environ.update(env)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    code = 0
    try:
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        payload = {"ok": fn(rank, world_size, *args)}
    except InputError as exc:
        payload = {"input_error": {"reason": exc.reason, "file": exc.file, "field": exc.field, "fix": exc.fix}}
        code = 2
    except BaseException as exc:  # report everything: the parent decides what to show
        payload = {"error": f"{type(exc).__name__}: {exc}"}
        code = 1
    sys.stdout.flush()      # before the result: once every result is in, the launch ends the ranks at once
    sys.stderr.flush()
    try:
        conn.send_bytes(json.dumps(payload, default=float).encode())
    except Exception as exc:
        conn.send_bytes(json.dumps({"error": f"result is not JSON-able: {exc}"}).encode())
        code = 1
    conn.close()
    if code == 0:
        # A rank that finished stays until the launch ends it: rank 0 hosts the rendezvous store (env://), and a
        # peer still in its rendezvous or building a group reads that store; rank 0 gone first, the peer failed
        # with "Connection reset by peer" instead of its own result. torchrun's agent hosts the store for the same
        # reason. A rank that failed or refused its input leaves now: its peers, perhaps waiting on it in a
        # collective, see the closed connection and report instead of waiting out the grace (a refusal is what the
        # launch raises, whatever they report). Its groups go now, the store stays: a peer that waits on it in a
        # collective (a defect of `fn`) sees the closed connection and reports, instead of waiting out its timeout.
        kept = _close_groups_keep_store()      # (the store: held until os._exit below)
        try:
            time.sleep(linger_s)
        except BaseException:       # Ctrl-C reaches the ranks too: no traceback, the launch ends the rest
            pass
    # Skip interpreter teardown: atexit handlers inherited from the parent (and torch's) must not run twice.
    os._exit(code)


def _close_groups_keep_store():
    """Destroy this finished rank's process groups (on a thread of their own: a destroy that waits on something
    does not hold the rank) and return the default group's store, which the caller keeps: on rank 0 that object
    hosts the env:// rendezvous. None when the rank made no group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:           # noqa: BLE001  (torch's private helper moved: keep the groups, as before)
        return None
    threading.Thread(target=dist.destroy_process_group, name="hetauto-close-groups", daemon=True).start()
    return store


def _relay_lines(read_fd: int, drop) -> None:
    """Copy the ranks' stderr (the pipe's `read_fd`) to this process's fd 2, less the lines `drop` matches."""
    with os.fdopen(read_fd, "rb") as pipe:
        for line in pipe:
            if drop.search(line):
                continue
            try:
                os.write(2, line)
            except OSError:        # our own stderr is gone: keep draining so that no rank blocks on the pipe
                pass


def launch(fn, world_size: int, *, args: tuple = (), timeout_s: float = 300.0, grace_s: float = 30.0,
           env: dict | None = None, drop_lines=None) -> list:
    """Run `fn(rank, world_size, *args)` in `world_size` forked processes; return the results in rank order.

    Raises `InputError` (the lowest failing rank's) when a rank rejected its input, `LaunchError` when any rank
    failed otherwise, died, or the launch passed `timeout_s`. `drop_lines` (a compiled bytes pattern): the ranks'
    stderr lines it matches are left out.
    """
    ctx = multiprocessing.get_context("fork")
    base_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    base_env.update(env or {})
    procs, conns = [], []
    payloads: dict[int, dict] = {}
    failures: dict[int, str] = {}
    stopped = None
    relay = os.pipe() if drop_lines is not None else None
    relayer = None
    previous = catch_stop_signals()
    try:
        for rank in range(world_size):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(fn, rank, world_size, args, base_env, send, os.getpid(), previous,
                                                 relay, timeout_s + grace_s), daemon=True)
            p.start()
            send.close()
            procs.append(p)
            conns.append(recv)
        if relay is not None:       # (started after the forks: no rank is forked from a process with threads)
            os.close(relay[1])
            relayer = threading.Thread(target=_relay_lines, args=(relay[0], drop_lines), daemon=True)
            relayer.start()
            relay = None
        _collect(procs, conns, payloads, failures, timeout_s, grace_s)
    except StopRequested as exc:
        stopped = exc.signum
    finally:
        # the handlers back first: a stop signal from here on has its default action (the ranks die with this
        # process, _die_with_parent) instead of raising StopRequested where nothing catches it
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _end(procs, STOP_GRACE_S if stopped else 0.0)
        for c in conns:
            c.close()
        if relay is not None:       # (a fork failed before the relay started)
            os.close(relay[0])
            os.close(relay[1])
        if relayer is not None:     # the ranks' last lines before the launch's own words (a process the ranks
            relayer.join(5.0)       # started may hold the pipe open: not waited for beyond this)
    if stopped:
        said = f"stopped by {signal.Signals(stopped).name}; its {len(procs)} rank process(es) were ended"
        print(f"hetauto: {said}", file=sys.stderr, flush=True)
        raise StoppedBySignal(stopped, said)
    input_errors = sorted(r for r, got in payloads.items() if "input_error" in got)
    if input_errors:
        raise InputError(**payloads[input_errors[0]]["input_error"])
    if failures:
        raise LaunchError(failures)
    return [payloads[r]["ok"] for r in range(world_size)]



def _collect(procs, conns, payloads: dict, failures: dict, timeout_s: float, grace_s: float) -> None:
    """Wait for every rank's result into `payloads` (rank -> what it sent) and `failures` (rank -> why), until
    each has one, the deadline passed, or `grace_s` passed after the first failure."""
    world_size = len(procs)
    deadline = time.monotonic() + timeout_s
    first_failure_at = None
    while True:
        for rank, (p, c) in enumerate(zip(procs, conns)):
            if rank in payloads or rank in failures:
                continue
            got = None
            if c.poll():
                try:
                    got = json.loads(c.recv_bytes().decode())
                except EOFError:
                    got = None
            if got is not None:
                payloads[rank] = got
                if "ok" not in got:     # an input error is raised below; any failure starts the grace
                    failures[rank] = got.get("error", "rejected its input")
            elif not p.is_alive():
                p.join()
                failures[rank] = f"process died (exit code {p.exitcode}) without reporting a result" + (
                    " (killed by SIGKILL: most often the machine ran out of memory)"
                    if p.exitcode == -signal.SIGKILL else "")
            if rank in failures and first_failure_at is None:
                first_failure_at = time.monotonic()
        if len(set(payloads) | set(failures)) == world_size:
            return
        now = time.monotonic()
        why = None
        if now > deadline:
            why = f"still running after the launch timeout of {timeout_s:.0f}s; killed"
        elif first_failure_at is not None and now - first_failure_at > grace_s:
            why = (f"still running {grace_s:.0f}s after another rank failed; killed "
                   "(it was probably waiting on the failed rank)")
        if why:
            failures.update({r: why for r in range(world_size) if r not in payloads and r not in failures})
            return
        time.sleep(0.01)
