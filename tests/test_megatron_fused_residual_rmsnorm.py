"""--fused-residual-rmsnorm against a plan, read from Megatron-Core 0.19's own source and spec functions: the flag
builds nothing in the layers the plan prices (so --hetauto runs it), and beside a LayerNorm model Megatron's
TransformerConfig stops every rank (so --hetauto refuses it there by name)."""
import dataclasses
import pathlib

import pytest
from helpers import parse_emitted, rank0_placement, transformer_config

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import rewrite
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.spec.model import PRESETS

FLAG = "--fused-residual-rmsnorm"


def _plan(gated=True):
    # tiny is a gated (LLaMA) model: RMSNorm; without its gated MLP, a GPT model: LayerNorm
    model = dataclasses.replace(PRESETS["tiny"], gated_mlp=gated)
    return plan_from_dict({"version": 4, "model": model.to_dict(), "global_batch_size": 8, "meshes": [
        {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 2, "micro_batch_size": 1, "recompute": "none",
         "stage_layers": [model.num_layers]}]})


def test_only_transformer_engines_residual_norm_reads_the_flag():
    """Megatron-Core reads fused_residual_rmsnorm in its config's check and in TENorm alone, which builds the fused
    norm only for a norm built with has_residual: the final norm (LayerNormImpl) and the local spec's norms (the
    dry runs') never read it. A later Megatron-Core that reads it elsewhere fails here, to be judged again."""
    import megatron.core
    core = pathlib.Path(megatron.core.__file__).parent
    readers = sorted(str(p.relative_to(core)) for p in core.rglob("*.py") if "fused_residual_rmsnorm" in p.read_text())
    assert readers == ["extensions/transformer_engine.py", "transformer/transformer_config.py"]
    te = (core / "extensions/transformer_engine.py").read_text()
    assert "use_fused_residual = config.fused_residual_rmsnorm and has_residual" in te


def test_the_plans_layers_build_no_residual_fused_norm(monkeypatch):
    """Transformer Engine's spec function, as NVIDIA's gpt_builders.py calls it for the plan's dense model, with a
    CPU stand-in for Transformer Engine's provider (as tests/test_memory_te_layers.py builds it) that records which
    norms it is asked for: both of the layer's norms are fused into the QKV and fc1 linears (IdentityOp), and no
    norm is asked for with a residual. The MoE and MLA layers, which --hetauto refuses, are the ones that ask."""
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer.identity_op import IdentityOp

    asked = []

    class CpuTransformerEngine(LocalSpecProvider):
        def linear(self):
            return ColumnParallelLinear

        def fuse_layernorm_and_linear(self):
            return True

        def column_parallel_layer_norm_linear(self):
            return ColumnParallelLinear

        def layer_norm(self, rms_norm=False, for_qk=False, has_residual=False):
            asked.append(has_residual)
            return super().layer_norm(rms_norm, for_qk, has_residual)

    monkeypatch.setattr(gpt_layer_specs, "TESpecProvider", CpuTransformerEngine)
    dense = gpt_layer_specs.get_gpt_layer_with_transformer_engine_submodules()
    assert dense.input_layernorm is IdentityOp and dense.pre_mlp_layernorm is IdentityOp
    assert True not in asked
    for refused in ({"num_experts": 2}, {"multi_latent_attention": True}):
        asked.clear()
        gpt_layer_specs.get_gpt_layer_with_transformer_engine_submodules(**refused)
        assert True in asked, refused


def test_the_flag_runs_beside_rmsnorm_and_is_refused_beside_layernorm(monkeypatch):
    """Beside the RMSNorm of a gated plan the flag passes the rewrite and Megatron's config takes it. Beside
    LayerNorm Megatron-Core's TransformerConfig raises a ValueError when the model is built, on every rank; the
    rewrite refuses it first, naming the flag (exit 2). Before: it passed, and every rank stopped with that
    traceback."""
    margs, args = parse_emitted(monkeypatch, _plan(), [FLAG])
    rewrite.rewrite_args(args, _plan(), rank0_placement(_plan()))
    margs.validate_args(args, {})
    assert args.normalization == "RMSNorm" and transformer_config(margs, args).fused_residual_rmsnorm

    gpt = _plan(gated=False)
    margs, args = parse_emitted(monkeypatch, gpt, [FLAG])
    margs.validate_args(args, {})
    with pytest.raises(ValueError, match="only supported when normalization is RMSNorm"):
        transformer_config(margs, args)
    _, args = parse_emitted(monkeypatch, gpt, [FLAG])
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, gpt, rank0_placement(gpt), file="plan.yaml")
    assert exc.value.exit_code == 2 and FLAG in str(exc.value) and "LayerNorm" in str(exc.value)
