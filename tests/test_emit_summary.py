"""The plan summary table, with and without an estimate."""
import json
import os

import pytest
import yaml

from hetauto_megatron.cli import main
from hetauto_megatron.emit.summary import format_summary
from hetauto_megatron.plan.plan import load_plan

PLAN_736 = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "examples", "llama", "plans", "llama2-70b-736.yaml")


def test_layout_only():
    p = load_plan(PLAN_736)
    lines = format_summary(p).splitlines()
    assert "736 devices" in lines[0] and "23 pipeline stages" in lines[0]
    assert "memory" not in lines[1] and "util" not in lines[1]
    rows = lines[3:3 + 23]
    assert rows[0].split()[:8] == ["0", "h800", "h800", "32", "8", "4", "3+emb", "2"]
    assert rows[-1].split()[:8] == ["22", "mi300x", "mi300x", "32", "4", "8", "3+head", "1"]
    assert sum(int(r.split()[6].split("+")[0]) for r in rows) == 80
    assert "128 micro-batch steps" in lines[-1]


def test_with_estimate():
    p = load_plan(PLAN_736)
    stages = [{"compute_s": 0.5 + s, "busy_s": 9.0, "bubble_s": 1.0, "memory_gib": 50.25, "utilisation": 0.9}
              for s in range(23)]
    stages[3] = {"busy_s": 8.0}   # missing keys print as '-'
    text = format_summary(p, {"stages": stages, "iteration_time_s": 10.0, "tokens_per_s": 419430.4,
                              "tflops_per_device": 201.3, "fits": True})
    lines = text.splitlines()
    assert "memory GiB" in lines[1] and "util" in lines[1]
    assert "50.2 / 80" in lines[3] and "90%" in lines[3] and "0.500" in lines[3]
    assert "50.2 / 192" in lines[3 + 22]            # MI300X capacity from the plan's inventory
    assert lines[3 + 3].split()[-6:] == ["-", "8.000", "-", "-", "-", "-"]   # compute busy bubble link mem util
    assert "419,430 tokens/s" in lines[-1] and "fits in memory: yes" in lines[-1]


def test_cli_summary(capsys):
    assert main(["emit", "summary", "--plan", PLAN_736]) == 0
    assert capsys.readouterr().out.strip() == format_summary(load_plan(PLAN_736))


def test_plan_that_outgrew_its_inventory_is_refused_by_every_target(tmp_path, capsys):
    """A hand-edited plan using 8 devices of a 4-device cluster: 'emit megatron' refused it, 'emit summary' (and
    'emit deepspeed') printed its stale estimate with exit 0. Every target runs the same check."""
    import yaml
    inv = os.path.join(os.path.dirname(PLAN_736), "..", "inventory-cpu-dryrun.yaml")
    plan = tmp_path / "p.yaml"
    assert main(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8", "--quiet", "--shapes",
                 "simple", "-o", str(plan)]) == 0
    data = yaml.safe_load(plan.read_text())
    for m in data["meshes"]:
        m["dp"], m["micro_batch_size"] = 8, 1
    first = data["meshes"][0]["cluster"]           # the check names the first cluster it finds overused
    used = sum(m["tp"] * m["dp"] * len(m["stage_layers"]) for m in data["meshes"] if m["cluster"] == first)
    have = next(c["nodes"] * c["devices_per_node"] for c in yaml.safe_load(open(inv))["clusters"] if c["name"] == first)
    assert used > have
    plan.write_text(yaml.safe_dump(data))
    capsys.readouterr()
    for target in ("summary", "deepspeed", "megatron"):
        assert main(["emit", target, "--plan", str(plan)]) == 2, target
        err = capsys.readouterr().err
        assert f"{plan}: field 'meshes': uses {used} devices of cluster {first}, which has only {have}" in err, err


EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "llama")


def _run(capsys, *argv) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", ["tiny-alongside-cpu", "tiny-2pipelines-cpu"])
def test_plans_of_replica_groups_or_several_pipelines_name_their_bottleneck(name, tmp_path, capsys):
    """A plan with a replica group side by side, and one of two pipelines: simulate's table named no bottleneck,
    where explain and compare do. The line names the largest part of the iteration, computed here from simulate's
    own figures (the slowest pipeline's 1F1B, the DP reduction exposed, the exchange across holders, the rest), as
    explain names it; the table of the plan file's stored estimate (emit summary) says the same."""
    plan = os.path.join(EXAMPLES, "plans", f"{name}.yaml")
    inv = os.path.join(EXAMPLES, "inventory-cpu-tiny-2clusters.yaml")
    est = json.loads(_run(capsys, "simulate", "--plan", plan, "--inventory", inv, "--json"))
    T = est["iteration_time_s"]
    slow = max(range(len(est["pipelines"])), key=lambda p: est["pipelines"][p]["before_sync_s"])
    parts = {"slowest pipeline (1F1B)": est["pipelines"][slow]["pipeline_s"],
             "exposed DP reduction and gathers": est["dp_exposed_s"], "gradients summed across holders": est["replica_sync_s"]}
    parts["norm, optimizer, overhead"] = T - sum(parts.values())
    worst = max(parts, key=parts.get)
    text = _run(capsys, "simulate", "--plan", plan, "--inventory", inv)
    line = [x for x in text.splitlines() if x.startswith("bottleneck: ")]
    assert len(line) == 1, text
    assert line[0].startswith(f"bottleneck: {worst} ({parts[worst]:.3f} s, {parts[worst] / T:.0%} of the iteration)")
    rep = json.loads(_run(capsys, "explain", "--plan", plan, "--inventory", inv, "--no-search", "--json", "--quiet"))
    assert line[0].startswith(f"bottleneck: {rep['bottleneck']} (")
    # the plan file with the estimate simulate stored in it: emit summary prints the same line
    stored = tmp_path / "with-estimate.yaml"
    doc = yaml.safe_load(open(plan))
    doc["estimate"] = est
    stored.write_text(yaml.safe_dump(doc))
    summary = _run(capsys, "emit", "summary", "--plan", str(stored)).splitlines()
    assert [x for x in summary if x.startswith("bottleneck: ")] == line
    # a hand-edited estimate without the per-pipeline figures: the table, no bottleneck line, no error
    doc["estimate"] = {k: v for k, v in est.items() if k != "pipelines"}
    stored.write_text(yaml.safe_dump(doc))
    assert not [x for x in _run(capsys, "emit", "summary", "--plan", str(stored)).splitlines()
                if x.startswith("bottleneck")]


def test_a_summary_says_where_the_estimate_it_shows_comes_from(readme_plan, tmp_path, capsys):
    """A plan's estimate is shown as recorded: edited after the plan was made (its layout fingerprint no longer
    matches) it is left out, and one an older hetauto wrote (no fingerprint; the cost model has moved since) was
    shown without a word; it is said now. The plan as written is shown without a note."""
    plan, _ = readme_plan
    assert main(["emit", "summary", "--plan", plan]) == 0
    assert "hetauto emit" not in capsys.readouterr().err
    raw = yaml.safe_load(open(plan))
    raw["estimate"].pop("layout_digest")
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(raw))
    assert main(["emit", "summary", "--plan", str(old)]) == 0
    out, err = capsys.readouterr()
    assert "written by an older hetauto" in err and f"hetauto compare {old}" in err, err
    assert f"{raw['estimate']['iteration_time_s']:.3f}" in out      # shown as recorded
    raw["estimate"]["layout_digest"] = "0" * 16       # another layout's fingerprint
    old.write_text(yaml.safe_dump(raw))
    assert main(["emit", "summary", "--plan", str(old)]) == 0
    assert "was changed after 'hetauto plan' wrote its estimate" in capsys.readouterr().err


def test_a_stage_just_over_its_memory_shows_the_digits_that_say_so(capsys, tmp_path):
    """A stage 40 MiB over its device showed "75.1 / 75.1" beside "fits: no", and explain its headroom as
    "-0.0 GiB": the used memory and the headroom take the decimals that tell them from the capacity and 0."""
    import re
    plan = str(tmp_path / "p.yaml")
    _run(capsys, "plan", "--model", "llama2-70b", "--inventory", os.path.join(EXAMPLES, "inventory-2clusters.yaml"),
         "--global-batch-size", "512", "--quiet", "-o", plan)
    est = json.loads(_run(capsys, "simulate", "--plan", plan, "--json"))
    k, used = max(((k, st["memory_gib"]) for k, st in enumerate(est["stages"])
                   if st["cluster"] == "h800" and round(st["memory_gib"], 1) < st["memory_gib"]), key=lambda x: x[1])
    cap = round(used, 1)                 # below what the stage uses, equal to it at one decimal
    over = ["--set", f"cluster.h800.memory_gib={cap}"]
    text = _run(capsys, "simulate", "--plan", plan, *over)
    shown = re.findall(r"(\d+\.\d+) / " + re.escape(f"{cap:g}") + r"\b", text)
    assert f"{used:.2f}" in shown and f"{cap:.1f}" not in shown, (shown, used, cap)
    rep = _run(capsys, "explain", "--plan", plan, *over, "--no-search")
    assert f"{cap - used:.2f} GiB" in rep and "-0.0 GiB" not in rep, rep
