"""The world's rendezvous when the clusters launch separately (HETAUTO_MASTER_ADDR set): a TCP store that global
rank 0 hosts at HETAUTO_MASTER_ADDR:HETAUTO_MASTER_PORT, through which every rank joins, and through which a
launch that refuses its input tells the other clusters at once.

Without it a cluster whose launch was refused (a bad argument, another plan: exit 2 with one paragraph) left every
other cluster waiting in torch's rendezvous until HETAUTO_TIMEOUT_S (600 s by default), then stopping with a
timeout that did not say why. Now:

- `join`: each rank connects to the store (rank 0 hosts it), counts itself in, and waits until the plan's world
  has checked in, reading the store's refusals twice a second: one stops it at once (InputError, exit 2) naming the
  refused rank, its cluster and its paragraph. torch's process group is then made on that store.
- Before anything else of this protocol each rank compares its hetauto-megatron code with the host's (the digest
  the host leaves under CODE as it starts the store): a cluster left on other code, whose rendezvous may differ,
  would otherwise wait in it until the timeout without a word. It stops at once naming both (exit 2), and its
  refusal stops the others. Then its plan, which the host leaves beside its code: a rank loaded with another
  (another world size would count the check-ins against another world) stops at once, and so does every rank
  that reads of it, with check_same_plan's paragraph (megatron/world_refusals.py).
- `post_refusal`: a rank that refuses its input before joining leaves its paragraph in the store (rank 0 hosts the
  store for it; another rank waits up to POST_S for the host to answer).
- Nobody who knows of a refusal leaves before the host says so: the host keeps the store up until every rank has
  read a refusal or posted one (at most LINGER_S), then sets RELEASED; the others wait for that (or for the host to
  go). torchrun stops a launch's other workers as soon as one of them exits, so a refused rank that left first
  would take rank 0's store down with it while other clusters are still connecting.

After the join the ranks are in torch's collectives, where a rank cannot poll. Refusals still come then: each
cluster reads its own files (a checkpoint under --load, its tokenizer), so one cluster may refuse while the others
already wait in a collective, which would end in the transport's traceback when the refused rank's connections
close, or at HETAUTO_TIMEOUT_S (600 s by default) where they stay open. So `join` leaves a watcher thread on every
rank, with a connection of its own to the store, that reads the refusals every WATCH_S (less often in worlds of
over 500 ranks, at most every WATCH_MAX_S so that every rank reads within the host's linger): one stops the rank
(exit 2, the refused rank's paragraph) once the host has passed it on, and the error its collective meets as the
others stop is not reported. At a normal end each rank stops its watcher and the host stays until no watcher reads
its store (end_of_job); otherwise the watcher says nothing when the host goes away; the collectives' timeouts bound
a crash. It doubles each rank's connections to rank 0's store (two per
rank: mind `ulimit -n` on rank 0's node in worlds of thousands).
"""
from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time

from ..errors import InputError, first_line
from ..runtime.rendezvous import (address_error, address_mistake, rendezvous_no_host_error, rendezvous_setup_error,
                                  rendezvous_timeout_error)
from .world_refusals import PLAN, check_plan, plan_digest, refused_elsewhere, stopped_by  # noqa: F401

JOINED = "hetauto/joined"           # counter: ranks that checked in
REFUSED = "hetauto/refused"         # appended: "RANK " of each rank that refused its launch
READ = "hetauto/refusal_read"       # counter: ranks that read a refusal (the host waits for them)
RELEASED = "hetauto/released"       # set by the host when it stops waiting for readers
RANK_KEY = "hetauto/rank"           # counter per global rank: processes of that rank that checked in
CHECKED_IN = "hetauto/checked_in"   # appended: "RANK " of each rank that checked in (a timeout names the others)
ENDED = "hetauto/ended"             # counter: ranks that ended normally with their watcher stopped (end_of_job)
LEAVING = "hetauto/leaving"         # set by the host as it ends normally: the watchers still reading stop
CODE = "hetauto/code"               # the host's code digest (hetauto_megatron.code_digest, 12 digits)
CODE_WAIT_S = 10.0                  # how long a rank waits for the host's digest (the host sets it as it starts)
POLL_S = 0.5
CONNECT_TRY_S = 5.0                 # a client's connection attempt; retried until the rendezvous timeout
POST_S = 60.0                       # how long a refused rank waits for the host to answer
LINGER_S = 60.0                     # the most the host stays to pass a refusal on
WATCH_S = 2.0                       # how often a joined rank's watcher reads the refusals: at least, and more
WATCH_READS_PER_S = 250.0           # seldom in large worlds, so that rank 0's store answers this many a second,
WATCH_MAX_S = LINGER_S / 3          # but often enough that every watcher reads a refusal while the host lingers
END_MARGIN_S = 2.0                  # beyond a watch period, for a watcher's last poll as the host ends (end_of_job)
_WORLD: dict = {}                   # this process after its join: addr, port, rank, world_size; "posting" (its
                                    # own refusal), "stopping" (another's, read by its watcher)
DEFAULT_PORT = "29500"
ADDR_FIX = "give the address (or a name every node resolves) of node 0 of the first cluster, where global rank 0 runs"


def master_port(env=None) -> str:
    """The world store's port: HETAUTO_MASTER_PORT, else MASTER_PORT, else 29500; InputError naming the variable
    for one that is not a TCP port (torch's rendezvous fails with a bare ValueError on every rank)."""
    env = os.environ if env is None else env
    name = "HETAUTO_MASTER_PORT" if env.get("HETAUTO_MASTER_PORT") else "MASTER_PORT"
    raw = env.get(name) or DEFAULT_PORT
    if not (raw.strip().isascii() and raw.strip().isdigit() and 0 < int(raw) < 65536):   # ('²' is a digit)
        raise InputError(f"{name}={raw!r} is not a TCP port", field=name,
                         fix="set it as the launch command from 'hetauto emit megatron' does (a port from 1 to "
                             "65535 that global rank 0's host has free)")
    return raw.strip()


def _store(addr: str, port: int, *, host: bool, world_size: int, timeout_s: float):
    from torch.distributed import TCPStore
    return TCPStore(addr, port, world_size if host else None, host, timeout=datetime.timedelta(seconds=timeout_s),
                    wait_for_workers=False)


def _client(addr: str, port: int, timeout_s: float):
    """A client of the store, made within `timeout_s`. torch's TCPStore client pings the server when it is made and
    waits for the answer with no timeout of its own: a port held by something other than the store (another
    program, a frozen process whose kernel still accepts connections) kept this rank in that wait for ever, whatever
    HETAUTO_TIMEOUT_S said. The client is made on a daemon thread (torch releases the GIL there); one that does not
    answer in time is left behind and TimeoutError raised."""
    made: list = []

    def make():
        try:
            made.append(_store(addr, port, host=False, world_size=0, timeout_s=timeout_s))
        except Exception as exc:      # noqa: BLE001  (refused, reset: the caller retries)
            made.append(exc)

    worker = threading.Thread(target=make, name="hetauto-store-connect", daemon=True)
    worker.start()
    worker.join(timeout_s + 1.0)
    if not made:
        raise TimeoutError(f"{addr}:{port} accepted the connection but did not answer as a rendezvous store")
    if isinstance(made[0], Exception):
        raise made[0]
    return made[0]


def _host_up(addr: str, port: int, timeout_s: float) -> bool:
    """Whether the store's port answers a plain socket (which logs nothing where torch's client would log a failed
    try with its C++ stack, some 60 lines). socket.gaierror for an address that does not resolve."""
    try:
        socket.create_connection((addr, port), timeout=max(0.1, timeout_s)).close()
        return True
    except socket.gaierror:
        raise
    except OSError:
        return False


def _connect(addr: str, port: int, deadline: float, unresolved=None, silent: list | None = None):
    """A client of the store, retried until `deadline` (the host may start later); None when it never answered.
    An address that does not resolve is retried too (a name may appear only once rank 0's node is up), and
    `unresolved(exc)` is called the first time it does not; `silent` collects the tries where something at the port
    accepted the connection but never answered as the store."""
    told = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            if _host_up(addr, port, min(CONNECT_TRY_S, left)):
                return _client(addr, port, max(1.0, min(CONNECT_TRY_S, left)))
        except socket.gaierror as exc:
            if unresolved is not None and not told:
                unresolved(exc)
                told = True
        except TimeoutError as exc:
            if silent is not None:
                silent.append(str(exc))
        except Exception:         # noqa: BLE001  (refused, timed out: torch's errors differ by version)
            pass
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


def _refusal(store) -> str | None:
    """The first refusal in the store as 'rank R (cluster C): paragraph', or None."""
    if not store.check([REFUSED]):
        return None
    rank = store.get(REFUSED).decode().split()[0]
    return store.get(f"{REFUSED}/{rank}").decode()


def _pass_on(store, rank: int, world_size: int) -> None:
    """After this rank has read or posted a refusal: the host keeps the store up until every rank has read a
    refusal or posted one (bounded: a rank its launcher stopped first does neither), then releases the others;
    they wait for that release (or for the host to go), so that no launch stops its rank 0 early."""
    deadline = time.monotonic() + LINGER_S + (0 if rank == 0 else 2 * POLL_S)
    try:
        while time.monotonic() < deadline:
            if rank == 0:
                refused = len(store.get(REFUSED).decode().split()) if store.check([REFUSED]) else 0
                if store.add(READ, 0) + refused >= world_size:
                    break
            elif store.check([RELEASED]):
                return
            time.sleep(POLL_S)
        if rank == 0:
            store.set(RELEASED, "1")
            time.sleep(2 * POLL_S)      # the others' next poll sees it before the store goes
    except Exception:                   # noqa: BLE001  (the host went: nothing left to wait for)
        return


def _check_code(store, rank: int, deadline: float, describe, file: str | None) -> None:
    """This rank's code against the host's (module docstring): InputError naming both where they differ, or where
    the host left none (an older hetauto-megatron, whose protocol may differ from here on)."""
    from .. import code_digest
    from ..runtime.rendezvous import different_code_error
    until = min(deadline, time.monotonic() + CODE_WAIT_S)
    while not store.check([CODE]) and time.monotonic() < until:
        if store.check([REFUSED]):
            return          # a refused rank 0 hosts the store to say so: the join reads its refusal next
        time.sleep(0.05)
    theirs = store.get(CODE).decode() if store.check([CODE]) else None
    mine = code_digest()[:12]
    if theirs != mine:
        raise different_code_error(rank, {0: theirs, rank: mine}, describe, file)


def join(rank: int, world_size: int, addr: str, port: int, timeout_s: float, *, file: str | None = None,
         describe=None, plan: str | None = None, timeout_from: str = "HETAUTO_TIMEOUT_S"):
    """Check this rank in and wait for the whole world (module docstring); returns the store for
    init_process_group. InputError (exit 2) on other code or another plan (`plan`: plan_digest) than the host's, a
    refusal, a port the host cannot take, the host going away, or the timeout. `describe(rank)` names a rank in
    those paragraphs (its cluster and stage, from the plan); `timeout_from` what set `timeout_s`, for the timeout's
    paragraph (which names the ranks that never checked in)."""
    describe = describe or (lambda r: f"rank {r}")
    deadline = time.monotonic() + timeout_s
    mistake = address_mistake(addr)
    if mistake:         # no host at all: said at once, where a lookup of it was retried until the timeout
        raise _ours(address_error("HETAUTO_MASTER_ADDR", addr, mistake, ADDR_FIX).within(file))
    if rank == 0:
        try:
            store = _store(addr, port, host=True, world_size=world_size, timeout_s=timeout_s)
        except Exception as exc:  # noqa: BLE001
            reason = first_line(exc)
            raise _ours(rendezvous_setup_error(rank, f"{addr}:{port}", reason, file)) from None
    else:
        lookup: list = []

        def unresolved(exc):        # said at once: a typo would otherwise wait the whole timeout without a word
            lookup.append(exc)
            print(f"hetauto: rank {rank}: the rendezvous address {addr!r} does not resolve ({exc.strerror}); "
                  f"retrying until the rendezvous timeout ({timeout_s:g} s)", file=sys.stderr, flush=True)

        silent: list = []
        store = _connect(addr, port, deadline, unresolved, silent)
        if store is None and lookup:
            raise _ours(InputError(f"the rendezvous address {addr!r} does not resolve ({lookup[0].strerror}), "
                                   f"waited {timeout_s:g} s", file=file, field="HETAUTO_MASTER_ADDR",
                                   fix=ADDR_FIX)) from None
        if store is None and silent:
            raise _ours(InputError(f"rank {rank} found something at {addr}:{port} that accepts connections but does "
                                   f"not answer as the world's rendezvous store (waited {timeout_s:g} s): another "
                                   "program, or a stuck earlier run, holds that port on global rank 0's node",
                                   file=file, field="HETAUTO_MASTER_PORT",
                                   fix="give every cluster a HETAUTO_MASTER_PORT that is free on node 0 of the first "
                                       "cluster (or stop what holds it there), then start every cluster's launch "
                                       "again")) from None
        if store is None:
            raise _ours(rendezvous_no_host_error(rank, f"{addr}:{port}", timeout_s, file, timeout_from=timeout_from))
    try:
        store.set_timeout(datetime.timedelta(seconds=timeout_s))
        if rank == 0:
            from .. import code_digest
            if plan is not None:
                store.set(PLAN, plan)
            store.set(CODE, code_digest()[:12])
        else:
            try:
                _check_code(store, rank, deadline, describe, file)
                check_plan(store, rank, plan, file)
            except InputError as exc:     # passed on through the store this rank holds, so the others stop now
                print(f"hetauto: passing this refusal on to the other clusters' ranks through the rendezvous at "
                      f"{addr}:{port} (up to {LINGER_S:.0f} s)", file=sys.stderr, flush=True)
                _post(store, rank, world_size, os.environ.get("HETAUTO_CLUSTER") or "?", exc.message)
                raise _ours(exc) from None
        # each global rank checks in once: a second process of the same rank (a launch started twice, two nodes of a
        # cluster given one NODE_RANK) counted as another rank, so the world "joined" without its real last rank and
        # the extra process waited in gloo's connection mesh until it failed with a traceback, minutes later
        if store.add(f"{RANK_KEY}/{rank}", 1) > 1:
            raise _ours(InputError(f"global rank {rank} was started twice: another process of this rank already "
                                   f"checked in at the rendezvous {addr}:{port}, so this one stops", file=file,
                                   field="NODE_RANK",
                                   fix="start each cluster's launch once per node, each node of a cluster with its own "
                                       "NODE_RANK (0..nodes-1), and stop any earlier run of the launch still going; "
                                       "if that run already stopped, start every cluster's launch again (global rank "
                                       "0's rendezvous remembers the ranks that checked in)"))
        store.append(CHECKED_IN, f"{rank} ")
        store.add(JOINED, 1)
        while True:
            refused = _refusal(store)
            if refused is not None:
                stop = stopped_by(store, refused, rank, file)      # (read while the host is surely up)
                store.add(READ, 1)
                _pass_on(store, rank, world_size)
                raise _ours(stop)
            joined = store.add(JOINED, 0)
            if joined >= world_size:
                _watch(addr, port, rank, world_size, file)
                return store
            if time.monotonic() > deadline:
                raise _timeout(rank, world_size, timeout_s, f"{joined} of {world_size} ranks checked in", file,
                               missing=_missing(store, world_size), describe=describe, timeout_from=timeout_from)
            time.sleep(POLL_S)
    except InputError:
        raise
    except Exception as exc:             # noqa: BLE001  (the host stopped: torch's network errors)
        reason = first_line(exc)
        raise _ours(InputError(f"rank {rank} lost the rendezvous at {addr}:{port} while waiting for the plan's "
                               f"{world_size} ranks ({reason[:200]}): global rank 0, which hosts it, stopped",
                               file=file, field="HETAUTO_MASTER_ADDR",
                               fix="see the log of global rank 0 (node 0 of the first cluster) for why it stopped, "
                                   "then start every cluster's launch again")) from None


def _watch(addr: str, port: int, rank: int, world_size: int, file: str | None = None) -> None:
    """After the join: a daemon thread with its own connection to the store (torch's process group uses the
    join's), reading the refusals every WATCH_S to WATCH_MAX_S (module docstring). Once it has read one, an
    exception that ends the main thread (the collective it waits in fails as the others stop) is not reported:
    the watcher ends the process with the refusal's paragraph and exit 2 once the host has passed it on."""
    every_s = min(max(WATCH_S, world_size / WATCH_READS_PER_S), WATCH_MAX_S)
    stop = threading.Event()
    _WORLD.update(addr=addr, port=port, rank=rank, world_size=world_size, posting=False, stopping=False,
                  every_s=every_s, stop=stop, client=None)

    def watch():
        try:
            client = _connect(addr, port, time.monotonic() + 60.0)
            _WORLD["client"] = client
            while client is not None:
                if stop.wait(every_s):
                    return          # this rank ends normally (end_of_job)
                # (rank 0 hosts the store in this very process: it is up while this thread runs)
                if rank != 0 and not _host_up(addr, port, CONNECT_TRY_S):
                    return          # the host went: a finished job (quietly), or a crash the timeouts bound
                if rank != 0 and client.check([LEAVING]):
                    return          # the host ends normally and stays up until every watcher has read this
                refused = _refusal(client)
                if refused is None or _WORLD.get("posting"):
                    continue        # (a rank refusing its own input says its own paragraph, and posts it)
                _WORLD["stopping"] = True
                exc = stopped_by(client, refused, rank, file, after_join=True)
                print(f"hetauto: error: {exc.message}", file=sys.__stderr__ or sys.stderr, flush=True)
                client.add(READ, 1)
                _pass_on(client, rank, world_size)
                sys.stdout.flush()
                os._exit(exc.exit_code)     # the main thread waits in a collective: only the process can stop
        except Exception:                   # noqa: BLE001  (the host went between two reads)
            return

    previous = sys.excepthook

    def excepthook(kind, exc, tb):
        if _WORLD.get("stopping"):          # the watcher's exit comes within the host's linger
            time.sleep(LINGER_S + 2 * WATCH_MAX_S)
        previous(kind, exc, tb)

    sys.excepthook = excepthook
    _WORLD["watcher"] = threading.Thread(target=watch, name="hetauto-world-watch", daemon=True)
    _WORLD["watcher"].start()


def end_of_job(clean: bool) -> None:
    """As a joined rank ends (script_guard.exit_after_training): its watcher stops before the store can go, and at a
    normal end (`clean`) no other rank's watcher is left reading a store that is gone. Left alone, a watcher that
    had found the host up and then read the store as rank 0 ended met the closed connection, and torch logged its
    C++ stack (some 60 lines) on that rank at the end of a job that went well; rank 0's own watcher met its store
    closing under it the same way. So each rank stops its watcher and counts itself out (ENDED); the host then
    sets LEAVING and stays until every rank has counted itself out, or until each watcher still reading has polled
    once since (one period and a margin: ranks still saving a checkpoint, or gone without ending normally, do
    not keep it longer). A rank that was stopped by a refusal, or is posting its own, ends as before."""
    if not _WORLD or _WORLD.get("stopping") or _WORLD.get("posting"):
        return
    _WORLD["stop"].set()
    _WORLD["watcher"].join(CONNECT_TRY_S + 1.0)     # a poll under way finishes first
    client, rank = _WORLD.get("client"), _WORLD["rank"]
    if not clean or client is None or _WORLD["watcher"].is_alive():
        return
    try:
        if rank != 0:
            if _host_up(_WORLD["addr"], _WORLD["port"], CONNECT_TRY_S):   # (gone: nothing to tell, nothing logged)
                client.add(ENDED, 1)
            return
        client.set(LEAVING, "1")
        until = time.monotonic() + _WORLD["every_s"] + END_MARGIN_S
        while client.add(ENDED, 0) < _WORLD["world_size"] - 1 and time.monotonic() < until:
            time.sleep(0.05)
    except Exception:                   # noqa: BLE001  (the host went between two reads: the job has ended)
        return


def _ours(exc: InputError) -> InputError:
    """Mark an error of the rendezvous itself: the rank stopping on it has no refusal of its own to post."""
    exc.from_world_store = True
    return exc


def _timeout(rank: int, world_size: int, timeout_s: float, reason: str, file: str | None, **named) -> InputError:
    return _ours(rendezvous_timeout_error(rank, world_size, timeout_s, reason, file, **named))


def _missing(store, world_size: int) -> list[int]:
    """The global ranks that have not checked in: one read of CHECKED_IN (this rank's own entry is there), not one
    request per rank, as every waiting rank of a large world asks at about the same time."""
    came = {int(r) for r in store.get(CHECKED_IN).decode().split()}
    return [r for r in range(world_size) if r not in came]


def post_refusal(message: str, env=None) -> None:
    """Leave this rank's refusal in the world's store, when this process is one rank of separately launched
    clusters (HETAUTO_MASTER_ADDR and HETAUTO_WORLD_SIZE set) that has not joined yet; never raises (the rank is
    stopping anyway). It may take up to POST_S + LINGER_S: it says so first. After the join it posts to the store
    this process joined (the others' watchers read it)."""
    env = os.environ if env is None else env
    if not _WORLD and (not env.get("HETAUTO_MASTER_ADDR") or not env.get("HETAUTO_WORLD_SIZE")):
        return
    try:
        cluster = env.get("HETAUTO_CLUSTER") or "?"
        if _WORLD:
            _WORLD["posting"] = True
            addr, port, rank, world_size = (_WORLD[k] for k in ("addr", "port", "rank", "world_size"))
        else:
            from .launch_identity import identity_from_env
            ident = identity_from_env(env)
            addr, port, rank, world_size = env["HETAUTO_MASTER_ADDR"], int(master_port(env)), ident.rank, \
                ident.world_size
        print(f"hetauto: passing this refusal on to the other clusters' ranks through the rendezvous at {addr}:"
              f"{port} (up to {POST_S + LINGER_S:.0f} s)", file=sys.stderr, flush=True)
        if rank == 0 and not _WORLD:
            store = _store(addr, port, host=True, world_size=world_size, timeout_s=POST_S)
            from .. import code_digest
            store.set(CODE, code_digest()[:12])     # as join's host does: the others compare it first
        else:                       # (after the join rank 0's own store, which torch's group holds, still serves)
            store = _connect(addr, port, time.monotonic() + POST_S)
            if store is None:
                return
        _post(store, rank, world_size, cluster, message)
    except Exception:             # noqa: BLE001  (best effort: the refusal is printed anyway)
        return


def _post(store, rank: int, world_size: int, cluster: str, message: str) -> None:
    """This rank's refusal into the store, then the host's linger (_pass_on)."""
    store.set(f"{REFUSED}/{rank}", f"rank {rank} (cluster {cluster}): {message}"[:2000])
    store.append(REFUSED, f"{rank} ")
    _pass_on(store, rank, world_size)
