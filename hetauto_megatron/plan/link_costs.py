"""What links cost: the link a DP group's ring runs on, the link between two clusters, and one micro-batch's
activation crossing a stage boundary.

Boundary transfers are priced as runtime/communicator.py sends them: inside a cluster every sending device its
own shard on its own path, between clusters each byte once over the inventory's site-to-site link, over as many
concurrent connections as the boundary has rank pairs (`boundary_pairs`). The simulator, the search's evaluator,
the multi-pipeline simulator and DeepSpeed's schedule (plan/deepspeed_schedule.py) all price boundaries here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InputError
from ..spec.inventory import Cluster, Inventory, LinkSpec
from ..spec.model import ModelSpec
from .shared_uplinks import boundary_uplinks

if TYPE_CHECKING:     # (costing imports this module: the profile is only named here)
    from .costing import StageProfile


def dp_ring_link(cluster: Cluster, tp: int, dp: int) -> LinkSpec:
    """The link a DP group's ring runs at. Inside one node: the intra-node link. Across nodes, the group has
    k = min(dp, devices_per_node / tp) members per node, each with its own NIC (the inventory's inter_node
    bandwidth is per device); NCCL runs one ring channel per NIC, so each node crossing carries k NICs'
    bandwidth, up to the intra-node link's, and up to its share of the node's own (`node_gbps`: one NIC for the
    node). Every TP rank has its own DP group and they all reduce at once, so a node's NIC carries the rings of
    every mesh device on the node: devices_per_node / k of them (TP 4 x DP 4 on nodes of 4: four rings of one
    member each, a quarter of the NIC each; TP 1 x DP 16: one ring of four members, the whole NIC)."""
    if tp * dp <= cluster.devices_per_node:
        return cluster.intra_node
    k = max(1, min(dp, cluster.devices_per_node // tp))
    # every device of the node sends at once (the mesh fills its nodes: tp x dp > devices_per_node), k per ring
    member = rank_rate_gbps(cluster, cluster.devices_per_node)
    return LinkSpec(min(k * member, cluster.intra_node.bandwidth_gbps), cluster.inter_node.latency_s)


def rank_rate_gbps(cluster: Cluster, senders_per_node: int) -> float:
    """Gbit/s of each of a node's `senders_per_node` devices sending at once over the inter-node network: the
    per-device bandwidth, up to its share of the node's one NIC where the inventory gives `node_gbps`."""
    inter = cluster.inter_node
    if inter.node_gbps is None:
        return inter.bandwidth_gbps
    return min(inter.bandwidth_gbps, inter.node_gbps / max(1, min(senders_per_node, cluster.devices_per_node)))


def rank_pairs_share(cluster: Cluster, pairs: int) -> float:
    """What one of `pairs` rank pairs exchanging at once inside a cluster carries of a transfer, counted at the
    per-device inter-node rate: 1 / pairs, or more where the node's NIC is shared (`node_gbps`)."""
    return cluster.inter_node.bandwidth_gbps / rank_rate_gbps(cluster, pairs) / pairs


def link_between(inventory: Inventory, a: str, b: str) -> LinkSpec:
    """The link traffic between clusters a and b crosses: the inventory's, or where they are not adjacent in it
    the slowest link it lists (conservative); each no faster than its clusters' uplinks (Inventory.link). Clusters
    that no chain of links joins cannot exchange anything: an InputError naming the inventory's `links`."""
    if a == b:
        return inventory.link(a, b)
    link = inventory.link(a, b)
    if link is None:
        if not connected(inventory, (a, b)):
            raise InputError(f"clusters {a} and {b} exchange data in this plan (gradients between pipelines or "
                             "replica groups) but no link, direct or through other clusters, joins them",
                             file=inventory.source, field="links",
                             fix=f"add a links entry between: [{a}, {b}] (bandwidth_gbps, latency_ms), or plan "
                                 "without one of them (--exclude-clusters)")
        link = min((inventory.link(*sorted(k)) for k in inventory.links), key=lambda x: x.bytes_per_s)
    return link


def connected(inventory: Inventory, names) -> bool:
    """Whether the inventory's links join every cluster of `names` (directly or through other clusters)."""
    names = list(names)
    if len(names) < 2:
        return True
    reach, todo = {names[0]}, [names[0]]
    while todo:
        here = todo.pop()
        for pair in inventory.links:
            if here in pair:
                for other in pair:
                    if other not in reach:
                        reach.add(other)
                        todo.append(other)
    return all(n in reach for n in names)


def boundary_pairs(senders, receivers, seq: int) -> int:
    """How many (sending rank, receiving rank) pairs a boundary's transfers use at once: the runtime's
    `compute_transfers` blocks, one connection per pair (runtime/communicator.py). `senders` / `receivers`:
    (first sample, end sample, tp, dp) of each mesh of the two sides in one micro-batch step. A pair of
    replicas whose samples overlap exchanges one block per piece of the sequence cut at both TP shardings."""
    pairs = 0
    for s0, s1, stp, sdp in senders:
        for r0, r1, rtp, rdp in receivers:
            lo, hi = max(s0, r0), min(s1, r1)
            if lo >= hi:
                continue
            ms, mr = (s1 - s0) // sdp, (r1 - r0) // rdp
            cuts = {x for x in range(s0, s1, ms) if lo < x < hi} | {x for x in range(r0, r1, mr) if lo < x < hi}
            seq_cuts = {t * seq // stp for t in range(stp)} | {t * seq // rtp for t in range(rtp)} | {seq}
            pairs += (len(cuts) + 1) * (len(seq_cuts) - 1)
    return pairs


def boundary_transfer_time(model: ModelSpec, a: StageProfile, b: StageProfile, link: LinkSpec, same_cluster: bool,
                           samples_per_step: int, partitions: int = 1) -> float:
    """One micro-batch's activation (or its gradient) crossing a stage boundary.

    Inside a cluster every sending device has its own path: it sends its 1/tp sequence shard of its replica's
    activation (or, `partitions` > 1, its 1/partitions slice of the whole activation: DeepSpeed's engine,
    plan/deepspeed_schedule.py). Between clusters the inventory's link is the whole site-to-site bandwidth, shared by all
    replicas; hetauto sends each byte across once, so the whole step's activation crosses it, over as many
    concurrent connections as the boundary has rank pairs (a link with `flow_gbps` gives each its rate, up to
    the link's bandwidth)."""
    B = a.cluster.device.dtype_bytes   # what the sender computes in (the receiver casts if it differs)
    if same_cluster:
        # Without sequence parallelism every TP rank of the sender holds (and sends) the whole activation.
        shards = max(a.tp, b.tp) if a.settings.sequence_parallel else partitions
        nbytes = B * a.micro_batch_size * model.seq_length * model.hidden_size / shards
        if link.node_gbps is not None:   # the node's devices send at once through its one NIC
            return link.latency_s + nbytes / (rank_rate_gbps(a.cluster, a.tp * a.dp) * 1e9 / 8)
    else:
        nbytes = cross_boundary_bytes(model, a, samples_per_step)
        if link.flow_gbps is not None:
            S = samples_per_step
            return link.transfer_time(nbytes, boundary_pairs([(0, S, a.tp, a.dp)], [(0, S, b.tp, b.dp)],
                                                             model.seq_length))
    return link.transfer_time(nbytes)


def cross_boundary_bytes(model: ModelSpec, a: StageProfile, samples_per_step: int) -> float:
    """Bytes of one micro-batch step's activation (or its gradient) crossing from a stage on cluster a to another
    cluster: the whole step's, each byte once, in the element the sender computes in."""
    return a.cluster.device.dtype_bytes * samples_per_step * model.seq_length * model.hidden_size


def pipeline_uplinks(model: ModelSpec, inventory: Inventory, profs: list, samples_per_step: int):
    """The shared uplinks of a pipeline's boundaries (plan/shared_uplinks.py `boundary_uplinks`), from its stage
    profiles in pipeline order: None unless a cluster with `uplink_gbps` is at the end of two cross-cluster
    boundaries."""
    flows = []
    for a, b in zip(profs, profs[1:]):
        nbytes = cross_boundary_bytes(model, a, samples_per_step)
        crosses = a.cluster.name != b.cluster.name
        flows.append({(a.cluster.name, "out"): nbytes, (b.cluster.name, "in"): nbytes} if crosses else None)
    return boundary_uplinks(flows, lambda name: inventory.cluster(name).uplink_bytes_per_s)
