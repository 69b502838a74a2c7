"""Which rank went away when one of Megatron's own collectives across every cluster fails (the gradient-norm
all-reduce, the closing barrier, ...): gloo's error names only a socket ("Connection closed by peer
[10.0.0.7]:41235"), never a rank, and the communicator's `PeerError` (peers.py) covers only the pipeline's own
transfers, where the peer is known.

Each rank keeps a small TCP listener (a daemon thread; nothing runs on it during training) whose address every
rank learns once at start-up (one all-gather on the world's gloo group, beside the groups' own set-up). When a
collective fails, `collective_failure` connects to every other rank's listener: a refused connection is a process
that is gone, one that does not answer within PROBE_S a node that is down or cut off. A listener answers "A"
(alive), or "S" and the ranks it found gone once its own rank stops on the loss: gloo's connections close only when
a process exits, so the ranks that wait on a stopping rank fail after it, when it may be gone too; the earlier
ranks' findings, where one still answers, tell the rank that went away first from those that stopped on it.
The collectives themselves are untouched: this only runs after one has failed.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import socket
import threading
import traceback

from .peers import PeerError, gloo_reason
from .ranks import describe_rank

PROBE_S = 2.0                    # a listener answers at once: longer is a node down or unreachable
PROBE_THREADS = 64
# A rank's exit status after its lost-peer paragraph: not 1, which is also any crash's (an uncaught exception), so
# that hetauto-torchrun (megatron/torchrun.py) can end such a launch with one line and keep torchrun's report for
# a crash. Not 2 or 3 either (invalid input, no feasible plan).
LOST_PEER_EXIT = 4
# A rank stopping on the loss leaves "S" and what it found answered on its listener this long after it exits
# (exit_for_lost_peer): the ranks that waited on it fail only once it has exited (gloo's connections close with the
# process), and they probe then; finding it gone, they would name it beside the rank that went away first.
LINGER_S = 3 * PROBE_S
# gloo's words for a peer that went away or stopped answering (its transport's own errors, any torch version)
PEER_LOSS = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out waiting",
             "connection refused", "read error", "write error")


class Liveness:
    """This rank's listener and every rank's (host, port) for it."""

    def __init__(self, ctx, host: str):
        self.ctx = ctx
        self.answer = b"A"
        self._server = socket.create_server(("", 0), backlog=128)
        # A forked child (Megatron's data-loader workers) would keep the listening socket open after this process
        # died: the kernel would still accept probes that nobody answers, and a crashed rank would read as silent.
        os.register_at_fork(after_in_child=self._server.close)
        threading.Thread(target=self._serve, name="hetauto-liveness", daemon=True).start()
        self.addresses = [None] * ctx.world_size
        import torch.distributed as dist
        dist.all_gather_object(self.addresses, (host, self._server.getsockname()[1]), group=ctx.world_gloo)

    @classmethod
    def start(cls, ctx) -> "Liveness":
        # Megatron's straggler timer logs the traceback of any exception leaving a forward step as a warning
        # (megatron/core/utils.py StragglerDetector.__exit__); for a lost peer the paragraph says it all
        logging.getLogger("megatron.core.utils").addFilter(_without_peer_loss)
        return cls(ctx, _reachable_address(os.environ.get("MASTER_ADDR", "")))

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(self.answer)
                except OSError:
                    pass

    def probe(self) -> dict:
        """{rank: "alive" | ("stopping", [ranks it found gone]) | "gone" | "silent"} for every other rank."""
        me = self.ctx.coords.rank
        others = [r for r in range(self.ctx.world_size) if r != me]
        with concurrent.futures.ThreadPoolExecutor(min(PROBE_THREADS, max(1, len(others)))) as pool:
            return dict(zip(others, pool.map(lambda r: _ask(*self.addresses[r]), others)))


def _reachable_address(master_addr: str) -> str:
    """This host's address on the route to the rendezvous host (the other ranks reach that host, so they reach this
    one by the same network); the host name where no route is known."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master_addr or "127.0.0.1", 9))       # no packet is sent: this only picks the route
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()


def _ask(host: str, port: int, tries: int = 2):
    """A rank's answer: "gone" (refused: no process), "silent" (no connection within PROBE_S, twice: its node is down
    or cut off, or a burst of probes from every failing rank dropped one), "stuck" (connected, no answer within
    PROBE_S: the process is there but does not run, e.g. stopped), or what its listener said."""
    try:
        conn = socket.create_connection((host, port), timeout=PROBE_S)
    except ConnectionRefusedError:
        return "gone"
    except OSError:
        return _ask(host, port, tries - 1) if tries > 1 else "silent"
    data = b""
    with conn:
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except OSError:
            return "stuck"
    if data.startswith(b"S"):
        return "stopping", [int(r) for r in data[1:].split()]
    return "alive" if data == b"A" else "stuck"


_NOTE = {"silent": " (its node does not answer)"}


def lost_peer(liveness: "Liveness | None", exc: BaseException) -> str | None:
    """The paragraph for a rank that went away under this one, or None for any other exception: a pipeline
    transfer's PeerError (the communicator names its peer; with `liveness`, the ranks are asked whether the peer
    went first or stopped on another's loss), or gloo's error in a collective (`collective_failure` finds which
    rank is gone; needs this rank's `liveness`)."""
    if isinstance(exc, PeerError):
        if liveness is None or exc.peer is None:
            return str(exc)
        return str(collective_failure(liveness, exc, head=exc.head))
    if liveness is not None and is_peer_loss(exc):
        return str(collective_failure(liveness, exc))
    return None


def is_peer_loss(exc: BaseException) -> bool:
    """Whether `exc` is gloo's error about a peer's connection (not a bug, not a user error)."""
    return isinstance(exc, RuntimeError) and _names_peer_loss(str(exc))


def _names_peer_loss(text: str) -> bool:
    text = text.lower()
    return "gloo" in text and any(p in text for p in PEER_LOSS)


def _without_peer_loss(record: logging.LogRecord) -> bool:
    """A logging filter: False (drop) for a record that reports gloo's error about a lost peer."""
    return not _names_peer_loss(record.getMessage())


_REDIRECTIONS = ("/hetauto_megatron/runtime/device.py",)


def _where(exc: BaseException) -> tuple[str, str]:
    """(whose, where) of the innermost frame of Megatron's or this package's code the failed collective ran in:
    ("Megatron's", ' (get_grad_norm_fp32 in megatron/core/optimizer/clip_grads.py:132)'), ("hetauto's",
    ' (whole_batch_losses in hetauto_megatron/megatron/plan_data.py:148)'), or ("the job's", '')."""
    for f in reversed(traceback.extract_tb(exc.__traceback__)):
        path = f.filename.replace(os.sep, "/")
        if path.endswith(_REDIRECTIONS):
            continue            # the CPU redirections (device.py) call the collective for the code above them
        for package, whose in (("/hetauto_megatron/", "hetauto's"), ("/megatron/", "Megatron's")):
            if package in path:
                return whose, f" ({f.name} in {package.strip('/')}/{path.rsplit(package, 1)[1]}:{f.lineno})"
    return "the job's", ""


def collective_failure(liveness: Liveness, exc: BaseException, head: str | None = None) -> PeerError:
    """The PeerError naming the rank(s) that went away, for gloo's error `exc` in a collective (or a pipeline
    transfer's, `head` its words). Marks this rank as stopping on the loss first, with what it found, for the
    ranks that probe it later."""
    ctx = liveness.ctx
    liveness.answer = b"S"                      # (until the probe below is done: it found nothing yet)
    found = liveness.probe()
    gone = sorted(r for r, state in found.items() if state in ("gone", "silent", "stuck"))
    earlier = sorted({r for state in found.values() if isinstance(state, tuple) for r in state[1]} - {ctx.coords.rank})
    first = earlier or gone
    liveness.answer = b"S" + " ".join(map(str, first)).encode()
    if head is None:
        whose, where = _where(exc)
        head = (f"{describe_rank(ctx.plan, ctx.coords.rank)} stopped: one of {whose} collectives{where} failed "
                f"(gloo: {gloo_reason(exc)})")
    if not first:
        return PeerError(f"{head}; every other rank still answers, so one of them is stuck or a connection between "
                         "the clusters broke. See the other ranks' logs (the first 'hetauto: error:' or traceback) "
                         "for which")
    since = sorted({r for r, state in found.items() if r in gone or isinstance(state, tuple)} - set(first))
    after = f"; {_named(ctx, since)} stopped since, on the same loss" if since else ""
    # A process that accepts the probe but does not answer is there (stopped: SIGSTOP, a debugger; or hung): it
    # did not go away, its log does not say why, and it holds its devices until someone ends it.
    stuck = [r for r in first if found.get(r) == "stuck"]
    went = [r for r in first if r not in stuck]
    one = len(stuck) == 1
    stopped = (f"{_named(ctx, stuck)} did not go away but stopped answering{' too' if went else ' first'}: "
               f"{'its process is' if one else 'their processes are'} there and not running (stopped, e.g. by SIGSTOP "
               "or a debugger, or stuck)")
    if went:
        which = "that process is" if len(went) == 1 else "those processes are"
        text = (f"{head}: {_named(ctx, went, found)} went away first{after}; {which} gone or cut off. See the log of "
                f"{_named(ctx, went)} for why (a crash, the kernel's out-of-memory killer, its node going down)")
        text += f". {stopped[0].upper()}{stopped[1:]}" if stuck else ""
    else:
        text = f"{head}: {stopped}{after}"
    if stuck:
        text += (f". On the node of {_named(ctx, stuck)}, see whether {'it is' if one else 'they are'} stopped "
                 f"(state T in 'ps -o stat= -p PID') or where {'it hangs' if one else 'they hang'} ('py-spy dump "
                 f"--pid PID'), and end {'it' if one else 'them'}")
    return PeerError(text + ", then start every cluster's launch again (with --load from the last checkpoint)")


def _named(ctx, ranks: list[int], found: dict | None = None) -> str:
    """'rank 1 (cluster b, stage 1), rank 3 (...)', each with what the probe `found` adds to it (_NOTE)."""
    # (a state is a word, or ("stopping", [ranks it named]) for a rank that stopped on a loss itself: no note, and
    # not a key: its list made the lookup a TypeError, the paragraph of a survivor that probed such a rank)
    notes = {r: _NOTE.get(state, "") for r, state in (found or {}).items() if isinstance(state, str)}
    return ", ".join(describe_rank(ctx.plan, r) + notes.get(r, "") for r in ranks)


# What a stopping rank's listener answers once the rank has exited: a process of its own, given the listening
# socket, answers LINGER_S. Sleeping in the rank itself would not do: it keeps its gloo connections open while it
# sleeps, and the ranks waiting on it fail (and probe it) only once they close, i.e. when it exits.
_ANSWER_ON = """
import socket, sys, time
server = socket.socket(fileno=int(sys.argv[1]))
answer, until = sys.argv[2].encode(), time.monotonic() + float(sys.argv[3])
while time.monotonic() < until:
    server.settimeout(max(0.01, until - time.monotonic()))
    try:
        conn, _ = server.accept()
    except OSError:
        continue
    with conn:
        try:
            conn.sendall(answer)
        except OSError:
            pass
"""


def exit_for_lost_peer(text: str, liveness: "Liveness | None") -> None:
    """Print the paragraph and exit LOST_PEER_EXIT (not a user error): at once, without the clean exit's destruction
    of the groups, which would wait on the broken connections. Where this rank stopped on a loss, its listener goes
    to a small process that keeps telling the ranks that fail after it what it found, for LINGER_S."""
    import sys
    print(f"hetauto: error: {text.rstrip('.')}.", file=sys.stderr, flush=True)
    sys.stdout.flush()
    _answer_after_exit(liveness)
    os._exit(LOST_PEER_EXIT)


@contextlib.contextmanager
def naming_lost_peers(liveness: Liveness):
    """Inside it, gloo's error about a peer or a pipeline transfer's PeerError leaves as the PeerError whose text
    names the rank that went away first (`lost_peer`), without gloo's own text and traceback; where this rank
    stopped on a loss, its listener keeps answering what it found after the process ends, as `exit_for_lost_peer`
    does. For a process that reports its failure itself (the dry run's ranks: runtime/launcher.py)."""
    try:
        yield
    except RuntimeError as exc:
        text = lost_peer(liveness, exc)
        if text is None:
            raise
        _answer_after_exit(liveness)
        raise PeerError(text) from None


def _answer_after_exit(liveness: "Liveness | None") -> None:
    """Where this rank stopped on a loss, hand its listener to a small process that keeps telling the ranks that
    fail after it what it found, for LINGER_S."""
    import subprocess
    import sys
    if liveness is not None and liveness.answer.startswith(b"S"):
        fd = liveness._server.fileno()
        try:
            subprocess.Popen([sys.executable, "-c", _ANSWER_ON, str(fd), liveness.answer.decode(), str(LINGER_S)],
                             pass_fds=(fd,), start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            pass            # then the ranks that fail after this one may name it too
