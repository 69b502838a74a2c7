"""`hetauto plan` / `hetauto simulate` command contract (JSON keys, files written, determinism)."""
import json
import os
import re

import pytest
from helpers import run_hetauto

from hetauto_megatron.plan.plan import load_plan

INV2 = "examples/llama/inventory-2clusters.yaml"


def hetauto(*args):
    r = run_hetauto(*args)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def test_plan_json_contract_and_files(tmp_path):
    plan_file = tmp_path / "plan.yaml"
    r = hetauto("plan", "--model", "llama2-70b", "--inventory", INV2, "--global-batch-size", "256",
                "-o", str(plan_file), "--emit", str(tmp_path / "launch"), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("iteration_time_s", "tokens_per_s", "tflops_per_device", "memory_gib", "fits", "search", "plan"):
        assert key in out
    assert out["fits"] is True
    assert out["search"]["candidates_evaluated"] > 0 and out["search"]["seconds"] >= 0
    # the schedule searched with is recorded: --from and explain re-plan with it (the meshes' boundaries cannot
    # tell it where an overlapped search left every boundary blocking)
    assert out["search"]["boundary_schedule"] == "overlapped"
    plan = load_plan(str(plan_file))
    assert plan.to_dict()["meshes"] == out["plan"]["meshes"]
    assert len(out["memory_gib"]) == plan.pipeline_parallel_size
    written = sorted(os.listdir(tmp_path / "launch"))
    assert "summary.txt" in written and any(n.startswith("ds_config.") for n in written)
    assert any(n.endswith(".sh") for n in written)
    # the same inputs and seed give the same plan
    again = json.loads(hetauto("plan", "--model", "llama2-70b", "--inventory", INV2, "--global-batch-size", "256",
                               "--json").stdout)
    assert again["plan"]["meshes"] == out["plan"]["meshes"]
    # simulate of the written plan agrees with the planner's estimate
    sim = json.loads(hetauto("simulate", "--model", "llama2-70b", "--inventory", INV2, "--plan", str(plan_file),
                             "--json").stdout)
    assert abs(sim["iteration_time_s"] - out["iteration_time_s"]) < 1e-6 * out["iteration_time_s"] + 1e-9


def test_plan_human_output_is_a_summary_table():
    r = hetauto("plan", "--model", "llama2-7b", "--inventory", INV2, "--global-batch-size", "128", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "stage" in r.stdout and "TP" in r.stdout and "memory GiB" in r.stdout
    assert "layouts evaluated" in r.stdout


def test_simulate_homogeneous_layout_and_errors():
    r = hetauto("simulate", "--model", "llama2-7b", "--inventory", INV2, "--tp", "2", "--pp", "2", "--dp", "4",
                "--micro-batch-size", "1", "--global-batch-size", "64", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["fits"] and len(out["memory_gib"]) == 2 and out["tokens_per_s"] > 0
    # the same layout run by DeepSpeed's pipeline engine: its blocking transfers hold both stages, never faster
    ds = hetauto("simulate", "--model", "llama2-7b", "--inventory", INV2, "--tp", "2", "--pp", "2", "--dp", "4",
                 "--micro-batch-size", "1", "--global-batch-size", "64", "--json", "--engine", "deepspeed")
    assert ds.returncode == 0, ds.stderr
    assert json.loads(ds.stdout)["iteration_time_s"] > out["iteration_time_s"]
    r = hetauto("simulate", "--model", "llama2-7b", "--inventory", INV2, "--tp", "2")
    assert r.returncode == 2 and "--pp" in r.stderr and "Fix:" in r.stderr
    # fp8 under DeepSpeed's engine, which has no fp8 setting (plan refuses it): it was priced as fp8 GEMMs
    r = hetauto("simulate", "--model", "llama2-7b", "--inventory", INV2, "--tp", "2", "--pp", "2", "--dp", "4",
                "--micro-batch-size", "1", "--global-batch-size", "64", "--engine", "deepspeed", "--precision", "fp8",
                "--cluster", "h800")
    assert r.returncode == 2 and "'--precision'" in r.stderr and "no fp8 setting" in r.stderr, r.stderr
    r = hetauto("simulate", "--model", "llama2-7b", "--inventory", INV2, "--tp", "16", "--pp", "1", "--dp", "1",
                "--micro-batch-size", "1", "--global-batch-size", "8")
    assert r.returncode == 2 and "inside a node" in r.stderr


def test_simulate_homogeneous_layout_splits_layers_the_stages_do_not_divide_as_the_planner_does(tmp_path):
    """80 layers on 12 stages (LLaMA-2-70B, 64 H800, TP 2 x DP 2): the split gave the first 11 stages 7 layers
    and the last 3, so stage 0 held 12 micro-batches of 7 layers and "did not fit". The planner's exact split
    balances the stage times with the embedding and the head within memory: it fits, and it is no slower than
    the plain splits of the same layout that fit, each simulated from a plan file (within 0.5 %: the split is
    solved on the closed form, the figures are the event simulation's)."""
    inv = tmp_path / "h800.yaml"
    inv.write_text("clusters:\n  - {name: h800, device: H800, nodes: 8, devices_per_node: 8}\n")
    layout = ("--tp", "2", "--pp", "12", "--dp", "2", "--micro-batch-size", "1", "--global-batch-size", "512")
    r = hetauto("simulate", "--model", "llama2-70b", "--inventory", str(inv), *layout, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["fits"] and sum(s["layers"] for s in out["stages"]) == 80
    compared = 0
    for layers in ([7] * 11 + [3], [6] * 4 + [7] * 8, [3] + [7] * 11):
        plan = tmp_path / "plan.yaml"
        plan.write_text(json.dumps({"version": 4, "model": {"preset": "llama2-70b"}, "global_batch_size": 512,
                                    "meshes": [{"cluster": "h800", "device_type": "h800", "tp": 2, "dp": 2,
                                                "micro_batch_size": 1, "stage_layers": layers}]}))
        other = hetauto("simulate", "--plan", str(plan), "--inventory", str(inv), "--json")
        assert other.returncode == 0, other.stderr
        other = json.loads(other.stdout)
        compared += other["fits"]
        assert not other["fits"] or out["iteration_time_s"] <= other["iteration_time_s"] * 1.005, layers
    assert compared


def test_exhaustive_mode_and_infeasible_exit_code():
    r = hetauto("plan", "--model", "tiny", "--inventory", "examples/llama/inventory-cpu-dryrun.yaml",
                "--global-batch-size", "8", "--search", "exhaustive", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["search"]["method"] == "exhaustive"
    r = hetauto("plan", "--model", "llama2-70b", "--inventory", "examples/llama/inventory-cpu-dryrun.yaml")
    assert r.returncode == 3 and "GiB" in r.stderr


def test_help_teaches():
    r = hetauto("plan", "--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "exit codes" in r.stdout
    r = hetauto("--help")
    assert r.returncode == 0 and "plan" in r.stdout and "dryrun" in r.stdout


def test_set_help_lists_every_whatif_key():
    """simulate's what-if paragraph and the --set help of every command that takes --set name each key
    spec/whatif.py accepts (flow_gbps, node_gbps and price_per_device_hour were missing)."""
    import argparse

    from hetauto_megatron.cli import build_parser
    from hetauto_megatron.commands import simulate
    from hetauto_megatron.spec.whatif import CLUSTER_FIELDS, LINK_FIELDS
    what_if = simulate.DESCRIPTION.split("--set KEY=VALUE overrides")[1].split("and --global-batch-size")[0]
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    texts = {"simulate description": what_if}
    for name in ("plan", "simulate", "explain", "compare"):
        texts[f"{name} --set"] = next(a.help for a in sub[name]._actions if "--set" in a.option_strings)
    for where, text in texts.items():
        missing = [f for f in LINK_FIELDS + CLUSTER_FIELDS if f not in text]
        assert not missing, f"{where} does not list {missing}"


def test_overlapped_boundaries_are_planned_written_and_simulated(tmp_path):
    """--boundary-schedule overlapped: the cross-cluster boundary is written with its depth, `simulate` of the file
    reproduces the estimate, and a boundary that cannot overlap is refused naming the field."""
    plan_file = tmp_path / "plan.yaml"
    r = hetauto("plan", "--model", "llama2-70b", "--inventory", INV2, "--global-batch-size", "512",
                "--boundary-schedule", "overlapped", "-o", str(plan_file), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    meshes = out["plan"]["meshes"]
    assert len(meshes) == 2 and meshes[0]["boundary"]["schedule"] == "overlapped" and "boundary" not in meshes[1]
    sim = json.loads(hetauto("simulate", "--model", "llama2-70b", "--inventory", INV2, "--plan", str(plan_file),
                             "--json").stdout)
    assert abs(sim["iteration_time_s"] - out["iteration_time_s"]) < 1e-6 * out["iteration_time_s"]
    text = plan_file.read_text().replace("schedule: overlapped", "schedule: sideways")
    (tmp_path / "bad.yaml").write_text(text)
    r = hetauto("simulate", "--model", "llama2-70b", "--inventory", INV2, "--plan", str(tmp_path / "bad.yaml"))
    assert r.returncode == 2 and "meshes[0].boundary.schedule" in r.stderr and "Fix:" in r.stderr


def test_replan_from_an_old_plan_says_what_moved(tmp_path):
    """--from: the old plan made for three clusters, the inventory now without one of them; the re-plan is a
    plan of the new inventory (as good as a cold search of it) and names the cluster that left."""
    import yaml
    inv3 = "examples/llama/inventory-3clusters.yaml"
    old = tmp_path / "old.yaml"
    r = hetauto("plan", "--model", "llama2-13b", "--inventory", inv3, "--global-batch-size", "128",
                "--boundary-schedule", "overlapped", "-o", str(old), "--json", "--workers", "1")
    assert r.returncode == 0, r.stderr
    used = [m["cluster"] for m in json.loads(r.stdout)["plan"]["meshes"]]
    gone = used[-1]
    d = yaml.safe_load(open(inv3))
    d["clusters"] = [c for c in d["clusters"] if c["name"] != gone]
    d["links"] = [link for link in d["links"] if gone not in link["between"]]
    inv2 = tmp_path / "inv.yaml"
    inv2.write_text(yaml.safe_dump(d))
    args = ("plan", "--model", "llama2-13b", "--inventory", str(inv2), "--global-batch-size", "128",
            "--boundary-schedule", "overlapped", "--json", "--workers", "1")
    cold = json.loads(hetauto(*args).stdout)
    r = hetauto(*args, "--from", str(old))
    assert r.returncode == 0, r.stderr
    warm = json.loads(r.stdout)
    assert gone not in [m["cluster"] for m in warm["plan"]["meshes"]]
    assert warm["iteration_time_s"] <= cold["iteration_time_s"] * 1.01
    if len(used) > 1:
        assert any(line.startswith(f"{gone}: left the plan") for line in warm["moved"])
    r = hetauto("plan", "--model", "llama2-7b", "--inventory", str(inv2), "--from", str(old), "--quiet")
    assert r.returncode == 2 and "old.yaml" in r.stderr and "llama2-13b" in r.stderr


def test_replan_from_a_plan_of_two_pipelines_reaches_the_cold_plan_and_says_what_moved(tmp_path):
    """--from took one pipeline of single meshes only (exit 2), though the planner writes the other shapes whenever
    they win. Two A100 clusters on a 400 Gbit/s link and an L40S cluster, an 8-layer model: the plan is two
    pipelines. Re-planned without each cluster in turn, the re-plan reaches a cold search of the new inventory
    (the new shapes searched again, the single pipeline warm-started from each old pipeline) and names the
    cluster that left and the new order of the pipelines."""
    import yaml
    from hetauto_megatron.plan.replan import warm_layouts
    from hetauto_megatron.plan.space import SearchSpace
    from hetauto_megatron.cost.analytic import AnalyticCostModel
    from hetauto_megatron.spec.inventory import load_inventory
    from hetauto_megatron.spec.model import load_model
    from helpers import twins_and_l40s
    inv = twins_and_l40s()
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
    (tmp_path / "m8.yaml").write_text("preset: llama2-7b\nnum_layers: 8\n")
    base = ("plan", "--model", str(tmp_path / "m8.yaml"), "--json", "--quiet", "--workers", "1")
    old = tmp_path / "old.yaml"
    r = hetauto(*base, "--inventory", str(tmp_path / "inv.yaml"), "--global-batch-size", "512", "-o", str(old))
    assert r.returncode == 0, r.stderr
    plan = load_plan(str(old))
    assert plan.num_pipelines == 2, "the case needs a plan of two pipelines"
    chains = [[plan.meshes[i].cluster for i in plan.pipeline_mesh_indices(p)] for p in range(2)]
    for gone in ("a", "b", "c"):
        d = dict(inv, clusters=[c for c in inv["clusters"] if c["name"] != gone],
                 links=[link for link in inv["links"] if gone not in link["between"]])
        path = tmp_path / f"without-{gone}.yaml"
        path.write_text(yaml.safe_dump(d))
        # each old pipeline on what is left seeds the single-pipeline search
        space = SearchSpace(load_model(str(tmp_path / "m8.yaml")), load_inventory(str(path)), 512,
                            AnalyticCostModel())
        seeded = {tuple(m.cluster for m in layout) for layout in warm_layouts(plan, space)}
        assert seeded == {tuple(c for c in chain if c != gone) for chain in chains} - {()}
        cold = json.loads(hetauto(*base, "--inventory", str(path), "--global-batch-size", "512").stdout)
        r = hetauto(*base, "--inventory", str(path), "--from", str(old))
        assert r.returncode == 0, r.stderr
        warm = json.loads(r.stdout)
        assert warm["kept_from_plan"]["shapes"] == "all"
        assert gone not in {m["cluster"] for m in warm["plan"]["meshes"]}
        assert warm["iteration_time_s"] <= cold["iteration_time_s"] * 1.01
        assert any(line.startswith(f"{gone}: left the plan") for line in warm["moved"]), warm["moved"]
        assert any(line.startswith("pipeline order: ") and "  |  " in line for line in warm["moved"]), warm["moved"]


def test_summary_of_a_plan_edited_after_planning_does_not_show_the_old_figures(tmp_path, capsys):
    """`emit summary` shows the estimate a plan file carries; a file edited afterwards (here half the replicas)
    showed the old layout's time, memory and "fits" as the new one's. The planner records a fingerprint of the
    layout the estimate is for; a summary of another layout shows the layout only and says why."""
    import yaml
    from helpers import ROOT, run_cli
    inv = os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")
    plan = tmp_path / "p.yaml"
    assert run_cli(["plan", "--model", "llama2-7b", "--inventory", inv, "--global-batch-size", "64", "--quiet",
                    "-o", str(plan)], capsys)[0] == 0
    rc, out, err = run_cli(["emit", "summary", "--plan", str(plan)], capsys)
    assert rc == 0 and "memory GiB" in out and "changed after" not in err
    data = yaml.safe_load(plan.read_text())
    data["meshes"][0]["dp"] //= 2
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(data, sort_keys=False))
    rc, out, err = run_cli(["emit", "summary", "--plan", str(edited)], capsys)
    assert rc == 0 and "memory GiB" not in out and "changed after 'hetauto plan'" in err and "compare" in err


def test_replan_of_a_plan_of_two_pipelines_never_returns_a_slower_one(tmp_path, capsys):
    """A re-plan (--from) whose search is cut short by --budget-s returned 4.296 s per iteration for a two-pipeline
    plan of 3.884 s on the same inventory: worse than the plan it started from. That plan, where it still runs,
    is now the new shapes' first incumbent: a re-plan is never slower than it, by the simulator's own price of
    the old plan (a separate `simulate` of the file)."""
    import yaml
    from helpers import run_cli, twins_and_l40s
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(twins_and_l40s()))
    (tmp_path / "m8.yaml").write_text("preset: llama2-7b\nnum_layers: 8\n")
    base = ["plan", "--model", str(tmp_path / "m8.yaml"), "--inventory", str(tmp_path / "inv.yaml"), "--json",
            "--quiet", "--workers", "1"]
    old = tmp_path / "old.yaml"
    rc, out, err = run_cli(base + ["--global-batch-size", "512", "-o", str(old)], capsys)
    assert rc == 0, err
    assert json.loads(out)["plan"].get("pipelines"), "the case needs a plan of several pipelines"
    rc, out, err = run_cli(["simulate", "--plan", str(old), "--model", str(tmp_path / "m8.yaml"), "--inventory",
                            str(tmp_path / "inv.yaml"), "--json"], capsys)
    assert rc == 0, err
    priced = json.loads(out)["iteration_time_s"]
    rc, out, err = run_cli(base + ["--from", str(old), "--budget-s", "0.05"], capsys)
    assert rc == 0, err
    assert json.loads(out)["iteration_time_s"] <= priced * (1 + 1e-9)


def test_replan_of_a_one_pipeline_plan_searched_with_every_shape_searches_every_shape(tmp_path, capsys):
    """--from re-planned every plan of one pipeline of single meshes with --shapes simple, even one searched with
    every shape: after a cluster joined, the re-plan kept one pipeline where a cold plan makes two (11 % fewer
    tokens/s on an H800-only plan joined by the 910B cluster). The plan records the --shapes it was searched with
    and --from keeps that: one A100 cluster alone (one pipeline), then the twin A100 cluster and the L40S join; the
    re-plan reaches the cold plan of the new inventory. With --shapes simple recorded, simple is kept. The same
    inputs and seed write the same bytes (the search's wall time is not in the file) and the file names the hetauto
    that wrote it."""
    import yaml
    from helpers import run_cli, twins_and_l40s
    inv = twins_and_l40s()
    alone = dict(inv, clusters=inv["clusters"][:1], links=[])
    (tmp_path / "alone.yaml").write_text(yaml.safe_dump(alone))
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
    (tmp_path / "m8.yaml").write_text("preset: llama2-7b\nnum_layers: 8\n")
    base = ["plan", "--model", str(tmp_path / "m8.yaml"), "--json", "--quiet", "--workers", "1"]
    gbs = ["--global-batch-size", "512"]

    def plan(*extra):
        rc, out, err = run_cli(base + list(extra), capsys)
        assert rc == 0, err
        return json.loads(out)

    old, again = tmp_path / "old.yaml", tmp_path / "again.yaml"
    plan(*gbs, "--inventory", str(tmp_path / "alone.yaml"), "-o", str(old))
    assert load_plan(str(old)).is_simple
    plan(*gbs, "--inventory", str(tmp_path / "alone.yaml"), "-o", str(again))
    assert old.read_bytes() == again.read_bytes()
    # the file says which hetauto made it: the installed package's version, as pip records it
    from importlib.metadata import version
    assert load_plan(str(old)).estimate["search"]["hetauto_version"] == version("hetauto-megatron")
    cold = plan(*gbs, "--inventory", str(tmp_path / "inv.yaml"))
    assert cold["plan"].get("pipelines") or any(m.get("alongside") for m in cold["plan"]["meshes"]), \
        "the case needs a cold plan of another shape"
    warm = plan("--inventory", str(tmp_path / "inv.yaml"), "--from", str(old))
    assert warm["kept_from_plan"]["shapes"] == "all"
    assert warm["iteration_time_s"] <= cold["iteration_time_s"] * 1.01
    simple = tmp_path / "simple.yaml"
    plan(*gbs, "--inventory", str(tmp_path / "alone.yaml"), "--shapes", "simple", "-o", str(simple))
    warm = plan("--inventory", str(tmp_path / "inv.yaml"), "--from", str(simple))
    assert warm["kept_from_plan"]["shapes"] == "simple" and not warm["plan"].get("pipelines")


def test_replan_keeps_the_old_plans_job_unless_a_flag_is_given(tmp_path):
    """--from silently re-planned an fp32, global batch 16, sequence 16 DeepSpeed job as bf16, 512, 32, Megatron
    (the flags' defaults): the job is the old plan's, each flag given wins, and stderr says what was kept."""
    inv = "examples/llama/inventory-cpu-dryrun.yaml"
    old = tmp_path / "old.yaml"
    base = ("plan", "--model", "tiny", "--inventory", inv, "--quiet", "--workers", "1")
    r = hetauto(*base, "--global-batch-size", "16", "--precision", "fp32", "--seq-length", "16",
                "--engine", "deepspeed", "-o", str(old))
    assert r.returncode == 0, r.stderr
    r = hetauto(*base, "--from", str(old), "--json")
    assert r.returncode == 0, r.stderr
    new = json.loads(r.stdout)["plan"]
    assert (new["global_batch_size"], new["precision"], new["model"]["seq_length"], new.get("engine")) == \
        (16, "fp32", 16, "deepspeed")
    assert "kept: --global-batch-size 16, --precision fp32, --seq-length 16, --engine deepspeed" in r.stderr
    r = hetauto(*base, "--from", str(old), "--json", "--global-batch-size", "32", "--engine", "megatron")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["plan"]["global_batch_size"], out["plan"]["precision"], out["plan"].get("engine", "megatron")) == \
        (32, "fp32", "megatron")
    # (the DeepSpeed plan was searched with the default --shapes all, one pipeline only because of its engine:
    # under Megatron's every shape is searched)
    assert out["kept_from_plan"] == {"precision": "fp32", "seq_length": 16, "shapes": "all"}
    # a Megatron plan of blocking boundaries is re-planned with blocking boundaries
    r = hetauto(*base, "--global-batch-size", "16", "--boundary-schedule", "blocking", "--shapes", "simple",
                "--use-clusters", "site-a,site-b", "-o", str(old))   # (one pipeline across both: a boundary)
    assert r.returncode == 0, r.stderr
    assert any(m.boundary_schedule == "blocking" for m in load_plan(str(old)).meshes[:-1])
    r = hetauto(*base, "--from", str(old), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kept_from_plan"]["boundary_schedule"] == "blocking"
    assert all(m.get("boundary", {}).get("schedule", "blocking") == "blocking"
               for m in json.loads(r.stdout)["plan"]["meshes"])
    # re-planned for DeepSpeed's engine, which blocks at every boundary: the schedule is not said to be kept (it
    # was: "kept: ... --boundary-schedule overlapped", a flag that --engine deepspeed refuses)
    r = hetauto(*base, "--from", str(old), "--json", "--engine", "deepspeed")
    assert r.returncode == 0, r.stderr
    assert "boundary_schedule" not in json.loads(r.stdout)["kept_from_plan"] and "--boundary-schedule" not in r.stderr


def test_replan_of_another_model_plans_its_own_sequence_length(tmp_path):
    """--from a plan of tiny at --seq-length 16 with --model of another model of the same layers and hidden size
    (another MLP width, 64-token sequences) planned 16 tokens and said "kept: --seq-length 16": the sequence
    length is the model's, so the given model's own is planned; the same model (in a file of another name) keeps
    the old plan's, and --seq-length given wins."""
    inv = "examples/llama/inventory-cpu-dryrun.yaml"
    old = tmp_path / "old.yaml"
    (tmp_path / "other.yaml").write_text("preset: tiny\nffn_hidden_size: 128\nseq_length: 64\n")
    (tmp_path / "same.yaml").write_text("preset: tiny\n")
    base = ("plan", "--inventory", inv, "--quiet", "--workers", "1", "--global-batch-size", "16")
    r = hetauto(*base, "--model", "tiny", "--seq-length", "16", "-o", str(old))
    assert r.returncode == 0, r.stderr
    for model, flags, want in (("other.yaml", (), 64), ("same.yaml", (), 16),
                               ("other.yaml", ("--seq-length", "8"), 8)):
        r = hetauto(*base, "--model", str(tmp_path / model), "--from", str(old), "--json", *flags)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["plan"]["model"]["seq_length"] == want, (model, flags)
        assert ("seq_length" in out["kept_from_plan"]) == (model == "same.yaml" and not flags), (model, flags)
        assert ("--seq-length not kept" in r.stderr) == (model == "other.yaml" and not flags), r.stderr
        if "--seq-length not kept" in r.stderr:     # what makes it another model, since the names may agree
            assert "ffn_hidden_size 256 there, 128 here" in r.stderr, r.stderr
    assert out["plan"]["model"]["ffn_hidden_size"] == 128


def test_replan_of_another_model_with_fewer_positions_than_the_old_sequence_tells_its_notes_once(tmp_path):
    """--from a plan of 64-token sequences with --model of another model of the same layers and hidden size and 32
    learned positions: the model was first read at the old plan's 64 tokens, which said "note: --seq-length 64 is
    longer than the 32 learned positions" (a flag never typed) before 32 was planned, and a config.json's notes
    (its dropout) were printed twice, once per read."""
    inv = "examples/llama/inventory-cpu-dryrun.yaml"
    old = tmp_path / "old.yaml"
    (tmp_path / "learned.yaml").write_text("preset: tiny\nffn_hidden_size: 128\nposition_embedding: learned\n"
                                           "seq_length: 32\nmax_position_embeddings: 32\n")
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "n_layer": 8, "n_embd": 64, "n_head": 4, "n_inner": 128, "vocab_size": 128,
        "n_positions": 32, "resid_pdrop": 0.1}))
    base = ("plan", "--inventory", inv, "--quiet", "--workers", "1", "--global-batch-size", "16")
    assert hetauto(*base, "--model", "tiny", "--seq-length", "64", "-o", str(old)).returncode == 0
    for model in ("learned.yaml", "config.json"):
        r = hetauto(*base, "--model", str(tmp_path / model), "--from", str(old), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["plan"]["model"]["seq_length"] == 32, model
        assert "--seq-length not kept" in r.stderr and "--seq-length 64" not in r.stderr, r.stderr
        notes = [line for line in r.stderr.splitlines() if line.startswith("note:")]
        assert len(notes) == len(set(notes)), r.stderr
    assert sum("trains with dropout" in line for line in notes) == 1, r.stderr
    # a config.json of no sequence length of its own (no positions key: read only given one) keeps the old plan's
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 8, "hidden_size": 64, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 128}))
    r = hetauto(*base, "--model", str(tmp_path / "llama" / "config.json"), "--from", str(old), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["plan"]["model"]["seq_length"] == 64, r.stderr
    assert "--seq-length not kept" not in r.stderr, r.stderr
    # a model on a pipe is read once (a second read found `<(...)` empty and waited on a named FIFO for ever): the
    # same model, fed once through a FIFO, re-plans at the old plan's length
    import threading
    fifo = str(tmp_path / "model.yaml")
    os.mkfifo(fifo)
    threading.Thread(target=lambda: open(fifo, "w").write("preset: tiny\n"), daemon=True).start()
    r = run_hetauto(*base, "--model", fifo, "--from", str(old), "--json", timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["plan"]["model"]["seq_length"] == 64, r.stderr
    # read once and built at both lengths, another model fed through a FIFO is told apart as a file is (it kept the
    # old plan's length, since telling it apart took a second read the pipe could not give)
    other = str(tmp_path / "other.yaml")
    os.mkfifo(other)
    threading.Thread(target=lambda: open(other, "w").write("preset: tiny\nffn_hidden_size: 128\n"),
                     daemon=True).start()
    r = run_hetauto(*base, "--model", other, "--from", str(old), "--json", timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["plan"]["model"]["seq_length"] == 32, r.stderr
    assert "--seq-length not kept" in r.stderr, r.stderr


def test_unknown_flag_is_told_by_the_commands_own_parser(capsys):
    """`hetauto explain --plan p --bogus` printed the top level's usage ('hetauto: error'), not explain's."""
    from hetauto_megatron.cli import main
    with pytest.raises(SystemExit) as e:
        main(["explain", "--plan", "p.yaml", "--bogus"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "hetauto explain: error: unrecognized arguments: --bogus" in err
    assert "usage: hetauto explain" in err


def test_emit_names_launch_scripts_left_from_an_earlier_plan(tmp_path, capsys):
    """Emitting a plan of fewer clusters into a folder that held another plan's launch scripts left the old
    ones beside the new without a word (launching one starts ranks the new plan does not have): stderr names them.
    simulate --engine deepspeed of a plan whose meshes differ in TP says one DeepSpeed job cannot run it."""
    import yaml
    from helpers import run_cli, twins_and_l40s
    inv = twins_and_l40s()
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(dict(inv, clusters=inv["clusters"][:1], links=[])))
    (tmp_path / "m8.yaml").write_text("preset: llama2-7b\nnum_layers: 8\n")
    base = ["plan", "--model", str(tmp_path / "m8.yaml"), "--quiet", "--workers", "1", "--global-batch-size", "512"]
    out = str(tmp_path / "launch")
    assert run_cli(base + ["--inventory", str(tmp_path / "inv.yaml"), "-o", str(tmp_path / "all.yaml"),
                           "--emit", out], capsys)[0] == 0
    before = {n for n in os.listdir(out) if n.endswith(".sh")}
    rc, _, err = run_cli(base + ["--inventory", str(tmp_path / "one.yaml"), "-o", str(tmp_path / "a.yaml"),
                                 "--emit", out], capsys)
    assert rc == 0 and before - {"a.sh"} and all(n in err for n in before - {"a.sh"}), (before, err)
    assert "still holds" in err and "a.sh," not in err.split("still holds")[1].split("from")[0]
    rc, _, err = run_cli(["emit", "megatron", "--plan", str(tmp_path / "a.yaml"), "-o", str(tmp_path / "fresh")],
                         capsys)
    assert rc == 0 and "still holds" not in err
    inv736 = "examples/llama/inventory-4clusters-736.yaml"
    p736 = str(tmp_path / "p736.yaml")
    assert run_cli(["plan", "--model", "llama2-70b", "--inventory", inv736, "--global-batch-size", "1024", "--quiet",
                    "--shapes", "simple", "-o", p736], capsys)[0] == 0
    assert len({m.tp for m in load_plan(p736).meshes}) > 1, "the case needs meshes of different TP"
    sim = ["simulate", "--model", "llama2-70b", "--inventory", inv736, "--plan", p736]
    rc, _, err = run_cli(sim + ["--engine", "deepspeed"], capsys)
    assert rc == 0 and "one DeepSpeed job cannot run" in err and "differ in TP" in err
    rc, _, err = run_cli(sim, capsys)
    assert rc == 0 and "DeepSpeed" not in err


def test_plan_uses_whole_nodes_that_launch_scripts_can_start(tmp_path, capsys):
    """--max-devices 12 on 8-device nodes: the search's plan held 12 devices of one cluster, which torchrun cannot
    start (the same number of processes on every node of a launch), and --emit refused it after writing the plan.
    The search now uses whole nodes, or part of one node: every launch script starts what the plan holds."""
    from helpers import run_cli

    from hetauto_megatron.spec.inventory import load_inventory
    plan_path, out = str(tmp_path / "p.yaml"), tmp_path / "launch"
    rc, _, err = run_cli(["plan", "--model", "llama2-7b", "--inventory", INV2, "--max-devices", "12", "--quiet",
                          "--workers", "1", "-o", plan_path, "--emit", str(out)], capsys)
    assert rc == 0, err
    plan = load_plan(plan_path)
    held = {}
    for m in plan.meshes:
        held[m.cluster] = held.get(m.cluster, 0) + m.num_devices
    assert sum(held.values()) <= 12
    for name, n in held.items():
        node = load_inventory(INV2).cluster(name).devices_per_node
        nnodes, nproc = (int(re.search(rf"--{k}=(\d+)", (out / f"{name}.sh").read_text()).group(1))
                         for k in ("nnodes", "nproc-per-node"))
        assert nnodes * nproc == n and (nproc == node or (nnodes == 1 and nproc < node)), (name, n, nnodes, nproc)


def test_a_vocabulary_smaller_than_tp_plans(tmp_path):
    """Byte- or nucleotide-level models have vocabularies of a few tokens, fewer than the TP sizes the search tries;
    the search's one-layer memory check priced the logits GEMM at vocab // TP = 0 columns and stopped with
    ZeroDivisionError. Megatron pads the table to a multiple of 128 x TP, which is what the plan must say."""
    model = tmp_path / "tiny-vocab.yaml"
    model.write_text("preset: llama2-7b\nvocab_size: 4\n")
    out = tmp_path / "plan.yaml"
    r = hetauto("plan", "--model", str(model), "--inventory", INV2, "--global-batch-size", "16", "--quiet",
                "-o", str(out))
    assert r.returncode == 0, r.stderr
    plan = load_plan(str(out))
    assert plan.model.vocab_size == 4
    assert all(plan.padded_vocab_size % (128 * m.tp) == 0 for m in plan.meshes) and plan.padded_vocab_size >= 128


def test_simulate_on_another_inventory_says_the_tf32_it_priced(tmp_path):
    """An fp32 plan made where the A100s run without TF32 (`tf32: false`), simulated on an inventory where they run
    with it: the figures are TF32's (3-4x faster GEMMs), so the summary must say TF32, and a note must say the plan's
    launch scripts (its own inventory: NVIDIA_TF32_OVERRIDE=0) run without; before, it printed 'no TF32' beside
    TF32 figures."""
    inv = {"clusters": [{"name": "a100", "device": "a100-40gb", "nodes": 1, "devices_per_node": 8}]}
    on, off = tmp_path / "tf32.yaml", tmp_path / "no-tf32.yaml"
    on.write_text(json.dumps(inv))
    inv["clusters"][0]["tf32"] = False
    off.write_text(json.dumps(inv))
    out = tmp_path / "plan.yaml"
    job = ["--model", "llama2-7b", "--global-batch-size", "64"]
    assert hetauto("plan", *job, "--inventory", str(off), "--precision", "fp32", "--quiet", "-o", str(out)).returncode == 0
    same = hetauto("simulate", "--plan", str(out), "--model", "llama2-7b", "--inventory", str(off))
    other = hetauto("simulate", "--plan", str(out), "--model", "llama2-7b", "--inventory", str(on))
    assert same.returncode == other.returncode == 0, other.stderr
    seconds = [float(re.search(r"iteration ([\d.]+) s", r.stdout).group(1)) for r in (same, other)]
    assert seconds[1] < 0.6 * seconds[0], seconds
    assert "no TF32" in same.stdout and "priced" not in same.stderr
    assert "TF32 GEMMs" in other.stdout and "no TF32" not in other.stdout
    assert "priced with TF32" in other.stderr and "launch scripts run it without" in other.stderr
    # explain and compare, priced on that inventory, say it too (they said nothing)
    for cmd in (["explain", "--plan", str(out), "--no-search"], ["compare", str(out), str(out)]):
        r = hetauto(*cmd, "--inventory", str(on))
        assert r.returncode == 0 and "priced with TF32" in r.stderr and "launch scripts run it without" in r.stderr, \
            (cmd, r.stderr)


def test_a_recorded_memory_job_of_the_wrong_type_is_named(tmp_path):
    """estimate.search.memory_job is read by simulate, explain, compare and plan --from: a list or mapping there is
    a malformed file (exit 2 naming the field), not a TypeError."""
    out = tmp_path / "plan.yaml"
    assert hetauto("plan", "--model", "tiny", "--inventory", "examples/llama/inventory-cpu-dryrun.yaml",
                   "--global-batch-size", "8", "--quiet", "-o", str(out)).returncode == 0
    import yaml
    data = yaml.safe_load(out.read_text())
    data["estimate"]["search"]["memory_job"] = ["sailor-deepspeed"]
    out.write_text(yaml.safe_dump(data))
    r = hetauto("explain", "--plan", str(out), "--no-search")
    assert r.returncode == 2 and "estimate.search.memory_job" in r.stderr, r.stderr


def test_simulate_a_plan_file_alone_uses_the_model_and_inventory_it_stores(tmp_path):
    """'simulate --plan F' needed --model and --inventory although the file carries both (explain and compare did
    not): it prices the plan as the same command with the plan's own model and inventory given does."""
    plan = "examples/llama/plans/llama2-70b-736.yaml"
    alone = hetauto("simulate", "--plan", plan, "--json")
    given = hetauto("simulate", "--plan", plan, "--model", "llama2-70b", "--inventory",
                    "examples/llama/inventory-4clusters-736.yaml", "--json")
    assert alone.returncode == 0 and given.returncode == 0, alone.stderr + given.stderr
    assert json.loads(alone.stdout)["iteration_time_s"] == json.loads(given.stdout)["iteration_time_s"]
    bare = hetauto("simulate", "--tp", "1")
    assert bare.returncode == 2 and "missing --model and --inventory" in bare.stderr and "Traceback" not in bare.stderr


def test_simulate_prices_the_plan_with_the_model_given(tmp_path):
    """'simulate --plan F --model M' with M of the plan's depth and width but another vocabulary and sequence
    (LLaMA-3-70B on a LLaMA-2-70B plan) printed the plan's own model's figures, unless --global-batch-size was
    given too: it prices what the same plan file naming M prices. A model whose heads the plan's TP does not
    divide is refused naming --model (it blamed --global-batch-size)."""
    import dataclasses

    from hetauto_megatron.plan.plan_file import save_plan
    from hetauto_megatron.spec.model import PRESETS
    plan = "examples/llama/plans/llama2-70b-736.yaml"
    given = hetauto("simulate", "--plan", plan, "--model", "llama3-70b", "--json")
    assert given.returncode == 0, given.stderr
    named = tmp_path / "llama3.yaml"
    save_plan(dataclasses.replace(load_plan(plan), model=PRESETS["llama3-70b"]), str(named))
    alone = hetauto("simulate", "--plan", str(named), "--json")
    assert alone.returncode == 0, alone.stderr
    assert json.loads(given.stdout)["iteration_time_s"] == json.loads(alone.stdout)["iteration_time_s"]
    assert json.loads(given.stdout)["iteration_time_s"] != json.loads(
        hetauto("simulate", "--plan", plan, "--json").stdout)["iteration_time_s"]
    heads = tmp_path / "two-heads.yaml"
    heads.write_text("preset: llama2-70b\nnum_attention_heads: 2\nnum_query_groups: 2\n")
    for command in (("simulate", "--plan", plan), ("explain", "--plan", plan), ("compare", plan)):
        r = hetauto(*command, "--model", str(heads))
        assert r.returncode == 2 and "'--model'" in r.stderr and "two-heads.yaml" in r.stderr, r.stderr


def test_a_timeline_that_cannot_be_written_stops_before_the_search(tmp_path):
    """--timeline into a folder that does not exist was said after the whole search, with exit 2 and the plan file
    written anyway: now before the search, and nothing is written."""
    out = tmp_path / "p.yaml"
    r = hetauto("plan", "--model", "tiny", "--inventory", "examples/llama/inventory-cpu-dryrun.yaml",
                "--global-batch-size", "8", "--quiet", "-o", str(out), "--timeline", str(tmp_path / "nodir" / "a.png"))
    assert r.returncode == 2 and "field '--timeline'" in r.stderr and "does not exist" in r.stderr, r.stderr
    assert not out.exists()


def test_json_failures_are_an_object_on_stdout():
    """A script reading --json's stdout got nothing on a failure (the paragraph is on stderr): now one object too."""
    bad = hetauto("simulate", "--plan", "no-such-plan.yaml", "--json")
    none = hetauto("plan", "--model", "llama2-70b", "--inventory", "examples/llama/inventory-cpu-dryrun.yaml",
                   "--quiet", "--json")
    assert (bad.returncode, none.returncode) == (2, 3), bad.stderr + none.stderr
    err = json.loads(bad.stdout)["error"]
    assert err["kind"] == "invalid input" and err["exit_code"] == 2 and err["file"] == "no-such-plan.yaml"
    assert err["fix"] and err["message"] in bad.stderr
    err = json.loads(none.stdout)["error"]
    assert err["kind"] == "no feasible plan" and err["exit_code"] == 3 and "does not fit" in err["message"]


def test_json_infeasible_object_names_file_field_and_fix(tmp_path):
    """Exit 3's JSON object had kind, exit_code and message only, where exit 2's names the file, the field and the
    fix that its paragraph names: now exit 3's carries them too (null where the paragraph names none), from plan and
    explain alike."""
    inv = tmp_path / "inv.yaml"
    inv.write_text("clusters:\n  - {name: a, device: cpu, nodes: 1, devices_per_node: 2, memory_gib: 1}\n"
                   "  - {name: b, device: cpu, nodes: 1, devices_per_node: 2}\n")

    def failure(*args):
        r = hetauto(*args, "--quiet", "--json")
        assert r.returncode == 3, r.stderr
        err = json.loads(r.stdout)["error"]
        assert set(err) == {"kind", "exit_code", "message", "file", "field", "reason", "fix"}, err
        assert err["message"] in r.stderr and err["kind"] == "no feasible plan"
        # the paragraph is its reason and its fix, nothing lost
        assert err["reason"] in err["message"] and (err["fix"] is None or err["fix"] in err["message"]), err
        return err

    # not one layer of LLaMA-2-7B (0.2B parameters, 12 bytes each to train with Adam) fits a 1 GiB device: the
    # memory of the cluster that misses by the least is the fix (a's, in the file, where b's is --set as small)
    small = ("--set", "cluster.b.memory_gib=1")
    err = failure("plan", "--model", "llama2-7b", "--inventory", str(inv), *small)
    assert (err["file"], err["field"]) == (str(inv), "clusters[0].memory_gib"), err
    assert err["fix"].startswith(f"devices with more memory ({inv}, field 'clusters[0].memory_gib')"), err
    # a's shrunk further by --set: b's --set item is the field, no file (as exit 2 names a --set item)
    err = failure("plan", "--model", "llama2-7b", "--inventory", str(inv), "--set", "cluster.a.memory_gib=0.01", *small)
    assert (err["file"], err["field"]) == (None, "--set") and "(--set cluster.b.memory_gib=1)" in err["fix"], err
    # two clusters no link joins, both required: the inventory's links
    err = failure("plan", "--model", "tiny", "--inventory", str(inv), "--use-clusters", "a,b")
    assert (err["file"], err["field"]) == (str(inv), "links") and err["fix"].endswith("or drop --use-clusters"), err
    # a model too big for all of it: the fix is said, no one field holds it (at 2048 tokens, where one of its layers
    # fits a CPU device: at its 4096 the local spec's s x s attention gradients alone outgrow b's 16 GiB)
    err = failure("plan", "--model", "llama2-70b", "--inventory", str(inv), "--seq-length", "2048")
    assert (err["file"], err["field"], err["fix"]) == (None, None, "Add devices or clusters, or shorten --seq-length")
    assert "misses by" in err["reason"] and "Add devices" not in err["reason"], err
    # the global batch caps the pipeline's depth (one micro-batch, one stage): the option the fix names first
    err = failure("plan", "--model", "llama2-7b", "--inventory", str(inv), "--global-batch-size", "1")
    assert (err["file"], err["field"]) == (None, "--global-batch-size") and "at most 1 stage deep" in err["reason"]
    # --max-pp below the batch's micro-batches binds instead: it is the field, and the fix's first word
    err = failure("plan", "--model", "llama2-7b", "--inventory", str(inv), "--max-pp", "2")
    assert err["field"] == "--max-pp" and err["fix"].startswith("a larger --max-pp allows"), err
    # (the constraints' sentence came after the paragraph's "Fix: ...": the fix now ends it, as everywhere)
    assert "no single constraint binds" in err["reason"] and err["message"].endswith(f"Fix: {err['fix']}"), err
    # a wrapped paragraph (a constraint binds) keeps the inner error's field and fix
    err = failure("plan", "--model", "tiny", "--inventory", "examples/llama/inventory-cpu-dryrun.yaml",
                  "--max-iteration-s", "1e-6")
    assert err["field"] == "--max-iteration-s" and err["fix"] == "a larger --max-iteration-s, or more or faster devices"
    assert err["reason"].startswith("under the constraints") and "Fix:" not in err["reason"], err
    # explain re-plans on an inventory where nothing fits: the same object
    err = failure("explain", "--plan", "examples/llama/plans/tiny-2pipelines-cpu.yaml", "--inventory",
                  "examples/llama/inventory-cpu-tiny-2clusters.yaml", "--set", "cluster.cluster-a.memory_gib=0.01",
                  "--set", "cluster.cluster-b.memory_gib=0.01")
    assert (err["file"], err["field"]) == (None, "--set") and "memory_gib=0.01" in err["fix"], err


@pytest.mark.parametrize("nodes, gbs, hint", [(2, 64, False), (8, 4, True)])
def test_the_batch_depth_hint_only_where_the_batch_binds(tmp_path, nodes, gbs, hint):
    """LLaMA-2-70B on A100-40s that cannot hold it: 16 devices and a batch of 64 were told "the pipeline is at most 64
    stages deep ... a larger --global-batch-size allows deeper pipelines", which cannot help (16 devices, 16 stages at
    most); 64 devices and a batch of 4 are capped by the batch, and told so."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"clusters:\n  - {{name: a, device: a100-40gb, nodes: {nodes}, devices_per_node: 8}}\n")
    r = hetauto("plan", "--model", "llama2-70b", "--inventory", str(inv), "--global-batch-size", str(gbs), "--quiet",
                "--budget-s", "20")
    assert r.returncode == 3 and "does not fit" in r.stderr, r.stderr
    assert ("a larger --global-batch-size allows deeper pipelines" in r.stderr) == hint, r.stderr


@pytest.mark.parametrize("search, wait_for", [
    # ~16M layouts (~2 h): the first progress line says how long
    (["--search", "exhaustive"], "exhaustive:"),
    # the tree search grown to 2M playouts (~10 s; its worker processes: test_plan_search.py); --explain's what-ifs
    # (searches too) are skipped after the Ctrl-C
    (["--iterations", "2000000", "--explain"], "tree 0:"),
], ids=["exhaustive", "mcts"])
def test_ctrl_c_during_a_search_keeps_the_best_so_far(tmp_path, search, wait_for):
    """A Ctrl-C during `hetauto plan` on the 736-device example ends the search with the best plan found so far,
    as --budget-s does, and writes it (before: exit 130 and no plan for the tree search, the default, whose workers
    raised KeyboardInterrupt; the exhaustive search caught it in its own loop only). The signal goes to the whole
    process group, as a terminal sends it."""
    import signal
    import subprocess
    import sys

    import yaml

    out = tmp_path / "p.yaml"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # A suite started in the background of a non-interactive shell (`pytest ... &`) ignores SIGINT, and a child
    # inherits an ignored signal (Python then installs no KeyboardInterrupt for it): the command would rightly
    # keep searching. Give the command the default disposition a terminal's Ctrl-C meets.
    proc = subprocess.Popen([sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, "
                             "signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
                             os.path.join(os.path.dirname(sys.executable), "hetauto"), "plan", "--model",
                             "llama2-70b", "--inventory", "examples/llama/inventory-4clusters-736.yaml", *search,
                             "-o", str(out)], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        seen = []
        while not seen or wait_for not in seen[-1]:
            seen.append(proc.stderr.readline())
            assert seen[-1], "".join(seen)          # (the command ended before the line)
        if search[-1] == "exhaustive":
            assert " left at " in seen[-1] and "Ctrl-C stops it" in seen[-1], seen[-1]
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "Ctrl-C: stopping the search" in stderr and stderr.count("Ctrl-C:") == 1, stderr   # once, not per worker
    assert "Traceback" not in stderr and "(cut short by Ctrl-C)" in stdout, stdout + stderr
    assert yaml.safe_load(out.read_text())["estimate"]["search"]["cut_by_budget"] is True
    assert ("--explain skipped after the Ctrl-C" in stderr) is ("--explain" in search), stderr


def test_ctrl_c_under_json_still_gives_an_object_on_stdout(tmp_path):
    """A command stopped by Ctrl-C under --json: one error object on stdout (kind "interrupted", exit 130), as for
    every other failure; before, stdout stayed empty. The command waits to read its plan from a named pipe nobody
    writes, so the signal always lands while it runs."""
    import signal
    import subprocess
    import sys
    import time

    fifo = tmp_path / "plan.yaml"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, "
                             "signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
                             os.path.join(os.path.dirname(sys.executable), "hetauto"), "simulate", "--plan", str(fifo),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        # until it waits on the pipe: its open() of a pipe with no writer blocks in the kernel (wchan
        # wait_for_partner; where a kernel does not say, 30 s is far past the command's start-up)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with open(f"/proc/{proc.pid}/wchan") as fh:
                    if "partner" in fh.read():
                        break
            except OSError:
                pass
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, stderr
    assert json.loads(stdout)["error"]["kind"] == "interrupted", stdout
    assert "interrupted" in stderr and "Traceback" not in stderr, stderr


def test_a_cluster_left_out_as_unable_stays_out_when_the_plan_is_priced_or_replanned(tmp_path, capsys):
    """The peers' same-zone inventory trains in bf16 only on its A100s (the V100-16 has no bf16): `plan
    --exclude-clusters v100` leaves the V100s out. Pricing that plan on the same inventory (simulate, explain,
    compare), a layout on the A100s alone, and `plan --from` it refused the inventory for the V100s the plan never
    uses (exit 2, "cluster v100 ... cannot train in bf16", the fix naming a flag those commands do not have). Now
    they are left out, said on stderr; a layout on the V100s themselves is still refused."""
    from helpers import run_cli
    inv = os.path.join(os.path.dirname(__file__), "..", "examples", "peers", "inventory-same-zone.yaml")
    plan = str(tmp_path / "a100.yaml")
    assert run_cli(["plan", "--model", "llama2-7b", "--inventory", inv, "--exclude-clusters", "v100", "--quiet",
                    "-o", plan], capsys)[0] == 0
    layout = ["--tp", "1", "--pp", "4", "--dp", "4", "--micro-batch-size", "1", "--global-batch-size", "64"]
    for argv in (["simulate", "--plan", plan, "--inventory", inv], ["compare", plan, "--inventory", inv],
                 ["explain", "--plan", plan, "--inventory", inv, "--no-search", "--quiet"],
                 ["simulate", "--model", "llama2-7b", "--inventory", inv, "--cluster", "a100", *layout],
                 ["plan", "--model", "llama2-7b", "--inventory", inv, "--from", plan, "--quiet",
                  "-o", str(tmp_path / "again.yaml")]):
        rc, _, err = run_cli(argv, capsys)
        assert rc == 0 and "left out of the inventory: v100" in err, (argv, err)
    rc, _, err = run_cli(["simulate", "--model", "llama2-7b", "--inventory", inv, "--cluster", "v100", *layout], capsys)
    # that one cluster chosen: the fix names the flags simulate has (it named plan --exclude-clusters)
    assert rc == 2 and "cannot train in bf16" in err and "--precision one it has (fp16, fp32)" in err, err
    assert "--exclude-clusters" not in err and "field '--precision'" in err, err


def test_iterations_with_the_exhaustive_search_is_refused(capsys):
    """--search exhaustive --iterations 50 was taken and did nothing (every layout evaluated anyway)."""
    from helpers import run_cli
    inv = os.path.join(os.path.dirname(__file__), "..", "examples", "llama", "inventory-cpu-dryrun.yaml")
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--search", "exhaustive", "--iterations",
                          "50"], capsys)
    assert rc == 2 and "field '--iterations'" in err and "Fix: " in err, err


def test_simulate_a_plan_at_a_longer_sequence_than_its_learned_positions(tmp_path, capsys):
    """`simulate --plan P --seq-length N` past the learned positions of P's own model was a paragraph naming no file,
    whose fix (set max_position_embeddings) no flag reaches, where `--model` beside it and `plan --seq-length` build
    the longer table with a note: now the plan's model does too."""
    from helpers import run_cli
    inv = os.path.join(os.path.dirname(__file__), "..", "examples", "llama", "inventory-cpu-dryrun.yaml")
    model = tmp_path / "gpt.yaml"       # the tiny shapes with GPT's learned positions, 32 of them
    model.write_text("preset: tiny\nposition_embedding: learned\nmax_position_embeddings: 32\n")
    plan = str(tmp_path / "g.yaml")
    assert run_cli(["plan", "--model", str(model), "--inventory", inv, "--global-batch-size", "8", "--quiet",
                    "-o", plan], capsys)[0] == 0
    rc, out, err = run_cli(["simulate", "--plan", plan, "--seq-length", "64", "--json"], capsys)
    assert rc == 0 and "learned positions" in err and "64-row position table" in err, err
    assert json.loads(out)["tokens_per_s"] > 0


def test_no_feasible_plan_on_clusters_no_link_joins_names_the_links(tmp_path, capsys):
    """Two clusters of 8 devices with no link between them: LLaMA-2-70B fits on the 16 together (with a link it
    plans) but on neither alone. The paragraph said it "does not fit on the inventory's 16 devices" and to add devices;
    it now says no link joins the two groups and names the inventory's `links`."""
    from helpers import run_cli
    inv = tmp_path / "inv.yaml"
    inv.write_text("clusters:\n  - {name: a, device: a100, nodes: 1, devices_per_node: 8}\n"
                   "  - {name: b, device: h100, nodes: 1, devices_per_node: 8}\n")
    rc, _, err = run_cli(["plan", "--model", "llama2-70b", "--inventory", str(inv), "--quiet"], capsys)
    assert rc == 3 and "No chain of links joins a | b" in err and "field 'links'" in err, err
    inv.write_text(inv.read_text() + "links:\n  - {between: [a, b], bandwidth_gbps: 25}\n")
    assert run_cli(["plan", "--model", "llama2-70b", "--inventory", str(inv), "--quiet"], capsys)[0] == 0
