"""The search over the new shapes (plan/multi_search.py): the partition level, its bound, the batch split, mixed
replica groups, and that the new shapes never make a plan worse."""
from __future__ import annotations

import json
import math
import os

import pytest

from helpers import side_by_side, small_inventory
from hetauto_megatron.cost.analytic import AnalyticCostModel
from hetauto_megatron.errors import InputError
from hetauto_megatron.plan import alongside_search, multi_search
from hetauto_megatron.plan.constraints import Constraints
from hetauto_megatron.plan.multi_search import search_shapes
from hetauto_megatron.plan.partition_bound import PartitionBound, set_partitions, set_partitions_into
from hetauto_megatron.plan.search import SearchConfig, search
from hetauto_megatron.plan.simulate import simulate
from hetauto_megatron.spec.model import PRESETS

MODEL = PRESETS["llama2-7b"]


def test_set_partitions_are_the_bell_numbers():
    # Bell numbers 1, 2, 5, 15, 52 (OEIS A000110): every partition once
    for n, bell in zip(range(1, 6), (1, 2, 5, 15, 52)):
        parts = list(set_partitions(list(range(n))))
        assert len(parts) == bell
        assert len({tuple(sorted(tuple(sorted(b)) for b in p)) for p in parts}) == bell


def test_partitions_into_k_blocks_are_the_stirling_numbers():
    # S(5, k) = 1, 15, 25, 10, 1 (OEIS A008277): together every partition of set_partitions, in the same order of
    # blocks (the bound's choice of pipeline 0 breaks ties by it)
    items = list(range(5))
    by_k = [list(set_partitions_into(items, k)) for k in range(1, 6)]
    assert [len(p) for p in by_k] == [1, 15, 25, 10, 1]
    assert sorted(map(str, (p for ps in by_k for p in ps))) == sorted(map(str, set_partitions(items)))


def test_partition_level_bounds_every_partition_of_eight_clusters_and_caps_more():
    """The partitions of every subset of the usable clusters into 2 or more pipelines number sum_r C(n, r)(B(r) - 1)
    (B: the Bell numbers): 20,891 for 8 clusters, all bounded, but 27.6 million for 12 (the search ran for hours,
    past --budget-s): there it bounds the first MAX_PARTITIONS_BOUNDED, fewer pipelines and larger subsets first,
    and says so."""
    import itertools
    con = Constraints()
    eight = [f"c{i}" for i in range(8)]
    brute = sum(1 for r in range(2, 9) for sub in itertools.combinations(eight, r)
                for p in set_partitions(list(sub)) if len(p) >= 2)
    assert brute == 20891 <= multi_search.MAX_PARTITIONS_BOUNDED
    assert sum(1 for _ in multi_search._partition_candidates(eight, con, 1024)) == brute
    # a global batch of 3 samples cannot feed 4 pipelines
    assert max(len(b) for _, b in multi_search._partition_candidates(eight, con, 3)) == 3
    twelve = [f"c{i}" for i in range(12)]
    first = list(itertools.islice(multi_search._partition_candidates(twelve, con, 1024),
                                  multi_search.MAX_PARTITIONS_BOUNDED))
    ks = [len(b) for _, b in first]
    assert ks == sorted(ks) and ks[0] == 2 and len(first[0][0]) == 12
    inv = small_inventory([(f"c{i}", "cpu", 1, 1) for i in range(12)],
                          [(f"c{i}", f"c{j}", 10, 1) for i in range(12) for j in range(i + 1, 12)])
    res = search_shapes(PRESETS["tiny"], inv, 8, config=SearchConfig(workers=1))
    assert res.partitions_cut and res.partitions == multi_search.MAX_PARTITIONS_BOUNDED
    assert res.to_dict()["shapes"]["partitions_cut"] is True


def test_micro_batch_split_follows_speed():
    # 4 replicas at speed v and 2 at 2v share a step of 16 samples: 8 each, so 2 and 4 per replica: each group
    # then takes mbs / speed = 2 / v per step
    assert alongside_search._split(16, [(4, 1.0), (2, 2.0)]) == [2, 4]
    # the first group keeps at least one sample per replica, and no split of whole micro-batches -> None
    assert alongside_search._split(6, [(4, 1.0), (1, 100.0)]) == [1, 2]
    assert alongside_search._split(5, [(2, 1.0), (2, 1.0)]) is None


def test_data_parallel_across_twin_clusters_beats_one_pipeline_and_prices_as_simulated():
    """Two A100 clusters on a 400 Gbit/s link and an 8-layer model of LLaMA-2-7B's width (1.7B parameters):
    one pipeline must cross the link every micro-batch and fill and drain two stages; two pipelines (one per
    cluster, half the batch each) swap the model's fp32 gradients once, both ways at once (7 GB each way, 0.15 s);
    so does one stage held by both clusters side by side, with the step split by speed."""
    model = MODEL.replace(num_layers=8)
    inv = small_inventory([("a", "a100-80gb", 2, 8), ("b", "a100-80gb", 2, 8)], [("a", "b", 400, 1)])
    cfg = SearchConfig(workers=1)
    one = search(model, inv, 512, config=cfg)
    res = search_shapes(model, inv, 512, config=cfg)
    assert not res.plan.is_simple and {m.cluster for m in res.plan.meshes} == {"a", "b"}
    assert res.iteration_time_s < one.iteration_time_s
    # at least as good as the two pipelines the partition level searched
    two = [t for what, t, _ in res.tried if what == "a | b"]
    assert two and res.iteration_time_s <= two[0]
    assert search_shapes(model, inv, 512, config=cfg).plan == res.plan       # deterministic
    assert simulate(res.plan, inv).iteration_time_s == pytest.approx(res.iteration_time_s, rel=1e-12)
    simple = search_shapes(model, inv, 512, config=cfg, shapes="simple")
    assert simple.plan.is_simple and simple.iteration_time_s == one.iteration_time_s


def test_a_blocks_link_bound_stays_above_every_order_and_takes_no_time_on_many_clusters():
    """The slowest link of the best order through a block bounds a pipeline's transfers. Exactly it is a subset
    programme over 2^n states: 20 clusters ran for minutes, 200 raised OverflowError. Beyond EXACT_PATH_MAX the
    widest spanning tree's narrowest link stands in; on random graphs it is never below the best order's narrowest
    link found by trying every order (so the time bound stays a lower bound), and a 40-cluster chain is bounded."""
    import itertools
    import random

    from hetauto_megatron.plan import partition_bound as pb
    rng = random.Random(3)
    for _ in range(200):
        n = rng.choice([2, 3, 4, 5, 6])
        bw = {}
        for i, j in itertools.combinations(range(n), 2):
            if rng.random() < 0.7:
                bw[i, j] = bw[j, i] = rng.choice([1.0, 2.0, 5.0, 10.0, 40.0])
        best = max((min(bw.get((p[k], p[k + 1]), 0.0) for k in range(n - 1))
                    for p in itertools.permutations(range(n))), default=0.0)
        # and no looser than it must be: the largest t whose links of at least t join every cluster
        joined = max([t for t in set(bw.values()) if _connected(n, {k for k, v in bw.items() if v >= t})],
                     default=0.0)
        assert pb._bottleneck_spanning_tree(n, bw) >= best
        assert pb._bottleneck_spanning_tree(n, bw) == joined
    chain = small_inventory([(f"c{i}", "a100-80gb", 1, 8) for i in range(40)],
                            [(f"c{i}", f"c{i + 1}", 100, 1) for i in range(39)])
    bound = PartitionBound(MODEL, chain, 128)
    assert bound._bottleneck_path([c.name for c in chain.clusters]) == chain.link("c0", "c1").bytes_per_s


def test_a_blocks_link_bound_is_the_best_orders_slowest_link():
    """Up to EXACT_PATH_MAX clusters the link bound is exact: the largest t such that some order through the block
    uses links of at least t only. The subset programme is skipped where the answer is known without it (a cluster
    without a link of at least t, or clusters they do not join: no order; every cluster linked to half of the
    others or more: an order, Dirac's theorem), which on fully linked inventories is nearly every t of nearly every
    block (a 20-cluster one bounds 25,000 partitions). On random graphs of 2-8 clusters, sparse to complete, it
    equals the best of every order tried."""
    import itertools
    import random

    rng = random.Random(8)
    for _ in range(150):
        n = rng.choice([2, 3, 4, 5, 6, 7, 8])
        names = [f"c{i}" for i in range(n)]
        share = rng.choice([0.3, 0.6, 0.9, 1.0])
        links = [(a, b, rng.choice([10, 25, 50, 100]), 1) for a, b in itertools.combinations(names, 2)
                 if rng.random() < share]
        inv = small_inventory([(x, "a100-80gb", 1, 8) for x in names], links)
        bw = {(a, b): inv.link(a, b).bytes_per_s for a, b in itertools.permutations(names, 2) if inv.link(a, b)}
        best = max((min(bw.get((p[k], p[k + 1]), 0.0) for k in range(n - 1))
                    for p in itertools.permutations(names) if p[0] < p[-1]), default=0.0)
        assert PartitionBound(MODEL, inv, 128)._bottleneck_path(names) == best


def _connected(n: int, edges: set) -> bool:
    """Whether the (i, j) pairs join all of 0..n-1 (a walk from 0)."""
    seen, todo = {0}, [0]
    while todo:
        a = todo.pop()
        for i, j in edges:
            if i == a and j not in seen:
                seen.add(j)
                todo.append(j)
    return len(seen) == n


def test_partition_bound_never_exceeds_the_priced_plan_and_prunes_no_better_partition():
    """Every partition of every subset of three clusters (8-layer model, fast links: several partitions are
    close to the single pipeline), each searched and priced: its bound is below its plan, and the search with
    its pruning finds a plan at least as good as the best of them all."""
    import itertools
    model = MODEL.replace(num_layers=8)
    inv = small_inventory([("a", "a100-80gb", 1, 4), ("h", "h100", 1, 4), ("v", "l40s", 1, 4)],
                          [("a", "h", 400, 1), ("h", "v", 200, 1), ("a", "v", 400, 1)])
    cost, cfg = AnalyticCostModel(), SearchConfig(workers=1)
    bound = PartitionBound(model, inv, 128)
    names = [c.name for c in inv.clusters]
    found_all = []
    for k in (2, 3):
        for subset in itertools.combinations(names, k):
            for blocks in set_partitions(list(subset)):
                if len(blocks) < 2:
                    continue
                out = multi_search.ShapesResult(None, math.inf, None, 0.0)
                found = multi_search._search_partition(model, inv, 128, cost, cfg, Constraints(), names, blocks, {},
                                                       out)
                if found is not None:
                    assert bound(blocks) <= found[0]
                    found_all.append(found[0])
    assert len(found_all) >= 5
    res = search_shapes(model, inv, 128, cost, cfg)
    assert res.iteration_time_s <= min(found_all) * (1 + 1e-9)


def test_partition_bound_of_three_pipelines_stays_below_their_exchange():
    """Three pipelines whose gradient exchange dominates (three nodes of 8 H800 on 100 Gbit/s links): the holders
    take turns as roots, so any two swap a third of the gradients each way per phase. The bound counted the whole
    buffer twice (a gather to pipeline 0 and a scatter back): 4.51 s against the plan's 1.81 s."""
    model = MODEL.replace(seq_length=1024)
    inv = small_inventory([("a", "h800", 1, 8), ("b", "h800", 1, 8), ("c", "h800", 1, 8)],
                          [("a", "b", 100, 1), ("b", "c", 100, 1), ("a", "c", 100, 1)])
    out = multi_search.ShapesResult(None, math.inf, None, 0.0)
    found = multi_search._search_partition(model, inv, 96, AnalyticCostModel(), SearchConfig(workers=1),
                                           Constraints(), ["a", "b", "c"], [["a"], ["b"], ["c"]], {}, out)
    assert found is not None
    assert PartitionBound(model, inv, 96)([["a"], ["b"], ["c"]]) <= found[0]


def test_partition_bound_gives_each_pair_without_a_link_its_own():
    """Three two-cluster blocks joined only by 1 Gbit/s a1 - b1 and b1 - c1 links (the inventory's slowest, which
    every pair without a link falls back to, each pair on its own, as the exchange's price has it): the bound
    counted that fallback once per pair of blocks, 143.9 s against the plan's 72.4 s (when the c block had no
    link at all, which is now refused: clusters no link joins cannot exchange gradients)."""
    names = ["a1", "a2", "b1", "b2", "c1", "c2"]
    inv = small_inventory([(n, "h100", 1, 8) for n in names],
                          [("a1", "a2", 400, 1), ("b1", "b2", 400, 1), ("c1", "c2", 400, 1), ("a1", "b1", 1, 1),
                           ("b1", "c1", 1, 1)])
    blocks = [["a1", "a2"], ["b1", "b2"], ["c1", "c2"]]
    out = multi_search.ShapesResult(None, math.inf, None, 0.0)
    found = multi_search._search_partition(MODEL, inv, 24, AnalyticCostModel(), SearchConfig(workers=1),
                                           Constraints(), names, blocks, {}, out)
    assert found is not None
    assert PartitionBound(MODEL, inv, 24)(blocks) <= found[0]


def test_pipelines_on_clusters_no_link_joins_are_refused_not_priced_free(tmp_path, capsys):
    """Two pipelines exchange their gradients, so their clusters need a link. With every link of the inventory
    removed, the exchange of the two-pipeline tiny plan was priced at 0.000 s (the fallback of a pair without a
    link, the inventory's slowest link, had none to fall back to) and simulate showed 9,943 tokens/s against
    9,492 with the link. Now simulate refuses it naming the inventory's links (exit 2), and the search keeps
    every plan within clusters links join: three clusters without links plan on one of them."""
    import yaml
    from helpers import ROOT, cpu_inventory, run_cli, twins_and_l40s
    from hetauto_megatron.plan.link_costs import connected
    from hetauto_megatron.spec.inventory import inventory_from_dict
    inv = yaml.safe_load(cpu_inventory(4, 4))
    assert inv["links"], "the case needs the CPU inventory's link"
    (tmp_path / "nolink.yaml").write_text(yaml.safe_dump(dict(inv, links=[])))
    plan = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2pipelines-cpu.yaml")
    rc, _, err = run_cli(["simulate", "--model", "tiny", "--plan", plan, "--inventory", str(tmp_path / "nolink.yaml")],
                         capsys)
    assert rc == 2 and "field 'links'" in err and "nolink.yaml" in err and "Traceback" not in err, err
    data = dict(twins_and_l40s(), links=[])
    m8 = MODEL.replace(num_layers=8)
    res = search_shapes(m8, inventory_from_dict(data), 512, AnalyticCostModel(), SearchConfig(workers=1))
    assert len({m.cluster for m in res.plan.meshes}) == 1
    data["links"] = [{"between": ["a", "b"], "bandwidth_gbps": 400, "latency_ms": 1}]   # c alone: a and b only
    res = search_shapes(m8, inventory_from_dict(data), 512, AnalyticCostModel(), SearchConfig(workers=1))
    used = {m.cluster for m in res.plan.meshes}
    assert connected(inventory_from_dict(data), used), used


def test_new_shapes_never_make_the_plan_worse():
    inv = small_inventory([("a", "a100-80gb", 2, 8), ("h", "h100", 1, 8)], [("a", "h", 25, 4)])
    cfg = SearchConfig(workers=1)
    one = search(MODEL, inv, 128, config=cfg)
    res = search_shapes(MODEL, inv, 128, config=cfg)
    assert res.iteration_time_s <= one.iteration_time_s


def test_partition_bound_counts_the_slowest_link_of_the_best_order():
    """A block's pipeline must pass through all its clusters: a - b at 100 Gbit/s and b - c at 50 Gbit/s, no
    a - c link, so every order crosses the 50 Gbit/s link with the whole share's activations."""
    inv = small_inventory([("a", "h100", 1, 8), ("b", "h100", 1, 8), ("c", "h100", 1, 8), ("d", "h100", 1, 8)],
                          [("a", "b", 100, 1), ("b", "c", 50, 1)])
    bound = PartitionBound(MODEL, inv, 64)
    act = 2 * 64 * MODEL.seq_length * MODEL.hidden_size            # bf16 activations of the whole batch
    # one cluster's compute by hand (docs/search.md): LLaMA-2-7B's training FLOPs of the batch (3 x forward: per
    # token and layer 8 h^2 for the projections, 4 s h for the attention scores, 6 h ffn for the gated MLP; the
    # logits 2 h V) over 8 H100s at the datasheet's 989 TFLOP/s x the fitted peak GEMM efficiency 0.706
    # (docs/cost-model.md), x the search's slack 0.8 (a learned model may predict a little faster)
    h, s, ffn, vocab, layers = 4096, 4096, 11008, 32000, 32
    flops = 3 * (layers * (8 * h * h + 4 * s * h + 6 * h * ffn) + 2 * h * vocab) * 64 * s
    one = 0.8 * flops / (8 * 989e12 * 0.706)
    assert bound.block_cost(["a"]) == pytest.approx(one, rel=1e-12)
    assert bound.block_cost(["a", "b", "c"]) == pytest.approx(max(act / (50e9 / 8), one / 3))
    assert bound.block_cost(["a", "c"]) == math.inf                # no link: no pipeline through both
    assert bound([["a", "c"], ["b"]]) == math.inf
    # d has no link at all: its pairs fall back to the slowest link of the inventory, as the pricing does; two
    # pipelines: the gradients cross once each way, at once (one phase)
    # fp32 gradients of the 6.74 B parameters: per layer 4 h^2 attention, 3 h ffn MLP, 2 h norms; two tables, final norm
    grads = 4 * (layers * (4 * h * h + 3 * h * ffn + 2 * h) + 2 * vocab * h + h)
    assert grads / 4 == pytest.approx(6.74e9, rel=1e-3)
    assert bound([["a"], ["d"]]) == pytest.approx(one / 2 + grads / (50e9 / 8))
    # three pipelines on a - b and b - c at 100 Gbit/s, a - c at 10: pipeline 0 is b, whose slowest cut is
    # 100 Gbit/s (a would wait on its 10 Gbit/s link to c). Each pipeline R roots a share s_R of the gradients,
    # which the other two send it over their cuts to R: a phase lasts at least s_R G over R's slowest cut (a and c:
    # 10 Gbit/s, b: 100), so at least G / (10 + 100 + 10 Gbit/s) whatever the shares (exchange_roots.py takes
    # 1:10:1, which reaches it; the turns would take 2 G / 30 in all, b the one root 2 G / 100)
    tri = PartitionBound(MODEL, small_inventory([("a", "h100", 1, 8), ("b", "h100", 1, 8), ("c", "h100", 1, 8)],
                                                [("a", "b", 100, 1), ("b", "c", 100, 1), ("a", "c", 10, 1)]), 64)
    assert tri.root([["a"], ["b"], ["c"]]) == 1
    assert tri([["a"], ["b"], ["c"]]) == pytest.approx(one / 3 + 2 * grads / (120e9 / 8))


def test_cost_objective_keeps_the_cheapest_of_the_shapes():
    """With --objective cost the new shapes are compared by money per iteration: never dearer than the single
    pipeline's plan, and the partition bound prunes on money (time bound x one device of each cluster's price)."""
    from hetauto_megatron.plan.constraints import devices_by_cluster, price_per_second
    from hetauto_megatron.spec.inventory import inventory_from_dict
    d = small_inventory([("a", "a100-80gb", 2, 8), ("b", "a100-80gb", 2, 8)], [("a", "b", 400, 1)]).to_dict()
    for c, price in zip(d["clusters"], (1.0, 3.0)):
        c["price_per_device_hour"] = price
    inv = inventory_from_dict(d)
    model = MODEL.replace(num_layers=8)
    cfg = SearchConfig(workers=1, constraints=Constraints(objective="cost"))
    one = search(model, inv, 512, config=cfg)
    res = search_shapes(model, inv, 512, config=cfg)
    money = lambda meshes, t: t * price_per_second(inv, devices_by_cluster(meshes))
    assert money(res.plan.meshes, res.iteration_time_s) <= money(one.choices, one.iteration_time_s) * (1 + 1e-12)


def test_plan_command_writes_two_pipelines_and_emits_their_launch_scripts(tmp_path):
    import yaml

    from helpers import run_hetauto
    from hetauto_megatron.plan.plan import load_plan
    model = tmp_path / "m8.yaml"
    model.write_text(yaml.safe_dump({**MODEL.replace(num_layers=8).to_dict(), "name": "llama-8-layers"}))
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(small_inventory([("a", "a100-80gb", 2, 8), ("b", "a100-80gb", 2, 8)],
                                                  [("a", "b", 400, 1)]).to_dict()))
    base = ["plan", "--model", str(model), "--inventory", str(inv), "--global-batch-size", "512", "--workers", "1"]
    r = run_hetauto(*base, "-o", str(tmp_path / "p.yaml"), "--timeline", str(tmp_path / "t.png"),
                    "--timeline", str(tmp_path / "t.json"))
    assert r.returncode == 0, r.stderr
    plan = load_plan(str(tmp_path / "p.yaml"))
    assert not plan.is_simple and (tmp_path / "t.png").stat().st_size > 10_000
    # the timeline draws every stage and replica group (a lane each, named "P1 stage 0 ..." where there are several
    # pipelines): each does its pipeline's micro-batches and covers the iteration
    with open(tmp_path / "t.json") as fh:
        trace = json.load(fh)
    T = trace["otherData"]["timelines"][0]["iteration_s"]
    assert T == pytest.approx(plan.estimate["iteration_time_s"], abs=1e-6)     # the plan's figure, to the microsecond
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    lanes: dict = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and " stage " in " " + names[(e["pid"], e["tid"])]:
            lanes.setdefault(names[(e["pid"], e["tid"])], []).append(e)
    steps = [p["micro_batches"] for p in plan.estimate["pipelines"]]
    assert len(lanes) == len(plan.estimate["stages"]) == sum(len(m.stage_layers) for m in plan.meshes)
    for name, spans in lanes.items():
        m = steps[int(name.split()[0][1:]) if name.startswith("P") else 0]
        assert sum(e["cat"] == "forward" for e in spans) == sum(e["cat"] == "backward" for e in spans) == m
        assert sum(e["dur"] for e in spans) / 1e6 == pytest.approx(T, rel=1e-6)
    assert plan.estimate["search"]["shapes"]["partitions"] == 1
    r = run_hetauto(*base, "-o", str(tmp_path / "q.yaml"), "--emit", str(tmp_path / "launch"))
    assert r.returncode == 0, r.stderr
    # the emitted Megatron-LM scripts run the shape that was planned; DeepSpeed's engine cannot, and says so
    assert load_plan(str(tmp_path / "q.yaml")).meshes == plan.meshes
    written = sorted(p.name for p in (tmp_path / "launch").iterdir())
    assert any(n.endswith(".sh") for n in written) and not any("deepspeed" in n for n in written), written
    assert "no DeepSpeed configs written" in r.stderr


def test_tp_groups_stay_inside_a_node():
    """TP 4 on 6-device nodes put devices 4-7 in one group across two nodes (the search offered it: TP only had to
    be at most the node's size). Rank arithmetic by hand: ranks go mesh after mesh, TP fastest, from a launch's
    first node."""
    from hetauto_megatron.plan.plan import Mesh, Plan
    model = MODEL.replace(num_layers=5)
    inv = small_inventory([("a", "cpu", 2, 6)], [])
    assert multi_search.tp_degrees(model, inv.cluster("a")) == [1, 2]
    a = Mesh("a", "cpu", 2, 1, 1, "none", (2,))                  # devices 0-1
    b = Mesh("a", "cpu", 4, 1, 1, "none", (3,))                  # devices 2-5: one group, inside node 0
    plan = Plan(model=model, global_batch_size=1, meshes=(a, b))
    assert plan.launch_groups() == [(0, 1)]
    plan.check_tp_inside_nodes(lambda c: 8)
    with pytest.raises(InputError, match=r"meshes\[1\]\.tp.*devices 2-5"):   # straddle nodes 0-3 and 4-7
        plan.check_tp_inside_nodes(lambda c: 4)
    a2 = Mesh("a", "cpu", 2, 1, 2, "none", (2,))                 # devices 0-1, two samples per micro-batch
    b2 = Mesh("a", "cpu", 4, 2, 1, "none", (3,))                 # devices 2-5 and 6-9
    two = Plan(model=model, global_batch_size=2, meshes=(a2, b2))
    with pytest.raises(InputError, match=r"meshes\[1\]\.tp.*devices 6-9"):   # straddle nodes 0-7 and 8-15
        two.check_tp_inside_nodes(lambda c: 8)
    Plan(model=MODEL.replace(num_layers=3), global_batch_size=2, meshes=(b2,)).check_tp_inside_nodes(lambda c: 4)


def test_a_replica_group_alongside_on_the_same_cluster_keeps_tp_inside_nodes():
    """`plan --objective cost` on the 736-device example put one TP 1 device of the 910Bs before four TP 2 groups
    on the same cluster: devices 7-8 in one TP group across two 8-device nodes, and the search stopped with exit 2.
    The group alongside now goes first when its TP is the larger, and a pair that no order fits is not offered;
    nor is a pair whose launch would not start on whole nodes (9 devices of 8-device nodes: torchrun starts the
    same number of processes on every node). Rank arithmetic by hand: ranks go mesh after mesh, TP fastest."""
    import dataclasses

    from hetauto_megatron.plan.plan import Mesh, Plan
    model = MODEL.replace(num_layers=2)
    eight = small_inventory([("a", "cpu", 2, 8)], [])
    main = Mesh("a", "cpu", 1, 1, 4, "none", (2,))                             # device 0
    extra = Mesh("a", "cpu", 2, 4, 1, "none", (2,), alongside=True)            # devices 1-8 as given: 7-8 straddle
    plan = Plan(model=model, global_batch_size=8, meshes=(main,))
    with pytest.raises(InputError, match=r"devices 7-8"):
        dataclasses.replace(plan, meshes=(main, extra)).check_tp_inside_nodes(lambda c: 8)
    assert alongside_search.with_group(plan, 0, main, extra, [], 1, eight) is None          # 9 of 16 devices
    # on whole nodes: a TP 1 mesh of 8 devices (0-7) and four TP 2 groups alongside (8-15)
    main8 = Mesh("a", "cpu", 1, 8, 1, "none", (2,))
    cand = alongside_search.with_group(Plan(model=model, global_batch_size=16, meshes=(main8,)), 0, main8,
                                    dataclasses.replace(extra, micro_batch_size=2), [], 1, eight)
    assert [(m.tp, m.dp, m.alongside) for m in cand.meshes] == [(1, 8, False), (2, 4, True)]
    cand.check_tp_inside_nodes(lambda c: 8)
    cand.check_whole_nodes(lambda c: (8, 2))
    # 6-device nodes: TP 3 then two TP 2 groups puts devices 5-6 together, two TP 2 groups then TP 3 devices 4-6
    six = small_inventory([("a", "cpu", 2, 6)], [])
    m3 = MODEL.replace(num_layers=2, num_attention_heads=12, num_query_groups=12, hidden_size=768,
                       ffn_hidden_size=3072, seq_length=3072)      # TP 3 and 2 split the sequence (SP)
    main3 = Mesh("a", "cpu", 3, 1, 2, "none", (2,))
    extra2 = Mesh("a", "cpu", 2, 2, 1, "none", (2,), alongside=True)
    plan3 = Plan(model=m3, global_batch_size=4, meshes=(main3,))
    assert alongside_search.with_group(plan3, 0, main3, extra2, [], 1, six) is None


def test_a_replica_group_alongside_needs_a_link_to_every_neighbouring_cluster():
    """A pipeline a -> b and a group of cluster c alongside b's mesh: c is linked to b (the mesh it joins) but not to
    a, whose stage sends it its activations. The candidate was priced, and since simulate checks every neighbour's
    link (as every emit target does) it stopped `plan` with exit 2 (the GPT-3 example at a global batch of 16,384:
    "clusters ascend and h100 are next to each other ... no link"); it is not offered now. With a link a-c it is."""
    from hetauto_megatron.plan.plan import Mesh, Plan
    model = MODEL.replace(num_layers=4)
    meshes = (Mesh("a", "cpu", 1, 1, 2, "none", (2,)), Mesh("b", "cpu", 1, 1, 2, "none", (2,)))
    plan = Plan(model=model, global_batch_size=4, meshes=meshes)
    main, extra = Mesh("b", "cpu", 1, 1, 1, "none", (2,)), Mesh("c", "cpu", 1, 1, 1, "none", (2,), alongside=True)
    clusters = [("a", "cpu", 1, 1), ("b", "cpu", 1, 1), ("c", "cpu", 1, 1)]
    unlinked = small_inventory(clusters, [("a", "b", 10, 1), ("b", "c", 10, 1)])
    assert alongside_search.with_group(plan, 1, main, extra, [0], 1, unlinked) is None
    linked = small_inventory(clusters, [("a", "b", 10, 1), ("b", "c", 10, 1), ("a", "c", 10, 1)])
    cand = alongside_search.with_group(plan, 1, main, extra, [0], 1, linked)
    assert [(m.cluster, m.alongside) for m in cand.meshes] == [("a", False), ("b", False), ("c", True)]
    assert simulate(cand, linked).iteration_time_s > 0


def _chain_of_five(tie: bool = False):
    """Five clusters in a chain (each linked to the next only), two device types, a small model: most pairs of
    clusters of two blocks have no link, which the exchange's bound counts at the inventory's slowest one."""
    inv = small_inventory([("c0", "h100", 1, 8), ("c1", "a100-80gb", 1, 8), ("c2", "h100", 1, 4),
                           ("c3", "a100-80gb", 1, 8), ("c4", "h100", 1, 8)],
                          [("c0", "c1", 100, 1), ("c1", "c2", 25, 1), ("c2", "c3", 50, 1), ("c3", "c4", 10, 2)])
    return MODEL.replace(num_layers=8, tie_embeddings=tie), inv


@pytest.mark.parametrize("tie", [False, True])
def test_tight_partition_bound_stays_below_every_searched_plan(tie):
    """PartitionBound.tight (the exchange over at most len(a) + len(b) - 1 pairs of clusters, + 2 for a tied table;
    each pipeline's layer work at the cost model's per-layer times) is at least the first bound and never above
    the priced plan of a partition, on partitions of a chain whose blocks hold several clusters."""
    model, inv = _chain_of_five(tie)
    cost, cfg = AnalyticCostModel(), SearchConfig(workers=1)
    bound = PartitionBound(model, inv, 128, cost)
    names = [c.name for c in inv.clusters]

    def check(blocks) -> bool:
        out = multi_search.ShapesResult(None, math.inf, None, 0.0)
        found = multi_search._search_partition(model, inv, 128, cost, cfg, Constraints(), names, blocks, {}, out)
        assert bound.tight(blocks) >= bound(blocks)
        if found is not None:
            assert bound.tight(blocks) <= found[0], blocks
        return found is not None

    partitions = ([["c0", "c1"], ["c2", "c3", "c4"]], [["c0", "c1", "c2"], ["c3", "c4"]],
                  [["c0"], ["c1", "c2", "c3", "c4"]], [["c0", "c1"], ["c2"], ["c3", "c4"]], [["c1", "c2"], ["c3", "c4"]])
    assert sum(side_by_side(check, partitions)) >= 3
    # the staircase counts 4 of the 6 pairs of 2 and 3 clusters (all 6 with a tied table): tighter untied
    blocks = [["c0", "c1"], ["c2", "c3", "c4"]]
    assert (bound._sync(blocks, staircase=True) > bound._sync(blocks)) is not tie


def test_tight_partition_bound_leaves_the_plan_as_it_was(monkeypatch):
    """The tight bound only skips partitions that cannot beat the plan held, and they keep their place among the
    MAX_PARTITIONS: the plan is the one the first bound alone gives, with no more partitions searched."""
    model, inv = _chain_of_five()
    cfg = SearchConfig(workers=1)
    res = search_shapes(model, inv, 128, AnalyticCostModel(), cfg)
    monkeypatch.setattr(PartitionBound, "tight", PartitionBound.__call__)
    before = search_shapes(model, inv, 128, AnalyticCostModel(), cfg)
    assert res.plan == before.plan and res.iteration_time_s == before.iteration_time_s
    assert res.partitions == before.partitions and res.partitions_searched <= before.partitions_searched
