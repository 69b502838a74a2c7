"""Analytic compute-time model: a roofline per kernel that knows small work is inefficient.

Each transformer layer is the GEMMs Megatron runs (QKV, attention core, output projection, MLP up/gate and
down) plus memory-bound element-wise work (norms, activation, residual adds, rotary). A GEMM [m,k] x [k,n] with
F = 2mkn FLOPs and B bytes moved, on a device with peak P, memory bandwidth W and U streaming multiprocessors
(compute units), takes

    time = max(F / (P * E_max * vendor * wave(m, n)), B / W) + kernel_latency
    wave(m, n) = tiles / (U * ceil(tiles / U)),   tiles = ceil(m / 128) * ceil(n / 128)

`max(., B/W)` is the roofline: a GEMM with a thin dimension (low arithmetic intensity) is bound by memory.
`wave` is wave quantisation: the kernel computes its output in 128 x 128 tiles, one per SM at a time, so the
last wave of tiles leaves SMs idle; a small shard (high TP, short sequences) fills one wave badly. Every kernel
pays a fixed `kernel_latency` (launch, prologue, the tail of its last wave). On top of the kernels, each layer
pays `layer_overhead` per micro-batch and pass (the framework's Python, autograd bookkeeping and the
synchronisations that stop the CPU from running ahead), the first and last stage pay `micro_batch_overhead`
per micro-batch (fetching the batch and broadcasting it over TP; the loss and its bookkeeping), and every
iteration pays `iteration_overhead` (zeroing gradient buffers, the gradient-norm reduction, the learning-rate
schedule, logging). These fixed costs are why a small model, or a large one sharded thinly, runs far below a
large GEMM's efficiency: its kernels are short and the fixed costs are not.

The constants are ONE set for every device and model. One is fitted on published Megatron runs (E_max,
benchmarks/calibration.py, leave one run out); the others are physical figures with their source in
docs/cost-model.md. `vendor` is a fixed per-vendor kernel maturity factor, an assumption until
`hetauto profile` measures the device.

Tensors are `device.dtype_bytes` wide: bf16 (2 bytes) on accelerators, fp32 (4) on `cpu`, where dry runs
train in fp32. The software stack is a setting of the model: flash attention (no s^2 scores through memory,
attention backward ~2.5x its forward) and sequence parallelism (element-wise work divided by TP) are on by
default, as Megatron-Core runs today; TP collectives overlapped with the GEMMs (--tp-comm-overlap) are off, as
hetauto's runtime runs them, and on only to price a published job that ran so (plan/calibration.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..spec.devices import DeviceType
from ..spec.model import ModelSpec

# Streaming multiprocessors (NVIDIA), compute units (AMD, one MI250X GCD), AI cores (Ascend): how many GEMM
# tiles the device computes at once. Datasheet figures; a type missing here gets its vendor's default.
COMPUTE_UNITS = {
    "a100-40gb": 108, "a100-80gb": 108, "h100-sxm": 132, "h800": 132, "h20": 78, "h200": 132, "gh200": 132,
    "v100": 80, "v100-16gb": 80, "l40s": 142, "a10": 72, "rtx-3090": 82, "rtx-2080": 46, "rtx-2080-ti": 68,
    "titan-rtx": 72, "mi250x": 110, "mi300x": 304, "ascend-910b": 24,
}
# a type an inventory defines itself (not in the catalog): its vendor's flagship count
DEFAULT_COMPUTE_UNITS = {"nvidia": 108, "amd": 110, "ascend": 24, "cpu": 8}
GEMM_TILE = 128     # output tile edge of the tensor-core GEMM kernels (cuBLAS / CUTLASS bf16 on Ampere, Hopper)


def compute_units(device: DeviceType) -> int:
    return COMPUTE_UNITS.get(device.name, DEFAULT_COMPUTE_UNITS.get(device.vendor, 100))


def wave_efficiency(m: float, n: float, units: int, tile: int = GEMM_TILE) -> float:
    """Share of the SM-time of a GEMM's waves that computes output tiles (1 when the last wave is full)."""
    tiles = math.ceil(m / tile) * math.ceil(n / tile)
    return tiles / (units * math.ceil(tiles / units))


@dataclass(frozen=True)
class Calibration:
    """The model's constants: one set for every device and model (docs/cost-model.md gives each one's source)."""
    gemm_max_efficiency: float = 0.706       # fitted: fraction of peak a large, wave-aligned GEMM reaches
    attention_efficiency: float = 0.60       # flash-attention core relative to a GEMM (FlashAttention-2 paper)
    elementwise_passes: float = 16.0         # reads+writes of the [tokens, hidden] tensor per layer forward
    kernel_latency_s: float = 5e-6           # per kernel: launch, prologue/epilogue, last-wave tail
    layer_overhead_s: float = 0.0            # framework time per layer, micro-batch and pass not hidden behind
                                             # the GPU (0 on Megatron-Core at the published sizes: calibration.py)
    # per vendor, (forward, backward) host time per layer and micro-batch on a device whose host runs the kernels
    # itself (a CPU process: Python, the dispatcher and autograd are on the critical path); an accelerator's host
    # runs ahead of it (layer_overhead_s). Measured: Megatron-Core 0.19 layers on one x86 core (docs/cost-model.md)
    host_layer_s: tuple = (("cpu", (1.15e-3, 0.47e-3)),)
    micro_batch_overhead_s: float = 0.2e-3   # per micro-batch on the first stage (get_batch) and the last (loss)
    iteration_overhead_s: float = 10e-3      # per iteration: zero grads, grad-norm, LR schedule, logging
    vendor_factor: tuple = (("nvidia", 1.0), ("amd", 0.80), ("ascend", 0.85), ("cpu", 1.0))

    def vendor(self, vendor: str) -> float:
        return dict(self.vendor_factor).get(vendor, 1.0)


DEFAULT_CALIBRATION = Calibration()

# Bytes the loss moves per logits element, (forward, backward), in fp32 on its own 32-bit copy of the logits, by
# implementation (plan/engines.py Engine.loss; both engines' loss casts 16-bit logits to it first: `loss_bytes`).
LOSS_BYTES = {
    # Megatron-Core's unfused vocabulary-parallel cross entropy, in place on the fp32 logits
    # (megatron/core/tensor_parallel/cross_entropy.py; hetauto does not emit --cross-entropy-loss-fusion):
    # forward: the max over the vocabulary (calculate_logits_max: read 4), its subtraction in place
    # (calculate_predicted_logits: read 4 + write 4), exp in place (8), the sum (read 4), the division by it in place
    # (calculate_cross_entropy_loss: 8) = 32; backward: the target's entries (per token, not priced) and
    # grad_input.mul_(grad_output) in place (calculate_gradients: 8). Megatron-LM 2021's mpu/cross_entropy.py, which
    # trained the published runs (plan/calibration.py), makes the same passes (its cast: gpt_model.py's .float()).
    "vocab_parallel": (32, 8),
    # torch's F.cross_entropy (hetauto's DeepSpeed pipeline module, runtime/deepspeed_pipeline.py lm_loss):
    # log_softmax and nll_loss (aten/src/ATen/native/cuda/SoftMax.cu, Loss.cu). A row wider than shared memory
    # holds (fp32: ~12K elements, every vocabulary) runs cunn_SoftMaxForward: it reads the row for the max, again
    # for the sum of exps, and a third time to write the output = 16; nll_loss reads the target's entries.
    # Backward: nll_loss_backward zero-fills its [tokens, vocab] gradient (write 4), cunn_SoftMaxBackward reads
    # that gradient for its sum, then the gradient and the saved output again and writes the input's gradient (16)
    # = 20.
    "torch": (16, 20),
}


def loss_bytes(loss: str, dtype_bytes: int) -> tuple[float, float]:
    """(forward, backward) bytes per logits element of the loss `loss` (LOSS_BYTES) on a device training in
    `dtype_bytes`-wide tensors: its passes plus the cast of 16-bit logits to fp32, `.float()` (Megatron-Core's
    calculate_logits_max; lm_loss), which reads 2 and writes 4 bytes, and its backward, the gradient cast back
    (read 4, write 2). In fp32 training `.float()` returns the logits themselves: no cast."""
    fwd, bwd = LOSS_BYTES[loss]
    cast = dtype_bytes + 4 if dtype_bytes != 4 else 0
    return fwd + cast, bwd + cast


class AnalyticCostModel:
    """Compute time of model pieces on one device of a TP group. No TP collectives here: the simulator adds
    those (cost/comm.py, plan/costing.py), exposed, or with `tp_comm_overlap` what `exposed_tp_comm` leaves of
    them; recomputation is priced by `recompute_time`."""

    name = "analytic"

    def __init__(self, calibration: Calibration = DEFAULT_CALIBRATION, *, flash_attention: bool = True,
                 sequence_parallel: bool = True, tp_comm_overlap: bool = False, loss: str = "vocab_parallel"):
        # The software stack matters as much as the chip: without flash attention the s x s score matrix goes
        # through memory (scale/mask/softmax, dropout, and the AV GEMM read it); without sequence parallelism
        # every TP rank repeats the element-wise work of the whole sequence.
        self.cal = calibration
        self.flash_attention = flash_attention
        self.sequence_parallel = sequence_parallel
        self.tp_comm_overlap = tp_comm_overlap
        self.loss = loss        # the cross entropy's implementation (LOSS_BYTES; the engine's: Engine.loss)

    def source(self, device: DeviceType) -> str:
        return "analytic"

    # ---- kernels ---------------------------------------------------------------------------------------
    def _kernel(self, device: DeviceType, flops: float, nbytes: float, wave: float = 1.0,
                kind: str = "gemm") -> float:
        c = self.cal
        peak = device.peak_tflops * 1e12 * c.gemm_max_efficiency * c.vendor(device.vendor) * wave
        if kind == "attention":
            peak *= c.attention_efficiency
        compute = flops / peak if flops > 0 else 0.0
        memory = nbytes / (device.hbm_gbps * 1e9)
        return max(compute, memory) + c.kernel_latency_s

    def _mm(self, device: DeviceType, m: float, k: float, n: float) -> float:
        """One GEMM [m,k] x [k,n] (output m x n)."""
        B = device.dtype_bytes
        wave = wave_efficiency(m, n, compute_units(device)) if device.vendor != "cpu" else 1.0
        return self._kernel(device, 2.0 * m * k * n, B * (m * k + k * n + m * n), wave)

    def _gemm(self, device: DeviceType, m, k, n) -> tuple[float, float]:
        """A linear layer on m tokens, k inputs, n outputs: forward, and backward = the input gradient
        [m,n] x [n,k] plus the weight gradient [k,m] x [m,n] (each with its own output tiling)."""
        return self._mm(device, m, k, n), self._mm(device, m, n, k) + self._mm(device, k, m, n)

    def _elementwise(self, device: DeviceType, nbytes: float) -> float:
        return self._kernel(device, 0.0, nbytes)

    # ---- model pieces ----------------------------------------------------------------------------------
    def layer_parts(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                    seq_length: int | None = None) -> dict[str, tuple[float, float]]:
        """(forward_s, backward_s) of each part of one transformer layer: attention, mlp, elementwise,
        overhead (the framework's fixed time). Memoised per cost model: a stage profile asks it twice (layer
        and recompute times) and the search prices each configuration on many meshes; a fresh dict each call."""
        key = (model, device, tp, micro_batch_size, seq_length, self.flash_attention, self.sequence_parallel,
               self.cal)
        return dict(self._memo(key, self._layer_parts, model, device, tp, micro_batch_size, seq_length))

    def _memo(self, key: tuple, compute, *args):
        """compute(*args), memoised per cost model under `key` (copy.copy shares the memo: each key holds the
        switches and the calibration it depends on)."""
        cache = self.__dict__.setdefault("_parts_memo", {})
        out = cache.get(key)
        if out is None:
            out = cache[key] = compute(*args)
        return out

    def _layer_parts(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                     seq_length: int | None) -> dict[str, tuple[float, float]]:
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
            a_f = self._kernel(device, attn_flops, attn_bytes, kind="attention")
            a_b = 2.5 * a_f
        else:  # two batched GEMMs plus ~5 passes over the [b, heads, s, s] scores (fused softmax, dropout)
            scores = B * micro_batch_size * heads * s * s
            wave = wave_efficiency(s, s, compute_units(device)) if device.vendor != "cpu" else 1.0
            a_f = self._kernel(device, attn_flops, attn_bytes, wave) + self._elementwise(device, 5 * scores)
            a_b = 2.0 * a_f
        up = self._gemm(device, m, h, (2 if model.gated_mlp else 1) * f // tp)
        down = self._gemm(device, m, f // tp, h)
        act_bytes = B * m * f / tp * (3 if model.gated_mlp else 2)
        sp = tp if self.sequence_parallel else 1
        ew = self._elementwise(device, B * m * h * self.cal.elementwise_passes / sp + act_bytes)
        o = self.cal.layer_overhead_s
        host_f, host_b = dict(self.cal.host_layer_s).get(device.vendor, (0.0, 0.0))
        return {
            "attention": (qkv[0] + a_f + proj[0], qkv[1] + a_b + proj[1]),
            "mlp": (up[0] + down[0], up[1] + down[1]),
            "elementwise": (ew, 2 * ew),
            # the backward runs about twice the forward's kernels; a CPU's autograd engine runs its backward in
            # C++, with less host time than the forward's Python modules
            "overhead": (o + host_f, 2 * o + host_b),
        }

    def exposed_tp_comm(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                        op_s: float, seq_length: int | None = None) -> tuple[float, float]:
        """(forward, backward) seconds of a layer's TP collectives left exposed when each runs under the GEMM it
        feeds or drains (Megatron-Core's --tp-comm-overlap with Transformer Engine's userbuffers, which needs
        sequence parallelism): `op_s` is one all-gather's or reduce-scatter's time. Forward: the all-gathers before
        the QKV and MLP-up GEMMs and the reduce-scatters after the projection and MLP-down GEMMs run chunk by chunk
        under them, a pipeline of tp chunks whose one end cannot overlap (the GEMM of the chunk already local, or the
        reduce-scatter of the last chunk computed). Backward: per column-parallel linear the input's all-gather under
        the input-gradient GEMM and that gradient's reduce-scatter under the weight-gradient GEMM (bulk); per
        row-parallel linear the output gradient's all-gather under its input-gradient GEMM (chunked). Not priced:
        the SMs the overlap's kernels take from the GEMMs (the fitted E_max absorbs it for the published runs)."""
        m = micro_batch_size * (seq_length or model.seq_length)
        h, f = model.hidden_size, model.ffn_hidden_size
        col = [(m, h, (h + 2 * model.kv_hidden) // tp), (m, h, (2 if model.gated_mlp else 1) * f // tp)]
        row = [(m, h // tp, h), (m, f // tp, h)]

        def ring(gemm: float) -> float:
            return max(0.0, op_s - gemm) + min(op_s, gemm) / tp

        def bulk(gemm: float) -> float:
            return max(0.0, op_s - gemm)

        fwd = sum(ring(self._mm(device, *d)) for d in col + row)
        bwd = sum(bulk(self._mm(device, a, n, k)) + bulk(self._mm(device, k, a, n)) for a, k, n in col)
        bwd += sum(ring(self._mm(device, a, n, k)) for a, k, n in row)
        return fwd, bwd

    def layer_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                    seq_length: int | None = None) -> tuple[float, float]:
        """(forward, backward) of one layer: the sums of layer_parts (memoised as it is, with its sums: every new
        stage profile asks them)."""
        key = ("times", model, device, tp, micro_batch_size, seq_length, self.flash_attention,
               self.sequence_parallel, self.cal)
        return self._memo(key, self._layer_times, model, device, tp, micro_batch_size, seq_length)

    def _layer_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                     seq_length: int | None) -> tuple[float, float]:
        parts = self.layer_parts(model, device, tp, micro_batch_size, seq_length)
        return sum(p[0] for p in parts.values()), sum(p[1] for p in parts.values())

    def recompute_time(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                       recompute: str, seq_length: int | None = None) -> float:
        """Extra backward-pass time per layer: full re-runs the layer's forward; selective re-runs the MLP."""
        if recompute == "none":
            return 0.0
        if recompute == "full":
            return self.layer_times(model, device, tp, micro_batch_size, seq_length)[0]
        return self.layer_parts(model, device, tp, micro_batch_size, seq_length)["mlp"][0]

    def head_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                   seq_length: int | None = None) -> tuple[float, float]:
        """Final norm, logits GEMM (vocab split by TP), the cross-entropy over [tokens, vocab/tp] in fp32 as the
        engine's loss runs it (`self.loss`: loss_bytes), and the last stage's per-micro-batch bookkeeping (loss
        averaging and reporting). A model without an output layer has no GEMM and its cross-entropy is over the
        norm's outputs (ModelSpec.logits_width). Memoised as layer_parts."""
        key = ("head", model, device, tp, micro_batch_size, seq_length, self.cal, self.loss)
        return self._memo(key, self._head_times, model, device, tp, micro_batch_size, seq_length)

    def _head_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                    seq_length: int | None) -> tuple[float, float]:
        m = micro_batch_size * (seq_length or model.seq_length)
        # (the vocabulary that runs is padded to a multiple of TP: the shard is whole; rounded up for an unpadded
        # one, e.g. the search's one-layer check, so a vocabulary smaller than TP is not an empty GEMM)
        g = self._gemm(device, m, model.hidden_size, -(-model.vocab_size // tp)) if model.output_layer else (0.0, 0.0)
        ce_f, ce_b = loss_bytes(self.loss, device.dtype_bytes)
        elements = m * model.logits_width(tp)
        o = self.cal.micro_batch_overhead_s
        return (g[0] + self._elementwise(device, ce_f * elements) + o,
                g[1] + self._elementwise(device, ce_b * elements))

    def embedding_times(self, model: ModelSpec, device: DeviceType, tp: int, micro_batch_size: int,
                        seq_length: int | None = None) -> tuple[float, float]:
        """Embedding lookup (a gather) and its backward (a scatter-add into the vocab/tp x hidden table), plus
        the first stage's per-micro-batch data fetch (the loader's next batch, broadcast over the TP group)."""
        m = micro_batch_size * (seq_length or model.seq_length)
        nbytes = device.dtype_bytes * m * model.hidden_size * 2
        fwd = self._elementwise(device, nbytes)
        return fwd + self.cal.micro_batch_overhead_s, 2 * fwd

    def optimizer_calibration(self, device: DeviceType) -> tuple[float, float]:
        """(rate on the optimizer step's memory traffic, fixed seconds per step): the analytic model prices the
        step as its traffic at full bandwidth (plan/tail_costs.py); a learned model may know better."""
        return 1.0, 0.0

    def host_floors(self, device: DeviceType, tp: int) -> tuple[float, float]:
        """(forward, backward) host floor of a layer's pass (F.host_floored): none. The roofline prices each
        kernel's work and adds the fixed per-kernel and per-micro-batch overheads (the calibration) to it; a floor
        that hides the all-reduces in the host's issue time needs the measured host-bound layers the learned
        model is fitted on."""
        return 0.0, 0.0

    def iteration_overhead_s(self, device: DeviceType) -> float:
        """Fixed time per iteration outside the pipeline (zeroing gradient buffers, the gradient-norm
        reduction, the learning-rate schedule, logging)."""
        return self.cal.iteration_overhead_s
