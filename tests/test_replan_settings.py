"""`hetauto plan --from` of a plan whose meshes' settings were edited: the dropouts (the job trained) are kept in
every mesh the re-plan writes and priced as `hetauto simulate` prices the written file; the settings the search
does not choose are named on stderr, and what moved lists each cluster's settings that changed."""
import dataclasses
import json
import os

import yaml
from helpers import ROOT, hetauto_here

from hetauto_megatron.plan.plan import load_plan
from hetauto_megatron.plan.replan import describe_moves

EXAMPLES = os.path.join(ROOT, "examples", "llama")
INV = os.path.join(EXAMPLES, "inventory-2clusters.yaml")
TINY2 = os.path.join(EXAMPLES, "inventory-cpu-tiny-2clusters.yaml")
DROPOUTS = {"hidden_dropout": 0.1, "attention_dropout": 0.1}


def _edited(src: str, dst, each) -> None:
    """The plan file `src` with each mesh's settings updated by each(index) (a dict), written to `dst`."""
    doc = yaml.safe_load(open(src))
    for i, m in enumerate(doc["meshes"]):
        m["settings"] = {**(m.get("settings") or {}), **each(i)}
    doc.pop("estimate", None)
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))


def _simulated(plan_file, inventory: str) -> dict:
    r = hetauto_here("simulate", "--plan", str(plan_file), "--inventory", inventory, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_replan_keeps_the_dropouts_and_names_the_settings_it_leaves(tmp_path):
    """The audit's case: llama2-70b on the two clusters, its plan's meshes edited to dropout 0.1, no sequence
    parallelism and gradients reduced in bf16. The re-plan trains the same job (dropout 0.1 in every mesh; before,
    0.0, and "nothing moved"), its estimate is what `hetauto simulate` measures of the written file (above what
    the same file without the dropouts uses: they were priced), and stderr names the settings left."""
    cold, old, new = tmp_path / "cold.yaml", tmp_path / "old.yaml", tmp_path / "new.yaml"
    base = ("plan", "--model", "llama2-70b", "--inventory", INV, "--quiet", "--workers", "1")
    assert hetauto_here(*base, "-o", str(cold)).returncode == 0
    _edited(str(cold), old, lambda i: {**DROPOUTS, "sequence_parallel": False, "grad_reduce_dtype": "param"})
    r = hetauto_here(*base, "--from", str(old), "-o", str(new))
    assert r.returncode == 0, r.stderr
    written = yaml.safe_load(new.read_text())
    assert all({k: m["settings"][k] for k in DROPOUTS} == DROPOUTS for m in written["meshes"])
    measured = _simulated(new, INV)
    assert written["estimate"]["iteration_time_s"] == measured["iteration_time_s"]
    assert written["estimate"]["memory_gib"] == measured["memory_gib"]
    _edited(str(new), tmp_path / "none.yaml", lambda i: {k: 0.0 for k in DROPOUTS})
    assert sum(measured["memory_gib"]) > sum(_simulated(tmp_path / "none.yaml", INV)["memory_gib"])
    left = next(line for line in r.stderr.splitlines() if "not kept (the search does not choose them" in line)
    for cluster in ("ascend", "h800"):
        assert f"{cluster}: sequence_parallel false, grad_reduce_dtype param" in left
    assert "settings.hidden_dropout 0.1" in r.stderr and "settings.attention_dropout 0.1" in r.stderr
    assert "nothing moved" not in r.stdout
    assert "h800: settings sequence_parallel false -> true, grad_reduce_dtype param -> fp32" in r.stdout


def test_replan_of_meshes_of_different_dropouts_keeps_none_and_says_so(tmp_path):
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    _edited(os.path.join(EXAMPLES, "plans", "tiny-2pipelines-cpu.yaml"), old, lambda i: {"hidden_dropout": 0.1 * i})
    r = hetauto_here("plan", "--model", "tiny", "--inventory", TINY2, "--quiet", "--workers", "1", "--from",
                     str(old), "-o", str(new))
    assert r.returncode == 0, r.stderr
    assert "the dropouts of" in r.stderr and "not kept: its meshes differ" in r.stderr
    assert "--hidden-dropout P and --attention-dropout P" in r.stderr
    assert all(m.settings.hidden_dropout == 0.0 for m in load_plan(str(new)).meshes)
    # the job's dropouts given by the flags: nothing to say of the old plan's (it said "runs none" before)
    r = hetauto_here("plan", "--model", "tiny", "--inventory", TINY2, "--quiet", "--workers", "1", "--from",
                     str(old), "--hidden-dropout", "0.1", "--attention-dropout", "0", "-o", str(new))
    assert r.returncode == 0, r.stderr
    assert "the dropouts of" not in r.stderr, r.stderr
    assert all(m.settings.hidden_dropout == 0.1 for m in load_plan(str(new)).meshes)


def test_replan_of_other_shapes_keeps_the_dropouts_in_every_mesh(tmp_path):
    """A plan of two pipelines and one of a mesh alongside another: whichever shape wins (the old plan seeds the
    new shapes' search, groups alongside are added from free devices), every mesh written trains the dropouts, and
    the estimate is what simulate measures of the file."""
    for src in (os.path.join(EXAMPLES, "plans", "tiny-2pipelines-cpu.yaml"), os.path.join(EXAMPLES, "plans", "tiny-alongside-cpu.yaml")):
        old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
        _edited(src, old, lambda i: DROPOUTS)
        r = hetauto_here("plan", "--model", "tiny", "--inventory", TINY2, "--quiet", "--workers", "1", "--from",
                         str(old), "-o", str(new))
        assert r.returncode == 0, r.stderr
        plan = load_plan(str(new))
        assert all((m.settings.hidden_dropout, m.settings.attention_dropout) == (0.1, 0.1) for m in plan.meshes)
        assert plan.estimate["iteration_time_s"] == _simulated(new, TINY2)["iteration_time_s"]


def test_what_moved_lists_a_clusters_settings_that_changed():
    """The same meshes with other settings are a move, not "nothing moved"."""
    before = load_plan(os.path.join(EXAMPLES, "plans", "tiny-2clusters-cpu.yaml"))
    first = dataclasses.replace(before.meshes[0], setting_overrides={"hidden_dropout": 0.1})
    after = dataclasses.replace(before, meshes=(first, *before.meshes[1:]))
    assert describe_moves(before, after) == [f"{first.cluster}: settings hidden_dropout 0.0 -> 0.1"]
    assert describe_moves(before, before) == ["nothing moved: the old plan is still the best found"]


def test_replan_of_a_plan_in_a_precision_some_of_its_devices_lack_takes_the_given_one(tmp_path):
    """The old plan asks fp8 of the Ascend cluster, which has none: naming the settings it leaves asked each mesh's
    settings as run at that precision and refused the re-plan (exit 2, no file named) even with --precision bf16
    given, which re-planned before. With --precision it re-plans; without, the refusal names the file and the fix."""
    cold, old = tmp_path / "cold.yaml", tmp_path / "old.yaml"
    base = ("plan", "--model", "llama2-70b", "--inventory", INV, "--quiet", "--workers", "1")
    assert hetauto_here(*base, "-o", str(cold)).returncode == 0
    doc = yaml.safe_load(cold.read_text())
    doc["precision"] = "fp8"
    doc.pop("estimate", None)
    old.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = hetauto_here(*base, "--from", str(old), "--precision", "bf16", "-o", str(tmp_path / "new.yaml"))
    assert r.returncode == 0, r.stderr
    r = hetauto_here(*base, "--from", str(old), "-o", str(tmp_path / "refused.yaml"))
    assert r.returncode == 2 and f"{old}: field 'precision'" in r.stderr and "--precision" in r.stderr, r.stderr


def test_a_cold_plan_trains_the_dropouts_its_flags_give_and_a_flag_replaces_what_from_kept(tmp_path):
    """--hidden-dropout / --attention-dropout: every mesh of the plan runs them (before, a cold search could only
    plan without dropout), the estimate prices them as `simulate` prices the written file, and the launch states
    them; given with --from, a flag replaces the old plan's value; a probability out of range is one paragraph."""
    cold, again = tmp_path / "cold.yaml", tmp_path / "again.yaml"
    base = ("plan", "--model", "tiny", "--inventory", TINY2, "--quiet", "--workers", "1")
    r = hetauto_here(*base, "--hidden-dropout", "0.1", "--attention-dropout", "0.05", "-o", str(cold),
                     "--emit", str(tmp_path / "emit"))
    assert r.returncode == 0, r.stderr
    plan = load_plan(str(cold))
    assert all((m.settings.hidden_dropout, m.settings.attention_dropout) == (0.1, 0.05) for m in plan.meshes)
    assert plan.estimate["memory_gib"] == _simulated(cold, TINY2)["memory_gib"]
    _edited(str(cold), tmp_path / "none.yaml", lambda i: {k: 0.0 for k in DROPOUTS})
    # (unrounded: the tiny model's masks are under the files' 0.01 GiB)
    from hetauto_megatron.plan.simulate import simulate
    from hetauto_megatron.spec.inventory import load_inventory
    held = [sum(simulate(load_plan(str(f)), load_inventory(TINY2)).memory_gib) for f in (cold, tmp_path / "none.yaml")]
    assert held[0] > held[1], held
    scripts = sorted((tmp_path / "emit").glob("*.sh"))      # one launch script per cluster
    assert len(scripts) == 2 and all("--hidden-dropout 0.1\n" in p.read_text() and "--attention-dropout 0.05\n"
                                     in p.read_text() for p in scripts), scripts
    r = hetauto_here(*base, "--from", str(cold), "--hidden-dropout", "0", "-o", str(again))
    assert r.returncode == 0, r.stderr
    assert all((m.settings.hidden_dropout, m.settings.attention_dropout) == (0.0, 0.05)
               for m in load_plan(str(again)).meshes)
    r = hetauto_here(*base, "--hidden-dropout", "1.5")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--hidden-dropout" in r.stderr and "1.5" in r.stderr and "Fix:" in r.stderr, r.stderr
