"""Which holders root a gradient exchange among three or more (plan/exchange_roots.py): the roots take turns,
unless one root taking all is faster on the inventory's links; the runtime runs what the planner prices.

Checked three ways: the rule on hand-made links, the price against a hand computation of the chosen exchange,
and a CPU dry run (real Megatron-Core, gloo, three processes) whose bytes per link direction, counted by the
runtime, are the chosen exchange's, with the loss of a single process.
"""
import json

import pytest
import yaml
from helpers import run_hetauto

from hetauto_megatron.cost.analytic import AnalyticCostModel
from hetauto_megatron.plan.exchange_roots import exchange_weights
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.plan.simulate import simulate
from hetauto_megatron.spec.inventory import inventory_from_dict
from hetauto_megatron.spec.model import PRESETS

NAMES = ["a", "b", "c"]


def _inventory(a_c_gbps, device="a100-40gb", per_node=1, uplink=None):
    fast = 20.0
    return {"clusters": [{"name": n, "device": device, "nodes": 1, "devices_per_node": per_node,
                          **({"uplink_gbps": uplink} if uplink else {})} for n in NAMES],
            "links": [{"between": ["a", "b"], "bandwidth_gbps": fast, "latency_ms": 0},
                      {"between": ["b", "c"], "bandwidth_gbps": fast, "latency_ms": 0},
                      {"between": ["a", "c"], "bandwidth_gbps": a_c_gbps, "latency_ms": 0}]}


def test_the_roots_take_turns_unless_one_root_is_faster():
    even = inventory_from_dict(_inventory(20.0))
    assert exchange_weights(even, NAMES) == (1, 1, 1)            # 1/3 per link against 1 on two links
    assert exchange_weights(None, NAMES) == (1, 1, 1)            # a plan without an inventory
    # a - c at 2 Gbit/s: taking turns, a third crosses it each way (1/6 s per Gbit of table); b as the one root,
    # a and c each send it the whole table over 20 Gbit/s (1/20)
    far = inventory_from_dict(_inventory(2.0))
    assert exchange_weights(far, NAMES) == (0, 1, 0)
    assert exchange_weights(far, ["a", "c", "b"]) == (0, 0, 1)   # in holder order
    # at 10 Gbit/s taking turns costs 1/30, one root 1/20: the turns stay
    assert exchange_weights(inventory_from_dict(_inventory(10.0)), NAMES) == (1, 1, 1)
    # b's uplink at 10 Gbit/s: as the one root it would take 2 tables in (1/5): the turns stay, even at 2 Gbit/s
    capped = _inventory(2.0)
    capped["clusters"][1]["uplink_gbps"] = 10.0
    assert exchange_weights(inventory_from_dict(capped), NAMES) == (1, 1, 1)
    # two holders of one cluster and a third elsewhere: the pairs inside a cluster run on its own network
    assert len(exchange_weights(far, ["a", "a", "b"])) == 3


MODEL = PRESETS["llama2-7b"].replace(num_layers=4, tie_embeddings=False)


def _three_groups(a_c_gbps):
    inv = _inventory(a_c_gbps)
    meshes = [{"cluster": n, "device_type": "a100-40gb", "tp": 1, "dp": 1, "micro_batch_size": 1,
               "recompute": "full", "stage_layers": [MODEL.num_layers], **({"alongside": True} if i else {})}
              for i, n in enumerate(NAMES)]
    plan = plan_from_dict({"version": 4, "model": MODEL.to_dict(), "global_batch_size": 3, "meshes": meshes,
                           "inventory": inv})
    return simulate(plan, inventory_from_dict(inv), AnalyticCostModel()).sync_s


def test_the_price_is_the_chosen_exchange():
    """Three replica groups of one stage, fp32 gradient buffers: with a - c at 2 Gbit/s, b roots everything: a and
    c send it the whole buffer over their own 20 Gbit/s links at once, then get the sums back: 2 G / 20 Gbit/s.
    Taking turns would have cost 2 (G / 3) / 2 Gbit/s, 3.3 times as long."""
    grads = 4 * MODEL.total_params
    assert _three_groups(2.0) == pytest.approx(2 * grads / (20e9 / 8), rel=0.02)
    assert _three_groups(20.0) == pytest.approx(2 * (grads / 3) / (20e9 / 8), rel=0.02)


TINY = {"name": "tiny", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 256,
        "vocab_size": 128, "seq_length": 32, "num_query_groups": 2, "gated_mlp": True, "tie_embeddings": True,
        "position_embedding": "rope", "max_position_embeddings": 32}


def test_dry_run_exchanges_through_the_one_root(tmp_path):
    """One stage held by three CPU meshes on clusters a, b, c, the a - c link 50 times slower than the others:
    the runtime roots every parameter at b (as the price does), so nothing crosses a - c, and a and c each send
    b every gradient element once per step (fp32) and receive the sums; the training matches one process."""
    inv = _inventory(0.2, device="cpu", per_node=1)
    inv["links"][0]["bandwidth_gbps"] = inv["links"][1]["bandwidth_gbps"] = 10.0
    meshes = [{"cluster": n, "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 1,
               "stage_layers": [TINY["num_layers"]], **({"alongside": True} if i else {})}
              for i, n in enumerate(NAMES)]
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump({"version": 4, "model": TINY, "global_batch_size": 6, "precision": "fp32",
                                    "meshes": meshes, "inventory": inv}))
    steps = 2
    out = run_hetauto("dryrun", "--plan", str(path), "--tiny", "--reference", "--json", "--steps", str(steps))
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["max_abs_diff"] <= 1e-5, r
    between = r["bytes"]["between"]
    assert not between.get("a->c") and not between.get("c->a"), between
    m, vocab = r["model"], r["padded_vocab_size"]
    h, ffn, heads, kv = m["hidden_size"], m["ffn_hidden_size"], m["num_attention_heads"], m["num_query_groups"]
    head = h // heads
    layer = h * (heads + 2 * kv) * head + h * h + h * 2 * ffn + ffn * h + 2 * h    # qkv, proj, fc1, fc2, 2 norms
    elements = m["num_layers"] * layer + vocab * h + h                             # + tied table, final norm
    for pair in ("a->b", "b->a", "c->b", "b->c"):
        assert between[pair] == 4 * elements * steps, (pair, between)
