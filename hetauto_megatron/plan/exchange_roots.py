"""Which holders are the roots of a gradient exchange among three or more, and of how much: one rule for the
runtime (runtime/replica_sync.py, through shard_regions.root_chunks) and the price (plan/tail_costs.py).

Three or more mesh stages holding the same parameters sum their gradients in two phases: every holder sends each
root its run of the elements, the roots sum them and send the sums back (shard_regions.sync_moves). How many of
the elements each holder is the root of is a choice (its share s_j, the shares summing to 1):
- the roots take turns (equal shares, the default): any two holders swap 1/H of the elements each way per phase,
  so the exchange spreads over every pair's link;
- one root takes all: every other holder sends it everything, over its links to that root only;
- anything between: where one pair is joined by a far slower link than the others (sites a - b and b - c close,
  a - c far apart), b roots most of the elements and a and c a small share each, so that the slow link carries
  as long as the fast ones do.
In one phase every link direction (and every uplink direction, and the ranks of each root receiving from the
holders in its own cluster) carries the sum of the shares of the roots it leads to: the phase lasts as long as the busiest of them, a
maximum of linear functions of the shares. `exchange_weights` finds the shares that make it least, exactly (a
linear programme, `_least_max_shares`), as integer weights (shard_regions.root_chunks cuts the elements by
them), and keeps the roots taking turns, or one root taking all, wherever the rounded shares are not strictly
faster. Priced by bandwidth (the bytes scale every choice alike); the price (holders_exchange.holders_sync_time) then
adds each link's latency.
"""
from __future__ import annotations

import functools
import math

from ..spec.inventory import Inventory
from .link_costs import link_between, rank_pairs_share

WEIGHT_TOTAL = 1200         # the most integer weights the shares are rounded to (then 1/1200 of the elements)
PRICE_TOLERANCE = 1e-3      # smaller weights where their phase is within this of the exact shares'


def _loads(inventory: Inventory, clusters: list[str], owners) -> list[tuple[float, tuple[float, ...]]]:
    """Every resource one gather phase uses, as (bytes per second, bytes it carries per byte of each root's run),
    as holders_exchange.holders_sync_time prices them: a link direction between two clusters (every holder sending a
    root over it adds the whole run), each end's uplink direction where the inventory gives one, and the ranks of
    a root receiving from the holders in its own cluster (on the inter-node network; each such holder's rank
    pairs in parallel, so it adds the run over the fewer of its and the root's `owners`, the source ranks). The
    scatter phase is the mirror image on full-duplex links, so it lasts as long."""
    h = len(clusters)
    coef: dict = {}
    for i, a in enumerate(clusters):
        for j, b in enumerate(clusters):
            if i == j:
                continue
            if a == b:
                # at the per-device rate below (a shared NIC makes it longer)
                res, amount = [("ranks", j)], rank_pairs_share(inventory.cluster(a), min(owners[i], owners[j]))
            else:
                res, amount = [("link", a, b), ("uplink", a, "out"), ("uplink", b, "in")], 1.0
            for r in res:
                coef.setdefault(r, [0.0] * h)[j] += amount
    out = []
    for res, c in coef.items():
        if res[0] == "ranks":
            rate = inventory.cluster(clusters[res[1]]).inter_node.bytes_per_s
        elif res[0] == "link":
            rate = link_between(inventory, res[1], res[2]).bytes_per_s
        else:
            rate = inventory.cluster(res[1]).uplink_bytes_per_s
            if rate is None:
                continue
        out.append((rate, tuple(c)))
    return out


def _phase_time(loads, weights) -> float:
    """Seconds per byte of the parameter for one phase with these weights: the busiest resource."""
    total = sum(weights)
    return max(sum(n * w for n, w in zip(c, weights)) / total / rate for rate, c in loads)


def _least_max_shares(rows: list[list[float]]) -> list[float]:
    """The shares s (s >= 0, summing to 1) that make max_r sum_j rows[r][j] s_j least, for rows >= 0 with every
    column somewhere positive. With y = s / t that is: maximise sum_j y_j subject to rows y <= 1, y >= 0, whose
    origin is feasible; solved by the simplex method with Bland's rule (no cycling, deterministic). Each column
    is scaled to a largest entry of 1 (z_j = y_j x that entry, the objective's weight of z_j its inverse), so
    that rates a million times apart keep their tableau entries far from the tolerance."""
    m, n = len(rows), len(rows[0])
    col = [max(r[j] for r in rows) for j in range(n)]
    # tableau: m constraint rows [A | I | 1], objective row [-c | 0 | 0] with c_j = 1 / col_j, largest 1
    tab = [[r[j] / col[j] for j in range(n)] + [float(k == i) for k in range(m)] + [1.0] for i, r in enumerate(rows)]
    least = min(col)
    obj = [-least / c for c in col] + [0.0] * (m + 1)
    basis = [n + i for i in range(m)]
    eps = 1e-12
    while True:
        enter = next((k for k in range(n + m) if obj[k] < -eps), None)
        if enter is None:
            break
        ratios = [(tab[i][-1] / tab[i][enter], basis[i], i) for i in range(m) if tab[i][enter] > eps]
        if not ratios:          # no resource limits that root any more (rounding): it takes all
            return [float(k == enter) for k in range(n)] if enter < n else [1.0 / n] * n
        _, _, leave = min(ratios)
        piv = tab[leave][enter]
        tab[leave] = [x / piv for x in tab[leave]]
        for i in range(m):
            if i != leave and tab[i][enter]:
                f = tab[i][enter]
                tab[i] = [x - f * y for x, y in zip(tab[i], tab[leave])]
        f = obj[enter]
        obj = [x - f * y for x, y in zip(obj, tab[leave])]
        basis[leave] = enter
    y = [0.0] * n
    for i, b in enumerate(basis):
        if b < n:
            y[b] = max(tab[i][-1], 0.0) / col[b]
    total = sum(y)
    return [v / total for v in y] if total > 0 else [1.0 / n] * n


def _as_weights(loads, shares: list[float]) -> tuple[int, ...]:
    """The smallest integer weights (total D = 1, 2, ... WEIGHT_TOTAL, each share rounded to D ths, the largest
    remainders first) whose phase is within PRICE_TOLERANCE of the exact shares': (1, 10, 1), not (100, 1000,
    100), and as few uneven cuts of small parameters as the price allows; where none is (a share far below
    1 / WEIGHT_TOTAL on a very slow resource), the fastest of them and of a greedy rounding."""
    best_t = _phase_time(loads, shares)
    found, found_t = None, math.inf
    for d in range(1, WEIGHT_TOTAL + 1):
        raw = [s * d for s in shares]
        w = [math.floor(x) for x in raw]
        for j in sorted(range(len(raw)), key=lambda j: (-(raw[j] - w[j]), j))[:d - sum(w)]:
            w[j] += 1
        t = _phase_time(loads, w)
        if t < found_t * (1 - 1e-12):
            found, found_t = w, t
        if t <= best_t * (1 + PRICE_TOLERANCE):
            break
    else:
        # none within the tolerance: at the finest total, each unit left after rounding down goes where it
        # lengthens the phase least
        w = [math.floor(x * WEIGHT_TOTAL) for x in shares]
        while sum(w) < WEIGHT_TOTAL:
            j = min(range(len(w)), key=lambda j: (_phase_time(loads, w[:j] + [w[j] + 1] + w[j + 1:]), j))
            w[j] += 1
        if _phase_time(loads, w) < found_t * (1 - 1e-12):
            found = w
    g = math.gcd(*found)
    return tuple(x // g for x in found)


@functools.lru_cache(maxsize=4096)
def _weights(loads: tuple) -> tuple[int, ...]:
    """exchange_weights for the resources `_loads` found (hashable: the search prices the same holders often)."""
    h = len(loads[0][1])
    mix = _as_weights(loads, _least_max_shares([[n / rate for n in c] for rate, c in loads]))
    equal = (1,) * h
    best, best_t = equal, _phase_time(loads, equal)
    for w in [tuple(int(i == r) for i in range(h)) for r in range(h)] + [mix]:
        t = _phase_time(loads, w)
        if t < best_t * (1 - 1e-9):
            best, best_t = w, t
    return best


def exchange_weights(inventory: Inventory | None, clusters: list[str], owners=None) -> tuple[int, ...]:
    """Each holder's share of the elements it is the root of (integer weights, shard_regions.root_chunks), for
    holders on `clusters` in holder order, `owners` the number of each one's source ranks (`source_ranks`;
    default 1): (1, ..., 1) the roots take turns, a single 1 one root takes all, other weights a mix (module
    doc). Without an inventory (a plan file that stores none) the roots take turns."""
    if inventory is None or len(clusters) < 3:
        return (1,) * len(clusters)
    owners = tuple(owners) if owners is not None else (1,) * len(clusters)
    return _weights(tuple(_loads(inventory, clusters, owners)))


def source_ranks(tp: int, dp: int, distributed_optimizer: bool) -> int:
    """Ranks of a holder that own (source) a distinct part of its gradient: TP x DP shards with the distributed
    optimizer, the TP slices of DP rank 0 without it (runtime/replica_records.py's `source` records)."""
    return tp * (dp if distributed_optimizer else 1)


def run_edges(n: int, weights) -> list[tuple[int, int]]:
    """The run [lo, hi) of n elements each holder is the root of, in proportion to its integer weight: run j is
    [n W_j / W, n W_(j+1) / W), W_j the weights before j and W all of them (equal weights: [j n / H, (j + 1) n / H);
    a weight of 0 roots nothing). The one cut for the runtime (shard_regions.root_chunks) and the price."""
    total, before, edges = sum(weights), 0, []
    for w in weights:
        edges.append((n * before // total, n * (before + w) // total))
        before += w
    return edges


def describe_roots(roots: list) -> str:
    """Estimate.exchange_roots in words (the plan summary, explain): each holder's share of the elements it
    roots, per set of three or more holders. Tolerates a hand-edited plan file's malformed entries."""
    parts = []
    for r in roots:
        w = r.get("weights") if isinstance(r, dict) else None
        names = r.get("holders") if isinstance(r, dict) else None
        if (not isinstance(w, list) or not w or not isinstance(names, list) or len(names) != len(w)
                or not all(type(x) is int and x >= 0 for x in w) or not sum(w)):
            continue
        names = [str(c) for c in names]
        how = ("equal, the roots take turns" if len(set(w)) == 1 else
               ", ".join(f"{c} {x}/{sum(w)}" for c, x in zip(names, w)))
        parts.append(f"{' + '.join(names)}: {how}")
    return "gradient exchange, each holder's share of the elements it roots: " + ("; ".join(parts) or "-")
