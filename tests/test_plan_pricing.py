"""What the planner prices is what runs: the runtime settings, the training precision, the iteration tail.

Each prediction is held against a published formula or a first-principles bound computed here from the
inventory's own numbers, never against the pricing code itself.
"""
import json

import pytest
import yaml
from helpers import ROOT, run_hetauto

from hetauto_megatron.cost.activations import layer_activation_bytes
from hetauto_megatron.plan.plan import Mesh, Plan, load_plan, plan_from_dict
from hetauto_megatron.plan.simulate import simulate
from hetauto_megatron.spec.inventory import inventory_from_dict
from hetauto_megatron.spec.model import ModelSpec, PRESETS

INV2 = f"{ROOT}/examples/llama/inventory-2clusters.yaml"


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_activations_follow_korthikanti_table_2(t):
    """Korthikanti et al. 2022, Table 2, per layer at 16-bit activations, the attention-score terms (5as/h) left
    out because flash attention stores none: no parallelism 34sbh, tensor parallel sbh(10 + 24/t), tensor +
    sequence parallel 34sbh/t; full recomputation keeps the layer input, 2sbh (2sbh/t with SP). The paper counts
    hidden dropout (two 1-byte masks, 2sbh of the 34sbh); without it (the plan's default) 32sbh."""
    s, b, h = 2048, 1, 4096
    gpt = ModelSpec(name="gpt", num_layers=1, hidden_size=h, num_attention_heads=32, ffn_hidden_size=4 * h,
                    vocab_size=51200, seq_length=s, gated_mlp=False)
    sbh = s * b * h
    paper = dict(hidden_dropout=0.1, attention_dropout=0.1)    # flash attention keeps no attention-dropout mask
    assert layer_activation_bytes(gpt, t, b, "none", sequence_parallel=False, **paper) == \
        pytest.approx(sbh * (10 + 24 / t))
    assert layer_activation_bytes(gpt, t, b, "none", sequence_parallel=True, **paper) == pytest.approx(34 * sbh / t)
    assert layer_activation_bytes(gpt, t, b, "none", sequence_parallel=True) == pytest.approx(32 * sbh / t)
    assert layer_activation_bytes(gpt, t, b, "full", sequence_parallel=False) == pytest.approx(2 * sbh)
    assert layer_activation_bytes(gpt, t, b, "full", sequence_parallel=True) == pytest.approx(2 * sbh / t)


def _inv(link_gbps=25.0, latency_ms=2.0):
    return inventory_from_dict({"clusters": [
        {"name": "a", "device": "h800", "nodes": 2, "devices_per_node": 8,
         "inter_node": {"bandwidth_gbps": 400, "latency_us": 10}},
        {"name": "b", "device": "h800", "nodes": 2, "devices_per_node": 8,
         "inter_node": {"bandwidth_gbps": 400, "latency_us": 10}}],
        "links": [{"between": ["a", "b"], "bandwidth_gbps": link_gbps, "latency_ms": latency_ms}]})


def _two_mesh_plan(model, overrides=()):
    return Plan(model, 64, (Mesh("a", "h800", 8, 2, 1, "selective", (8,), dict(overrides)),
                            Mesh("b", "h800", 8, 2, 1, "selective", (8,), dict(overrides))))


def test_tied_embeddings_across_clusters_cost_the_table_twice_over_the_link():
    """Tied input and output embeddings in two clusters: their gradients are summed shard to shard between the
    owners, the whole table once in each direction of the (full-duplex) 25 Gbit/s link in the fp32 gradient
    dtype, so the iteration is longer by at least 4 bytes x (padded vocab x hidden) / link bandwidth than the
    same plan untied (which has more parameters, not fewer)."""
    m = PRESETS["llama2-7b"].replace(num_layers=16)
    inv = _inv()
    tied, untied = (simulate(_two_mesh_plan(m.replace(tie_embeddings=x)), inv) for x in (True, False))
    table = 4 * 32768 * m.hidden_size          # vocab 32000 padded to 128 x 8 = 1024 multiple
    bound = table / (25e9 / 8)
    assert tied.sync_s >= bound
    assert tied.iteration_time_s - untied.iteration_time_s >= bound * 0.95


def test_gradient_reduction_is_exposed_without_overlap():
    """Without overlap_grad_reduce the DP reduce-scatter waits for the backward pass: the exposed DP time is at
    least the ring's bandwidth term for one stage's fp32 gradients, (n-1)/n x bytes / per-rank bandwidth, with
    the inventory's numbers (DP 2 over the 400 Gbit/s inter-node network: TP 8 fills a node)."""
    m = PRESETS["llama2-7b"].replace(num_layers=16)
    inv = _inv()
    off = simulate(_two_mesh_plan(m, {"overlap_grad_reduce": False, "overlap_param_gather": False}), inv)
    on = simulate(_two_mesh_plan(m), inv)
    params_per_rank = 8 * m.layer_params / 8   # 8 layers, TP 8 (a lower bound: embedding and norms left out)
    ring = (2 - 1) / 2 * 4 * params_per_rank / (400e9 / 8)
    assert off.dp_exposed_s >= ring
    assert on.dp_exposed_s < off.dp_exposed_s
    assert on.iteration_time_s < off.iteration_time_s


def test_precision_is_an_input_stored_and_emitted(tmp_path):
    out = tmp_path / "fp32.yaml"
    inv_path = tmp_path / "inv.yaml"
    # tf32: false, the CUDA cores' FP32 (test_fp32_runs_on_tf32_unless_the_inventory_says_not: the default)
    inv_path.write_text(yaml.safe_dump({"clusters": [
        {"name": "h", "device": "h800", "nodes": 2, "devices_per_node": 8, "tf32": False},
        {"name": "a", "device": "a100-80gb", "nodes": 2, "devices_per_node": 8, "tf32": False}],
        "links": [{"between": ["h", "a"], "bandwidth_gbps": 100, "latency_ms": 1}]}))
    r = run_hetauto("plan", "--model", "llama2-7b", "--inventory", str(inv_path), "--global-batch-size", "64",
                    "--precision", "fp32", "-o", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load(out.read_text())
    assert data["precision"] == "fp32" and data["version"] == 4
    r = run_hetauto("emit", "megatron", "--plan", str(out), "--json")
    args = [a for la in json.loads(r.stdout)["launches"] for v in la["megatron_args"].values() for a in v]
    assert "--bf16" not in args and "--fp16" not in args
    # simulate --precision: the same plan at another precision (what-if); bf16 on the tensor cores is faster
    times = {}
    for p in ("fp32", "bf16"):
        r = run_hetauto("simulate", "--model", "llama2-7b", "--inventory", str(inv_path), "--plan", str(out),
                        "--precision", p, "--json")
        assert r.returncode == 0, r.stderr
        times[p] = json.loads(r.stdout)["iteration_time_s"]
    assert times["bf16"] < times["fp32"] / 3
    # fp8 only where the device has it: the Ascend 910B has none
    r = run_hetauto("plan", "--model", "llama2-7b", "--inventory", INV2, "--precision", "fp8")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "ascend-910b" in r.stderr and "cannot train in fp8" in r.stderr and "bf16, fp16" in r.stderr
    # fp32 runs at the non-tensor-core peak: the same plan is slower than in bf16
    plan = plan_from_dict(data)
    inv = inventory_from_dict(yaml.safe_load(inv_path.read_text()))
    fp32, bf16 = simulate(plan, inv), simulate(Plan(plan.model, plan.global_batch_size, plan.meshes), inv)
    assert fp32.iteration_time_s > 3 * bf16.iteration_time_s
    assert max(fp32.memory_gib) > max(bf16.memory_gib)


def test_fp32_runs_on_tf32_unless_the_inventory_says_not(tmp_path):
    """Transformer Engine computes Megatron's fp32 GEMMs with CUBLAS_COMPUTE_32F_FAST_TF32 whatever PyTorch's switch
    (transformer_engine/common/gemm/cublaslt_gemm.cu): an fp32 plan on a device with TF32 tensor cores is priced at
    their peak by default, and its launch turns PyTorch's switch on for the matmuls outside Transformer Engine.
    `tf32: false` prices the CUDA cores' FP32 and launches with NVIDIA_TF32_OVERRIDE=0, which turns TF32 off in
    every NVIDIA library. Version-3 plan files keep what they meant: no `tf32` was no TF32."""
    from hetauto_megatron.emit.deepspeed import deepspeed_config
    from hetauto_megatron.plan.plan_file import plan_to_dict
    inv = {"clusters": [{"name": "a", "device": "a100-80gb", "nodes": 1, "devices_per_node": 8},
                        {"name": "v", "device": "v100", "nodes": 1, "devices_per_node": 8}],
           "links": [{"between": ["a", "v"], "bandwidth_gbps": 100, "latency_ms": 1}]}
    default = inventory_from_dict(inv)
    off = inventory_from_dict({**inv, "clusters": [{**inv["clusters"][0], "tf32": False}, inv["clusters"][1]]})
    assert default.cluster("a").device.tf32 and not off.cluster("a").device.tf32
    assert not default.cluster("v").device.tf32          # a V100 has no TF32: its FP32 CUDA cores either way
    assert default.with_precision("fp32").cluster("a").device.peak_tflops == 156.0
    assert off.with_precision("fp32").cluster("a").device.peak_tflops == 19.5
    assert default.to_dict()["clusters"][0]["tf32"] is True and "tf32" not in default.to_dict()["clusters"][1]
    model = PRESETS["llama2-7b"]
    meshes = (Mesh("a", "a100-80gb", 4, 2, 1, "full", (32,)),)
    times = {}
    for name, i in (("tf32", default), ("cuda cores", off)):
        plan = Plan(model, 64, meshes, i.to_dict(), precision="fp32")
        times[name] = simulate(plan, i).iteration_time_s
        path = tmp_path / f"{name}.yaml"
        plan.save(str(path))
        r = run_hetauto("emit", "megatron", "--plan", str(path), "--json")
        env = json.loads(r.stdout)["launches"][0]["env"]
        # (=0 would do nothing: PyTorch reads it only to force TF32 on; the hook sets its switch either way)
        assert env.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == ("1" if name == "tf32" else None)
        assert env.get("NVIDIA_TF32_OVERRIDE") == (None if name == "tf32" else "0")
        # DeepSpeed's layers are torch's: the config says which, the runtime sets PyTorch's switch from it
        assert deepspeed_config(plan, 0)["hetauto"]["tf32"] is (name == "tf32")
    bf16 = simulate(Plan(model, 64, meshes, default.to_dict(), precision="fp16"), default).iteration_time_s
    assert bf16 < times["tf32"] < times["cuda cores"] / 3       # (fp16 here: the V100 has no bf16)
    # a version-3 file without `tf32` was priced without TF32, and reads so
    old = plan_to_dict(Plan(model, 64, meshes, inv, precision="fp32"))
    old["version"] = 3
    assert not inventory_from_dict(plan_from_dict(old).inventory).cluster("a").device.tf32
    saved = tmp_path / "resaved.yaml"
    plan_from_dict(old).save(str(saved))          # written as version 4, `tf32: false` spelled out
    assert not inventory_from_dict(load_plan(str(saved)).inventory).cluster("a").device.tf32
    old["version"] = 4
    assert inventory_from_dict(plan_from_dict(old).inventory).cluster("a").device.tf32
    # without a stored inventory: a version-3 plan launched without TF32, a version-4 one with its devices' default
    from hetauto_megatron.emit.vendor_env import fp32_tf32
    bare = {k: v for k, v in old.items() if k != "inventory"}
    assert fp32_tf32(plan_from_dict(bare), "a") and not fp32_tf32(plan_from_dict({**bare, "version": 3}), "a")


def test_version_1_plans_read_as_bf16():
    d = yaml.safe_load(open(f"{ROOT}/examples/llama/plans/tiny-2clusters-cpu.yaml"))
    assert d["version"] == 1 and "precision" not in d
    assert plan_from_dict(d).precision == "bf16"


def test_fp8_plan_emits_transformer_engine_flags():
    d = {"version": 2, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "precision": "fp8",
         "meshes": [{"cluster": "h", "device_type": "h100-sxm", "tp": 1, "dp": 8, "micro_batch_size": 1,
                     "stage_layers": [8]}]}
    from hetauto_megatron.emit.megatron import megatron_args
    args = megatron_args(plan_from_dict(d), 0, "p.yaml")
    assert "--fp8-format hybrid" in " ".join(args) and "--transformer-impl transformer_engine" in " ".join(args)


def test_simulate_table_shows_the_inventorys_memory(tmp_path):
    """An inventory that gives its H800s 64 GiB (not the catalog's 80): the table says / 64."""
    inv = yaml.safe_load(open(INV2))
    inv["clusters"][0]["memory_gib"] = 64
    p = tmp_path / "inv.yaml"
    p.write_text(yaml.safe_dump(inv))
    r = run_hetauto("simulate", "--model", "llama2-7b", "--inventory", str(p), "--tp", "8", "--pp", "2", "--dp",
                    "4", "--micro-batch-size", "1", "--global-batch-size", "64", "--cluster", "h800")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if " h800 " in line]
    assert rows and all("/ 64" in line and "/ 80" not in line for line in rows), r.stdout


def test_sequence_parallel_off_costs_memory_and_time():
    """The same plan with sequence parallelism switched off in both meshes: every TP rank holds the replicated
    10sbh per layer and micro-batch in flight (Korthikanti's Table 2), and repeats the element-wise work."""
    m = PRESETS["llama2-7b"].replace(num_layers=16)
    inv = _inv()
    on = simulate(_two_mesh_plan(m), inv)
    off = simulate(_two_mesh_plan(m, {"sequence_parallel": False}), inv)
    sbh = m.seq_length * 1 * m.hidden_size
    # stage 0 holds 2 micro-batches in flight; the replicated part of a layer without dropout (the default) is the
    # two norms' inputs and outputs less, under 'selective', the second norm's output (Transformer Engine's layers
    # recompute it with the MLP: tests/test_memory_te_layers.py), 3 sbh at 2 bytes, of which SP keeps 1/8
    extra = 2 * 8 * 3 * 2 * sbh * (1 - 1 / 8)
    assert (off.memory_gib[0] - on.memory_gib[0]) * 1024 ** 3 >= 0.99 * extra
    assert off.stages[0]["forward_s"] > on.stages[0]["forward_s"]


def test_measured_overheads_from_the_inventory_replace_the_vendor_estimates(tmp_path):
    """A cluster's `overheads:` (the file `hetauto profile --overheads` writes, or the figures inline) is what the
    memory model reserves on its devices: the fixed GiB plus fragmentation x the priced bytes, instead of the
    vendor's estimates (NVIDIA: 3 GiB fixed, no fragmentation). A figure the measurement left out (comm_gib null:
    one rank) keeps the vendor's; a file measured on another device type is refused (exit 2)."""
    m = PRESETS["llama2-7b"].replace(num_layers=16)
    measured = {"vendor": "nvidia", "device": "NVIDIA H800", "device_type": "h800", "context_gib": 0.5,
                "workspace_gib": 0.25, "comm_gib": None, "fragmentation": 0.05}
    (tmp_path / "overheads-h800.json").write_text(json.dumps(measured))
    raw = {"clusters": [
        {"name": "a", "device": "h800", "nodes": 2, "devices_per_node": 8, "overheads": "overheads-h800.json"},
        {"name": "b", "device": "h800", "nodes": 2, "devices_per_node": 8,
         "overheads": {"context_gib": 1.0, "comm_gib": 2.0, "workspace_gib": 1.0}}],
        "links": [{"between": ["a", "b"], "bandwidth_gbps": 25, "latency_ms": 2}]}
    inv = inventory_from_dict(raw, file=str(tmp_path / "inv.yaml"))
    base = simulate(_two_mesh_plan(m), _inv())
    est = simulate(_two_mesh_plan(m), inv)
    for i, (fixed, frag) in enumerate(((0.5 + 1.5 + 0.25, 0.05), (4.0, 0.0))):
        tensors = base.memory_gib[i] - 3.0                    # the vendor's estimate: 3 GiB fixed, no fragmentation
        assert est.memory_gib[i] == pytest.approx(tensors * (1 + frag) + fixed, rel=1e-9), (i, est.memory_gib)
    # a plan carries its inventory's figures, not the path (Inventory.to_dict)
    assert [c.overhead for c in inventory_from_dict(inv.to_dict()).clusters] == [c.overhead for c in inv.clusters]
    measured["device_type"] = "a100-80"
    (tmp_path / "overheads-h800.json").write_text(json.dumps(measured))
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(raw))
    r = run_hetauto("simulate", "--model", "llama2-7b", "--inventory", str(tmp_path / "inv.yaml"), "--tp", "8",
                    "--pp", "2", "--dp", "2", "--micro-batch-size", "1", "--global-batch-size", "64")
    assert r.returncode == 2 and "clusters[0].overheads" in r.stderr and "a100-80" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
