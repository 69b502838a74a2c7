"""--objective cost pays for the devices a plan uses, so part of a cluster can be the cheapest plan: the search's tree
offers it (a mesh's stage count is a decision under the cost objective), and a device cap can only make it dearer."""
import math

import pytest

from hetauto_megatron.cost.analytic import AnalyticCostModel
from hetauto_megatron.plan import space as space_mod
from hetauto_megatron.plan.constraints import Constraints, devices_by_cluster, objective_value
from hetauto_megatron.plan.evaluator import LayoutEvaluator
from hetauto_megatron.plan.search import SearchConfig, layout_value, search
from hetauto_megatron.spec.inventory import inventory_from_dict
from hetauto_megatron.spec.model import PRESETS

COST = AnalyticCostModel()
# 64 H800 at 2 per device-hour (the README's two-cluster example without its Ascends): the fewest devices that hold
# llama2-7b are cheaper per token than all 64 (less DP traffic per sample)
ONE = {"clusters": [{"name": "h800", "device": "H800", "nodes": 8, "devices_per_node": 8,
                     "price_per_device_hour": 2.0}]}
TWO = {"clusters": [{"name": "a", "device": "H100-SXM", "nodes": 2, "devices_per_node": 8,
                     "price_per_device_hour": 4.0},
                    {"name": "b", "device": "A100-80GB", "nodes": 2, "devices_per_node": 8,
                     "price_per_device_hour": 1.0}],
       "links": [{"between": ["a", "b"], "bandwidth_gbps": 100}]}


def _cost(model, inv, gbs, method, **constraints):
    con = Constraints(objective="cost", **constraints)
    r = search(model, inv, gbs, COST, SearchConfig(method=method, constraints=con))
    return objective_value(con, inv, r.iteration_time_s, devices_by_cluster(r.choices))


@pytest.mark.parametrize("method", ["mcts", "exhaustive"])
def test_cost_search_is_no_dearer_without_a_device_cap(method):
    """The unconstrained search holds every plan --max-devices N allows, so it is never dearer (it kept all 64
    devices, 0.04625 per 1M tokens, where --max-devices 8 found 8 at 0.04605: its tree gave each mesh every stage
    its devices allow, and a settled enumeration climbs from nothing)."""
    inv, model = inventory_from_dict(ONE), PRESETS["llama2-7b"]
    free = _cost(model, inv, 512, method)
    for n in (4, 8, 16, 32, 48):
        assert free <= _cost(model, inv, 512, method, max_devices=n) * (1 + 1e-9), n


def test_cost_tree_holds_every_leaf_of_a_capped_tree():
    """Under the cost objective every leaf of the tree with --max-devices N is a leaf of the tree without it (the
    throughput objective's tree gives each mesh the most stages its devices allow, and need not)."""
    inv, model = inventory_from_dict(TWO), PRESETS["llama2-7b"]
    free = space_mod.SearchSpace(model, inv, 64, COST, constraints=Constraints(objective="cost"))
    held = {free.leaf_meshes(p) for p in space_mod.iter_leaves(free)} - {None}
    for n in (8, 12, 24):
        capped = space_mod.SearchSpace(model, inv, 64, COST, constraints=Constraints(objective="cost", max_devices=n))
        value = layout_value(capped, LayoutEvaluator(model, inv, 64, COST))
        for p in space_mod.iter_leaves(capped):
            t, layout = value(p)
            if layout is not None and math.isfinite(t):     # (the tree leaves out stage counts that cannot fit)
                assert layout in held, (n, layout)


def test_a_stage_decisions_bounds_in_one_pass_are_the_general_ones():
    """`_stage_bounds` prices every child of a stage decision in one pass (the same terms as `bound`'s general pass,
    summed in another order): on random paths of random priced instances both give the same figure."""
    import random

    class General(space_mod.SearchSpace):
        def _stage_bounds(self, path):
            return None

    devices = ["a100-80gb", "a100-40gb", "h100-sxm", "l40s", "mi300x", "ascend-910b", "h20"]
    compared = 0
    for inst in range(12):
        rng = random.Random(inst)
        names = "abc"[:rng.choice([1, 2, 3])]
        inv = inventory_from_dict({
            "clusters": [{"name": x, "device": rng.choice(devices), "nodes": rng.choice([1, 2, 3]),
                          "devices_per_node": rng.choice([4, 8]),
                          "price_per_device_hour": rng.choice([0.3, 1.0, 2.5, 9.0])} for x in names],
            "links": [{"between": [a, b], "bandwidth_gbps": rng.choice([10, 25, 100])}
                      for i, a in enumerate(names) for b in names[i + 1:]]})
        model, gbs = PRESETS[rng.choice(["llama2-7b", "llama2-13b"])], rng.choice([32, 64, 128])
        one, general = (cls(model, inv, gbs, COST, constraints=Constraints(objective="cost"))
                        for cls in (space_mod.SearchSpace, General))
        for _ in range(40):
            path = ()
            while one.actions(path):
                path += (rng.choice(one.actions(path)),)
                a, b = one.bound(path), general.bound(path)
                assert a == pytest.approx(b, rel=1e-12) or (math.isinf(a) and math.isinf(b)), (inst, path, a, b)
                compared += 1
    assert compared > 500


def test_every_catalog_accelerator_has_its_own_compute_units():
    """The GEMMs' wave quantisation spreads a GEMM's output tiles over the device's SMs (CUs, AI cores): a catalog
    accelerator missing from COMPUTE_UNITS took its vendor's default, the A100's 108, so the RTX 3090 (82 SMs),
    2080 (46), 2080 Ti (68) and TITAN RTX (72) were priced with a third to twice more SMs than their datasheets
    give. Every catalog accelerator has its own count; the default is for types an inventory defines."""
    from hetauto_megatron.cost.analytic import COMPUTE_UNITS
    from hetauto_megatron.spec.devices import CATALOG

    assert [n for n, d in CATALOG.items() if d.vendor != "cpu" and n not in COMPUTE_UNITS] == []
