"""How much of a gradient exchange among three or more each holder roots (plan/exchange_roots.py): the shares
that make the busiest link least busy (equal, the roots taking turns, where the links are); the runtime runs what
the planner prices.

Checked three ways: the rule on hand-made links, the price against a hand computation of the chosen exchange,
and a CPU dry run (real Megatron-Core, gloo, three processes) whose bytes per link direction, counted by the
runtime, are the chosen exchange's, with the loss of a single process.
"""
import json

import pytest
import yaml
from helpers import hetauto_here

from hetauto_megatron.cost.analytic import AnalyticCostModel
from hetauto_megatron.plan.exchange_roots import describe_roots, exchange_weights
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.plan.simulate import simulate
from hetauto_megatron.spec.inventory import inventory_from_dict
from hetauto_megatron.spec.model import PRESETS

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

NAMES = ["a", "b", "c"]


def _inventory(a_c_gbps, device="a100-40gb", per_node=1, uplink=None):
    fast = 20.0
    return {"clusters": [{"name": n, "device": device, "nodes": 1, "devices_per_node": per_node,
                          **({"uplink_gbps": uplink} if uplink else {})} for n in NAMES],
            "links": [{"between": ["a", "b"], "bandwidth_gbps": fast, "latency_ms": 0},
                      {"between": ["b", "c"], "bandwidth_gbps": fast, "latency_ms": 0},
                      {"between": ["a", "c"], "bandwidth_gbps": a_c_gbps, "latency_ms": 0}]}


def test_the_shares_make_the_busiest_link_least_busy():
    """Hand-solved: in a gather phase the link from holder i to root j carries j's share s_j of the table; a
    phase lasts as long as its busiest link direction (or uplink direction)."""
    even = inventory_from_dict(_inventory(20.0))
    assert exchange_weights(even, NAMES) == (1, 1, 1)            # 1/3 per link against 1 on two links
    assert exchange_weights(None, NAMES) == (1, 1, 1)            # a plan without an inventory
    # a - c at 2 Gbit/s, s_a = s_c = x: max(x / 2, (1 - 2 x) / 20) is least at x = 1/12, 1/24 s per Gbit of
    # table, where the turns take 1/6 (a third over 2 Gbit/s) and b as the one root 1/20
    far = inventory_from_dict(_inventory(2.0))
    assert exchange_weights(far, NAMES) == (1, 10, 1)
    assert exchange_weights(far, ["a", "c", "b"]) == (1, 1, 10)  # in holder order
    # at 10 Gbit/s: x / 10 = (1 - 2 x) / 20 at x = 1/4
    assert exchange_weights(inventory_from_dict(_inventory(10.0)), NAMES) == (1, 2, 1)
    # b's uplink at 10 Gbit/s takes a's and c's shares to b at once: max(x / 2, 2 (1 - 2 x) / 10) is least at
    # x = 2/9 (1/9 s per Gbit: the turns 1/6, b the one root 2/10)
    capped = _inventory(2.0)
    capped["clusters"][1]["uplink_gbps"] = 10.0
    assert exchange_weights(inventory_from_dict(capped), NAMES) == (2, 5, 2)
    # four sites, a - c at 2 Gbit/s, every other pair at 20: s_a = s_c = x, s_b = s_d = y with x / 2 = y / 20
    # and 2 x + 2 y = 1, x = 1/22 (1/44 s per Gbit, the turns 1/8)
    four = _inventory(2.0)
    four["clusters"].append(dict(four["clusters"][0], name="d"))
    four["links"] += [{"between": [n, "d"], "bandwidth_gbps": 20.0, "latency_ms": 0} for n in NAMES]
    assert exchange_weights(inventory_from_dict(four), NAMES + ["d"]) == (1, 10, 1, 10)
    # two holders of one cluster and a third elsewhere: the pairs inside a cluster run on its own network, and
    # a's link to b carries b's and the other a's shares, b's link to a both a's: equal shares are least
    assert exchange_weights(far, ["a", "a", "b"]) == (1, 1, 1)
    # eight TP ranks per group run eight pairs in parallel inside a (25 Gbit/s): b's share s_b crosses a - b
    # (100 Gbit/s) twice, the a groups' shares once: s_b = 1/3 (counted as one pair, b would get half)
    inside = {"clusters": [{"name": n, "device": "a100-80gb", "nodes": 4, "devices_per_node": 8,
                            "inter_node": {"bandwidth_gbps": 25.0, "latency_us": 0}} for n in "ab"],
              "links": [{"between": ["a", "b"], "bandwidth_gbps": 100.0, "latency_ms": 0}]}
    assert exchange_weights(inventory_from_dict(inside), ["a", "a", "b"], [8, 8, 8]) == (1, 1, 1)
    assert exchange_weights(inventory_from_dict(inside), ["a", "a", "b"]) == (1, 1, 2)
    # rates 10^13 apart (a - b at 1e-4 Gbit/s, the rest at 1e9): c and d root everything, without a failure
    extreme = {"clusters": [{"name": n, "device": "a100-80gb", "nodes": 1, "devices_per_node": 8} for n in "abcd"],
               "links": [{"between": [x, y], "bandwidth_gbps": 1e-4 if x + y == "ab" else 1e9, "latency_ms": 0}
                         for k, x in enumerate("abcd") for y in "abcd"[k + 1:]]}
    assert exchange_weights(inventory_from_dict(extreme), list("abcd")) == (0, 0, 1, 1)


def test_the_shares_in_words_tolerate_a_hand_edited_plan():
    assert describe_roots([{"holders": ["a", "b", "c"], "weights": [1, 10, 1]}]).endswith("a 1/12, b 10/12, c 1/12")
    for bad in ({"holders": None, "weights": [1, 1, 1]}, {"holders": 5, "weights": [1, 1, 1]},
                {"holders": ["a", "b"], "weights": [1, 1, 1]}, {"holders": ["a", "b"], "weights": [True, 1]},
                {"holders": ["a", "b"], "weights": [0, 0]}, {"weights": "x"}, "x", None):
        assert describe_roots([bad]).endswith(": -")


MODEL = PRESETS["llama2-7b"].replace(num_layers=4, tie_embeddings=False)


def _three_groups_plan(a_c_gbps):
    inv = _inventory(a_c_gbps)
    meshes = [{"cluster": n, "device_type": "a100-40gb", "tp": 1, "dp": 1, "micro_batch_size": 1,
               "recompute": "full", "stage_layers": [MODEL.num_layers], **({"alongside": True} if i else {})}
              for i, n in enumerate(NAMES)]
    plan = plan_from_dict({"version": 4, "model": MODEL.to_dict(), "global_batch_size": 3, "meshes": meshes,
                           "inventory": inv})
    return plan, inventory_from_dict(inv)


def _three_groups(a_c_gbps):
    return simulate(*_three_groups_plan(a_c_gbps), AnalyticCostModel())


def test_the_price_is_the_chosen_exchange():
    """Three replica groups of one stage, fp32 gradient buffers: with a - c at 2 Gbit/s, a and c root 1/12 of the
    buffer each and b the rest: each phase G / 12 over 2 Gbit/s, as long as 10 G / 12 over 20: 2 G / 24 Gbit/s.
    Taking turns would have cost 2 (G / 3) / 2 Gbit/s, 4 times as long; b the one root 2 G / 20 Gbit/s."""
    grads = 4 * MODEL.total_params
    far = _three_groups(2.0)
    assert far.sync_s == pytest.approx(2 * grads / (24e9 / 8), rel=0.02)
    assert _three_groups(20.0).sync_s == pytest.approx(2 * (grads / 3) / (20e9 / 8), rel=0.02)
    # the estimate (and so the plan file, simulate --json and the summary) says which shares it priced
    assert far.exchange_roots == [{"holders": NAMES, "weights": [1, 10, 1]}]
    assert describe_roots(far.exchange_roots).endswith("a + b + c: a 1/12, b 10/12, c 1/12")
    assert describe_roots(_three_groups(20.0).exchange_roots).endswith("equal, the roots take turns")
    # explain prices the other choices by hand too: the turns 2 (G / 3) / 2 Gbit/s, b the one root 2 G / 20
    from hetauto_megatron.plan.multi_explain import format_shapes_report, shapes_report
    rep = shapes_report(*_three_groups_plan(2.0), AnalyticCostModel())
    ch = rep["exchange_choices"]
    assert ch["chosen_s"] == pytest.approx(far.sync_s, rel=0.02)
    assert ch["turns_s"] == pytest.approx(2 * (grads / 3) / (2e9 / 8), rel=0.02)
    assert ch["one_root"] == "b" and ch["one_root_s"] == pytest.approx(2 * grads / (20e9 / 8), rel=0.02)
    assert "with b the one root" in format_shapes_report(rep)


TINY = {"name": "tiny", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 256,
        "vocab_size": 128, "seq_length": 32, "num_query_groups": 2, "gated_mlp": True, "tie_embeddings": True,
        "position_embedding": "rope", "max_position_embeddings": 32}


def test_dry_run_exchanges_by_the_chosen_shares(tmp_path):
    """One stage held by three CPU meshes on clusters a, b, c, the a - c link 10 times slower than the others:
    the runtime cuts every parameter's elements 1 : 10 : 1 among the roots a, b, c (as the price does), and each
    link direction x -> y carries, per parameter and step, y's run (gathered to it) and x's (its sums scattered
    back), fp32: the bytes the runtime counted; the training matches one process."""
    inv = _inventory(1.0, device="cpu", per_node=1)
    inv["links"][0]["bandwidth_gbps"] = inv["links"][1]["bandwidth_gbps"] = 10.0
    assert exchange_weights(inventory_from_dict(inv), NAMES) == (1, 10, 1)
    meshes = [{"cluster": n, "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 1,
               "stage_layers": [TINY["num_layers"]], **({"alongside": True} if i else {})}
              for i, n in enumerate(NAMES)]
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump({"version": 4, "model": TINY, "global_batch_size": 6, "precision": "fp32",
                                    "meshes": meshes, "inventory": inv}))
    steps = 2
    out = hetauto_here("dryrun", "--plan", str(path), "--tiny", "--reference", "--json", "--steps", str(steps))
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["max_abs_diff"] <= 1e-5, r
    m, vocab = r["model"], r["padded_vocab_size"]
    h, ffn, heads, kv = m["hidden_size"], m["ffn_hidden_size"], m["num_attention_heads"], m["num_query_groups"]
    head = h // heads
    layer = [h * (heads + 2 * kv) * head, h * h, h * 2 * ffn, ffn * h, h, h]     # qkv, proj, fc1, fc2, 2 norms
    sizes = m["num_layers"] * layer + [vocab * h, h]                             # + tied table, final norm
    cuts = {"a": (0, 1), "b": (1, 11), "c": (11, 12)}                            # of 12, in holder order

    def run(n, root):                    # elements of an n-element parameter rooted at `root` (root_chunks)
        lo, hi = cuts[root]
        return n * hi // 12 - n * lo // 12

    between = r["bytes"]["between"]
    for x in NAMES:
        for y in NAMES:
            if x != y:
                want = 4 * steps * sum(run(n, y) + run(n, x) for n in sizes)
                assert between[f"{x}->{y}"] == want, (x, y, between)
    # the slow link carries a sixth of what each fast one does
    assert between["a->c"] * 5 < between["a->b"] < between["a->c"] * 7


def test_no_other_shares_make_the_priced_exchange_shorter():
    """Against brute force on the price: one stage held by 3 or 4 replica groups side by side (random TP, DP and
    optimizer sharding; random links and uplinks among 3-4 sites, some groups in one site), every choice of
    weights out of 12 priced by holders_exchange.holders_sync_time, the exchange's price; none beats the rule's
    weights by more than its 0.1 % rounding. No latency anywhere, which the rule leaves out of its choice. The
    first case fails if the rule counts a pair of groups in one site as one connection: it then gives b half of
    the elements and the price of that exchange is 1.5 times the equal shares'."""
    import itertools
    import random

    from hetauto_megatron.plan import holders_exchange
    from hetauto_megatron.plan.multi_simulate import price_shapes, shapes_of
    rng = random.Random(7)
    model = MODEL.replace(num_layers=2)
    for trial in range(30):
        sites = ["a", "b", "c", "d"][:3 + trial % 2]
        holders = rng.choice([sites, sites, ["a", "a", "b"], ["a", "b", "b", "c"]])
        inv = {"clusters": [{"name": n, "device": "a100-80gb", "nodes": 4, "devices_per_node": 8,
                             "intra_node": {"bandwidth_gbps": 2400.0, "latency_us": 0},
                             "inter_node": {"bandwidth_gbps": rng.choice([10.0, 25.0, 100.0, 400.0]), "latency_us": 0,
                                            **({"node_gbps": 40.0} if trial % 3 == 1 else {})},
                             **({"uplink_gbps": rng.choice([5.0, 20.0, 60.0])} if rng.random() < 0.3 else {})}
                            for n in sites],
               "links": [{"between": [x, y], "bandwidth_gbps": rng.choice([1.0, 2.5, 10.0, 40.0, 100.0, 400.0]),
                          "latency_ms": 0} for x, y in itertools.combinations(sites, 2)]}
        meshes = []
        for i, c in enumerate(holders):
            sharded = rng.random() < 0.7
            meshes.append({"cluster": c, "device_type": "a100-80gb", "tp": rng.choice([1, 2, 4, 8]),
                           "dp": rng.choice([1, 2]), "micro_batch_size": 1, "recompute": "full",
                           "stage_layers": [model.num_layers], **({"alongside": True} if i else {}),
                           **({} if sharded else {"settings": {"distributed_optimizer": False,
                                                               "overlap_param_gather": False}})})
        if trial == 0:      # groups inside one site whose TP ranks exchange in parallel over a slow network
            holders = ["a", "a", "b"]
            for c in inv["clusters"]:
                c["inter_node"]["bandwidth_gbps"] = 25.0
                c.pop("uplink_gbps", None)
            inv["links"][0]["bandwidth_gbps"] = 100.0       # a - b
            meshes = [dict(m, cluster=c, tp=8, dp=1) for m, c in zip(meshes, holders)]
        step = sum(m["dp"] for m in meshes)
        plan = plan_from_dict({"version": 4, "model": model.to_dict(), "global_batch_size": 2 * step,
                               "meshes": meshes, "inventory": inv})
        inventory = inventory_from_dict(inv)
        blocks = price_shapes(plan.model, inventory, shapes_of(plan), AnalyticCostModel()).extra["holders"]
        chosen = holders_exchange.holders_sync_time(inventory, blocks)
        best = None
        for w in itertools.product(range(13), repeat=len(holders)):
            if sum(w) == 12:
                # (each weighting passed as the rule: the default argument is bound when the function is defined,
                # so patching the module's exchange_weights changed nothing and the test compared the choice with
                # itself)
                t = holders_exchange.holders_sync_time(inventory, blocks, lambda *_, w=w: w)
                best = t if best is None else min(best, t)
        assert chosen <= best * (1 + 1e-3) + 1e-12, (trial, holders, meshes, inv, chosen, best)


def test_groups_in_one_site_share_a_nodes_nic():
    """Two replica groups of one stage side by side in one site (TP 8 x DP 1 each, nodes of 8): their 8 TP rank
    pairs exchange at once, each at its own NIC's 25 Gbit/s; where the node has one NIC of 50 Gbit/s for its 8
    devices (`node_gbps`, a cloud VM) each pair gets 50 / 8 = 6.25, so the exchange takes 4x as long (as a DP ring
    and a pipeline send inside the site already share it)."""
    from hetauto_megatron.plan import holders_exchange
    from hetauto_megatron.plan.multi_simulate import price_shapes, shapes_of
    model = MODEL.replace(num_layers=2)
    times = []
    for node in ({}, {"node_gbps": 50.0}):
        inv = {"clusters": [{"name": "a", "device": "a100-80gb", "nodes": 2, "devices_per_node": 8,
                             "intra_node": {"bandwidth_gbps": 2400.0, "latency_us": 0},
                             "inter_node": {"bandwidth_gbps": 25.0, "latency_us": 0, **node}}]}
        meshes = [{"cluster": "a", "device_type": "a100-80gb", "tp": 8, "dp": 1, "micro_batch_size": 1,
                   "recompute": "full", "stage_layers": [2], **({"alongside": True} if i else {})} for i in range(2)]
        plan = plan_from_dict({"version": 4, "model": model.to_dict(), "global_batch_size": 4, "meshes": meshes,
                               "inventory": inv})
        inventory = inventory_from_dict(inv)
        blocks = price_shapes(plan.model, inventory, shapes_of(plan), AnalyticCostModel()).extra["holders"]
        times.append(holders_exchange.holders_sync_time(inventory, blocks))
    assert times[1] == pytest.approx(4 * times[0], rel=0.02), times
