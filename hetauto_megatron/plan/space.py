"""The search's decision tree, the symmetries that shrink it, and the bounds that prune it.

A plan is built by a sequence of decisions, each a level of the tree:
    the clusters taking part, in pipeline order (one decision per position, then stop);
    S, the samples per micro-batch step (= dp * micro_batch_size, equal in every mesh);
    for each mesh in pipeline order: its TP, then its DP (micro-batch = S / DP).
A mesh takes as many pipeline stages as its cluster's devices allow (devices // (TP * DP)), leaving one for
each mesh after it.

Principles prune the tree (what we know about heterogeneous training):
- TP stays inside a node and divides the attention and key/value heads.
- A mesh never spans clusters (TP and DP stay on fast links); consecutive meshes must be linked.
- Pipelines are no deeper than the layers (plus embedding and head) and the micro-batches.
- A TP/DP whose one-layer stage does not fit even with full recomputation is never expanded.
- Identical clusters (same devices, nodes and networks, and the same links to every other cluster) are
  interchangeable: the tree only offers the first unused one of each such class, so it holds one of the
  orders that differ by swapping them.
- `order_bound` is a lower bound on the iteration time of every plan whose pipeline starts with a given
  cluster order: the model's FLOPs at the calibrated peak of every cluster that could still join, and the
  whole iteration's activations crossing each slow link of the order (a link carries every micro-batch once
  each way per iteration, whatever S). The search drops subtrees whose bound is worse than a plan it holds.
"""
from __future__ import annotations

import math
import random

from ..cost.analytic import DEFAULT_CALIBRATION
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import costing, memory_fit
from .constraints import Constraints, devices_by_cluster, objective_value, price_per_second
from .evaluator import AUTO
from .leaf_bound import split_lower_bound
from .simulate import MeshChoice

END = "<end>"
# The compute bound assumes no layer beats the analytic model's peak GEMM efficiency; a learned model may
# predict a little faster, so the bound used for pruning keeps a margin.
COMPUTE_SLACK = 0.8


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def peak_rate(cluster) -> float:
    """FLOP/s of a whole cluster at the calibrated peak GEMM efficiency (no layer runs faster)."""
    cal = DEFAULT_CALIBRATION
    return cluster.num_devices * cluster.device.peak_tflops * 1e12 * cal.gemm_max_efficiency * cal.vendor(
        cluster.device.vendor)


def tp_degrees(model: ModelSpec, cluster) -> list[int]:
    """The TP degrees a cluster may run: inside one node, dividing the attention and key/value heads."""
    return [t for t in (1, 2, 4, 8, 16) if t <= min(cluster.devices_per_node, cluster.num_devices)
            and model.num_attention_heads % t == 0 and model.num_query_groups % t == 0]


class SearchSpace:
    """The decision tree: `actions(path)` lists the legal next decisions after a path of decisions."""

    def __init__(self, model: ModelSpec, inventory: Inventory, gbs: int, cost_model, max_micro_batch: int = 16,
                 constraints: Constraints | None = None):
        self.model, self.inventory, self.gbs, self.cost = model, inventory, gbs, cost_model
        self.con = con = constraints or Constraints()
        self.max_mb = max(max_micro_batch, con.micro_batch_size or 0)
        self.max_devices = min(inventory.num_devices, con.max_devices or inventory.num_devices)
        self.samples = [1 << k for k in range(inventory.num_devices.bit_length())
                        if gbs % (1 << k) == 0 and (1 << k) <= inventory.num_devices
                        and (1 << k) >= (con.micro_batch_size or 1)]
        self.tp = {c.name: [t for t in tp_degrees(model, c) if con.tp_of(c.name) in (None, t)]
                   for c in inventory.clusters}
        self.names = [c.name for c in inventory.clusters]
        self._cl = {c.name: c for c in inventory.clusters}
        self._fits: dict = {}
        self._actions: dict = {}
        self._bounds: dict = {}
        self._child_bounds: dict = {}
        self._decoded: dict = {}
        self._leaf_bounds: dict = {}
        self._pinned_rc = {c.name: con.recompute_of(c.name) for c in inventory.clusters}   # --recompute
        self.twin_of = self._symmetry_classes()
        self._twins = {k: [x for x in self.names if self.twin_of[x] == k] for k in set(self.twin_of.values())}
        flops = model.model_flops_per_token() * gbs * model.seq_length
        self._flops = flops
        self._rate = {c.name: peak_rate(c) for c in inventory.clusters}
        # the whole iteration's activations, in the sender's precision, crossing a link once each way
        self._act_bytes = {c.name: c.device.dtype_bytes * gbs * model.seq_length * model.hidden_size
                           for c in inventory.clusters}

    def _symmetry_classes(self) -> dict[str, str]:
        """cluster -> the first cluster of its class of interchangeable clusters."""
        inv = self.inventory
        first: dict[str, str] = {}
        for i, a in enumerate(inv.clusters):
            first[a.name] = a.name
            for b in inv.clusters[:i]:
                if first[b.name] != b.name:
                    continue
                same = (a.device, a.nodes, a.devices_per_node, a.intra_node, a.inter_node, a.price_per_device_hour,
                        self.con.pinned(a.name)) == (b.device, b.nodes, b.devices_per_node, b.intra_node,
                                                     b.inter_node, b.price_per_device_hour, self.con.pinned(b.name))
                if same and all(inv.link(a.name, x) == inv.link(b.name, x) for x in self.names
                                if x not in (a.name, b.name)):
                    first[a.name] = b.name
                    break
        return first

    # ---- the tree -----------------------------------------------------------------------------------------
    def mesh(self, cluster: str, tp: int, dp: int, samples: int, stages_before: int, meshes_after: int = 0,
             devices_before: int = 0) -> MeshChoice:
        """A mesh takes as many stages as its devices allow (within --max-devices), leaving one stage for each
        mesh after it. Its recomputation is the evaluator's choice unless --recompute pins it."""
        n = min(self._cl[cluster].num_devices, self.max_devices - devices_before)
        k = min(n // (tp * dp), self.max_stages(samples) - stages_before - meshes_after)
        return MeshChoice(cluster, tp, dp, samples // dp, self._pinned_rc[cluster] or AUTO, k)

    def max_stages(self, samples: int) -> int:
        """Pipeline depth limit: at most one stage per layer (plus embedding and head stages), and no more
        stages than micro-batches (beyond that 1F1B's fill and drain exceed half of the iteration); --max-pp."""
        return min(self.model.num_layers + 2, self.gbs // samples, self.con.max_pp or self.gbs)

    def score(self, seconds: float, choices) -> float:
        """What the search minimises: seconds per iteration, or for the cost objective the money per iteration
        (the devices in use times their price per second times the iteration)."""
        return objective_value(self.con, self.inventory, seconds, devices_by_cluster(choices))

    def decode(self, path: tuple):
        """-> (cluster order, order complete?, S or None, finished meshes, pending TP of the next mesh or None)
        (cached: every playout decodes its leaf)"""
        out = self._decoded.get(path)
        if out is None:
            out = self._decoded[path] = self._decode(path)
        return out

    def leaf_meshes(self, path: tuple) -> tuple | None:
        """A leaf's meshes, or None where the path is a dead end (no legal completion)."""
        order, _, _, meshes, _ = self.decode(path)
        if not meshes or len(meshes) != len(order) or min(m.num_stages for m in meshes) < 1:
            return None
        return meshes

    def _decode(self, path: tuple):
        """From the parent's decoding (cached) and the last decision: a playout extends a path one decision at
        a time, so each path is decoded once, in constant time."""
        if not path:
            return (), False, None, (), None
        order, complete, S, meshes, pending = self.decode(path[:-1])
        a = path[-1]
        if not complete:
            return (order, True, None, (), None) if a == END else (order + (a,), False, None, (), None)
        if S is None:
            return order, True, a, (), None
        if pending is None:
            return order, True, S, meshes, a
        before = sum(m.num_stages for m in meshes)
        devices = sum(m.num_stages * m.tp * m.dp for m in meshes)
        mesh = self.mesh(order[len(meshes)], pending, a, S, before, len(order) - len(meshes) - 1, devices)
        return order, True, S, meshes + (mesh,), None

    def actions(self, path: tuple) -> list:
        acts = self._actions.get(path)
        if acts is None:
            acts = self._actions[path] = self._compute_actions(path)
        return acts

    def _compute_actions(self, path: tuple) -> list:
        order, complete, S, meshes, pending = self.decode(path)
        if not complete:
            prev = order[-1] if order else None
            nxt = [c for c in self.names if c not in order and self.tp[c]
                   and self._earlier_twins_used(c, order)
                   and (prev is None or self.inventory.link(prev, c) is not None)]
            done = order and all(c in order for c in self.con.use_clusters)   # --use-clusters: all taken part
            return nxt + ([END] if done else [])
        if S is None:
            return [s for s in self.samples if self.max_stages(s) >= len(order)]
        if len(meshes) == len(order):
            return []
        cl = self._cl[order[len(meshes)]]
        if pending is None:
            return list(self.tp[cl.name])
        before = sum(m.num_stages for m in meshes)
        room = self.max_stages(S) - before - (len(order) - len(meshes) - 1)
        free = min(cl.num_devices, self.max_devices - sum(m.tp * m.dp * m.num_stages for m in meshes))
        return [d for d in divisors(S) if pending * d <= free and S // d <= self.max_mb and room >= 1
                and self._mb_ok(S // d) and self.fits_one_layer(cl.name, pending, d, S // d, self._rc(cl.name))]

    def _mb_ok(self, mb: int) -> bool:
        return self.con.micro_batch_size in (None, mb)

    def _rc(self, cluster: str) -> str:
        """The recomputation the one-layer check assumes: the pinned one, else the most generous."""
        return self._pinned_rc[cluster] or "full"

    def _earlier_twins_used(self, c: str, order) -> bool:
        """Interchangeable clusters enter the pipeline in inventory order: c only after every earlier twin."""
        twins = self._twins[self.twin_of[c]]
        return all(x in order for x in twins[:twins.index(c)])

    def fits_one_layer(self, cluster, tp, dp, mb, rc) -> bool:
        key = (cluster, tp, dp, mb, rc)
        if key not in self._fits:
            prof = costing.stage_profile(self.model, self._cl[cluster], tp, dp, mb, rc, self.cost)
            self._fits[key] = memory_fit.max_layers_in_memory(self.model, prof, 1, False, False) >= 1
        return self._fits[key]

    def mesh_rate(self, cluster: str, tp: int, dp: int, samples: int) -> float:
        """Layers per second a mesh of this shape pushes through in the steady state at best (its stages over
        the time of one layer without recomputation), for the bounds: it ignores memory beyond the one-layer
        check and the room other meshes leave."""
        key = ("rate", cluster, tp, dp, samples)
        rate = self._fits.get(key)
        if rate is None:
            k = min(self._cl[cluster].num_devices // (tp * dp), self.max_stages(samples))
            rate = self._fits[key] = k / self.layer_time(cluster, tp, dp, samples // dp)
        return rate

    def legal(self, choices: tuple) -> bool:
        """The tree's rules, checked on a finished layout (local-search moves may set stages and recompute)."""
        if not choices or any(m.cluster not in self._cl for m in choices):   # e.g. --exclude-clusters
            return False
        S = choices[0].dp * choices[0].micro_batch_size
        if sum(m.num_stages for m in choices) > self.max_stages(S):
            return False
        if S not in self.samples or len({m.cluster for m in choices}) != len(choices):
            return False
        if sum(m.tp * m.dp * m.num_stages for m in choices) > self.max_devices or not all(
                c in {m.cluster for m in choices} for c in self.con.use_clusters):
            return False
        for a, b in zip(choices, choices[1:]):
            if self.inventory.link(a.cluster, b.cluster) is None:
                return False
        for m in choices:
            n = self._cl[m.cluster].num_devices
            if (m.tp not in self.tp[m.cluster] or m.dp * m.micro_batch_size != S or m.micro_batch_size > self.max_mb
                    or m.num_stages < 1 or m.tp * m.dp * m.num_stages > n or not self._mb_ok(m.micro_batch_size)
                    or self.con.recompute_of(m.cluster) not in (None, m.recompute)
                    or not self.fits_one_layer(m.cluster, m.tp, m.dp, m.micro_batch_size,
                                               "full" if m.recompute == AUTO else m.recompute)):
                return False
        return True

    def canonical(self, choices: tuple) -> tuple:
        """The same layout with interchangeable clusters renamed so that they appear in inventory order (the
        form the tree holds). A layout on a cluster the search does not see (--exclude-clusters) is left as is."""
        if any(m.cluster not in self.twin_of for m in choices):
            return choices
        seen: dict[str, list] = {}
        out = []
        for m in choices:
            cls = self.twin_of[m.cluster]
            twins = self._twins[cls]
            used = seen.setdefault(cls, [])
            name = twins[len(used)]
            used.append(name)
            out.append(m if name == m.cluster else MeshChoice(name, m.tp, m.dp, m.micro_batch_size, m.recompute,
                                                              m.num_stages))
        return tuple(out)

    # ---- bounds -------------------------------------------------------------------------------------------
    def time_lower_bound(self) -> float:
        """Model FLOPs of an iteration at the calibrated peak efficiency of every device at once (cost objective:
        at the price per FLOP of the cheapest device, the least an iteration can cost)."""
        if self.con.objective == "cost":
            return self._cost_bound(self.names, 1.0)
        return self._flops / sum(self._rate.values())

    def _cost_bound(self, names, slack: float) -> float:
        """Each cluster's share w of the FLOPs takes at least w / (its devices' peak rate) seconds, so it costs
        at least w x its price per FLOP; the cheapest price per FLOP of `names` bounds the whole."""
        per_flop = min(self._cl[c].price_per_device_hour / 3600 * self._cl[c].num_devices / self._rate[c]
                       for c in names)
        return slack * self._flops * per_flop

    def order_bound(self, order: tuple, complete: bool) -> float:
        """No plan whose pipeline starts with `order` (is `order`, when complete) runs faster than this."""
        key = ("order", order, complete)
        b = self._fits.get(key)
        if b is None:
            b = self._fits[key] = self._order_bound(order, complete)
        return b

    def _order_bound(self, order: tuple, complete: bool) -> float:
        names = order if complete else [c for c in self.names if c in order or self.tp[c]]
        bound = COMPUTE_SLACK * self._flops / sum(self._rate[c] for c in names)
        for a, b in zip(order, order[1:]):
            bound = max(bound, self._act_bytes[a] / self.inventory.link(a, b).bytes_per_s)
        return bound

    def leaf_bound(self, choices: tuple, ev) -> float:
        """A lower bound on the objective of a finished layout (one the tree holds or a local-search move): the
        larger of its cluster order's bound and the evaluator's own raised by the layer split's rules
        (`leaf_bound.split_lower_bound`). Cached: every climb asks it of the neighbours of its layouts."""
        b = self._leaf_bounds.get(choices)
        if b is None:
            order = tuple(m.cluster for m in choices)
            b = self._leaf_bounds[choices] = self.score(max(self.order_bound(order, True),
                                                            split_lower_bound(ev, choices)), choices)
        return b

    def child_bounds(self, path: tuple) -> list:
        """[(action, bound of path + (action,))] for every legal next decision (cached: the tree search's default
        policy asks it at every level of every playout)."""
        out = self._child_bounds.get(path)
        if out is None:
            out = self._child_bounds[path] = [(a, self.bound(path + (a,))) for a in self.actions(path)]
        return out

    def bound(self, path: tuple) -> float:
        """A lower bound on the closed-form time (cost objective: money per iteration) of every leaf below
        `path` (cached per path)."""
        b = self._bounds.get(path)
        if b is None:
            order, complete, S, meshes, pending = self.decode(path)
            b = self.order_bound(order, complete)
            if S is not None:
                b = max(b, self._pipeline_bound(order, complete, S, meshes, pending))
            elif complete:
                b = max(b, min((self._pipeline_bound(order, True, s, (), None) for s in self.actions(path)),
                               default=math.inf))
            if self.con.objective == "cost":
                # money: the time bound times the least the leaves below pay per second (the meshes decided so
                # far, and one device of every other cluster of the order), and the cheapest price per FLOP
                names = order if complete else [c for c in self.names if c in order or self.tp[c]]
                rate = price_per_second(self.inventory, devices_by_cluster(meshes)) + sum(
                    self._cl[c].price_per_device_hour / 3600 for c in order[len(meshes):])
                b = max(self._cost_bound(names, COMPUTE_SLACK), b * rate if math.isfinite(b) else b)
            self._bounds[path] = b
        return b

    def _pipeline_bound(self, order, complete, S, meshes, pending) -> float:
        """1F1B's closed form is T = sum of stage times + links + (m - 1) x period. The period is at least the
        slowest stage, hence at least L / (sum over meshes of stages / per-layer time): the layers spread
        perfectly over stages that need no memory and no recomputation; and at least the per-layer time of
        every mesh with a middle stage (all but the pipeline's first and last), which holds a layer at least.
        The stage times sum to at least L x the fastest per-layer time, plus for each middle stage what its
        layer costs above the fastest."""
        m = self.gbs // S
        rate, fastest = 0.0, math.inf
        middle = []                     # per-layer time of each stage that must hold a layer
        done = complete and len(meshes) == len(order)       # a leaf: the last mesh's last stage is an end too
        for i, c in enumerate(meshes):
            per = self.layer_time(c.cluster, c.tp, c.dp, c.micro_batch_size)
            rate += c.num_stages / per
            fastest = min(fastest, per)
            middle += [per] * max(0, c.num_stages - (i == 0) - (done and i == len(meshes) - 1))
        rest = order[len(meshes):] if complete else [c for c in self.names if c not in order and self.tp[c]]
        for i, cl in enumerate(rest):
            tps = [pending] if i == 0 and pending is not None else self.tp[cl]
            best = self._best_shape(cl, S, tps)
            if best is None:
                if complete:
                    return math.inf
                continue
            rate += best[0]
            fastest = min(fastest, best[1])
            if complete and i < len(rest) - 1 and (meshes or i > 0):
                middle.append(best[1])  # a mesh before the last, not the first: its stages are middle ones
        if rate <= 0:
            return math.inf
        L = self.model.num_layers
        if len(middle) > L:
            return math.inf
        # (The links' share is order_bound's: their bytes. Their latency is not a bound: an overlapped
        # boundary keeps several micro-batches in flight, so latencies overlap.)
        period = max(L / rate, max(middle, default=0.0))
        return (m - 1) * period + L * fastest + sum(middle) - len(middle) * fastest

    def _best_shape(self, cluster: str, S: int, tps) -> tuple[float, float] | None:
        """(best mesh_rate, least layer_time) over the cluster's shapes for S and these TPs; None if it has none
        (cached: every bound asks it for every cluster still to be placed)."""
        key = ("best", cluster, S, tuple(tps))
        if key not in self._fits:
            shapes = self._list_shapes(cluster, S, tps)
            self._fits[key] = None if not shapes else (
                max(self.mesh_rate(cluster, tp, dp, S) for tp, dp in shapes),
                min(self.layer_time(cluster, tp, dp, S // dp) for tp, dp in shapes))
        return self._fits[key]

    def _list_shapes(self, cluster: str, S: int, tps) -> list[tuple[int, int]]:
        n = self._cl[cluster].num_devices
        return [(tp, d) for tp in tps for d in divisors(S) if tp * d <= n and S // d <= self.max_mb
                and self._mb_ok(S // d) and self.fits_one_layer(cluster, tp, d, S // d, self._rc(cluster))]

    def layer_time(self, cluster: str, tp: int, dp: int, mb: int) -> float:
        """Forward + backward of one layer without recomputation (the fastest a layer of this shape runs)."""
        key = ("layer", cluster, tp, dp, mb)
        t = self._fits.get(key)
        if t is None:
            prof = costing.stage_profile(self.model, self._cl[cluster], tp, dp, mb, "none", self.cost)
            t = self._fits[key] = prof.layer_fwd + prof.layer_bwd
        return t

    def estimate_leaves(self, rng: random.Random, probes: int = 64) -> float:
        """Knuth's estimator of the number of leaves: the product of branching factors along random paths."""
        total = 0.0
        for _ in range(probes):
            path, width = (), 1.0
            while True:
                acts = self.actions(path)
                if not acts:
                    break
                width *= len(acts)
                path = path + (rng.choice(acts),)
            total += width
        return total / probes


def leaves(space: SearchSpace, limit: int | None = None) -> list[tuple]:
    """Every leaf of the decision tree in depth-first order (stops after limit + 1 leaves when a limit is given)."""
    out, stack = [], [()]
    while stack:
        path = stack.pop()
        acts = space.actions(path)
        if not acts:
            out.append(path)
            if limit is not None and len(out) > limit:
                break
        else:
            stack.extend(path + (a,) for a in reversed(acts))
    return out
