"""Which holders are the roots of a gradient exchange among three or more, and of how much: one rule for the
runtime (runtime/replica_sync.py, through shard_regions.root_chunks) and the price (plan/tail_costs.py).

Three or more mesh stages holding the same parameters sum their gradients in two phases: every holder sends each
root its run of the elements, the roots sum them and send the sums back (shard_regions.sync_moves). Which runs go
to which root is a choice:
- the roots take turns (equal runs, the default): any two holders swap 1/H of the elements each way per phase,
  so the exchange spreads over every pair's link and no link carries more than 1/H;
- one root takes all: every other holder sends it everything, over its links to that root only.
Taking turns moves H times fewer bytes over each link, but over every pair's link; where one pair is joined by a
far slower link than the others (sites a - b and b - c close, a - c far apart) a root at b keeps the slow link
idle. `exchange_weights` prices one phase of each choice on the inventory's links (by bandwidth: the bytes scale
every choice alike) and returns the cheapest: equal weights unless one root is strictly faster. Fractional mixes
can be better still; they are not tried.
"""
from __future__ import annotations

from ..spec.inventory import Inventory
from .link_costs import link_between


def _phase_time(inventory: Inventory, clusters: list[str], weights: tuple[int, ...]) -> float:
    """Seconds per byte of the parameter for one phase (every holder to each root its run; the scatter is the
    mirror image on full-duplex links): the busiest link direction or uplink direction. Holders in one cluster
    move over its inter-node network, each pair in parallel."""
    total = sum(weights)
    load: dict = {}
    for i, a in enumerate(clusters):
        for j, b in enumerate(clusters):
            if i == j or not weights[j]:
                continue
            share = weights[j] / total
            if a == b:
                res = ("pair", i, j)
            else:
                res = ("link", a, b)
                for end in ((a, "out"), (b, "in")):
                    load[("uplink",) + end] = load.get(("uplink",) + end, 0.0) + share
            load[res] = load.get(res, 0.0) + share
    worst = 0.0
    for res, share in load.items():
        if res[0] == "pair":
            rate = inventory.cluster(clusters[res[1]]).inter_node.bytes_per_s
        elif res[0] == "link":
            rate = link_between(inventory, res[1], res[2]).bytes_per_s
        else:
            rate = inventory.cluster(res[1]).uplink_bytes_per_s
            if rate is None:
                continue
        worst = max(worst, share / rate)
    return worst


def exchange_weights(inventory: Inventory | None, clusters: list[str]) -> tuple[int, ...]:
    """Each holder's share of the elements it is the root of (integer weights, shard_regions.root_chunks), for
    holders on `clusters` in holder order: (1, ..., 1) the roots take turns, a single 1 one root takes all.
    Without an inventory (a plan file that stores none) the roots take turns."""
    h = len(clusters)
    equal = (1,) * h
    if inventory is None or h < 3:
        return equal
    best, best_t = equal, _phase_time(inventory, clusters, equal)
    for r in range(h):
        one = tuple(int(i == r) for i in range(h))
        t = _phase_time(inventory, clusters, one)
        if t < best_t * (1 - 1e-9):
            best, best_t = one, t
    return best
