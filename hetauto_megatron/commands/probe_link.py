"""`hetauto probe-link`: measure a link's bandwidth and latency through torch.distributed gloo."""
from __future__ import annotations

import os
import sys

from ..errors import InputError
from ..outputs import json_text

DESCRIPTION = """\
Measure point-to-point bandwidth (over message sizes) and latency between two hosts through torch.distributed
gloo: host tensors sent on a two-rank gloo group, the path pipeline activations take between clusters. Like
iperf3, but through the same stack. Start '--rank 0' on a host of one cluster and '--rank 1' on a host of the
other, both with --master set to rank 0's address; rank 0 reports each step on stderr as it goes (the latency,
then each message size) and prints the inventory 'links:' entry to paste.
--connections N also sends the largest messages on N connections at once, as a boundary's rank pairs do: the
entry then gives their total as bandwidth_gbps and one connection's rate as flow_gbps (on a long-haul path one
TCP stream gets far less than the path).
--local runs both sides on this machine (a self-test; it measures this host's loopback)."""

EPILOG = """\
examples:
  cluster A host (10.0.0.5):  hetauto probe-link --rank 0 --master 10.0.0.5:29600 --between h800 ascend
  cluster B host:             hetauto probe-link --rank 1 --master 10.0.0.5:29600
  with 8 connections at once: add --connections 8 on both sides
  self-test:                  hetauto probe-link --local --json

exit codes: 0 ok, 1 the run failed (--local's second process failed), 2 invalid options or the other side not
reached within --timeout."""


def add_arguments(p):
    p.add_argument("--rank", type=int, metavar="0|1", help="0 on the side whose address is --master, 1 on the other")
    p.add_argument("--master", metavar="HOST:PORT", help="rank 0's address, reachable from rank 1")
    p.add_argument("--local", action="store_true", help="run both sides here (self-test)")
    p.add_argument("--between", nargs=2, metavar="CLUSTER", default=["cluster_a", "cluster_b"],
                   help="the two clusters' names in the printed inventory 'links:' entry (default: cluster_a "
                        "cluster_b; rank 0 prints it)")
    p.add_argument("--max-size-mib", type=float, default=64.0, metavar="MIB",
                   help="largest message (default 64 MiB, at least 1 KiB = 0.0009765625, at most 1024): sizes go "
                        "up by 4x from 1 KiB to it")
    p.add_argument("--iters", type=int, default=5, metavar="N", help="repetitions per message size (default 5, at most 10,000)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds to wait for the other side (default 60)")
    p.add_argument("--connections", type=int, default=1, metavar="N",
                   help="also measure this many connections at once (same on both sides; default 1)")
    p.add_argument("--json", action="store_true", help="print the measurement as JSON")


def run(args) -> int:
    from ..emit.megatron import MAX_TIMEOUT_S
    from ..measure.probe_link import MAX_ITERS, MAX_SIZE_MIB, MIN_SIZE_MIB
    for flag, value, ok, want, fix in (
            # the sizes go up from 1 KiB: a smaller limit would leave nothing to probe
            ("--max-size-mib", args.max_size_mib, args.max_size_mib >= MIN_SIZE_MIB,
             f"at least {MIN_SIZE_MIB} MiB (1 KiB: the smallest message the probe sends)",
             f"give --max-size-mib {MIN_SIZE_MIB} or more, e.g. --max-size-mib 64 (the default)"),
            # (a count beyond a long long stopped both sides with a traceback where they agree on it)
            ("--iters", args.iters, 1 <= args.iters <= MAX_ITERS, f"1 to {MAX_ITERS:,} (each message size is sent "
             "that many times)", "give e.g. --iters 5 (the default)"),
            ("--timeout", args.timeout, 0 < args.timeout <= MAX_TIMEOUT_S,
             f"positive, at most a week ({MAX_TIMEOUT_S} s; Python's and torch's clocks overflow not far above)",
             f"give a positive number of seconds up to {MAX_TIMEOUT_S}, e.g. --timeout 60 (the default)"),
            ("--connections", args.connections, 1 <= args.connections <= 64, "1 to 64",
             "give 1 to 64, e.g. --connections 8")):
        if not ok:
            raise InputError(f"must be {want}, got {value:g}", field=flag, fix=fix)
    if args.max_size_mib > MAX_SIZE_MIB:
        raise InputError(f"at most {MAX_SIZE_MIB} MiB, got {args.max_size_mib:g} (each connection holds a buffer of "
                         "the largest message on both hosts)", field="--max-size-mib",
                         fix=f"give --max-size-mib {MAX_SIZE_MIB} or less")
    # torch's C++ layer logs every failed rendezvous attempt with a native stack trace; the failure itself
    # reaches the user as one InputError paragraph.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    from ..measure import probe_link as P
    sizes = P.message_sizes(args.max_size_mib * (1 << 20))
    from ..spec.inventory import check_cluster_name     # the entry it prints must load as an inventory's link
    for name in args.between:
        check_cluster_name(name, file=None, field="--between")
    if args.between[0] == args.between[1]:
        raise InputError("must name two different clusters", field="--between", fix="e.g. --between h800 ascend")
    if args.local and (args.rank is not None or args.master is not None):
        flag = "--rank" if args.rank is not None else "--master"
        raise InputError(f"--local runs both sides on this machine, so {flag} would be ignored", field=flag,
                         fix="drop --local to probe a link between two hosts, or drop --rank and --master")
    if args.local:
        try:
            m = P.run_local(sizes=sizes, iters=args.iters, timeout_s=args.timeout, connections=args.connections,
                            progress=True)
        except P.LocalPeerFailed as exc:    # a failed run: its paragraph, exit 1 (as 'hetauto dryrun' says one)
            print(f"hetauto probe-link: the run failed: {exc}", file=sys.stderr)
            from ..cli import json_error
            json_error(args, 1, "run failed", str(exc))
            return 1
    else:
        if args.rank is None or args.master is None:
            raise InputError("both --rank and --master are needed (or --local)", field="--rank",
                             fix="run '--rank 0 --master HOST:PORT' on one host and '--rank 1' with the same "
                                 "--master on the other")
        m = P.run_side(args.rank, args.master, sizes=sizes, iters=args.iters, timeout_s=args.timeout,
                       connections=args.connections, progress=True)
        if m is None:
            # stdout is for the result: under --json a script reading rank 1's stdout gets nothing to parse wrongly
            print("hetauto probe-link: done (rank 0 prints the result)", file=sys.stderr)
            return 0
    a, b = args.between
    if args.json:
        print(json_text(m.to_dict(a, b), indent=1))
        return 0
    print(f"# latency {m.latency_s * 1e6:.1f} us, bandwidth {m.bandwidth_gbps:.3f} Gbit/s "
          f"({m.bandwidth_bytes_per_s / 1e6:.1f} MB/s) on one connection"
          + (f", {m.together_bytes_per_s * 8 / 1e9:.3f} Gbit/s on {m.connections} at once"
             if m.together_bytes_per_s else "") + "; per message size (one connection):")
    for n, t, r in m.per_size:
        print(f"#   {n:>10} B  {t * 1e3:9.3f} ms  {r * 8 / 1e9:8.3f} Gbit/s")
    print(P.link_yaml(m, a, b), end="")
    return 0
