"""A cluster's uplink (`uplink_gbps`): what all of its links to other clusters carry together.

The field is read, written and checked like the inventory's other figures; each of the cluster's links is priced
no faster than it; and where one exchange step moves bytes between a cluster and several others at once (the
gradient exchange among three or more replica groups) the step lasts at least the cluster's bytes over it. The
figures here are hand-computed from the exchange's definition (runtime/replica_sync.py: each of H holders the
root of 1/H of the elements; a gather phase, then a scatter phase). The measured check is
tests/test_sailor_hetero_iterations.py: Sailor's runs whose stages hold three to six replica groups, one node each.
"""
import pytest

from hetauto_megatron.cost.analytic import AnalyticCostModel
from hetauto_megatron.cost.learned.sailor import SAILOR_MODELS
from hetauto_megatron.errors import InputError
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.plan.simulate import simulate
from hetauto_megatron.spec.inventory import inventory_from_dict
from hetauto_megatron.spec.whatif import apply_overrides

MODEL = SAILOR_MODELS["OPT-350"].replace(tie_embeddings=False)
LINK_GBPS = 20.0


def _inventory(names, uplink=None):
    clusters = [{"name": n, "device": "a100-40gb", "nodes": 1, "devices_per_node": 1,
                 **({"uplink_gbps": uplink} if uplink else {})} for n in names]
    links = [{"between": [a, b], "bandwidth_gbps": LINK_GBPS, "latency_ms": 0}
             for i, a in enumerate(names) for b in names[i + 1:]]
    return {"clusters": clusters, "links": links}


def test_uplink_is_read_written_and_checked():
    inv = inventory_from_dict(_inventory(["a", "b"], uplink=5))
    assert inv.cluster("a").uplink_gbps == 5
    assert inventory_from_dict(inv.to_dict()) == inv
    assert inv.link("a", "b").bandwidth_gbps == 5            # no link is faster than its clusters' uplinks
    assert inventory_from_dict(_inventory(["a", "b"], uplink=50)).link("a", "b").bandwidth_gbps == LINK_GBPS
    bad = _inventory(["a", "b"])
    bad["clusters"][1]["uplink_gbps"] = -1
    with pytest.raises(InputError) as exc:
        inventory_from_dict(bad)
    assert exc.value.field == "clusters[1].uplink_gbps"
    what_if = apply_overrides(inventory_from_dict(_inventory(["a", "b"])), ["cluster.b.uplink_gbps=2"])
    assert what_if.cluster("b").uplink_gbps == 2 and what_if.link("a", "b").bandwidth_gbps == 2


def _three_groups(uplink):
    """(plan, inventory) of one stage held by three replica groups (a cluster each, TP 1, DP 1, fp32)."""
    names = ["g0", "g1", "g2"]
    inv = _inventory(names, uplink)
    meshes = [{"cluster": n, "device_type": "a100-40gb", "tp": 1, "dp": 1, "micro_batch_size": 1,
               "recompute": "full", "stage_layers": [MODEL.num_layers], **({"alongside": True} if i else {})}
              for i, n in enumerate(names)]
    plan = plan_from_dict({"version": 4, "model": MODEL.to_dict(), "global_batch_size": 3, "precision": "fp32",
                           "meshes": meshes, "inventory": inv})
    return plan, inventory_from_dict(inv)


def _three_groups_sync_s(uplink):
    return simulate(*_three_groups(uplink), AnalyticCostModel(), engine="megatron").sync_s


def test_an_exchange_with_several_clusters_at_once_shares_the_uplink():
    """Each phase, every group sends 2/3 of the parameters' gradients (1/3 to each other root) and receives as
    much: on separate links each 1/3 takes its own link's time; through one uplink the 2/3 add up on it."""
    grads = 4 * MODEL.total_params                          # fp32 gradient buffer, every parameter in the stage
    alone = 2 * (grads / 3) / (LINK_GBPS * 1e9 / 8)          # two phases, 1/3 per link
    assert _three_groups_sync_s(None) == pytest.approx(alone, rel=0.02)
    shared = 2 * (2 * grads / 3) / (15.0 * 1e9 / 8)           # uplink 15 Gbit/s: below the link, above half of it
    assert _three_groups_sync_s(15.0) == pytest.approx(shared, rel=0.02)


def test_explain_names_the_uplink_where_it_binds():
    """Two clusters on a 20 Gbit/s link, one of them behind a 0.5 Gbit/s uplink, one stage each: the pipeline is
    bound by the activations crossing at 0.5 Gbit/s. A faster link changes nothing; a faster uplink does."""
    from hetauto_megatron.plan.explain import sensitivity
    inv = _inventory(["a", "b"])
    inv["clusters"][1]["uplink_gbps"] = 0.5
    meshes = [{"cluster": n, "device_type": "a100-40gb", "tp": 1, "dp": 1, "micro_batch_size": 1,
               "recompute": "full", "stage_layers": [MODEL.num_layers // 2]} for n in ("a", "b")]
    plan = plan_from_dict({"version": 4, "model": MODEL.to_dict(), "global_batch_size": 8, "precision": "fp32",
                           "meshes": meshes, "inventory": inv})
    rows = {r["key"]: r for r in sensitivity(plan, inventory_from_dict(inv), AnalyticCostModel())}
    link, uplink = rows["link.a-b.bandwidth_gbps"], rows["cluster.b.uplink_gbps"]
    assert link["cases"][1]["tokens_per_s"] == pytest.approx(link["base_tokens_per_s"])
    assert uplink["cases"][1]["tokens_per_s"] > 1.1 * uplink["base_tokens_per_s"]
    assert uplink["cases"][0]["tokens_per_s"] < uplink["base_tokens_per_s"]


def test_explain_of_replica_groups_names_the_uplink():
    """The three groups behind 15 Gbit/s uplinks on 20 Gbit/s links: the exchange is bound by the uplinks, so a
    faster link changes nothing and faster uplinks do (explain's report for plans of several meshes per stage)."""
    from hetauto_megatron.plan.multi_explain import shapes_report
    rows = {r["what"]: r for r in shapes_report(*_three_groups(15.0), AnalyticCostModel())["sensitivity"]}
    assert rows["link g0-g1 bandwidth"]["cases"][1]["change"] == pytest.approx(0.0, abs=1e-4)   # (rounded base)
    up = rows["cluster g0 uplink"]["cases"]
    assert up[0]["change"] < -0.1 and up[1]["change"] == pytest.approx(0.0, abs=1e-4)   # x2 of one: the others bind
