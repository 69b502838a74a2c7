"""`hetauto validate-cost-model` says what priced each figure: layer files at the precision their header states (and
refused or skipped where the model does not price them), rows skipped with their reason, the dry-run column named
after the model that priced it, and the published runs' coverage per device type."""
import json
import os

import pytest
from conftest import TINY_PLAN
from helpers import CPU_INVENTORY

from hetauto_megatron.cli import main
from hetauto_megatron.cost import learned as L

OPS, LAYERS = (os.path.join(L.H200_DATA, f) for f in ("profile-h200.jsonl", "layers-h200.jsonl"))


def relabelled(src: str, dst, **header) -> str:
    """`src` with its header's fields replaced (the rows unchanged)."""
    lines = open(src).read().splitlines()
    dst.write_text("\n".join([json.dumps({**json.loads(lines[0]), **header})] + lines[1:]) + "\n")
    return str(dst)


FP32_TF32 = dict(dtype="float32", dtype_bytes=4, tf32=True, peak_tflops=494.5)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(bf16 model of the packaged H200 files, a model fitted on the same files labelled fp32 on TF32, that layer
    file, a directory)."""
    d = tmp_path_factory.mktemp("coverage")
    assert L.fit([OPS, LAYERS], str(d / "bf16"), holdout=0.0)
    ops32, layers32 = relabelled(OPS, d / "ops32.jsonl", **FP32_TF32), relabelled(LAYERS, d / "l32.jsonl", **FP32_TF32)
    assert L.fit([ops32, layers32], str(d / "tf32"), holdout=0.0)
    return str(d / "bf16"), str(d / "tf32"), layers32, d


def run(argv, capsys):
    code = main(["validate-cost-model"] + argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def layer_json(argv, capsys) -> dict:
    code, out, err = run(argv + ["--json"], capsys)
    assert code == 0, err
    return json.loads(out)["layers"]


def test_published_runs_say_why_per_device(sailor_model_dir, capsys):
    """The Sailor model covers A100-80 in TF32; the published runs trained in 16-bit: each device type's reason is
    given, and the learned figures are the analytic ones (the in-sample column) where it prices none."""
    code, out, _ = run(["--published", "--cost-model", sailor_model_dir, "--json"], capsys)
    res = json.loads(out)["published"]
    a100 = res["learned_coverage"]["a100-80gb"]
    assert a100["priced_by"] == "analytic" and "TF32" in a100["why"] and "16-bit" in a100["why"]
    assert all(r["learned_s"] == r["in_sample_s"] for r in res["rows"] if r["learned_source"] == "analytic")
    code, out, _ = run(["--published", "--cost-model", sailor_model_dir], capsys)
    assert code == 0 and "covers none" not in out and f"  a100-80gb: analytic ({a100['why']})" in out


def test_dryrun_column_named_after_the_model_that_priced_it(models, tmp_path, capsys):
    """A model without cpu measurements: the dry run is priced by the analytic model, labelled so, with the same
    figure as without --cost-model, and stderr says why."""
    from hetauto_megatron.plan.plan import load_plan
    from hetauto_megatron.runtime.dryrun import prepare_plan
    bf16 = models[0]
    (tmp_path / "inv.yaml").write_text(CPU_INVENTORY)
    rep = tmp_path / "report.json"
    rep.write_text(json.dumps({"iteration_s": 0.5, "cores": 2,
                               "model": prepare_plan(load_plan(TINY_PLAN), tiny=True).model.to_dict()}))
    argv = ["--inventory", str(tmp_path / "inv.yaml"), "--dryrun", str(rep), TINY_PLAN]
    code, out, err = run(["--cost-model", bf16] + argv + ["--json"], capsys)
    res = json.loads(out)["dryruns"]
    row, = res["rows"]
    assert code == 0 and res["cost_model"] == "analytic" and row["cost_model"] == {"cpu": "analytic"}
    assert "analytic_s" not in row and "no measurements of cpu" in row["cost_model_why"]["cpu"]
    assert "cost model: cpu: analytic (no measurements of cpu" in err
    _, plain, _ = run(argv + ["--json"], capsys)
    assert row["predicted_s"] == json.loads(plain)["dryruns"]["rows"][0]["predicted_s"]
    code, out, _ = run(["--cost-model", bf16] + argv, capsys)
    assert "analytic s" in out.splitlines()[0] and "learned" not in out
