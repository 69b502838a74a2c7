"""The attention a launch runs against the attention its plan priced. Megatron-LM's own parser and validate_args
(and core_transformer_config_from_args) say what --attention-backend and --transformer-impl make Megatron build;
the plan priced Transformer Engine's fused attention (no s x s scores kept) on devices and precisions that have it
(bf16 on an H800), its unfused attention in fp32 or on a V100. A flag that makes a fused-priced mesh run unfused
attention must be refused by the --hetauto rewrite, naming it."""
import sys

import pytest
from helpers import parse_emitted as _parse, rank0_placement as _placement, transformer_config

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import rewrite
from hetauto_megatron.megatron.args import hetauto_args_provider
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.spec.model import PRESETS


def _plan(device, precision):
    return plan_from_dict({"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8,
                           "precision": precision, "meshes": [
                               {"cluster": "a", "device_type": device, "tp": 1, "dp": 2, "micro_batch_size": 1,
                                "stage_layers": [8]}]})


@pytest.mark.parametrize("extra, flag, runs", [
    (["--attention-backend", "unfused"], "--attention-backend", "unfused"),
    (["--transformer-impl", "local"], "--transformer-impl", "local"),
])
def test_unfused_attention_on_a_mesh_priced_fused_is_refused(monkeypatch, extra, flag, runs):
    plan = _plan("h800", "bf16")
    # Megatron's own reading, without the rewrite: it would build unfused attention / the local layers
    margs, args = _parse(monkeypatch, plan, extra)
    margs.validate_args(args, {})
    config = transformer_config(margs, args)
    assert runs in (config.attention_backend.name, args.transformer_impl)
    _, args = _parse(monkeypatch, plan, extra)
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, _placement(plan), file="plan.yaml")
    assert exc.value.field == flag and exc.value.exit_code == 2 and runs in exc.value.message


@pytest.mark.parametrize("device, precision, extra", [
    ("h800", "bf16", []),                                       # auto: Transformer Engine picks flash or cuDNN
    ("h800", "bf16", ["--attention-backend", "flash"]),
    ("h800", "fp32", ["--attention-backend", "unfused"]),       # priced unfused: fp32
    ("v100-32gb", "fp16", ["--attention-backend", "unfused"]),  # priced unfused: no fused attention below sm80
])
def test_attention_the_plan_priced_runs(monkeypatch, device, precision, extra):
    plan = _plan(device, precision)
    margs, args = _parse(monkeypatch, plan, extra)
    rewrite.rewrite_args(args, plan, _placement(plan))
    margs.validate_args(args, {})


def test_no_attention_mask_from_the_data_loader_as_priced(monkeypatch):
    """Megatron-LM's default makes the data loader build an s x s boolean mask per sample, copied to the first and
    last stages and broadcast over TP every micro-batch (pretrain_gpt.py get_batch reads
    args.create_attention_mask_in_dataloader), which the plan prices neither in memory nor in time and a causal
    model's attention does not read. The launch scripts turn it off, and so does the rewrite where a launch left the
    flag out; --reset-attention-mask, whose document cuts live in that mask, keeps it. Before: NVIDIA's default ran,
    and only the demo's own command line turned it off."""
    import megatron.training.arguments as margs

    from hetauto_megatron.emit.megatron import megatron_args

    plan = _plan("h800", "bf16")
    emitted = megatron_args(plan, 0, "plan.yaml")
    _, args = _parse(monkeypatch, plan, [])
    assert "--no-create-attention-mask-in-dataloader" in emitted and args.create_attention_mask_in_dataloader is False
    # a launch of its own without the flag: Megatron's parser builds the mask; the rewrite turns it off
    monkeypatch.setattr("sys.argv", [a for a in sys.argv if a != "--no-create-attention-mask-in-dataloader"])
    args = margs.parse_args(hetauto_args_provider())
    assert args.create_attention_mask_in_dataloader is True
    rewrite.rewrite_args(args, plan, _placement(plan))
    margs.validate_args(args, {})
    assert args.create_attention_mask_in_dataloader is False
    # document-level masking needs the mask (GPTDataset drops the cuts without one), also where the emitted
    # launch says --no-create-attention-mask-in-dataloader and the user adds --reset-attention-mask to it
    _, args = _parse(monkeypatch, plan, ["--reset-attention-mask"])
    assert args.create_attention_mask_in_dataloader is False
    rewrite.rewrite_args(args, plan, _placement(plan))
    assert args.create_attention_mask_in_dataloader is True and args.reset_attention_mask
