"""The exchange that sums the gradients of parameters several mesh stages hold across their holders, as
runtime/replica_sync.py runs it (one pipeline's tied embedding table included): its seconds, its steps and its
bytes between clusters. Part of the iteration tail (tail_costs.py iteration_sync_time)."""
from __future__ import annotations

import math

from ..cost.model_state import grad_buffer_bytes
from ..spec.inventory import Inventory
from ..spec.model import ModelSpec
from .costing import StageProfile
from .exchange_roots import exchange_weights, run_edges, source_ranks
from .link_costs import link_between, rank_pairs_share
from .vocab_padding import model_padded_vocab_size


def owner_ranks(prof: StageProfile) -> int:
    """Ranks of a holder that own (source) a distinct part of its gradient (exchange_roots.source_ranks)."""
    return source_ranks(prof.tp, prof.dp, prof.settings.distributed_optimizer)


def holders_sync_time(inventory: Inventory, blocks, rule=exchange_weights) -> float:
    """Seconds of the exchange that sums every shared parameter's gradient across the mesh stages holding it, as
    runtime/replica_sync.py runs it, for every plan shape (one pipeline's tied embedding table included).
    `blocks`: [((parameters, of which every TP rank keeps a copy), [(cluster, StageProfile, key), ...])], each
    block's holders sorted by key (mesh index, stage).

    Two holders: one phase, each holder's source ranks send their reduced gradient of the elements they own to
    the other holder's and receive its, both directions at once. Three or more (H holders): holder j is the
    root of a run of the elements in proportion to its weight (shard_regions.root_chunks; plan/exchange_roots.py,
    the runtime's rule, weighs them by the links: equal, the roots taking turns, unless other shares make the
    busiest link less busy); in a gather phase each root's source ranks receive every other holder's reduced
    gradient of those elements, after the sums a scatter phase sends the result back to the same source ranks:
    between any two holders the root's run each way in each phase (1/H of the parameter with equal weights). The pair moves run in the gather's
    phase; the scatter starts when that phase is done. Each phase is one message per pair of ranks for all
    parameters at once. Bytes are the gradient buffer's (gradient-reduce dtype). Every link is full duplex (as
    for pipeline boundaries: each direction its own resource). Between clusters a phase's bytes in one
    direction of an inventory link add up (one transfer at the link's bandwidth), and so do all of a cluster's
    bytes out (in) over all its links where it has an uplink (`uplink_gbps`: one more resource per direction,
    without latency, which its links already pay); inside a cluster the rank
    pairs run in parallel on the inter-node network, each root rank sending or receiving its share (the side
    with fewer owner ranks sets it) at its device's rate, or its share of the node's NIC (`node_gbps`). A phase lasts as long as its busiest link direction or root rank
    direction. Then, inside every holder at once, the ranks that are not sources take the sum from theirs:
    without the distributed optimizer a broadcast to the DP replicas of every synced local tensor (on the
    mesh's DP link), then for what TP duplicates (the norms, the row-parallel biases, a learned position table) a
    broadcast to the other TP ranks of the part each holds (on the node's link). Runs after the DP reduction, before the optimizer
    step: exposed in full. `rule(inventory, clusters, owners)`: the roots' weights of three or more holders
    (the runtime's, exchange_weights, unless explain prices another choice)."""
    steps = holders_sync_steps(inventory, blocks, rule)
    return sum((max((sec for sec, _ in step.values()), default=0.0) for _, step in steps), 0.0)


def holders_sync_steps(inventory: Inventory, blocks, rule=exchange_weights) -> list[tuple[str, dict]]:
    """holders_sync_time's steps, one after the other: [(step, {resource: (seconds, bytes)})] for the gather phase
    (where pairs swap too), the scatter phase and the broadcasts inside every holder; a step lasts as long as
    its busiest resource, and holders_sync_time is their sum (plan/timeline.py draws them where they run).
    Resources: ("link", from cluster, to cluster), ("uplink", cluster, "out" | "in"), ("ranks", holder, cluster,
    "in" | "out"), ("copies", holder, cluster)."""
    if not blocks:
        return []
    phases, copies, pairs = _exchange_traffic(inventory, blocks, rule)
    steps = []
    for name, phase, phase_pairs in zip(("gather phase", "scatter phase"), phases, pairs):
        out = {}
        for res, nbytes in phase.items():
            if res[0] == "link":
                # one connection per rank pair (gloo), so a link's per-connection rate (flow_gbps) caps what few
                # pairs move, as for pipeline boundaries
                flows = sum(phase_pairs.get(res, {}).values()) or None
                t = link_between(inventory, res[1], res[2]).transfer_time(nbytes, flows)
            elif res[0] == "uplink":
                up = inventory.cluster(res[1]).uplink_bytes_per_s
                t = nbytes / up if up else 0.0
            else:
                t = inventory.cluster(res[2]).inter_node.transfer_time(nbytes)
            out[res] = (t, nbytes)
        steps.append((name, out))
    steps.append(("copies inside holders", {
        ("copies", key, prof.cluster.name): ((prof.dp_link.transfer_time(dp) if dp else 0.0) +
                                             (prof.cluster.intra_node.transfer_time(tp) if tp else 0.0), dp + tp)
        for key, (dp, tp, prof) in copies.items()}))
    return steps


def holders_cross_cluster_bytes(inventory: Inventory, blocks, rule=exchange_weights) -> float:
    """Bytes the exchange of holders_sync_time moves between clusters per iteration (both phases, both
    directions of every inventory link)."""
    phases = _exchange_traffic(inventory, blocks, rule)[0] if blocks else []
    return sum(nbytes for phase in phases for res, nbytes in phase.items() if res[0] == "link")


def exchange_pairs(a: int, b: int) -> int:
    """Rank pairs that exchange elements between two holders whose a and b source ranks each own an even run of the
    same elements: a + b - gcd(a, b), the runs' boundaries taken together (each piece between two boundaries is one
    pair). Where TP cuts a parameter's rows or columns the regions are rectangles and the runtime's pairs
    (runtime/shard_regions.py) may be more; the estimate prices the per-connection limit of a long-haul link."""
    return a + b - math.gcd(a, b)


def _exchange_traffic(inventory: Inventory, blocks, rule) -> tuple[list[dict], dict, list[dict]]:
    """(per phase: resource -> bytes, per holder: [DP broadcast bytes, TP broadcast bytes, its profile], per phase:
    link resource -> {(sending holder, receiving holder): rank pairs}) of the exchange holders_sync_time prices. Resources:
    ("link", from cluster, to cluster), ("uplink", cluster, "out" | "in"), ("ranks", holder, cluster, "in" |
    "out"). A pair of holders' rank pairs (exchange_pairs) count once per phase and link however many parameters
    they exchange: every parameter's messages of a rank pair go in one message (one connection)."""
    phases = [{}, {}]          # per phase: resource (one direction) -> bytes
    copies: dict = {}          # holder -> [DP broadcast bytes, TP broadcast bytes, its profile]
    pairs = [{}, {}]           # per phase: link resource -> {(sending holder, receiving holder): rank pairs}

    def add(phase: int, res, nbytes: float, holders=None, ranks: int = 0) -> None:
        phases[phase][res] = phases[phase].get(res, 0.0) + nbytes
        if holders is not None:
            pairs[phase].setdefault(res, {})[holders] = ranks

    for (n, dup), hs in blocks:
        if len(hs) < 2 or n == 0:
            continue
        for c, prof, key in hs:
            gb = grad_buffer_bytes(prof.cluster.device.dtype_bytes, prof.settings)
            sharded = prof.settings.distributed_optimizer
            acc = copies.setdefault(key, [0.0, 0.0, prof])
            if not sharded and prof.dp > 1:
                acc[0] += gb * ((n - dup) / prof.tp + dup)            # every rank's whole local tensor
            if prof.tp > 1:
                acc[1] += gb * dup / (prof.dp if sharded else 1)      # the part of the duplicates it holds
        roots = hs[:1] if len(hs) == 2 else hs          # two holders: the pair phase, priced as a gather both ways
        weights = ((1,) if len(hs) == 2 else
                   rule(inventory, [c for c, _, _ in hs], [owner_ranks(p) for _, p, _ in hs]))
        edges = run_edges(int(n), weights)
        for j, (rc, rp, rk) in enumerate(roots):
            run = edges[j][1] - edges[j][0]          # the elements this holder is the root of
            if not run:
                continue
            for c, prof, key in hs:
                if key == rk:
                    continue
                gb = grad_buffer_bytes(prof.cluster.device.dtype_bytes, prof.settings)
                sent = gb * run                                       # its run of the elements, once each way
                back = 0 if len(hs) == 2 else 1
                to_pair = from_pair = None
                ranks = 0
                if c != rc:
                    to_root, from_root = ("link", c, rc), ("link", rc, c)
                    # keyed by direction (sender, receiver): the same two holders meet in blocks of two and of
                    # more, with either the root, and their rank pairs on a link direction count once
                    to_pair, from_pair = (key, rk), (rk, key)
                    ranks = exchange_pairs(owner_ranks(prof), owner_ranks(rp))
                    # every link out of (into) a cluster also crosses its uplink, where the inventory gives one
                    add(0, ("uplink", c, "out"), sent)
                    add(0, ("uplink", rc, "in"), sent)
                    add(back, ("uplink", rc, "out"), sent)
                    add(back, ("uplink", c, "in"), sent)
                else:
                    # each root rank's share, counted at the per-device rate (longer where a node's NIC is shared)
                    sent *= rank_pairs_share(inventory.cluster(c), min(owner_ranks(prof), owner_ranks(rp)))
                    to_root, from_root = ("ranks", rk, c, "in"), ("ranks", rk, c, "out")
                add(0, to_root, sent, to_pair, ranks)
                add(back, from_root, sent, from_pair, ranks)
    return phases, copies, pairs


def tied_table_blocks(model: ModelSpec, meshes, first: StageProfile, last: StageProfile) -> list:
    """One pipeline of single meshes: its only parameter with two holders is a tied embedding table, held by the
    first stage (word embeddings, the root) and the last stage (output layer). The block for holders_sync_time
    (none untied or with one stage). `meshes`: the plan's mesh list or MeshChoices (cluster, tp, dp,
    num_stages), pipeline order; the table has the plan's padded vocabulary, as every mesh builds it."""
    if not model.tie_embeddings or sum(m.num_stages for m in meshes) == 1:
        return []
    table = model_padded_vocab_size(model, [m.tp for m in meshes]) * model.hidden_size
    return [((table, 0), [(meshes[0].cluster, first, (0, 0)),
                          (meshes[-1].cluster, last, (len(meshes) - 1, meshes[-1].num_stages - 1))])]
