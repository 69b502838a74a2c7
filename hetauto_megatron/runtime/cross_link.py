"""One direction of a cross-cluster pipeline boundary, as one rank sees it: blocking or overlapped transfers,
optional link emulation, and the measured time the rank's compute waited on the link.

The plan decides each cross-cluster boundary's schedule (plan/pipeline.py prices it the same way):
- blocking:   a send is posted and waited for before the schedule goes on (Megatron's behaviour);
- overlapped: a send is handed to the communication thread and completed later (host_staging.py: the
              device-to-host copy on a copy stream, the gloo send posted by the thread as soon as the bytes are
              on the host, gloo moving them on its own threads while the stage computes); receives are posted
              ahead, up to the boundary's depth + 1 messages (the gradients' from the stage's first activation
              sent across, as gloo starts a transfer only once its receive is posted), so a stage waits only
              when the data it needs has not arrived. Sends in flight are completed at the next call and at the end of the step, every
              wait with the communicator's timeout.

Each message carries the time its sender posted it (a one-element tensor beside the blocks), so both ends can
run the same link emulation (`LinkEmulator`: the link direction is a queue at the inventory's bandwidth plus
its latency, scaled for a CPU run) and the communicator can tell waiting for the link from waiting for the
sender's compute: it counts as exposed only the time a message was on its way (sent, queued or on the wire).
gloo moves a message only once its receive is posted (rendezvous); a blocking link's receive is posted with its
call, which Megatron makes after the previous one returned where it receives alone (warm-up, cool-down). So
under emulation the receiver of a blocking link sends its post time back to each sender, and both ends start the
emulated transfer at the later of the send and the receive (plan/pipeline.py prices it so).
"""
from __future__ import annotations

import collections
import time

_WINDOW = 1024            # messages numbered modulo this in tags (far more than are ever in flight)
_BLOCKS = 1023            # blocks per message at most; block slot _BLOCKS carries the send time
_GRAD = 1 << 30           # gradient tags above every activation tag
_POSTED = 1 << 29         # a receiver's post time sent back to the sender (emulated blocking links)


def tag(grad: bool, message: int, block: int) -> int:
    return (_GRAD if grad else 0) + (message % _WINDOW) * (_BLOCKS + 1) + block


def stamp_tag(grad: bool, message: int) -> int:
    """The tag of a message's send time (one per sending-receiving pair)."""
    return tag(grad, message, _BLOCKS)


def posted_tag(grad: bool, message: int) -> int:
    """The tag of a receiver's post time for a message, sent back to its sender (emulated blocking links)."""
    return _POSTED + stamp_tag(grad, message)


def now() -> float:
    return time.monotonic()     # one clock for every process of a machine (CLOCK_MONOTONIC)


class LinkEmulator:
    """A link direction as a queue: a transfer of the boundary's bytes occupies it for bytes / bandwidth after the
    previous one, and lands `latency` later. Both ends compute the same arrival from the same send times."""

    def __init__(self, bytes_per_s: float, latency_s: float):
        self.bytes_per_s, self.latency_s = bytes_per_s, latency_s
        self.free = 0.0

    def arrival(self, sent_at: float, nbytes: float) -> float:
        start = max(sent_at, self.free)
        self.free = start + nbytes / self.bytes_per_s
        return self.free + self.latency_s


def covered(lo: float, hi: float, intervals) -> float:
    """Length of [lo, hi] covered by the union of `intervals`: of a call's wait, the time some message was on its
    way (what counts as exposed)."""
    total, reach = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            total += b - a
            reach = b
    return total


def sleep_until(t: float) -> None:
    while True:
        left = t - now()
        if left <= 0:
            return
        time.sleep(left)


class CrossLink:
    """The state of one direction (activations or gradients) of one cross-cluster boundary for this rank."""

    def __init__(self, *, overlapped: bool, depth: int, emulator: LinkEmulator | None, boundary_bytes: float):
        self.overlapped, self.depth = overlapped, depth
        self.emulator, self.boundary_bytes = emulator, boundary_bytes
        self.sent = 0                              # messages sent (numbering for tags)
        self.posted = 0                            # receives posted this step
        self.limit = None                          # messages to receive this step (None: not told, one at a time)
        self.received = 0                          # messages received (numbering for tags)
        self.ahead: collections.deque = collections.deque()   # posted receives: (message, posted state)
        self.pending: list = []                    # overlapped sends in flight: (future, meter handles or None)
        self.exposed_s = 0.0                       # waits for overlapped sends (back-pressure, end of step)

    # ---- sending ---------------------------------------------------------------------------------------
    def send(self, post_all, submit, finish, held=None):
        """post_all(message number) -> (works, send time, host buffers, posted): on the communication thread, waits
        until the message's bytes are on the host, then posts it (its send time to every receiving peer, then the
        blocks); posted: None, or for an emulated blocking link a function that waits for the receivers' post
        times and returns the latest. submit(job) runs a job on that thread (host_staging.HostStaging.submit)
        and returns its future;
        finish(future) waits for the posted sends (raising on a dead peer) and frees the host buffers.
        Overlapped: returns None (completed later); `held()` (None: nothing to call) returns the meter's
        handles on what the send keeps alive, dropped with it. Blocking: returns the future; its result (works,
        send time, emulated arrival or None, host buffers; the arrival a function to call once the call's
        receives are posted where the link is emulated) is waited for by the caller together with the call's
        receives
        (Megatron pairs each send with the neighbour's receive in one call; waiting for the send alone first
        would deadlock)."""
        j, self.sent = self.sent, self.sent + 1

        def job():
            works, sent_at, hosts, posted = post_all(j)
            if posted is not None:
                # a blocking link's transfer starts once its receive is posted too; the caller asks once its own
                # receives are posted (asking here, before them, would deadlock two paired calls)
                return works, sent_at, lambda: self.emulator.arrival(max(sent_at, posted()), self.boundary_bytes), \
                    hosts
            arrive = self.emulator.arrival(sent_at, self.boundary_bytes) if self.emulator else None
            return works, sent_at, arrive, hosts

        fut = submit(job)
        if self.overlapped:
            # back-pressure: with d + 2 in flight the oldest is waited for, after the new one is posted. gloo
            # reports a send complete only once it is waited for (is_completed() stays False until wait()), so
            # without it a link always holds its last d + 2 sends (plan/pipeline_memory.py side_buffers prices them on
            # CPU). The new send's tensors count as held from here: until the call returns they are the stage's
            # output or input gradient, alive anyway
            self.complete_sends(finish, block=len(self.pending) >= self.depth + 2)
            self.pending.append((fut, held() if held is not None else None))
            return None
        return fut

    def complete_sends(self, finish, block: bool = False) -> None:
        """Drop the sends that finished; with block, wait for the oldest (back-pressure: depth + 2 in flight)."""
        keep = []
        for i, (fut, held) in enumerate(self.pending):
            if (block and i == 0) or (fut.done() and all(w[0].is_completed() for w in fut.result()[0])):
                t0 = now()
                finish(fut)
                self.exposed_s += now() - t0
            else:
                keep.append((fut, held))
        self.pending = keep

    def flush(self, finish) -> None:
        t0 = now()
        for fut, _ in self.pending:
            finish(fut)
        self.pending = []
        self.exposed_s += now() - t0

    # ---- receiving -------------------------------------------------------------------------------------
    def begin_step(self, num_micro_batches: int | None) -> None:
        self.posted = 0
        self.limit = num_micro_batches

    def post_ahead(self, post_message) -> None:
        """An overlapped link told its step's messages: keep depth + 1 receives posted, no more than the step has
        left. post_message: as for `receive`. The communicator calls it from the send path too
        (communicator.py `_gradients_ahead`), so that the gradients' receives are posted before the first one
        is needed."""
        if not self.overlapped or self.limit is None:
            return
        while len(self.ahead) < self.depth + 1 and self.posted < self.limit:
            self._post_next(post_message)

    def _post_next(self, post_message) -> None:
        j, self.received = self.received, self.received + 1
        self.ahead.append(post_message(j))
        self.posted += 1

    def receive(self, post_message, wait):
        """post_message(message number, posted at or None) -> (works, send-time tensors, payload): the receives
        of one message (the send time from each sending peer, then the blocks; given the time it is posted at,
        that time is also sent back to each sending peer). Returns (payload, (send time, arrival)) once the
        message has arrived."""
        posted = None
        if not self.ahead:          # a blocking link (or one not told its step's messages) posts it now
            posted = now() if self.emulator and not self.overlapped else None
            self._post_next(lambda j: post_message(j, posted))
        self.post_ahead(lambda j: post_message(j, None))
        works, stamps, payload = self.ahead.popleft()
        t0 = now()
        wait(works)
        sent_at = max(float(t.item()) for t in stamps)
        if self.emulator:
            start = sent_at if posted is None else max(sent_at, posted)    # rendezvous (module docstring)
            sleep_until(self.emulator.arrival(start, self.boundary_bytes))
        t1 = now()
        self.post_ahead(post_message)      # keep depth + 1 receives posted
        return payload, (sent_at, t1)


class ExchangeEmulation:
    """The holders' gradient exchange (replica_sync.py) over emulated links, as plan/tail_costs.py's
    holders_sync_time prices it: in each phase (0: pair and gather, 1: scatter) every rank's messages between
    two clusters add up on that link direction, one transfer at the inventory's bandwidth (or, for few rank pairs,
    at their number times the link's per-connection rate, flow_gbps) plus its latency,
    and a cluster's bytes out (in) over all its links also cross its uplink where the inventory gives one; all
    of it times `scale`. A rank with such messages holds, once its own messages have completed (every partner
    has then started the phase), for the longest of the resources they cross: the phase's emulated length.
    The real transfer's time comes on top (small next to a scaled link)."""

    def __init__(self, scale: float, inventory, moves, cluster_of: dict):
        self.scale, self.inventory, self.cluster_of = scale, inventory, cluster_of
        self.elements: list[dict] = [{}, {}]      # per phase: resource -> elements of every rank's messages
        self.pairs: list[dict] = [{}, {}]         # per phase: link -> its (sending, receiving) rank pairs
        for m in moves:
            a, b = cluster_of[m.src], cluster_of[m.dst]
            if a != b:
                k = 1 if m.phase == "scatter" else 0
                phase = self.elements[k]
                for res in (("link", a, b), ("uplink", a, "out"), ("uplink", b, "in")):
                    phase[res] = phase.get(res, 0) + m.numel
                self.pairs[k].setdefault(("link", a, b), set()).add((m.src, m.dst))

    def seconds(self, phase: int, me: int, peers_out, peers_in, itemsize: int) -> float:
        """The emulated length of this rank's part of `phase` (0 when none of its messages leaves its cluster)."""
        from ..plan.link_costs import link_between
        mine = self.cluster_of[me]
        pairs = {(mine, self.cluster_of[p]) for p in peers_out} | {(self.cluster_of[p], mine) for p in peers_in}
        elements, longest = self.elements[phase], 0.0
        for a, b in pairs:
            if a == b:
                continue
            # (clusters the inventory does not link: the route the planner prices, its slowest link)
            link = link_between(self.inventory, a, b)
            # one connection per rank pair: the link's per-connection rate (flow_gbps) caps what few pairs move
            flows = len(self.pairs[phase][("link", a, b)])
            longest = max(longest, link.transfer_time(elements[("link", a, b)] * itemsize, flows))
            for cluster, way in ((a, "out"), (b, "in")):
                up = self.inventory.cluster(cluster).uplink_bytes_per_s
                if up:
                    longest = max(longest, elements[("uplink", cluster, way)] * itemsize / up)
        return longest * self.scale
