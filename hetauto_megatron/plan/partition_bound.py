"""The bound that keeps the search over pipelines cheap (plan/multi_search.py): the partitions of the clusters into
pipelines, and a lower bound on the iteration of any plan whose pipelines use exactly given blocks of clusters.
Pure functions of the model, the inventory and the batch (no search, no simulation)."""
from __future__ import annotations

import itertools
import math

from ..cost.model_state import grad_buffer_bytes
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import costing
from .settings import default_settings
from .space import tp_degrees
from .space_bounds import COMPUTE_SLACK, peak_rate


def set_partitions(items: list):
    """Every partition of `items` into blocks (lists), each once."""
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[head]] + part
        for i in range(len(part)):
            yield part[:i] + [[head] + part[i]] + part[i + 1:]


def set_partitions_into(items: list, k: int):
    """Every partition of `items` into exactly k blocks (lists), each once."""
    if k <= 0 or k > len(items):
        if k == 0 and not items:
            yield []
        return
    head, rest = items[0], items[1:]
    for part in set_partitions_into(rest, k - 1):      # head alone
        yield [[head]] + part
    for part in set_partitions_into(rest, k):          # head joins one of the k blocks of the rest
        for i in range(k):
            yield part[:i] + [[head] + part[i]] + part[i + 1:]


# The exact subset programme of _bottleneck_path holds 2^n bitsets per threshold: 20 clusters ran for minutes,
# 200 raised OverflowError. Beyond this many clusters in one block a cheaper, still valid, bound is used.
EXACT_PATH_MAX = 8


def _joined(adj: list) -> bool:
    """Whether the links `adj` (per cluster, its neighbours) join every cluster (a walk from the first)."""
    seen, todo = {0}, [0]
    while todo:
        for j in adj[todo.pop()]:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return len(seen) == len(adj)


def _bottleneck_spanning_tree(n: int, bw: dict) -> float:
    """The narrowest link of the widest spanning tree (Kruskal, widest links first); 0 when the block is not
    connected (then no order through it exists either)."""
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    joined, narrowest = 1, math.inf
    for (i, j), b in sorted(bw.items(), key=lambda kv: -kv[1]):
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[ri] = rj
            joined += 1
            narrowest = min(narrowest, b)
            if joined == n:
                return narrowest
    return 0.0 if n > 1 else math.inf


class PartitionBound:
    """A lower bound on the iteration of any plan whose pipelines use exactly these blocks of clusters.

    Pipelines: block X alone would take at least c_X = max(its FLOPs share of the whole batch at the peak rate of
    its clusters, the whole batch's activations over the slowest link of the best order through its clusters)
    for the whole batch (both are proportional to its share s_X), so the slowest pipeline takes at least
    min over shares of max_X c_X s_X = 1 / sum_X (1 / c_X). Gradient exchange, after the pipelines (as
    runtime/replica_sync.py runs it, plan/multi_simulate.py prices it): with two pipelines every parameter has
    two holders, whose gradients (gradient-reduce dtype) cross once each way at once (full-duplex links): at
    least G / (the links joining the two blocks, all at once at best); with three or more each pipeline roots a
    share of every parameter, which every other pipeline sends it and gets back summed, one phase after the
    other: at least 2 G / sum over pipelines R of (the bandwidth of R's slowest cut to another) (`_sync`). The
    slowest link of the inventory stands in where a pair of clusters has none, as the pricing does. The plan
    makes pipeline 0 the block whose slowest cut is fastest (`root`).

    `tight(blocks)` is a second, tighter bound for the few partitions the search is about to search (`__call__`
    stays the cheap one that bounds and orders all of them); see its docstring. It needs `cost_model` (the one the
    plans are priced with) and the largest micro-batch the search may choose."""

    def __init__(self, model: ModelSpec, inventory: Inventory, gbs: int, cost_model=None,
                 max_micro_batch: int = 16):
        self.inventory = inventory
        self.model, self.gbs, self.cost, self.max_mb = model, gbs, cost_model, max_micro_batch
        self._layer_rates: dict = {}
        self.flops = model.model_flops_per_token() * gbs * model.seq_length
        self.rate = {c.name: peak_rate(c) for c in inventory.clusters}
        # every pipeline holds every parameter; gradients travel in the gradient buffer's dtype as the search's
        # meshes run it (the default settings), the smallest of the clusters' element sizes
        self.grad_bytes = model.total_params * min(
            grad_buffer_bytes(c.device.dtype_bytes, default_settings(1)) for c in inventory.clusters)
        self.act_bytes = {c.name: c.device.dtype_bytes * gbs * model.seq_length * model.hidden_size
                          for c in inventory.clusters}
        slowest = min((inventory.link(*sorted(k)) for k in inventory.links), key=lambda x: x.bytes_per_s,
                      default=None)
        self.fallback = slowest.bytes_per_s if slowest is not None else 0.0
        self._cost: dict = {}

    def block_cost(self, block) -> float:
        """c_X: the least time pipeline X would take for the whole global batch (cached per block)."""
        key = frozenset(block)
        c = self._cost.get(key)
        if c is None:
            c = COMPUTE_SLACK * self.flops / sum(self.rate[x] for x in block)
            if len(block) > 1:
                bw = self._bottleneck_path(sorted(block))
                c = max(c, min(self.act_bytes[x] for x in block) / bw if bw > 0 else math.inf)
            self._cost[key] = c
        return c

    def _bottleneck_path(self, block: list) -> float:
        """The largest b such that an order through every cluster of the block uses only links of at least b
        bytes/s (0 when no order exists): thresholds tried from the fastest link down, each checked with the
        subset dynamic programme for a Hamiltonian path."""
        n = len(block)
        bw = {}
        for i, j in itertools.combinations(range(n), 2):
            link = self.inventory.link(block[i], block[j])
            if link is not None:
                bw[i, j] = bw[j, i] = link.bytes_per_s
        if n > EXACT_PATH_MAX:
            # 2^n states: for many clusters take the widest spanning tree's narrowest link instead. Every
            # Hamiltonian path is a spanning tree, so this is >= the exact value and the bound stays a lower bound
            return _bottleneck_spanning_tree(n, bw)
        for t in sorted(set(bw.values()), reverse=True):
            adj = [[j for j in range(n) if bw.get((i, j), 0.0) >= t] for i in range(n)]
            # what decides without the programme: no path through a cluster without a link or through clusters
            # not joined at all; and every cluster linked to half of them or more is a cycle through all (Dirac)
            if min(map(len, adj)) == 0 or not _joined(adj):
                continue
            if 2 * min(map(len, adj)) >= n:
                return t
            reach = [0] * (1 << n)          # reach[mask]: bitset of end clusters of a path covering mask
            for i in range(n):
                reach[1 << i] |= 1 << i
            for mask in range(1, 1 << n):
                ends = reach[mask]
                if not ends:
                    continue
                for i in range(n):
                    if ends >> i & 1:
                        for j in adj[i]:
                            if not mask >> j & 1:
                                reach[mask | 1 << j] |= 1 << j
            if reach[(1 << n) - 1]:
                return t
        return 0.0

    def _cap(self, a, b, staircase: bool = False) -> float:
        """Bytes per second between two blocks at best: every link joining them at once (each pair of clusters
        without a link uses the inventory's slowest one, as the pricing does, link_costs.link_between: one more
        link per such pair). `staircase`: only the len(a) + len(b) - 1 fastest pairs (`tight`), two more with
        tied embeddings (the table's holders are both ends of each pipeline: first with last are pairs too)."""
        if staircase:
            caps = sorted((self.fallback if link is None else link.bytes_per_s
                           for link in (self.inventory.link(x, y) for x in a for y in b)), reverse=True)
            return sum(caps[:len(a) + len(b) - 1 + 2 * bool(self.model.tie_embeddings)])
        cap = 0.0
        for x in a:
            for y in b:
                link = self.inventory.link(x, y)
                cap += self.fallback if link is None else link.bytes_per_s
        return cap

    def _pair_time(self, a, b, staircase: bool = False) -> float:
        """Seconds for the whole gradient buffer between two blocks at best (every link joining them at once)."""
        cap = self._cap(a, b, staircase)
        return self.grad_bytes / cap if cap > 0 else math.inf

    def root(self, blocks: list) -> int:
        """The block to make pipeline 0: the one whose slowest cut to another block is the fastest (an order only:
        the exchange's price does not depend on it)."""
        return min(range(len(blocks)), key=lambda r: (self._slowest_cut(blocks, r), r))

    def _slowest_cut(self, blocks: list, r: int, staircase: bool = False) -> float:
        """Seconds for the whole gradient buffer over block r's slowest cut to another block."""
        return max((self._pair_time(blocks[r], b, staircase) for i, b in enumerate(blocks) if i != r), default=0.0)

    def _sync(self, blocks: list, staircase: bool = False) -> float:
        """The gradient exchange among the blocks' pipelines at best (plan/holders_exchange.py holders_sync_time): two
        holders swap the whole buffer in one phase, both directions at once; H >= 3 in two phases, each block r
        the root of a share s_r of it (plan/exchange_roots.py chooses the shares), which every other block sends
        it over their cut in each phase: a phase lasts at least s_r times the slowest other block's cut to r, for
        every r, and with the shares summing to 1 at least 1 / sum_r (1 / that slowest cut) (below the roots
        taking turns and one root taking all, the shares' extremes)."""
        h = len(blocks)
        if h < 2:
            return 0.0
        if h == 2:
            return self._pair_time(*blocks, staircase)
        rates = 0.0
        for r in range(h):
            slowest = self._slowest_cut(blocks, r, staircase)
            rates += 1 / slowest if slowest > 0 else math.inf
        return 2 / rates if rates > 0 else math.inf

    def __call__(self, blocks: list) -> float:
        inv_sum = sum(1 / c for c in (self.block_cost(b) for b in blocks) if c < math.inf)
        if any(self.block_cost(b) == math.inf for b in blocks) or inv_sum <= 0:
            return math.inf
        return 1 / inv_sum + self._sync(blocks)

    def tight(self, blocks: list) -> float:
        """A tighter lower bound than `__call__` on the plans the search builds for these blocks (one mesh per
        cluster in each pipeline, `_search_partition`), at least `__call__`; worth its cost only on the few
        partitions about to be searched. Two terms are raised:

        - the exchange: a parameter block's gradient crosses one pair of clusters (its holder in one pipeline,
          its holder in the other). Along the layers both holders only move forward through their pipelines'
          cluster orders, so the pairs used form a staircase of at most len(a) + len(b) - 1 distinct pairs,
          whatever the orders. A phase lasts as long as its busiest pair, at least the bytes over the capacity of
          the pairs used: at most the len(a) + len(b) - 1 fastest pairs (+ 2 for a tied table, held at both
          ends of each pipeline), not all len(a) x len(b) of them. On a
          chain of clusters almost every pair has no link and stood in at the slowest link: two blocks of 3 and
          17 clusters counted 51 such paths where a plan uses 19 at most (the bound's exchange 4.3 s, the plan's
          85.7 s; the partition took most of a 20-cluster plan's search to find that out);
        - the pipelines: a stage runs its m micro-batch steps one after another, so a pipeline takes at least m x
          its slowest stage >= m L / (sum over stages of 1 / per-layer time), whatever the layer split. A stage of
          a mesh (TP t, DP d, micro-batch b) runs d b samples per step through a layer in its per-layer time
          `lt` (no recomputation: the fastest), and a cluster's N devices hold at most N / (t d) such stages: a
          pipeline training s samples takes at least s L / sum over its clusters of N x (the best b / (t lt) over
          the TP degrees and micro-batches the search offers), linear in s like the FLOPs bound it raises (the
          cost model's own layer times instead of the peak rate with COMPUTE_SLACK)."""
        costs = [max(self.block_cost(b), self.work_cost(b)) for b in blocks]
        if any(c == math.inf for c in costs):
            return math.inf
        return 1 / sum(1 / c for c in costs) + self._sync(blocks, staircase=True)

    def work_cost(self, block) -> float:
        """The least time one pipeline through `block` takes for the whole global batch by its stages' layer work
        (`tight`); 0 without a cost model."""
        if self.cost is None:
            return 0.0
        rate = sum(self.inventory.cluster(x).num_devices * self._layer_rate(x) for x in block)
        return self.gbs * self.model.num_layers / rate if rate > 0 else math.inf

    def _layer_rate(self, name: str) -> float:
        """Sample-layers (forward and backward) one device of the cluster runs per second at best: the largest
        b / (TP x per-layer time) over the TP degrees and every micro-batch b up to the largest the search may give
        (a superset of the shapes it offers, odd micro-batches among them: space.step_sizes; per-layer time does not
        depend on DP)."""
        r = self._layer_rates.get(name)
        if r is None:
            c, r = self.inventory.cluster(name), 0.0
            for tp in tp_degrees(self.model, c):
                for mb in range(1, self.max_mb + 1):
                    prof = costing.stage_profile(self.model, c, tp, 1, mb, "none", self.cost, default_settings(tp))
                    r = max(r, mb / (tp * (prof.layer_fwd + prof.layer_bwd)))
            self._layer_rates[name] = r
        return r
