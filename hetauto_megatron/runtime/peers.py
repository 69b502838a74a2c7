"""Waiting for transfers with a peer: every wait has a timeout, and a peer that is gone or silent raises
`PeerError` naming both ranks (`ranks.describe_rank`: pipeline when there are several, cluster, stage).

The pipeline communicator (communicator.py) and the holders' exchange (replica_sync.py) both wait here.
"""
from __future__ import annotations

import datetime
import re

from .ranks import describe_rank


class PeerError(RuntimeError):
    """A peer did not answer (gone, or silent past the timeout). `peer`: that rank, where one transfer's peer is
    meant; `head`: the message without its closing words (runtime/liveness.py asks the ranks who went first)."""

    def __init__(self, message: str, peer: int | None = None, head: str | None = None):
        super().__init__(message)
        self.peer, self.head = peer, head


def peer_error(ctx, peer: int, what: str, how: str) -> PeerError:
    """'rank 0 (cluster a, stage 0) could not <what> with rank 2 (cluster b, stage 1): <how>; ...'."""
    head = f"{describe_rank(ctx.plan, ctx.coords.rank)} could not {what} with {describe_rank(ctx.plan, peer)}: {how}"
    return PeerError(f"{head}; that process is gone or stuck", peer=peer, head=head)


def gloo_reason(exc: BaseException) -> str:
    """gloo's first line, which says what happened ("Connection closed by peer ...", "Timed out waiting 3000ms
    ..."), without its source position ("[.../gloo/transport/tcp/pair.cc:537] ") and its boilerplate advice."""
    return re.sub(r"^\[[^\]]*\] ", "", str(exc).splitlines()[0]).split(". This is typically")[0][:300]


def failure(ctx, exc: RuntimeError, peer: int, what: str) -> PeerError:
    """The PeerError for gloo's exception about a peer (posting on a closed connection, or a failed wait)."""
    return peer_error(ctx, peer, what, f"failed (gloo: {gloo_reason(exc)})")


def wait_all(works, ctx, timeout: datetime.timedelta) -> None:
    """Wait for every (work, peer, what) with `timeout`; the first peer that fails or stays silent raises."""
    for work, peer, what in works:
        try:
            ok = work.wait(timeout)
        except RuntimeError as exc:
            raise failure(ctx, exc, peer, what) from None
        if ok is False:
            raise peer_error(ctx, peer, what, f"timed out after {timeout.total_seconds():.0f}s")
