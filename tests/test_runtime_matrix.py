"""Heterogeneous layouts on real Megatron-Core (CPU, gloo, forked ranks) against the single-process reference:
losses and grad norms over 3 Adam steps must agree to 1e-5, and the byte counters must show which path the
data took.

The layouts run the production settings of plan/settings.py (nothing here sets them): the distributed
optimizer with the gradient reduce-scatter and the parameter all-gather overlapped, gradients reduced in
fp32, sequence parallelism where TP > 1. The reference is one process with Megatron's plain optimizer. Every
step's gradient norm is above the clipping threshold, so clipping binds and a wrong global norm changes the
update. Each layout runs once per session (`report`); the tests read the shared reports. GPT-2's 50257-token
vocabulary, padded once for the whole plan and tied between a TP 2 and a TP 1 x DP 2 cluster, is the same
check in tests/test_runtime_sp.py.
"""
import os

import pytest
from helpers import ROOT, mesh

from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.runtime.dryrun import run_dryrun
from hetauto_megatron.runtime.gradients import owned_interval
from hetauto_megatron.runtime.train import CLIP_GRAD
from hetauto_megatron.spec.model import PRESETS

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

TINY = PRESETS["tiny"].to_dict()  # 8 layers, 4 heads, 2 key/value groups
TIED = {**TINY, "tie_embeddings": True}
STEPS = 3


def plan(meshes, model=TINY, gbs=None):
    step = meshes[0]["dp"] * meshes[0]["micro_batch_size"]
    return plan_from_dict({"version": 2, "model": model, "global_batch_size": gbs or 3 * step, "meshes": meshes})


OVERLAPPED_1 = {"schedule": "overlapped", "depth": 1}
# Boundaries are blocking unless a case says otherwise; tests/test_runtime_overlap.py runs TP 2 -> 1 and
# DP 2 -> 1 both ways and compares the two schedules with each other.
CASES = {
    # TP 2 -> 1, uneven layers, two clusters, full recomputation in the TP 2 mesh
    "tp2_to_tp1_uneven": plan([{**mesh("a", 2, 1, 2, [2, 3]), "recompute": "full"}, mesh("b", 1, 1, 2, [3])]),
    # TP 1 -> 2, selective recomputation (the MLP, as the cost model prices it) in the TP 2 mesh
    "tp1_to_tp2": plan([mesh("a", 1, 1, 2, [3]), {**mesh("b", 2, 1, 2, [5]), "recompute": "selective"}]),
    # DP 2 -> 1 (the smaller DP runs the larger micro-batch): the DP 2 mesh shards its optimizer
    "dp2_to_dp1": plan([mesh("a", 1, 2, 1, [4]), mesh("b", 2, 1, 2, [4])]),
    # 3 meshes in 2 clusters, TP 2 -> 4 across the clusters (overlapped, depth 1), then 4 -> 1 inside one
    "three_meshes_tp2_4_1": plan([{**mesh("x", 2, 1, 2, [3]), "boundary": OVERLAPPED_1}, mesh("y", 4, 1, 2, [3]),
                                  mesh("y", 1, 1, 2, [2])],
                                 model={**TINY, "num_attention_heads": 8, "num_query_groups": 4}),
    # tied embeddings, first and last stage in different clusters with different TP and DP: the last mesh's two
    # DP ranks own different halves of the output layer after the reduce-scatter; the boundary is overlapped
    # with depth 2 (every micro-batch of the step in flight before the first backward)
    "tied_across_clusters": plan([{**mesh("a", 2, 1, 2, [4]), "boundary": {"schedule": "overlapped", "depth": 2}},
                                  mesh("b", 1, 2, 1, [4])], model=TIED),
    # one cluster, two meshes: the embedding's stage at TP 1, then TP 2 with full recomputation on the same
    # cluster (an intra-cluster boundary between different TP), tied to a TP 1 x DP 2 last stage in another cluster
    "two_meshes_one_cluster": plan([mesh("a", 1, 1, 2, [0, 2]), mesh("a", 2, 1, 2, [3], recompute="full"),
                                    mesh("b", 1, 2, 1, [3])], model=TIED),
    # an embedding-only first stage (zero transformer layers), tied to a TP 2 last stage
    "embedding_only_stage": plan([mesh("a", 1, 1, 2, [0, 4]), mesh("b", 2, 1, 2, [4])], model=TIED),
}
PLAIN = "tied_across_clusters"   # also run with --no-distributed-optimizer

_reports = {}


def report(name, distributed_optimizer=True):
    key = (name, distributed_optimizer)
    if key not in _reports:
        p = CASES[name]
        assert p.world_size <= 8
        _reports[key] = run_dryrun(p, steps=STEPS, seed=7, tiny=True, reference=True, timeout_s=60,
                                   distributed_optimizer=distributed_optimizer)
    return _reports[key]


@pytest.mark.parametrize("name,distributed_optimizer", [(n, True) for n in sorted(CASES)] + [(PLAIN, False)])
def test_matches_single_process(name, distributed_optimizer):
    p, r = CASES[name], report(name, distributed_optimizer)
    assert "error" not in r, r.get("error")
    assert len(r["steps"]) == STEPS
    assert r["max_abs_diff"] <= 1e-5, r
    # the model trains, and clipping binds at every step (the reference's own norm says so)
    losses = [s["loss"] for s in r["steps"]]
    assert len(set(losses)) == STEPS
    assert all(s["grad_norm"] > CLIP_GRAD for s in r["reference"]), r["reference"]
    clusters = {m.cluster for m in p.meshes}
    if len(clusters) > 1:
        assert r["bytes"]["inter_cluster"] > 0
    else:
        assert r["bytes"]["inter_cluster"] == 0
    # what ran is what the settings table says, per mesh
    for m, ran in zip(p.meshes, r["settings"]):
        want = m.settings.to_dict()
        if not distributed_optimizer:
            want.update(distributed_optimizer=False, overlap_param_gather=False)
        assert {k: ran[k] for k in want} == want, (m, ran)


def boundary_bytes(p, r):
    """Inter-cluster bytes of the activations and their gradients: once per micro-batch each way, fp32."""
    tiny = r["model"]
    per_micro = tiny["seq_length"] * p.samples_per_step * tiny["hidden_size"] * 4
    crossings = sum(a.cluster != b.cluster for a, b in zip(p.meshes, p.meshes[1:]))
    return 2 * per_micro * p.num_micro_batches * crossings * STEPS


def test_inter_cluster_bytes_are_exactly_the_boundary_traffic():
    # one boundary a -> b and no tied weights: nothing else may take the inter-cluster path (in particular not
    # the distributed optimizer's reduce-scatter or all-gather, which stay inside each mesh)
    p = CASES["tp2_to_tp1_uneven"]
    r = report("tp2_to_tp1_uneven")
    assert r["bytes"]["inter_cluster"] == boundary_bytes(p, r)


@pytest.mark.parametrize("distributed_optimizer", [True, False])
def test_tied_embeddings_cross_once_each_way(distributed_optimizer):
    # Shard to shard: every element of the tied table crosses the slow link once in each direction per step,
    # whether the last mesh's two DP ranks own halves of it (distributed optimizer) or DP rank 0 owns it all.
    p, r = CASES[PLAIN], report(PLAIN, distributed_optimizer)
    table = r["padded_vocab_size"] * r["model"]["hidden_size"] * 4   # every mesh's table has the plan's rows
    assert r["bytes"]["inter_cluster"] - boundary_bytes(p, r) == 2 * table * STEPS


TIED_CASES = [(n, True) for n in sorted(CASES) if CASES[n].model.tie_embeddings] + [(PLAIN, False)]


@pytest.mark.parametrize("name,distributed_optimizer", TIED_CASES)
def test_tied_copies_stay_bitwise_equal(name, distributed_optimizer):
    # After 3 steps the first stage's embedding table and the last stage's output layer (each put together from
    # its TP shards) are the same bits: both ends of the pair exchange compute the same sum on the host, and
    # each then runs the same optimizer update on it.
    digests = report(name, distributed_optimizer)["shared_digests"]
    assert list(digests) == ["embedding.word_embeddings.weight"], digests
    copies = digests["embedding.word_embeddings.weight"]
    assert len(copies) == 2 and "incomplete" not in copies.values(), copies
    assert len(set(copies.values())) == 1, copies


def test_same_cluster_meshes_stay_off_the_inter_cluster_path():
    p = plan([mesh("a", 2, 1, 2, [4]), mesh("a", 1, 1, 2, [4])])
    r = run_dryrun(p, steps=1, seed=1, tiny=True, reference=False, timeout_s=60)
    assert r["bytes"]["inter_cluster"] == 0 and r["bytes"]["intra_cluster"] > 0


def test_cli_dryrun_json_on_the_example_plan(tiny_dryrun_json):
    """The command a user (and the README) runs, `hetauto dryrun --plan examples/llama/plans/tiny-2clusters-cpu.yaml
    --tiny --reference --json` (the session's run of it, conftest.py; run as a separate process by
    test_runtime_overlap.py): real processes, the documented JSON keys, the single-process reference's losses."""
    import json

    r = json.loads(tiny_dryrun_json)
    assert set(r) >= {"steps", "reference", "max_abs_diff", "bytes", "settings"}
    assert len(r["steps"]) == 3 and set(r["steps"][0]) == {"loss", "grad_norm"}
    assert r["max_abs_diff"] <= 1e-5
    assert r["bytes"]["inter_cluster"] > 0 and r["bytes"]["intra_cluster"] > 0
    assert [(s["cluster"], s["distributed_optimizer"], s["overlap_grad_reduce"]) for s in r["settings"]] == \
        [("cluster-a", True, True), ("cluster-b", True, True)]


# ---- the pure parts of the tied table's exchange -----------------------------------------------------------------

def test_owned_interval_follows_megatrons_bucket_shards():
    # a 10-element parameter at [4, 14) of a 16-element bucket, DP 2: rank 0 owns [0, 8) of the bucket
    assert owned_interval(4, 14, 16, 2, 0) == (0, 4)
    assert owned_interval(4, 14, 16, 2, 1) == (4, 10)
    assert owned_interval(0, 4, 16, 2, 1) == (0, 0)     # the rank's shard misses the parameter


def test_tied_table_pairs_each_element_once():
    """The tied table's two holders, as replica_sync.py pairs them: first stage TP 2 (ranks 0, 1) own halves of
    a 12-element table; last stage DP 3 shards of 5, 4, 3 (rank 7 owns nothing). Every element goes once each
    way between the rank of the last stage that owns it and the first stage's owner, both directions in one
    phase (the start-up copy of the weights: the first stage's owner to the last stage's, once)."""
    from hetauto_megatron.runtime.shard_regions import Owner, sync_moves, tp_layout

    first = [Owner(r, (0, 0), 1.0, tp_layout((6, 1), 2, t, 0), 0, 6, True) for t, r in enumerate((0, 1))]
    whole = tp_layout((12, 1), 1, 0, None)
    last = [Owner(r, (1, 0), 1.0, whole, lo, hi, True) for r, lo, hi in ((4, 0, 5), (5, 5, 9), (6, 9, 12), (7, 0, 0))]
    moves = [(m.phase, m.src, m.dst, m.rects) for m in sync_moves("table", first + last)]
    pairs = [(4, 0, 0, 5), (5, 0, 5, 6), (5, 1, 6, 9), (6, 1, 9, 12)]
    assert moves == [m for s, d, lo, hi in pairs
                     for m in (("pair", s, d, ((lo, hi, 0, 1),)), ("pair", d, s, ((lo, hi, 0, 1),)))]
    copy = [(m.phase, m.src, m.dst, m.rects) for m in sync_moves("table", first + last, pairwise=False,
                                                                  rotate=False)]
    assert [m for m in copy if m[0] == "scatter"] == [("scatter", d, s, ((lo, hi, 0, 1),)) for s, d, lo, hi in pairs]
    with pytest.raises(ValueError, match="different shapes"):
        sync_moves("table", first + [Owner(4, (1, 0), 1.0, tp_layout((8, 1), 1, 0, None), 0, 8, True)])
    with pytest.raises(ValueError, match="partition"):
        sync_moves("table", first + [Owner(4, (1, 0), 1.0, whole, 0, 6, True),
                                     Owner(5, (1, 0), 1.0, whole, 5, 12, True)])


def test_cli_dryrun_no_distributed_optimizer_table_says_what_ran(capsys):
    """--no-distributed-optimizer: every mesh runs the plain optimizer (so no parameter all-gather to overlap);
    the table lists per mesh the settings read back from what Megatron built."""
    from hetauto_megatron.cli import main

    assert main(["dryrun", "--plan", os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml"),
                 "--tiny", "--steps", "1",
                 "--no-distributed-optimizer"]) == 0
    out = capsys.readouterr().out
    assert "mesh 0 (cluster-a, tp 2 x dp 1): sequence_parallel, overlap_grad_reduce; gradients reduced in fp32" in out
    assert "mesh 1 (cluster-b, tp 1 x dp 2): overlap_grad_reduce; gradients reduced in fp32" in out


def test_priced_tie_exchange_is_what_the_runtime_sent():
    """The cost model's iteration tail prices the tied table's sum the runtime runs (replica_sync.py): one
    (padded) table in the main-gradient dtype over the link between the clusters in each direction, both at once
    (one phase; the link is full duplex). Compared with the bytes the dry run counted, for both optimizers (the
    plain one adds a DP broadcast inside cluster b, priced apart)."""
    import yaml
    from helpers import CPU_INVENTORY

    from hetauto_megatron.plan.costing import StageProfile
    from hetauto_megatron.plan.link_costs import dp_ring_link
    from hetauto_megatron.plan.settings import resolve_settings
    from hetauto_megatron.plan.holders_exchange import holders_sync_time, tied_table_blocks
    from hetauto_megatron.runtime.model import shrink_model
    from hetauto_megatron.spec.inventory import inventory_from_dict

    inv = inventory_from_dict(yaml.safe_load(CPU_INVENTORY.replace("cluster-a", "a").replace("cluster-b", "b")))
    link = inv.link("a", "b")
    p = CASES[PLAIN]
    model = shrink_model(p.model, p)
    for distributed_optimizer in (True, False):
        r = report(PLAIN, distributed_optimizer)
        profiles = []
        for m, ran in zip(p.meshes, r["settings"]):    # priced with the settings that ran
            settings = resolve_settings(m.tp, {k: ran[k] for k in ("distributed_optimizer", "overlap_param_gather")})
            c = inv.cluster(m.cluster)
            profiles.append(StageProfile(c, m.tp, m.dp, m.micro_batch_size, "none", 0, 0, 0, 0, 0, 0,
                                         dp_ring_link(c, m.tp, m.dp), 0, settings))
        exchange = holders_sync_time(inv, tied_table_blocks(model, p.meshes, profiles[0], profiles[-1]))
        if not distributed_optimizer:
            exchange -= profiles[-1].dp_link.transfer_time(r["padded_vocab_size"] * model.hidden_size * 4)
        priced_bytes_per_direction = (exchange - link.latency_s) * link.bytes_per_s
        measured = r["bytes"]["inter_cluster"] - boundary_bytes(p, r)
        assert priced_bytes_per_direction == pytest.approx(measured / 2 / STEPS, rel=1e-9)


def test_a_full_size_tp_plan_matches_its_reference_within_the_optimizers_rounding():
    """examples/llama/plans/cpu-small-tp2.yaml at full size (hidden 384, vocabulary 4,096): the losses match the
    one-process reference to fp32 rounding, and so do the gradients, while the norms the two optimizers report
    differ by about 1e-5 of themselves (each takes fp32 norms of its own tensors: shards there, whole tensors
    here). `hetauto dryrun --reference` failed this shipped plan under one 1e-5 absolute tolerance; the grad norm
    is now held to 1e-4 of itself (runtime/dryrun.py parity), the loss still to 1e-5."""
    from hetauto_megatron.plan.plan import load_plan
    from hetauto_megatron.runtime.dryrun import parity
    r = run_dryrun(load_plan(os.path.join(ROOT, "examples", "llama", "plans", "cpu-small-tp2.yaml")), steps=2,
                   seed=1234, tiny=False, reference=True, timeout_s=120)
    assert r["parity"]["ok"] and r["parity"]["loss_max_abs_diff"] <= 1e-5, r["parity"]
    # the rule itself, on figures of that size: a grad norm off by 1e-3 of itself or a loss off by 2e-5 fails
    ref = [{"loss": 8.4, "grad_norm": 1.77}]
    assert parity([{"loss": 8.4, "grad_norm": 1.77 * (1 + 2e-5)}], ref)["ok"]
    assert not parity([{"loss": 8.4, "grad_norm": 1.77 * (1 + 1e-3)}], ref)["ok"]
    assert not parity([{"loss": 8.4 + 2e-5, "grad_norm": 1.77}], ref)["ok"]
    # a norm of 0 matches a rounding-sized one; a NaN in any step fails (max() let a later NaN pass)
    assert parity([{"loss": 8.4, "grad_norm": 1e-12}], [{"loss": 8.4, "grad_norm": 0.0}])["ok"]
    assert not parity(ref + [{"loss": float("nan"), "grad_norm": 1.7}], ref + [{"loss": 8.3, "grad_norm": 1.7}])["ok"]


def test_the_reports_max_abs_diff_is_null_where_a_figure_is_not_finite():
    """A dozen tests hold a dry run's max_abs_diff to 1e-5: max() let a NaN after the first step pass as 0."""
    from hetauto_megatron.runtime.dryrun import max_abs_diff
    ref = [{"loss": 8.4, "grad_norm": 1.77}, {"loss": 8.3, "grad_norm": 1.7}]
    assert max_abs_diff([ref[0], {"loss": 8.3, "grad_norm": float("nan")}], ref) is None
    assert max_abs_diff([ref[0], {"loss": float("inf"), "grad_norm": 1.7}], ref) is None
    assert max_abs_diff([ref[0], {"loss": 8.3, "grad_norm": 1.6}], ref) == pytest.approx(0.1)
