"""The rendezvous of one cluster's torchrun (its static TCP rendezvous at --master-addr/--master-port, which the
launch scripts give as CLUSTER_MASTER_ADDR/CLUSTER_MASTER_PORT), as hetauto-torchrun (megatron/torchrun.py) runs it.

torch's static rendezvous waits for the launch's nodes with a timeout of its own, 600 s unless `--rdzv-conf
timeout=N` says otherwise (torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py): a cluster started with
fewer nodes than the plan hung there silently whatever HETAUTO_TIMEOUT_S said, then printed the agent's traceback.
So hetauto-torchrun gives that rendezvous the job's timeout (HETAUTO_TIMEOUT_S, megatron/timeouts.py) where the
command line sets none, and ends a rendezvous that fails with one paragraph naming the nodes that never joined,
exit 2 (a node other than 0 first waits quietly for node 0's rendezvous to accept a connection).
Before it, the arguments torch refuses with a traceback (a rendezvous timeout that is not whole seconds, a
--master-port outside 0..65535, a --nproc-per-node below 1: check_arguments), and the address: blank (torch's
ValueError traceback), with a port, or not resolving (c10d's "gai error" warnings until the timeout) is refused
with the checks the world's rendezvous makes of HETAUTO_MASTER_ADDR (runtime/rendezvous.py address_mistake).
"""
from __future__ import annotations

import math
import os
import re
import socket
import sys
import time

from ..errors import InputError, first_line
from ..runtime.rendezvous import address_error, address_mistake

MAX_NAMED = 8           # nodes a paragraph names, then counts
RESOLVE_RETRY_S = 1.0


class ClusterRendezvousFailed(Exception):
    """torch's agent failed in the launch's own rendezvous (the nodes of this cluster never all met)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _given_timeout(rdzv_conf: str) -> str | None:
    """The timeout a launch's --rdzv-conf gives (text as written, "" for a bare 'timeout'), None where it gives none."""
    for kv in (rdzv_conf or "").split(","):
        key, _, value = kv.partition("=")
        if key.strip() == "timeout":
            return value.strip()
    return None


def prepare(args) -> float | None:
    """Checks torchrun's parsed arguments before it starts and gives its static rendezvous the job's timeout;
    returns the rendezvous timeout in seconds (None where the launch uses another rendezvous backend, which this
    leaves to torch). InputError for a timeout or an address that cannot work."""
    check_arguments(args)
    if args.rdzv_backend != "static" or args.rdzv_endpoint:
        return None
    from .timeouts import env_timeout_s
    given = _given_timeout(args.rdzv_conf)
    if given is not None:      # the launch's own (checked in check_arguments: whole seconds, at least 1)
        timeout_s = float(given)
    else:
        # torch reads the rendezvous's timeout as whole seconds (int(...)): at least the job's
        timeout_s = float(max(1, math.ceil(env_timeout_s())))
        args.rdzv_conf = ",".join(filter(None, [args.rdzv_conf, f"timeout={timeout_s:.0f}"]))
    check_address(args.master_addr, timeout_s)
    if args.node_rank != 0:
        wait_for_node0(args, timeout_s)
    return timeout_s


def check_arguments(args) -> None:
    """torchrun's arguments that torch itself refuses with a traceback (exit 1) after parsing them, refused here with
    one paragraph naming the flag and the fix (InputError, exit 2): a rendezvous timeout that is not whole seconds
    (torch's static rendezvous reads it with int(); 0 failed the rendezvous at once, naming the nodes as missing), a
    --master-port outside the TCP ports, a --nproc-per-node below 1 (an AssertionError). The timeout only of the
    static rendezvous, the one that reads it."""
    given = _given_timeout(args.rdzv_conf) if args.rdzv_backend == "static" and not args.rdzv_endpoint else None
    if given is not None and (not given.isdigit() or int(given) < 1):
        raise InputError(f"--rdzv-conf timeout={given!r} is not a whole number of seconds of at least 1 (torch's "
                         "rendezvous reads it as an integer)", field="--rdzv-conf timeout",
                         fix="give whole seconds, e.g. 'timeout=600', or leave the timeout out: hetauto-torchrun then "
                             "gives the rendezvous HETAUTO_TIMEOUT_S, rounded up")
    port = args.master_port
    if port is not None and not 0 <= port <= 65535:
        raise InputError(f"--master-port {port} is not a TCP port", field="--master-port",
                         fix="set CLUSTER_MASTER_PORT (the launch script's --master-port) to a port between 1024 and "
                             "65535 that is free on this cluster's node 0, the same on every node of the cluster")
    nproc = str(args.nproc_per_node).strip()
    if nproc.lstrip("+-").isdigit() and int(nproc) < 1:
        raise InputError(f"--nproc-per-node {nproc} starts no worker", field="--nproc-per-node",
                         fix="give the worker processes per node, at least 1: the plan's count for this cluster's "
                             "nodes, as the launch script 'hetauto emit megatron' wrote gives it (or 'auto', 'gpu', "
                             "'cpu')")


def wait_for_node0(args, timeout_s: float) -> None:
    """A node other than 0 waits, quietly, until node 0's rendezvous accepts a plain connection: torch's client logged
    each failed try with a page of C++ frames, and a node 0 never started reads as one paragraph (failed_error)."""
    addr, port = args.master_addr.strip(), int(args.master_port or 29500)
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            socket.create_connection((addr, port), timeout=min(5.0, max(0.1, left))).close()
            return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            from torch.distributed.run import parse_min_max_nnodes
            raise failed_error(f"nothing accepted a connection at {addr}:{port}",
                               node_rank=args.node_rank, nnodes=parse_min_max_nnodes(args.nnodes)[1], addr=addr,
                               port=port, timeout_s=timeout_s, cluster=os.environ.get("HETAUTO_CLUSTER"))
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


ADDR_FIX = ("set CLUSTER_MASTER_ADDR to the address (or a name every node of the cluster resolves) of this cluster's "
            "node 0, without a port (CLUSTER_MASTER_PORT gives it), the same on every node of the cluster")


def check_address(addr: str, timeout_s: float) -> None:
    """The cluster's rendezvous address: refused at once where it is no host; a name that does not resolve is said
    at once and retried until the rendezvous timeout (a name may appear only once node 0 is up), then refused."""
    mistake = address_mistake(addr)
    if mistake:
        raise address_error("CLUSTER_MASTER_ADDR", addr, mistake, ADDR_FIX)
    deadline, told = time.monotonic() + timeout_s, False
    while True:
        try:
            socket.getaddrinfo(addr.strip(), None)
            return
        except socket.gaierror as exc:
            if time.monotonic() >= deadline:
                raise address_error("CLUSTER_MASTER_ADDR", addr, f"does not resolve ({exc.strerror}), waited "
                                    f"{timeout_s:g} s", ADDR_FIX) from None
            if not told:
                print(f"hetauto-torchrun: CLUSTER_MASTER_ADDR={addr!r} does not resolve ({exc.strerror}); retrying "
                      f"until the rendezvous timeout ({timeout_s:g} s)", file=sys.stderr, flush=True)
                told = True
        time.sleep(min(RESOLVE_RETRY_S, max(0.0, deadline - time.monotonic())))


def catch_rendezvous_failure() -> None:
    """torch's agent raises a rendezvous that failed (its store's timeout, a node 0 that never answered) from
    SimpleElasticAgent._rendezvous, out through torchrun as a traceback: raised as ClusterRendezvousFailed instead,
    which hetauto-torchrun says in one paragraph. A port node 0 cannot listen on stays torch's error (torchrun.py
    says it in a paragraph of its own)."""
    from torch.distributed import DistError
    from torch.distributed.elastic.agent.server import api
    from torch.distributed.elastic.rendezvous import RendezvousError

    original = api.SimpleElasticAgent._rendezvous
    if getattr(original, "_hetauto", False):
        return

    def _rendezvous(self, worker_group):
        try:
            return original(self, worker_group)
        except (DistError, RendezvousError) as exc:
            text = str(exc)
            if "EADDRINUSE" in text or "address already in use" in text.lower():
                raise
            raise ClusterRendezvousFailed(first_line(exc)) from exc

    _rendezvous._hetauto = True
    api.SimpleElasticAgent._rendezvous = _rendezvous


def _nodes(numbers: list[int]) -> str:
    return (", ".join(map(str, numbers[:MAX_NAMED]))
            + (f" and {len(numbers) - MAX_NAMED} more" if len(numbers) > MAX_NAMED else ""))


def failed_error(reason: str, *, node_rank: int, nnodes: int, addr: str, port, timeout_s: float | None,
                 cluster: str | None = None) -> InputError:
    """The paragraph for a cluster rendezvous that failed, from torch's `reason` (its first line) and where this
    node stands: node 0 hosts the rendezvous and counts the nodes that came ("1/2 clients joined": itself among
    them), another node either reached no rendezvous at all or waited there for the rest."""
    where = (f"the torchrun rendezvous of {cluster or 'this cluster'} at {addr}:{port} "
             "(CLUSTER_MASTER_ADDR:CLUSTER_MASTER_PORT)")
    within = f" within {timeout_s:g} s" if timeout_s else ""
    fix = (f"start this cluster's launch script on each of its {nnodes} nodes, each with its own NODE_RANK "
           f"(0..{nnodes - 1}) and the same CLUSTER_MASTER_ADDR and CLUSTER_MASTER_PORT (node 0's)"
           + (f"; where nodes start slowly, give a larger HETAUTO_TIMEOUT_S (it gave {timeout_s:g} s)"
              if timeout_s else ""))
    came = re.search(r"(\d+)/(\d+) clients joined", reason)
    if node_rank == 0 and came:
        joined = int(came.group(1))
        if joined <= 1:
            missing = f"node(s) {_nodes(list(range(1, nnodes)))} never joined"
        else:
            missing = f"{nnodes - joined} of nodes 1..{nnodes - 1} never joined ({joined - 1} did)"
        return InputError(f"this cluster's plan has {nnodes} nodes; {missing} {where}{within}, where this node "
                          f"(NODE_RANK=0) waited for them ({reason[:200]}): their launch did not start, was given "
                          "another NODE_RANK, CLUSTER_MASTER_ADDR or CLUSTER_MASTER_PORT, or was still starting",
                          field="NODE_RANK", fix=fix)
    if node_rank != 0 and "connect" in reason.lower():
        return InputError(f"this cluster's plan has {nnodes} nodes; this node (NODE_RANK={node_rank}) could not "
                          f"reach {where}{within} ({reason[:200]}): node 0 (NODE_RANK=0), which hosts it, did not "
                          "start its launch or stopped, or this node was given another CLUSTER_MASTER_ADDR or "
                          "CLUSTER_MASTER_PORT than node 0's (or a firewall drops the connection)",
                          field="CLUSTER_MASTER_ADDR", fix=fix)
    return InputError(f"this cluster's plan has {nnodes} nodes, and not all of them joined {where}{within} "
                      f"({reason[:200]}); this is node {node_rank} (NODE_RANK={node_rank}), and node 0's log says "
                      "how many came: a node's launch did not start, was given another NODE_RANK, "
                      "CLUSTER_MASTER_ADDR or CLUSTER_MASTER_PORT, or was still starting", field="NODE_RANK", fix=fix)


def failed_paragraph(exc: ClusterRendezvousFailed, args, timeout_s: float | None) -> str:
    from torch.distributed.run import parse_min_max_nnodes
    _, nnodes = parse_min_max_nnodes(args.nnodes)
    err = failed_error(exc.reason, node_rank=args.node_rank, nnodes=nnodes, addr=args.master_addr,
                       port=args.master_port, timeout_s=timeout_s, cluster=os.environ.get("HETAUTO_CLUSTER"))
    return err.message
