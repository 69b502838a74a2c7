"""The peer scenarios (examples/peers/, docs/peers.md): a plan made with `--memory-job sailor-deepspeed` fits under our
memory model configured as Sailor's job runs, and that configuration never under-predicts Sailor's own memory
terms, computed from the per-layer parameters and activation memory Sailor measured (data/sailor/llm_info.json)."""
import json
import os
import subprocess
import sys

import pytest

from hetauto_megatron.cost.memory import job_stage_memory_bytes
from hetauto_megatron.plan.memory_fit import sailor_deepspeed_job
from hetauto_megatron.plan.plan import load_plan
from hetauto_megatron.plan.vocab_padding import padded_vocab_size
from hetauto_megatron.spec.model import load_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "hetauto_megatron", "data", "sailor")
with open(os.path.join(DATA, "llm_info.json")) as f:
    LLM_INFO = json.load(f)


def sailor_stage_bytes(model: str, entries: list[int], tp: int, mbs: int, in_flight: int) -> float:
    """Sailor's check_config_fits: 24 bytes per parameter, measured activation memory x micro-batch x 4 bytes x
    the stages after this one, 2 GB (TP 1) or 3 GB of framework memory."""
    info = LLM_INFO[model][str(tp)]
    params = sum(info[str(i)]["params_floats"] for i in entries)
    act = sum(info[str(i)]["act_mem_floats"] for i in entries) * mbs * 4
    return params * 24 + act * in_flight + (2e9 if tp == 1 else 3e9)


CASES = [  # (model, yaml, entries of the stage (0 = embedding, L+1 = head), tp, micro-batch, stages, stage index)
    ("OPT-350", "opt-350m.yaml", list(range(0, 13)), 1, 4, 2, 0),
    ("OPT-350", "opt-350m.yaml", list(range(13, 26)), 1, 4, 2, 1),
    ("OPT-350", "opt-350m.yaml", list(range(0, 13)), 4, 4, 2, 0),
    ("OPT-350", "opt-350m.yaml", list(range(7, 15)), 2, 2, 4, 1),
    ("GPT-Neo-2.7", "gpt-neo-2.7b.yaml", list(range(0, 9)), 1, 1, 4, 0),
    ("GPT-Neo-2.7", "gpt-neo-2.7b.yaml", list(range(25, 34)), 4, 2, 4, 3),
    ("GPT-Neo-2.7", "gpt-neo-2.7b.yaml", list(range(9, 17)), 2, 1, 4, 1),
]


@pytest.mark.parametrize("name,yaml,entries,tp,mbs,p,i", CASES)
def test_job_memory_not_below_sailors_terms(name, yaml, entries, tp, mbs, p, i):
    model = load_model(os.path.join(ROOT, "examples", "peers", "models", yaml))
    model = model.replace(vocab_size=padded_vocab_size(model.vocab_size, [tp]))
    L = model.num_layers
    first, last = entries[0] == 0, entries[-1] > L
    layers = len([e for e in entries if 1 <= e <= L])
    ours = job_stage_memory_bytes(sailor_deepspeed_job(), model, layers=layers, tp=tp, dp=8, micro_batch_size=mbs,
                                  recompute="none", in_flight=p - i, first=first, last=last)["total"]
    theirs = sailor_stage_bytes(name, entries, tp, mbs, p - i)
    assert ours >= theirs, f"{name} stage {i}/{p} tp{tp} mbs{mbs}: ours {ours / 2**30:.2f} GiB < Sailor's " \
                           f"{theirs / 2**30:.2f} GiB"
    assert ours <= 1.6 * theirs, "configured as Sailor's job, the model should describe the same job"


def _plan(tmp_path, *extra) -> str:
    out = tmp_path / "plan.yaml"
    cmd = [sys.executable, "-m", "hetauto_megatron.cli", "plan", "--model", "examples/peers/models/opt-350m.yaml",
           "--inventory", "examples/peers/inventory-same-zone.yaml", "--precision", "fp32",
           "--global-batch-size", "1024", "--quiet", "--budget-s", "8", "--shapes", "simple", "-o", str(out), *extra]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return str(out)


def _assert_fits_as_sailors_job(path: str) -> None:
    """Every stage of the plan, held as Sailor's job (sailor_stage_bytes: Sailor's formula over the per-layer
    parameters and activations it measured), fits its cluster's memory_gib."""
    plan = load_plan(path)
    caps = {c["name"]: c["memory_gib"] * 2 ** 30 for c in plan.inventory["clusters"]}
    L = plan.model.num_layers
    p = sum(len(m.stage_layers) for m in plan.meshes)
    s, layer = 0, 0
    for mesh in plan.meshes:
        for layers in mesh.stage_layers:
            # Sailor's entries: 0 the embedding, 1..L the layers, L + 1 the head
            entries = ([0] if s == 0 else []) + list(range(layer + 1, layer + layers + 1)) + \
                ([L + 1] if s == p - 1 else [])
            need = sailor_stage_bytes("OPT-350", entries, mesh.tp, mesh.micro_batch_size, p - s)
            assert need <= caps[mesh.cluster], f"stage {s} on {mesh.cluster}: {need / 2**30:.1f} GiB as Sailor's job"
            s, layer = s + 1, layer + layers
    assert layer == L


def test_peer_plan_fits_as_sailors_job(tmp_path):
    """OPT-350M on the same-zone inventory, planned with --memory-job (analytic model: the memory does not depend
    on the time model): every stage of every mesh fits its device as Sailor's job would hold it, by Sailor's own
    measured terms. (Planned without it, the plan's first A100 stage needs 42.1 GiB by those terms.)"""
    _assert_fits_as_sailors_job(_plan(tmp_path, "--memory-job", "sailor-deepspeed"))


def test_commands_reading_the_plan_price_it_with_its_memory_job(tmp_path, capsys):
    """The --memory-job a plan was made with is recorded in it (estimate.search.memory_job), and simulate, explain
    and compare apply it: they report the per-stage memory the plan was fitted to, Sailor's job's (which the stages
    must fit by Sailor's own measured terms, checked above); before, compare and explain priced the plan without
    it and showed a third less memory than the plan and its summary did."""
    from hetauto_megatron.cli import main
    path = _plan(tmp_path, "--memory-job", "sailor-deepspeed")
    plan = load_plan(path)
    assert plan.estimate["search"]["memory_job"] == "sailor-deepspeed"
    planned = [s["memory_gib"] for s in plan.estimate["stages"]]
    model = "examples/peers/models/opt-350m.yaml"
    inventory = "examples/peers/inventory-same-zone.yaml"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        capsys.readouterr()
        assert main(["simulate", "--plan", path, "--model", model, "--inventory", inventory, "--json"]) == 0
        simulated = [s["memory_gib"] for s in json.loads(capsys.readouterr().out)["stages"]]
        assert main(["explain", "--plan", path, "--no-search", "--json"]) == 0
        explained = [m["memory_gib"] for m in json.loads(capsys.readouterr().out)["memory"]]
        assert main(["compare", path, "--json"]) == 0
        compared = json.loads(capsys.readouterr().out)["plans"][0]
    finally:
        os.chdir(cwd)
    assert simulated == pytest.approx(planned, abs=0.06) and explained == pytest.approx(planned, abs=0.06)
    # (compare's peak: the stage that fills the largest share of its device)
    assert min(abs(compared["peak_memory_gib"] - m) for m in planned) < 0.06 and compared["fits"] is True
    # the job is what binds: priced as our runtime alone holds memory, the stages need less
    assert main(["compare", path, "--json", "--inventory", os.path.join(ROOT, inventory)]) == 0
    assert compared["peak_memory_gib"] == json.loads(capsys.readouterr().out)["plans"][0]["peak_memory_gib"]
    plan.estimate["search"].pop("memory_job")
    plan.save(str(tmp_path / "without.yaml"))
    assert main(["compare", str(tmp_path / "without.yaml"), "--json"]) == 0
    # (by less than before: in fp32 our runtime's unfused attention holds its backward's s x s gradients too,
    # cost/activations.py TRANSFORMER_ENGINE_UNFUSED_ATTENTION_FP32; Sailor's job keeps its simulator's count)
    assert json.loads(capsys.readouterr().out)["plans"][0]["peak_memory_gib"] < compared["peak_memory_gib"]


# ---- fp32 GEMMs on TF32: the inventory's `tf32`, the peak, the learned model's coverage, the emitted switch --------
def test_tf32_cluster_key(tmp_path):
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.spec.inventory import inventory_from_dict, load_inventory
    inv = load_inventory(os.path.join(ROOT, "examples", "peers", "inventory-same-zone.yaml"))
    a100, v100 = inv.cluster("a100").device, inv.cluster("v100").device
    assert a100.tf32 and not v100.tf32
    fp32 = inv.with_precision("fp32")
    # the datasheets' dense TF32 tensor peak for the A100, the CUDA cores' FP32 for the V100 (no TF32)
    assert fp32.cluster("a100").device.peak_tflops == 156.0 and fp32.cluster("v100").device.peak_tflops == 15.7
    assert inv.with_precision("fp16").cluster("a100").device.peak_tflops == 312.0
    # plan files keep it, `false` included (the default is true), and write it only for devices that have TF32
    off = inv.to_dict()
    off["clusters"][0]["tf32"] = False
    again = inventory_from_dict(inventory_from_dict(off).to_dict())
    assert not again.cluster("a100").device.tf32 and again.to_dict()["clusters"][0]["tf32"] is False
    assert "tf32" not in again.to_dict()["clusters"][1]
    for device in ("v100-16gb", "cpu"):      # no TF32 tensor cores (a CPU process has none either)
        bad = {"clusters": [{"name": "v", "device": device, "nodes": 1, "devices_per_node": 4, "tf32": True}]}
        with pytest.raises(InputError) as exc:
            inventory_from_dict(bad, file="inv.yaml")
        assert exc.value.field == "clusters[0].tf32" and "TF32" in str(exc.value)
        assert "tf32" not in inventory_from_dict({**bad, "clusters": [{**bad["clusters"][0], "tf32": False}]}
                                                 ).to_dict()["clusters"][0]


def test_analytic_fp32_plans_name_the_packaged_measurements(capsys):
    """Without --cost-model an fp32 plan says which of its device types have measured layer times in its arithmetic
    shipped with hetauto (Sailor's runs: the A100-40's are TF32 runs, the V100-16's CUDA-core ones)."""
    from hetauto_megatron.commands._common import measured_layers_hint
    from hetauto_megatron.spec.inventory import inventory_from_dict, load_inventory
    inv = load_inventory(os.path.join(ROOT, "examples", "peers", "inventory-same-zone.yaml"))
    measured_layers_hint(inv.with_precision("fp32"))
    assert "a100-40gb, v100-16gb ship with hetauto" in capsys.readouterr().err
    d = inv.to_dict()
    d["clusters"][0]["tf32"] = False        # the A100s' CUDA cores: not what Sailor's A100 runs measured
    measured_layers_hint(inventory_from_dict(d).with_precision("fp32"))
    assert "of v100-16gb ship with hetauto" in capsys.readouterr().err


@pytest.fixture(scope="module")
def sailor_model(sailor_model_dir) -> str:
    """A learned cost model fitted to Sailor's measurements (hetauto fit --sailor; the session's, tests/conftest.py)."""
    return sailor_model_dir


def test_fp32_with_tf32_is_priced_from_sailors_tensor_core_runs(tmp_path, sailor_model):
    """Sailor's A100-40 runs that beat the FP32 CUDA-core peak are its fp32 jobs with TF32 GEMMs: an fp32 plan on a
    `tf32` cluster is priced from them (OPT-350 at TP 1 within 10 % of the measured layer), a plain fp32 plan is
    not (analytic, saying why), and the launch script sets PyTorch's TF32 switch as priced."""
    import dataclasses
    import statistics
    from hetauto_megatron.cost.learned import SAILOR_MODELS, LearnedCostModel
    from hetauto_megatron.spec.devices import get_device
    m = LearnedCostModel(sailor_model)
    # priced from Sailor's fp32 measurements, the plan also fits as Sailor's job without being asked
    _assert_fits_as_sailors_job(_plan(tmp_path, "--cost-model", sailor_model))
    tf32 = dataclasses.replace(get_device("a100-40gb"), tf32=True).at_precision("fp32")
    plain = dataclasses.replace(get_device("a100-40gb"), tf32=False).at_precision("fp32")
    info, why = m.coverage(tf32)
    assert info is not None and "TF32" in why
    assert m.coverage(plain)[0] is None
    with open(os.path.join(DATA, "profiles_tmp.json")) as f:
        layers = json.load(f)["OPT-350"]["A100-40"]["2"]["1"]
    measured = statistics.median(layers[str(i)][0] + layers[str(i)][1] for i in range(1, 25))
    predicted = sum(m.layer_times(SAILOR_MODELS["OPT-350"], tf32, 1, 2))
    assert abs(predicted / measured - 1) < 0.10, (predicted, measured)
    # the head (no per-layer data: analytic) is the fp32 job's, at the TF32 rate, even after a bf16 plan asked: its
    # logits GEMMs at half the bf16 rate (156 against 312 TFLOP/s), its loss 40 bytes per logit against bf16's 52 (the
    # casts to and from fp32: cost/analytic.py LOSS_BYTES), about 1.35x; the bf16 answer served again would be 1x
    bf16 = get_device("a100-40gb").at_precision("bf16")
    opt = SAILOR_MODELS["OPT-350"]
    assert sum(m.head_times(opt, tf32, 1, 2)) > 1.25 * sum(m.head_times(opt, bf16, 1, 2))
    # the emitted launch turns TF32 on where the plan priced it, off elsewhere
    _plan(tmp_path, "--emit", str(tmp_path / "launch"))
    a100 = (tmp_path / "launch" / "a100.sh").read_text()
    v100 = (tmp_path / "launch" / "v100.sh").read_text()
    assert "export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1" in a100 and "export NVIDIA_TF32_OVERRIDE=0" in v100
    assert "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE" not in v100 and "NVIDIA_TF32_OVERRIDE" not in a100


def test_simulate_and_compare_give_one_fits_verdict(tmp_path, capsys, sailor_model):
    """The memory job is the plan's, decided at its precision by every command (plan/memory_fit.py
    resolve_memory_job): the same-zone inventory with a plain-fp32 A100 (priced analytically) beside the V100
    (priced from Sailor's fp32 measurements), and an fp32 plan of GPT-Neo-2.7B on the A100s alone at TP 2 x DP 8.
    Under our runtime its stage fits the 40 GiB (24.5 GiB: the distributed optimizer shards Adam's state); as
    Sailor's job (its 24 bytes per parameter on every rank) it does not (45.1 GiB). `simulate` (with or without
    --precision) and `compare` must all say so."""
    import yaml
    from hetauto_megatron.cli import main
    from hetauto_megatron.plan.plan import Mesh, Plan
    from hetauto_megatron.spec.inventory import inventory_from_dict, load_inventory
    inv = load_inventory(os.path.join(ROOT, "examples", "peers", "inventory-same-zone.yaml")).to_dict()
    for c in inv["clusters"]:
        c["tf32"] = False
    inv = inventory_from_dict(inv)
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(yaml.safe_dump(inv.to_dict()))
    model_path = os.path.join(ROOT, "examples", "peers", "models", "gpt-neo-2.7b.yaml")
    plan = Plan(load_model(model_path), 1024, (Mesh("a100", "a100-40gb", 2, 8, 1, "none", (32,)),), inv.to_dict(),
                precision="fp32")
    plan_path = str(tmp_path / "plan.yaml")
    plan.save(plan_path)
    verdicts = {}
    simulate = ["simulate", "--model", model_path, "--inventory", str(inv_path), "--plan", plan_path]
    for name, cmd in (("simulate", simulate), ("simulate --precision fp32", [*simulate, "--precision", "fp32"]),
                      ("compare", ["compare", plan_path])):
        capsys.readouterr()
        assert main([*cmd, "--cost-model", sailor_model, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        verdicts[name] = out["fits"] if cmd[0] == "simulate" else out["plans"][0]["fits"]
    # analytic model (no Sailor data): our runtime alone, which fits
    assert main(["compare", plan_path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plans"][0]["fits"] is True
    assert verdicts == {"simulate": False, "simulate --precision fp32": False, "compare": False}
