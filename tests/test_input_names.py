"""Names in YAML files are the text written: YAML 1.1 reads a bare 0x10 as 16, 007 as 7, 1_000 as 1000, on as
true, 1.50 as 1.5 and 2024-01-01 as a date, and a cluster named 0x10 was planned as "16" without a word (so
--tp 0x10=8 and --exclude-clusters 0x10 no longer found it). The expected names below are the file's own text."""
from __future__ import annotations

import yaml
from helpers import run_cli

from hetauto_megatron.spec.inventory import load_inventory

# written as YAML reads something other than text: hex, octal, underscores, boolean words, a float, a date;
# then a plain decimal integer, which reads back as written either way
NAMES = ["0x10", "007", "1_000", "on", "true", "1.50", "2024-01-01", "5"]


def _write(tmp_path, text):
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    return str(path)


def test_cluster_names_and_link_ends_are_read_as_written(tmp_path):
    lines = ["clusters:"] + [f"  - {{name: {n}, device: cpu, nodes: 1, devices_per_node: 2}}" for n in NAMES]
    lines += ["links:", f"  - {{between: [{NAMES[0]}, {NAMES[1]}], bandwidth_gbps: 10, latency_ms: 0.5}}"]
    inv = load_inventory(_write(tmp_path, "\n".join(lines) + "\n"))
    assert [c.name for c in inv.clusters] == NAMES
    assert inv.link("0x10", "007").bandwidth_gbps == 10
    assert inv.link("007", "0x10").latency_s == 0.0005


def test_a_name_shared_with_a_number_by_an_alias_leaves_the_number_be(tmp_path):
    """The name is read as text from its own copy: the aliased count stays the integer it is."""
    inv = load_inventory(_write(tmp_path, "clusters:\n"
                                          "  - {devices_per_node: &n 0x4, name: *n, device: cpu, nodes: 1}\n"))
    assert inv.clusters[0].name == "0x4" and inv.clusters[0].devices_per_node == 4


def test_flags_and_plan_files_find_the_name_as_written(tmp_path, capsys):
    """--tp, --exclude-clusters and --set name the clusters as the file writes them; the plan file keeps the name
    (quoted by the writer) and simulate reads it back."""
    inv = _write(tmp_path, "clusters:\n"
                           "  - {name: 0x10, device: cpu, nodes: 1, devices_per_node: 4}\n"
                           "  - {name: 007, device: cpu, nodes: 1, devices_per_node: 2}\n"
                           "links:\n  - {between: [0x10, 007], bandwidth_gbps: 10, latency_ms: 0.1}\n")
    plan = str(tmp_path / "p.yaml")
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8", "--quiet",
                          "--tp", "0x10=2", "--exclude-clusters", "007", "--set", "cluster.0x10.nodes=2",
                          "-o", plan], capsys)
    assert rc == 0, err
    with open(plan) as fh:
        meshes = yaml.safe_load(fh)["meshes"]
    assert {(m["cluster"], m["tp"]) for m in meshes} == {("0x10", 2)}
    rc, _, err = run_cli(["simulate", "--plan", plan], capsys)
    assert rc == 0, err


def test_a_name_written_as_null_says_what_yaml_read(tmp_path, capsys):
    inv = _write(tmp_path, "clusters:\n  - {name: null, device: cpu, nodes: 1, devices_per_node: 4}\n")
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--quiet"], capsys)
    assert rc == 2 and "Traceback" not in err
    assert "field 'clusters[0].name'" in err and "null" in err and "quote" in err, err


def test_plan_file_keys_naming_clusters_are_read_as_written(tmp_path, capsys):
    """A hand-written plan's recorded constraints map cluster names to a setting (tp: {007: 1}): the keys are the
    names as written, so the plan simulates and 'plan --from' keeps the pins on those clusters (read as 7 and True,
    they named no cluster of the inventory and were dropped)."""
    from hetauto_megatron.plan.constraints import Constraints
    from hetauto_megatron.plan.plan import load_plan
    path = tmp_path / "hand.yaml"
    path.write_text(
        "version: 4\n"
        "model: {preset: tiny}\n"
        "global_batch_size: 8\n"
        "meshes:\n"
        "- {cluster: 007, device_type: cpu, tp: 1, dp: 1, micro_batch_size: 1, stage_layers: [4]}\n"
        "- {cluster: yes, device_type: cpu, tp: 1, dp: 1, micro_batch_size: 1, recompute: full, stage_layers: [4]}\n"
        "inventory:\n"
        "  clusters:\n"
        "  - {name: 007, device: cpu, nodes: 1, devices_per_node: 2}\n"
        "  - {name: yes, device: cpu, nodes: 1, devices_per_node: 2}\n"
        "  links:\n"
        "  - {between: [007, yes], bandwidth_gbps: 10, latency_ms: 0.1}\n"
        "estimate:\n"
        "  search: {method: exhaustive, objective: throughput,\n"
        "           constraints: {tp: {007: 1}, recompute: {yes: full, 0x10: none}, use_clusters: [007, yes]}}\n")
    plan = load_plan(str(path))
    record = plan.estimate["search"]
    assert record["constraints"] == {"tp": {"007": 1}, "recompute": {"yes": "full", "0x10": "none"},
                                    "use_clusters": ["007", "yes"]}
    c = Constraints.from_record(record)
    assert c.tp == (("007", 1),) and c.recompute == (("0x10", "none"), ("yes", "full"))    # (sorted by cluster)
    assert c.use_clusters == ("007", "yes")
    rc, out, err = run_cli(["simulate", "--plan", str(path), "--json"], capsys)
    assert rc == 0, err
    again = str(tmp_path / "again.yaml")
    inv = _write(tmp_path, "clusters:\n"
                           "  - {name: 007, device: cpu, nodes: 1, devices_per_node: 2}\n"
                           "  - {name: yes, device: cpu, nodes: 1, devices_per_node: 2}\n"
                           "links:\n  - {between: [007, yes], bandwidth_gbps: 10, latency_ms: 0.1}\n")
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8", "--from",
                          str(path), "--quiet", "-o", again], capsys)
    assert rc == 0, err
    assert "--tp 007=1" in err and "--recompute yes=full" in err and "no cluster 7" not in err, err
    with open(again) as fh:
        kept = yaml.safe_load(fh)["estimate"]["search"]["constraints"]
    assert kept["tp"] == {"007": 1} and kept["recompute"] == {"yes": "full"}, kept
    for mesh in load_plan(again).meshes:
        assert (mesh.tp if mesh.cluster == "007" else mesh.recompute) == (1 if mesh.cluster == "007" else "full")
