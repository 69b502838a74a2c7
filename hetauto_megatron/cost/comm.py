"""Communication time: collectives inside a cluster, point-to-point on any link (ring / alpha-beta models)."""
from __future__ import annotations

from ..spec.inventory import LinkSpec


def allreduce_time(nbytes: float, n: int, link: LinkSpec) -> float:
    """Ring all-reduce of nbytes over n ranks: 2(n-1)/n of the data crosses each link, 2(n-1) latency steps."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bytes_per_s + 2 * (n - 1) * link.latency_s


def reduce_scatter_time(nbytes: float, n: int, link: LinkSpec) -> float:
    """Ring reduce-scatter (or all-gather) of a buffer of nbytes over n ranks: half an all-reduce."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / link.bytes_per_s + (n - 1) * link.latency_s


all_gather_time = reduce_scatter_time

