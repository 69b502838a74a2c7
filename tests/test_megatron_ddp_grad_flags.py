"""Megatron-Core's DDP flags that change the main gradients or their DP reduction, against a plan: Megatron's own
parser, validate_args and DDP config (megatron/training/training.py get_megatron_ddp_config, which builds
DistributedDataParallelConfig as pretrain() does) say what each makes Megatron run; the plan prices main gradients
in the mesh's grad_reduce_dtype in one gradient buffer, reduced by NCCL's reduce-scatter (cost/ddp_buffer.py,
plan/tail_costs.py). The --hetauto rewrite must refuse each flag by name before the ranks join."""
import inspect

import pytest
from helpers import parse_emitted, rank0_placement

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import rewrite
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.spec.model import PRESETS

PATTERNS = "--ddp-param-name-patterns-for-fp32-local-accumulation"
RS_FP32 = "--ddp-reduce-scatter-with-fp32-accumulation"


def _plan(**settings):
    mesh = {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 2, "micro_batch_size": 1, "stage_layers": [8]}
    if settings:
        mesh["settings"] = settings
    return plan_from_dict({"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8,
                           "meshes": [mesh]})


def _megatrons_ddp_config(monkeypatch, plan, extra):
    """Megatron's DDP config for the emitted launch plus `extra`, without the rewrite's refusals (the settings the
    rewrite would give the mesh are the emitted flags)."""
    from megatron.training.training import get_megatron_ddp_config

    margs, args = parse_emitted(monkeypatch, plan, extra)
    margs.validate_args(args, {})
    return get_megatron_ddp_config(args)


def _refused(monkeypatch, plan, extra, flag):
    _, args = parse_emitted(monkeypatch, plan, extra)
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, rank0_placement(plan), file="plan.yaml")
    assert exc.value.exit_code == 2 and exc.value.field == flag and flag in str(exc.value)
    assert f"drop {flag}" in exc.value.fix and "plan.yaml" in str(exc.value)


def test_fp32_main_gradient_copies_are_refused(monkeypatch):
    """On the plan's default mesh (gradients reduced in fp32) Megatron-Core's DDP config asserts on every rank,
    inside pretrain() after the ranks joined: a traceback. Where the mesh reduces in bf16 (grad_reduce_dtype:
    param) Megatron takes the patterns and its gradient buffer gives each matched parameter an fp32 main_grad of
    its own (param_and_grad_buffer.py), memory the plan does not price. Before: the rewrite let both through."""
    from megatron.core.distributed import param_and_grad_buffer

    plan = _plan()
    assert plan.meshes[0].settings.grad_reduce_dtype == "fp32"
    with pytest.raises(AssertionError, match="param_name patterns for FP32 local accumulation"):
        _megatrons_ddp_config(monkeypatch, plan, [PATTERNS, "all"])
    _refused(monkeypatch, plan, [PATTERNS, "all"], PATTERNS)
    bf16 = _plan(grad_reduce_dtype="param")
    config = _megatrons_ddp_config(monkeypatch, bf16, [PATTERNS, "*.weight"])
    assert config.param_name_patterns_for_fp32_local_accumulation == ("*.weight",) and not config.grad_reduce_in_fp32
    assert "promote_main_grads_to_higher_precision = True" in inspect.getsource(param_and_grad_buffer)
    _refused(monkeypatch, bf16, [PATTERNS, "*.weight"], PATTERNS)


def test_reduce_scatter_with_local_fp32_sums_is_refused(monkeypatch):
    """Megatron-Core's DDP config takes the flag on the plan's default mesh (distributed optimizer, DP 2), and its
    gradient buffer then swaps NCCL's reduce-scatter for an all-to-all into a buffer of the bucket's size and a
    local fp32 sum (reduce_scatter_with_fp32_accumulation.py). Before: the rewrite let it through."""
    from megatron.core.distributed import param_and_grad_buffer, reduce_scatter_with_fp32_accumulation

    plan = _plan()
    config = _megatrons_ddp_config(monkeypatch, plan, [RS_FP32])
    assert config.reduce_scatter_with_fp32_accumulation and config.use_distributed_optimizer
    assert "dist_reduce_scatter_func = reduce_scatter_with_fp32_accumulation" in \
        inspect.getsource(param_and_grad_buffer)
    assert "all_to_all_single" in inspect.getsource(reduce_scatter_with_fp32_accumulation)
    _refused(monkeypatch, plan, [RS_FP32], RS_FP32)
    assert not _megatrons_ddp_config(monkeypatch, plan, []).reduce_scatter_with_fp32_accumulation
