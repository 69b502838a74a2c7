"""Megatron-LM's --loss-scale (a static loss scale) against a plan: Megatron's own parser, validate_args and
config builders (get_megatron_ddp_config, get_megatron_optimizer_config) and Megatron-Core's optimizer factory say
what it makes Megatron run; the --hetauto rewrite must refuse it by name where that is something the plan did not
price, and let through the dynamic scaler's own flags, which change nothing priced."""
import inspect

import pytest
from helpers import parse_emitted, rank0_placement

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import rewrite
from hetauto_megatron.plan import tail_costs
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.spec.model import PRESETS


def _plan(precision, **settings):
    mesh = {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 2, "micro_batch_size": 1, "recompute": "none",
            "stage_layers": [8]}
    if settings:
        mesh["settings"] = settings
    return plan_from_dict({"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8,
                           "precision": precision, "meshes": [mesh]})


def _megatron(monkeypatch, plan, extra):
    """Megatron-LM's validated arguments for the emitted launch and `extra`, as its own code leaves them."""
    margs, args = parse_emitted(monkeypatch, plan, extra)
    margs.validate_args(args, {})
    return args


def _rewrite(monkeypatch, plan, extra):
    _, args = parse_emitted(monkeypatch, plan, extra)
    rewrite.rewrite_args(args, plan, rank0_placement(plan), file="plan.yaml")
    return args


def _refused(monkeypatch, plan, extra):
    with pytest.raises(InputError) as exc:
        _rewrite(monkeypatch, plan, extra)
    assert exc.value.exit_code == 2 and exc.value.field == "--loss-scale" and "--loss-scale" in str(exc.value)
    assert "the plan" in str(exc.value) and exc.value.fix.startswith("drop --loss-scale")
    return exc.value


def test_a_static_loss_scale_in_fp16_runs_the_gradient_check_the_plan_prices_off(monkeypatch):
    """fp16: validate_args turns --check-for-nan-in-loss-and-grad off only for the dynamic scaler, so with
    --loss-scale DDP checks every bucket's gradients before reducing it, a pass the plan prices off for fp16
    (tail_costs.checks_gradients). Before: the rewrite let it through."""
    from megatron.training.training import get_megatron_ddp_config

    plan = _plan("fp16")
    dynamic = _megatron(monkeypatch, plan, [])
    assert dynamic.fp16 and not get_megatron_ddp_config(dynamic).check_for_nan_in_grad
    assert get_megatron_ddp_config(dynamic).check_for_nan_in_grad == tail_costs.checks_gradients("fp16")
    static = _megatron(monkeypatch, plan, ["--loss-scale", "1024"])
    assert static.fp16 and get_megatron_ddp_config(static).check_for_nan_in_grad
    error = _refused(monkeypatch, plan, ["--loss-scale", "1024"])
    assert "dynamic loss scaler" in error.fix and "fp16" in str(error)


def test_the_dynamic_scalers_own_flags_run_what_the_plan_priced(monkeypatch):
    """--initial-loss-scale, --min-loss-scale, --loss-scale-window and --hysteresis only tune the dynamic scaler:
    the gradient check stays off as priced and the rewrite lets them through; --loss-scale 0 is the dynamic
    scaler too (Megatron tests `if not args.loss_scale`)."""
    from megatron.training.training import get_megatron_ddp_config

    plan = _plan("fp16")
    tuned = ["--initial-loss-scale", "65536", "--min-loss-scale", "2", "--loss-scale-window", "500",
             "--hysteresis", "4"]
    for extra in (tuned, ["--loss-scale", "0"]):
        assert not get_megatron_ddp_config(_megatron(monkeypatch, plan, extra)).check_for_nan_in_grad
        args = _rewrite(monkeypatch, plan, extra)
        assert args.fp16
    assert args.loss_scale == 0


def test_a_loss_scale_in_bf16_or_fp32_refused_where_megatron_builds_a_scaler(monkeypatch):
    """bf16, and fp32 under the distributed optimizer: Megatron-Core's optimizer factory gives the mixed-precision
    optimizer a ConstantGradScaler for config.loss_scale, whose prepare_grads unscales and checks the main gradients
    and all-reduces the overflow flag every step (the plan prices no scaler outside fp16): refused. fp32 without
    the distributed optimizer builds Megatron's FP32Optimizer, which ignores it: accepted."""
    from megatron.core import optimizer as core_optimizer
    from megatron.core.optimizer.optimizer import MixedPrecisionOptimizer
    from megatron.training.training import get_megatron_optimizer_config

    factory = inspect.getsource(core_optimizer._get_megatron_optimizer_based_on_param_groups)
    assert "if config.fp16 or config.bf16 or config.use_distributed_optimizer:" in factory
    assert "if config.loss_scale:\n            grad_scaler = ConstantGradScaler(config.loss_scale)" in factory
    assert "self._unscale_main_grads_and_check_for_nan()" in inspect.getsource(MixedPrecisionOptimizer.prepare_grads)

    for plan in (_plan("bf16"), _plan("fp32")):
        config = get_megatron_optimizer_config(_megatron(monkeypatch, plan, ["--loss-scale", "1024"]))[0]
        assert config.loss_scale == 1024 and (config.bf16 or config.use_distributed_optimizer)
        error = _refused(monkeypatch, plan, ["--loss-scale", "1024"])
        assert "constant loss scaler" in str(error)
    plain = _plan("fp32", distributed_optimizer=False, overlap_param_gather=False)
    config = get_megatron_optimizer_config(_megatron(monkeypatch, plain, ["--loss-scale", "1024"]))[0]
    assert not (config.fp16 or config.bf16 or config.use_distributed_optimizer)     # FP32Optimizer: no scaler
    assert _rewrite(monkeypatch, plain, ["--loss-scale", "1024"]).loss_scale == 1024
