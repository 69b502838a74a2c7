"""Two clusters of one device type that the learned model prices differently (one without TF32, or given other
figures with --set): stderr and --json's cost_model say each cluster's pricing, without contradiction. Both were
keyed by the device type, and each kept one cluster's answer: stderr said "analytic", --json "learned"."""
import json
import os

import pytest

from hetauto_megatron.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, "examples", "peers")


def _inventory(tmp_path, v100_tf32: bool) -> str:
    """Sailor's same-zone peers with the V100 cluster turned into A100-40s (TF32 as given)."""
    with open(os.path.join(PEERS, "inventory-same-zone.yaml"), encoding="utf-8") as fh:
        text = fh.read()
    head, sep, tail = text.partition("  - name: v100")
    tail = tail.replace("device: v100-16gb", f"device: a100-40gb\n    tf32: {str(v100_tf32).lower()}", 1)
    tail = tail.replace("memory_gib: 16", "memory_gib: 40", 1)
    assert "a100-40gb" in tail, "the example's v100 cluster changed: adapt the test"
    path = tmp_path / "inv.yaml"
    path.write_text(head + sep + tail)
    return str(path)


def _plan(capsys, inv, model_dir, *extra):
    assert main(["plan", "--model", os.path.join(PEERS, "models", "opt-350m.yaml"), "--inventory", inv,
                 "--cost-model", model_dir, "--precision", "fp32", "--use-clusters", "a100,v100",
                 "--shapes", "simple", "--json", *extra]) == 0
    out, err = capsys.readouterr()
    said = dict(line[len("cost model: "):].split(": ", 1) for line in err.splitlines()
                if line.startswith("cost model: "))
    return json.loads(out), said


@pytest.mark.parametrize("v100_tf32, extra", [(False, ()), (True, ("--set", "cluster.v100.peak_tflops=100"))],
                         ids=["tf32-false", "set-peak"])
def test_clusters_of_one_type_priced_differently_are_each_named(sailor_model_dir, tmp_path, capsys, v100_tf32,
                                                                  extra):
    res, said = _plan(capsys, _inventory(tmp_path, v100_tf32), sailor_model_dir, *extra)
    a, v = "a100-40gb (cluster a100)", "a100-40gb (cluster v100)"
    assert {s["cluster"] for s in res["stages"]} == {"a100", "v100"}
    assert res["cost_model"] == {a: "learned", v: "analytic"}, res["cost_model"]
    assert said[a].startswith("learned (measured (sailor") and said[v].startswith("analytic ("), said
    # the reason in --json is the one on stderr
    assert {k: f"{res['cost_model'][k]} ({w})" for k, w in res["cost_model_why"].items()} == said
    why = "without tensor cores" if not v100_tf32 else "other figures"
    assert why in res["cost_model_why"][v]


def test_clusters_of_one_type_priced_alike_keep_one_entry_per_type(sailor_model_dir, tmp_path, capsys):
    res, said = _plan(capsys, _inventory(tmp_path, True), sailor_model_dir)
    assert res["cost_model"] == {"a100-40gb": "learned"} and list(said) == ["a100-40gb"]
