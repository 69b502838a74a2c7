"""The built-in device catalog: public per-device specs of common accelerators.

Numbers are vendor datasheet figures for ONE device as the framework sees it (an MI250X is two GCDs; we list
one GCD): dense tensor throughput without sparsity per training precision, HBM capacity and bandwidth, and
the default intra-node link (NVLink, Infinity Fabric, HCCS or PCIe) as per-device unidirectional bandwidth.

Training precision is a property of the job (`hetauto plan --precision`, `Plan.precision`), not of the
inventory: `DeviceType.at_precision(p)` gives the device as that job sees it, with
    peak_tflops   the dense peak at p: bf16/fp16 on the tensor cores, fp8 (Transformer Engine) only on devices
                  that have it (Hopper, Ada, MI300X), fp32 on the TF32 tensor cores where the device has them
                  (NVIDIA Ampere and newer), else without tensor cores. TF32 is what an fp32 job runs there:
                  Transformer Engine computes every fp32 GEMM of Megatron's layers with
                  CUBLAS_COMPUTE_32F_FAST_TF32 whatever PyTorch's switch says (transformer_engine/common/gemm/
                  cublaslt_gemm.cu, "Use TF32 only for pure FP32 GEMM"), and the launch turns PyTorch's switch on
                  for the rest (emit/vendor_env.py vendor_env). An inventory's `tf32: false` turns it off: priced
                  at the CUDA cores' FP32, launched with NVIDIA_TF32_OVERRIDE=0, which every NVIDIA library obeys
    dtype_bytes   the element size of parameters, activations and pipeline sends: 2 for bf16, fp16 and fp8
                  (fp8 trains on bf16 parameters), 4 for fp32
    precision     p
`cpu` is priced in fp32 whatever the job's precision, because that is what CPU dry runs train in.
A catalog entry not yet placed in a job (`precision == ""`) carries its 16-bit tensor peak (bf16, or fp16
where the device has no bf16) and 16-bit elements, which is also what an inventory's `peak_tflops` overrides:
the other precisions scale with it.
Inventories may override memory, peak and bandwidth per cluster (`memory_gib`, `peak_tflops`, `hbm_gbps`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import InputError

# Bytes per element of the tensors training keeps, by vendor, before a precision is chosen: accelerators run
# 16-bit mixed precision, CPU processes (the dry run) train in fp32.
DTYPE_BYTES = {"nvidia": 2, "amd": 2, "ascend": 2, "cpu": 4}
PRECISIONS = ("bf16", "fp16", "fp8", "fp32")
PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp8": 2, "fp32": 4}


@dataclass(frozen=True)
class DeviceType:
    name: str                  # canonical catalog name, e.g. "h800"
    vendor: str                # nvidia | amd | ascend | cpu: decides the collective backend and torch device
    memory_gib: float          # device memory
    peak_tflops: float         # dense peak at `precision` (unplaced: the 16-bit tensor peak)
    hbm_gbps: float            # memory bandwidth, GB/s (bytes)
    intra_node_gbps: float     # default per-device intra-node link, Gbit/s (used when the inventory omits it)
    description: str = ""
    dtype_bytes: int = 0       # element size of training tensors; 0 = the vendor's default (DTYPE_BYTES)
    precision: str = ""        # the job's training precision once placed (at_precision); "" = catalog entry
    peaks: tuple = ()          # datasheet (precision, dense TFLOP/s) pairs; a precision absent is unsupported
    reference_tflops: float = 0.0   # the 16-bit peak the inventory may override; 0 = peak_tflops
    tf32: bool = False         # fp32 GEMMs run on the TF32 tensor cores: the catalog sets it where the device
                               # has them (Transformer Engine's fp32 GEMMs use them), an inventory's `tf32: false` not
    fused_attention: bool = True   # Transformer Engine's fused attention (flash, cuDNN) runs on it in 16 bits: not
                               # below NVIDIA sm80 (TransformerEngine get_attention_backend, "Filter: Compute
                               # capability"), so a V100 runs its unfused attention (plan/engines.py ENGINES)

    def __post_init__(self):
        if self.reference_tflops == 0:
            object.__setattr__(self, "reference_tflops", self.peak_tflops)
        if self.dtype_bytes == 0:
            object.__setattr__(self, "dtype_bytes", DTYPE_BYTES[self.vendor])
        if self.dtype_bytes not in (2, 4):
            raise ValueError(f"device type {self.name}: dtype_bytes must be 2 (bf16/fp16) or 4 (fp32), "
                             f"got {self.dtype_bytes}")

    @property
    def backend(self) -> str:
        """The collective library used inside a cluster of this device type."""
        return {"nvidia": "nccl", "amd": "nccl", "ascend": "hccl", "cpu": "gloo"}[self.vendor]

    @property
    def torch_device(self) -> str:
        return {"nvidia": "cuda", "amd": "cuda", "ascend": "npu", "cpu": "cpu"}[self.vendor]

    def with_overrides(self, **kw) -> "DeviceType":
        """The inventory's per-cluster values; `peak_tflops` is the 16-bit tensor peak (other precisions scale)."""
        kw = {k: v for k, v in kw.items() if v is not None}
        peak = kw.pop("peak_tflops", None)
        dev = dataclasses.replace(self, **kw)
        if peak is not None:
            dev = dataclasses.replace(dev, reference_tflops=peak, peak_tflops=peak)
            if self.precision:
                dev = dataclasses.replace(dev, precision="").at_precision(self.precision)
        return dev

    @property
    def has_tf32(self) -> bool:
        """Whether the device has TF32 tensor cores (a datasheet TF32 peak; never a CPU process)."""
        return self.vendor != "cpu" and "tf32" in dict(self.peaks)

    @property
    def precisions(self) -> list[str]:
        """The training precisions this device has (PRECISIONS order): the ones a fix may suggest."""
        return [p for p in PRECISIONS if self.peak_tflops_at(p) is not None]

    def peak_tflops_at(self, precision: str) -> float | None:
        """Dense peak at a training precision, scaled like an inventory override; None if the device lacks it."""
        if self.vendor == "cpu":
            return None if precision == "fp8" else self.reference_tflops
        table = dict(self.peaks)
        if precision not in table:
            return None
        sixteen = table.get("bf16") or table["fp16"]
        return table[precision] * self.reference_tflops / sixteen

    def at_precision(self, precision: str, *, file: str | None = None, field: str | None = None) -> "DeviceType":
        """This device as a job training in `precision` sees it (see the module docstring)."""
        if precision not in PRECISIONS:
            raise InputError(f"unknown training precision {precision!r}", file=file, field=field or "--precision",
                             fix=f"use one of: {', '.join(PRECISIONS)}")
        peak = self.peak_tflops_at(precision)
        if precision == "fp32" and self.tf32 and self.has_tf32:
            peak = self.peak_tflops_at("tf32")   # fp32 storage, GEMMs on the TF32 tensor cores
        if peak is None:
            have = self.precisions
            raise InputError(f"device type {self.name} ({self.description or self.vendor}) cannot train in "
                             f"{precision}", file=file, field=field or "--precision",
                             fix=f"choose a precision it has: {', '.join(have)}, or leave that cluster out (hetauto "
                                 "plan --exclude-clusters, or remove it from the inventory)")
        if self.vendor == "cpu":      # dry runs train in fp32 whatever the job's precision
            return dataclasses.replace(self, precision="fp32", peak_tflops=peak, dtype_bytes=4)
        return dataclasses.replace(self, precision=precision, peak_tflops=peak, dtype_bytes=PRECISION_BYTES[precision])


def _d(name, vendor, mem, tflops, hbm, link_gbytes, desc, *, fp32=None, fp8=None, bf16=True, tf32=None,
       fused_attention=True):
    """tflops: the 16-bit dense tensor peak (bf16 and fp16 alike unless bf16=False); fp32: without tensor cores;
    fp8: dense fp8 peak where the device has fp8 (None: it has not); tf32: the dense TF32 tensor peak an fp32 job
    reaches on its tensor cores (not a training precision of its own; such a device runs fp32 on TF32 unless the
    inventory says `tf32: false`)."""
    peaks = {"fp16": tflops}
    if bf16:
        peaks["bf16"] = tflops
    if fp8:
        peaks["fp8"] = fp8
    if fp32:
        peaks["fp32"] = fp32
    if tf32:
        peaks["tf32"] = tf32
    return DeviceType(name, vendor, float(mem), float(tflops), float(hbm), float(link_gbytes) * 8, desc,
                      peaks=tuple(sorted((k, float(v)) for k, v in peaks.items())), tf32=bool(tf32),
                      fused_attention=fused_attention)


# fp32 peaks are the datasheets' non-tensor FP32 (an fp32 job's rate without TF32); the Ascend 910B publishes none.
# tf32: the datasheets' dense TF32 tensor peak (half the sparse figure), NVIDIA Ampere and newer.
CATALOG: dict[str, DeviceType] = {d.name: d for d in [
    _d("a100-40gb", "nvidia", 40, 312, 1555, 300, "NVIDIA A100 SXM4 40GB, NVLink3", fp32=19.5, tf32=156),
    _d("a100-80gb", "nvidia", 80, 312, 2039, 300, "NVIDIA A100 SXM4 80GB, NVLink3", fp32=19.5, tf32=156),
    _d("h100-sxm", "nvidia", 80, 989, 3350, 450, "NVIDIA H100 SXM5 80GB, NVLink4", fp32=67, fp8=1979, tf32=494.7),
    _d("h800", "nvidia", 80, 989, 3350, 200, "NVIDIA H800 SXM5 80GB (export NVLink 400 GB/s bidirectional)",
       fp32=67, fp8=1979, tf32=494.7),
    _d("h20", "nvidia", 96, 148, 4000, 450, "NVIDIA H20 96GB", fp32=44, fp8=296, tf32=74),
    _d("h200", "nvidia", 141, 989, 4800, 450, "NVIDIA H200 SXM 141GB", fp32=67, fp8=1979, tf32=494.7),
    _d("gh200", "nvidia", 96, 989, 4000, 450, "NVIDIA GH200 Grace Hopper, 96GB HBM3", fp32=67, fp8=1979, tf32=494.7),
    _d("v100", "nvidia", 32, 125, 900, 150, "NVIDIA V100 SXM2 32GB (FP16 tensor peak; no BF16)", fp32=15.7,
       bf16=False, fused_attention=False),        # sm70
    _d("v100-16gb", "nvidia", 16, 125, 900, 150, "NVIDIA V100 SXM2 16GB (FP16 tensor peak; no BF16)", fp32=15.7,
       bf16=False, fused_attention=False),
    _d("l40s", "nvidia", 48, 362, 864, 32, "NVIDIA L40S 48GB, PCIe Gen4", fp32=91.6, fp8=733, tf32=183),
    _d("a10", "nvidia", 24, 125, 600, 32, "NVIDIA A10 24GB, PCIe Gen4", fp32=31.2, tf32=62.5),
    # GeForce / TITAN cards (the 16-bit peak with FP32 accumulation, which training uses: half the FP16-accumulate
    # figure on GeForce, the full rate on the TITAN RTX); Turing (sm75) has no BF16, no TF32 and no fused attention.
    # The RTX 3090's dense TF32 tensor peak equals its FP32 peak (35.6): an fp32 job gains nothing from TF32 there,
    # and its measured runs cannot tell the two apart (cost/learned/sailor.py sailor_precisions), so it is listed
    # without TF32.
    _d("rtx-3090", "nvidia", 24, 71, 936, 32, "NVIDIA GeForce RTX 3090 24GB, PCIe Gen4", fp32=35.6),
    _d("rtx-2080", "nvidia", 8, 40.3, 448, 16, "NVIDIA GeForce RTX 2080 8GB, PCIe Gen3 (FP16 tensor peak; no BF16)",
       fp32=10.1, bf16=False, fused_attention=False),
    _d("rtx-2080-ti", "nvidia", 11, 53.8, 616, 16,
       "NVIDIA GeForce RTX 2080 Ti 11GB, PCIe Gen3 (FP16 tensor peak; no BF16)", fp32=13.4, bf16=False,
       fused_attention=False),
    _d("titan-rtx", "nvidia", 24, 130, 672, 16, "NVIDIA TITAN RTX 24GB, PCIe Gen3 (FP16 tensor peak; no BF16)",
       fp32=16.3, bf16=False, fused_attention=False),
    _d("mi250x", "amd", 64, 191.5, 1638, 100, "AMD Instinct MI250X, one GCD (half a card)", fp32=47.9),
    _d("mi300x", "amd", 192, 1307, 5300, 448, "AMD Instinct MI300X 192GB, Infinity Fabric", fp32=163.4, fp8=2615),
    _d("ascend-910b", "ascend", 64, 320, 1600, 196, "Huawei Ascend 910B 64GB, HCCS"),
    # one single-threaded process per rank (the dry run's OMP_NUM_THREADS=1): one x86 core's fp32 GEMM rate,
    # 84-96 GFLOP/s measured with torch.matmul at 128-2048 x 256-1024 x 256-1024, over E_max (docs/cost-model.md)
    _d("cpu", "cpu", 16, 0.128, 20, 10, "a CPU process (gloo): for dry runs of a plan's layout and numerics",
       fp32=0.128),
]}

_ALIASES = {
    "a100": "a100-80gb", "a100-80": "a100-80gb", "a100-40": "a100-40gb", "h100": "h100-sxm", "h100-80gb": "h100-sxm",
    "gh-96": "gh200", "gh200-96gb": "gh200", "v100-32gb": "v100", "v100-16": "v100-16gb", "910b": "ascend-910b",
    "ascend910b": "ascend-910b", "ascend-910b2": "ascend-910b", "mi300": "mi300x", "3090": "rtx-3090",
    "geforce-rtx-3090": "rtx-3090", "2080": "rtx-2080", "geforce-rtx-2080": "rtx-2080", "2080-ti": "rtx-2080-ti", "rtx-2080ti": "rtx-2080-ti",
    "geforce-rtx-2080-ti": "rtx-2080-ti", "titanrtx": "titan-rtx",
}


def canonical_device_name(name: str) -> str | None:
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    return key if key in CATALOG else None


def get_device(name: str, *, file: str | None = None, field: str | None = None) -> DeviceType:
    key = canonical_device_name(name)
    if key is None:
        raise InputError(f"unknown device type {name!r}", file=file, field=field,
                         fix=f"use one of the catalog's types: {', '.join(CATALOG)} (or an alias such as "
                             f"A100, H100, 910B), and override memory_gib/peak_tflops/hbm_gbps if yours differ")
    return CATALOG[key]
