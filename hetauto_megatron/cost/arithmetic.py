"""The arithmetic a measurement of the learned cost model ran in (16-bit, fp32, TF32), and which backward GEMMs take
the fitted backward-GEMM weight. Pure Python; read through cost/features.py."""
from __future__ import annotations

# The arithmetic a measurement ran in, and so which plans its rates may price (cost/learned/model.py `coverage`)
# and which calibration group it joins: 16-bit tensor-core training (bf16/fp16), fp32 on the CUDA cores, or fp32
# storage with its GEMMs on the TF32 tensor cores. Each with the element size of the tensors the job stores and
# moves (activations, TP all-reduces, softmax passes, pipeline sends): a TF32 job's are fp32, 4 bytes.
ARITHMETIC_BYTES = {"16-bit": 2, "fp32": 4, "tf32": 4}


def arithmetic_of(dtype_bytes: int, tf32: bool = False) -> str:
    """The arithmetic of a job whose tensors are `dtype_bytes` wide (`tf32`: an fp32 job's GEMMs on TF32)."""
    return "16-bit" if dtype_bytes == 2 else "tf32" if tf32 else "fp32"


# GPUs whose TF32 tensor-core instruction takes its operands K-major only: Hopper's wgmma transposes an operand in
# shared memory for 16-bit types alone (PTX ISA, wgmma.mma_async: imm-trans-a/-b are for .f16/.bf16). A linear
# layer's forward GEMM (X W^T) reads both operands K-major; its backward's do not (dX = dY W reads W N-major,
# dW = dY^T X reads dY and X M- and N-major), so in TF32 they run off that instruction's fast path, at a lower share
# of the TF32 peak than the forward's. Ampere's mma.sync loads its operands through registers in any layout.
TF32_K_MAJOR_ONLY = frozenset({"h100-sxm", "h800", "h20", "h200", "gh200"})


def backward_gemm_weighted(device: str, arithmetic: str) -> bool:
    """Whether a layer's backward GEMMs on `device` in `arithmetic` take the fitted backward-GEMM weight
    (cost/learned/backward_weights.py choose_weights): TF32 GEMMs on a GPU whose TF32 instruction wants K-major operands."""
    return arithmetic == "tf32" and device in TF32_K_MAJOR_ONLY


def backward_gemm_weight(device: str, arithmetic: str, fitted: float) -> float:
    """The backward-GEMM weight a layer prior on `device` in `arithmetic` takes: the fitted one where
    backward_gemm_weighted, else 1."""
    return fitted if backward_gemm_weighted(device, arithmetic) else 1.0


def device_arithmetic(device) -> str:
    """The arithmetic a plan's device (spec/devices.py DeviceType, placed at the job's precision) trains in:
    an fp32 job on a device with TF32 tensor cores is a TF32 job (its GEMMs run on them, as Transformer Engine runs
    fp32 GEMMs) unless its cluster says `tf32: false`."""
    tf32 = (device.dtype_bytes == 4 and device.precision == "fp32" and getattr(device, "tf32", False)
            and device.has_tf32)
    return arithmetic_of(device.dtype_bytes, tf32)
