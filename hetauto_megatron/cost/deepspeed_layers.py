"""How the layers of hetauto's DeepSpeed pipeline module (runtime/deepspeed_pipeline.py) keep activations, for the
memory model (cost/activations.py LayerImpl); the planner prices every --engine deepspeed stage with them
(plan/memory_fit.py layers_of). Measured by tests/test_memory_deepspeed.py."""
from __future__ import annotations

from dataclasses import replace

from .activations import LayerImpl

# The layers of the DeepSpeed pipeline module hetauto ships (runtime/deepspeed_pipeline.py): torch's
# scaled_dot_product_attention (flash or memory-efficient kernel: no s x s matrix, at any precision), torch's norms
# (RMSNorm keeps the normalised input), unfused rotary embedding, SiLU x up without Megatron's GLU offset, no dropout
# (that module refuses a config with one). Q, K and V are kept at their GQA width: the flash kernel takes grouped K
# and V (on CPU; on an accelerator in 16 bits, not a V100), and V is copied out of the fused QKV output when rope
# copies Q and K, so that output is not kept beside them. Measured on CPU (LLaMA-style and GPT-style models).
DEEPSPEED_PIPELINE_IMPL = LayerImpl(flash_attention=True, fused_norm=False, fused_rope=False, gated_mlp_tensors=4,
                                    pre_mlp_norm_in_fc1=False, dropout_mask_bytes=None, position_ids_per_sample=False)
# torch's CUDA flash kernel takes head dims up to 256, and trains (192, 224] only outside sm86/sm89 (its
# check_head_dim_size_flash and the sm86/89 filter); above, enable_gqa falls to the math kernel and its s x s scores.
# The module and the pricing both take K and V grouped on an accelerator only up to 192, where every sm80+ card runs
# flash, and repeat them above it (runtime/deepspeed_pipeline.py sdpa_takes_gqa).
FLASH_GQA_MAX_HEAD_DIM = 192
DEEPSPEED_PIPELINE_IMPL_ACCELERATOR = replace(DEEPSPEED_PIPELINE_IMPL, grouped_kv_max_head_dim=FLASH_GQA_MAX_HEAD_DIM)
# The same layers where the kernel that runs takes no grouped K and V (fp32 on an accelerator, a V100: the
# memory-efficient kernel; runtime/deepspeed_pipeline.py sdpa_takes_gqa): K and V repeated to every head.
DEEPSPEED_PIPELINE_IMPL_REPEATED_KV = replace(DEEPSPEED_PIPELINE_IMPL, kv_repeated=True)

# On CPU processes DeepSpeed's checkpoint (activation_checkpointing/checkpointing.py CheckpointFunction) keeps the CPU
# RNG state and its accelerator's, which on its CPU accelerator is the same generator's: 2 x torch.get_rng_state(),
# 5,056 bytes each, per checkpointed layer and micro-batch, and 2 more in the backward that re-runs it (on a GPU
# these are host memory).
TORCH_CPU_RNG_STATE_BYTES = 5056
DEEPSPEED_PIPELINE_IMPL_CPU = replace(DEEPSPEED_PIPELINE_IMPL, checkpoint_bytes=2 * TORCH_CPU_RNG_STATE_BYTES)


def deepspeed_pipeline_impl(device) -> LayerImpl:
    """How hetauto's DeepSpeed pipeline module keeps activations on `device` (a spec.devices.DeviceType at the
    job's precision): K and V at their GQA width where torch's flash kernel takes them grouped (CPU; 16 bits on a
    CUDA or ROCm device that runs flash attention, DeviceType.fused_attention, up to FLASH_GQA_MAX_HEAD_DIM),
    repeated to every head elsewhere (fp32, a V100, an Ascend's torch_npu, whose kernels the module does not
    assume). The module decides by the same rule (runtime/deepspeed_pipeline.py sdpa_takes_gqa). On CPU its
    checkpoints' RNG states."""
    if device.vendor == "cpu":
        return DEEPSPEED_PIPELINE_IMPL_CPU
    if device.torch_device == "cuda" and device.dtype_bytes <= 2 and device.fused_attention:
        return DEEPSPEED_PIPELINE_IMPL_ACCELERATOR
    return DEEPSPEED_PIPELINE_IMPL_REPEATED_KV
