"""Megatron-LM flags that change how the plan's layers run (the kernels, the MLP's passes, the fp8 recipe, whether
anything trains) or add a collective over the world, against a plan: Megatron's own parser, validate_args, config
builder and source say what each flag makes Megatron run; the --hetauto rewrite must refuse by name what the plan
did not price, and the clusters must agree on a collective's flag."""
import inspect

import pytest
from helpers import parse_emitted, rank0_placement, transformer_config

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import rewrite
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.spec.model import PRESETS


def _plan(precision=None, tp=1):
    plan = {"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "meshes": [
        {"cluster": "a", "device_type": "h800", "tp": tp, "dp": 2, "micro_batch_size": 1, "recompute": "none",
         "stage_layers": [PRESETS["tiny"].num_layers]}]}
    if precision:
        plan["precision"] = precision
    return plan_from_dict(plan)


def _refused(monkeypatch, plan, extra, field):
    _, args = parse_emitted(monkeypatch, plan, extra)
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, rank0_placement(plan), file="plan.yaml")
    assert exc.value.exit_code == 2 and exc.value.field == field and exc.value.fix
    assert extra[0] in str(exc.value) and "the plan" in str(exc.value)
    return exc.value


def test_frozen_layers_are_refused(monkeypatch):
    """Megatron-LM's validate_args turns off the distributed optimizer and the parameter-gather overlap the rewrite
    set from the plan, and get_model freezes every parameter (training.py requires_grad_(False)):
    no weight gradients, DP reduction or optimizer step. Before: the rewrite let it through, the start-up log
    showing the plan's settings while Megatron ran others."""
    from megatron.training import training

    plan = _plan()
    assert plan.meshes[0].settings.distributed_optimizer and plan.meshes[0].settings.overlap_param_gather
    margs, args = parse_emitted(monkeypatch, plan, ["--freeze-all-layers"])
    margs.validate_args(args, {})
    assert args.freeze_all_layers and not args.use_distributed_optimizer and not args.overlap_param_gather
    assert "model_module.requires_grad_(False)" in inspect.getsource(training.get_model)
    _refused(monkeypatch, plan, ["--freeze-all-layers"], "--freeze-all-layers")


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8", "custom"])
def test_fp8_recipes_the_plan_does_not_price_are_refused(monkeypatch, recipe):
    """Megatron-Core's get_fp8_recipe builds Transformer Engine's current scaling, block scaling, MXFP8 (which
    Hopper cannot run) or a user's factory for these, where the plan prices delayed scaling's weight copies
    (cost/model_state.py). Before: each passed on an fp8 plan. The default, typed out, and the amax history's
    settings (a few numbers per GEMM) pass; outside fp8 plans Megatron builds no recipe and the flag passes."""
    from megatron.core import fp8_utils

    source = inspect.getsource(fp8_utils)
    assert "config.fp8_recipe == Fp8Recipe.delayed" in source and f"Fp8Recipe.{recipe}" in source
    fp8 = _plan("fp8", tp=2)
    error = _refused(monkeypatch, fp8, ["--fp8-recipe", recipe], "precision")
    assert "--fp8-recipe delayed" in str(error)
    for passes in (["--fp8-recipe", "delayed"], ["--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"]):
        margs, args = parse_emitted(monkeypatch, fp8, passes)
        rewrite.rewrite_args(args, fp8, rank0_placement(fp8))
        assert args.fp8 == "hybrid" and args.fp8_recipe == "delayed"
    bf16 = _plan()
    margs, args = parse_emitted(monkeypatch, bf16, ["--fp8-recipe", recipe])
    rewrite.rewrite_args(args, bf16, rank0_placement(bf16))
    margs.validate_args(args, {})
    assert args.fp8 is None and args.bf16


def test_batch_invariant_kernels_are_refused(monkeypatch):
    """Megatron-LM's initialize enables batch-invariant mode for the whole process: aten's mm, addmm, log-softmax
    and mean replaced by Triton kernels (core/transformer/custom_layers/batch_invariant_kernels.py), GEMM rates
    the plan does not price, as with --deterministic-mode. Before: the rewrite let it through."""
    from megatron.core.transformer.custom_layers import batch_invariant_kernels
    from megatron.training import initialize

    assert "enable_batch_invariant_mode()" in inspect.getsource(initialize)
    enable = inspect.getsource(batch_invariant_kernels.enable_batch_invariant_mode)
    assert '"aten::mm", mm_batch_invariant' in enable and '"aten::addmm", addmm_batch_invariant' in enable
    error = _refused(monkeypatch, _plan(), ["--batch-invariant-mode"], "--batch-invariant-mode")
    assert "Triton" in str(error)


def test_an_mlp_run_in_chunks_is_refused(monkeypatch):
    """Megatron-Core's TransformerLayer runs every MLP in training on N slices of the sequence and concatenates
    them (transformer_layer.py _forward_mlp): N times the GEMM launches and TP collectives the plan prices once.
    Before: the rewrite let it through; one chunk, Megatron's default typed out, passes."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    plan = _plan(tp=2)
    monkeypatch.setenv("WORLD_SIZE", "4")          # the mesh's ranks, as torchrun tells Megatron's parser
    margs, args = parse_emitted(monkeypatch, plan, ["--mlp-chunks-for-training", "4"])
    margs.validate_args(args, {})
    assert transformer_config(margs, args).mlp_chunks_for_training == 4
    forward = inspect.getsource(TransformerLayer)
    assert "self.config.mlp_chunks_for_training > 1" in forward and "outputs = [apply_module(self.mlp)(chunk)" \
        in forward
    _refused(monkeypatch, plan, ["--mlp-chunks-for-training", "4"], "--mlp-chunks-for-training")
    _, args = parse_emitted(monkeypatch, plan, ["--mlp-chunks-for-training", "1"])
    rewrite.rewrite_args(args, plan, rank0_placement(plan))


def test_the_energy_monitors_collective_is_compared_between_clusters(monkeypatch):
    """Megatron-Core's energy monitor all-reduces over the world at each logging iteration and at the end
    (core/energy_monitor.py lap, get_total, called from training.py under --log-energy): a cluster launched with it
    beside one without waits in that all-reduce until the timeout. Before: the clusters were not compared on it;
    now the first difference names the flag."""
    from megatron.core.energy_monitor import EnergyMonitor
    from megatron.training import training

    from hetauto_megatron.megatron.job_agreement import differences, job_values

    for method in (EnergyMonitor.lap, EnergyMonitor.get_total):
        assert "dist.all_reduce(" in inspect.getsource(method)
    assert "if args.log_energy:" in inspect.getsource(training.training_log)
    plan = _plan()
    _, plain = parse_emitted(monkeypatch, plan, [])
    _, energy = parse_emitted(monkeypatch, plan, ["--log-energy"])
    found = differences(plan, [job_values(plain), job_values(energy)])
    assert found and found[0].startswith("--log-energy: False on rank 0"), found
