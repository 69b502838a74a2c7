"""Strategy search: Monte-Carlo tree search (UCT) over a plan's sequential decisions, and an exhaustive mode.

A plan is built by a sequence of decisions, each a level of the tree:
    the clusters taking part, in pipeline order (one decision per position, then stop);
    S, the samples per micro-batch step (= dp * micro_batch_size, equal in every mesh);
    for each mesh in pipeline order: its TP, then its DP (micro-batch = S / DP).
The coarse, most consequential choices (which sites, which slow links) sit at the top of the tree, where UCT
spreads its playouts over them.
A mesh takes as many pipeline stages as its cluster's devices allow (devices // (TP * DP)), and the lightest
recomputation that lets the layer split fit in memory. A leaf is thus a list of `MeshChoice`; its value is
the iteration time after the exact layer split (plan/split.py).

Principles prune and order the tree (what we know about heterogeneous training):
- TP stays inside a node and divides the attention and key/value heads.
- Slow links carry only pipeline traffic: a mesh never spans clusters (TP and DP stay on fast links), so the
  only cross-cluster traffic is one activation per micro-batch at a pipeline boundary.
- Consecutive meshes must be linked in the inventory; the default policy prefers the fastest next link.
- Pipelines are no deeper than the layers (plus embedding and head) and the micro-batches.
- Memory-infeasible branches die early: a TP/DP whose single-layer stage does not fit even with full
  recomputation is never expanded.

Leaves are screened with the closed-form 1F1B model (microseconds); after the tree search a local search
changes one decision at a time around the best leaves (TP, DP, stage count, recomputation, order, adding or
dropping a cluster, S), and the best distinct layouts are re-ranked with the event simulation.
Trees with at most twice the playout budget's leaves are enumerated instead (cheaper, and exact).
Everything is driven by one seeded random generator and an iteration budget, so the same inputs and seed give
the same plan; `budget_s` only stops the tree search early (the result then says it was cut).
"""
from __future__ import annotations

import itertools
import math
import random
import sys
import time
from dataclasses import dataclass, field, replace

from ..cost.analytic import AnalyticCostModel, DEFAULT_CALIBRATION
from ..errors import InfeasibleError, InputError
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import costing
from .plan import RECOMPUTE_MODES
from .simulate import SCHEDULES, MeshChoice, evaluate_layout

RECOMPUTE = RECOMPUTE_MODES       # in the order the evaluator raises them
AUTO = "auto"          # recomputation still to be chosen by the evaluator
END = "<end>"


@dataclass
class SearchConfig:
    method: str = "mcts"               # "mcts" | "exhaustive"
    iterations: int = 0                # MCTS playouts; 0 -> chosen from the problem size
    budget_s: float | None = None      # wall-clock cap on the tree search
    seed: int = 0
    rerank: int = 24                   # best distinct leaves re-evaluated with the event simulation
    schedule: str = "blocking"         # cross-cluster boundaries: "blocking" or "overlapped" (depth chosen per layout)
    max_micro_batch: int = 16
    exploration: float = 0.7
    local_search: bool = True
    progress: bool = False             # progress lines on stderr


@dataclass
class SearchResult:
    choices: list[MeshChoice]
    stage_layers: list[int]
    iteration_time_s: float
    seconds: float
    candidates_evaluated: int
    method: str
    cut_by_budget: bool = False
    iterations: int = 0
    # every layout the event simulation re-checked, best first: (iteration s, choices, stage_layers); the
    # first is the result, the next ones are the runners-up `hetauto explain` shows
    ranked: list = field(default_factory=list)
    boundaries: tuple | None = None    # per mesh, the boundary after it: None (blocking) or the overlapped depth

    def to_dict(self) -> dict:
        return {"method": self.method, "seconds": round(self.seconds, 3), "candidates_evaluated":
                self.candidates_evaluated, "playouts": self.iterations, "cut_by_budget": self.cut_by_budget}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class SearchSpace:
    """The decision tree: `actions(path)` lists the legal next decisions after a path of decisions."""

    def __init__(self, model: ModelSpec, inventory: Inventory, gbs: int, cost_model, max_micro_batch: int = 16,
                 schedule: str = "blocking"):
        self.model, self.inventory, self.gbs, self.cost = model, inventory, gbs, cost_model
        self.schedule = schedule
        self.max_mb = max_micro_batch
        self.samples = [1 << k for k in range(inventory.num_devices.bit_length())
                        if gbs % (1 << k) == 0 and (1 << k) <= inventory.num_devices]
        self.tp = {c.name: [t for t in (1, 2, 4, 8, 16) if t <= min(c.devices_per_node, c.num_devices)
                            and model.num_attention_heads % t == 0 and model.num_query_groups % t == 0]
                   for c in inventory.clusters}
        self._fits: dict = {}

    def mesh(self, cluster: str, tp: int, dp: int, samples: int, stages_before: int, meshes_after: int = 0
             ) -> MeshChoice:
        """A mesh takes as many stages as its devices allow, leaving one stage for each mesh after it."""
        n = self.inventory.cluster(cluster).num_devices
        k = min(n // (tp * dp), self.max_stages(samples) - stages_before - meshes_after)
        return MeshChoice(cluster, tp, dp, samples // dp, AUTO, k)

    def max_stages(self, samples: int) -> int:
        """Pipeline depth limit: at most one stage per layer (plus embedding and head stages), and no more
        stages than micro-batches (beyond that 1F1B's fill and drain exceed half of the iteration)."""
        return min(self.model.num_layers + 2, self.gbs // samples)

    def decode(self, path: tuple):
        """-> (cluster order, order complete?, S or None, finished meshes, pending TP of the next mesh or None)"""
        order = []
        i = 0
        while i < len(path) and path[i] != END:
            order.append(path[i])
            i += 1
        if i == len(path):
            return tuple(order), False, None, (), None
        if i + 1 == len(path):
            return tuple(order), True, None, (), None
        S = path[i + 1]
        rest = path[i + 2:]
        meshes = []
        for j in range(0, len(rest) - 1, 2):
            before = sum(m.num_stages for m in meshes)
            meshes.append(self.mesh(order[len(meshes)], rest[j], rest[j + 1], S, before, len(order) - len(meshes) - 1))
        pending = rest[-1] if len(rest) % 2 else None
        return tuple(order), True, S, tuple(meshes), pending

    def actions(self, path: tuple) -> list:
        order, complete, S, meshes, pending = self.decode(path)
        if not complete:
            prev = order[-1] if order else None
            nxt = [c.name for c in self.inventory.clusters if c.name not in order and self.tp[c.name]
                   and (prev is None or self.inventory.link(prev, c.name) is not None)]
            return nxt + ([END] if order else [])
        if S is None:
            return [s for s in self.samples if self.max_stages(s) >= len(order)]
        if len(meshes) == len(order):
            return []
        cl = self.inventory.cluster(order[len(meshes)])
        if pending is None:
            return [t for t in self.tp[cl.name]]
        before = sum(m.num_stages for m in meshes)
        room = self.max_stages(S) - before - (len(order) - len(meshes) - 1)
        return [d for d in _divisors(S) if pending * d <= cl.num_devices and S // d <= self.max_mb and room >= 1
                and self.fits_one_layer(cl.name, pending, d, S // d, "full")]

    def fits_one_layer(self, cluster, tp, dp, mb, rc) -> bool:
        key = (cluster, tp, dp, mb, rc)
        if key not in self._fits:
            prof = costing.stage_profile(self.model, self.inventory.cluster(cluster), tp, dp, mb, rc, self.cost)
            self._fits[key] = costing.max_layers_in_memory(self.model, prof, 1, False, False) >= 1
        return self._fits[key]

    def legal(self, choices: tuple) -> bool:
        """The tree's rules, checked on a finished layout (local-search moves may set stages and recompute)."""
        if not choices:
            return False
        S = choices[0].dp * choices[0].micro_batch_size
        if sum(m.num_stages for m in choices) > self.max_stages(S):
            return False
        if S not in self.samples or len({m.cluster for m in choices}) != len(choices):
            return False
        for a, b in zip(choices, choices[1:]):
            if self.inventory.link(a.cluster, b.cluster) is None:
                return False
        for m in choices:
            n = self.inventory.cluster(m.cluster).num_devices
            if (m.tp not in self.tp[m.cluster] or m.dp * m.micro_batch_size != S or m.micro_batch_size > self.max_mb
                    or m.num_stages < 1 or m.tp * m.dp * m.num_stages > n
                    or not self.fits_one_layer(m.cluster, m.tp, m.dp, m.micro_batch_size,
                                               "full" if m.recompute == AUTO else m.recompute)):
                return False
        return True


class _Evaluator:
    """Closed-form value of a layout, resolving AUTO recomputation: start with none, and raise the level of
    the mesh that runs out of memory until the split fits (or nothing is left to raise)."""

    def __init__(self, space: SearchSpace):
        self.space = space
        self.cache: dict = {}
        self.best_infeasible = None     # (shortfall GiB, where)

    def resolve(self, choices: tuple) -> tuple[float, tuple]:
        if choices in self.cache:
            return self.cache[choices]
        sp = self.space
        auto = [m.recompute == AUTO for m in choices]
        cur = tuple(replace(m, recompute="none") if a else m for m, a in zip(choices, auto))
        while True:
            res = evaluate_layout(sp.model, sp.inventory, list(cur), sp.gbs, sp.cost, exact=False,
                                  schedule=sp.schedule)
            if res.stage_layers is not None:
                out = (res.iteration_time_s, cur)
                break
            # raise the short mesh's recomputation if we may, else any other AUTO mesh still below full
            order = [res.short_mesh] + [i for i in range(len(cur)) if i != res.short_mesh]
            raise_at = next((i for i in order if auto[i] and cur[i].recompute != "full"), None)
            if raise_at is None:
                if self.best_infeasible is None or res.shortfall_gib < self.best_infeasible[0]:
                    self.best_infeasible = (res.shortfall_gib, res.short_device)
                out = (math.inf, cur)
                break
            nxt = RECOMPUTE[RECOMPUTE.index(cur[raise_at].recompute) + 1]
            cur = cur[:raise_at] + (replace(cur[raise_at], recompute=nxt),) + cur[raise_at + 1:]
        self.cache[choices] = out
        return out

    def exact(self, choices: tuple):
        sp = self.space
        return evaluate_layout(sp.model, sp.inventory, list(choices), sp.gbs, sp.cost, exact=True,
                               schedule=sp.schedule)


class _Node:
    __slots__ = ("visits", "total", "best", "children", "untried", "done")

    def __init__(self, untried: list):
        self.visits, self.total, self.best = 0, 0.0, 0.0
        self.children: list = []
        self.untried = untried
        self.done = not untried          # a leaf, or later: every child subtree fully explored


def _leaves(space: SearchSpace, limit: int | None = None) -> list[tuple]:
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


def _uct(node: _Node, ln_parent: float, c: float, lo: float, span: float) -> float:
    """Mean and best reward of the subtree, rescaled to [0, 1] over the rewards seen so far (good plans differ
    by a few percent, which an unscaled reward would drown in the exploration term), plus exploration."""
    value = (0.5 * node.total / node.visits + 0.5 * node.best - lo) / span
    return value + c * math.sqrt(ln_parent / node.visits)


def _rollout_action(space: SearchSpace, path: tuple, acts: list, rng: random.Random):
    """Default policy: random, steered by the principles: keep adding clusters (each adds compute), preferably
    over the fastest link from the last one."""
    order, complete, _, _, _ = space.decode(path)
    if not complete:
        real = [a for a in acts if a != END]
        if not real or (END in acts and rng.random() < 0.2):
            return END
        if order and rng.random() < 0.6:
            return max(real, key=lambda c: space.inventory.link(order[-1], c).bandwidth_gbps)
        return rng.choice(real)
    return rng.choice(acts)


def _time_lower_bound(model: ModelSpec, inventory: Inventory, gbs: int) -> float:
    """Model FLOPs of an iteration at the calibrated peak efficiency of every device at once."""
    cal = DEFAULT_CALIBRATION
    rate = sum(c.num_devices * c.device.peak_tflops * 1e12 * cal.gemm_max_efficiency * cal.vendor(c.device.vendor)
               for c in inventory.clusters)
    return model.model_flops_per_token() * gbs * model.seq_length / rate


def default_iterations(inventory: Inventory) -> int:
    return 300 + 100 * len(inventory.clusters) ** 3


def search(model: ModelSpec, inventory: Inventory, gbs: int, cost_model=None,
           config: SearchConfig | None = None) -> SearchResult:
    cfg = config or SearchConfig()
    cost = cost_model or AnalyticCostModel()
    if gbs < 1:
        raise InputError(f"must be at least 1, got {gbs}", field="--global-batch-size")
    if cfg.method not in ("mcts", "exhaustive"):
        raise InputError(f"unknown search method {cfg.method!r}", field="--search", fix="use mcts or exhaustive")
    if cfg.schedule not in SCHEDULES:
        raise InputError(f"unknown boundary schedule {cfg.schedule!r}", field="--boundary-schedule",
                         fix="use blocking or overlapped")
    space = SearchSpace(model, inventory, gbs, cost, cfg.max_micro_batch, cfg.schedule)
    if not any(space.tp.values()):
        raise InputError(f"no TP degree up to the node size divides the model's {model.num_attention_heads} "
                         f"attention heads and {model.num_query_groups} key/value heads", field="model",
                         fix="check num_attention_heads and num_query_groups")
    ev = _Evaluator(space)
    t0 = time.perf_counter()
    leaves: dict[tuple, float] = {}      # layout as decided (AUTO recompute) -> closed-form time
    playouts, cut = 0, False

    def value(path: tuple) -> float:
        order, _, _, meshes, _ = space.decode(path)
        if not meshes or len(meshes) != len(order) or min(m.num_stages for m in meshes) < 1:
            return math.inf             # a dead end: no legal completion
        leaves[meshes] = ev.resolve(meshes)[0]
        return leaves[meshes]

    n_iter = cfg.iterations or default_iterations(inventory)
    method = cfg.method
    if method == "mcts" and not cfg.iterations and len(_leaves(space, limit=2 * n_iter)) <= 2 * n_iter:
        method = "exhaustive"          # a tree this small costs fewer evaluations to enumerate than to sample
    if method == "exhaustive":
        for path in _leaves(space):
            value(path)
            playouts += 1
    else:
        rng = random.Random(cfg.seed)
        t_lb = _time_lower_bound(model, inventory, gbs)
        nodes: dict[tuple, _Node] = {(): _Node(space.actions(()))}
        best_t, last_report = math.inf, t0
        r_lo, r_hi = 1.0, 0.0           # range of the feasible rewards seen so far
        for it in range(n_iter):
            if nodes[()].done:
                break                  # the whole tree has been explored
            if cfg.budget_s is not None and leaves and time.perf_counter() - t0 > cfg.budget_s:
                cut = True
                break
            playouts += 1
            path, trail = (), [()]
            while True:                # selection: UCT among children whose subtree is not exhausted
                node = nodes[path]
                if node.untried:
                    break
                ln = math.log(node.visits)
                span = max(r_hi - r_lo, 1e-9)
                path = max((c for c in node.children if not nodes[c].done),
                           key=lambda c: _uct(nodes[c], ln, cfg.exploration, r_lo, span))
                trail.append(path)
            a = node.untried.pop(rng.randrange(len(node.untried)))   # expansion
            path = path + (a,)
            node.children.append(path)
            nodes[path] = _Node(space.actions(path))
            trail.append(path)
            leaf = path                # rollout
            while True:
                acts = space.actions(leaf)
                if not acts:
                    break
                leaf = leaf + (_rollout_action(space, leaf, acts, rng),)
            t = value(leaf)
            best_t = min(best_t, t)
            reward = 0.0 if not math.isfinite(t) else min(1.0, t_lb / t)
            if reward > 0:
                r_lo, r_hi = min(r_lo, reward), max(r_hi, reward)
            for p in trail:
                n = nodes[p]
                n.visits += 1
                n.total += reward
                n.best = max(n.best, reward)
            for p in reversed(trail):  # a node whose children are all exhausted is exhausted
                n = nodes[p]
                if n.done:
                    continue
                if n.untried or not all(nodes[c].done for c in n.children):
                    break
                n.done = True
            if cfg.progress and time.perf_counter() - last_report > 1.0:
                last_report = time.perf_counter()
                print(f"hetauto plan: {it + 1}/{n_iter} playouts, {len(ev.cache)} layouts evaluated, best "
                      f"{best_t:.3f} s/iteration ({last_report - t0:.1f} s)", file=sys.stderr, flush=True)

    ranked = sorted(((t, k) for k, t in leaves.items() if math.isfinite(t)), key=lambda x: x[0])
    if not ranked:
        _raise_infeasible(model, inventory, ev)
    # The closed form screens; the event simulation decides among the best of the tree's own leaves and, after
    # the local search, the best of everything found (two lists, so the climb's many near-identical layouts
    # cannot crowd the tree's best leaves out of the final check).
    shortlists = [ranked]
    if method == "mcts" and cfg.local_search:
        deadline = None if cfg.budget_s is None else t0 + cfg.budget_s
        shortlists.append(_local_search(space, ev, ranked, deadline))
    best = None
    seen = set()
    exact = []
    for shortlist in shortlists:
        checked = 0
        for _, choices in shortlist:
            resolved = ev.resolve(choices)[1]
            if resolved in seen:
                continue
            seen.add(resolved)
            checked += 1
            res = ev.exact(resolved)
            if res.stage_layers is not None:
                exact.append((res.iteration_time_s, resolved, res.stage_layers))
            if res.stage_layers is not None and (best is None or
                                                 res.iteration_time_s < best[0].iteration_time_s - 1e-12):
                best = (res, resolved)
            if checked >= cfg.rerank:
                break
    res, choices = best
    return SearchResult(list(choices), res.stage_layers, res.iteration_time_s, time.perf_counter() - t0,
                        len(ev.cache), method, cut, playouts, sorted(exact, key=lambda x: x[0]),
                        boundaries=res.boundaries)


def _local_search(space: SearchSpace, ev: _Evaluator, ranked: list, deadline: float | None = None) -> list:
    """Hill-climb from the best leaves, one decision at a time; stops when no single change helps (or at the
    deadline of --budget-s)."""
    seen = {k for _, k in ranked}
    found = list(ranked)
    # Start from the best leaf of each of the best few cluster orders, so the climb explores different
    # pipelines rather than polishing one.
    starts, orders = [], set()
    for _, k in ranked:
        order = tuple(m.cluster for m in k)
        if order not in orders:
            orders.add(order)
            starts.append(k)
        if len(starts) == 6:
            break
    for start in starts:
        cur, cur_t = start, ev.resolve(start)[0]
        improved = True
        while improved:
            improved = False
            for cand in _neighbours(space, cur):
                if deadline is not None and time.perf_counter() > deadline:
                    return sorted(found, key=lambda x: x[0])
                if cand in seen or not space.legal(cand):
                    continue
                seen.add(cand)
                t = ev.resolve(cand)[0]
                if math.isfinite(t):
                    found.append((t, cand))
                if t < cur_t - 1e-12:
                    cur, cur_t, improved = cand, t, True
    return sorted(found, key=lambda x: x[0])


def _neighbours(space: SearchSpace, choices: tuple) -> list[tuple]:
    S = choices[0].dp * choices[0].micro_batch_size
    out = []

    def with_mesh(i, m):
        return choices[:i] + (m,) + choices[i + 1:]

    for i, m in enumerate(choices):
        before = sum(x.num_stages for x in choices[:i])
        # TP and DP together: trading one for the other (same devices, other shard shapes) is the common move
        for tp in space.tp[m.cluster]:
            for dp in _divisors(S):
                if (tp, dp) != (m.tp, m.dp):
                    out.append(with_mesh(i, space.mesh(m.cluster, tp, dp, S, before)))
        for k in (m.num_stages - 1, m.num_stages + 1, (m.num_stages + 1) // 2):
            if k != m.num_stages:
                out.append(with_mesh(i, replace(m, num_stages=k)))
        for rc in RECOMPUTE:
            if rc != m.recompute:
                out.append(with_mesh(i, replace(m, recompute=rc)))
    # every other order of the same meshes (a handful: at most 4! for the inventories this tool targets)
    if len(choices) <= 4:
        out += [perm for perm in itertools.permutations(choices) if perm != choices]
    else:
        out += [choices[:i] + (choices[i + 1], choices[i]) + choices[i + 2:] for i in range(len(choices) - 1)]
    if len(choices) > 1:
        out += [choices[:i] + choices[i + 1:] for i in range(len(choices))]
    used = {m.cluster for m in choices}
    for cl in space.inventory.clusters:
        if cl.name in used or not space.tp[cl.name]:
            continue
        for dp in _divisors(S):
            for i in range(len(choices) + 1):
                out.append(choices[:i] + (space.mesh(cl.name, max(space.tp[cl.name]), dp, S, 0),) + choices[i:])
    for S2 in (S // 2, S * 2):
        if S2 in space.samples:
            scaled = tuple(replace(m, dp=max(1, m.dp * S2 // S), micro_batch_size=S2 // max(1, m.dp * S2 // S))
                           for m in choices)
            out.append(scaled)
            out.append(tuple(replace(m, micro_batch_size=m.micro_batch_size * S2 // S) for m in choices)
                       if S2 > S or all(m.micro_batch_size % 2 == 0 for m in choices) else scaled)
    return out


def _raise_infeasible(model: ModelSpec, inventory: Inventory, ev: _Evaluator):
    largest = max(c.device.memory_gib for c in inventory.clusters)
    if ev.best_infeasible:
        short, where = ev.best_infeasible
        raise InfeasibleError(
            f"{model.name} does not fit on the inventory's {inventory.num_devices} devices even with full "
            f"recomputation: the closest layout misses by {short:.1f} GiB per device (a stage on {where}; the "
            f"largest device has {largest:.0f} GiB). Add devices or clusters, or shorten --seq-length")
    raise InfeasibleError(f"{model.name}: no legal layout exists for this inventory (TP must divide the heads, "
                          "clusters next to each other in the pipeline must be linked)")
