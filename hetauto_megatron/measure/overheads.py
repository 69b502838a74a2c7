"""Measure a device's runtime memory overheads (spec/overheads.py `RuntimeOverhead`): `hetauto profile --overheads`
writes them to overheads-TYPE.json, which an inventory cluster's `overheads:` gives the memory model.

Runs only where an accelerator is at hand (CUDA or ROCm through torch.cuda, Ascend through torch_npu); the
readings are the device's own (mem_get_info: bytes in use on the device by every context, this process's
included) and the caching allocator's (reserved / allocated), so the process must be alone on its device.

    context        in use after the runtime initialises and a first kernel runs, minus what the allocator holds
    workspace      what a first bf16 GEMM and a first scaled-dot-product attention add beyond their tensors
    comm           what a first all-reduce adds on a communicator (only under torchrun with >= 2 ranks: NCCL,
                   RCCL and HCCL allocate their buffers when a communicator first runs)
    fragmentation  max reserved / max allocated - 1 over a few training steps of a transformer layer with Adam
"""
from __future__ import annotations

import os

GIB = 1024 ** 3


def _backend(vendor: str):
    """(torch device module, device string, collective backend) for the vendor; None when none is at hand."""
    import torch
    if vendor in ("nvidia", "amd") and torch.cuda.is_available():
        return torch.cuda, "cuda", "nccl"
    if vendor == "ascend":
        try:
            import torch_npu  # noqa: F401
        except ImportError:
            return None
        if torch.npu.is_available():
            return torch.npu, "npu", "hccl"
    return None


def accelerator_at_hand(vendor: str) -> bool:
    return _backend(vendor) is not None


def measure_overheads(vendor: str, *, hidden: int = 4096, seq: int = 2048, steps: int = 5) -> dict:
    """Measured overheads in GiB (fragmentation as a fraction); "comm_gib" is None without a multi-rank launch."""
    import torch

    from ..errors import InputError

    found = _backend(vendor)
    if found is None:
        raise InputError(f"measuring runtime overheads needs a {vendor} accelerator that torch can use, and this "
                         "machine has none (or the vendor is not one of nvidia, amd, ascend)",
                         field="--device-type", fix="run 'hetauto profile --overheads' on a machine with the "
                         "device, with --device-type naming it (one process per device, alone on it)")
    mod, dev, backend = found
    mod.set_device(int(os.environ.get("LOCAL_RANK", "0")))    # under torchrun: this rank's device

    def in_use() -> int:
        free, total = mod.mem_get_info()
        return total - free

    # context: the runtime and a first kernel; whatever the allocator holds is not context
    x = torch.ones(1, device=dev) + 1
    mod.synchronize()
    context = in_use() - mod.memory_reserved()

    # workspace: a first GEMM and attention, beyond the bytes their operands and results take
    before_use, before_alloc = in_use(), mod.memory_allocated()
    a = torch.randn(seq, hidden, device=dev, dtype=torch.bfloat16)
    w = torch.randn(hidden, hidden, device=dev, dtype=torch.bfloat16)
    y = a @ w
    q = a.view(1, seq, hidden // 128, 128).transpose(1, 2)
    o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    mod.synchronize()
    tensors = mod.memory_allocated() - before_alloc
    workspace = in_use() - before_use - tensors
    del a, w, y, q, o, x

    comm = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group(backend)
        t = torch.ones(1 << 20, device=dev)
        mod.synchronize()
        before_use, before_res = in_use(), mod.memory_reserved()
        dist.all_reduce(t)
        mod.synchronize()
        comm = in_use() - before_use - (mod.memory_reserved() - before_res)

    # fragmentation: training steps of one transformer layer in bf16 with Adam, varied sequence lengths
    mod.empty_cache()
    mod.reset_peak_memory_stats()
    layer = torch.nn.TransformerEncoderLayer(hidden, hidden // 128, 4 * hidden, batch_first=True, device=dev,
                                             dtype=torch.bfloat16)
    opt = torch.optim.Adam(layer.parameters())
    for i in range(steps):
        s = seq // (1 + i % 2)
        out = layer(torch.randn(1, s, hidden, device=dev, dtype=torch.bfloat16))
        out.float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    mod.synchronize()
    fragmentation = mod.max_memory_reserved() / max(mod.max_memory_allocated(), 1) - 1
    return {"vendor": vendor, "device": str(mod.get_device_name()) if hasattr(mod, "get_device_name") else dev,
            "context_gib": context / GIB, "workspace_gib": workspace / GIB,
            "comm_gib": None if comm is None else comm / GIB, "fragmentation": fragmentation}
