"""`hetauto plan --from` re-plans a plan of every shape (meshes alongside one another, several pipelines) under
its constraints, whether typed or kept from the plan's estimate.search; the depths expected are counted by hand
from the files (meshes side by side share their stages, docs/plan-format.md)."""
import json

import yaml
from helpers import hetauto_here

from hetauto_megatron.plan.constraints import Constraints
from hetauto_megatron.plan.multi_search import _meets
from hetauto_megatron.plan.plan import plan_from_dict
from test_plan_shapes import two_pipelines

TINY2 = "examples/llama/inventory-cpu-tiny-2clusters.yaml"
ALONGSIDE = "examples/llama/plans/tiny-alongside-cpu.yaml"


def depths(plan: dict) -> list[int]:
    """Each pipeline's stage count from a plan file's meshes: a mesh alongside the one before it adds no stage."""
    out: dict = {}
    for m in plan["meshes"]:
        if not m.get("alongside"):
            out[m.get("pipeline", 0)] = out.get(m.get("pipeline", 0), 0) + len(m["stage_layers"])
    return [out[p] for p in sorted(out)]


def replan(*argv) -> dict:
    r = hetauto_here("plan", "--model", "tiny", "--inventory", TINY2, "--quiet", "--workers", "1", "--json", *argv)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["plan"]


def test_the_constraints_count_a_pipelines_stages_once_for_meshes_side_by_side():
    """two_pipelines(): pipeline 0 is a stage of mesh a with mesh b alongside, then mesh c (2 stages); pipeline 1
    is mesh d of 2 stages (micro-batch 1, the others 2); 2 + 2 + 3 + 4 = 11 devices; mesh b (alongside) runs TP 2."""
    plan = plan_from_dict(two_pipelines())
    assert depths(two_pipelines()) == [2, 2]
    assert _meets(Constraints(max_pp=2), plan, "overlapped")
    assert not _meets(Constraints(max_pp=1), plan, "overlapped")
    assert _meets(Constraints(max_devices=11), plan, "overlapped")
    assert not _meets(Constraints(max_devices=10), plan, "overlapped")
    assert _meets(Constraints(tp=(("b", 2), ("d", 1))), plan, "overlapped")
    assert not _meets(Constraints(tp=(("b", 1),)), plan, "overlapped")          # the mesh alongside breaks the pin
    assert not _meets(Constraints(micro_batch_size=2), plan, "overlapped")      # pipeline 1's mesh d runs 1


def test_replan_of_a_plan_with_a_mesh_alongside_under_max_pp():
    """The example's stage 0 is two meshes side by side (2 stages in all): --max-pp 4 and 2 re-plan it (it was an
    exit 2 naming an internal property), and the plan found keeps to the limit."""
    assert depths(yaml.safe_load(open(ALONGSIDE))) == [2]
    for limit in (4, 2):
        new = replan("--from", ALONGSIDE, "--max-pp", str(limit))
        assert max(depths(new)) <= limit


def test_replan_keeps_the_max_pp_of_a_plan_with_meshes_alongside(tmp_path):
    """A plan that has a mesh alongside another and records --max-pp 2 (the example plan with the estimate.search
    block `plan --max-pp 2` writes; the search's own plan here is no longer one with a mesh alongside, since the tree
    offers steps above the devices), re-planned with --from and no flag: its recorded --max-pp is kept and met."""
    record = replan("--global-batch-size", "16", "--max-pp", "2")["estimate"]["search"]
    assert record["constraints"] == {"max_pp": 2}
    written = yaml.safe_load(open(ALONGSIDE))
    assert any(m.get("alongside") for m in written["meshes"]), "the case needs a plan with a mesh alongside"
    written["estimate"] = {"search": {key: record[key] for key in ("objective", "constraints", "boundary_schedule")}}
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(written))
    r = hetauto_here("plan", "--model", "tiny", "--inventory", TINY2, "--quiet", "--workers", "1", "--json",
                     "--from", str(old))
    assert r.returncode == 0, r.stderr
    assert "--max-pp 2" in r.stderr
    assert max(depths(json.loads(r.stdout)["plan"])) <= 2
