"""Heterogeneous layouts on real Megatron-Core (CPU, gloo, forked ranks) against the single-process reference:
losses and grad norms over 3 Adam steps must agree to 1e-5, and the byte counters must show which path the
activations took."""
import pytest
from helpers import mesh, run_hetauto

from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.runtime.dryrun import run_dryrun
from hetauto_megatron.spec.model import PRESETS

TINY = PRESETS["tiny"].to_dict()  # 8 layers, 4 heads, 2 key/value groups


def plan(meshes, model=TINY, gbs=None):
    step = meshes[0]["dp"] * meshes[0]["micro_batch_size"]
    return plan_from_dict({"version": 1, "model": model, "global_batch_size": gbs or 3 * step, "meshes": meshes})


CASES = {
    # (a) TP 2 -> 1, uneven layers, two clusters
    "a_tp2_to_tp1_uneven": plan([mesh("a", 2, 1, 2, [2, 3]), mesh("b", 1, 1, 2, [3])]),
    # (b) TP 1 -> 2
    "b_tp1_to_tp2": plan([mesh("a", 1, 1, 2, [3]), mesh("b", 2, 1, 2, [5])]),
    # (c) DP mismatch: tp1 dp2 -> tp2 dp1 (the smaller DP runs the larger micro-batch)
    "c_dp2_to_dp1": plan([mesh("a", 1, 2, 1, [4]), mesh("b", 2, 1, 2, [4])]),
    # (d) 3 meshes, 2 clusters, TP 4 -> 2 -> 1 (a model with 4 key/value groups so TP 4 is legal)
    "d_three_meshes_tp4_2_1": plan([mesh("x", 4, 1, 2, [3]), mesh("x", 2, 1, 2, [3]), mesh("y", 1, 1, 2, [2])],
                                   model={**TINY, "num_attention_heads": 8, "num_query_groups": 4}),
    # (e) tied embeddings, first and last stage in different clusters with different TP and DP
    "e_tied_across_clusters": plan([mesh("a", 2, 1, 2, [4]), mesh("b", 1, 2, 1, [4])],
                                   model={**TINY, "tie_embeddings": True}),
    # (f) an embedding-only first stage (zero transformer layers)
    "f_zero_layer_first_stage": plan([mesh("a", 1, 1, 2, [0, 4]), mesh("b", 2, 1, 2, [4])]),
    # full activation recomputation in one mesh (Megatron's checkpointing with the CPU RNG tracker)
    "g_recompute_full": plan([{**mesh("a", 2, 1, 2, [4]), "recompute": "full"}, mesh("b", 1, 1, 2, [4])]),
    # selective recomputation (the MLP, as the cost model prices it) in a TP 2 mesh, none in the other
    "h_recompute_selective": plan([mesh("a", 1, 1, 2, [4]), {**mesh("b", 2, 1, 2, [4]), "recompute": "selective"}]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_single_process(name):
    p = CASES[name]
    assert p.world_size <= 8
    report = run_dryrun(p, steps=3, seed=7, tiny=True, reference=True, timeout_s=60)
    assert "error" not in report, report.get("error")
    assert len(report["steps"]) == 3
    assert report["max_abs_diff"] <= 1e-5, report
    # the model trains: something changed between steps, and norms are finite and positive
    losses = [s["loss"] for s in report["steps"]]
    assert len(set(losses)) == 3 and all(s["grad_norm"] > 0 for s in report["steps"])
    clusters = {m.cluster for m in p.meshes}
    if len(clusters) > 1:
        assert report["bytes"]["inter_cluster"] > 0
    else:
        assert report["bytes"]["inter_cluster"] == 0


def test_inter_cluster_bytes_are_exactly_the_boundary_traffic():
    # (a): one boundary a -> b. Per micro-batch the activation (seq, batch, hidden) crosses once forward and
    # its gradient once backward, fp32: nothing else may take the inter-cluster path.
    p = CASES["a_tp2_to_tp1_uneven"]
    report = run_dryrun(p, steps=2, seed=1, tiny=True, reference=False, timeout_s=60)
    tiny = report["model"]
    per_micro = tiny["seq_length"] * p.samples_per_step * tiny["hidden_size"] * 4
    assert report["bytes"]["inter_cluster"] == 2 * per_micro * p.num_micro_batches * 2


def test_same_cluster_meshes_stay_off_the_inter_cluster_path():
    p = plan([mesh("a", 2, 1, 2, [4]), mesh("a", 1, 1, 2, [4])])
    report = run_dryrun(p, steps=1, seed=1, tiny=True, reference=False, timeout_s=60)
    assert report["bytes"]["inter_cluster"] == 0 and report["bytes"]["intra_cluster"] > 0


def test_cli_dryrun_json_on_the_example_plan():
    """The command a user (and the README) runs: real processes, exit code 0, the documented JSON keys."""
    import json

    out = run_hetauto("dryrun", "--plan", "examples/llama/plans/tiny-2clusters-cpu.yaml", "--tiny", "--reference",
                      "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert set(report) >= {"steps", "reference", "max_abs_diff", "bytes"}
    assert len(report["steps"]) == 3 and set(report["steps"][0]) == {"loss", "grad_norm"}
    assert report["max_abs_diff"] <= 1e-5
    assert report["bytes"]["inter_cluster"] > 0 and report["bytes"]["intra_cluster"] > 0
