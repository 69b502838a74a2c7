"""What the search over the new plan shapes returns (`ShapesResult`), and the helpers its two levels share
(plan/multi_search.py: clusters -> pipelines; plan/alongside_search.py: replica groups side by side): the
objective of a plan, progress on stderr, the single-pipeline searches' configuration and --budget-s."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from ..spec.inventory import Inventory
from .constraints import Constraints, devices_by_cluster, objective_value
from .plan import Plan
from .search import SearchConfig, SearchResult


@dataclass
class ShapesResult:
    plan: Plan                      # the best plan found (estimate not set)
    iteration_time_s: float
    simple: SearchResult | None     # the single-pipeline search (its runners-up, method, ...); None where no
                                    # single pipeline follows the constraints and several pipelines do
    seconds: float
    partitions: int = 0             # partitions of the clusters into pipelines considered
    partitions_searched: int = 0    # ... whose bound beat the best plan, searched
    partitions_cut: bool = False    # the enumeration stopped at MAX_PARTITIONS_BOUNDED (or at --budget-s)
    pipelines_searched: int = 0     # single-pipeline searches for those
    alongside_tried: int = 0        # mixed replica groups priced
    tried: list = field(default_factory=list)   # (what, seconds per iteration or None, why) for the report
    levels_cut: bool = False        # --budget-s ran out in the new shapes' levels (or one of their searches)
    say: object = field(default=None, repr=False)    # progress(text) on stderr, or None

    @property
    def candidates_evaluated(self) -> int:
        return self.simple.candidates_evaluated if self.simple is not None else 0

    @property
    def method(self) -> str:
        return self.simple.method if self.simple is not None else "new shapes only"

    @property
    def cut_by_budget(self) -> bool:
        return (self.simple is not None and self.simple.cut_by_budget) or self.levels_cut

    def to_dict(self) -> dict:
        simple = self.simple.to_dict() if self.simple is not None else {   # (no single pipeline follows the
            "method": self.method, "candidates_evaluated": 0, "playouts": 0, "trees": 0}   # constraints)
        return {**simple, "seconds": round(self.seconds, 3), "cut_by_budget": self.cut_by_budget,
                "shapes": {"partitions": self.partitions, "partitions_searched": self.partitions_searched,
                           "partitions_cut": self.partitions_cut,
                           "pipelines_searched": self.pipelines_searched, "alongside_tried": self.alongside_tried}}


def plan_score(con: Constraints, inventory: Inventory, plan: Plan, seconds: float) -> float:
    return objective_value(con, inventory, seconds, devices_by_cluster(plan.meshes))


def progress(out: ShapesResult, text: str) -> None:
    if out.say is not None:
        out.say(text)


def quiet_config(cfg: SearchConfig) -> SearchConfig:
    """The configuration of the single-pipeline searches below: quiet and cold (a re-plan's warm start seeds the
    single-pipeline search above: its layouts span other clusters and batches). Each of them gets what is left of
    --budget-s when it starts (`within_budget`)."""
    return dataclasses.replace(cfg, progress=False, warm_start=())


def within_budget(cfg: SearchConfig, deadline) -> SearchConfig:
    """`cfg` with what is left of --budget-s now (each search below starts its own clock)."""
    return cfg if deadline is None else dataclasses.replace(cfg, budget_s=max(0.1, deadline - time.perf_counter()))


def objective_bound(con: Constraints, inventory: Inventory, seconds: float, clusters) -> float:
    """A time bound as a bound on the objective: with --objective cost, times the least the plan pays per second
    (one device of each of `clusters`, which all take part)."""
    return objective_value(con, inventory, seconds, {c: 1 for c in clusters})


def block_constraints(con: Constraints, block: list, names: list) -> Constraints:
    """The pipeline of a block uses exactly the block's clusters (the partition says which clusters take part,
    so its bound may count only their links)."""
    keep = set(block)
    return dataclasses.replace(
        con, exclude_clusters=tuple(n for n in names if n not in keep), use_clusters=tuple(block),
        tp=tuple((c, t) for c, t in con.tp if c in keep), recompute=tuple((c, r) for c, r in con.recompute if c in keep))
