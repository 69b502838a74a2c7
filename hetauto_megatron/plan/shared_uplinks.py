"""A middle cluster's uplink, shared by the two boundaries of one pipeline that cross it (pure functions).

A pipeline through clusters a -> b -> c crosses b's uplink (`uplink_gbps`, docs/inputs.md) twice: b sends the
activations on to c and the gradients back to a through the same uplink direction ("out"), and receives the
activations from a and the gradients from c through the other ("in"). Each boundary's own link is already capped
by the uplink (Inventory.link); what the cap alone misses is that the two boundaries' transfers add up on it
whenever they are on the wire at once.

- `boundary_uplinks` names, per boundary and direction, the uplink directions a transfer crosses and its
  seconds on each (its bytes at the uplink's rate). Only clusters at two or more boundaries of the pipeline are
  listed: a cluster at one boundary has no second flow on its uplink, and its cap is already in the link's time.
- `contended` keeps the uplink directions that can be short: those whose transfers, each moving at its link's
  speed, would together need more than all of the uplink (their seconds over their link occupancies add up to
  more than 1). On the others every transfer can run at its link's speed whatever the rest do, and nothing
  waits for the uplink.
- On a contended direction the simulators (plan/pipeline_shared.py for Megatron's 1F1B, plan/deepspeed_schedule.py
  for DeepSpeed's engine) give the uplink to one transfer at a time, for its seconds on it, in the order the
  transfers are due (data ready, link free): `Uplinks.book`. That carries the uplink's bytes at its full rate, as
  flows sharing it would together; a transfer's own timing is approximate (it waits for the one before it where
  sharing would slow both).
- `uplink_period` (the busiest contended direction's seconds per micro-batch) and `with_waits` (each transfer's
  wait for the others' seconds on a contended direction) are what the closed form (pipeline.estimate_1f1b) adds.

Several pipelines crossing one cluster at the same time (plans of several pipelines) are each priced with their
own uplink: docs/inputs.md.
"""
from __future__ import annotations

import math
from collections import Counter


def boundary_uplinks(flows: list, uplink_rate) -> tuple | None:
    """Per boundary (None where it needs no shared uplink) a pair (forward, backward) of tuples of
    ((cluster, "out" | "in"), seconds): the uplink directions one micro-batch's activation (forward) and its
    gradient (backward, the other way) cross, and its seconds on each (its bytes at the uplink's rate). `flows`:
    per boundary {(cluster, "out" | "in"): bytes} of one micro-batch step's activations leaving and entering
    clusters (None or empty inside a cluster); `uplink_rate(cluster)`: bytes/s of its uplink, or None. Only
    clusters that appear at two or more boundaries are listed. None when no boundary needs one."""
    used = Counter(c for f in flows if f for c in {c for c, _ in f})
    swap = {"out": "in", "in": "out"}
    out, any_need = [], False
    for f in flows:
        fwd, bwd = [], []
        for (c, d), nbytes in sorted((f or {}).items()):
            rate = uplink_rate(c) if used[c] > 1 else None
            if rate:
                fwd.append(((c, d), nbytes / rate))
                bwd.append(((c, swap[d]), nbytes / rate))
        out.append((tuple(fwd), tuple(bwd)) if fwd else None)
        any_need = any_need or bool(fwd)
    return tuple(out) if any_need else None


def contended(uplinks, link: list, latency: list | None = None) -> tuple | None:
    """`uplinks` with only the directions whose transfers can need more than the whole uplink together: their
    seconds over their link occupancies (per boundary its transfer time `link` less its `latency`; a transfer of
    no occupancy counts as needing all of it) add up to more than 1. None if there are none."""
    if not uplinks:
        return None
    occupancy = [x - a for x, a in zip(link, latency)] if latency is not None else link
    share: dict = {}
    for l, entry in enumerate(uplinks):
        for needs in entry or ():
            for key, sec in needs:
                if sec > 0:
                    share[key] = share.get(key, 0.0) + (min(1.0, sec / occupancy[l]) if occupancy[l] > 0 else 1.0)
    busy = {key for key, total in share.items() if total > 1 + 1e-9}
    out = []
    for entry in uplinks:
        kept = tuple(tuple((key, sec) for key, sec in needs if key in busy and sec > 0) for needs in entry or ((), ()))
        out.append(kept if any(kept) else None)
    return tuple(out) if any(out) else None


def uplink_period(uplinks) -> float:
    """The busiest uplink direction's seconds per micro-batch (every boundary's activation and gradient cross it
    once per micro-batch): a lower bound on a pipeline's steady-state period. 0 without uplinks."""
    if not uplinks:
        return 0.0
    return max(_loads(uplinks).values(), default=0.0)


def with_waits(link: list, uplinks) -> list:
    """The closed form's link times (`link`, per boundary) with the uplinks' waits (`uplinks`: the contended ones):
    a transfer may wait for every other transfer's seconds on each uplink direction it crosses before it starts,
    so each boundary's time grows by the longest such wait of its two directions."""
    if not uplinks:
        return list(link)
    load = _loads(uplinks)
    out = list(link)
    for l, entry in enumerate(uplinks):
        if entry:
            out[l] += max(sum(load[key] - sec for key, sec in needs) for needs in entry)
    return out


def _loads(uplinks) -> dict:
    """Seconds per micro-batch of each uplink direction (every transfer crossing it once)."""
    load: dict = {}
    for entry in uplinks:
        for needs in entry or ():
            for key, sec in needs:
                load[key] = load.get(key, 0.0) + sec
    return load


def without_links(uplinks, links) -> tuple | None:
    """`uplinks` with the boundaries whose link time is 0 left out (a link priced away carries nothing)."""
    if not uplinks:
        return None
    out = tuple(None if x == 0 else u for u, x in zip(uplinks, links))
    return out if any(out) else None


def to_row(entry) -> dict:
    """A boundary's entry as its stage row stores it (the estimate's `send_next_uplinks`, JSON): per direction
    [cluster, "out" | "in", seconds] lists; {} where it crosses no shared uplink."""
    if not entry:
        return {}
    return {"send_next_uplinks": {way: [[c, d, round(sec, 9)] for (c, d), sec in needs]
                                  for way, needs in zip(("forward", "backward"), entry)}}


def from_rows(stages: list) -> tuple | None:
    """The boundaries' entries back from stage rows (`to_row`), for re-simulating a stored estimate; an entry
    that is not of that form (a hand-edited file) is read as no shared uplink."""
    out = []
    for s in stages[:-1]:
        row = s.get("send_next_uplinks") if isinstance(s, dict) else None
        try:
            entry = tuple(tuple(((str(c), str(d)), float(sec)) for c, d, sec in row.get(way, []))
                          for way in ("forward", "backward"))
            entry = entry if any(entry) and all(0 <= sec < math.inf for needs in entry for _, sec in needs) else None
        except (AttributeError, TypeError, ValueError):
            entry = None
        out.append(entry)
    return tuple(out) if any(out) else None


class Uplinks:
    """The contended uplink directions, each taken by one transfer at a time, first come, first served."""

    def __init__(self):
        self._free: dict = {}       # key -> when the direction is next free

    def book(self, needs, ready: float) -> float:
        """The earliest start >= `ready` at which every direction of `needs` ((key, seconds), the transfer's
        contended ones) is free; holds each for its seconds from then and returns the start. The caller books the
        transfers in the order they are due."""
        s = max([ready] + [self._free.get(key, ready) for key, _ in needs])
        for key, sec in needs:
            self._free[key] = s + sec
        return s
