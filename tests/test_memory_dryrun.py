"""The memory model against what dry-run ranks really hold, stage by stage, under the production settings.

Each rank of a real `hetauto dryrun --tiny` (Megatron-Core GPTModel stages, Megatron's DDP and distributed
optimizer, 1F1B, sequence parallelism where TP > 1, overlapped gradient reduce and parameter gather) measures
(runtime/memory_meter.py) its weights, gradient buffer and optimizer state from the tensors, and its
activations with saved-tensor hooks through the whole schedule (peak of the live bytes autograd holds, unique
storages, in-flight micro-batches and recomputation included). `hetauto dryrun --json` reports them beside
cost/memory.py's prediction for the same stage (the shrunk model, fp32, the padded vocabulary, the layers the
dry run builds: runtime/dryrun.py predicted_stage_memory).

Grid: the session's 2-cluster run (TP 2 x DP 1 over two stages, TP 1 x DP 2; no recomputation; no dropout, the
default settings) and one 7-rank run here: TP 1 x DP 1 selective, TP 2 x DP 1 full, TP 2 x DP 2 selective, one
stage each (in flight 3, 2, 1), with hidden and attention dropout 0.1 in every mesh's settings (the dry run builds
its layers with them, as the launch arguments and the --hetauto rewrite pass them to Megatron).
Target: every stage within 10 % (activations and total); weights, gradient buffer and the busiest DP rank's optimizer
state exact to the byte (cost/ddp_buffer.py: Megatron's buffer padding priced).
"""
import contextlib
import io
import json

import pytest
import yaml

from hetauto_megatron.cli import main

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

ACTIVATIONS_TOLERANCE = 0.10
# Overlapped boundaries' tensors (messages held, pieces, sends in flight) are priced as the runtime holds them: those
# runs' activations within 1 % (what is left: the dry run's causal mask and rope table, 1,280 bytes at most, kept
# by unfused attention and checkpoints once per rank and not priced)
BOUNDARY_TOLERANCE = 0.01
TOTAL_TOLERANCE = 0.10
# Q kept as a view of the fused QKV output at micro-batch 1 (one key/value group per rank, no rope): priced as the
# local attention keeps it, the stages within 2 % (measured 0.6 %; 6.9-8.3 % before it was priced)
QUERY_VIEW_TOLERANCE = 0.02
DROPOUT = {"hidden_dropout": 0.1, "attention_dropout": 0.1}
GRID_PLAN = {
    "version": 2,
    "model": {"name": "tiny", "num_layers": 6, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2,
              "ffn_hidden_size": 256, "vocab_size": 128, "seq_length": 32, "gated_mlp": True,
              "tie_embeddings": False, "position_embedding": "rope", "max_position_embeddings": 32},
    "global_batch_size": 8,
    "meshes": [
        {"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 2, "recompute": "selective",
         "stage_layers": [2], "settings": DROPOUT},
        {"cluster": "b", "device_type": "cpu", "tp": 2, "dp": 1, "micro_batch_size": 2, "recompute": "full",
         "stage_layers": [2], "settings": DROPOUT},
        {"cluster": "c", "device_type": "cpu", "tp": 2, "dp": 2, "micro_batch_size": 1, "recompute": "selective",
         "stage_layers": [2], "settings": DROPOUT},
    ],
}


@pytest.fixture(scope="module")
def grid_memory(tmp_path_factory):
    path = tmp_path_factory.mktemp("memgrid") / "plan.yaml"
    path.write_text(yaml.safe_dump(GRID_PLAN))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["dryrun", "--plan", str(path), "--tiny", "--steps", "1", "--json"]) == 0
    report = json.loads(buf.getvalue())
    # what ran (read back from the TransformerConfig each mesh built): the plan's dropouts
    assert [(s["hidden_dropout"], s["attention_dropout"]) for s in report["settings"]] == [(0.1, 0.1)] * 3
    return report["memory"]


def _check(rows, activations=ACTIVATIONS_TOLERANCE):
    worst = []
    # the state is exact: weights and gradient buffer on every rank, the optimizer's shard on the busiest DP rank
    # of each stage (the others' pieces of the buffer hold more of its padding)
    busiest = {}
    for r in rows:
        key = (r.get("pipeline"), r["mesh"], r["stage"])
        busiest[key] = max(busiest.get(key, 0), r["measured"]["optimizer"])
    for r in rows:
        p, g = r["predicted"], r["measured"]
        where = (r["rank"], r["stage"], r["tp"], r["dp"], r["recompute"])
        for part in ("weights", "gradients"):
            assert g[part] == p[part], (where, part, p[part], g[part])
        assert busiest[(r.get("pipeline"), r["mesh"], r["stage"])] == p["optimizer"], (where, p, busiest)
        assert g["activations"] == pytest.approx(p["activations"], rel=activations), \
            (where, "activations", p["activations"], g["activations"])
        assert g["total"] == pytest.approx(p["total"], rel=TOTAL_TOLERANCE), (where, "total", p["total"], g["total"])
        # cross-check: what the allocator saw the step allocate covers the saved tensors
        assert g["allocator_peak"] >= g["activations"], (where, g)
        worst.append(abs(g["activations"] / p["activations"] - 1))
    print(f"worst activation error {max(worst):.1%} over {len(rows)} ranks")


def _two_stage_plan(path, model, first, second):
    """Write GRID_PLAN with `model` over two one-stage CPU meshes of two layers each, cluster a then b, with
    the (tp, recompute) given for each; returns the path, for dryrun --plan."""
    meshes = [{"cluster": c, "device_type": "cpu", "tp": tp, "dp": 1, "micro_batch_size": 2, "recompute": r,
               "stage_layers": [2]} for c, (tp, r) in zip("ab", (first, second))]
    path.write_text(yaml.safe_dump({**GRID_PLAN, "model": model, "meshes": meshes}))
    return path


def test_every_stage_of_the_recompute_grid_within_10_percent(grid_memory):
    assert [r["recompute"] for r in grid_memory] == ["selective"] + ["full"] * 2 + ["selective"] * 4
    assert [r["in_flight"] for r in grid_memory] == [3, 2, 2, 1, 1, 1, 1]
    _check(grid_memory)


def test_a_model_without_grouped_query_attention_within_10_percent(tmp_path, capsys):
    """The grid's model with as many key/value heads as query heads (LLaMA-2-7B's and 13B's shape) and rotary
    positions: Megatron's local attention then repeats no head, so V stays a view of the fused QKV output and the
    whole of it is kept beside the rotated Q and K. Predicted without it: +13.8 % activations measured on the
    selective stage (2 ranks of TP 2 and one of TP 1)."""
    path = _two_stage_plan(tmp_path / "mha.yaml", {**GRID_PLAN["model"], "num_layers": 4, "num_query_groups": 4},
                           (1, "selective"), (2, "none"))
    assert main(["dryrun", "--plan", str(path), "--tiny", "--steps", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["memory"]
    assert [r["recompute"] for r in rows] == ["selective", "none", "none"]
    _check(rows)


def test_one_key_value_group_per_rank_without_rope_at_micro_batch_one(tmp_path, capsys):
    """Grouped-query attention with learned positions (StarCoder's kind) at micro-batch 1 and TP 2, so each rank holds
    one key/value group (as --tiny shrinks every GQA model: runtime/model.py shrink_model): Megatron's local attention
    passes Q to its score GEMM as a view of the fused QKV output (the reshape to [s, b x heads, head_dim] merges the
    micro-batch's dimension of one; at micro-batch 2 it copies), so the kept Q keeps the whole output, K and V too
    (cost/activations.py LayerImpl.query_views_qkv). Predicted without it: +8.3 % and +6.9 % activations measured
    (within the 10 % target, and the only stages of 23 random dry-run plans above 5 %); with it, within 1 %."""
    mesh = {"device_type": "cpu", "tp": 2, "dp": 1, "micro_batch_size": 1, "recompute": "none", "stage_layers": [2]}
    plan = {**GRID_PLAN, "global_batch_size": 4,
            "model": {**GRID_PLAN["model"], "num_layers": 4, "gated_mlp": False, "position_embedding": "learned"},
            "meshes": [{**mesh, "cluster": "a"}, {**mesh, "cluster": "b"}]}
    path = tmp_path / "query-view.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["dryrun", "--plan", str(path), "--tiny", "--steps", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["memory"]
    assert [(r["tp"], r["recompute"]) for r in rows] == [(2, "none")] * 4
    _check(rows, QUERY_VIEW_TOLERANCE)


def test_full_recomputation_behind_an_overlapped_boundary_within_10_percent(tmp_path, capsys):
    """Full recomputation on both sides of an overlapped boundary (TP 1 x DP 2, then TP 2 with sequence
    parallelism on the last stage, which holds 2 of the 8 layers): it measured 10.3 % below the prediction. The recomputed layer's
    first norm keeps the checkpoint's own input, which was counted twice, and each rank holds its 1/TP piece of a
    boundary tensor under sequence parallelism (Megatron's p2p shape is (s / t, b, h)), which was priced whole."""
    mesh = {"device_type": "cpu", "recompute": "full"}
    plan = {**GRID_PLAN, "model": {**GRID_PLAN["model"], "num_layers": 8},
            "meshes": [{**mesh, "cluster": "a", "tp": 1, "dp": 2, "micro_batch_size": 2, "stage_layers": [6],
                        "boundary": {"schedule": "overlapped", "depth": 0}},
                       {**mesh, "cluster": "b", "tp": 2, "dp": 1, "micro_batch_size": 4, "stage_layers": [2]}]}
    path = tmp_path / "full.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["dryrun", "--plan", str(path), "--tiny", "--steps", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["memory"]
    assert [(r["tp"], r["recompute"]) for r in rows] == [(1, "full")] * 2 + [(2, "full")] * 2
    _check(rows, BOUNDARY_TOLERANCE)


def test_the_grids_dropout_is_more_than_the_tolerance():
    """The grid's dropouts change the prediction by more than the tolerance on some stage, so a memory model (or a
    dry run) that left them out would fail the grid's check above."""
    import copy

    from hetauto_megatron.plan.plan import plan_from_dict
    from hetauto_megatron.runtime.dryrun import predicted_stage_memory, prepare_plan

    without = copy.deepcopy(GRID_PLAN)
    for mesh in without["meshes"]:
        del mesh["settings"]
    on, off = (predicted_stage_memory(prepare_plan(plan_from_dict(d), tiny=True)) for d in (GRID_PLAN, without))
    share = {k: on[k]["activations"] / off[k]["activations"] - 1 for k in on}
    print("dropout's share of the predicted activations per mesh stage:", {k: f"{v:+.1%}" for k, v in share.items()})
    assert max(share.values()) > ACTIVATIONS_TOLERANCE


def test_every_stage_of_the_two_cluster_run_within_10_percent(tiny_dryrun_json):
    rows = json.loads(tiny_dryrun_json)["memory"]
    assert {(r["tp"], r["dp"]) for r in rows} == {(2, 1), (1, 2)}
    _check(rows)
    # the gradients the memory rows count are fp32 in a dry run: the buffers Megatron built say so
    assert [s["grad_buffer_dtype"] for s in json.loads(tiny_dryrun_json)["settings"]] == ["fp32", "fp32"]


def test_the_settings_line_names_the_gradients_dtype():
    """A mesh with grad_reduce_dtype param printed 'gradients reduced in param': the line names the dtype of the
    DDP gradient buffers (read back by settings_that_ran), the parameters' own."""
    import types

    import torch

    from hetauto_megatron.commands.dryrun import settings_line
    from hetauto_megatron.runtime.train import settings_that_ran
    config = types.SimpleNamespace(sequence_parallel=False, hidden_dropout=0.0, attention_dropout=0.0)
    opt = types.SimpleNamespace(config=types.SimpleNamespace(use_distributed_optimizer=True))
    for in_fp32, dtype, words in ((False, torch.bfloat16, "bf16 (the parameters' dtype)"),
                                  (True, torch.float32, "fp32")):
        ddp_config = types.SimpleNamespace(overlap_grad_reduce=True, overlap_param_gather=True,
                                           grad_reduce_in_fp32=in_fp32)
        ran = settings_that_ran(config, ddp_config, opt, [types.SimpleNamespace(grad_dtype=dtype)])
        line = settings_line(0, {"cluster": "a", "tp": 1, "dp": 2, **ran})
        assert line.endswith(f"; gradients reduced in {words}"), line
    assert settings_line(0, {"cluster": "a", "tp": 1, "dp": 2, **ran, "grad_reduce_dtype": "param",
                             "grad_buffer_dtype": None}).endswith("gradients reduced in the parameters' dtype")
    # a mesh that runs dropout says so (the JSON had it; the table left it out)
    config.hidden_dropout = 0.1
    ran = settings_that_ran(config, ddp_config, opt, [types.SimpleNamespace(grad_dtype=torch.float32)])
    assert settings_line(0, {"cluster": "a", "tp": 1, "dp": 2, **ran}).endswith("; hidden_dropout 0.1")


def test_profile_overheads_needs_the_device():
    """`hetauto profile --overheads` measures on an accelerator only; without one it says so (exit 2)."""
    import torch
    from helpers import run_hetauto
    if torch.cuda.is_available():
        pytest.skip("a GPU is at hand: the measuring path would run")
    r = run_hetauto("profile", "--device-type", "h100", "--overheads")
    assert r.returncode == 2 and "--overheads" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_reference_run_with_dropout_is_refused(tmp_path, capsys):
    """Losses compared with a single process need dropout 0 (each layout draws its masks differently): exit 2
    naming the mesh's settings, before any process starts."""
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(GRID_PLAN))
    assert main(["dryrun", "--plan", str(path), "--tiny", "--reference"]) == 2
    assert "meshes[0].settings" in capsys.readouterr().err


OVERLAPPED_PLAN = {
    "version": 4,
    "model": {**GRID_PLAN["model"], "num_layers": 8},
    "global_batch_size": 16,
    "meshes": [
        # an embedding-only first stage before an overlapped cross-cluster boundary of depth 2
        {"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 4, "stage_layers": [0],
         "boundary": {"schedule": "overlapped", "depth": 2}},
        {"cluster": "b", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 4, "stage_layers": [8]},
    ],
}


def test_overlapped_boundary_buffers_are_measured(tmp_path):
    """Both sides of an overlapped boundary hold messages posted ahead into their own buffers (the model's boundary
    buffers, in the predicted activations); the meter counts them while they wait to be taken, and on CPU the
    sends in flight, which keep the tensors they send. Before it counted messages,
    it saw only autograd's saved tensors: the embedding-only stage measured 2 of 34 KiB (-32.7 % in total)."""
    path = tmp_path / "overlapped.yaml"
    path.write_text(yaml.safe_dump(OVERLAPPED_PLAN))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["dryrun", "--plan", str(path), "--tiny", "--steps", "1", "--json"]) == 0
    rows = json.loads(buf.getvalue())["memory"]
    assert [r["in_flight"] for r in rows] == [4, 1]
    # what the embedding-only stage holds, counted from the runtime's rules: its 4 gradients received (the link
    # posts d + 1 = 3 ahead and the next while it takes one) and its last d + 2 = 4 activations sent, which gloo
    # reports complete only once waited for, each its own (16 x 4 x 32) fp32 tensor on CPU. Before the meter
    # followed sends in flight it measured the first 4 alone (34,816 bytes: -48.5 % against 67,584 now)
    assert rows[0]["measured"]["activations"] >= 8 * 16 * 4 * 32 * 4
    _check(rows, BOUNDARY_TOLERANCE)


def test_overlapped_boundary_deeper_than_the_step_within_the_tolerances(tmp_path, capsys):
    """Boundaries of depth 3 in a step of 2 micro-batches (the planner chose depths up to the step's micro-batches):
    each side holds at most 2 boundary tensors, the messages the step has. Priced d + 2 = 5, the embedding-only
    stage measured 17,408 of the 41,984 activation bytes predicted (-58.5 %; a planned plan of depth 3 over 3
    micro-batches measured -11.3 % on its last stage). The head-only last stage behind the second boundary holds
    one message ahead besides the one it takes, which is its input (its final norm keeps it): priced 2, it
    measured 66,368 of the 74,496 activation bytes predicted (+12.2 %). The middle stage takes its second and last
    activation at its peak (2 in flight): none left ahead."""
    plan = {**OVERLAPPED_PLAN, "global_batch_size": 8,
            "meshes": [{**OVERLAPPED_PLAN["meshes"][0], "boundary": {"schedule": "overlapped", "depth": 3}},
                       {**OVERLAPPED_PLAN["meshes"][1], "boundary": {"schedule": "overlapped", "depth": 3}},
                       {**OVERLAPPED_PLAN["meshes"][1], "cluster": "c", "stage_layers": [0]}]}
    path = tmp_path / "deep.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["dryrun", "--plan", str(path), "--tiny", "--steps", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["memory"]
    assert [r["in_flight"] for r in rows] == [2, 2, 1]
    _check(rows, BOUNDARY_TOLERANCE)


def test_sends_in_flight_after_an_overlapped_boundary_within_the_tolerances(tmp_path, capsys):
    """A receiving mesh of two stages after an overlapped boundary of depth 2, 8 micro-batches: its first stage
    (2 in flight) sends a gradient back after each backward, and gloo reports a send complete only once it is
    waited for, so the link keeps its last d + 2 = 4 and each keeps its tensor on CPU: a send replaces a
    message ahead until the d + 1 = 3 ahead run out, 6 boundary tensors at most, not the 3 messages ahead; the
    stage before holds its last 4 activations sent beside its 4 gradients. With the sends measured but not
    priced, these two stages' activations were predicted 3.2 % and 1.8 % below what they measured."""
    m = {"device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 2, "recompute": "none"}
    plan = {**GRID_PLAN, "model": {**GRID_PLAN["model"], "num_layers": 8}, "global_batch_size": 16,
            "meshes": [{**m, "cluster": "a", "stage_layers": [2, 2],
                        "boundary": {"schedule": "overlapped", "depth": 2}},
                       {**m, "cluster": "b", "stage_layers": [2, 2]}]}
    path = tmp_path / "sends.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["dryrun", "--plan", str(path), "--tiny", "--steps", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["memory"]
    assert [r["in_flight"] for r in rows] == [6, 5, 2, 1]
    _check(rows, BOUNDARY_TOLERANCE)


def test_received_pieces_of_overlapped_boundaries_within_the_tolerances(tmp_path, capsys):
    """Overlapped boundaries whose blocks do not land in place (DP 1 x 4 samples, then DP 2 x 2, then DP 1 x 4):
    each message posted ahead holds its buffer and the pieces its blocks arrive in (plan/staged_pieces.py), on
    CPU the same memory. Priced as one tensor per message, the embedding-only stage, receiving its gradients in
    two batch halves, measured 34,304 of the 17,920 activation bytes predicted (+91.4 %); a plan found by a
    fuzzing run measured +97 % there (and +12.5 % on a head-only stage receiving its activations in halves)."""
    mesh = {"device_type": "cpu", "tp": 1}
    plan = {**GRID_PLAN, "model": {**GRID_PLAN["model"], "num_layers": 4}, "global_batch_size": 12,
            "meshes": [{**mesh, "cluster": "a", "dp": 1, "micro_batch_size": 4, "stage_layers": [0],
                        "boundary": {"schedule": "overlapped", "depth": 0}},
                       {**mesh, "cluster": "b", "dp": 2, "micro_batch_size": 2, "stage_layers": [2],
                        "recompute": "selective", "boundary": {"schedule": "overlapped", "depth": 1}},
                       {**mesh, "cluster": "c", "dp": 1, "micro_batch_size": 4, "stage_layers": [2]}]}
    path = tmp_path / "pieces.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["dryrun", "--plan", str(path), "--tiny", "--steps", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["memory"]
    assert [(r["dp"], r["in_flight"]) for r in rows] == [(1, 3), (2, 3), (2, 3), (1, 1)]
    _check(rows, BOUNDARY_TOLERANCE)


def test_a_gpt_family_model_within_the_tolerances(tmp_path, capsys):
    """A GPT-2-style model (linear biases, LayerNorm with shifts, GELU, learned positions, tied table) over TP 2
    with full recomputation, then TP 1 without, at the production settings and --tiny's widths: its losses equal
    the single process's, its weights, gradient buffer and optimizer state are exact to the byte and every stage is
    within the tolerances. Before its biases and LayerNorm shifts were priced (c38084a), the TP 2 stage held 3.2 %
    and the TP 1 stage 2.5 % more weights than predicted. Before the distributed optimizer's buffer padding was
    priced (cost/ddp_buffer.py: every parameter on a 64-element boundary, so each 32-element bias and LayerNorm
    vector here takes 64), these stages held 1.8-4.2 % more weights and gradients than predicted."""
    model = {**GRID_PLAN["model"], "num_layers": 4, "hidden_size": 128, "ffn_hidden_size": 512,
             "num_query_groups": 4, "gated_mlp": False, "tie_embeddings": True, "position_embedding": "learned"}
    path = _two_stage_plan(tmp_path / "gpt.yaml", model, (2, "full"), (1, "none"))
    # --tiny shrinks it to hidden 32: 32-element biases and LayerNorm vectors
    assert main(["dryrun", "--plan", str(path), "--tiny", "--steps", "1", "--reference", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_abs_diff"] < 1e-5, report["max_abs_diff"]
    rows = report["memory"]
    assert [(r["tp"], r["recompute"]) for r in rows] == [(2, "full")] * 2 + [(1, "none")]
    assert all(r["measured"][k] == r["predicted"][k] for r in rows for k in ("weights", "gradients", "optimizer"))
    _check(rows)


def test_an_embedding_only_stage_keeps_what_its_embedding_saves(tmp_path, capsys):
    """A first stage that holds only the embedding (stage_layers [0, ...]) at TP 2 with learned positions: its
    activations are what the embedding saves for the backward. Megatron's vocabulary-parallel embedding keeps the
    bool mask with which it zeroes the rows of the ids outside its part (b x s bytes per micro-batch), and the
    position embedding keeps its ids (int64, one row per sample as Megatron-LM's batch has them). Neither was
    priced: the stage measured 12.5 % (the mask) and 16.7 % (the ids, then one row shared by every micro-batch in the
    dry run, where Megatron-LM's get_batch gives each its own) above its prediction. Now within 1 %."""
    model = {**GRID_PLAN["model"], "num_layers": 4, "position_embedding": "learned"}
    plan = {**GRID_PLAN, "model": model, "meshes": [
        {"cluster": "a", "device_type": "cpu", "tp": 2, "dp": 1, "micro_batch_size": 2, "recompute": "none",
         "stage_layers": [0, 2]},
        {"cluster": "b", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 2, "recompute": "none",
         "stage_layers": [2]}]}
    path = tmp_path / "embedding-only.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["dryrun", "--plan", str(path), "--tiny", "--steps", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["memory"]
    first = [r for r in rows if r["stage"] == 0]
    assert len(first) == 2 and all(r["in_flight"] >= 2 for r in first), first
    for r in first:
        assert r["measured"]["activations"] == pytest.approx(r["predicted"]["activations"], rel=BOUNDARY_TOLERANCE), \
            (r["rank"], r["predicted"]["activations"], r["measured"]["activations"])
    _check(rows)
