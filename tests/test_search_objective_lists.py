"""The search under --objective cost says and ranks by that objective everywhere: its progress lines give the best
layout's cost per 1M tokens (the unit of the plan's own cost line), and the lists the final re-ranking draws from
(plan/rescreen.py) are ranked by the objective, not by seconds. Checked against the plan's printed figures and the
event simulation of the written plan (`hetauto simulate`), priced by hand."""
import json
import re

import pytest
import yaml
from helpers import run_hetauto

THREE = ("--model", "llama2-70b", "--inventory", "examples/llama/inventory-3clusters.yaml", "--global-batch-size",
         "512", "--workers", "1", "--shapes", "simple", "--set", "cluster.h800.price_per_device_hour=2.5",
         "--set", "cluster.ascend.price_per_device_hour=1.2", "--set", "cluster.mi300x.price_per_device_hour=2.0")


def _printed(stdout: str) -> tuple[float, float]:
    """(iteration s, cost per 1M tokens) as the plan's table prints them."""
    seconds = float(re.search(r"^iteration ([0-9.]+) s", stdout, re.M).group(1))
    cost = float(re.search(r"^cost: ([0-9.]+) per 1M tokens", stdout, re.M).group(1))
    return seconds, cost


@pytest.mark.parametrize("objective", ["cost", "throughput"])
def test_progress_lines_give_the_objective_in_its_own_unit(objective):
    """The README's three clusters priced 2.5 / 1.2 / 2.0, LLaMA-2-70B: the tree search's progress line named the cost
    objective's value (money per iteration weighed by time, 1.2 on this inventory) "s per iteration". It now gives
    the best layout's cost per 1M tokens and its seconds, which the closed form puts within a few % of what the plan
    prints for the plan it keeps; under the throughput objective the line stays the seconds."""
    r = run_hetauto("plan", *THREE, "--objective", objective)
    assert r.returncode == 0, r.stderr
    seconds, cost = _printed(r.stdout)
    lines = [x for x in r.stderr.splitlines() if x.startswith("search: ") and " trees, " in x]
    assert lines, "the case needs a tree search: " + r.stderr
    for line in lines:
        best = line.split(" best ", 1)[1]
        if objective == "cost":
            m = re.match(r"([0-9.]+) per 1M tokens at ([0-9.]+) s per iteration, ", best)
            assert m, line
            assert float(m.group(1)) == pytest.approx(cost, rel=0.03)
            assert float(m.group(2)) == pytest.approx(seconds, rel=0.03)
        else:
            m = re.match(r"([0-9.]+) s per iteration, ", best)
            assert m and "per 1M" not in line, line
            assert float(m.group(1)) == pytest.approx(seconds, rel=0.03)


# Three single-node clusters in a chain, b's uplink shared by its two links (benchmarks/uplink_screening.py's kind of
# instance), priced, under --objective cost and a --max-iteration-s floor. The best plan for the event simulation
# (every leaf of the tree re-ranked by it, search.RERANK_MARGIN off) was computed once:
# - CHAIN: 2.588 s at 0.03290 per 1M tokens (a TP 4, b one device, c TP 4 x 2 stages; 22,205 leaves, 72 s); the extra
#   lists, ranked by seconds, held the fastest layouts instead and the plan was 2.223 s at 0.03769 (15 % dearer);
#   either list ranked by the objective finds the optimum (since Megatron-LM's result check is priced, 2.595 s at
#   0.03300, 22,289 leaves);
# - CHAIN2: 8.560 s at 0.01587 (29,384 leaves, 175 s); the search (trees, not settled) kept 8.295 s at 0.01758
#   with the uplink's list ranked by the objective, 8.430 s at 0.02010 without (27 % above the optimum). It was
#   left to the trees because tree_budget's estimate from 64 random paths read 51,065 leaves at seed 0 (26,127 at
#   seed 1), over the 50,000 the search settles exactly; re-estimated near that limit (tree_size.settle_estimate) it
#   is settled at every seed: the optimum (since the loss is priced as it runs, 8.547 s at 0.01585; since
#   Megatron-LM's result check is priced, 8.553 s at 0.01586, 29,392 leaves). Before, with
#   the loss priced at 3 passes the trees kept 0.01760, with its passes counted 0.01988 (25 % above).
CHAIN = """\
clusters:
  - {name: a, device: mi300x, nodes: 1, devices_per_node: 4, price_per_device_hour: 1.0}
  - {name: b, device: ascend-910b, nodes: 1, devices_per_node: 4, price_per_device_hour: 4.0, uplink_gbps: 50}
  - {name: c, device: mi300x, nodes: 1, devices_per_node: 8, price_per_device_hour: 0.5}
links:
  - {between: [a, b], bandwidth_gbps: 100, latency_ms: 2}
  - {between: [b, c], bandwidth_gbps: 50, latency_ms: 2}
"""
CHAIN2 = """\
clusters:
  - {name: a, device: mi300x, nodes: 1, devices_per_node: 4, price_per_device_hour: 0.5}
  - {name: b, device: h800, nodes: 1, devices_per_node: 8, price_per_device_hour: 1.0, uplink_gbps: 25}
  - {name: c, device: h100-sxm, nodes: 1, devices_per_node: 4, price_per_device_hour: 0.5}
links:
  - {between: [a, b], bandwidth_gbps: 25, latency_ms: 1}
  - {between: [b, c], bandwidth_gbps: 10, latency_ms: 1}
"""


@pytest.mark.parametrize("inventory, model, gbs, floor, optimum, within", [
    (CHAIN, "llama3-8b", 64, 2.626, 0.03300, 0.001), (CHAIN2, "llama2-7b", 256, 8.583, 0.01586, 0.001)],
    ids=["chain", "chain2"])
def test_the_lists_of_the_final_ranking_are_ranked_by_the_objective(tmp_path, inventory, model, gbs, floor, optimum,
                                                                    within):
    inv = tmp_path / "chain.yaml"
    inv.write_text(inventory)
    plan = tmp_path / "p.yaml"
    r = run_hetauto("plan", "--model", model, "--seq-length", "4096", "--inventory", str(inv), "--global-batch-size",
                    str(gbs), "--objective", "cost", "--max-iteration-s", str(floor), "--workers", "1", "--quiet",
                    "-o", str(plan))
    assert r.returncode == 0, r.stderr
    sim = run_hetauto("simulate", "--inventory", str(inv), "--plan", str(plan), "--json")
    assert sim.returncode == 0, sim.stderr
    seconds = json.loads(sim.stdout)["iteration_time_s"]
    price = {c["name"]: c["price_per_device_hour"] for c in yaml.safe_load(inventory)["clusters"]}
    money = sum(m["tp"] * m["dp"] * len(m["stage_layers"]) * price[m["cluster"]]
                for m in yaml.safe_load(plan.read_text())["meshes"]) / 3600 * seconds
    cost = money / (gbs * 4096) * 1e6
    assert seconds <= floor
    assert cost <= optimum * (1 + within), (seconds, cost)
    printed = _printed(r.stdout)        # the plan's table says the same (3 and 4 decimals)
    assert printed[0] == pytest.approx(seconds, abs=5e-4) and printed[1] == pytest.approx(cost, abs=5e-5)
