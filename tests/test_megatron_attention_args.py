"""The attention a launch runs against the attention its plan priced. Megatron-LM's own parser and validate_args
(and core_transformer_config_from_args) say what --attention-backend and --transformer-impl make Megatron build;
the plan priced Transformer Engine's fused attention (no s x s scores kept) on devices and precisions that have it
(bf16 on an H800), its unfused attention in fp32 or on a V100. A flag that makes a fused-priced mesh run unfused
attention must be refused by the --hetauto rewrite, naming it; so must a flag that makes Megatron build other layers
(--spec, --transformer-impl inference_optimized) or cut attention at document ends (--sft,
--dataloader-inter-document-masking)."""
import sys

import pytest
from helpers import nvidia_megatron_lm, parse_emitted as _parse, rank0_placement as _placement, transformer_config

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


def test_layers_megatron_builds_for_another_spec_or_implementation_are_refused(monkeypatch):
    """NVIDIA's gpt_builders.py builds the layers from --spec whatever --transformer-impl says, and from Megatron-
    Core's inference spec for --transformer-impl inference_optimized; Megatron's validate_args and config builder
    accept both on the plan's H800 mesh, priced with Transformer Engine's layers. Before: --spec naming the local
    spec bypassed the refusal of --transformer-impl local, and inference_optimized was let through."""
    import inspect

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import import_module

    plan = _plan("h800", "bf16")
    spec = ["--spec", "megatron.core.models.gpt.gpt_layer_specs", "get_gpt_layer_local_spec"]
    margs, args = _parse(monkeypatch, plan, spec)
    margs.validate_args(args, {})
    assert args.transformer_impl == "transformer_engine" and import_module(args.spec) is get_gpt_layer_local_spec
    where = nvidia_megatron_lm()
    if where is not None:           # NVIDIA's builder reads --spec before --transformer-impl
        monkeypatch.syspath_prepend(where)
        import gpt_builders
        source = inspect.getsource(gpt_builders.gpt_builder)
        assert source.index("import_module(args.spec)") < source.index("use_te = args.transformer_impl")
        assert 'config.transformer_impl == "inference_optimized"' in inspect.getsource(
            gpt_builders._get_transformer_layer_spec)
    _, args = _parse(monkeypatch, plan, spec)
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, _placement(plan), file="plan.yaml")
    assert exc.value.field == "--spec" and exc.value.exit_code == 2 and "drop --spec" in exc.value.fix

    impl = ["--transformer-impl", "inference_optimized"]
    margs, args = _parse(monkeypatch, plan, impl)
    margs.validate_args(args, {})
    assert transformer_config(margs, args).transformer_impl == "inference_optimized"
    _, args = _parse(monkeypatch, plan, impl)
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, _placement(plan), file="plan.yaml")
    assert exc.value.field == "--transformer-impl" and "inference_optimized" in exc.value.message
    # the priced implementation typed out runs
    _, args = _parse(monkeypatch, plan, ["--transformer-impl", "transformer_engine"])
    rewrite.rewrite_args(args, plan, _placement(plan))


@pytest.mark.parametrize("flag", ["--dataloader-inter-document-masking", "--sft"])
def test_attention_cut_at_document_ends_is_refused(monkeypatch, flag):
    """NVIDIA's pretrain_gpt.py get_batch gives every pipeline stage the data loader's cu_seqlens for --sft or
    --dataloader-inter-document-masking (varlen attention cut at each document's end, a batch read on every stage
    each micro-batch); Megatron-Core's GPTDataset returns them for inter_document_masking (run here on its mock
    data). The plan prices full causal attention over each sample. Before: both were let through."""
    import numpy
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset, MockGPTLowLevelDataset
    from megatron.core.datasets.utils import Split
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    plan = _plan("h800", "bf16")
    margs, args = _parse(monkeypatch, plan, [flag])
    margs.validate_args(args, {})
    assert getattr(args, flag[2:].replace("-", "_"))
    where = nvidia_megatron_lm()
    if where is not None:
        text = open(f"{where}/pretrain_gpt.py").read()
        assert "has_cu_seqlens = is_sft or args.dataloader_inter_document_masking" in text
    tokenizer = NullTokenizer(128)
    keys = {}
    for cut in (False, True):
        config = GPTDatasetConfig(random_seed=1, sequence_length=32, blend=None, blend_per_split=[None] * 3,
                                  split="1,0,0", tokenizer=tokenizer, reset_position_ids=False,
                                  reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
                                  inter_document_masking=cut)
        data = MockGPTDataset(MockGPTLowLevelDataset(tokenizer), None, numpy.arange(64), 4, Split.train, config)
        keys[cut] = set(data[0])
    assert "cu_seqlens" in keys[True] - keys[False]
    _, args = _parse(monkeypatch, plan, [flag])
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, _placement(plan), file="plan.yaml")
    assert exc.value.field == flag and exc.value.exit_code == 2 and f"drop {flag}" in exc.value.fix
    assert "full causal attention" in exc.value.message
