"""A link's per-connection rate (`flow_gbps`): a boundary between clusters moves its bytes over as many concurrent
connections as its transfers have rank pairs, each at most `flow_gbps`, all together at most `bandwidth_gbps`.

Checked against what it models: the pair count against the runtime's own transfer list (compute_transfers), and
the pricing against Sailor's packaged send measurements (multizone_bandwidths_het.json: N GPUs on one VM each
sending to one GPU of another VM at once, the bandwidth of all N together), held out: the per-connection rate is
fitted on the 1-pair curve, the aggregate on the 4-pair curve, and the 2-pair curve is predicted.
"""
import json
import math
import os
from collections import namedtuple

import numpy as np
import pytest

from hetauto_megatron.cost.learned import SAILOR_DATA
from hetauto_megatron.errors import InputError
from hetauto_megatron.plan.link_costs import boundary_pairs
from hetauto_megatron.runtime.transfers import Share, compute_transfers
from hetauto_megatron.spec.inventory import LinkSpec, inventory_from_dict

M = namedtuple("M", "tp dp")
SEQ = 24


@pytest.mark.parametrize("src", [M(1, 1), M(2, 1), M(4, 1), M(1, 2), M(2, 2), M(1, 4), M(4, 4), M(3, 2), M(1, 16)])
@pytest.mark.parametrize("dst", [M(1, 1), M(2, 1), M(1, 2), M(2, 4), M(1, 8), M(4, 2), M(8, 1), M(1, 16)])
def test_pairs_are_the_runtime_transfers_rank_pairs(src, dst):
    batch = 48
    pairs = {(t.src_tp, t.src_dp, t.dst_tp, t.dst_dp) for t in compute_transfers(src, dst, (SEQ, batch, 2))}
    assert boundary_pairs([(0, batch, src.tp, src.dp)], [(0, batch, dst.tp, dst.dp)], SEQ) == len(pairs)


def test_pairs_of_meshes_side_by_side():
    """Sides of several meshes (alongside groups): the pairs of every mesh pair whose samples overlap add up."""
    senders = [Share(1, 6, 0, 24), Share(4, 2, 24, 40)]
    receivers = [Share(2, 5, 0, 10), Share(1, 10, 10, 40)]
    pairs = {(t.src_mesh, t.src_tp, t.src_dp, t.dst_mesh, t.dst_tp, t.dst_dp)
             for t in compute_transfers(senders, receivers, (SEQ, 40, 2))}
    count = sum(boundary_pairs([(s.start, s.stop, s.tp, s.dp)], [(r.start, r.stop, r.tp, r.dp)], SEQ)
                for s in senders for r in receivers)
    assert count == len(pairs)


def test_rate_by_connections():
    link = LinkSpec(24.0, 0.002, flow_gbps=3.2)
    assert link.transfer_time(8e6, 1) == pytest.approx(0.002 + 8e6 / (3.2e9 / 8))
    assert link.transfer_time(8e6, 4) == pytest.approx(0.002 + 8e6 / (12.8e9 / 8))
    assert link.transfer_time(8e6, 16) == pytest.approx(0.002 + 8e6 / (24e9 / 8))   # the aggregate binds
    assert LinkSpec(24.0, 0.002).transfer_time(8e6, 1) == pytest.approx(0.002 + 8e6 / 3e9)  # no flow limit given


def test_flow_field_is_read_written_and_checked():
    clusters = [{"name": "a", "device": "a100", "nodes": 1, "devices_per_node": 4},
                {"name": "b", "device": "v100", "nodes": 1, "devices_per_node": 4}]
    inv = inventory_from_dict({"clusters": clusters, "links": [
        {"between": ["a", "b"], "bandwidth_gbps": 24, "latency_ms": 2, "flow_gbps": 3.2}]})
    assert inv.link("a", "b").flow_gbps == 3.2
    assert inventory_from_dict(inv.to_dict()).link("a", "b") == inv.link("a", "b")
    with pytest.raises(InputError) as exc:
        inventory_from_dict({"clusters": clusters, "links": [
            {"between": ["a", "b"], "bandwidth_gbps": 24, "flow_gbps": 30}]})
    assert exc.value.field == "links[0].flow_gbps"


def _fit(times, nbytes):
    """(bytes/s, latency s) of time = latency + bytes / bandwidth, least squares in relative error."""
    a = np.array([[1 / t, n / t] for t, n in zip(times, nbytes)])
    lat, inv_bw = np.linalg.lstsq(a, np.ones(len(times)), rcond=None)[0]
    return 1 / inv_bw, lat


# The cloud VMs' curves (GCP, A100-40 and V100-16): N GPUs per VM sending at once over one path. The MIT cluster's
# (TITAN RTX, RTX 2080 Ti, RTX 3090) are not of that kind: between a TITAN RTX and a 2080 Ti node its 1- and 8-GPU
# curves read 0.9 Gbit/s where its 2- and 4-GPU ones read 23 (benchmarks/sailor_hetero_iterations.py reads them as
# Sailor's simulator does).
CLOUD_GPUS = ("A100-40", "V100-16")


def _pair_curves():
    with open(os.path.join(SAILOR_DATA, "multizone_bandwidths_het.json")) as f:
        curves = json.load(f)
    seen = {}
    for sz, by_gpu in curves.items():
        for sg, by_n in by_gpu.items():
            if sg not in CLOUD_GPUS:
                continue
            for rz, by_rgpu in by_n["1"].items():
                for rg in by_rgpu:
                    co = tuple(tuple(curves[sz][sg][n][rz][rg][n][0]) for n in ("1", "2", "4"))
                    seen.setdefault(co, f"{sz} {sg} -> {rz} {rg}")
    return [(name, co) for co, name in seen.items()]


SIZES = [2 ** (k / 2) * 1e6 for k in range(21)]      # bytes per pair, 1 MB .. 1 GB


def _times(co, pairs):
    """Measured seconds for `pairs` pairs each sending s bytes at once (the curve is their total GB/s)."""
    out = []
    for s in SIZES:
        x = math.log2(s / 1e6)
        out.append(pairs * s / ((co[0] * x * x + co[1] * x + co[2]) * 1e9))
    return out


def test_concurrent_pairs_against_measured_sends():
    """Held out: the 2-pair curve of every zone and GPU pair, from the 1-pair rate and the 4-pair aggregate.
    Target: within 35 % (mean absolute error over 1 MB - 1 GB) on every pair, 25 % on average, and never worse
    than pricing the aggregate alone (the model before flow_gbps)."""
    errors, rows = [], []
    for name, co in _pair_curves():
        flow, _ = _fit(_times(co[0], 1), SIZES)
        agg, lat = _fit(_times(co[2], 4), [4 * s for s in SIZES])
        link = LinkSpec(agg * 8 / 1e9, lat, flow_gbps=min(flow, agg) * 8 / 1e9)
        meas = _times(co[1], 2)
        new = np.mean([abs(link.transfer_time(2 * s, 2) / t - 1) for s, t in zip(SIZES, meas)])
        old = np.mean([abs(link.transfer_time(2 * s) / t - 1) for s, t in zip(SIZES, meas)])
        rows.append(f"{name}: flow {flow * 8e-9:.1f} Gbit/s, 4 pairs {agg * 8e-9:.1f} Gbit/s, 2 pairs predicted "
                    f"within {new:.1%} (aggregate alone {old:.1%})")
        errors.append(new)
        assert new <= old + 1e-9, rows[-1]
        assert new <= 0.35, rows[-1]
    print("\n".join(rows))
    assert np.mean(errors) <= 0.25, "\n".join(rows)


def test_node_network_caps_the_dp_ring_and_the_sends_inside_a_cluster():
    """inter_node.node_gbps: a node's devices share one NIC (a cloud VM). A DP ring of TP 1 x DP 16 over 4 nodes of
    4 crosses each node with 4 devices: 4 x 15.6 = 62.4 Gbit/s with a NIC per device, the node's 48 with one
    (Sailor's measured 4 concurrent pairs between two A100 VMs, same zone)."""
    from hetauto_megatron.plan.link_costs import dp_ring_link
    raw = {"clusters": [{"name": "a", "device": "a100", "nodes": 4, "devices_per_node": 4,
                         "inter_node": {"bandwidth_gbps": 15.6, "latency_us": 568}}]}
    per_device = inventory_from_dict(raw).cluster("a")
    raw["clusters"][0]["inter_node"]["node_gbps"] = 48.0
    shared = inventory_from_dict(raw).cluster("a")
    assert inventory_from_dict(inventory_from_dict(raw).to_dict()).cluster("a").inter_node.node_gbps == 48.0
    assert dp_ring_link(per_device, 1, 16).bandwidth_gbps == pytest.approx(62.4)
    assert dp_ring_link(shared, 1, 16).bandwidth_gbps == pytest.approx(48.0)
    # TP 4 x DP 4: four rings (one per TP rank) of one member per node reduce at once, so the node's four devices
    # send together as in the measured 4-pair case: 48 / 4 each, not one pair alone's 15.6 (that only with a NIC
    # per device); TP 2 x DP 8: two rings of two members, 48 / 2 each.
    assert dp_ring_link(per_device, 4, 4).bandwidth_gbps == pytest.approx(15.6)
    assert dp_ring_link(shared, 4, 4).bandwidth_gbps == pytest.approx(12.0)
    assert dp_ring_link(per_device, 2, 8).bandwidth_gbps == pytest.approx(31.2)
    assert dp_ring_link(shared, 2, 8).bandwidth_gbps == pytest.approx(24.0)
