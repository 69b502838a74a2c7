"""Megatron-LM's fused kernels turned off on a mesh of accelerators, against a plan. Megatron's own parser,
validate_args and config builder say what each --no-*-fusion flag makes it run; the --hetauto rewrite must refuse,
by name and naming the mesh, each one whose unfused path changes what the plan priced for that model and mesh
(megatron/fusion_args.py), and let through the ones Megatron runs the same either way and every one on a mesh of
CPU processes (which runs the unfused layers, as priced)."""
import importlib.util

import pytest
from helpers import parse_emitted, rank0_placement, transformer_config

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import fusion_args, launch_identity, rewrite
from hetauto_megatron.megatron.fusion_args import FUSIONS
from hetauto_megatron.plan.megatron_flags import CPU_LAYER_ARGS
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.spec.model import PRESETS

LLAMA = PRESETS["tiny"].to_dict()     # SwiGLU, RMSNorm, no linear biases, rotary positions
GPT = {"preset": "tiny", "position_embedding": "learned", "gated_mlp": False}     # GeLU with biases, learned


def _plan(model=LLAMA, device="h800", **settings):
    mesh = {"cluster": "a", "device_type": device, "tp": 1, "dp": 2, "micro_batch_size": 1, "stage_layers": [8]}
    if settings:
        mesh["settings"] = settings
    return plan_from_dict({"version": 4, "model": model, "global_batch_size": 8, "meshes": [mesh]})


def _megatron(monkeypatch, plan, extra):
    """Megatron's own reading of the emitted launch with `extra`, without the rewrite: its validated arguments and
    its transformer config."""
    margs, args = parse_emitted(monkeypatch, plan, extra)
    margs.validate_args(args, {})
    return args, transformer_config(margs, args)


def test_every_fusion_a_cpu_mesh_turns_off_is_judged_for_accelerator_meshes():
    """A fusion added to the CPU meshes' table (CPU_LAYER_ARGS) must say whether its flag, typed on an accelerator
    mesh, changes what the plan priced there: otherwise it would pass unjudged."""
    assert set(FUSIONS) == set(CPU_LAYER_ARGS) - {"transformer_impl"}


@pytest.mark.parametrize("model, settings, flag, attribute", [
    # Transformer Engine's linears read config.gradient_accumulation_fusion (fuse_wgrad_accumulation)
    (LLAMA, {}, "--no-gradient-accumulation-fusion", "gradient_accumulation_fusion"),
    # a gated MLP's fused kernel: config.bias_activation_fusion follows --no-bias-swiglu-fusion under --swiglu
    (LLAMA, {}, "--no-bias-swiglu-fusion", "bias_activation_fusion"),
    # a plain MLP with biases: config.bias_activation_fusion follows --no-bias-gelu-fusion
    (GPT, {}, "--no-bias-gelu-fusion", "bias_activation_fusion"),
    # the layers' bias-dropout-add on a mesh with a hidden dropout
    (LLAMA, {"hidden_dropout": 0.1}, "--no-bias-dropout-fusion", "bias_dropout_fusion"),
    (GPT, {}, "--no-bias-dropout-fusion", "bias_dropout_fusion"),
])
def test_a_fusion_turned_off_where_the_plan_priced_it_is_refused(monkeypatch, model, settings, flag, attribute):
    # as on an install with APEX's fused weight-gradient kernel (NVIDIA's containers); without it, below
    monkeypatch.setattr(fusion_args, "fused_accumulation_available", lambda: True)
    plan = _plan(model, **settings)
    _, fused = _megatron(monkeypatch, plan, [])
    _, unfused = _megatron(monkeypatch, plan, [flag])
    assert getattr(fused, attribute) is True and getattr(unfused, attribute) is False
    _, args = parse_emitted(monkeypatch, plan, [flag])
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, rank0_placement(plan), file="plan.yaml")
    assert exc.value.exit_code == 2 and exc.value.field == flag and flag in exc.value.fix
    assert f"turns off fused kernels that the plan priced on meshes[0] (h800): {flag} (" in exc.value.message


def test_the_unfused_rotary_embedding_is_refused_with_rotary_positions_only(monkeypatch):
    """Megatron's validate_args keeps the fused rotary embedding on with rotary positions (the layers then read
    apply_rope_fusion) and turns it off itself with learned ones: --no-rope-fusion is refused on the first, and runs
    what was priced on the second."""
    llama = _plan(LLAMA)
    assert _megatron(monkeypatch, llama, [])[0].apply_rope_fusion is True
    assert _megatron(monkeypatch, llama, ["--no-rope-fusion"])[0].apply_rope_fusion is False
    _, args = parse_emitted(monkeypatch, llama, ["--no-rope-fusion"])
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, llama, rank0_placement(llama))
    assert exc.value.field == "--no-rope-fusion"
    gpt = _plan(GPT)
    assert _megatron(monkeypatch, gpt, [])[0].apply_rope_fusion is False
    _accepted(monkeypatch, gpt, ["--no-rope-fusion"])


def _accepted(monkeypatch, plan, extra, rank=0):
    """The rank's launch as emitted (its mesh's flags), with `extra`, rewritten and validated."""
    placement = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(rank, plan.world_size, None), None)
    margs, args = parse_emitted(monkeypatch, plan, extra, placement.mesh_index)
    rewrite.rewrite_args(args, plan, placement)
    margs.validate_args(args, {})
    return args


def test_fusion_flags_megatron_runs_the_same_either_way_pass(monkeypatch):
    """On a gated MLP Megatron's config takes its activation fusion from --no-bias-swiglu-fusion, never from the GeLU
    one; Megatron's validate_args turns the GeLU fusion off itself without biases. Both run what the plan priced."""
    llama = _plan(LLAMA)
    assert _megatron(monkeypatch, llama, ["--no-bias-gelu-fusion"])[1].bias_activation_fusion is True
    _accepted(monkeypatch, llama, ["--no-bias-gelu-fusion"])
    gelu_without_biases = _plan({**GPT, "linear_biases": False})
    args, config = _megatron(monkeypatch, gelu_without_biases, [])
    assert args.bias_gelu_fusion is False and config.bias_activation_fusion is False
    _accepted(monkeypatch, gelu_without_biases, ["--no-bias-gelu-fusion"])


def test_the_unfused_bias_dropout_add_without_bias_or_dropout_is_the_one_add_priced(monkeypatch):
    """Megatron's unfused bias-dropout-add, with no bias (the plan's model has none) and the mesh's hidden dropout of
    0, is one residual add, as fused: --no-bias-dropout-fusion passes there. With a bias it adds more kernels."""
    import torch
    from megatron.core.fusions.fused_bias_dropout import bias_dropout_add_unfused

    x, residual = torch.ones(2, 3, requires_grad=True), torch.ones(2, 3, requires_grad=True)
    out = bias_dropout_add_unfused(True)((x, None), residual, 0.0)
    assert type(out.grad_fn).__name__ == "AddBackward0"
    assert {type(f).__name__ for f, _ in out.grad_fn.next_functions} == {"AccumulateGrad"}
    biased = bias_dropout_add_unfused(True)((x, torch.ones(3, requires_grad=True)), residual, 0.0)
    assert any(type(f).__name__ != "AccumulateGrad" for f, _ in biased.grad_fn.next_functions)
    plan = _plan(LLAMA)
    args, config = _megatron(monkeypatch, plan, ["--no-bias-dropout-fusion"])
    assert config.hidden_dropout == 0.0 and not config.add_bias_linear and not config.bias_dropout_fusion
    _accepted(monkeypatch, plan, ["--no-bias-dropout-fusion"])


def test_fusions_only_megatrons_local_layers_read_pass_on_accelerator_meshes(monkeypatch):
    """--no-masked-softmax-fusion and --no-persist-layer-norm are read by Megatron's local attention and APEX
    LayerNorm alone; Transformer Engine's layers, which an accelerator mesh builds, never read them."""
    def source(module):
        with open(importlib.util.find_spec(module).origin) as fh:
            return fh.read()
    te = source("megatron.core.extensions.transformer_engine")
    assert "masked_softmax_fusion" not in te and "persist_layer_norm" not in te
    assert "self.config.masked_softmax_fusion" in source("megatron.core.transformer.dot_product_attention")
    assert "self.config.persist_layer_norm" in source("megatron.core.fusions.fused_layer_norm")
    args = _accepted(monkeypatch, _plan(), ["--no-masked-softmax-fusion", "--no-persist-layer-norm"])
    assert args.masked_softmax_fusion is False and args.no_persist_layer_norm is True


def test_every_fusion_flag_runs_on_a_mesh_of_cpu_processes_and_is_judged_per_mesh(monkeypatch):
    """A CPU mesh runs the unfused layers its plan priced (the rewrite sets them whatever the launch says); beside it
    an accelerator mesh of the same plan refuses the flag on its own ranks, naming that mesh."""
    flags = [CPU_LAYER_ARGS[dest][0] for dest in FUSIONS]
    both = plan_from_dict({"version": 4, "model": LLAMA, "global_batch_size": 8, "meshes": [
        {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 1, "micro_batch_size": 1, "stage_layers": [4]},
        {"cluster": "b", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 1, "stage_layers": [4]}]})
    args = _accepted(monkeypatch, both, flags, rank=1)
    assert args.transformer_impl == "local" and args.gradient_accumulation_fusion is False
    monkeypatch.setattr(fusion_args, "fused_accumulation_available", lambda: True)     # an install with APEX's kernel
    _, args = parse_emitted(monkeypatch, both, ["--no-gradient-accumulation-fusion"])
    with pytest.raises(InputError, match=r"on meshes\[0\] \(h800\): --no-gradient-accumulation-fusion"):
        rewrite.rewrite_args(args, both, rank0_placement(both))


def test_without_apexs_kernel_the_gradient_accumulation_runs_unfused(monkeypatch):
    """Megatron-Core's ColumnParallelLinear (the output layer, under Transformer Engine's layers too) raises at build
    time when the fusion is on without APEX's fused_weight_gradient_mlp_cuda, as on this install: such a launch can
    only run the unfused accumulation, so --no-gradient-accumulation-fusion passes there and the rewrite turns the
    fusion off where the launch left it on (before, every rank stopped with Megatron's RuntimeError, and typing the
    flag was refused)."""
    import megatron.core.tensor_parallel.layers as layers
    assert fusion_args.fused_accumulation_available() is layers._grad_accum_fusion_available is False
    plan = _plan(LLAMA)
    assert _accepted(monkeypatch, plan, ["--no-gradient-accumulation-fusion"]).gradient_accumulation_fusion is False
    margs, args = parse_emitted(monkeypatch, plan, [])
    assert args.gradient_accumulation_fusion is True          # Megatron-LM's default, which could not build here
    changed = rewrite.rewrite_args(args, plan, rank0_placement(plan))
    assert changed["gradient_accumulation_fusion"] == (True, False)


def test_transformer_engines_activation_on_a_swiglu_plan_is_refused_in_one_paragraph_before_the_join(monkeypatch):
    """--use-te-activation-func passes the rewrite and Megatron-LM's validate_args on a SwiGLU plan of accelerators,
    and Megatron-Core's TransformerConfig then refuses it beside the fused bias-SwiGLU the plan prices (a ValueError
    that NVIDIA's pretrain_gpt.py met in pretrain(), after the join, as a traceback on every rank). The hook builds
    that config right after validate_args: one paragraph naming the flag and its removal, exit 2. A launch without
    it builds its config there as before."""
    import sys

    from hetauto_megatron.megatron.config_check import check_transformer_config
    plan = _plan(LLAMA)
    args = _accepted(monkeypatch, plan, ["--use-te-activation-func"])
    assert args.swiglu and args.bias_swiglu_fusion and args.use_te_activation_func
    margs = sys.modules["megatron.training.arguments"]
    with pytest.raises(ValueError, match="bias_activation_fusion and use_te_activation_func cannot be both true"):
        transformer_config(margs, args)                  # Megatron's own builder, as pretrain() calls it
    # this machine lacks Transformer Engine, whose fused rotary embedding the config would refuse too (helpers.py)
    args.apply_rope_fusion = False
    with pytest.raises(InputError) as exc:
        check_transformer_config(args, plan, sys.argv[1:], file="plan.yaml")
    err = exc.value
    assert err.exit_code == 2 and err.field == "--use-te-activation-func" and "\n" not in err.message
    assert "remove --use-te-activation-func" in err.fix and "fused bias-SwiGLU" in err.message
    assert "cannot be both true" in err.message
    args = _accepted(monkeypatch, plan, [])
    args.apply_rope_fusion = False
    check_transformer_config(args, plan, sys.argv[1:], file="plan.yaml")
