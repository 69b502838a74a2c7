"""Memory a training process holds on its device beyond the tensors the memory model prices: the runtime's
context, the collective library's buffers, workspaces and the allocator's fragmentation (cost/memory.py adds them
to every stage as `reserved`).

Per vendor, documented estimates (`RUNTIME_OVERHEADS`; docs/cost-model.md gives each one's basis) until measured:
`hetauto profile --device-type TYPE --overheads` measures them on a device (measure/overheads.py) and writes
overheads-TYPE.json; an inventory cluster's `overheads:` (that file's path, or the four figures inline) makes the
memory model use the measured figures for that cluster (docs/inputs.md). A figure the measurement left out (the
collective buffers need a launch of 2+ ranks) keeps the vendor's estimate.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

from ..errors import InputError
from ._fields import get, reject_unknown, require_mapping
from .files import read_json_file

GIB = 1024 ** 3


@dataclass(frozen=True)
class RuntimeOverhead:
    """GiB one training process holds on its device beyond its tensors, and a fraction of the tensors for the
    allocator."""
    context_gib: float      # the runtime's context (CUDA, HIP, CANN) and the framework's loaded kernels
    comm_gib: float         # the collective library's buffers over the rank's communicators (TP, DP, PP)
    workspace_gib: float    # GEMM and attention workspaces (cuBLAS/cuBLASLt, Transformer Engine, aclnn)
    fragmentation: float    # the caching allocator's reserved / allocated bytes at the peak, minus 1

    @property
    def fixed_gib(self) -> float:
        return self.context_gib + self.comm_gib + self.workspace_gib

    def bytes(self, allocated: float) -> float:
        return self.fixed_gib * GIB + self.fragmentation * allocated

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


OVERHEAD_KEYS = tuple(f.name for f in fields(RuntimeOverhead))

# Per vendor. Estimates until measured on the device (docs/cost-model.md gives each one's basis): the fixed
# parts sum to the 3 GiB reserve the planner has always taken for accelerators; fragmentation is left at 0 until
# `hetauto profile --overheads` has measured a device's allocator. CPU dry-run processes: the interpreter,
# torch and Megatron-Core, the gloo buffers.
RUNTIME_OVERHEADS = {
    "nvidia": RuntimeOverhead(context_gib=0.75, comm_gib=1.5, workspace_gib=0.75, fragmentation=0.0),
    "amd": RuntimeOverhead(context_gib=0.75, comm_gib=1.5, workspace_gib=0.75, fragmentation=0.0),
    "ascend": RuntimeOverhead(context_gib=1.0, comm_gib=1.5, workspace_gib=0.5, fragmentation=0.0),
    "cpu": RuntimeOverhead(context_gib=0.5, comm_gib=0.0, workspace_gib=0.0, fragmentation=0.0),
}
DEFAULT_OVERHEAD = RUNTIME_OVERHEADS["nvidia"]


def vendor_overhead(vendor: str) -> RuntimeOverhead:
    return RUNTIME_OVERHEADS.get(vendor, DEFAULT_OVERHEAD)


def overhead_from_value(value, *, device, file: str | None, field: str) -> RuntimeOverhead:
    """An inventory cluster's `overheads:`: the path of a file `hetauto profile --overheads` wrote (relative to the
    inventory's folder), or a mapping of the four figures. A figure that is missing or null keeps the vendor's
    estimate; a file measured on another device type is refused."""
    source, where = file, field
    if isinstance(value, str):
        path = value if os.path.isabs(value) or not file else os.path.join(os.path.dirname(file), value)
        if not os.path.exists(path):
            raise InputError(f"the overheads file {path} is not there", file=file, field=field,
                             fix="give the path of the file 'hetauto profile --overheads' wrote (relative to the "
                                 "inventory), or the figures inline")
        # (the project's JSON reader: its syntax errors with line and column, a key written twice, a bounded size)
        value = read_json_file(path, field=field, fix="pass the file 'hetauto profile --overheads' wrote, unchanged")
        source, where = path, None
        measured_on = value.get("device_type") if isinstance(value, dict) else None
        if measured_on is not None and measured_on != device.name:
            from .devices import canonical_device_name     # an alias the inventory takes ("A100") names the same
            measured_on = canonical_device_name(measured_on) or measured_on
        if measured_on is not None and measured_on != device.name:
            raise InputError(f"was measured on a {measured_on}, but the cluster's device is {device.name}",
                             file=file, field=field, fix=f"measure a {device.name} with 'hetauto profile "
                             f"--device-type {device.name} --overheads', or leave the field out")
    data = require_mapping(value, where or "the overheads", source)
    prefix = f"{where}." if where else ""
    # a measured file also names what it was measured on
    reject_unknown(data, set(OVERHEAD_KEYS) | ({"vendor", "device", "device_type"} if where is None else set()),
                   file=source, prefix=prefix)
    base = vendor_overhead(device.vendor)
    figures = {}
    for key in OVERHEAD_KEYS:
        v = get(data, key, float, default=getattr(base, key), file=source, prefix=prefix)
        if v < 0:
            raise InputError(f"must not be negative, got {v}", file=source, field=prefix + key,
                             fix="give GiB (fragmentation: a fraction, reserved / allocated - 1), 0 or more")
        if v > 100:     # GiB per device or a reserved/allocated ratio minus 1: far beyond any measurement
            raise InputError(f"is {v:g}, beyond any measured overhead (at most 100)", file=source,
                             field=prefix + key, fix="give GiB per device (fragmentation: a fraction such as 0.1)")
        figures[key] = v
    return RuntimeOverhead(**figures)
