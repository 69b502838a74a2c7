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
from hetauto_megatron.cost.analytic import AnalyticCostModel
from hetauto_megatron.spec.devices import get_device

OPS, LAYERS = (os.path.join(L.H200_DATA, f) for f in ("profile-h200.jsonl", "layers-h200.jsonl"))


def relabelled(src: str, dst, **header) -> str:
    """`src` with its header's fields replaced (the rows unchanged). An operator profile relabelled fp32 also
    holds each attention row as the unfused attention's, which an fp32 job runs on the H200 (Transformer Engine's
    fused kernels take 16-bit inputs only: features.runs_unfused_attention) and its profile times: the same
    readings, only to give the fit the operator kind it prices fp32 layers from."""
    lines = open(src).read().splitlines()
    rows = lines[1:]
    if header.get("dtype") == "float32":
        for line in lines[1:]:
            row = json.loads(line)
            if row.get("op", {}).get("kind") == "attention":
                rows.append(json.dumps({**row, "key": "attention_unfused" + row["key"][len("attention"):],
                                        "op": {**row["op"], "kind": "attention_unfused"}}))
    dst.write_text("\n".join([json.dumps({**json.loads(lines[0]), **header})] + rows) + "\n")
    return str(dst)


FP32_TF32 = dict(dtype="float32", dtype_bytes=4, tf32=True,
                 peak_tflops=get_device("h200").peak_tflops_at("tf32"))      # what 'hetauto profile' writes


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


def test_layer_file_in_another_precision_is_refused_naming_the_field(models, capsys):
    bf16, _, layers32, d = models
    code, _, err = run(["--cost-model", bf16, "--profile", layers32], capsys)
    assert code == 2 and f"{layers32}: field 'dtype'" in err and "16-bit" in err and "Traceback" not in err
    # the header's dtype changed alone: its element width contradicts it
    half = relabelled(LAYERS, d / "half.jsonl", dtype="float32", tf32=True)
    code, _, err = run(["--cost-model", bf16, "--profile", half], capsys)
    assert code == 2 and "field 'dtype_bytes'" in err and half in err
    # TF32 claimed for 16-bit layers
    code, _, err = run(["--cost-model", bf16, "--profile", relabelled(LAYERS, d / "t.jsonl", tf32=True)], capsys)
    assert code == 2 and "field 'tf32'" in err
    # a CPU is priced in fp32 whatever the job's precision: bf16 CPU layers have no figure to compare with
    cpu = relabelled(LAYERS, d / "cpu.jsonl", device_type="cpu", vendor="cpu")
    code, _, err = run(["--cost-model", bf16, "--profile", cpu], capsys)
    assert code == 2 and "field 'dtype'" in err and "fp32" in err


def test_tf32_layers_priced_at_tf32(models, capsys):
    """A model fitted on TF32 files prices the TF32 layer file as learned, and the analytic column is the analytic
    model's layer time for an fp32 job on TF32 (computed here), not a bf16 job's."""
    bf16, tf32, layers32, _ = models
    res = layer_json(["--cost-model", tf32, "--profile", layers32], capsys)
    assert {r["source"] for r in res["rows"]} == {"learned"} and res["summary"]["all"]["source"] == "learned"
    _, measured = L.read_layers(layers32)
    analytic = AnalyticCostModel(sequence_parallel=False)
    at_tf32, at_bf16 = get_device("h200").at_precision("fp32"), get_device("h200").at_precision("bf16")
    for layer, fwd, bwd in zip(measured, res["rows"][0::2], res["rows"][1::2]):
        spec, tp, b = layer.shape.model(layer.model), layer.shape.tp, layer.shape.micro_batch
        assert (fwd["analytic_s"], bwd["analytic_s"]) == pytest.approx(analytic.layer_times(spec, at_tf32, tp, b))
        assert fwd["analytic_s"] != pytest.approx(analytic.layer_times(spec, at_bf16, tp, b)[0])
        assert (fwd["measured_s"], bwd["measured_s"]) == (layer.fwd_s, layer.bwd_s)
    # the bf16 file against the bf16 model: its analytic column is a bf16 job's
    res = layer_json(["--cost-model", bf16, "--profile", LAYERS], capsys)
    layer = L.read_layers(LAYERS)[1][0]
    want = analytic.layer_times(layer.shape.model(layer.model), at_bf16, layer.shape.tp, layer.shape.micro_batch)
    assert (res["rows"][0]["analytic_s"], res["rows"][1]["analytic_s"]) == pytest.approx(want)


def test_layer_file_the_model_does_not_price_is_skipped_with_its_reason(models, capsys):
    bf16, tf32, layers32, d = models
    other = relabelled(LAYERS, d / "h100.jsonl", device_type="h100-sxm")
    res = layer_json(["--cost-model", bf16, "--profile", LAYERS, "--profile", other, "--profile", layers32], capsys)
    assert {r["device"] for r in res["rows"]} == {"h200"} and {r["source"] for r in res["rows"]} == {"learned"}
    n = 2 * len(L.read_layers(LAYERS)[1])
    assert len(res["rows"]) == n and res["skipped"] == 2 * n
    why = {s["file"]: s for s in res["skipped_why"]}
    assert why[other]["device"] == "h100-sxm" and "no measurements of h100-sxm" in why[other]["reason"]
    assert why[layers32]["arithmetic"] == "tf32" and "another precision" in why[layers32]["reason"]
    code, out, _ = run(["--cost-model", bf16, "--profile", LAYERS, "--profile", other], capsys)
    assert code == 0 and f"{other}: {n} rows of h100-sxm measured in 16-bit" in out
    # only files it does not price: refused, naming the file and the device type
    code, _, err = run(["--cost-model", bf16, "--profile", other], capsys)
    assert code == 2 and f"{other}: field 'device_type'" in err


def test_sailor_readings_skipped_say_their_precision(sailor_model_dir, capsys):
    """The A100-40 readings measured without TF32 are skipped because the model measured A100-40 on TF32: the
    count comes from the readings' own precision labels, the model's from its manifest."""
    from hetauto_megatron.commands.fit import SAILOR_DEFAULT, sailor_path
    model = L.LearnedCostModel(sailor_model_dir)
    readings = L.sailor_reading_samples([r for r in L.load_sailor(sailor_path(SAILOR_DEFAULT))
                                         if r.shape.kind == "transformer"], 1.0, 1.0)
    other = [s for s in readings if s.arithmetic != model.devices[s.device].arithmetic]
    assert other and {(s.device, s.arithmetic) for s in other} == {("a100-40gb", "fp32")}
    code, out, _ = run(["--cost-model", sailor_model_dir, "--sailor", "--json"], capsys)
    res = json.loads(out)
    assert code == 0 and res["skipped"] == len(other) and res["summary"]["all"]["rows"] == len(readings) - len(other)
    skip, = res["skipped_why"]
    assert (skip["device"], skip["arithmetic"], skip["rows"]) == ("a100-40gb", "fp32", len(other))
    code, out, _ = run(["--cost-model", sailor_model_dir, "--sailor"], capsys)
    assert f"{len(other)} rows of a100-40gb measured in fp32 without tensor cores skipped" in out
    assert "TF32" in out.splitlines()[-1] and "device types the model does not cover" not in out


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
