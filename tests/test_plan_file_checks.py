"""A plan file checked as every command checks it: the same refusal, naming the same field of the same file, from
simulate, explain, compare, emit, dryrun and plan --from."""
import os

import yaml

from helpers import CPU_INVENTORY, ROOT, run_cli

TINY_PLAN = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")


def plan_with_inventory(tmp_path, name="p.yaml", **changes) -> str:
    """The tiny two-cluster CPU plan as a version-4 file carrying its inventory, with `changes` to its keys."""
    with open(TINY_PLAN) as fh:
        plan = yaml.safe_load(fh)
    plan.update(version=4, inventory=yaml.safe_load(CPU_INVENTORY), **changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(plan))
    return str(path)


def one_paragraph(rc, err, field):
    assert rc == 2 and "Traceback" not in err, err
    assert len([x for x in err.splitlines() if x.strip()]) == 1, err
    assert f"field '{field}'" in err and "Fix: " in err, err


def test_a_mesh_on_a_cluster_the_stored_inventory_lacks_is_named_before_its_links(tmp_path, capsys):
    """meshes[0].cluster renamed to a cluster the plan's inventory lacks: simulate, explain and compare named the
    inventory's links ("add a links entry", which then failed on the unknown cluster); emit named the mesh. Now
    all name the mesh's cluster, and the inventory as the plan's."""
    with open(TINY_PLAN) as fh:
        meshes = yaml.safe_load(fh)["meshes"]
    path = plan_with_inventory(tmp_path, meshes=[{**meshes[0], "cluster": "zzz"}] + meshes[1:])
    for argv in (["simulate", "--plan", path], ["explain", "--plan", path, "--no-search"], ["compare", path],
                 ["emit", "summary", "--plan", path]):
        rc, _, err = run_cli(argv, capsys)
        one_paragraph(rc, err, "meshes[0].cluster")
        assert path in err and "zzz" in err and "cluster-a" in err, (argv, err)
        assert "links" not in err, (argv, err)


def test_the_cost_model_is_described_at_the_plan_files_precision(tmp_path, capsys, sailor_model_dir):
    """simulate --plan of an fp32 plan with a learned model of fp32 measurements: stderr said every device type was
    priced by the analytic model "because the plan trains in 16-bit precision" (the default, not the plan's), while
    the figures were the learned model's."""
    inv = tmp_path / "inv.yaml"
    inv.write_text("clusters:\n  - {name: a, device: a100-40gb, nodes: 1, devices_per_node: 2}\n")
    plan = str(tmp_path / "p.yaml")
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", str(inv), "--precision", "fp32",
                          "--global-batch-size", "4", "--quiet", "--workers", "1", "-o", plan], capsys)
    assert rc == 0, err
    rc, out, err = run_cli(["simulate", "--plan", plan, "--cost-model", sailor_model_dir, "--json"], capsys)
    assert rc == 0, err
    said = [line for line in err.splitlines() if line.startswith("cost model: a100-40gb")]
    assert len(said) == 1 and "learned" in said[0] and "16-bit" not in said[0], err
    assert yaml.safe_load(out)["cost_model"] == {"a100-40gb": "learned"}


def gpu_plan(tmp_path, device: str, precision: str, *, unused: str | None = None, name="gpu.yaml") -> str:
    """The tiny model in two stages on one 2-device cluster `a` of `device`, training in `precision`; `unused`: the
    inventory also lists a cluster `b` of that device type, which the plan does not use."""
    with open(TINY_PLAN) as fh:
        model = yaml.safe_load(fh)["model"]
    clusters = [{"name": "a", "device": device, "nodes": 1, "devices_per_node": 2}]
    if unused:
        clusters.append({"name": "b", "device": unused, "nodes": 1, "devices_per_node": 2})
    plan = {"version": 4, "model": model, "global_batch_size": 4, "precision": precision,
            "meshes": [{"cluster": "a", "device_type": device, "tp": 1, "dp": 1, "micro_batch_size": 2,
                        "recompute": "none", "stage_layers": [4, 4]}],
            "inventory": {"clusters": clusters, "links": []}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(plan))
    return str(path)


def test_dryrun_refuses_a_precision_the_plans_devices_lack(tmp_path, capsys, monkeypatch):
    """fp8 on an A100, or on cpu processes: simulate and emit refused the plan, dryrun trained it (exit 0); with
    --timeline --compare it refused, naming an option '--precision' dryrun does not have. Now refused before any
    rank starts, naming the plan's `precision`, as emit names it."""
    monkeypatch.chdir(tmp_path)
    a100 = gpu_plan(tmp_path, "a100-80gb", "fp8")
    cpu = plan_with_inventory(tmp_path, "cpu.yaml", precision="fp8")
    for path, device in ((a100, "a100-80gb"), (cpu, "cpu")):
        for extra in ([], ["--timeline", "t.json", "--compare"]):
            rc, out, err = run_cli(["dryrun", "--plan", path, "--tiny", "--steps", "2", *extra], capsys)
            one_paragraph(rc, err, "precision")
            assert path in err and f"device type {device}" in err and "fp8" in err and out == "", err
            assert not os.path.exists("t.json")
        rc, _, emitted = run_cli(["emit", "summary", "--plan", path], capsys)
        assert rc == 2 and emitted == err.replace("hetauto dryrun", "hetauto emit"), (emitted, err)
    # validate-cost-model --dryrun prices a report's plan: the plan's precision named the same way (it named
    # '--precision', an option it does not have)
    report = tmp_path / "rep.json"
    report.write_text('{"iteration_s": 0.5, "steps": [{"loss": 1, "grad_norm": 1}, {"loss": 1, "grad_norm": 1}], '
                      '"step_times_s": [0.5, 0.5], "cores": 2}')
    rc, out, err = run_cli(["validate-cost-model", "--dryrun", str(report), cpu, "--tiny"], capsys)
    one_paragraph(rc, err, "precision")
    assert cpu in err and "device type cpu" in err and "fp8" in err, err


def test_plan_from_names_the_old_plans_precision(tmp_path, capsys, sailor_model_dir):
    """plan --from a plan in fp8 onto an inventory of A100s, no --precision given: the refusal named the inventory
    file's field '--precision' (a flag not given); it is the old plan's `precision`, also with a learned model
    (whose notes refused it first). With --precision given, the flag is named as before."""
    old = gpu_plan(tmp_path, "a100-80gb", "fp8")
    inv = tmp_path / "inv.yaml"
    inv.write_text("clusters:\n  - {name: a, device: a100-80gb, nodes: 1, devices_per_node: 2}\n")
    argv = ["plan", "--from", old, "--model", "tiny", "--inventory", str(inv), "--quiet", "--workers", "1"]
    rc, _, err = run_cli(argv, capsys)
    one_paragraph(rc, err, "precision")
    assert f"{old}: field 'precision'" in err and "--precision bf16 or fp16 or fp32" in err, err
    rc, _, learned = run_cli(argv + ["--cost-model", sailor_model_dir], capsys)
    assert rc == 2 and learned == err, learned
    rc, _, err = run_cli(argv + ["--precision", "fp8"], capsys)
    one_paragraph(rc, err, "--precision")
    assert str(inv) in err, err


def test_dryrun_prices_an_fp8_plan_as_simulate_does(tmp_path, capsys, monkeypatch):
    """An fp8 plan on H100s whose inventory also lists an A100 cluster it does not use: simulate leaves that cluster
    out; dryrun --compare refused it naming '--precision' after the run, and --emulate-links refused every fp8 plan
    (it priced the run's cpu processes in fp8). Now both run, the cluster left out as simulate leaves it."""
    monkeypatch.chdir(tmp_path)
    path = gpu_plan(tmp_path, "h100-80gb", "fp8", unused="a100-80gb")
    rc, _, err = run_cli(["simulate", "--plan", path], capsys)
    assert rc == 0, err
    rc, _, err = run_cli(["dryrun", "--plan", path, "--tiny", "--steps", "2", "--emulate-links", "--timeline",
                          "t.json", "--compare"], capsys)
    assert rc == 0, err
    assert err.count("left out of the inventory: b") == 1 and os.path.exists("t.json"), err


def test_a_plan_a_learned_model_priced_says_so_when_the_analytic_one_prices_it(tmp_path, capsys):
    """A plan made with --cost-model (estimate.cost_model: learned) was re-priced by the analytic model in
    simulate, explain and compare without a word: other figures than the plan's, and explain's bottleneck and
    runners-up another model's."""
    import os

    from helpers import ROOT, run_cli
    inv = os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")
    plan = tmp_path / "p.yaml"
    assert run_cli(["plan", "--model", "llama2-7b", "--inventory", inv, "--global-batch-size", "64", "--quiet",
                    "-o", str(plan)], capsys)[0] == 0
    text = plan.read_text()
    assert "cost_model: {h800: analytic}" in text
    for name, source, warned in (("analytic.yaml", "analytic", False), ("learned.yaml", "learned", True)):
        path = tmp_path / name
        path.write_text(text.replace("cost_model: {h800: analytic}", f"cost_model: {{h800: {source}}}"))
        for argv in (["simulate", "--plan", str(path)], ["explain", "--plan", str(path), "--no-search"],
                     ["compare", str(path), str(plan)]):
            rc, _, err = run_cli(argv, capsys)
            assert rc == 0, err
            said = f"{path} was priced with a learned cost model for h800" in err and "--cost-model" in err
            assert said == warned, (argv, err)


def test_plan_from_a_plan_a_learned_model_priced_says_the_analytic_one_replans_it(tmp_path, capsys):
    """plan --from a plan a learned model priced, without --cost-model: the analytic model re-planned it and the
    "what moved" listing blamed the inventory for a layout the other model chose."""
    from helpers import ROOT
    inv = os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")
    plan = tmp_path / "p.yaml"
    assert run_cli(["plan", "--model", "llama2-7b", "--inventory", inv, "--global-batch-size", "64", "--quiet",
                    "-o", str(plan)], capsys)[0] == 0
    learned = tmp_path / "learned.yaml"
    learned.write_text(plan.read_text().replace("cost_model: {h800: analytic}", "cost_model: {h800: learned}"))
    for old, warned in ((plan, False), (learned, True)):
        rc, _, err = run_cli(["plan", "--from", str(old), "--model", "llama2-7b", "--inventory", inv, "--quiet",
                              "-o", str(tmp_path / "again.yaml")], capsys)
        assert rc == 0, err
        assert (f"{old} was priced with a learned cost model for h800" in err) == warned, err
