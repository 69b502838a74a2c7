"""Pricing several pipelines and mixed replica groups in a stage (plan/multi_simulate.py).

Every expectation is the existing single-pipeline simulator on an equivalent plan, or a hand computation from
the model's parameter counts and the inventory's link: never the code path under test."""
from __future__ import annotations

import pytest

from helpers import small_inventory
from hetauto_megatron.cost.analytic import AnalyticCostModel
from hetauto_megatron.plan.link_costs import dp_ring_link
from hetauto_megatron.plan.multi_simulate import PipelineShape, shapes_estimate
from hetauto_megatron.plan.plan import Mesh, Plan
from hetauto_megatron.plan.simulate import simulate
from hetauto_megatron.spec.model import PRESETS

COST = AnalyticCostModel()
MODEL = PRESETS["llama2-7b"]          # untied embeddings, 32 layers


def _plan(model, gbs, meshes):
    return Plan(model=model, global_batch_size=gbs, meshes=tuple(meshes))


def _shapes(pipelines):
    """pipelines: [(samples, [[Mesh, ...] per position])] -> their PipelineShapes, meshes numbered in order."""
    shapes, k = [], 0
    for samples, positions in pipelines:
        pos = []
        for group in positions:
            pos.append([(k + j, m) for j, m in enumerate(group)])
            k += len(group)
        shapes.append(PipelineShape(pos, samples))
    return shapes


def _price(model, inv, pipelines, precision="bf16"):
    """pipelines: [(samples, [[Mesh, ...] per position])]"""
    return shapes_estimate(model, inv.with_precision(precision), _shapes(pipelines), COST)


def _mesh(cluster, device, tp, dp, mbs, layers, **kw):
    return Mesh(cluster, device, tp, dp, mbs, "none", tuple(layers), **kw)


def test_one_pipeline_of_single_meshes_prices_as_the_simulator():
    inv = small_inventory([("a", "a100-80gb", 2, 8), ("b", "h100", 2, 8)], [("a", "b", 100, 1)])
    for boundary in (dict(), dict(boundary_schedule="overlapped", boundary_depth=2)):
        meshes = [_mesh("b", "h100", 2, 4, 2, [9, 9], **boundary), _mesh("a", "a100-80gb", 2, 4, 2, [7, 7])]
        plan = _plan(MODEL, 128, meshes)
        want = simulate(plan, inv, COST)
        got = _price(MODEL, inv, [(128, [[m] for m in meshes])])
        assert got.iteration_time_s == pytest.approx(want.iteration_time_s, rel=1e-12)
        assert got.pipeline_s == pytest.approx(want.pipeline_s, rel=1e-12)
        assert got.memory_gib == pytest.approx(want.memory_gib, rel=1e-12)


def test_two_identical_pipelines_equal_one_with_dp_doubled_up_to_the_gradient_sync():
    """Two twin clusters, one pipeline each with half the batch: every micro-batch step is the one pipeline's
    with twice the DP on one cluster of twice the nodes (same micro-batches, same stage times, same links
    inside a cluster), so the 1F1B makespans are equal; every parameter has two holders, so the gradients of
    the whole model cross the link once in each direction, both at once (the link is full duplex), and both
    ends sum them (bf16 training, fp32 gradient buffer: 4 bytes per parameter; one phase, one latency)."""
    link_gbps, link_ms = 100, 2
    inv = small_inventory([("a1", "h100", 4, 8), ("a2", "h100", 4, 8), ("big", "h100", 8, 8)],
                          [("a1", "a2", link_gbps, link_ms)])
    half = [_mesh("a1", "h100", 4, 4, 1, [16, 16])], [_mesh("a2", "h100", 4, 4, 1, [16, 16])]
    got = _price(MODEL, inv, [(64, [half[0]]), (64, [half[1]])])
    one = simulate(_plan(MODEL, 128, [_mesh("big", "h100", 4, 8, 1, [16, 16])]), inv, COST)
    assert got.pipeline_s == pytest.approx(one.pipeline_s, rel=1e-12)
    # the vocabulary as it runs: padded to a multiple of 128 x TP (4) = 512 (Megatron's rule)
    padded = MODEL.replace(vocab_size=-(-MODEL.vocab_size // 512) * 512)
    params = padded.total_params
    # every element once each way at once; then inside each holder TP rank 0 broadcasts its DP shard of the norms
    # (2h per layer of the stage, h final on the last) to the other TP ranks, on the node's link
    h = MODEL.hidden_size
    norms_per_rank = 4 * (16 * 2 * h + h) / 4
    hand = link_ms / 1e3 + 4 * params / (link_gbps * 1e9 / 8) + \
        inv.cluster("a1").intra_node.transfer_time(norms_per_rank)
    assert got.replica_sync_s == pytest.approx(hand, rel=1e-9)
    # each pipeline alone is the simulator's plan with its half of the batch; the joint iteration adds the sync
    alone = simulate(_plan(MODEL, 64, half[0]), inv, COST)
    assert got.memory_gib[:2] == pytest.approx(alone.memory_gib, rel=1e-12)
    # and the global gradient norm (docs/cost-model.md): one scalar twice around the ring of every rank, each hop
    # at its link's latency. Alone: 32 ranks on one cluster, 32 hops at the nodes' 10 us. Together: 64 ranks,
    # 62 hops at 10 us inside the clusters and 2 across the 2 ms link (a1 -> a2, a2 -> a1). Megatron-LM's result
    # check walks the same ring once more.
    inside = 10e-6
    norm_alone = 2 * 2 * 32 * inside
    norm_both = 2 * 2 * (62 * inside + 2 * link_ms / 1e3)
    assert got.iteration_time_s == pytest.approx(alone.iteration_time_s + hand + norm_both - norm_alone, rel=1e-9)
    assert got.iteration_time_s > alone.iteration_time_s + hand


def test_alongside_twins_equal_one_mesh_of_their_dp_and_a_slower_group_sets_the_stage_time():
    inv = small_inventory([("a", "a100-80gb", 4, 8), ("v", "v100", 4, 8)], [("a", "v", 100, 1)])
    # two identical groups side by side on one cluster = one mesh with their DP summed (same micro-batch)
    pos = [_mesh("a", "a100-80gb", 2, 2, 2, [16]), _mesh("a", "a100-80gb", 2, 2, 2, [16])]
    tail = [_mesh("a", "a100-80gb", 2, 4, 2, [16])]
    got = _price(MODEL, inv, [(64, [pos, tail])], "fp16")
    one = simulate(Plan(model=MODEL, global_batch_size=64, meshes=(_mesh("a", "a100-80gb", 2, 4, 2, [16]), tail[0]),
                        precision="fp16"), inv, COST)
    assert got.pipeline_s == pytest.approx(one.pipeline_s, rel=1e-12)
    # a V100 group next to an A100 group, one stage each: the stage runs at the slower group's pace, which is
    # the V100 mesh alone with the same micro-batches
    # (a vocabulary every TP pads alike: 32256 = 63 x 512, so each group alone builds the same table)
    model = MODEL.replace(vocab_size=32256)
    a = _mesh("a", "a100-80gb", 1, 4, 2, [32])
    v = _mesh("v", "v100", 4, 2, 4, [32])
    got = _price(model, inv, [(128, [[a, v]])], "fp16")
    slow = simulate(Plan(model=model, global_batch_size=128 // 2, meshes=(_mesh("v", "v100", 4, 2, 4, [32]),),
                         precision="fp16"), inv, COST)
    fast = simulate(Plan(model=model, global_batch_size=128 // 2, meshes=(_mesh("a", "a100-80gb", 1, 4, 2, [32]),),
                         precision="fp16"), inv, COST)
    assert slow.pipeline_s > fast.pipeline_s
    assert got.pipeline_s == pytest.approx(slow.pipeline_s, rel=1e-12)      # 8 micro-batch steps of 16 samples
    # memory per group: each group as its own mesh with the same micro-batches in flight
    assert got.memory_gib == pytest.approx(fast.memory_gib + slow.memory_gib, rel=1e-12)
    # two holders: the V100 group's gradients cross the link to the A100 group's ranks and theirs the other way,
    # at once (the whole model in fp32 each way); then the V100 group's TP rank 0 broadcasts its DP shard (of 2)
    # of the norms to the other 3 TP ranks on the node's link
    norms = model.num_layers * 2 * model.hidden_size + model.hidden_size
    hand = 1e-3 + 4 * model.total_params / (100e9 / 8) + inv.cluster("v").intra_node.transfer_time(4 * norms / 2)
    assert got.replica_sync_s == pytest.approx(hand, rel=1e-9)


def test_tied_copies_and_plain_optimizer_replicas_in_the_holders_exchange():
    """Two pipelines of two stages each, tied embeddings, the plain optimizer at DP 2 (every DP replica holds the
    whole gradient; DP rank 0's count). The layers and the final norm have two holders (one per pipeline): their
    gradients cross the 10 Gbit/s link once each way, at once, in the first phase. The tied table has four (both
    ends of both pipelines), each the root of a quarter of it: in the same first phase every copy sends the
    other three their quarters, in a second phase the sums come back. Each direction of the link carries, in the
    first phase, layers, norm and a table (the two far copies' quarters of the two near roots); in the second, a
    table. Then inside every
    holder DP rank 0 broadcasts its local tensors to its replica (the mesh's DP link) and TP rank 0 the norms to
    the other TP ranks (the node's link); the last stages, which hold the most, set that time."""
    model = MODEL.replace(tie_embeddings=True, vocab_size=32256)        # 32256: padded alike at every TP
    inv = small_inventory([("a", "h100", 2, 8), ("b", "h100", 2, 8)], [("a", "b", 10, 5)])
    plain = {"distributed_optimizer": False}
    p0 = [_mesh("a", "h100", 4, 2, 1, [16, 16], setting_overrides=plain)]
    p1 = [_mesh("b", "h100", 4, 2, 1, [16, 16], setting_overrides=plain)]
    got = _price(model, inv, [(32, [p0]), (32, [p1])])
    h = model.hidden_size
    gather = 4 * (model.num_layers * model.layer_params + model.embedding_params + h)
    scatter = 4 * model.embedding_params
    bw = 10e9 / 8
    # a last stage: 16 layers, its copy of the table, the final norm; TP 4 duplicates the norms (2h a layer, h)
    n, dup = 16 * model.layer_params + model.embedding_params + h, 16 * 2 * h + h
    a = inv.cluster("a")
    copies = dp_ring_link(a, 4, 2).transfer_time(4 * ((n - dup) / 4 + dup)) + a.intra_node.transfer_time(4 * dup)
    assert got.replica_sync_s == pytest.approx(2 * 5e-3 + (gather + scatter) / bw + copies, rel=1e-9)
    # one pipeline of single meshes sums only its tied table, in the same exchange: its two holders (first and
    # last stage) are on cluster a, each TP rank of DP rank 0 sends its quarter to the other stage's owner over
    # the inter-node network and gets the other's quarter at once; then each stage's DP rank 0 broadcasts it
    one = _price(model, inv, [(32, [p0])])
    want = simulate(Plan(model=model, global_batch_size=32, meshes=tuple(p0)), inv, COST)
    quarter = 4 * model.vocab_size * h / 4
    tied = a.inter_node.transfer_time(quarter) + dp_ring_link(a, 4, 2).transfer_time(quarter)
    assert one.replica_sync_s == pytest.approx(tied, rel=1e-9)
    assert one.iteration_time_s == pytest.approx(want.iteration_time_s, rel=1e-12)


def test_explain_of_two_pipelines_splits_the_iteration(tmp_path):
    """hetauto explain takes a plan of two pipelines: its parts add up to the predicted iteration, the holders'
    exchange is the hand figure from the inventory's link and the parameter count, and each pipeline of single
    meshes gets its own bottleneck."""
    import yaml

    from helpers import run_hetauto
    from hetauto_megatron.plan.plan import plan_from_dict
    inv = small_inventory([("a1", "h100", 4, 8), ("a2", "h100", 4, 8)], [("a1", "a2", 100, 2)])
    meshes = [_mesh("a1", "h100", 4, 4, 1, [16, 16]), _mesh("a2", "h100", 4, 4, 1, [16, 16], pipeline=1)]
    plan = Plan(model=MODEL, global_batch_size=128, meshes=tuple(meshes), inventory=inv.to_dict(),
                pipeline_samples=(64, 64))
    path = tmp_path / "two.yaml"
    plan.save(str(path))
    r = run_hetauto("explain", "--plan", str(path), "--json")
    assert r.returncode == 0, r.stderr
    import json
    rep = json.loads(r.stdout)
    est = simulate(plan_from_dict(yaml.safe_load(path.read_text())), inv, COST)
    parts = rep["breakdown"]["parts"]
    assert sum(p["seconds"] for p in parts.values()) == pytest.approx(est.iteration_time_s, abs=1e-5)   # 6 decimals
    # two holders of every parameter: the whole model's fp32 gradients (vocabulary padded to 512 for TP 4) cross
    # the 100 Gbit/s, 2 ms link once each way at once; then TP rank 0 of each holder broadcasts its DP shard (of
    # 4) of the norms (2h per layer of the stage's 16, h final) to the other TP ranks on the node's link
    h = MODEL.hidden_size
    params = MODEL.replace(vocab_size=-(-MODEL.vocab_size // 512) * 512).total_params
    node = inv.cluster("a1").intra_node
    hand = 2e-3 + 4 * params / (100e9 / 8) + node.latency_s + 4 * (16 * 2 * h + h) / 4 / node.bytes_per_s
    assert parts["holders_sync"]["seconds"] == pytest.approx(hand, abs=1e-6)
    assert [p["samples"] for p in rep["pipelines"]] == [64, 64] and all(p["bottleneck"] for p in rep["pipelines"])


def test_the_exchange_moves_what_the_runtime_counted():
    """examples/llama/plans/tiny-alongside-cpu.yaml: stage 0 = mesh A (cluster-a, TP 1 x DP 2) beside mesh B
    (cluster-b, TP 2 x DP 1), stage 1 = mesh C (cluster-b), tied embeddings. The runtime counts the bytes its
    exchange sends between the clusters (tests/test_runtime_alongside.py, the same formula from the model's
    shapes): B and A send each other every element of stage 0's layers once, at once (two holders; B's TP rank
    0 for the norms TP duplicates, which broadcasts them inside the mesh); the tied table has three holders, A, B
    and C, each the root of a third of it (shard_regions.root_chunks): with the layers, B and C send A their first
    thirds and A sends B its second and C its last; in a second phase the sums come back. On a full-duplex link of
    1 byte/s without latency the priced exchange is the busier direction's bytes of each phase, in seconds."""
    from hetauto_megatron.plan.multi_simulate import shapes_of
    from hetauto_megatron.plan.plan import load_plan
    from hetauto_megatron.spec.inventory import inventory_from_dict
    plan = load_plan("examples/llama/plans/tiny-alongside-cpu.yaml")
    inv = inventory_from_dict({"clusters": [{"name": "cluster-a", "device": "cpu", "nodes": 1, "devices_per_node": 4},
                                            {"name": "cluster-b", "device": "cpu", "nodes": 1, "devices_per_node": 2}],
                               "links": [{"between": ["cluster-a", "cluster-b"], "bandwidth_gbps": 8e-9,
                                          "latency_ms": 0}]})
    got = shapes_estimate(plan.model, inv.with_precision(plan.precision), shapes_of(plan), COST)
    m = plan.model
    hidden, ffn, heads, kv = m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.num_query_groups
    head = hidden // heads
    split = hidden * (heads + 2 * kv) * head + hidden * hidden + hidden * 2 * ffn + ffn * hidden
    norms, layers, table = 2 * hidden, 4, plan.padded_vocab_size * hidden
    stage0 = layers * (split + norms) + table
    # the runtime counts (2 stage0 + 2 table) x 4 bytes sent between the clusters per iteration
    # (test_runtime_alongside.py measures it); the tiny model by hand: qkv 64 x 8 x 16, proj 64 x 64, fc1 64 x 512,
    # fc2 256 x 64, two norms of 64, four layers; the table 256 padded rows (128 x TP 2) x 64
    assert (split, stage0, table) == (61440, 4 * 61568 + 256 * 64, 256 * 64)
    # first phase: stage 0's layers each way, with two first thirds b -> a and the second and last thirds a -> b
    # (one element more); second phase the sums back: the second and last thirds b -> a, the busier. The exchange
    # inside cluster-b, the broadcast inside mesh B and the ranks' own network are far faster than 1 byte/s
    run = [(j + 1) * table // 3 - j * table // 3 for j in range(3)]
    assert 2 * run[0] < run[1] + run[2]
    priced = ((stage0 - table) + 2 * (run[1] + run[2])) * 4
    assert got.replica_sync_s == pytest.approx(priced, rel=1e-6)
    # and so for the two-pipeline example (tests/test_runtime_pipelines.py): every parameter once each way, the
    # tied table's four copies (both ends of both pipelines) each the root of a quarter; priced: the layers and the
    # final norm each way with the far copies' quarters of the near roots (a table each way), then the sums back
    # (a table each way)
    two = load_plan("examples/llama/plans/tiny-2pipelines-cpu.yaml")
    got = shapes_estimate(two.model, inv.with_precision(two.precision), shapes_of(two), COST)
    m, table = two.model, two.padded_vocab_size * two.model.hidden_size
    assert table % 4 == 0
    priced = 4 * ((m.num_layers * m.layer_params + m.hidden_size) + table + table)
    assert got.replica_sync_s == pytest.approx(priced, rel=1e-6)


def test_compare_takes_two_pipelines_and_counts_the_exchange_between_clusters(tmp_path):
    """hetauto compare puts a plan of two pipelines beside one of a single pipeline: each pipeline's stages and
    micro-batches, its meshes by pipeline, and the bytes between clusters. Each pipeline runs inside its own
    cluster, so those bytes are the gradient exchange alone: two holders of every parameter, each sending the
    other its whole fp32 gradient once (the hand figure from the parameter count, vocabulary padded to 512 for
    TP 4); the single pipeline moves no byte between clusters."""
    import json

    from helpers import run_hetauto
    inv = small_inventory([("a1", "h100", 4, 8), ("a2", "h100", 4, 8)], [("a1", "a2", 100, 2)])
    two = Plan(model=MODEL, global_batch_size=128, inventory=inv.to_dict(), pipeline_samples=(64, 64),
               meshes=(_mesh("a1", "h100", 4, 4, 1, [16, 16]), _mesh("a2", "h100", 4, 4, 1, [16, 16], pipeline=1)))
    one = Plan(model=MODEL, global_batch_size=128, inventory=inv.to_dict(),
               meshes=(_mesh("a1", "h100", 4, 4, 1, [16, 16]),))
    two.save(str(tmp_path / "two.yaml"))
    one.save(str(tmp_path / "one.yaml"))
    r = run_hetauto("compare", str(tmp_path / "two.yaml"), str(tmp_path / "one.yaml"), "--json")
    assert r.returncode == 0, r.stderr
    a, b = json.loads(r.stdout)["plans"]
    params = MODEL.replace(vocab_size=-(-MODEL.vocab_size // 512) * 512).total_params
    assert a["cross_cluster_bytes"] == pytest.approx(2 * 4 * params, rel=1e-12) and b["cross_cluster_bytes"] == 0
    assert a["pipeline"] == "P0: 2 stages x 16 micro-batches; P1: 2 stages x 16 micro-batches"
    assert a["meshes"].startswith("P0 a1 TP4 DP4") and ", P1 a2 TP4 DP4" in a["meshes"]
    assert a["bottleneck"] and b["pipeline"] == "2 stages x 32 micro-batches"
    assert run_hetauto("compare", str(tmp_path / "two.yaml"), str(tmp_path / "one.yaml")).returncode == 0


def test_a_tail_without_parameter_gathers_exposes_none():
    """The gathers a pipeline's tail exposes are its tail less its optimizer step, taken as it was priced, not as
    the stage rows hold it (rounded to the microsecond): with no gathers at all (no distributed optimizer) the rows'
    figure made a rounding error that could read below zero (sailor_hetero_iterations.py printed DP -0.00 s)."""
    from hetauto_megatron.plan.multi_simulate import PipelineTiming

    step = 0.1234566                       # rounds up to 0.123457 in the row: 0.4 us above the tail itself
    tail = PipelineTiming(samples=8, micro_batches=4, makespan=1.0, reduce_s=0.0, after_s=step, overhead_s=0.0,
                          stages=[{"optimizer_s": round(step, 6)}], fits=True, optimizer_s=step)
    assert tail.gathers_s == 0.0
    with_gathers = PipelineTiming(samples=8, micro_batches=4, makespan=1.0, reduce_s=0.0, after_s=step + 0.25,
                                  overhead_s=0.0, stages=[{"optimizer_s": round(step, 6)}], fits=True,
                                  optimizer_s=step)
    assert with_gathers.gathers_s == pytest.approx(0.25, abs=1e-6)


def test_the_exchange_over_a_long_haul_link_is_capped_by_its_connections():
    """A link's per-connection rate (flow_gbps: one TCP stream on a long-haul path gets far less than the path)
    caps the gradient exchange between two pipelines as it caps a pipeline boundary: the runtime sends each rank
    pair's messages on one connection (gloo), so TP 1 x DP 2 on each side (Megatron's distributed optimizer: each
    DP rank the source of half the elements) moves every element over 2 connections, at 2 x 1 Gbit/s on a 100
    Gbit/s link. Before, the exchange was priced at the link's 100 Gbit/s whatever its connections."""
    from hetauto_megatron.spec.inventory import inventory_from_dict
    node = {"nodes": 1, "devices_per_node": 8, "inter_node": {"bandwidth_gbps": 200, "latency_us": 10}}
    link = {"between": ["a1", "a2"], "bandwidth_gbps": 100, "latency_ms": 2}
    model = PRESETS["tiny"]
    pipes = [(8, [[_mesh("a1", "h100", 1, 2, 1, [model.num_layers])]]),
             (8, [[_mesh("a2", "h100", 1, 2, 1, [model.num_layers])]])]
    params = model.replace(vocab_size=-(-model.vocab_size // 128) * 128).total_params    # padded at TP 1
    for flow, rate in ((None, 100), (1, 2 * 1), (60, 100)):
        inv = inventory_from_dict({"clusters": [{"name": "a1", "device": "h100", **node},
                                                {"name": "a2", "device": "h100", **node}],
                                   "links": [{**link, **({"flow_gbps": flow} if flow else {})}]})
        got = _price(model, inv, pipes)
        # every element once each way at once (fp32 gradient buffer), one latency; nothing to copy inside a holder
        assert got.replica_sync_s == pytest.approx(2e-3 + 4 * params / (rate * 1e9 / 8), rel=1e-9), flow


def test_the_exchanges_rank_pairs_count_once_per_link_direction():
    """Two pipelines of two stages with a tied table: the layers' blocks have two holders, the table four (both
    ends of both pipelines), so the same two meshes meet in blocks of two and of four, with either one the root. A
    link direction carries each pair of sending and receiving ranks once; the price counted a pair of holders again
    when they met with the other as root (12 connections one way, 8 the other, for the runtime's 8 each way)."""
    from hetauto_megatron.plan.multi_simulate import price_shapes
    from hetauto_megatron.plan.holders_exchange import _exchange_traffic
    from hetauto_megatron.spec.inventory import inventory_from_dict
    from hetauto_megatron.plan.exchange_roots import exchange_weights
    node = {"nodes": 1, "devices_per_node": 8, "inter_node": {"bandwidth_gbps": 200, "latency_us": 10}}
    inv = inventory_from_dict({"clusters": [{"name": "a1", "device": "h100", **node},
                                            {"name": "a2", "device": "h100", **node}],
                               "links": [{"between": ["a1", "a2"], "bandwidth_gbps": 100, "latency_ms": 2,
                                          "flow_gbps": 1}]})
    model = PRESETS["tiny"].replace(tie_embeddings=True)
    half = model.num_layers // 2
    shapes = _shapes([(8, [[_mesh(c, "h100", 1, 2, 1, [half, half])]]) for c in ("a1", "a2")])
    blocks = price_shapes(model, inv.with_precision("bf16"), shapes, COST).extra["holders"]
    assert any(len(hs) == 2 for _, hs in blocks) and any(len(hs) == 4 for _, hs in blocks)
    _, _, pairs = _exchange_traffic(inv.with_precision("bf16"), blocks, exchange_weights)
    for phase in pairs:
        there, back = (sum(phase.get(("link", x, y), {}).values()) for x, y in (("a1", "a2"), ("a2", "a1")))
        assert there == back, (there, back)
