"""The architecture a model file describes is what every runtime builds: the rotary base (RoPE theta).

A config.json's rope_theta (LLaMA-3 500,000, Qwen2 1,000,000) reaches Megatron's parser through the emitted launch,
the --hetauto rewrite refuses a launch without it, the dry run's Megatron model computes its frequencies with it,
and the layers DeepSpeed's pipeline engine runs rotate as Megatron-Core's RoPE does with the same base.
"""
import argparse
import os

import pytest
import torch

from hetauto_megatron.emit.megatron import model_args
from hetauto_megatron.plan.plan import Mesh, Plan, plan_from_dict
from hetauto_megatron.spec.model import PRESETS, ModelSpec, load_model

HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")
THETA = 500000
MODEL = ModelSpec(name="theta", num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                  ffn_hidden_size=256, vocab_size=128, seq_length=16, rotary_base=THETA)


def _plan(model):
    return plan_from_dict({"version": 1, "model": model.to_dict(), "global_batch_size": 2, "meshes": [
        {"cluster": "a", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 1, "stage_layers": [2]}]})


def test_a_configs_rope_theta_reaches_megatrons_parser():
    import json

    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    for name in ("qwen2-7b", "llama-2-7b", "mistral-7b", "pythia-160m"):
        cfg = json.load(open(os.path.join(HF, f"{name}.json")))
        theta = cfg.get("rope_theta", cfg.get("rotary_emb_base", 10000))     # (transformers' LLaMA default)
        model = load_model(os.path.join(HF, f"{name}.json"), seq_length=64)
        args, _ = parser.parse_known_args(model_args(_plan(model.replace(num_layers=2))))
        assert args.rotary_base == theta, (name, args.rotary_base, theta)
    # the plan file keeps it (and files of a model with the default base stay as they were)
    plan = _plan(load_model(os.path.join(HF, "qwen2-7b.json"), seq_length=64).replace(num_layers=2))
    assert plan_from_dict(plan.to_dict()).model.rotary_base == 1000000
    assert "rotary_base" not in PRESETS["llama2-7b"].to_dict() and PRESETS["llama3-8b"].rotary_base == THETA


def test_a_launch_without_the_base_is_refused(monkeypatch):
    from test_megatron_args import _megatron_args

    from hetauto_megatron.errors import InputError
    from hetauto_megatron.megatron import launch_identity, rewrite

    plan = _plan(MODEL)
    c = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, 1, None), None)
    margs, args = _megatron_args(monkeypatch, ["--vocab-size", "128"], model=MODEL.replace(rotary_base=10000))
    with pytest.raises(InputError, match="add --rotary-base 500000"):
        rewrite.rewrite_args(args, plan, c)
    margs, args = _megatron_args(monkeypatch, ["--vocab-size", "128"], model=MODEL)
    rewrite.rewrite_args(args, plan, c)
    margs.validate_args(args, {})
    assert args.rotary_base == THETA


def _dry_run_frequencies(rank, world_size):
    from hetauto_megatron.runtime.groups import build_groups, set_megatron_globals
    from hetauto_megatron.runtime.model import build_model, transformer_config
    from hetauto_megatron.runtime.rendezvous import init_distributed

    plan = Plan(MODEL, 2, (Mesh("a", "cpu", 1, 1, 1, "none", (2,)),))
    init_distributed(plan, rank, world_size, timeout_s=60, dry_run=True)
    ctx = build_groups(plan, rank, world_size, timeout_s=60, dry_run=True)
    set_megatron_globals(ctx)
    model = build_model(ctx, MODEL, transformer_config(plan, ctx, MODEL), seed=1)
    return model.rotary_pos_emb.inv_freq.tolist()


def test_the_dry_runs_model_rotates_with_the_models_base():
    """RoFormer's frequencies, theta^(-2i/d) for the head dimension d, with the model's theta."""
    from hetauto_megatron.runtime.launcher import launch

    freqs, = launch(_dry_run_frequencies, 1, timeout_s=120)
    d = MODEL.hidden_size // MODEL.num_attention_heads
    expected = [THETA ** (-2 * i / d) for i in range(d // 2)]
    assert freqs == pytest.approx(expected, rel=1e-6)
    assert freqs != pytest.approx([10000 ** (-2 * i / d) for i in range(d // 2)], rel=1e-3)


def test_deepspeeds_layers_rotate_as_megatron_core_does(monkeypatch):
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from hetauto_megatron.runtime.deepspeed_pipeline import _rotate

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")   # where RotaryEmbedding moves its frequencies
    b, h, s, d = 2, 3, 16, 16
    x = torch.randn(b, h, s, d, generator=torch.Generator().manual_seed(0))
    for theta in (10000, THETA):
        rope = RotaryEmbedding(kv_channels=d, rotary_percent=1.0, rotary_base=theta, use_cpu_initialization=True)
        megatron = _apply_rotary_pos_emb_bshd(x.permute(2, 0, 1, 3), rope(s), rotary_interleaved=False)
        assert torch.allclose(_rotate(x, theta), megatron.permute(1, 2, 0, 3), atol=1e-5), theta


def test_rotary_heads_of_an_odd_width_are_refused_as_megatron_core_cannot_rotate_them(monkeypatch):
    """Megatron-Core's RotaryEmbedding gives a head of an odd width one frequency channel too many, so the model's
    first forward pass failed on the shapes (a plan of 4 heads of 25 channels was planned, emitted and dry-run with
    --tiny, whose heads are 16 wide, then failed at full size). The model file is refused instead (exit 2, naming
    hidden_size); even widths, and learned positions of any width, are accepted."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from hetauto_megatron.errors import InputError
    from hetauto_megatron.spec.model import ModelSpec

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")   # where RotaryEmbedding moves its frequencies
    for width in (24, 25, 26, 33):
        rope = RotaryEmbedding(kv_channels=width, rotary_percent=1.0, use_cpu_initialization=True)
        runs = rope(8).shape[-1] == width      # the channels Megatron rotates against the head's own
        shape = dict(name="m", num_layers=2, hidden_size=4 * width, num_attention_heads=4, ffn_hidden_size=64,
                     vocab_size=128, seq_length=8)
        if runs:
            ModelSpec(**shape, position_embedding="rope")
        else:
            with pytest.raises(InputError) as refused:
                ModelSpec(**shape, position_embedding="rope")
            assert refused.value.field == "hidden_size" and "odd" in refused.value.reason, refused.value.message
        ModelSpec(**shape, position_embedding="learned", max_position_embeddings=8)
        assert runs == (width % 2 == 0)
