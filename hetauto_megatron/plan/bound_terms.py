"""Sums the search's bounds (plan/space_bounds.py) take over a cluster order and over the meshes decided, kept from
node to node.

The tree extends a path one decision at a time, and on a 20-cluster inventory the bounds are asked of hundreds of
thousands of nodes whose figures differ from their parent's by one cluster or one mesh; summing each afresh was a
large part of the search. Each figure here is built from its parent's with the same operations in the same order
as the bound's own loop would take them, so the bounds are the same floats (a float sum depends on its order, and
Python's `sum` compensates round-off where a loop of `+=` does not: each keeps its own kind); a maximum or a
minimum is one of its arguments, in any order.
"""
from __future__ import annotations

import math

_MISSING = object()


class BoundTerms:
    """Mixed into `SpaceBounds`: reads the tree's `tp`, `inventory`, `_act_bytes`, `layer_time` and `_best_shape`."""

    def _init_terms(self) -> None:
        self._order_terms: dict = {}        # order -> `_order_links`
        self._rest_bests: dict = {}         # S -> {clusters: `_rest_shapes`}
        self._mesh_sums: dict = {}          # (id of a tuple of meshes, done) -> (the tuple, `_meshes_terms`)

    def _order_links(self, order: tuple) -> tuple:
        """(whether every cluster of `order` has a TP degree, the most seconds the iteration's activations take to
        cross one link of the order (once), or None for fewer than two clusters): `order_bound`'s figures."""
        return by_prefix(self._order_terms, order, (True, None), self._extend_order)

    def _extend_order(self, terms: tuple, order: tuple) -> tuple:
        all_tp, slowest_link = terms
        last = order[-1]
        if len(order) > 1:
            t = self._act_bytes[order[-2]] / self.inventory.link(order[-2], last).bytes_per_s
            slowest_link = t if slowest_link is None else max(slowest_link, t)
        return all_tp and bool(self.tp[last]), slowest_link

    def _meshes_terms(self, meshes: tuple, done: bool) -> tuple:
        """`_pipeline_bound`'s sums over the decided meshes: (rate, fastest, middle). Cached per tuple of meshes
        by identity (a node's children share their parent's decoded tuple; the entry keeps it alive)."""
        key = (id(meshes), done)
        out = self._mesh_sums.get(key)
        if out is None or out[0] is not meshes:
            rate, fastest, middle = 0.0, math.inf, []
            for i, c in enumerate(meshes):
                per = self.layer_time(c.cluster, c.tp, c.dp, c.micro_batch_size)
                rate += c.num_stages / per
                fastest = min(fastest, per)
                middle += [per] * max(0, c.num_stages - (i == 0) - (done and i == len(meshes) - 1))
            out = self._mesh_sums[key] = (meshes, (rate, fastest, tuple(middle)))
        return out[1]

    def _rest_shapes(self, clusters: tuple, S: int):
        """(rates, least layer times) of `clusters` at their best shapes at S with their own TP degrees
        (`_best_shape`), or None where one has none (the clusters after it not looked at, as `_pipeline_bound`
        stops there)."""
        cache = self._rest_bests.get(S)
        if cache is None:
            cache = self._rest_bests[S] = {}
        return by_prefix(cache, clusters, ((), ()), lambda shapes, c: self._extend_shapes(shapes, c, S))

    def _extend_shapes(self, shapes, clusters: tuple, S: int):
        best = None if shapes is None else self._best_shape(clusters[-1], S, self.tp[clusters[-1]])
        return None if best is None else (shapes[0] + (best[0],), shapes[1] + (best[1],))


def by_prefix(cache: dict, order: tuple, empty, extend):
    """cache[order], where each value is `extend(value of order[:-1], order)` and `empty` the empty order's: built
    from the order without its last cluster where that is cached (the tree extends an order one cluster at a time),
    else from the start (an order a local-search move made, the clusters after a mesh)."""
    out = cache.get(order, _MISSING)
    if out is not _MISSING:
        return out
    if not order:
        return empty
    value = cache.get(order[:-1], _MISSING)
    if value is _MISSING:
        value = empty
        for j in range(1, len(order)):
            value = extend(value, order[:j])
    value = cache[order] = extend(value, order)
    return value
