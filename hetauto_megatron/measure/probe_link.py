"""Measure a link between two hosts through torch.distributed gloo: the path pipeline activations take between
clusters (host tensors sent point to point on a gloo group).

One process per side joins a two-rank gloo group over TCP (rank 0 listens at --master). Latency: half the
median round trip of a 4-byte ping-pong. Bandwidth: rank 0 sends a message of each size, rank 1 answers with
a 4-byte acknowledgement; the time minus the fastest ping's half gives the one-way rate, and the link's bandwidth
is the best rate over the largest messages (small ones are latency-bound; a size that took no longer than a ping
gives none). The two sides check first that they were started with the same options. Every wait has a timeout.

That is one connection, as one rank pair of a pipeline boundary uses (one gloo connection per pair). With
`connections` > 1 the largest messages are also sent on that many connections at once (one gloo group each: its
own TCP connection), the way a boundary's rank pairs send together: the link entry then gives their total as
`bandwidth_gbps` and the single connection's rate as `flow_gbps` (docs/inputs.md). On a long-haul path the two
differ by far (one TCP stream is limited by its window over the round trip).

The result is an inventory `links:` entry (Gbit/s and milliseconds, the inventory's units).
"""
from __future__ import annotations

import datetime
import statistics
import sys
import time
from dataclasses import dataclass

from ..errors import InputError

DEFAULT_SIZES = tuple(1 << p for p in range(10, 27, 2))   # 1 KiB .. 64 MiB
# The smallest message the probe sends (the first of its sizes): a --max-size-mib below it would probe none.
MIN_SIZE_BYTES = 1 << 10
MIN_SIZE_MIB = MIN_SIZE_BYTES / (1 << 20)
# The largest message --max-size-mib may ask for: each connection holds one such buffer on both hosts.
MAX_SIZE_MIB = 1024
MAX_ITERS = 10_000        # repetitions per message size: a minute of the largest messages on a fast link is ~100


def message_sizes(max_bytes: float) -> tuple[int, ...]:
    """The probe's message sizes: powers of 4 from 1 KiB up to `max_bytes` (at least the 1 KiB one)."""
    sizes, n = [], MIN_SIZE_BYTES
    while n <= max_bytes:
        sizes.append(n)
        n *= 4
    return tuple(sizes) or (MIN_SIZE_BYTES,)


@dataclass(frozen=True)
class LinkMeasurement:
    latency_s: float
    bandwidth_bytes_per_s: float
    per_size: tuple      # (bytes, seconds one way, bytes/s)
    connections: int = 1
    together_bytes_per_s: float | None = None   # all `connections` at once (None: one connection measured)

    @property
    def bandwidth_gbps(self) -> float:
        return self.bandwidth_bytes_per_s * 8 / 1e9

    def link_entry(self, a: str, b: str) -> dict:
        if self.together_bytes_per_s is None:
            return {"between": [a, b], "bandwidth_gbps": round(self.bandwidth_gbps, 3),
                    "latency_ms": round(self.latency_s * 1e3, 4)}
        total = max(self.together_bytes_per_s, self.bandwidth_bytes_per_s) * 8 / 1e9
        return {"between": [a, b], "bandwidth_gbps": round(total, 3), "latency_ms": round(self.latency_s * 1e3, 4),
                "flow_gbps": round(min(self.bandwidth_gbps, total), 3)}

    def to_dict(self, a: str, b: str) -> dict:
        # (the N connections' own rate too, as the text prints it; the link entry takes the larger of it and one's)
        together = ({"together_gbps": round(self.together_bytes_per_s * 8 / 1e9, 3)}
                    if self.together_bytes_per_s is not None else {})
        return {"link": self.link_entry(a, b), "latency_us": round(self.latency_s * 1e6, 2),
                "connections": self.connections, **together,
                "per_size": [{"bytes": n, "seconds": round(t, 9), "gbps": round(r * 8 / 1e9, 3)}
                             for n, t, r in self.per_size]}


def link_yaml(m: LinkMeasurement, a: str, b: str) -> str:
    e = m.link_entry(a, b)
    flow = f"    flow_gbps: {e['flow_gbps']}\n" if "flow_gbps" in e else ""
    return (f"links:\n  - between: [{a}, {b}]\n    bandwidth_gbps: {e['bandwidth_gbps']}\n"
            f"    latency_ms: {e['latency_ms']}\n{flow}")


def parse_master(master: str) -> tuple[str, int]:
    host, sep, port = master.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise InputError(f"'{master}' is not HOST:PORT", field="--master",
                         fix="give the rank-0 side's address reachable from the other side, e.g. 10.0.0.5:29600")
    return host, int(port)


def _check_resolves(rank: int, host: str, port: int, timeout_s: float) -> None:
    """A --master name that does not resolve: rank 0 listens there, so it never will (refused at once); rank 1 may
    start before rank 0's name is known, so it is told at once and keeps trying until --timeout (it waited the whole
    timeout without a word)."""
    import socket
    try:
        socket.getaddrinfo(host, port)
    except socket.gaierror as exc:
        if rank == 0:
            raise InputError(f"'{host}' does not resolve on this host ({exc.strerror}), and rank 0 listens there",
                             field="--master", fix="give this host's address (or a name it resolves) and a free "
                                                   "port, e.g. 10.0.0.5:29600, and the same --master to rank 1") from None
        print(f"hetauto probe-link: '{host}' does not resolve ({exc.strerror}); retrying until --timeout "
              f"({timeout_s:g} s)", file=sys.stderr, flush=True)


def _stderr_progress(started: float):
    """A line on stderr per step of the probe (the default one takes up to half a minute on a busy host), timed
    from `started`: stdout keeps the result alone (--json)."""
    def say(text: str) -> None:
        print(f"hetauto probe-link: {text} ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    return say


def run_side(rank: int, master: str, *, sizes=DEFAULT_SIZES, iters: int = 5, ping_iters: int = 50,
             timeout_s: float = 60.0, connections: int = 1, progress: bool = False) -> LinkMeasurement | None:
    """Run one side of the probe; rank 0 returns the measurement, rank 1 returns None. With `progress`, rank 0
    (the side that reports the result) says each step on stderr."""
    if rank not in (0, 1):
        raise InputError(f"must be 0 or 1, got {rank}", field="--rank",
                         fix="start '--rank 0' on one host and '--rank 1' on the other")
    host, port = parse_master(master)
    _check_resolves(rank, host, port, timeout_s)
    say = _stderr_progress(time.perf_counter()) if progress and rank == 0 else None
    if say:     # (before torch's import: seconds on a busy host)
        print(f"hetauto probe-link: waiting for rank 1 at {master} (up to --timeout, {timeout_s:g} s)",
              file=sys.stderr, flush=True)
    import torch
    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank, world_size=2,
                                timeout=timeout)
    except Exception as exc:   # rendezvous refused / timed out: the user's network or address
        raise InputError(f"could not reach the other side at {master} within {timeout_s:g} s ({exc})",
                         field="--master", fix="start both sides with the same --master (rank 0's address), "
                                               "check the port is open, or raise --timeout") from None
    # this process now holds gloo's group and the rendezvous store: it ends as a Megatron rank does (the command
    # line's end, cli.py; --local's second process, _local_peer), not through interpreter finalisation, in which
    # a gloo thread can abort a probe that succeeded (SIGABRT, pytorch#190489)
    from ..runtime.clean_exit import take_charge_of_exit
    take_charge_of_exit(timeout_s)
    try:
        _check_same_options(torch, dist, rank, (len(sizes), max(sizes), iters, ping_iters, connections))
        try:
            return _measure(torch, dist, rank, sizes, iters, ping_iters, connections, timeout, say)
        except RuntimeError as exc:     # gloo: the other side stopped or timed out mid-probe
            raise InputError(f"the other side stopped answering during the probe ({str(exc).splitlines()[0][:160]})",
                             field="--master", fix="run both sides to the end with the same options, or raise "
                                                   "--timeout on a slow link") from None
    finally:
        dist.destroy_process_group()


# The options both sides must share (each side sends what the other expects): message count and largest size,
# iterations, pings, connections.
_OPTION_NAMES = ("message sizes", "largest message (bytes)", "--iters", "ping-pongs", "--connections")
_OPTION_FLAGS = ("--max-size-mib", "--max-size-mib", "--iters", "--iters", "--connections")


def _check_same_options(torch, dist, rank: int, options: tuple) -> None:
    """Both sides exchange their options before any message: with different ones each would wait for messages of
    other sizes or counts (a gloo size-mismatch abort, or a hang until --timeout) instead of one paragraph."""
    mine = torch.tensor(options, dtype=torch.int64)
    both = [torch.zeros_like(mine) for _ in range(2)]
    dist.all_gather(both, mine)
    differ = [k for k in range(len(options)) if both[0][k] != both[1][k]]
    if differ:
        raise InputError("the two sides were started with different options (" + "; ".join(
            f"{_OPTION_NAMES[k]}: rank 0 {int(both[0][k])}, rank 1 {int(both[1][k])}" for k in differ) + ")",
                         field=_OPTION_FLAGS[differ[0]], fix="start both sides with the same --max-size-mib, --iters and "
                                                     "--connections")


def _measure(torch, dist, rank, sizes, iters, ping_iters, connections=1, timeout=None, say=None):
    peer = 1 - rank
    small = torch.zeros(1, dtype=torch.float32)
    # Latency: ping-pong of one float.
    def round_trip(out, back) -> float:
        """Rank 0 sends `out` and waits for `back`; rank 1 mirrors it. Returns the seconds it took."""
        a = time.perf_counter()
        if rank == 0:
            dist.send(out, peer)
            dist.recv(back, peer)
        else:
            dist.recv(out, peer)
            dist.send(back, peer)
        return time.perf_counter() - a

    rtts = [round_trip(small, small) for _ in range(ping_iters + 3)][3:]   # first exchanges set up the connection
    latency = statistics.median(rtts) / 2
    # What a message's time loses to latency: the fastest ping's half, not the median's. On a busy host the median
    # ping can take as long as a large message (2 ms against 45 us measured), and subtracting it left no time and
    # an absurd rate (33,554,432 Gbit/s in the link entry).
    floor = min(rtts) / 2
    if say:
        say(f"latency {latency * 1e6:.1f} us ({ping_iters} ping-pongs); next: {len(sizes)} message "
            f"size{'s' if len(sizes) > 1 else ''}, {iters} time{'s' if iters > 1 else ''} each")
    per_size = []
    for i, n in enumerate(sizes, 1):
        buf = torch.empty(max(1, n // 4), dtype=torch.float32)
        times = [round_trip(buf, small) for _ in range(iters + 1)]
        one_way = max(statistics.median(times[1:]) - floor, 1e-9)
        per_size.append((buf.numel() * 4, one_way, buf.numel() * 4 / one_way))
        if say:
            say(f"size {i}/{len(sizes)}: {n:,} B in {one_way * 1e3:.3f} ms one way, "
                f"{n / one_way * 8 / 1e9:.3f} Gbit/s")
    # The largest third is bandwidth-bound, where the latency is a small share of a message's time. Where it is
    # not (a message that took no longer than twice the latency: a small --max-size-mib, or a ping slowed by a busy
    # host) the difference is noise, and its rate absurd: such sizes give no bandwidth.
    largest = per_size[-max(1, len(per_size) // 3):]     # the sizes both sides send (the same on both)
    big = [x for x in largest if x[1] > floor]              # rank 0's timings decide (rank 1's are not reported)
    if not big and rank == 0:
        raise InputError(f"the largest messages ({per_size[-1][0]:,} bytes) took no longer than a ping "
                         f"({2 * floor * 1e3:.3f} ms): their time is the latency, not the bandwidth", field="--max-size-mib",
                         fix="probe larger messages (a larger --max-size-mib) or more --iters, on a quiet host")
    together = None
    if connections > 1:
        # every rank creates the same groups in the same order; each is a gloo context of its own connection
        groups = [None] + [dist.new_group([0, 1], backend="gloo", timeout=timeout) for _ in range(connections - 1)]
        rates = []
        for i, (n, _, _) in enumerate(largest, 1):
            bufs = [torch.empty(max(1, n // 4), dtype=torch.float32) for _ in groups]
            times = []
            for _ in range(iters + 1):
                a = time.perf_counter()
                op = dist.isend if rank == 0 else dist.irecv
                for w in [op(b, peer, group=g) for b, g in zip(bufs, groups)]:
                    w.wait()
                if rank == 0:
                    dist.recv(small, peer)
                else:
                    dist.send(small, peer)
                times.append(time.perf_counter() - a)
            one_way = statistics.median(times[1:]) - floor
            if one_way > floor:         # as for one connection: no faster than a ping gives no rate
                rates.append(len(groups) * bufs[0].numel() * 4 / one_way)
            if say:
                say(f"{connections} connections at once, size {i}/{len(largest)}: {n:,} B each, "
                    + (f"{rates[-1] * 8 / 1e9:.3f} Gbit/s together" if one_way > floor else "no slower than a ping"))
        together = max(rates, default=None)
    if rank != 0:
        return None
    return LinkMeasurement(latency, max(r for _, _, r in big), tuple(per_size), connections, together)


class LocalPeerFailed(RuntimeError):
    """--local's second process (rank 1) failed although rank 0 measured: the run failed (exit 1), its result is
    not given."""


def _local_peer(port: int, sizes, iters, timeout_s, connections=1):
    """Rank 1 of --local, in its own process: its failure is its exit status, which run_local checks (a refusal
    its one paragraph, exit 2), and it ends as clean_exit.end_process ends a rank, not through finalisation."""
    import traceback

    from ..runtime.clean_exit import end_process
    code = 0
    try:
        run_side(1, f"127.0.0.1:{port}", sizes=sizes, iters=iters, timeout_s=timeout_s, connections=connections)
    except InputError as exc:
        print(f"hetauto probe-link: error: rank 1 (--local's second process): {exc.message}", file=sys.stderr,
              flush=True)
        code = exc.exit_code
    except BaseException:       # noqa: BLE001  (an internal error keeps its traceback; its status tells the parent)
        traceback.print_exc()
        code = 1
    end_process(code)


def peer_failure(exitcode: int | None, timeout_s: float) -> str | None:
    """Why --local's second process failed, from its exit status (multiprocessing's: minus the signal that ended it),
    or None where it succeeded."""
    import signal
    if exitcode == 0:
        return None
    if exitcode is None or exitcode == -signal.SIGTERM:     # (SIGTERM: run_local's own, past the timeout)
        how = f"did not end within --timeout ({timeout_s:g} s) after the probe"
    elif exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        how = f"was killed by {name}"
    else:
        how = f"ended with exit {exitcode}"
    return (f"--local's second process (rank 1) {how}, so the probe failed and its figures are not given; what it "
            "printed above says why. Run it again; on a busy host give a larger --timeout")


def run_local(*, sizes=DEFAULT_SIZES, iters: int = 5, timeout_s: float = 60.0, port: int | None = None,
              connections: int = 1, progress: bool = False) -> LinkMeasurement:
    """Both sides on this machine (a second process for rank 1): a self-test of the probe, and the loopback
    figures of this host. With `progress`, rank 0 says each step on stderr. LocalPeerFailed where rank 1 failed
    although rank 0 measured (before, its exit status was not looked at: a side that aborted passed)."""
    import multiprocessing as mp
    from ..runtime.launcher import free_port
    port = port or free_port()
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_local_peer, args=(port, tuple(sizes), iters, timeout_s, connections), daemon=True)
    proc.start()
    try:
        m = run_side(0, f"127.0.0.1:{port}", sizes=sizes, iters=iters, timeout_s=timeout_s, connections=connections,
                     progress=progress)
    finally:
        proc.join(timeout_s)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
    failed = peer_failure(proc.exitcode, timeout_s)
    if failed:
        raise LocalPeerFailed(failed)
    return m
