"""What a rank of separately launched clusters learns at the world store's rendezvous (megatron/world_store.py)
about the others, and the paragraph it stops with: whether they loaded its plan, and who refused the job.

A rank counts check-ins against its own plan's world size, so a cluster launched with a plan of another world size
"joined" and every rank then waited in the first collective over the world (check_same_plan's all-gather needs one
world size) until HETAUTO_TIMEOUT_S, and stopped with gloo's traceback. So each rank compares its plan_digest with
the host's (left under PLAN before the host's code digest, so found by any rank that compared the code) before it
counts itself in; one that differs stops with check_same_plan's paragraph (exit 2) and posts it, and each rank that
reads it stops with the same paragraph, naming no cluster at fault: either plan may be the stale one.
"""
from __future__ import annotations

import os
import re

from ..errors import InputError

PLAN = "hetauto/plan"               # the host's plan_digest (set before its code digest)
OTHER_PLAN = "hetauto/other_plan"   # appended: "RANK " of each rank whose plan is not the host's


def plan_digest(plan) -> str:
    """What a rank's check-in says of its plan: check_same_plan's fingerprint and the world size."""
    from ..plan.plan_file import layout_digest
    return f"{layout_digest(plan, inventory_as_parsed=True)[:15]} {plan.world_size}"


def check_plan(store, rank: int, mine: str | None, file: str | None) -> None:
    """This rank's plan_digest against the host's (module docstring). Nothing to compare where either is not said:
    a host that refused before joining (post_refusal) leaves a refusal instead, which the join reads next."""
    if mine is None or not store.check([PLAN]):
        return
    theirs = store.get(PLAN).decode()
    if theirs != mine:
        store.append(OTHER_PLAN, f"{rank} ")
        sizes = (theirs.split()[-1], mine.split()[-1])
        detail = f": rank 0's plan runs {sizes[0]} ranks, this one's {sizes[1]}" if sizes[0] != sizes[1] else ""
        from ..runtime.rendezvous import different_plans_error
        raise different_plans_error(rank, [rank], file, detail)


def stopped_by(store, refused: str, rank: int, file: str | None, *, after_join: bool = False) -> InputError:
    """The paragraph of a rank that read `refused` in the store: check_same_plan's where a rank loaded another plan
    than the host's (refused_elsewhere would call this rank's cluster not at fault, and its plan may be the stale
    one), else refused_elsewhere."""
    if store.check([OTHER_PLAN]):
        from ..runtime.rendezvous import different_plans_error
        return different_plans_error(rank, sorted({int(r) for r in store.get(OTHER_PLAN).decode().split()}), file)
    return refused_elsewhere(refused, rank, after_join=after_join)


def refused_elsewhere(refused: str, rank: int, *, after_join: bool = False) -> InputError:
    """The paragraph of a rank that stops because another rank refused its launch (`refused`, as _refusal reads it:
    'rank R (cluster C): paragraph'). It names the refusing cluster and where its reason is, and no field of this
    rank's own: this rank's launch and the rendezvous address are fine (naming HETAUTO_MASTER_ADDR sent users to
    check an address that had just worked)."""
    found = re.match(r"rank (\d+) \(cluster ([^)]*)\): ", refused)
    who, log = "another cluster", "the refusing rank's log"
    if found:
        other, cluster = found.groups()
        who = f"cluster {cluster}" if cluster != "?" else f"the cluster of global rank {other}"
        log = f"the log of global rank {other}" + (f" on cluster {cluster}" if cluster != "?" else "")
    mine = os.environ.get("HETAUTO_CLUSTER")
    when = " after the clusters had joined" if after_join else ""
    if found and mine and found.group(2) == mine:
        # a rank of this very cluster: its launch is this one's, so neither "another cluster" nor "not at fault"
        return InputError(f"rank {found.group(1)} of this cluster ({mine}) refused the job{when}, so this rank "
                          f"({rank}) stops too; the rendezvous address is not at fault. The refusal: {refused}",
                          fix=f"fix what the refusal says ({log} has it in full), then start every cluster's launch "
                              "again")
    return InputError(f"another cluster's launch was refused{when}, so this rank ({rank}) stops too: {who} refused "
                      f"the job; the launch of this cluster{f' ({mine})' if mine else ''} and the rendezvous address are "
                      f"not at fault. The refusal: {refused}",
                      fix=f"fix the launch of {who} as the refusal says ({log} has it in full), then start every "
                          "cluster's launch again")
