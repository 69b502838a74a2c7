"""Analytic compute-time model: a roofline per operator with a size-dependent efficiency.

Each transformer layer is the GEMMs Megatron runs (QKV, attention core, output projection, MLP up/gate and
down) plus memory-bound element-wise work (norms, activation, residual adds, rotary). For an operator with F
FLOPs and B bytes moved on a device with peak P and memory bandwidth W:

    time = max(F / (P * eff(F)), B / W)    with    eff(F) = E_max * vendor * F / (F + P * t0)

`eff` grows with the GEMM size and saturates at E_max: a GEMM of P*t0 FLOPs (the work the device does in t0
seconds at peak) reaches half of it, so small shards (high TP, small micro-batches) are penalised the way real
kernels are. E_max, t0 and the element-wise traffic are ONE set of constants for every device and model,
calibrated once against published Megatron runs (docs/cost-model.md); `vendor` is a fixed per-vendor kernel
maturity factor, an assumption until `hetauto profile` measures the device.

Tensors are `device.dtype_bytes` wide: bf16 (2 bytes) on accelerators, fp32 (4) on `cpu`, where dry runs
train in fp32. Assumptions (Megatron-Core defaults on GPUs): flash attention (no s^2 activations stored, attention
backward ~2.5x its forward), sequence parallelism whenever TP > 1 (element-wise work divided by TP).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..spec.devices import DeviceType
from ..spec.model import ModelSpec


@dataclass(frozen=True)
class Calibration:
    """The model's only free constants (one set for all rows of the calibration table)."""
    gemm_max_efficiency: float = 0.76
    gemm_half_time_s: float = 20e-6          # t0: a GEMM of P*t0 FLOPs runs at half of the max efficiency
    attention_efficiency: float = 0.60       # flash-attention core relative to GEMM efficiency
    elementwise_passes: float = 16.0         # element-wise reads+writes of the [tokens, hidden] tensor per layer fwd
    kernel_overhead_s: float = 4e-6          # launch/dispatch cost per operator
    vendor_factor: tuple = (("nvidia", 1.0), ("amd", 0.80), ("ascend", 0.85), ("cpu", 1.0))

    def vendor(self, vendor: str) -> float:
        return dict(self.vendor_factor).get(vendor, 1.0)


DEFAULT_CALIBRATION = Calibration()


class AnalyticCostModel:
    """Compute time of model pieces on one device of a TP group. No TP collectives, no recomputation here:
    the simulator adds those (cost/comm.py, recompute factors below)."""

    name = "analytic"

    def __init__(self, calibration: Calibration = DEFAULT_CALIBRATION, *, flash_attention: bool = True,
                 sequence_parallel: bool = True):
        # The software stack matters as much as the chip: without flash attention the s x s score matrix goes
        # through memory (scale/mask/softmax, dropout, and the AV GEMM read it); without sequence parallelism
        # every TP rank repeats the element-wise work of the whole sequence.
        self.cal = calibration
        self.flash_attention = flash_attention
        self.sequence_parallel = sequence_parallel

    def source(self, device: DeviceType) -> str:
        return "analytic"

    # ---- one operator ----------------------------------------------------------------------------------
    def _op(self, device: DeviceType, flops: float, nbytes: float, kind: str = "gemm") -> float:
        c = self.cal
        peak = device.peak_tflops * 1e12
        eff = c.gemm_max_efficiency * c.vendor(device.vendor) * flops / (flops + peak * c.gemm_half_time_s)
        if kind == "attention":
            eff *= c.attention_efficiency
        compute = flops / (peak * eff) if flops > 0 else 0.0
        memory = nbytes / (device.hbm_gbps * 1e9)
        return max(compute, memory) + c.kernel_overhead_s

    def _gemm(self, device, m, k, n):
        """[m,k] x [k,n]: forward time, and backward (two GEMMs of the same size: data and weight grads)."""
        flops = 2.0 * m * k * n
        nbytes = device.dtype_bytes * (m * k + k * n + m * n)
        t = self._op(device, flops, nbytes)
        return t, 2 * t

    # ---- model pieces ----------------------------------------------------------------------------------
    def layer_parts(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                    seq_length: int | None = None) -> dict[str, tuple[float, float]]:
        """(forward_s, backward_s) of each part of one transformer layer: attention, mlp, elementwise."""
        s = seq_length or model.seq_length
        m = micro_batch_size * s                      # tokens in the micro-batch
        h, f = model.hidden_size, model.ffn_hidden_size
        B = device.dtype_bytes
        qkv = self._gemm(device, m, h, (h + 2 * model.kv_hidden) // tp)
        proj = self._gemm(device, m, h // tp, h)
        heads = model.num_attention_heads // tp
        attn_flops = 2 * 2.0 * micro_batch_size * heads * s * s * model.head_dim
        attn_bytes = B * m * (h + 2 * model.kv_hidden) / tp * 2
        if self.flash_attention:
            a_f = self._op(device, attn_flops, attn_bytes, "attention")
        else:  # two batched GEMMs plus ~5 passes over the [b, heads, s, s] scores (fused softmax, dropout)
            scores = B * micro_batch_size * heads * s * s
            a_f = self._op(device, attn_flops, attn_bytes) + self._op(device, 0.0, 5 * scores, "elementwise")
        up = self._gemm(device, m, h, (2 if model.gated_mlp else 1) * f // tp)
        down = self._gemm(device, m, f // tp, h)
        act_bytes = B * m * f / tp * (3 if model.gated_mlp else 2)
        sp = tp if self.sequence_parallel else 1
        ew_bytes = B * m * h * self.cal.elementwise_passes / sp + act_bytes
        ew = self._op(device, 0.0, ew_bytes, "elementwise")
        return {
            "attention": (qkv[0] + a_f + proj[0], qkv[1] + (2.5 if self.flash_attention else 2.0) * a_f + proj[1]),
            "mlp": (up[0] + down[0], up[1] + down[1]),
            "elementwise": (ew, 2 * ew),
        }

    def layer_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                    seq_length: int | None = None) -> tuple[float, float]:
        parts = self.layer_parts(model, device, tp, micro_batch_size, seq_length)
        return sum(p[0] for p in parts.values()), sum(p[1] for p in parts.values())

    def recompute_time(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                       recompute: str, seq_length: int | None = None) -> float:
        """Extra backward-pass time per layer: full re-runs the layer's forward; selective re-runs the MLP."""
        if recompute == "none":
            return 0.0
        parts = self.layer_parts(model, device, tp, micro_batch_size, seq_length)
        if recompute == "full":
            return sum(p[0] for p in parts.values())
        return parts["mlp"][0]

    def head_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                   seq_length: int | None = None) -> tuple[float, float]:
        """Final norm, logits GEMM (vocab split by TP) and the cross-entropy over [tokens, vocab/tp] fp32."""
        m = micro_batch_size * (seq_length or model.seq_length)
        g = self._gemm(device, m, model.hidden_size, model.vocab_size // tp)
        ce = self._op(device, 0.0, 4 * 3 * m * model.vocab_size / tp, "elementwise")
        return g[0] + ce, g[1] + ce

    def embedding_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                        seq_length: int | None = None) -> tuple[float, float]:
        """Embedding lookup (a gather) and its backward (a scatter-add into the vocab/tp x hidden table)."""
        m = micro_batch_size * (seq_length or model.seq_length)
        nbytes = device.dtype_bytes * m * model.hidden_size * 2
        fwd = self._op(device, 0.0, nbytes, "elementwise")
        return fwd, 2 * fwd
