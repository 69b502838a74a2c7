"""A pipeline stage held by two meshes side by side that differ in TP and micro-batch size (`alongside: true`),
on real Megatron-Core (CPU, gloo, forked ranks), against the single-process reference.

The plan (examples/llama/plans/tiny-alongside-cpu.yaml, tied embeddings, 6 ranks): stage 0 = mesh A (cluster-a,
TP 1 x DP 2, micro-batch 1) beside mesh B (cluster-b, TP 2 with sequence parallelism, DP 1, micro-batch 2);
stage 1 = mesh C (cluster-b, TP 1 x DP 2, micro-batch 2). Production settings (plan/settings.py: the
distributed optimizer, both overlaps, fp32 gradient reduction). One `hetauto dryrun --reference --json` run is
shared by the tests: the command a user runs must take this shape.
"""
import json
from collections import Counter

import pytest
from helpers import cpu_inventory, hetauto_here, planned_cross_cluster_bytes, run_hetauto

from hetauto_megatron.plan.plan import load_plan
from hetauto_megatron.runtime.layout import PipelineLayout
from hetauto_megatron.runtime.train import CLIP_GRAD
from hetauto_megatron.runtime.transfers import Share

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

PLAN = "examples/llama/plans/tiny-alongside-cpu.yaml"
STEPS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The dry run, with its timelines (measured, and predicted above it): (report, timeline files, stderr)."""
    d = tmp_path_factory.mktemp("alongside")
    (d / "inv.yaml").write_text(cpu_inventory(a=2, b=4))
    files = {"trace": d / "timeline.json", "picture": d / "timeline.png"}
    out = hetauto_here("dryrun", "--plan", PLAN, "--tiny", "--reference", "--json", "--steps", str(STEPS),
                      "--timeline", str(files["trace"]), "--timeline", str(files["picture"]), "--compare",
                      "--inventory", str(d / "inv.yaml"))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), files, out.stderr


@pytest.fixture(scope="module")
def report(run):
    return run[0]


def test_layout_of_the_plan():
    """Pure: which meshes hold each stage and which samples each replica holds (docs/plan-format.md)."""
    layout = PipelineLayout(load_plan(PLAN))
    assert layout.stages == [[(0, 0), (1, 0)], [(2, 0)]] and layout.stage_layers == [4, 4]
    assert layout.step == 4 and layout.num_micro_batches == 3
    assert [layout.sample_range(0, d) for d in range(2)] == [(0, 1), (1, 2)] and layout.sample_range(1, 0) == (2, 4)
    assert layout.shares(0) == [Share(1, 2, 0, 2, False), Share(2, 1, 2, 4, True)]
    assert [layout.stage_ranks(s) for s in range(2)] == [[0, 1, 2, 3], [4, 5]]
    assert [layout.sample_share(i) for i in range(3)] == [0.5, 0.5, 1.0]


def test_matches_single_process(report):
    assert report["max_abs_diff"] <= 1e-5, report
    assert len({s["loss"] for s in report["steps"]}) == STEPS          # it trains
    assert all(s["grad_norm"] > CLIP_GRAD for s in report["reference"])  # clipping binds: the global norm matters
    # what ran: the production settings, sequence parallelism on the TP 2 mesh only
    assert [(s["tp"], s["sequence_parallel"], s["distributed_optimizer"], s["overlap_grad_reduce"])
            for s in report["settings"]] == [(1, False, True, True), (2, True, True, True), (1, False, True, True)]


def test_bytes_are_the_resliced_activations_and_the_gradient_sum(report):
    """Counted by the runtime, predicted here from the model's shapes.

    Per micro-batch each sample's activation crosses the boundary once forward and its gradient once back, from
    the mesh holding it at stage 0 to the replica holding it at stage 1: A's 2 samples between cluster-a and
    cluster-b, B's 2 inside cluster-b. Per iteration the gradient sum across the holders (replica_sync.py): the
    layers of stage 0 (two holders, A and B) once each way between A and B (where TP duplicates a parameter, the
    two norms of each layer, B's TP rank 0 receives it and broadcasts it to TP rank 1 inside the mesh); the
    embedding table, held by A, B and C (the tied output layer, its two DP ranks owning halves), in three runs
    whose roots take turns: the first third's to A and back from B and C (four crossings of cluster-a's link),
    the second's to B and the last's to C and back from A (two crossings each) and from the other holder inside
    cluster-b. Nothing else leaves a mesh."""
    m, vocab = report["model"], report["padded_vocab_size"]
    seq, hidden, ffn, heads, kv = (m[k] for k in ("seq_length", "hidden_size", "ffn_hidden_size",
                                                  "num_attention_heads", "num_query_groups"))
    fp32 = 4
    micro, a_samples, b_samples = 3, 2, 2
    activations_a = 2 * micro * seq * a_samples * hidden * fp32
    activations_b = 2 * micro * seq * b_samples * hidden * fp32
    head = hidden // heads
    split = hidden * (heads + 2 * kv) * head + hidden * hidden + hidden * 2 * ffn + ffn * hidden  # qkv, proj, fc1, fc2
    norms = 2 * hidden                                    # RMSNorm weights, the same on every TP rank
    layers, table = 4, vocab * hidden
    run = [(j + 1) * table // 3 - j * table // 3 for j in range(3)]     # shard_regions.root_chunks
    sync = (2 * layers * (split + norms)                  # stage 0's layers: B -> A, A -> B
            + 4 * run[0] + 2 * run[1] + 2 * run[2]) * fp32     # the table's runs rooted at A, B, C
    inside_b = (2 * run[1] + 2 * run[2]) * fp32           # C <-> B for the runs rooted at B and at C
    assert report["bytes"]["intra_cluster"] == (activations_b + inside_b) * STEPS
    assert report["bytes"]["inter_cluster"] == (activations_a + sync) * STEPS
    # the planner's figure (hetauto compare's cross-cluster bytes) is what the runtime moved
    assert planned_cross_cluster_bytes(report, PLAN, cpu_inventory(a=2, b=4)) * STEPS == \
        report["bytes"]["inter_cluster"]


def test_memory_predicted_per_mesh(report):
    """Meshes side by side at a stage get their own prediction (their TP, DP, micro-batch) and match it."""
    rows = report["memory"]
    assert sorted({(r["stage"], r["mesh"]) for r in rows}) == [(0, 0), (0, 1), (1, 2)]
    for r in rows:
        assert r["measured"]["total"] == pytest.approx(r["predicted"]["total"], rel=0.03), r


def test_meshes_side_by_side_in_one_of_two_pipelines(tmp_path):
    """Both version-3 shapes in one plan (8 ranks, tied embeddings): pipeline 0 = two stages, each held by a TP 1
    and a TP 2 (sequence parallel) mesh side by side, one sample each; pipeline 1 = TP 1 over 3 | 5 layers, two
    samples, its stages in the other cluster order."""
    import yaml

    plan = {"version": 3, "model": {**yaml.safe_load(open(PLAN))["model"]}, "global_batch_size": 8,
            "pipelines": [{"samples": 4}, {"samples": 4}],
            "meshes": [{"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 1,
                        "stage_layers": [4, 4]},
                       {"cluster": "b", "device_type": "cpu", "tp": 2, "dp": 1, "micro_batch_size": 1,
                        "stage_layers": [4, 4], "alongside": True},
                       {"cluster": "b", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 2,
                        "stage_layers": [3], "pipeline": 1},
                       {"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 2,
                        "stage_layers": [5], "pipeline": 1}]}
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump(plan))
    out = hetauto_here("dryrun", "--plan", str(path), "--tiny", "--reference", "--json", "--steps", "2")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["max_abs_diff"] <= 1e-5, r
    assert all(s["grad_norm"] > CLIP_GRAD for s in r["reference"])


def test_timelines_show_each_replica_group(run):
    """`dryrun --timeline --compare` on a stage held by two meshes: the measured timeline has a lane per rank and
    (picture) per stage and mesh; the prediction has a lane per stage and replica group, the same groups as ran,
    each doing the same micro-batches; the comparison line pairs each measured group with its predicted one."""
    _, files, err = run
    assert files["picture"].stat().st_size > 10_000
    with open(files["trace"]) as fh:
        trace = json.load(fh)
    assert [t["source"] for t in trace["otherData"]["timelines"]] == ["predicted", "measured"]
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    lanes: dict = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            key = (procs[e["pid"]].split(":")[0], names[(e["pid"], e["tid"])])
            lanes.setdefault(key, Counter())[e["cat"]] += 1
    m = PipelineLayout(load_plan(PLAN)).num_micro_batches
    measured = {n: c for (src, n), c in lanes.items() if src == "measured"}
    predicted = {n: c for (src, n), c in lanes.items() if src == "predicted" and " stage " in f" {n}"}
    assert len(measured) == 6 and all(c["forward"] == c["backward"] == m and c["optimizer"] == 1
                                      for c in measured.values()), measured
    assert sorted(predicted) == ["stage 0 mesh 0: cpu TP1 x2", "stage 0 mesh 1: cpu TP2 x1", "stage 1"]
    assert all(c["forward"] == c["backward"] == m for c in predicted.values())
    line = next(x for x in err.splitlines() if x.startswith("timeline: "))
    pairs = line.split("measured / predicted: ")[1].split(", ")
    assert [p.split(":")[0] for p in pairs] == ["0 (mesh 0)", "0 (mesh 1)", "1 (mesh 2)"], line


def test_validate_cost_model_takes_the_report_of_this_shape(run, tmp_path):
    """`validate-cost-model --dryrun REPORT PLAN` on the side-by-side run: the measured iteration against the
    simulator's prediction of the shape that ran (the shrunk model, its six ranks on the report's cores)."""
    report, _, _ = run
    (tmp_path / "report.json").write_text(json.dumps(report))
    (tmp_path / "inv.yaml").write_text(cpu_inventory(a=2, b=4))
    out = run_hetauto("validate-cost-model", "--dryrun", str(tmp_path / "report.json"), PLAN,
                      "--inventory", str(tmp_path / "inv.yaml"), "--json")
    assert out.returncode == 0, out.stderr
    row, = json.loads(out.stdout)["dryruns"]["rows"]
    assert (row["hidden_size"], row["seq_length"]) == (report["model"]["hidden_size"], report["model"]["seq_length"])
    assert row["ranks"] == 6 and row["measured_s"] == report["iteration_s"]
    assert row["error_pct"] == pytest.approx(100 * (row["predicted_s"] - row["measured_s"]) / row["measured_s"])
