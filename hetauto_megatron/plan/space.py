"""The search's decision tree: its decisions, their encoding as paths, and the symmetries that shrink it.

A plan is built by a sequence of decisions, each a level of the tree:
    the clusters taking part, in pipeline order (one decision per position, then stop);
    S, the samples per micro-batch step (= dp * micro_batch_size, equal in every mesh; `step_sizes`);
    for each mesh in pipeline order: its TP, then its DP (micro-batch = S / DP), and under the cost objective
    its number of stages.
A mesh takes as many pipeline stages as its cluster's devices allow (devices // (TP * DP)), leaving one for
each mesh after it. Under the cost objective the tree also offers every smaller count (`stage_options`): a plan
pays for the devices it uses, so part of a cluster (fewer stages: fewer devices, a shorter fill and drain) can
cost less per token than all of it.

Principles prune the tree (what we know about heterogeneous training):
- TP stays inside a node and divides the attention and key/value heads.
- A mesh never spans clusters (TP and DP stay on fast links); consecutive meshes must be linked.
- Pipelines are no deeper than the layers (plus embedding and head) and the micro-batches.
- A TP/DP whose one-layer stage does not fit even with full recomputation is never expanded.
- Identical clusters (same devices, nodes and networks, and the same links to every other cluster) are
  interchangeable: the tree only offers the first unused one of each such class, so it holds one of the
  orders that differ by swapping them.
The bounds that prune it further (a subtree whose bound is worse than a plan the search holds is dropped)
are in plan/space_bounds.py; `SearchSpace` inherits them.
"""
from __future__ import annotations

import dataclasses
import math
import random

from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from . import costing, memory_fit
from .constraints import Constraints, devices_by_cluster, every_device_free, objective_value
from .evaluator import AUTO
from .plan import launch_nodes
from .engines import DEFAULT_ENGINE, selective_runs
from .simulate import MeshChoice
from .space_bounds import SpaceBounds

END = "<end>"


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending: pairs up to its square root (a global batch of millions is a million steps
    where a walk to n would be seconds)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def odd_part(n: int) -> int:
    return n // (n & -n)


def step_sizes(gbs: int, inventory: Inventory, con: Constraints, max_micro_batch: int = 16,
               above_devices: bool = True) -> list[int]:
    """The tree's choices of S, the samples a micro-batch step moves (DP x micro-batch): the divisors of the global
    batch, at most the devices, that are some DP x micro-batch the tree can offer: a micro-batch of at most
    `max_micro_batch` (the pinned one where --micro-batch-size pins it) and a DP whose odd factor (DP / 2^k) divides
    a cluster's device count or the --max-devices budget. So the pinned tree's steps are among the free tree's, and
    its optimum is a leaf of the free tree (docs/search.md).

    A DP of 48 on 96 devices (12 nodes of 8) is a step of 48 or 96, which a power of two never gives: without it the
    96 H100s of Megatron-LM's published 7.1B run (TP 2 x DP 48) had to take three pipeline stages, priced 18 %
    slower. A DP whose odd factor no cluster's devices have (DP 3 on 8 + 16 devices) could only leave devices idle,
    so it is not offered (a smaller tree); the micro-batch may hold an odd factor (DP 1 x 3 through 8 stages).
    S may exceed the devices (`above_devices`: every device as DP at micro-batches of 2 or more). Capped at the
    devices, OPT-350M on 8 H100s at a global batch of 512 took two pipeline stages of DP 4 x 2 (1.034 s) where DP 8
    x 8 runs 0.924 s, and 24 A100s on LLaMA-2-7B at 96 took DP 24 x 1 (4.162 s) against DP 24 x 2's 4.091 s. The
    multi-pipeline search's pipelines keep the cap (above_devices=False): its batch split by rates and per-sample
    times misses the shares at which a pipeline runs one large step, and with uncapped steps it missed its
    exhaustive optimum by 2.4 % on a tiny instance."""
    sizes = [c.num_devices for c in inventory.clusters] + ([con.max_devices] if con.max_devices else [])
    mbs = [con.micro_batch_size] if con.micro_batch_size else range(1, max_micro_batch + 1)
    # (the divisors of the global batch, not every DP up to the devices: an inventory of 10^8 nodes, which its
    # reader accepts, walked for minutes here before the search began)
    dps = [d for d in divisors(gbs) if d <= inventory.num_devices and any(n % odd_part(d) == 0 for n in sizes)]
    return sorted({dp * mb for mb in mbs for dp in dps
                   if gbs % (dp * mb) == 0 and (above_devices or dp * mb <= inventory.num_devices)})


def _node_and_head_tps(model: ModelSpec, cluster) -> list[int]:
    """The TP degrees that divide the devices of a node (so that every TP group, counted from a node's first device,
    stays inside it: TP 4 on 6-device nodes would put devices 4-7 in one group) and the attention and key/value
    heads."""
    return [t for t in (1, 2, 4, 8, 16) if cluster.devices_per_node % t == 0
            and model.num_attention_heads % t == 0 and model.num_query_groups % t == 0]


def tp_degrees(model: ModelSpec, cluster) -> list[int]:
    """The TP degrees a cluster may run: those of `_node_and_head_tps` that also divide the MLP width (Megatron
    shards it evenly) and, since a mesh with TP > 1 runs sequence parallelism (settings.default_settings), the
    sequence (Plan validates the same; DeepSpeed's engine, which has no sequence parallelism, could take such a TP,
    but sequences TP does not divide are rare)."""
    return [t for t in _node_and_head_tps(model, cluster)
            if model.ffn_hidden_size % t == 0 and (t == 1 or model.seq_length % t == 0)]


def tp_shape_note(model: ModelSpec, inventory) -> str:
    """A sentence for an infeasible search: the TP degrees the nodes and heads would allow but the model's MLP width
    or sequence rules out (an odd --seq-length leaves a large model TP 1 only), else ''."""
    out = sorted({t for c in inventory.clusters for t in _node_and_head_tps(model, c)}
                 - {t for c in inventory.clusters for t in tp_degrees(model, c)})
    if not out:
        return ""
    why = []
    if any(model.ffn_hidden_size % t for t in out):
        why.append(f"the MLP width of {model.ffn_hidden_size:,} (Megatron shards it evenly)")
    if any(model.seq_length % t for t in out):
        why.append(f"the {model.seq_length:,}-token sequence (sequence parallelism splits it evenly)")
    one = len(out) == 1
    note = (f" TP {', '.join(map(str, out))} {'was' if one else 'were'} left out: {'it does' if one else 'they do'} "
            f"not divide {' or '.join(why)}")
    if not any(model.ffn_hidden_size % t for t in out):
        note += f"; a --seq-length that {max(out)} divides gives {'it' if one else 'them'} back"
    return note + "."


class SearchSpace(SpaceBounds):
    """The decision tree: `actions(path)` lists the legal next decisions after a path of decisions; its
    bounds (`bound`, `leaf_bound`, ...) come from SpaceBounds."""

    def __init__(self, model: ModelSpec, inventory: Inventory, gbs: int, cost_model, max_micro_batch: int = 16,
                 constraints: Constraints | None = None, engine: str = DEFAULT_ENGINE, job_settings: tuple = (),
                 steps_above_devices: bool = True):
        self.model, self.inventory, self.gbs, self.cost = model, inventory, gbs, cost_model
        self.job_settings = job_settings      # the job's dropouts: every mesh of the tree runs them (`mesh`)
        # the engine planned for: the tree's memory checks and the bounds' layer times are its settings' (DeepSpeed's
        # engine runs without sequence parallelism or the overlaps; priced with Megatron's, a bound exceeded the
        # layouts below it by up to 9 % and the bounded search could cut its optimum)
        self.engine = engine
        self.selective = selective_runs(model, engine)        # recompute "selective" runs for this model
        self.con = con = constraints or Constraints()
        if con.objective == "cost" and every_device_free(inventory):
            # money bounds of 0 pruned nothing while every plan's value was its time: 10x the throughput's search
            self.con = con = dataclasses.replace(con, objective="throughput")
        self.max_mb = max(max_micro_batch, con.micro_batch_size or 0)
        self.max_devices = min(inventory.num_devices, con.max_devices or inventory.num_devices)
        self.samples = step_sizes(gbs, inventory, con, self.max_mb, steps_above_devices)
        self.tp = {c.name: [t for t in tp_degrees(model, c) if con.tp_of(c.name) in (None, t)]
                   for c in inventory.clusters}
        self.names = [c.name for c in inventory.clusters]
        self._cl = {c.name: c for c in inventory.clusters}
        self._fits: dict = {}          # one-layer memory checks, and the bounds' per-shape figures
        self._actions: dict = {}
        self._decoded: dict = {}
        self._meshes: dict = {}
        self._pinned_rc = {c.name: con.recompute_of(c.name) for c in inventory.clusters}   # --recompute
        # the cost objective's tree decides each mesh's stages too (after its DP: the pending decision is then the
        # pair (TP, DP)); the throughput objective's mesh takes the most stages its devices allow
        self.stage_decision = con.objective == "cost"
        self.twin_of = self._symmetry_classes()
        self._twins = {k: [x for x in self.names if self.twin_of[x] == k] for k in set(self.twin_of.values())}
        self._init_bounds()

    def _symmetry_classes(self) -> dict[str, str]:
        """cluster -> the first cluster of its class of interchangeable clusters."""
        inv = self.inventory
        first: dict[str, str] = {}
        for i, a in enumerate(inv.clusters):
            first[a.name] = a.name
            for b in inv.clusters[:i]:
                if first[b.name] != b.name:
                    continue
                # every figure of the cluster but its name (device, networks, uplink, price, overheads)
                same = dataclasses.replace(a, name=b.name) == b and self.con.pinned(a.name) == self.con.pinned(b.name)
                if same and all(inv.link(a.name, x) == inv.link(b.name, x) for x in self.names
                                if x not in (a.name, b.name)):
                    first[a.name] = b.name
                    break
        return first

    # ---- the tree -----------------------------------------------------------------------------------------
    def mesh(self, cluster: str, tp: int, dp: int, samples: int, stages_before: int, meshes_after: int = 0,
             devices_before: int = 0, stages: int | None = None) -> MeshChoice:
        """A mesh takes as many stages as its devices allow (within --max-devices), leaving one stage for each
        mesh after it, unless `stages` (one of `stage_options`) says how many. Its recomputation is the
        evaluator's choice unless --recompute pins it."""
        key = (cluster, tp, dp, samples, stages_before, meshes_after, devices_before, stages)
        if key not in self._meshes:     # (one object per mesh: the tree decodes the same mesh on many paths)
            k = self.most_stages(*key[:-1]) if stages is None else stages
            self._meshes[key] = MeshChoice(cluster, tp, dp, samples // dp, self._pinned_rc[cluster] or AUTO, k,
                                           self.job_settings)
        return self._meshes[key]

    def refit(self, shapes, samples: int) -> tuple:
        """Meshes of the given (cluster, TP, DP), in pipeline order, at `samples` per step, each with the stages the
        tree gives it (`mesh`: as many as its devices allow after the meshes before it): an old chain of meshes
        fitted again (a re-plan's warm start on what is left, the local search's move across an S step)."""
        out, before, taken = [], 0, 0
        for i, (cluster, tp, dp) in enumerate(shapes):
            m = self.mesh(cluster, tp, dp, samples, before, len(shapes) - i - 1, taken)
            before, taken = before + m.num_stages, taken + m.tp * m.dp * m.num_stages
            out.append(m)
        return tuple(out)

    def most_stages(self, cluster: str, tp: int, dp: int, samples: int, stages_before: int, meshes_after: int = 0,
                    devices_before: int = 0) -> int:
        """The stages a mesh's devices allow (within --max-devices), leaving one stage for each mesh after it."""
        n = min(self._cl[cluster].num_devices, self.max_devices - devices_before)
        k = min(n // (tp * dp), self.max_stages(samples) - stages_before - meshes_after)
        while k > 0 and not self.whole_nodes(cluster, tp * dp * k):   # launch scripts start whole nodes
            k -= 1
        return k

    def stage_options(self, cluster: str, tp: int, dp: int, samples: int, meshes: tuple, order: tuple) -> list[int]:
        """The cost objective's stage decision for the mesh after `meshes` (of the pipeline `order`): the most
        stages the devices allow (the throughput objective's tree, so the cost objective's holds every leaf of it),
        then every smaller count that whole nodes can start, down to the fewest whose stages, with those of the
        other meshes, can hold the layers (`stage_cap`: fewer would not fit in memory). Where not even one stage
        is left, the one count (a dead end)."""
        before = sum(m.num_stages for m in meshes)
        used = sum(m.tp * m.dp * m.num_stages for m in meshes)
        k = self.most_stages(cluster, tp, dp, samples, before, len(order) - len(meshes) - 1, used)
        if k < 1:
            return [k]
        # the layers the other meshes can hold at most: the meshes decided, and each cluster after this mesh at
        # its most stages of its roomiest shape
        others = sum(m.num_stages * self.stage_cap(m.cluster, m.tp, m.dp, m.micro_batch_size) for m in meshes) + sum(
            self._cluster_cap(c, samples) for c in order[len(meshes) + 1:])
        least = max(1, -(-(self.model.num_layers - others) // self.stage_cap(cluster, tp, dp, samples // dp)))
        return [k] + [j for j in range(k - 1, least - 1, -1) if self.whole_nodes(cluster, tp * dp * j)]

    def stage_cap(self, cluster: str, tp: int, dp: int, mb: int, rc: str | None = None) -> int:
        """The most layers a stage of this shape can hold: one micro-batch in flight, neither the embedding nor the
        head, recomputation `rc` (default the most generous the tree allows the cluster: every stage of a pipeline
        holds at least that much memory; `fits_one_layer` is this >= 1, so a shape the tree offers holds one)."""
        rc = rc or self._rc(cluster)
        key = ("cap", cluster, tp, dp, mb, rc)
        cap = self._fits.get(key)
        if cap is None:
            prof = costing.stage_profile(self.model, self._cl[cluster], tp, dp, mb, rc, self.cost,
                                         self.settings_of(tp, cluster))
            cap = self._fits[key] = max(0, memory_fit.max_layers_in_memory(self.model, prof, 1, False, False))
        return cap

    def _cluster_cap(self, cluster: str, samples: int) -> int:
        """The most layers a mesh of `cluster` can hold at S = `samples`: its most stages (devices and depth
        allowing) of its roomiest shape."""
        key = ("cluster cap", cluster, samples)
        cap = self._fits.get(key)
        if cap is None:
            n = self._cl[cluster].num_devices
            shapes = self._list_shapes(cluster, samples, self.tp[cluster])
            cap = self._fits[key] = max((min(n // (tp * dp), self.max_stages(samples))
                                         * self.stage_cap(cluster, tp, dp, samples // dp) for tp, dp in shapes),
                                        default=0)
        return cap

    def whole_nodes(self, cluster: str, devices: int) -> bool:
        """Whether torchrun can start `devices` processes of a cluster in one launch: whole nodes, or part of one
        node (plan.launch_nodes; a single-pipeline layout is one launch per cluster)."""
        return launch_nodes(devices, self._cl[cluster].devices_per_node) is not None

    def max_stages(self, samples: int) -> int:
        """Pipeline depth limit: at most one stage per layer (plus embedding and head stages), and no more
        stages than micro-batches (beyond that 1F1B's fill and drain exceed half of the iteration); --max-pp."""
        return min(self.model.num_layers + 2, self.gbs // samples, self.con.max_pp or self.gbs)

    def score(self, seconds: float, choices) -> float:
        """What the search minimises: seconds per iteration, or for the cost objective the money per iteration
        (the devices in use times their price per second times the iteration)."""
        return objective_value(self.con, self.inventory, seconds, devices_by_cluster(choices), self._ceiling)

    def decode(self, path: tuple):
        """-> (cluster order, order complete?, S or None, finished meshes, what is decided of the next mesh: None,
        its TP, or under the cost objective (TP, DP) before its stage decision)
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
        if isinstance(pending, tuple):                  # the stage decision (cost objective)
            (tp, dp), stages = pending, a
        elif self.stage_decision:                       # the DP decision; the stages come next
            return order, True, S, meshes, (pending, a)
        else:
            tp, dp, stages = pending, a, None
        before = sum(m.num_stages for m in meshes)
        devices = sum(m.num_stages * m.tp * m.dp for m in meshes)
        mesh = self.mesh(order[len(meshes)], tp, dp, S, before, len(order) - len(meshes) - 1, devices, stages)
        return order, True, S, meshes + (mesh,), None

    def actions(self, path: tuple) -> list:
        acts = self._actions.get(path)
        if acts is None:
            acts = self._actions[path] = self._compute_actions(path)
        return acts

    def _compute_actions(self, path: tuple) -> list:
        order, complete, S, meshes, pending = self.decode(path)
        if not complete:
            prev, taken = order[-1] if order else None, set(order)
            nxt = [c for c in self.names if c not in taken and self.tp[c]
                   and self._earlier_twins_used(c, order)
                   and (prev is None or self.inventory.link(prev, c) is not None)]
            done = order and all(c in order for c in self.con.use_clusters)   # --use-clusters: all taken part
            return nxt + ([END] if done else [])
        if S is None:
            return [s for s in self.samples if self.max_stages(s) >= len(order)
                    and (s <= self.inventory.num_devices or all(self._takes_step(c, s) for c in order))]
        if len(meshes) == len(order):
            return []
        cl = self._cl[order[len(meshes)]]
        if pending is None:
            if S <= self.inventory.num_devices:
                return list(self.tp[cl.name])
            return [t for t in self.tp[cl.name] if self._dp_choices(cl, t, S, meshes, order)]
        if isinstance(pending, tuple):                  # the stage decision (cost objective)
            return self.stage_options(cl.name, *pending, S, meshes, order)
        return self._dp_choices(cl, pending, S, meshes, order)

    def _dp_choices(self, cl, tp: int, S: int, meshes: tuple, order: tuple) -> list[int]:
        """The DPs the mesh of `cl` after `meshes` may take at TP `tp` and step S: within the devices left, the
        micro-batch S / DP allowed, room for a stage, and one layer fits."""
        before = sum(m.num_stages for m in meshes)
        used = sum(m.tp * m.dp * m.num_stages for m in meshes)
        room = self.max_stages(S) - before - (len(order) - len(meshes) - 1)
        free = min(cl.num_devices, self.max_devices - used)
        return [d for d in divisors(S) if tp * d <= free and S // d <= self.max_mb and room >= 1
                and self._mb_ok(S // d) and self.fits_one_layer(cl.name, tp, d, S // d, self._rc(cl.name))]

    def _takes_step(self, cluster: str, S: int) -> bool:
        """Whether some TP x DP of the cluster's devices runs a step of S above the devices (micro-batches of 2 or
        more) at an allowed micro-batch that one layer fits in; else the subtree is a dead end that playouts would
        keep falling into. The steps up to the devices are not filtered (the trees they make are as before)."""
        key = ("step", cluster, S)
        if key not in self._fits:      # (the cluster as a pipeline's first mesh: all of its devices free)
            self._fits[key] = any(self._dp_choices(self._cl[cluster], t, S, (), (cluster,)) for t in self.tp[cluster])
        return self._fits[key]

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
        return self.stage_cap(cluster, tp, dp, mb, rc) >= 1

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
                    or not self.whole_nodes(m.cluster, m.tp * m.dp * m.num_stages)
                    or self.con.recompute_of(m.cluster) not in (None, m.recompute)
                    or (m.recompute == "selective" and not self.selective)
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
            out.append(m if name == m.cluster else dataclasses.replace(m, cluster=name))
        return tuple(out)

    def _list_shapes(self, cluster: str, S: int, tps) -> list[tuple[int, int]]:
        """The (TP, DP) shapes the tree offers `cluster` at S with these TPs, ignoring the devices and stages
        the other meshes take (what the bounds assume of a mesh still to be decided)."""
        n = self._cl[cluster].num_devices
        return [(tp, d) for tp in tps for d in divisors(S) if tp * d <= n and S // d <= self.max_mb
                and self._mb_ok(S // d) and self.fits_one_layer(cluster, tp, d, S // d, self._rc(cluster))]

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
    out = []
    for path in iter_leaves(space):
        out.append(path)
        if limit is not None and len(out) > limit:
            break
    return out


def iter_leaves(space: SearchSpace):
    """The leaves of `leaves`, one at a time: the exhaustive search prices each as it comes, so that it can stop
    at its time budget (listing a large tree's leaves first took minutes on its own)."""
    stack = [()]
    while stack:
        path = stack.pop()
        acts = space.actions(path)
        if not acts:
            yield path
        else:
            stack.extend(path + (a,) for a in reversed(acts))
