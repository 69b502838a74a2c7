"""The attention a launch runs against the attention its plan priced. Megatron-LM's own parser and validate_args
(and core_transformer_config_from_args) say what --attention-backend and --transformer-impl make Megatron build;
the plan priced Transformer Engine's fused attention (no s x s scores kept) on devices and precisions that have it
(bf16 on an H800), its unfused attention in fp32 or on a V100. A flag that makes a fused-priced mesh run unfused
attention must be refused by the --hetauto rewrite, naming it."""
import pytest
from helpers import parse_emitted as _parse, rank0_placement as _placement, transformer_config

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import rewrite
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
