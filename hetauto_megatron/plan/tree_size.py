"""How large the search's decision tree is, and what the search makes of it (plan/search.py): the trees' playout cap
and patience, and whether the bounded enumeration tries to settle the tree exactly. Pure, no torch.
"""
from __future__ import annotations

import random

from .space import SearchSpace

ENUMERATION_TREE = 50_000       # the bounded enumeration is tried on trees of up to this many leaves (Knuth's
ENUMERATION_VISITS = 2          # estimate), and may visit this many nodes per estimated leaf (at least 4,000)
PROVE_TREE = 4 * ENUMERATION_TREE   # near the limit: a tree estimated at up to this many leaves is estimated again
REFINE_PROBES = 1024            # from this many paths before the search decides to settle it (settle_estimate),
                                # and the trees' best is proved after them (plan/search.py PROVE_PRICED)
MIN_PLAYOUTS, MAX_PLAYOUTS = 300, 6000   # per tree


def tree_budget(space: SearchSpace, seed: int) -> tuple[int, int, float]:
    """(playout cap per tree, stall patience, estimated leaves) from the tree's size."""
    est = space.estimate_leaves(random.Random(seed * 7919 + 1))
    cap = int(min(MAX_PLAYOUTS, max(MIN_PLAYOUTS, est ** 0.75)))
    return cap, max(MIN_PLAYOUTS // 2, min(cap // 6, MAX_PLAYOUTS // 12)), est


def settle_estimate(space: SearchSpace, seed: int, est: float) -> float:
    """The tree's leaves as the choice to settle it exactly reads them: `est` (tree_budget's, from 64 random
    paths), taken again from REFINE_PROBES paths where it lies above ENUMERATION_TREE, up to PROVE_TREE. From 64
    paths Knuth's estimator is too noisy for a choice at a limit: the 29,384 leaves of a 3-cluster chain (tests/
    test_search_objective_lists.py) read 26,127 with one seed, settled exactly, and 51,065 with another, left to
    the trees (25 % dearer than the optimum under --objective cost)."""
    if not ENUMERATION_TREE < est <= PROVE_TREE:
        return est
    return space.estimate_leaves(random.Random(seed * 7919 + 2), REFINE_PROBES)
