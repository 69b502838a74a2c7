"""Recompute "selective" (the MLP re-run, plan/mesh.py RECOMPUTE_SETTINGS) for models with linear biases: Megatron-Core
0.19 cannot run it (plan/engines.py selective_runs), so no plan asks for it. The defect itself is shown on Megatron's
own MLP and checkpoint, the way TransformerLayer._forward_mlp calls them; if a Megatron release fixes it, the first
test fails and the refusal can go."""
from __future__ import annotations

import json

import pytest
import yaml

from hetauto_megatron.cli import main
from hetauto_megatron.plan.engines import selective_runs
from hetauto_megatron.spec.model import PRESETS, ModelSpec

# Megatron's MLP with and without biases, checkpointed as TransformerLayer checkpoints it under
# recompute_modules ["mlp"] (a one-rank gloo world: the layers need their TP group)
PROBE = r"""  # after helpers.ONE_RANK_PROBE
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig
out = {}
for bias in (False, True):
    cfg = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32,
                            add_bias_linear=bias, activation_func=F.gelu, use_cpu_initialization=True,
                            bias_activation_fusion=False, gradient_accumulation_fusion=False)
    mlp = MLP(cfg, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear))
    x = torch.randn(4, 2, 16, requires_grad=True)
    y, b = tensor_parallel.checkpoint(mlp, False, x)
    p = mlp.linear_fc2.bias
    row = {"bias_is_output": b is not None and b is p, "bias_still_a_leaf": None if p is None else p.is_leaf}
    if p is None:           # (with the bias the backward re-enters the checkpoint without end: not run)
        y.sum().backward()
        row["backward_done"] = x.grad is not None and all(q.grad is not None for q in mlp.parameters())
    out[str(bias)] = row
print(json.dumps(out), flush=True)
dist.destroy_process_group()      # as hetauto's ranks end (see test_megatron_statistics.py)
"""

GPT = {"name": "tiny-gpt", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 256,
       "vocab_size": 128, "seq_length": 32, "gated_mlp": False, "position_embedding": "learned",
       "max_position_embeddings": 32}


def test_megatrons_checkpointed_mlp_takes_over_its_bias_parameter(tmp_path):
    from helpers import run_one_rank_probe
    rows = run_one_rank_probe(tmp_path, PROBE)
    # without biases the checkpointed MLP trains; with them the output projection's bias parameter is returned
    # through the checkpoint and autograd re-bases it: no longer a leaf, so the backward re-enters the checkpoint
    assert rows["False"] == {"bias_is_output": False, "bias_still_a_leaf": None, "backward_done": True}
    assert rows["True"] == {"bias_is_output": True, "bias_still_a_leaf": False}
    assert not selective_runs(ModelSpec(**GPT)) and selective_runs(PRESETS["llama2-7b"])
    # the rule is the biases, not the MLP kind: a plain GeLU MLP without them (Falcon's) trains, as measured above
    assert selective_runs(ModelSpec(**GPT, linear_biases=False))
    assert selective_runs(ModelSpec(**GPT), "deepspeed")      # DeepSpeed's engine runs it as full


def _plan_file(tmp_path, recompute: str) -> str:
    path = tmp_path / f"{recompute}.yaml"
    path.write_text(yaml.safe_dump({
        "version": 2, "model": GPT, "global_batch_size": 8,
        "meshes": [{"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 2,
                    "recompute": recompute, "stage_layers": [4]}]}))
    return str(path)


def test_a_plan_asking_for_it_is_refused_before_anything_runs(tmp_path, capsys):
    path = _plan_file(tmp_path, "selective")
    assert main(["dryrun", "--plan", path, "--tiny", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert path in err and "meshes[0].recompute" in err and "linear biases" in err and "write full" in err
    assert "Traceback" not in err
    assert main(["dryrun", "--plan", _plan_file(tmp_path, "full"), "--tiny", "--steps", "1"]) == 0   # full runs


def test_plan_refuses_the_pin_and_never_chooses_it(tmp_path, capsys):
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"clusters": [{"name": "a", "device": "a100-40gb", "nodes": 1,
                                                  "devices_per_node": 8}]}))
    model = tmp_path / "gpt.yaml"
    model.write_text(yaml.safe_dump({**GPT, "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                                     "ffn_hidden_size": 16384, "vocab_size": 50304, "seq_length": 2048,
                                     "max_position_embeddings": 2048}))
    base = ["plan", "--model", str(model), "--inventory", str(inv), "--global-batch-size", "64", "--quiet", "--json"]
    assert main(base + ["--recompute", "a=selective"]) == 2
    err = capsys.readouterr().err
    assert "--recompute" in err and "a=selective" in err and "a=full or none" in err
    # TP 1 and micro-batches of 8: the layers do not fit in 40 GB without recomputation (the plan chose
    # selective before; the job then hung in its first backward)
    assert main(base + ["--tp", "a=1", "--micro-batch-size", "8"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert {m["recompute"] for m in plan["meshes"]} <= {"none", "full"}
    assert any(m["recompute"] == "full" for m in plan["meshes"])


@pytest.mark.parametrize("gated", [True, False])
def test_the_search_space_holds_selective_only_where_it_runs(gated):
    from hetauto_megatron.plan.space import SearchSpace
    from hetauto_megatron.spec.inventory import inventory_from_dict
    from hetauto_megatron.cost.analytic import AnalyticCostModel
    model = ModelSpec(**{**GPT, "gated_mlp": gated})
    inv = inventory_from_dict({"clusters": [{"name": "a", "device": "a100-40gb", "nodes": 1,
                                             "devices_per_node": 8}]})
    space = SearchSpace(model, inv, 8, AnalyticCostModel())
    assert space.selective == gated


def _gpt_on_one_node(tmp_path):
    """(model file, inventory file): the GPT-family model and one node of 8 A100-40, as simulate reads them."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"clusters": [{"name": "a", "device": "a100-40gb", "nodes": 1,
                                                  "devices_per_node": 8}]}))
    model = tmp_path / "gpt.yaml"
    model.write_text(yaml.safe_dump(GPT))
    return model, inv


def test_simulate_names_its_recompute_flag(tmp_path, capsys):
    """simulate --recompute selective for a model with linear biases: the refusal names the flag it came from and
    a fix written as that flag, not the plan field (meshes[0].recompute) the layout became."""
    model, inv = _gpt_on_one_node(tmp_path)
    base = ["simulate", "--model", str(model), "--inventory", str(inv), "--tp", "1", "--pp", "1", "--dp", "8",
            "--micro-batch-size", "1", "--global-batch-size", "8"]
    assert main(base + ["--recompute", "selective"]) == 2
    err = capsys.readouterr().err
    assert "field '--recompute'" in err and "linear biases" in err and "--recompute full or none" in err, err
    assert "meshes[0]" not in err and "Traceback" not in err
    assert main(base + ["--recompute", "full"]) == 0


def test_simulate_prices_selective_under_deepspeed_as_it_runs(tmp_path, capsys):
    """DeepSpeed's pipeline engine runs "selective" as full, whatever the biases (selective_runs, and
    tests/test_memory_deepspeed.py counts every layer's forward run twice): `simulate --engine deepspeed --recompute
    selective` on this model is priced as full recomputation, the same iteration and memory; Megatron's engine
    still refuses it (above). Before, the layout's plan was built without the engine and refused with Megatron's
    reason."""
    model, inv = _gpt_on_one_node(tmp_path)
    base = ["simulate", "--model", str(model), "--inventory", str(inv), "--tp", "1", "--pp", "2", "--dp", "4",
            "--micro-batch-size", "1", "--global-batch-size", "8", "--engine", "deepspeed", "--json"]
    runs = {}
    for recompute in ("selective", "full"):
        assert main(base + ["--recompute", recompute]) == 0, capsys.readouterr().err
        out = capsys.readouterr()
        runs[recompute] = json.loads(out.out)
        # said, since the flag asked for another (the stage table's recompute column was all that told it)
        assert ("runs, and is priced, as full" in out.err) == (recompute == "selective"), out.err
    selective, full = runs["selective"], runs["full"]
    assert selective["engine"] == "deepspeed"
    assert [st["recompute"] for st in selective["stages"]] == ["full", "full"]
    for key in ("iteration_time_s", "memory_gib"):
        assert selective[key] == full[key], key
    assert main([a for a in base if a not in ("--engine", "deepspeed")] + ["--recompute", "selective"]) == 2
    assert "linear biases" in capsys.readouterr().err
