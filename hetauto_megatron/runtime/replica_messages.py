"""The messages of the holders' exchange (replica_sync.py): pure, no torch and no processes.

Every rank derives the same moves (shard_regions.sync_moves: which rectangles of which parameter go from which
rank to which, in which phase); `messages_of` groups one rank's moves into one message per peer and direction,
each a list of pieces (where a rectangle sits in the rank's local table and in the flat message) in move order,
the order the other end derives from the same moves. Apart from replica_sync.py because it is the wire format
both ends must agree on, testable without processes; replica_sync.py only copies elements into and out of it.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .shard_regions import Move, to_local


@dataclass(frozen=True)
class Piece:
    """One rectangle of a message: rows x cols of the local table of parameter `name` (`rect` in local
    coordinates: row_start, row_stop, col_start, col_stop), at [at, at + numel) of the flat message; `move` is
    the move it belongs to."""
    name: str
    rect: tuple
    at: int
    move: Move

    @property
    def rows(self) -> slice:
        return slice(self.rect[0], self.rect[1])

    @property
    def cols(self) -> slice:
        return slice(self.rect[2], self.rect[3])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rect[1] - self.rect[0], self.rect[3] - self.rect[2])

    @property
    def numel(self) -> int:
        return (self.rect[1] - self.rect[0]) * (self.rect[3] - self.rect[2])


@dataclass(frozen=True)
class Messages:
    """One exchange of a rank: `sends` and `receives`, each [(peer, elements, pieces)], one message per peer,
    peers in rank order."""
    sends: tuple
    receives: tuple


def messages_of(moves, phases: tuple, me: int, layouts: dict) -> Messages:
    """Rank `me`'s messages of the moves of these phases: one per peer and direction, its pieces in move order
    (the order the other end derives from the same moves), placed in the local tables by `layouts`."""
    out, inn = defaultdict(list), defaultdict(list)
    for m in moves:
        if m.phase in phases:
            (out[m.dst] if m.src == me else inn[m.src]).append(m)

    def message(peer, ms):
        at, pieces = 0, []
        for m in ms:
            for rect in m.rects:
                p = Piece(m.name, to_local(layouts[m.name], rect), at, m)
                pieces.append(p)
                at += p.numel
        return peer, at, tuple(pieces)

    return Messages(tuple(message(peer, ms) for peer, ms in sorted(out.items())),
                    tuple(message(peer, ms) for peer, ms in sorted(inn.items())))
