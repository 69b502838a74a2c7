"""The device layer: one place that turns a plan's device type into a torch device and a collective backend,
and that lets Megatron-Core run on CPU processes.

Mapping (from the catalog's vendor): NVIDIA -> cuda/nccl, AMD ROCm -> cuda/nccl (RCCL answers to the nccl
name in ROCm builds of torch), Ascend -> npu/hccl (needs torch_npu), cpu -> cpu/gloo.

Megatron-Core 0.19 assumes CUDA in a handful of places (measured, see docs/runtime.md): RNG state helpers,
`device="cuda"` literals and `.cuda()` calls, `torch.cuda.current_device()` passed as a device,
`torch.cuda.synchronize()` after pipeline sends, a CUDA stream in DDP, and a `torch.cuda.FloatTensor` type
check in gradient clipping. `enable_cpu_redirects()` points each of these at the CPU. It is applied only when
asked (a `cpu` rank), once per process; it is the same set of seams vendor plug-ins such as torch_npu cover
for their own devices.

Sequence parallelism needs no redirect here: gloo in the pinned torch 2.13 implements the collectives Megatron's
sequence-parallel regions and distributed optimizer call (`all_gather_into_tensor`, `reduce_scatter_tensor`,
`_all_gather_base`, `_reduce_scatter_base`), bit-identical to all_gather + cat and all_reduce + own chunk
(tests/test_runtime_sp.py). What it does need on CPU is a norm that marks its parameters (runtime/norm.py).
"""
from __future__ import annotations

import importlib.util

from ..errors import InputError
from ..spec.devices import get_device


def has_accelerator() -> bool:
    """Whether this process can reach an accelerator: a CUDA (or ROCm) device, or torch_npu installed. The device
    count reads NVML (or AMD SMI) where it can rather than initialising the CUDA driver, which a process that forks
    ranks afterwards must not have done (torch.cuda.is_available() does, unless PYTORCH_NVML_BASED_CUDA_CHECK=1)."""
    import torch
    return torch.cuda.device_count() > 0 or importlib.util.find_spec("torch_npu") is not None


def torch_device_for(device_type: str) -> str:
    """'cuda', 'npu' or 'cpu' for a catalog device type (or alias)."""
    return get_device(device_type).torch_device


def backend_for(device_type: str) -> str:
    """The collective backend used inside a cluster of this device type: nccl, hccl or gloo."""
    return get_device(device_type).backend


def init_backend(device_types) -> str:
    """Backend string for `init_process_group` in a world that mixes these device types.

    gloo always serves CPU tensors (the host-staged inter-cluster path needs it); each accelerator type adds its
    own backend for its own tensors. A CPU-only world is plain 'gloo'.
    """
    pairs = {"cpu": "gloo"}
    for name in device_types:
        dev = get_device(name)
        if dev.torch_device != "cpu":
            pairs[dev.torch_device] = dev.backend
    if len(pairs) == 1:
        return "gloo"
    return ",".join(f"{k}:{v}" for k, v in pairs.items())


def set_fp32_gemms(tf32: bool) -> None:
    """An fp32 job's GEMMs on the TF32 tensor cores or not, in this process, before any GEMM: PyTorch's switch, and
    without TF32 also NVIDIA_TF32_OVERRIDE=0, which every NVIDIA library obeys (Transformer Engine's cuBLASLt GEMMs,
    which take TF32 for fp32 whatever PyTorch says, and a container that forces PyTorch's switch on)."""
    import os

    import torch
    torch.backends.cuda.matmul.allow_tf32 = tf32
    if not tf32:
        os.environ["NVIDIA_TF32_OVERRIDE"] = "0"


def set_fp32_arithmetic(plan, cluster: str, device_type: str) -> None:
    """An fp32 plan's TF32 switches as it was priced and as its launch script sets them (emit/vendor_env.py
    vendor_env), also for a process started without that script (Megatron-LM under --hetauto, hetauto's runtime on
    an accelerator): PyTorch's own matmuls on TF32 or not, and where the plan was priced without TF32,
    NVIDIA_TF32_OVERRIDE=0 for the cuBLAS handles not yet created (Transformer Engine's GEMMs use TF32 otherwise).
    Before any layer is built, so before any GEMM. NVIDIA devices only."""
    import os
    import sys

    from ..emit.vendor_env import fp32_tf32
    tf32 = fp32_tf32(plan, cluster)
    if tf32 is None or get_device(device_type).vendor != "nvidia":
        return
    if tf32 and os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
        # the user's environment turns off what the plan priced: say so rather than run several times slower
        print(f"[hetauto] warning: NVIDIA_TF32_OVERRIDE=0 in the environment turns off the TF32 GEMMs the plan "
              f"priced for cluster {cluster} (fp32 on TF32); unset it, or give the cluster tf32: false in the "
              "inventory and plan again", file=sys.stderr)
    set_fp32_gemms(tf32)


def check_local_device(device_type: str, *, rank: int, file: str | None = None) -> None:
    """Raise InputError when this process cannot run the plan's device type for `rank`."""
    import torch

    dev = get_device(device_type)
    kind = dev.torch_device
    ok = True
    if kind == "cuda":
        ok = torch.cuda.is_available()
        if ok and dev.vendor == "amd" and not getattr(torch.version, "hip", None):
            ok = False
        if ok and dev.vendor == "nvidia" and getattr(torch.version, "hip", None):
            ok = False
    elif kind == "npu":
        ok = importlib.util.find_spec("torch_npu") is not None
    if not ok:
        raise InputError(f"rank {rank} is planned on device type {dev.name} ({dev.vendor}, torch device '{kind}') "
                         f"but this process has no such device", file=file, field="meshes[*].device_type",
                         fix="launch each rank on the cluster the plan assigns it to, or dry-run the plan on CPU "
                             "with 'hetauto dryrun'")


def select_local_device(device_type: str, *, rank: int) -> None:
    """Bind this process to its own CUDA/ROCm device before the collectives start: LOCAL_RANK's (torchrun, the
    launch scripts; else the rank), or the one device visible when each process sees only its own. Ascend's NPUs
    are bound by torch_npu's launcher."""
    import os

    import torch

    if get_device(device_type).torch_device != "cuda":
        return
    from ..errors import InputError

    count = torch.cuda.device_count()
    raw = os.environ.get("LOCAL_RANK", str(rank))
    if not raw.strip().isdecimal():     # what int() reads (not "²", a digit it refuses)
        raise InputError(f"LOCAL_RANK={raw!r} is not a device index", field="LOCAL_RANK",
                         fix="start the ranks with torchrun (or the launch scripts), which set it")
    local = int(raw)
    if count > 1 and local >= count:
        raise InputError(f"rank {rank} is local process {local} on a machine with {count} visible devices: two "
                         "processes would share one", field="--nproc-per-node",
                         fix="start at most one process per device (the launch script's --nproc-per-node), or make "
                             "more devices visible (CUDA_VISIBLE_DEVICES)")
    torch.cuda.set_device(local % count)      # one visible device per process: index 0


class NullStream:
    """Stands in for a torch.cuda.Stream on CPU: DDP (and the training loop) wait on / record events in streams,
    and on CPU there is nothing to order, so every method is a no-op."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


_redirected = False


def enable_cpu_redirects() -> None:
    """Make the CUDA calls Megatron-Core makes run on the CPU. Idempotent; affects this process only."""
    global _redirected
    if _redirected:
        return
    import torch
    from torch.overrides import TorchFunctionMode

    import megatron.core.tensor_parallel.random as mrandom

    # RNG: Megatron's tracker saves/restores "CUDA" generator states; the CPU generator stands in.
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)
    # `device=torch.cuda.current_device()` appears at many allocation sites.
    torch.cuda.current_device = lambda: "cpu"
    # p2p calls synchronize() after batched sends; CPU ops are already complete when they return.
    torch.cuda.synchronize = lambda *a, **k: None

    torch.cuda.current_stream = lambda *a, **k: NullStream()

    def _is_cuda(d) -> bool:
        if isinstance(d, str):
            return d.startswith("cuda")
        return isinstance(d, torch.device) and d.type == "cuda"

    class _CudaToCpu(TorchFunctionMode):
        """`device='cuda'` in factory calls -> cpu; `Tensor.cuda()` -> itself; `Tensor.type()` reports the
        CUDA type name because gradient clipping asserts it."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0]
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                return func(*args).replace("torch.", "torch.cuda.", 1)
            if "device" in kwargs and _is_cuda(kwargs["device"]):
                kwargs["device"] = "cpu"
            if func is torch.Tensor.to:
                args = tuple("cpu" if _is_cuda(a) else a for a in args)
            return func(*args, **kwargs)

    # Entered for the life of the process: every later torch call in it sees the redirect.
    _CudaToCpu().__enter__()
    _redirected = True
