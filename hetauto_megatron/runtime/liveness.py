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
import os
import re
import socket
import threading
import traceback

from .groups import describe_rank
from .peers import PeerError

PROBE_S = 2.0                    # a listener answers at once: longer is a node down or unreachable
PROBE_THREADS = 64
# A rank stopping on the loss keeps answering "S" and what it found this long before it exits: the ranks that
# waited on it fail only once it has exited (gloo's connections close with the process), and they probe then;
# without the wait they would find it gone and name it beside the rank that went away first.
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
    """A rank's answer: "gone" (refused: no process), "silent" (no connection or no answer within PROBE_S,
    twice: a burst of probes from every failing rank may drop one), or what its listener said."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_S) as conn:
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
    except ConnectionRefusedError:
        return "gone"
    except OSError:
        return _ask(host, port, tries - 1) if tries > 1 else "silent"
    if data.startswith(b"S"):
        return "stopping", [int(r) for r in data[1:].split()]
    return "alive" if data == b"A" else "silent"


def lost_peer(liveness: "Liveness | None", exc: BaseException) -> str | None:
    """The paragraph for a rank that went away under this one, or None for any other exception: a pipeline
    transfer's PeerError (the communicator names the peer), or gloo's error in one of Megatron's own collectives
    (`collective_failure` finds which rank is gone; needs this rank's `liveness`)."""
    if isinstance(exc, PeerError):
        return str(exc)
    if liveness is not None and is_peer_loss(exc):
        return str(collective_failure(liveness, exc))
    return None


def is_peer_loss(exc: BaseException) -> bool:
    """Whether `exc` is gloo's error about a peer's connection (not a bug, not a user error)."""
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and "gloo" in text and any(p in text for p in PEER_LOSS)


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


def collective_failure(liveness: Liveness, exc: BaseException) -> PeerError:
    """The PeerError naming the rank(s) that went away, for gloo's error `exc` in a collective of Megatron's. Marks
    this rank as stopping on the loss first, with what it found, for the ranks that probe it later."""
    ctx = liveness.ctx
    liveness.answer = b"S"                      # (until the probe below is done: it found nothing yet)
    found = liveness.probe()
    gone = sorted(r for r, state in found.items() if state in ("gone", "silent"))
    earlier = sorted({r for state in found.values() if isinstance(state, tuple) for r in state[1]})
    first = earlier or gone
    liveness.answer = b"S" + " ".join(map(str, first)).encode()
    # gloo's first line, without its source position ("[.../pair.cc:537] ") and its boilerplate advice
    reason = re.sub(r"^\[[^\]]*\] ", "", str(exc).splitlines()[0]).split(". This is typically")[0][:300]
    me = describe_rank(ctx.plan, ctx.coords.rank)
    whose, where = _where(exc)
    head = f"{me} stopped: one of {whose} collectives across the clusters{where} failed (gloo: {reason})"
    if not first:
        return PeerError(f"{head}; every other rank still answers, so one of them is stuck or a connection between "
                         "the clusters broke; that process is gone or stuck. See the other ranks' logs (the first "
                         "'hetauto: error:' or traceback) for which")
    names = ", ".join(describe_rank(ctx.plan, r) + (" (its node does not answer)" if found.get(r) == "silent" else "")
                      for r in first)
    since = [r for r in gone if r not in first]
    after = (f"; {', '.join(describe_rank(ctx.plan, r) for r in since)} stopped since, on the same loss"
             if since else "")
    which = "that process is" if len(first) == 1 else "those processes are"
    return PeerError(f"{head}: {names} went away{after}; {which} gone or stuck. See the log of {names} for why "
                     "(a crash, the kernel's out-of-memory killer, its node going down), then start every cluster's "
                     "launch again (with --load from the last checkpoint)")


def exit_for_lost_peer(text: str, liveness: "Liveness | None") -> None:
    """Print the paragraph and exit 1 (not a user error): at once, without the clean exit's destruction of the
    groups, which would wait on the broken connections; after LINGER_S where this rank's listener tells the ranks
    that fail after it what it found."""
    import sys
    import time
    print(f"hetauto: error: {text.rstrip('.')}.", file=sys.stderr, flush=True)
    sys.stdout.flush()
    if liveness is not None and liveness.answer.startswith(b"S"):
        time.sleep(LINGER_S)
    os._exit(1)
