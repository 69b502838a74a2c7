"""Weights, gradients and optimizer state per device as DeepSpeed's pipeline engine holds them.

Read in DeepSpeed 0.19.8's source (paths under `deepspeed/runtime/`) and measured on CPU by
tests/test_memory_deepspeed_state.py (every tensor the engine's module and optimizer reach, by unique storage, at
every instruction boundary of a training step and inside the optimizer's step). Which optimizer wraps the torch
Adam the runtime passes is decided by `engine.py:2294-2324` (`_do_optimizer_sanity_check`) from the precision,
the ZeRO stage and `data_types.grad_accum_dtype`, all three written by emit/deepspeed.py from the mesh's settings
(`settings.grad_accum_fp32`: fp32 accumulation of 16-bit gradients needs ZeRO in DeepSpeed):

  torch       fp32 without ZeRO: the torch optimizer itself. Weights 4, `.grad` 4, Adam's moments 8: Megatron's
              figure.
  bf16        16-bit without ZeRO, or with ZeRO-1 and fp32 accumulation: `BF16_Optimizer` (bf16_optimizer.py). It
              keeps the 16-bit weights in one flat buffer (`bf16_groups_flat`, :166-171), every parameter's 16-bit
              `.grad` (zeroed, not freed, between micro-batches: `clear_lp_grads`, :612-623, called by
              pipe/engine.py:840) and beside it a whole accumulation buffer in grad_accum_dtype
              (`fp32_groups_gradients_flat`, :191-192, added to after each backward, :523). The fp32 master weights
              (:182, :225) and so Adam's moments are one partition per DP rank, with ZeRO-0 too: the optimizer is
              built over the data-parallel group whatever the ZeRO stage (engine.py:2611-2626, `partition_count`
              :153). With a 16-bit accumulation buffer the step runs on an fp32 copy of the partition's gradient
              (`grad_partition.to(...)`, :417): 4/d more while Adam steps.
  zero        fp32 with ZeRO-1, or 16-bit with ZeRO-1 and 16-bit accumulation: `DeepSpeedZeroOptimizer`
              (zero/stage_1_and_2.py). Weights in a flat buffer (:509); each parameter's `.grad` while the
              micro-batches accumulate; the fp32 master partition is a clone even in fp32 training (:560-577: 4/d
              where Megatron's fp32 parameter is its own master); Adam's moments 8/d. At the step the `.grad`s are
              freed (`free_grad_in_param_list`, :2898-2901) and the step runs on a flat fp32 gradient partition
              (4/d, :3118-3126), with the reduce bucket below released: the state priced is the larger of the
              two sets (measured at DP 1 in bf16, where the step's 2 + 4 + 12 outweighs the 2 + 2 + 12 held
              through the micro-batches when the bucket is left out). Its gradient hooks (registered
              with contiguous_gradients, on by default: :713-715, zero/config.py:102) allocate a reduce bucket of
              `reduce_bucket_size` elements in the gradient's element type at a step's first backward
              (`setup_buckets`, :3256-3269, from the hooks :1354-1372) and hold it, beside the activations of the
              micro-batches still in flight, until the reduction after the last backward releases it (:924-927,
              :1061); the reduction allocates a second one (`reduce_gradients`, :963-968).

d is the mesh's DP degree. fp16 (`FP16_UnfusedOptimizer` without ZeRO: fp32 master weights on every rank,
fp16/unfused_optimizer.py:78) does not run on CPU and is priced as bf16. Not held, and not priced: the transient of
the gradient reduction after the last backward, when the activations are gone (measured, docs/deepspeed.md).
"""
from __future__ import annotations

FP32 = 4
ADAM_MOMENT_BYTES = 8


def deepspeed_optimizer(dtype_bytes: int, settings) -> str:
    """Which of DeepSpeed's optimizers the engine builds for a mesh: "torch", "bf16" or "zero" (module docstring)."""
    if dtype_bytes >= FP32:
        return "zero" if settings.distributed_optimizer else "torch"
    if settings.distributed_optimizer and not settings.grad_accum_fp32:
        return "zero"
    return "bf16"


def deepspeed_state_bytes_per_param(dtype_bytes: int, dp: int, settings) -> dict[str, float]:
    """Bytes per parameter DeepSpeed's engine holds through a step's micro-batches (for the torch and BF16
    optimizers, the most it holds, their step included), as {"weights", "gradients", "optimizer"} (the module
    docstring gives each term's source); the ZeRO optimizer's step holds another set
    (deepspeed_step_bytes_per_param)."""
    E = float(dtype_bytes)
    kind = deepspeed_optimizer(dtype_bytes, settings)
    if kind == "torch":
        return {"weights": E, "gradients": E, "optimizer": float(ADAM_MOMENT_BYTES)}
    if kind == "bf16":
        accumulation = FP32 if settings.grad_accum_fp32 else E
        fp32_grad_copy = FP32 if accumulation < FP32 else 0
        return {"weights": E, "gradients": E + accumulation,
                "optimizer": (FP32 + ADAM_MOMENT_BYTES + fp32_grad_copy) / dp}
    return {"weights": E, "gradients": E, "optimizer": (FP32 + ADAM_MOMENT_BYTES) / dp}


def deepspeed_step_bytes_per_param(dtype_bytes: int, dp: int, settings) -> dict[str, float] | None:
    """Bytes per parameter the ZeRO optimizer holds while it steps, with the `.grad`s and the reduce bucket freed
    and the fp32 gradient partition formed; None for the other optimizers, whose step adds to what they hold
    (deepspeed_state_bytes_per_param counts it)."""
    if deepspeed_optimizer(dtype_bytes, settings) != "zero":
        return None
    return {"weights": float(dtype_bytes), "gradients": FP32 / dp, "optimizer": (FP32 + ADAM_MOMENT_BYTES) / dp}


def deepspeed_state_fixed_bytes(dtype_bytes: int, settings) -> dict[str, float]:
    """Bytes DeepSpeed's engine holds whatever the stage's size: the ZeRO optimizer's reduce bucket (gradients)."""
    if deepspeed_optimizer(dtype_bytes, settings) == "zero":
        return {"gradients": float(settings.reduce_bucket_elements * dtype_bytes)}
    return {}
