"""The search's leaves ranked again by a second closed form, each a list of its own for the final re-ranking with
the event simulation (search._rank_exact). The search's closed form (pipeline.estimate_1f1b) is pessimistic
where these forms are not, by amounts that differ from layout to layout, so on its own it can rank the
simulation's best layout out of the simulation's reach; the second forms are not safe to screen or bound with
(they can undercut the simulation), so they only add candidates.

Each list is ranked by the search's objective of the second form's seconds (`score`: SearchSpace.score), as the
search's own list is. Ranked by seconds, a list held the fastest layouts, which under --objective cost (with a
--max-iteration-s floor or not) are not the best ones, and the final re-ranking's margin (search._rank_exact) set
its values, seconds, against the objective's, skipping those of many micro-batches unsimulated.
"""
from __future__ import annotations

from .evaluator import LayoutEvaluator
from .pipeline_fill import estimate_fill_drain

RESCREEN = 256      # the best layouts ranked again: those through a contended uplink without its terms
                    # (uplink_shortlist), all by fill and drain (fill_shortlist)


def uplink_shortlist(ev: LayoutEvaluator, ranked: list, score, among: int = RESCREEN) -> list:
    """The layouts among the best `among` of `ranked` whose pipeline runs through a contended uplink
    (plan/shared_uplinks.py), ranked by their closed form without the uplink's terms: the closed form charges each
    of their transfers its longest wait for the uplink (never below the simulation, but 6 % above it at the
    median), so on its own it can rank them out of the event simulation's reach (benchmarks/uplink_screening.py);
    the simulation decides among the best of this list too."""
    return rescreened(ev, ranked, among, score, lambda layout: ev.crosses_contended_uplink(ev.resolve(layout)[1]),
                      share_uplinks=False)


def fill_shortlist(ev: LayoutEvaluator, ranked: list, score, among: int = RESCREEN) -> list:
    """The best `among` of `ranked` ranked by the closed form that counts the slowest stage's work during fill and
    drain (plan/pipeline_fill.py): the search's closed form overcounts them by up to the stage's warm-up forwards
    and as many backwards, the more the fewer micro-batches, so it can rank the simulation's best layout behind
    many others (benchmarks/uplink_screening.py without its uplinks: 20th and 34th, the plans 1.5 % and 0.6 %
    slower). That closed form can also undercut the simulation by a few %, so it ranks a list of its own."""
    return rescreened(ev, ranked, among, score, estimate=estimate_fill_drain)


def rescreened(ev: LayoutEvaluator, ranked: list, among: int, score, only=None, **changes) -> list:
    """The best `among` of `ranked` (those for which `only(layout)`, where given) priced again by `ev` but for
    `changes` (LayoutEvaluator.variant): (`score(seconds, layout)`, the objective, layout), best first."""
    other = ev.variant(**changes)
    out = [(score(other.resolve(layout)[0], layout), layout) for _, layout in ranked[:among]
           if only is None or only(layout)]
    return sorted(out, key=lambda x: x[0])
