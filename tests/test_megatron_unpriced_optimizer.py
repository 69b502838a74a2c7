"""Megatron-LM's precision-aware optimizer flags against a plan: Megatron's own parser, validate_args and its
DDP / optimizer config builders (megatron/training/training.py) are the reference for what each flag makes Megatron
run; the --hetauto rewrite must refuse, by name and before Megatron validates anything, every flag that makes it run
another gradient reduction or optimizer state than the plan priced."""
import pytest
from helpers import parse_emitted, rank0_placement

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import rewrite
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.spec.model import PRESETS


def _plan():
    # bf16 on H800s, the plan's default gradient reduction: fp32 (grad_reduce_dtype fp32)
    return plan_from_dict({"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "meshes": [
        {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 2, "micro_batch_size": 1, "stage_layers": [8]}]})


@pytest.mark.parametrize("extra", [
    ["--main-grads-dtype", "bf16"],
    ["--use-precision-aware-optimizer", "--main-grads-dtype", "bf16"],
    ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"],
    ["--use-precision-aware-optimizer", "--main-params-dtype", "fp16"],
])
def test_precision_aware_optimizer_flags_are_refused_before_megatron_validates(monkeypatch, extra):
    """Megatron's validate_args derives accumulate_allreduce_grads_in_fp32 for bf16 from --main-grads-dtype (it
    stays off for bf16): its DDP config then reduces the gradients in bf16 where the plan priced an fp32 gradient
    buffer and fp32 DP traffic; the moment and master-weight dtypes change the optimizer state the plan priced
    (12 bytes per parameter / DP). Before: the rewrite let every one of them through."""
    from megatron.training.training import get_megatron_ddp_config

    plan = _plan()
    c = rank0_placement(plan)
    # Megatron's own reading of the flags (no hetauto rewrite): what the job would run
    margs, args = parse_emitted(monkeypatch, plan, extra)
    margs.validate_args(args, {})
    ddp = get_megatron_ddp_config(args)
    runs_plan = (ddp.grad_reduce_in_fp32 == (plan.meshes[0].settings.grad_reduce_dtype == "fp32")
                 and not args.use_precision_aware_optimizer)
    assert not runs_plan, "the flags must make Megatron run something the plan did not price"
    _, args = parse_emitted(monkeypatch, plan, extra)
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, c, file="plan.yaml")
    assert exc.value.exit_code == 2 and exc.value.field in extra


def test_without_those_flags_megatron_reduces_as_the_plan_priced(monkeypatch):
    from megatron.training.training import get_megatron_ddp_config

    plan = _plan()
    c = rank0_placement(plan)
    margs, args = parse_emitted(monkeypatch, plan, [])
    rewrite.rewrite_args(args, plan, c)
    margs.validate_args(args, {})
    assert get_megatron_ddp_config(args).grad_reduce_in_fp32 is True
    assert not args.use_precision_aware_optimizer
