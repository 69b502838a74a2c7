"""A middle cluster's uplink, shared by the two boundaries of one pipeline that cross it (pure functions).

A pipeline through clusters a -> b -> c crosses b's uplink (`uplink_gbps`, docs/inputs.md) twice: b sends the
activations on to c and the gradients back to a through the same uplink direction ("out"), and receives the
activations from a and the gradients from c through the other ("in"). Each boundary's own link is already capped
by the uplink (Inventory.link); what the cap alone misses is that the two boundaries' transfers add up on it
whenever they are on the wire at once. The simulators (plan/pipeline_shared.py for Megatron's 1F1B,
plan/deepspeed_schedule.py for DeepSpeed's engine) therefore book every such transfer on the uplink directions
it crosses as well as on its link:

- `boundary_uplinks` names, per boundary and direction, the uplink directions a transfer crosses and for how
  long it needs each (its bytes at the uplink's rate). Only clusters at two or more boundaries of the pipeline
  are listed: a cluster at one boundary has no second flow on its uplink, and its cap is already in the link's
  time.
- `Uplinks.book` starts a transfer at the earliest time at or after it is due at which every uplink direction it
  crosses has its share free: the uplink is a fluid, and a transfer holds bytes / uplink rate over the time it
  occupies its link (an uplink as fast as two links together carries both at full speed). The simulators book
  the transfers in the order they are due (data ready, link free), and each direction serves them first come,
  first served.
- `uplink_period` (the busiest direction's seconds per micro-batch) and `with_waits` (each transfer's wait
  behind the others where they need more than the whole uplink) are what the closed form
  (pipeline.estimate_1f1b) adds for it.

Several pipelines crossing one cluster at the same time (plans of several pipelines) are each priced with their
own uplink: docs/inputs.md.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import Counter


def boundary_uplinks(flows: list, uplink_rate) -> tuple | None:
    """Per boundary (None where it needs no shared uplink) a pair (forward, backward) of tuples of
    ((cluster, "out" | "in"), seconds): the uplink directions one micro-batch's activation (forward) and its
    gradient (backward, the other way) cross, and how long each transfer occupies each. `flows`: per boundary
    {(cluster, "out" | "in"): bytes} of one micro-batch step's activations leaving and entering clusters (None
    or empty inside a cluster); `uplink_rate(cluster)`: bytes/s of its uplink, or None. Only clusters that
    appear at two or more boundaries are listed. None when no boundary needs one."""
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


def uplink_period(uplinks) -> float:
    """The busiest uplink direction's seconds per micro-batch (every boundary's activation and gradient cross it
    once per micro-batch): a lower bound on a pipeline's steady-state period. 0 without shared uplinks."""
    if not uplinks:
        return 0.0
    load: dict = {}
    for entry in uplinks:
        if entry is None:
            continue
        for needs in entry:
            for key, seconds in needs:
                load[key] = load.get(key, 0.0) + seconds
    return max(load.values(), default=0.0)


def with_waits(link: list, latency: list | None, uplinks) -> list:
    """The closed form's link times with the shared uplinks' waits: where the transfers that take an uplink
    direction together need more than all of it (their shares, seconds / occupancy, add up to over 1), each may
    wait for the others' seconds on it before it starts (first come, first served), so each boundary's time
    grows by the longest such wait of its two directions. Without oversubscribed directions `link` as given."""
    if not uplinks:
        return list(link)
    occ = [x - (0.0 if latency is None else a) for x, a in zip(link, latency or [0.0] * len(link))]
    load: dict = {}
    share: dict = {}
    for l, entry in enumerate(uplinks):
        for needs in entry or ():
            for key, sec in needs:
                load[key] = load.get(key, 0.0) + sec
                share[key] = share.get(key, 0.0) + (min(1.0, sec / occ[l]) if occ[l] > 0 else 1.0)
    out = list(link)
    for l, entry in enumerate(uplinks):
        if entry:
            wait = max(sum(load[key] - sec for key, sec in needs if share[key] > 1 + 1e-9) for needs in entry)
            out[l] += wait
    return out


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
            entry = entry if any(entry) and all(sec >= 0 for needs in entry for _, sec in needs) else None
        except (AttributeError, TypeError, ValueError):
            entry = None
        out.append(entry)
    return tuple(out) if any(out) else None


class Uplinks:
    """The reservations of each uplink direction: (start, end, share) intervals, sorted by start. A transfer that
    runs for `duration` seconds and needs `seconds` of an uplink direction holds the share seconds / duration of
    it for its whole run (the uplink is a fluid: transfers on links slower than it run side by side as long as
    their shares add up to at most the whole)."""

    def __init__(self):
        self._starts: dict = {}     # key -> starts of its reservations, sorted
        self._items: dict = {}      # key -> (start, end, share) in the same order
        self._longest: dict = {}    # key -> the longest reservation (how far back one may still be running)
        self._last: dict = {}       # key -> the latest start: transfers take each direction in the order booked

    def book(self, needs, ready: float, duration: float) -> float:
        """The earliest start >= `ready`, and no earlier than any transfer booked before it on the same
        directions (the caller books in the order the transfers are ready: first come, first served), at which
        every (key, seconds) of `needs` has room for a transfer of `duration` seconds (each holding
        seconds / duration of its direction, or all of it for `seconds` if longer); reserves them and returns the
        start."""
        spans = [(key, max(duration, sec), min(1.0, sec / duration) if duration > 0 else 1.0)
                 for key, sec in needs if sec > 0]
        s = max([ready] + [self._last.get(key, ready) for key, _, _ in spans])
        moved = True
        while moved:                # each pass moves s to where one direction has room; they agree after a few
            moved = False
            for key, span, share in spans:
                t = self._fit(key, s, span, share)
                if t > s:
                    s, moved = t, True
        for key, span, share in spans:
            starts, items = self._starts.setdefault(key, []), self._items.setdefault(key, [])
            k = bisect_right(starts, s)
            starts.insert(k, s)
            items.insert(k, (s, s + span, share))
            self._longest[key] = max(self._longest.get(key, 0.0), span)
            self._last[key] = s
        return s

    def _fit(self, key, s: float, span: float, share: float) -> float:
        """The earliest t >= s at which the reservations of `key` leave `share` free all through [t, t + span)."""
        starts = self._starts.get(key)
        if not starts:
            return s
        items, back = self._items[key], self._longest[key]
        while True:
            lo, hi = bisect_right(starts, s - back), bisect_right(starts, s + span)
            running = [(max(a, s), min(b, s + span), f) for a, b, f in items[lo:hi] if b > s and a < s + span]
            if _peak(running) + share <= 1.0 + 1e-9:
                return s
            s = min(b for _, b, _ in running)     # the next time a reservation ends: the load only drops there


def _peak(intervals) -> float:
    """The largest sum of shares at any instant of (start, end, share) intervals."""
    marks = sorted([(a, f) for a, _, f in intervals] + [(b, -f) for _, b, f in intervals], key=lambda x: (x[0], x[1]))
    load = peak = 0.0
    for _, f in marks:
        load += f
        peak = max(peak, load)
    return peak
