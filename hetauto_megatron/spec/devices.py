"""The built-in device catalog: public per-device specs of common accelerators.

Numbers are vendor datasheet figures for ONE device as the framework sees it (an MI250X is two GCDs; we list
one GCD): dense BF16 tensor throughput without sparsity, HBM capacity and bandwidth, and the default
intra-node link (NVLink, Infinity Fabric, HCCS or PCIe) as per-device unidirectional bandwidth.
`dtype_bytes` is the element size training runs in on the device: 2 (bf16 mixed precision) on accelerators,
4 on `cpu` (CPU dry runs train in fp32); the cost, memory and transfer models size every tensor with it.
Inventories may override memory, peak and bandwidth per cluster (`memory_gib`, `peak_tflops`, `hbm_gbps`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import InputError

# Bytes per element of the tensors training keeps, by vendor: accelerators run Megatron's bf16 mixed precision,
# CPU processes (the dry run) train in fp32.
DTYPE_BYTES = {"nvidia": 2, "amd": 2, "ascend": 2, "cpu": 4}


@dataclass(frozen=True)
class DeviceType:
    name: str                  # canonical catalog name, e.g. "h800"
    vendor: str                # nvidia | amd | ascend | cpu: decides the collective backend and torch device
    memory_gib: float          # device memory
    peak_tflops: float         # dense BF16 tensor-core peak
    hbm_gbps: float            # memory bandwidth, GB/s (bytes)
    intra_node_gbps: float     # default per-device intra-node link, Gbit/s (used when the inventory omits it)
    description: str = ""
    dtype_bytes: int = 0       # element size of training tensors; 0 = the vendor's default (DTYPE_BYTES)

    def __post_init__(self):
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
        return dataclasses.replace(self, **{k: v for k, v in kw.items() if v is not None})


def _d(name, vendor, mem, tflops, hbm, link_gbytes, desc):
    return DeviceType(name, vendor, float(mem), float(tflops), float(hbm), float(link_gbytes) * 8, desc)


CATALOG: dict[str, DeviceType] = {d.name: d for d in [
    _d("a100-40gb", "nvidia", 40, 312, 1555, 300, "NVIDIA A100 SXM4 40GB, NVLink3"),
    _d("a100-80gb", "nvidia", 80, 312, 2039, 300, "NVIDIA A100 SXM4 80GB, NVLink3"),
    _d("h100-sxm", "nvidia", 80, 989, 3350, 450, "NVIDIA H100 SXM5 80GB, NVLink4"),
    _d("h800", "nvidia", 80, 989, 3350, 200, "NVIDIA H800 SXM5 80GB (export NVLink 400 GB/s bidirectional)"),
    _d("h20", "nvidia", 96, 148, 4000, 450, "NVIDIA H20 96GB"),
    _d("h200", "nvidia", 141, 989, 4800, 450, "NVIDIA H200 SXM 141GB"),
    _d("gh200", "nvidia", 96, 989, 4000, 450, "NVIDIA GH200 Grace Hopper, 96GB HBM3"),
    _d("v100", "nvidia", 32, 125, 900, 150, "NVIDIA V100 SXM2 32GB (FP16 tensor peak; no BF16)"),
    _d("v100-16gb", "nvidia", 16, 125, 900, 150, "NVIDIA V100 SXM2 16GB"),
    _d("l40s", "nvidia", 48, 362, 864, 32, "NVIDIA L40S 48GB, PCIe Gen4"),
    _d("a10", "nvidia", 24, 125, 600, 32, "NVIDIA A10 24GB, PCIe Gen4"),
    _d("mi250x", "amd", 64, 191.5, 1638, 100, "AMD Instinct MI250X, one GCD (half a card)"),
    _d("mi300x", "amd", 192, 1307, 5300, 448, "AMD Instinct MI300X 192GB, Infinity Fabric"),
    _d("ascend-910b", "ascend", 64, 320, 1600, 196, "Huawei Ascend 910B 64GB, HCCS"),
    _d("cpu", "cpu", 16, 0.5, 20, 10, "a CPU process (gloo): for dry runs of a plan's layout and numerics"),
]}

_ALIASES = {
    "a100": "a100-80gb", "a100-80": "a100-80gb", "a100-40": "a100-40gb", "h100": "h100-sxm", "h100-80gb": "h100-sxm",
    "gh-96": "gh200", "gh200-96gb": "gh200", "v100-32gb": "v100", "v100-16": "v100-16gb", "910b": "ascend-910b",
    "ascend910b": "ascend-910b", "ascend-910b2": "ascend-910b", "mi300": "mi300x",
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
