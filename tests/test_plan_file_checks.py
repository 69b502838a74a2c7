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
