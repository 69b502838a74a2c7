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
- `leaf_bound`: a finished layout's, raised by the layer split's rules (plan/leaf_bound.py); with `leaf_links`
  (re-planning) also by what the boundaries add to the period.
docs/search.md ("Bounds") states each with its reasoning.
"""
from __future__ import annotations

import functools
import math
import operator

from ..cost.analytic import DEFAULT_CALIBRATION
from . import costing
from .bound_terms import BoundTerms
from .constraints import bound_under_floor, devices_by_cluster, floor_ceiling, price_per_second, time_factor
from .leaf_bound import split_lower_bound
from .settings import settings_as_run

# The compute bound assumes no layer beats the analytic model's peak GEMM efficiency; a learned model may
# predict a little faster, so the bound used for pruning keeps a margin.
COMPUTE_SLACK = 0.8


def peak_rate(cluster) -> float:
    """FLOP/s of a whole cluster at the calibrated peak GEMM efficiency (no layer runs faster)."""
    cal = DEFAULT_CALIBRATION
    return cluster.num_devices * cluster.device.peak_tflops * 1e12 * cal.gemm_max_efficiency * cal.vendor(
        cluster.device.vendor)


class SpaceBounds(BoundTerms):
    """The bounds half of `SearchSpace` (which inherits it): they read the tree it defines (`decode`,
    `actions`, the TP degrees per cluster, the one-layer memory check) and share its caches."""

    def _init_bounds(self) -> None:
        """The figures every bound uses, and the bounds' caches (called by SearchSpace.__init__)."""
        model, gbs = self.model, self.gbs
        self._bounds: dict = {}
        self._child_bounds: dict = {}
        self._leaf_bounds: dict = {}
        self._joinable_compute = None       # order_bound's compute term while every cluster may still join
        self._init_terms()
        self.leaf_links = False         # leaf_bound with the boundaries' share of the period (re-planning's)
        self._flops = model.model_flops_per_token() * gbs * model.seq_length
        self._rate = {c.name: peak_rate(c) for c in self.inventory.clusters}
        # the whole iteration's activations, in the sender's precision, crossing a link once each way
        self._act_bytes = {c.name: c.device.dtype_bytes * gbs * model.seq_length * model.hidden_size
                           for c in self.inventory.clusters}
        # a time no plan beats (the FLOPs at every device's peak, with the pruning margin): what the cost
        # objective's time weight (constraints.TIME_WEIGHT) is at least where a node has no better time bound
        self._least_time = COMPUTE_SLACK * self._flops / sum(self._rate.values())
        # under --max-iteration-s, the objective no plan within it exceeds (taken once: every bound and score reads it)
        self._ceiling = floor_ceiling(self.con, self.inventory) if self.con.max_iteration_s is not None else None

    def time_lower_bound(self) -> float:
        """Model FLOPs of an iteration at the calibrated peak efficiency of every device at once (cost objective:
        at the price per FLOP of the cheapest device, the least an iteration can cost)."""
        least = self._least_time
        if self.con.objective == "cost":
            return self._under_floor(self._cost_bound(self.names, 1.0) * time_factor(least), least)
        return self._flops / sum(self._rate.values())

    def _under_floor(self, value_bound: float, seconds_bound: float) -> float:
        return bound_under_floor(self.con, self.inventory, value_bound, seconds_bound, self._ceiling)

    def _weighed(self, money: float, seconds: float) -> float:
        """A money bound as a bound on the cost objective (money x seconds^TIME_WEIGHT), given a time bound of
        the same leaves."""
        return money * time_factor(max(seconds, self._least_time)) if math.isfinite(money) else money

    def _cost_bound(self, names, slack: float) -> float:
        """Each cluster's share w of the FLOPs takes at least w / (its devices' peak rate) seconds, so it costs
        at least w x its price per FLOP; the cheapest price per FLOP of `names` bounds the whole."""
        per_flop = min(self._cl[c].price_per_device_hour / 3600 * self._cl[c].num_devices / self._rate[c]
                       for c in names)
        return slack * self._flops * per_flop

    def order_bound(self, order: tuple, complete: bool) -> float:
        """No plan whose pipeline starts with `order` (is `order`, when complete) runs faster than this."""
        if not complete:
            return self._order_bound(order, False)      # (from the order's cached figures: no cache of its own)
        key = ("order", order, complete)
        b = self._fits.get(key)
        if b is None:
            b = self._fits[key] = self._order_bound(order, complete)
        return b

    def _order_bound(self, order: tuple, complete: bool) -> float:
        all_tp, slowest_link = self._order_links(order)
        if not complete and all_tp:
            # the clusters that may still join are those with a TP degree, whatever the order: the same sum for
            # every open order (a 20-cluster inventory bounds hundreds of thousands of them)
            if self._joinable_compute is None:
                names = [c for c in self.names if self.tp[c]]
                self._joinable_compute = COMPUTE_SLACK * self._flops / sum(self._rate[c] for c in names)
            bound = self._joinable_compute
        else:
            names = order if complete else [c for c in self.names if c in order or self.tp[c]]
            bound = COMPUTE_SLACK * self._flops / sum(self._rate[c] for c in names)
        # each link of the order: the whole iteration's activations crossing it once (the largest of them, kept
        # along the order: max takes one of its arguments, so in any order the same float)
        return bound if slowest_link is None else max(bound, slowest_link)

    def leaf_bound(self, choices: tuple, ev) -> float:
        """A lower bound on the objective of a finished layout (one the tree holds or a local-search move): the
        larger of its cluster order's bound and the evaluator's own raised by the layer split's rules
        (`leaf_bound.split_lower_bound`; with `leaf_links`, by the boundaries' share of the period too). Cached:
        every climb asks it of the neighbours of its layouts."""
        key = (choices, self.leaf_links)      # a space searched cold, then re-planned, keeps both kinds apart
        b = self._leaf_bounds.get(key)
        if b is None:
            order = tuple(m.cluster for m in choices)
            b = self._leaf_bounds[key] = self.score(max(self.order_bound(order, True),
                                                            split_lower_bound(ev, choices, self.leaf_links)),
                                                        choices)
        return b

    def child_bounds(self, path: tuple) -> list:
        """[(action, bound of path + (action,))] for every legal next decision (cached: the tree search's default
        policy asks it at every level of every playout)."""
        out = self._child_bounds.get(path)
        if out is None:
            out = self._child_bounds[path] = [(a, self.bound(path + (a,))) for a in self.actions(path)]
        return out

    def bound(self, path: tuple) -> float:
        """A lower bound on the closed-form time (cost objective: money per iteration, weighed by time) of every leaf below
        `path` (cached per path)."""
        b = self._bounds.get(path)
        if b is None and path and self.stage_decision and isinstance(self.decode(path[:-1])[4], tuple):
            self._stage_bounds(path[:-1])       # a stage decision's children, all at once (cost objective)
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
                # (a mesh whose TP, or TP and DP, are decided uses TP x DP devices at least)
                names = order if complete else [c for c in self.names if c in order or self.tp[c]]
                rate = price_per_second(self.inventory, devices_by_cluster(meshes)) + sum(
                    self._cl[c].price_per_device_hour / 3600 for c in order[len(meshes):])
                if pending is not None:
                    least = pending[0] * pending[1] if isinstance(pending, tuple) else pending
                    rate += (least - 1) * self._cl[order[len(meshes)]].price_per_device_hour / 3600
                seconds = b
                b = max(self._cost_bound(names, COMPUTE_SLACK), b * rate if math.isfinite(b) else b)
                if S is not None and math.isfinite(b):
                    b = max(b, self._money_bound(*self._money_terms(order, complete, S, meshes, pending), S))
                b = self._under_floor(self._weighed(b, seconds), seconds)
            self._bounds[path] = b
        return b

    def _stage_bounds(self, path: tuple) -> None:
        """`bound` of every child of a stage decision (`path` has decided the next mesh's TP and DP; cost objective),
        in one pass: the children differ only in that mesh's stage count k, so `_pipeline_bound`'s sums over the
        other meshes and the clusters after them, and the money the other meshes pay per second, are taken once;
        a child's figures are `bound`'s (the same terms, summed in another order)."""
        order, _, S, meshes, (tp, dp) = self.decode(path)
        i = len(meshes)
        cluster = order[i]
        done = i == len(order) - 1                      # this mesh is the last: its last stage holds the head
        rest = order[i + 1:]
        L, m = self.model.num_layers, self.gbs // S
        rate0, fastest0, middle = 0.0, math.inf, []
        for j, c in enumerate(meshes):
            per = self.layer_time(c.cluster, c.tp, c.dp, c.micro_batch_size)
            rate0 += c.num_stages / per
            fastest0 = min(fastest0, per)
            middle += [per] * max(0, c.num_stages - (j == 0))
        for j, cl in enumerate(rest):
            best = self._best_shape(cl, S, self.tp[cl])
            if best is None:                            # (bound's own pass says inf too)
                return
            rate0 += best[0]
            fastest0 = min(fastest0, best[1])
            if j < len(rest) - 1:
                middle.append(best[1])
        price = self._cl[cluster].price_per_device_hour / 3600
        money0 = price_per_second(self.inventory, devices_by_cluster(meshes)) + sum(
            self._cl[c].price_per_device_hour / 3600 for c in rest)
        floor = max(self.order_bound(order, True), 0.0)
        spent, speed, quickest, options = self._money_terms(order, True, S, meshes, None, i + 1)
        cost_floor = self._cost_bound(order, COMPUTE_SLACK)
        per = self.layer_time(cluster, tp, dp, S // dp)
        fastest = min(fastest0, per)
        mid_sum, mid_n, mid_max = sum(middle), len(middle), max(middle, default=0.0)
        for k in self.actions(path):
            if k < 1:
                continue                                # a dead end: bound's own pass
            extra = max(0, k - (i == 0) - done)         # this mesh's middle stages
            n = mid_n + extra
            if n > L:
                t = math.inf
            else:
                period = max(L / (rate0 + k / per), mid_max, per if extra else 0.0)
                t = (m - 1) * period + L * fastest + (mid_sum + extra * per) - n * fastest
            t = max(floor, t)
            money = money0 + k * tp * dp * price
            b = max(cost_floor, t * money if math.isfinite(t) else t)
            if math.isfinite(b):
                b = max(b, self._money_bound(spent + k * tp * dp * price, speed + k / per, min(quickest, per),
                                             options, S))
            self._bounds[path + (k,)] = self._under_floor(self._weighed(b, t), t)

    def _money_terms(self, order, complete, S, meshes, pending, placed: int | None = None):
        """The figures `_money_bound` reads at a node whose S is decided: (money per second and stages per second
        of layer work, the least the leaves below can have: the decided meshes, and the fewest devices of every
        cluster of the order still to be placed at their fastest shape's rate per device; the least per-layer
        time of any stage; for every cluster still to be placed, (its price per unit of that rate, the money and
        the rate its other devices could add)). `placed`: the clusters of the order counted elsewhere (the meshes
        decided, unless the caller places the next one itself)."""
        spent = speed = 0.0
        quickest = math.inf
        for c in meshes:
            per = self.layer_time(c.cluster, c.tp, c.dp, c.micro_batch_size)
            spent += c.tp * c.dp * c.num_stages * self._cl[c.cluster].price_per_device_hour / 3600
            speed += c.num_stages / per
            quickest = min(quickest, per)
        rest = list(order[len(meshes) if placed is None else placed:])
        free = [] if complete else [c for c in self.names if c not in order and self.tp[c]]
        options = []
        for i, cl in enumerate(rest + free):
            if i == 0 and isinstance(pending, tuple):
                rate = self._device_rate(cl, S, None, pending)
            else:
                rate = self._device_rate(cl, S, (pending,) if i == 0 and pending is not None else tuple(self.tp[cl]))
            if rate is None:
                if i < len(rest):
                    return math.inf, 1.0, 0.0, ()
                continue
            per_device, least, per = rate
            price = self._cl[cl].price_per_device_hour / 3600
            low = least if i < len(rest) else 0            # a cluster of the order takes part; another may not
            spent += low * price
            speed += low * per_device
            quickest = min(quickest, per)
            more = self._cl[cl].num_devices - low
            if more > 0:
                options.append((price / per_device, more * price, more * per_device))
        return spent, speed, quickest, tuple(sorted(options))

    def _device_rate(self, cluster: str, S: int, tps: tuple | None, shape: tuple | None = None):
        """(the most stages per second of layer work one device of `cluster` gives in the (TP, DP) shapes the tree
        offers it at S with these TPs (or in the one `shape`), the fewest devices a mesh of them has, their least
        per-layer time), or None for no shape (cached)."""
        key = ("device rate", cluster, S, tps, shape)
        if key not in self._fits:
            shapes = (shape,) if shape is not None else self._list_shapes(cluster, S, tps)
            self._fits[key] = None if not shapes else (
                max(1 / (tp * dp * self.layer_time(cluster, tp, dp, S // dp)) for tp, dp in shapes),
                min(tp * dp for tp, dp in shapes),
                min(self.layer_time(cluster, tp, dp, S // dp) for tp, dp in shapes))
        return self._fits[key]

    def _money_bound(self, spent: float, speed: float, quickest: float, options: tuple, S: int) -> float:
        """Money per iteration, at least (cost objective): 1F1B's closed form is at least (m - 1) x the period
        plus the stage times, and the period at least L / (the pipeline's stages per second of layer work), each
        stage's layers taking their time without recomputation (`_pipeline_bound`). So money per iteration =
        T x money per second >= (m - 1) L x (money per second / stages per second) + L x the least per-layer time
        x money per second. The first ratio is at least its least over the devices the leaves below may use:
        starting from the fewest (`_money_terms`), adding the devices of each other cluster in order of their price
        per unit of rate while that lowers it (a linear-fractional minimum over boxes; each device counted at its
        cluster's best rate, which only lowers it)."""
        if not math.isfinite(spent):
            return math.inf
        L, m = self.model.num_layers, self.gbs // S
        money, rate = spent, speed
        for unit, more_money, more_rate in options:
            if rate > 0 and unit >= money / rate:
                break
            money, rate = money + more_money, rate + more_rate
        if rate <= 0:
            return 0.0
        return (m - 1) * L * money / rate + L * quickest * spent

    def _pipeline_bound(self, order, complete, S, meshes, pending) -> float:
        """1F1B's closed form is T = sum of stage times + links + (m - 1) x period. The period is at least the
        slowest stage, hence at least L / (sum over meshes of stages / per-layer time): the layers spread
        perfectly over stages that need no memory and no recomputation; and at least the per-layer time of
        every mesh with a middle stage (all but the pipeline's first and last), which holds a layer at least.
        The stage times sum to at least L x the fastest per-layer time, plus for each middle stage what its
        layer costs above the fastest."""
        m = self.gbs // S
        done = complete and len(meshes) == len(order)       # a leaf: the last mesh's last stage is an end too
        rate, fastest, middle = self._meshes_terms(meshes, done)
        middle = list(middle)           # per-layer time of each stage that must hold a layer
        rest = order[len(meshes):] if complete else [c for c in self.names if c not in order and self.tp[c]]
        for i, cl in enumerate(rest):
            if i == 0 and isinstance(pending, tuple):     # TP and DP decided, the stages not yet (cost objective)
                tp, dp = pending
                best = (self.mesh_rate(cl, tp, dp, S), self.layer_time(cl, tp, dp, S // dp))
            elif (i == 0 and pending is not None) or not complete:
                best = self._best_shape(cl, S, [pending] if i == 0 and pending is not None else self.tp[cl])
            else:   # the clusters from here on at their best shapes, from a list the node's children share
                shapes = self._rest_shapes(rest[i:], S)
                if shapes is None:
                    return math.inf
                rates, pers = shapes
                rate = functools.reduce(operator.add, rates, rate)      # (added one by one, as below)
                fastest = min(fastest, *pers)
                middle += pers[0 if meshes or i else 1:-1]
                break
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
            prof = costing.stage_profile(self.model, self._cl[cluster], tp, dp, mb, "none", self.cost,
                                         self.settings_of(tp, cluster))
            t = self._fits[key] = prof.layer_fwd + prof.layer_bwd
        return t

    def settings_of(self, tp: int, cluster: str):
        """A mesh's settings (the defaults, with the job's dropouts) as the engine planned for runs them on
        `cluster`'s devices (what the evaluator prices the tree's meshes with: settings.py `settings_as_run`)."""
        return settings_as_run(tp, self.job_settings, self.engine, self._cl[cluster].device.precision)
