"""What the user asks of a plan besides speed: the objective (throughput or cost) and hard constraints.

The search (plan/space.py) reads a `Constraints` in three places: the decisions it offers (pinned TP, micro-batch,
recomputation, the pipeline depth and device count limits, clusters pinned in or out), `SearchSpace.legal`
(the local search's moves obey the same rules), and `SearchSpace.score` (the value the search minimises:
seconds per iteration, or money per iteration for the cost objective). Prices are per device-hour per cluster
(the inventory's `price_per_device_hour`); a plan pays for the devices it uses, not for its clusters' idle ones.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..errors import InfeasibleError, InputError
from ..spec.inventory import Inventory
from .plan import RECOMPUTE_MODES

OBJECTIVES = ("throughput", "cost")


@dataclass(frozen=True)
class Constraints:
    objective: str = "throughput"          # "throughput": shortest iteration; "cost": least money per token
    max_devices: int | None = None         # devices the plan may use in all
    use_clusters: tuple = ()               # clusters that must take part
    exclude_clusters: tuple = ()           # clusters that must not
    tp: tuple = ()                         # ((cluster, TP), ...): every mesh of the cluster runs this TP
    recompute: tuple = ()                  # ((cluster, mode), ...): every mesh of the cluster recomputes so
    max_pp: int | None = None              # pipeline stages in all
    micro_batch_size: int | None = None    # every mesh's micro-batch
    max_iteration_s: float | None = None   # a throughput floor: no plan slower than this per iteration

    def __post_init__(self):
        # Sets of clusters (every reader asks only whether a cluster is in one), kept sorted: the same request typed
        # in another order (--use-clusters b,a) is the same constraint and records the same plan file.
        for name in ("use_clusters", "exclude_clusters"):
            object.__setattr__(self, name, tuple(sorted(getattr(self, name))))
        # Pins per cluster (read by cluster: tp_of, recompute_of; a cluster at most once), sorted by cluster the
        # same way: --tp b=2,a=4 and --tp a=4,b=2 record the same plan file.
        for name in ("tp", "recompute"):
            object.__setattr__(self, name, tuple(sorted(getattr(self, name), key=lambda pin: pin[0])))

    def tp_of(self, cluster: str) -> int | None:
        return dict(self.tp).get(cluster)

    def recompute_of(self, cluster: str) -> str | None:
        return dict(self.recompute).get(cluster)

    def pinned(self, cluster: str) -> tuple:
        """What distinguishes a cluster from an otherwise identical one (symmetry classes must not merge them)."""
        return (self.tp_of(cluster), self.recompute_of(cluster), cluster in self.use_clusters)

    @property
    def active(self) -> dict:
        """The constraints that are set, as the plan records them (estimate.search.constraints)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name != "objective" and v not in (None, ()):
                out[f.name] = dict(v) if f.name in ("tp", "recompute") else (list(v) if isinstance(v, tuple) else v)
        return out

    @classmethod
    def from_record(cls, record: dict | None) -> "Constraints":
        """The objective and constraints a plan was made under, from what its estimate recorded
        (`estimate.search`: {"objective": ..., "constraints": active}); none recorded = no constraints."""
        record = record or {}

        def garbled(key: str, what: str):
            return InputError(f"must be {what}", field=f"estimate.search.{key}",
                              fix="remove the plan's estimate.search block (hetauto plan writes it) or correct it")
        if not isinstance(record, dict):
            raise InputError("must be a mapping", field="estimate.search",
                             fix="remove the plan's estimate.search block (hetauto plan writes it) or correct it")
        active = record.get("constraints") or {}
        if not isinstance(active, dict):
            raise garbled("constraints", "a mapping of constraint: value")
        active = dict(active)
        for name in ("tp", "recompute"):
            if name in active:
                kind = int if name == "tp" else str
                if not isinstance(active[name], dict) or not all(
                        isinstance(v, kind) and not isinstance(v, bool) for v in active[name].values()):
                    raise garbled(f"constraints.{name}", f"a mapping of cluster: {'TP' if name == 'tp' else 'mode'}")
                active[name] = tuple((str(k), v) for k, v in active[name].items())
        for name in ("use_clusters", "exclude_clusters"):
            if name in active:
                if not isinstance(active[name], list) or not all(isinstance(v, str) for v in active[name]):
                    raise garbled(f"constraints.{name}", "a list of cluster names")
                active[name] = tuple(active[name])
        for name in ("max_devices", "max_pp", "micro_batch_size"):
            v = active.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise garbled(f"constraints.{name}", "a whole number, at least 1")
        v = active.get("max_iteration_s")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
            raise garbled("constraints.max_iteration_s", "a number of seconds above 0")
        objective = record.get("objective", "throughput")
        if objective not in OBJECTIVES:
            raise garbled("objective", f"one of {', '.join(OBJECTIVES)}")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(objective=objective, **{k: v for k, v in active.items() if k in known})

    def without(self, name: str) -> "Constraints":
        """These constraints with `name` lifted (to tell which one binds when nothing is feasible)."""
        return dataclasses.replace(self, **{name: Constraints.__dataclass_fields__[name].default})


# The command-line flag of each constraint (messages name the flag the user typed).
FLAGS = {"max_devices": "--max-devices", "use_clusters": "--use-clusters", "exclude_clusters": "--exclude-clusters",
         "tp": "--tp", "recompute": "--recompute", "max_pp": "--max-pp", "micro_batch_size": "--micro-batch-size",
         "max_iteration_s": "--max-iteration-s"}


def keep_constraints(old: Constraints, given: Constraints, given_names: set, inventory: Inventory,
                     gbs: int) -> tuple[Constraints, list[str], list[str]]:
    """A re-plan (`plan --from`): the old plan's objective and constraints (`old`, from its estimate.search) where
    the command line set none (`given`; `given_names`: the fields whose flag was typed, which win) ->
    (the constraints to search under, the names of the fields kept, those not kept as "FLAG VALUE (why)").

    A kept pin of a cluster that left the inventory, or that a typed flag contradicts (--exclude-clusters X
    against a kept --tp X=2), is not kept: the re-plan follows the inventory and the flags typed, not the old pins.
    """
    names = {x.name for x in inventory.clusters}
    out, kept, dropped = given, [], []
    if "objective" not in given_names and old.objective != given.objective:
        out = dataclasses.replace(out, objective=old.objective)
        kept.append("objective")
    for name in FLAGS:
        value = getattr(old, name)
        if name in given_names or value in (None, ()):
            continue
        if name in ("use_clusters", "exclude_clusters", "tp", "recompute"):
            # a kept exclusion meets the clusters typed in --use-clusters and the typed pins; a kept pin meets the
            # exclusion in force
            against = (set(out.use_clusters) | {k for k, _ in out.tp} | {k for k, _ in out.recompute}
                       if name == "exclude_clusters" else out.exclude_clusters)
            why = {}
            for item in value:
                cluster = item[0] if isinstance(item, tuple) else item
                if cluster not in names:
                    why[cluster] = f"no cluster {cluster} in the inventory"
                elif cluster in against:
                    why[cluster] = f"{'a flag typed' if name == 'exclude_clusters' else '--exclude-clusters'} " \
                                   f"names {cluster}"
            for item in value:
                cluster = item[0] if isinstance(item, tuple) else item
                if cluster in why:
                    shown = f"{FLAGS[name]} {cluster}" + (f"={item[1]}" if isinstance(item, tuple) else "")
                    dropped.append(f"{shown} ({why[cluster]})")
            value = tuple(item for item in value if (item[0] if isinstance(item, tuple) else item) not in why)
            if not value:
                continue
        if name == "micro_batch_size" and gbs % value:
            dropped.append(f"--micro-batch-size {value} (does not divide the global batch {gbs})")
            continue
        out = dataclasses.replace(out, **{name: value})
        kept.append(name)
    return out, kept, dropped


def describe(c: Constraints, name: str) -> str:
    v = getattr(c, name)
    if name in ("tp", "recompute"):
        return " ".join(f"{FLAGS[name]} {k}={x}" for k, x in v)
    if name in ("use_clusters", "exclude_clusters"):
        return f"{FLAGS[name]} {','.join(v)}"
    return f"{FLAGS[name]} {v}"


def parse_pins(items: list[str], flag: str, example: str) -> tuple:
    """'CLUSTER=VALUE' strings -> ((cluster, value), ...) in the order given (a cluster at most once; Constraints
    sorts them by cluster)."""
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, value = (x.strip() for x in item.partition("="))
        if not sep or not name or not value:
            raise InputError(f"{item!r} is not CLUSTER=VALUE", field=flag, fix=f"write e.g. {flag} {example}")
        if name in out:
            raise InputError(f"cluster {name!r} is given twice", field=flag, fix="give each cluster once")
        out[name] = value
    return tuple(out.items())


def parse_names(text: str | None) -> tuple:
    return tuple(dict.fromkeys(x.strip() for x in (text or "").split(",") if x.strip()))


def check(c: Constraints, model, inventory: Inventory, gbs: int) -> None:
    """InputError (exit 2) naming the flag and the fix for a constraint that cannot mean anything here."""
    from .space import tp_degrees
    names = [x.name for x in inventory.clusters]
    if c.objective not in OBJECTIVES:
        raise InputError(f"unknown objective {c.objective!r}", field="--objective", fix="use throughput or cost")
    for flag, clusters in (("--use-clusters", c.use_clusters), ("--exclude-clusters", c.exclude_clusters),
                           ("--tp", [k for k, _ in c.tp]), ("--recompute", [k for k, _ in c.recompute])):
        for name in clusters:
            if name not in names:
                raise InputError(f"the inventory ({inventory.source or 'inventory'}) has no cluster {name!r}",
                                 field=flag, fix=f"name one of its clusters: {', '.join(names)}")
    both = [n for n in c.use_clusters if n in c.exclude_clusters]
    if both:
        raise InputError(f"cluster {both[0]!r} is both pinned in and excluded", field="--exclude-clusters",
                         fix=f"drop {both[0]} from --use-clusters or from --exclude-clusters")
    if len(c.exclude_clusters) == len(names):
        raise InputError("excludes every cluster of the inventory", field="--exclude-clusters",
                         fix="leave at least one cluster in")
    for name, tp in c.tp:
        if name in c.exclude_clusters:
            raise InputError(f"pins the TP of {name!r}, which --exclude-clusters leaves out", field="--tp",
                             fix=f"drop --tp {name}=... or keep {name} in")
        options = tp_degrees(model, inventory.cluster(name))
        if tp not in options:
            raise InputError(f"TP {tp} is not possible on cluster {name!r} (TP divides the "
                             f"{inventory.cluster(name).devices_per_node} devices of a node, so that each TP group "
                             "stays inside one, the model's "
                             f"{model.num_attention_heads} attention and {model.num_query_groups} key/value heads, "
                             f"its MLP width of {model.ffn_hidden_size} and, with TP > 1, its sequence of "
                             f"{model.seq_length} tokens, which sequence parallelism splits)",
                             field="--tp", fix=f"use one of: {', '.join(map(str, options)) or 'none'}")
    for name, mode in c.recompute:
        if mode not in RECOMPUTE_MODES:
            raise InputError(f"unknown recomputation {mode!r} for cluster {name!r}", field="--recompute",
                             fix=f"use one of: {', '.join(RECOMPUTE_MODES)} (e.g. --recompute {name}=full)")
    for flag, v in (("--max-devices", c.max_devices), ("--max-pp", c.max_pp),
                    ("--micro-batch-size", c.micro_batch_size)):
        if v is not None and v < 1:
            raise InputError(f"must be at least 1, got {v}", field=flag, fix=f"give {flag} 1 or more, or leave it out")
    if c.max_iteration_s is not None and not 0 < c.max_iteration_s < math.inf:
        raise InputError(f"must be a number of seconds above 0, got {c.max_iteration_s}", field="--max-iteration-s",
                         fix="give the longest iteration you accept, e.g. --max-iteration-s 30, or leave it out")
    mb = c.micro_batch_size
    if mb is not None and gbs % mb:
        what = f"{mb} is more than the global batch {gbs}" if mb > gbs else f"{mb} does not divide the global batch {gbs}"
        raise InputError(f"{what} (every micro-batch step moves whole micro-batches, and the steps make up the "
                         "global batch)", field="--micro-batch-size",
                         fix=f"use a divisor of --global-batch-size {gbs}: " + _divisors_said(gbs))
    if c.objective == "cost":
        missing = [x.name for x in inventory.clusters if x.name not in c.exclude_clusters
                   and x.price_per_device_hour is None]
        if missing:
            i = names.index(missing[0])
            which = ("clusters " if len(missing) > 1 else "cluster ") + ", ".join(repr(m) for m in missing) + \
                (" have" if len(missing) > 1 else " has")
            add = f"add price_per_device_hour to {'these clusters' if len(missing) > 1 else 'it'} in the inventory"
            priced = [x.name for x in inventory.clusters if x.name not in c.exclude_clusters
                      and x.price_per_device_hour is not None]
            # excluding the unpriced clusters is a fix only where a priced one is left to plan on
            leave = (f", or leave {'them' if len(missing) > 1 else 'it'} out with --exclude-clusters "
                     f"{','.join(sorted(set(missing) | set(c.exclude_clusters)))}" if priced else "")
            raise InputError(f"--objective cost needs a price for every cluster the search may use; {which} none",
                             file=inventory.source, field=f"clusters[{i}].price_per_device_hour", fix=add + leave)


def restrict(inventory: Inventory, c: Constraints) -> Inventory:
    """The inventory without the excluded clusters (and their links): what the search may use."""
    return inventory.without(c.exclude_clusters)


def devices_by_cluster(meshes) -> dict[str, int]:
    """Devices a layout (MeshChoices) or a plan's meshes use per cluster."""
    out: dict[str, int] = {}
    for m in meshes:
        n = m.tp * m.dp * m.num_stages
        out[m.cluster] = out.get(m.cluster, 0) + n
    return out


def price_per_second(inventory: Inventory, used: dict[str, int]) -> float | None:
    """Money per second the devices in use cost; None when a cluster in use has no price."""
    total = 0.0
    for name, n in used.items():
        price = inventory.cluster(name).price_per_device_hour
        if price is None:
            return None
        total += n * price / 3600
    return total


# Ties in money are broken by time: with --objective cost each second also costs this share of the dearest
# device's price per second (every device free: the time alone). Layouts that use only
# free devices (price 0: owned hardware) all cost nothing; without it the search kept whichever it met first,
# 32 one-device stages where one stage of 32 replicas runs 1.6x faster.
TIE_BREAK = 1e-6

# What time is worth under --objective cost: the search minimises money x seconds^TIME_WEIGHT, so a plan k times
# faster wins when it costs less than k^TIME_WEIGHT times as much (twice as fast: under 0.7 % more; 10 % faster:
# under 0.1 % more). Money alone traded any time for any saving: LLaMA-2-7B on 64 H800 + 32 910B priced 2 / 1
# took 4 H800 at 43.5 s per iteration where 8 run 21.7 s for 0.04 % more per token, far below what the cost
# model can tell apart. Every bound of the cost objective multiplies by a time bound to this power
# (plan/space_bounds.py), which keeps it a lower bound.
TIME_WEIGHT = 0.01


def time_factor(seconds: float) -> float:
    """The factor that weighs money by time under the cost objective (TIME_WEIGHT); 0 for no time."""
    return seconds ** TIME_WEIGHT if seconds > 0 else 0.0


def every_device_free(inventory: Inventory) -> bool:
    """Whether no cluster has a price above 0: the cost objective is then the time (objective_value), and the
    search runs as the throughput objective's (space.SearchSpace), whose bounds are the times'."""
    return all(not cl.price_per_device_hour for cl in inventory.clusters)


def objective_value(c: Constraints, inventory: Inventory, seconds: float, used: dict[str, int],
                    ceiling: float | None = None) -> float:
    """What the search minimises for an iteration of `seconds` on the devices `used` (per cluster): the seconds,
    or with --objective cost the money (seconds times the devices' price per second) weighed by time
    (TIME_WEIGHT; ties broken by time, TIE_BREAK). Above --max-iteration-s, worse than every plan within it and
    ordered by time alone (`floor_ceiling`, or `ceiling` where the caller holds it), so the search is still steered
    towards the floor."""
    limit = c.max_iteration_s
    if c.objective == "cost" and limit is not None and math.isfinite(seconds) and seconds > limit:
        return (floor_ceiling(c, inventory) if ceiling is None else ceiling) * seconds / limit
    if c.objective != "cost" or not math.isfinite(seconds) or every_device_free(inventory):
        return seconds      # (every device free: the fastest plan costs nothing too)
    dearest = max(cl.price_per_device_hour or 0.0 for cl in inventory.clusters)
    return seconds * (price_per_second(inventory, used) * time_factor(seconds) + TIE_BREAK * dearest / 3600)


def floor_ceiling(c: Constraints, inventory: Inventory) -> float:
    """Under --max-iteration-s L: an objective no plan within L exceeds (all of the inventory's devices for L
    seconds; L itself under the throughput objective). A plan above L is worth this x its seconds / L: more than
    any plan within L, the faster the better (a lower bound of it from a time bound: `bound_under_floor`)."""
    every = {cl.name: cl.num_devices for cl in inventory.clusters if cl.price_per_device_hour is not None}
    return objective_value(dataclasses.replace(c, max_iteration_s=None), inventory, c.max_iteration_s, every)


def bound_under_floor(c: Constraints, inventory: Inventory, value_bound: float, seconds_bound: float,
                      ceiling: float | None = None) -> float:
    """A lower bound on the objective of leaves whose objective without --max-iteration-s is at least
    `value_bound` and whose time is at least `seconds_bound`: above the floor, the floor's value of that time;
    else the smaller of `value_bound` (a leaf within it) and the ceiling (one above it)."""
    if c.objective != "cost" or c.max_iteration_s is None or not math.isfinite(value_bound) \
            or not math.isfinite(seconds_bound):
        return value_bound      # (the throughput objective is the seconds, above the floor too)
    ceiling = floor_ceiling(c, inventory) if ceiling is None else ceiling
    if seconds_bound > c.max_iteration_s:
        return ceiling * seconds_bound / c.max_iteration_s
    return min(value_bound, ceiling)


def check_floor(model, c: Constraints, seconds: float) -> None:
    """InfeasibleError where the best plan found runs slower than --max-iteration-s: every plan within it is worth
    more than any above it, and the fastest above it the most (objective_value), so the search found none."""
    limit = c.max_iteration_s
    if limit is not None and seconds > limit:
        fix = "a larger --max-iteration-s, or more or faster devices"
        raise InfeasibleError(
            f"{model.name}: no plan that fits runs within --max-iteration-s {limit:g} s per iteration (the fastest "
            f"the search found: {seconds:.3f} s).", field="--max-iteration-s", fix=fix)


def cost_per_million_tokens(inventory: Inventory, meshes, iteration_time_s: float, tokens: int) -> float | None:
    rate = price_per_second(inventory, devices_by_cluster(meshes))
    return None if rate is None else rate * iteration_time_s / tokens * 1e6


def _divisors_said(n: int, most: int = 8) -> str:
    """The divisors of n, the first `most` of them where there are more ("1, 2, 4, 8, 16, 32, 64, 128 and 1 more":
    a trailing ", ..." lost its dots to the message's full stop)."""
    from .space import divisors     # (space imports this module)
    found = divisors(n)
    more = len(found) - most
    return ", ".join(map(str, found[:most])) + (f" and {more} more" if more > 0 else "")
