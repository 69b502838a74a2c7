"""The bounds that prune the search's decision tree (plan/space.py): lower bounds on every leaf below a node.

The tree search (plan/mcts.py) closes a node whose bound is no better than the best plan it holds, and the
bounded enumeration (plan/search.py) visits nodes in the order of their bounds; a bound must therefore never
exceed the value of a leaf below it (tests/test_plan_search_bounds.py, test_plan_objective.py check that on
thousands of leaves). They live apart from the tree because they are the part that needs the cost model's
per-layer times and the peak FLOP rates, while the tree itself is only which decisions are legal.

- `order_bound`: no plan whose pipeline starts with a given cluster order is faster than the model's FLOPs at
  the calibrated peak of every cluster that could still join, nor than the whole iteration's activations
  crossing each slow link of the order (a link carries every micro-batch once each way per iteration,
  whatever S).
- `bound`: once S is chosen, 1F1B's closed form bounds the rest (`_pipeline_bound`); for the cost objective,
  the time bound times the least the leaves below pay per second, and the cheapest price per FLOP.
- `leaf_bound`: a finished layout's, raised by the layer split's rules (plan/leaf_bound.py).
docs/search.md ("Bounds") states each with its reasoning.
"""
from __future__ import annotations

import math

from ..cost.analytic import DEFAULT_CALIBRATION
from . import costing
from .constraints import devices_by_cluster, price_per_second
from .leaf_bound import split_lower_bound

# The compute bound assumes no layer beats the analytic model's peak GEMM efficiency; a learned model may
# predict a little faster, so the bound used for pruning keeps a margin.
COMPUTE_SLACK = 0.8


def peak_rate(cluster) -> float:
    """FLOP/s of a whole cluster at the calibrated peak GEMM efficiency (no layer runs faster)."""
    cal = DEFAULT_CALIBRATION
    return cluster.num_devices * cluster.device.peak_tflops * 1e12 * cal.gemm_max_efficiency * cal.vendor(
        cluster.device.vendor)


class SpaceBounds:
    """The bounds half of `SearchSpace` (which inherits it): they read the tree it defines (`decode`,
    `actions`, the TP degrees per cluster, the one-layer memory check) and share its caches."""

    def _init_bounds(self) -> None:
        """The figures every bound uses, and the bounds' caches (called by SearchSpace.__init__)."""
        model, gbs = self.model, self.gbs
        self._bounds: dict = {}
        self._child_bounds: dict = {}
        self._leaf_bounds: dict = {}
        self._flops = model.model_flops_per_token() * gbs * model.seq_length
        self._rate = {c.name: peak_rate(c) for c in self.inventory.clusters}
        # the whole iteration's activations, in the sender's precision, crossing a link once each way
        self._act_bytes = {c.name: c.device.dtype_bytes * gbs * model.seq_length * model.hidden_size
                           for c in self.inventory.clusters}

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

    def layer_time(self, cluster: str, tp: int, dp: int, mb: int) -> float:
        """Forward + backward of one layer without recomputation (the fastest a layer of this shape runs)."""
        key = ("layer", cluster, tp, dp, mb)
        t = self._fits.get(key)
        if t is None:
            prof = costing.stage_profile(self.model, self._cl[cluster], tp, dp, mb, "none", self.cost)
            t = self._fits[key] = prof.layer_fwd + prof.layer_bwd
        return t
