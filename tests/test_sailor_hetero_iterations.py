"""Sailor's measured runs on three GPU types (its MIT cluster: RTX 3090, TITAN RTX, RTX 2080 Ti; OPT-350, fp32):
the learned model's layers against the GPUs' measured layers at TP 1-8, and whole heterogeneous iterations composed
by the simulator against the measured ones (benchmarks/sailor_hetero_iterations.py prints both tables)."""
import dataclasses
import json
import os
import shutil
import statistics
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import sailor_hetero_iterations as H  # noqa: E402

from hetauto_megatron.cost import learned as L  # noqa: E402
from hetauto_megatron.errors import InputError  # noqa: E402
from hetauto_megatron.plan import costing  # noqa: E402
from hetauto_megatron.spec.inventory import inventory_from_dict  # noqa: E402

PCIE_GPUS = ("Titan-RTX", "RTX-2080", "RTX-3090")


@pytest.fixture(scope="module")
def fitted(sailor_model_dir):
    return L.LearnedCostModel(sailor_model_dir)     # hetauto fit --sailor --holdout 0 (tests/conftest.py)


@pytest.fixture(scope="module")
def measured_rows(fitted):
    """The nine runs composed with the GPUs' own measured layers (the composition alone)."""
    return H.compose(fitted, measured_layers=True)


def test_tp_all_reduces_are_read_at_the_rate_the_layers_ran_them(fitted):
    """On the PCIe GPUs the layers' TP all-reduces ran far below Sailor's all-reduce curves of the same nodes: the
    fit reads their rate from the layers (sailor_tp_allreduce_rates) and the planner prices the GPUs' TP
    collectives at it (`tp_link`), while a GPU whose layers ran them near the curve (the A100-40) keeps the node's
    link."""
    rates = L.sailor_tp_allreduce_rates(L.load_sailor(L.SAILOR_DATA))
    for dev in ("titan-rtx", "rtx-2080-ti", "rtx-3090"):
        assert all(r < 6e9 for _, r in rates[f"{dev}|tp8"]), (dev, rates[f"{dev}|tp8"])   # Sailor's curves: 5.3-24.6
    link = H.intra_link("Titan-RTX", 8)
    titan = inventory_from_dict({"clusters": [{"name": "t", "device": "titan-rtx", "nodes": 1,
                                               "devices_per_node": 8}]}).with_precision("fp32").clusters[0].device
    # the layers' rate, under half of what Sailor's all-reduce curve of the same node gives
    assert fitted.tp_link(titan, 8, link).bytes_per_s < 0.5 * link.bytes_per_s
    a100 = inventory_from_dict({"clusters": [{"name": "a", "device": "a100-40gb", "nodes": 1, "devices_per_node": 4,
                                              "tf32": True}]}).with_precision("fp32").clusters[0].device
    slow = dataclasses.replace(link, bandwidth_gbps=100.0)       # below every A100 reading: the link stands
    assert fitted.tp_link(a100, 2, slow) == slow


def _priced_against_measured(fitted, gpu: str, tp: int, micro_batches) -> list[float]:
    """|priced / measured - 1| of each pass of `gpu`'s OPT-350 layer at TP `tp`, priced as the planner prices it
    (stage_profile: learned compute, the TP all-reduces on the link the TP collectives run on, the host floor) on
    the node's link as Sailor measured it, against Sailor's measured median layer."""
    with open(os.path.join(L.SAILOR_DATA, "profiles_tmp.json")) as f:
        prof = json.load(f)["OPT-350"]
    model = L.SAILOR_MODELS["OPT-350"]
    inv = inventory_from_dict({"clusters": [{"name": "c", "device": L.SAILOR_GPUS[gpu], "nodes": 1,
                                             "devices_per_node": 8,
                                             "intra_node": H.measured_link("intra", max(tp, 2), max(tp, 2), gpu)}]})
    cluster = inv.with_precision("fp32").clusters[0]
    errs = []
    for mb in micro_batches:
        e = prof[gpu].get(str(mb), {}).get(str(tp))
        if not e:
            continue
        p = costing.stage_profile(model, cluster, tp, 1, mb, "none", fitted)
        for got, i in ((p.layer_fwd, 0), (p.layer_bwd, 1)):
            want = statistics.median(e[str(k)][i] for k in range(1, model.num_layers + 1))
            errs.append(abs(got / want - 1))
    return errs


def test_pcie_gpu_layers_at_every_tp_degree_match_their_measurements(fitted):
    """In sample (these GPUs were profiled on OPT-350 only): a layer priced as the planner prices it (learned
    compute, the TP all-reduces on the link the TP collectives run on, the host floor) against Sailor's measured
    median layer, TP 1-8, micro-batch 2-8, on each node's link as Sailor measured it. Target 10 % MAPE, the issue's
    per-pass target; setting the curve's all-reduce time apart instead of the layers' left 31 %, worst 122 %, with
    micro-batch 1 (TP 8 on the RTX 3090: +40 %, the host's share) 5 %."""
    errs = [e for gpu in PCIE_GPUS for tp in (1, 2, 4, 8) for e in _priced_against_measured(fitted, gpu, tp, (2, 4, 8))]
    assert len(errs) >= 60
    assert 100 * sum(errs) / len(errs) <= 10.0, 100 * sum(errs) / len(errs)


def test_all_reduces_through_host_memory_are_priced_at_the_rate_of_their_message_size(fitted):
    """In sample: the RTX 3090's layers at TP 8 ran their all-reduces at 2.0 GB/s with 8 MB messages (micro-batch
    1) and at 1.5 GB/s with 34 MB ones (micro-batch 4). Read as one rate (the largest message's, as the fit did
    before), its micro-batch 1 and 2 layers were priced 39 % and 12 % slower than they ran (the learned compute
    cannot take it back: it is never negative), and so was every run of the MIT cluster through that GPU.
    Target: the issue's per-pass target, 10 % MAPE over micro-batches 1, 2 and 4, and no pass 15 % off."""
    errs = _priced_against_measured(fitted, "RTX-3090", 8, (1, 2, 4))
    assert len(errs) == 6
    assert 100 * sum(errs) / len(errs) <= 10.0 and 100 * max(errs) <= 15.0, [round(100 * e, 1) for e in errs]


def test_a_model_fitted_with_one_all_reduce_rate_per_degree_still_reads(fitted, tmp_path):
    """Models fitted before the rates were kept by message size stored one rate per device and TP degree: they
    still read, at that rate for every size; a table out of order is refused, naming the field."""
    out = tmp_path / "old"
    shutil.copytree(fitted.model_dir, out)
    man = json.loads((out / "manifest.json").read_text())
    man["tp_allreduce_bytes_per_s"] = {k: v[-1][1] for k, v in man["tp_allreduce_bytes_per_s"].items()}
    (out / "manifest.json").write_text(json.dumps(man))
    old = L.LearnedCostModel(str(out))
    dev = inventory_from_dict({"clusters": [{"name": "c", "device": "rtx-3090", "nodes": 1, "devices_per_node": 8}]})
    dev = dev.with_precision("fp32").clusters[0].device
    link = H.intra_link("RTX-3090", 8)
    for nbytes in (8.4e6, 33.6e6, None):
        assert old.tp_link(dev, 8, link, nbytes).bytes_per_s == pytest.approx(man["tp_allreduce_bytes_per_s"]["rtx-3090|tp8"])
    man["tp_allreduce_bytes_per_s"]["rtx-3090|tp8"] = [[3e7, 1.5e9], [1e7, 2e9]]
    (out / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(InputError, match="tp_allreduce_bytes_per_s"):
        L.LearnedCostModel(str(out))


def test_whole_heterogeneous_iterations_composed_from_the_measured_layers_reach_sailors_simulator(measured_rows):
    """The composition alone (the same measured layer times Sailor's simulator reads; nothing of the runs fitted):
    the nine runs' pipelines, boundaries over the measured links, replica groups' gradient exchange and optimizer
    step against the measured iterations. Target: Sailor's simulator on the same runs, 10.3 % MAPE, worst 27.3 %."""
    errs = [abs(H.pct(r["predicted_s"], r["measured_s"])) for r in measured_rows]
    assert len(errs) == 9 and sum(errs) / len(errs) <= 10.3 and max(errs) <= 27.3, errs


def test_whole_heterogeneous_iterations_reach_sailors_simulator(fitted):
    """The nine measured runs composed with the learned model (out of sample: nothing of the runs is fitted); the
    target is Sailor's own simulator on the same runs, 10.3 % MAPE, worst run 27.3 %. Before the node's NIC was
    priced as shared by its links (`uplink_gbps`): 10.6 %."""
    rows = H.compose(fitted)
    assert len(rows) == 9 and all(r["predicted_s"] > 0 for r in rows)
    errs = [abs(H.pct(r["predicted_s"], r["measured_s"])) for r in rows]
    assert sum(errs) / len(errs) <= 10.3 and max(errs) <= 27.3, errs


def test_a_node_exchanging_with_several_nodes_at_once_shares_its_nic(measured_rows):
    """The runs whose stages hold three to six replica groups, a node each: the RTX 3090 node, whose every send
    curve reads 0.8 Gbit/s, exchanges gradients with two to five nodes at once through its one NIC (the cluster's
    `uplink_gbps`). Priced as separate links, these runs came out 17.5 % and 28 % short (six groups: 50.98 s
    against 70.79 measured). Target: the nine runs' target, 10.3 % MAPE, on these three with the measured layers
    (the composition alone)."""
    rows = [r for r in measured_rows if r["max_groups"] >= 3]
    errs = [abs(H.pct(r["predicted_s"], r["measured_s"])) for r in rows]
    assert len(errs) == 3 and sum(errs) / len(errs) <= 10.3, errs


def test_a_rate_between_two_measured_sizes_interpolates_the_time_per_byte():
    """Hand figures: 2 GB/s measured at 1 MB, 1 GB/s at 4 MB. At 2 MB (halfway on the logarithm) the time per byte
    is the mean of 0.5 and 1 ns: 1.333 GB/s; outside the sizes the nearest one's rate; None the largest's; one bare
    rate (a model fitted before the sizes were kept) at every size."""
    points = ((1e6, 2e9), (4e6, 1e9))
    assert L.allreduce_rate_at(points, 2e6) == pytest.approx(4e9 / 3)
    assert L.allreduce_rate_at(points, 1e5) == 2e9 and L.allreduce_rate_at(points, 1e8) == 1e9
    assert L.allreduce_rate_at(points, None) == 1e9 and L.allreduce_rate_at(3e9, 1e6) == 3e9
