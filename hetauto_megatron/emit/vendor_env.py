"""The environment a launch sets for its device vendor's software stack, and the TF32 switch of an fp32 plan.

Apart from the launch scripts (emit/megatron.py) because other readers need the same answers: the DeepSpeed
emitter and the plan summary state the TF32 switch (`fp32_tf32`), the runtime sets it for a process started
without a launch script (runtime/device.py), and the commands compare it with what an inventory prices
(commands/_common.py).
"""
from __future__ import annotations

from ..plan.plan import Plan
from ..spec.devices import get_device
from ..spec.inventory import inventory_from_dict
from .launches import Launch


def vendor_env(vendor: str, max_tp: int, fp32_tf32: bool | None = None) -> tuple[dict[str, str], list[str]]:
    """(variables the launch sets, commented suggestions) for one device vendor's software stack. `fp32_tf32`:
    for an fp32 plan on NVIDIA devices, whether its GEMMs run on the TF32 tensor cores as priced (the cluster's
    device type and the inventory's `tf32`). Transformer Engine runs Megatron's fp32 GEMMs on TF32 whatever
    PyTorch says; PyTorch's own matmuls (the attention scores, the output layer) follow its switch, which NVIDIA's
    containers turn on and upstream PyTorch leaves off: the --hetauto hook sets it on every rank as priced
    (runtime/device.py set_fp32_gemms), and TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 turns it on from the process's
    start; where the plan was priced without TF32, NVIDIA_TF32_OVERRIDE=0 turns TF32 off in every NVIDIA library,
    Transformer Engine's cuBLASLt GEMMs included (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=0 would do nothing: PyTorch
    reads the variable only to force TF32 on)."""
    env: dict[str, str] = {}
    notes: list[str] = []
    if vendor == "nvidia" and fp32_tf32 is not None:
        if fp32_tf32:
            env["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] = "1"
        else:
            env["NVIDIA_TF32_OVERRIDE"] = "0"
    if vendor in ("nvidia", "amd", "ascend") and max_tp > 1:
        # Megatron orders TP communication behind compute on one hardware queue; it asserts this is 1.
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    if vendor == "nvidia":
        notes += ["export NCCL_SOCKET_IFNAME=<nic>      # interface for NCCL bootstrap inside the cluster",
                  "export NCCL_IB_HCA=<hca list>        # InfiniBand adapters, e.g. mlx5_0,mlx5_1"]
    elif vendor == "amd":
        notes += ["export NCCL_SOCKET_IFNAME=<nic>      # RCCL reads the NCCL_* variables",
                  "export HIP_FORCE_DEV_KERNARG=1       # faster kernel launches on MI300X (ROCm guidance)"]
    elif vendor == "ascend":
        env["HCCL_CONNECT_TIMEOUT"] = "1200"   # HCCL's 120 s default is too short for large jobs to come up
        notes += ["source /usr/local/Ascend/ascend-toolkit/set_env.sh   # CANN environment (path may differ)",
                  "export HCCL_IF_IP=<ip>               # interface HCCL uses inside the cluster"]
    elif vendor == "cpu":
        env["OMP_NUM_THREADS"] = "1"           # several processes per node share the cores
    notes.append("export GLOO_SOCKET_IFNAME=<nic>      # interface that reaches the other clusters (gloo/TCP)")
    return env, notes


def launch_env(plan: Plan, la: Launch) -> tuple[dict[str, str], list[str]]:
    """vendor_env for one launch: its vendor, the largest TP among its meshes, the cluster's TF32 switch."""
    max_tp = max(plan.meshes[k].tp for k in la.mesh_indices)
    return vendor_env(la.vendor, max_tp, fp32_tf32(plan, la.cluster))


def fp32_tf32(plan: Plan, cluster: str) -> bool | None:
    """For an fp32 plan: whether the cluster runs its GEMMs on TF32, as the plan was priced (its inventory's
    device, `tf32: false` turning it off; without an inventory, the device type's default, which a version 1-3
    plan did not have: no TF32 there); None otherwise."""
    if plan.precision != "fp32":
        return None
    if plan.inventory:
        return inventory_from_dict(plan.inventory).cluster(cluster).device.tf32
    return plan.version >= 4 and get_device(next(m.device_type for m in plan.meshes if m.cluster == cluster)).tf32
