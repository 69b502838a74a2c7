"""Time one Megatron-Core transformer layer as hetauto's runtime builds it, for `hetauto profile --layers
--layer-impl megatron`.

The layer is the one a CPU dry run trains (runtime/model.py: Megatron-Core's GPTModel with the local layer spec,
fp32, RMSNorm/SwiGLU or LayerNorm/GELU, Megatron's own unfused attention with its mask), built in a one-rank
process of its own (Megatron-Core keeps its parallel state in process globals), TP 1: a TP > 1 layer of
Megatron-Core needs its TP ranks and would time their all-reduces too, which the communication model prices.
Its forward and backward are timed exactly like an operator (measure/profile.py: `Runner.time_fn`), so the rows
line up with the operator profile whose composition they calibrate.
"""
from __future__ import annotations

from ..cost import features as F


def megatron_layer_times(shape: F.LayerShape, name: str, *, timing: dict, threads: int,
                         timeout_s: float = 300.0) -> dict:
    """Timing row (as `Runner.time_fn` returns it) of one TP-1 Megatron-Core transformer layer of `shape`, in a
    forked one-rank process (call runtime.dryrun.preload_megatron first so that it starts fast)."""
    from ..plan.plan import Mesh, Plan
    from ..runtime.launcher import launch
    if shape.tp != 1:
        raise ValueError(f"Megatron-Core layers are timed at TP 1, got TP {shape.tp}")
    mesh = Mesh(cluster="profile", device_type="cpu", tp=1, dp=1, micro_batch_size=shape.micro_batch,
                recompute="none", stage_layers=(1,))
    plan = Plan(model=shape.model(name), global_batch_size=shape.micro_batch, meshes=(mesh,))
    return launch(_time_layer_rank, 1, args=(plan, timing, threads, timeout_s), timeout_s=timeout_s)[0]


def _time_layer_rank(rank: int, world_size: int, plan, timing: dict, threads: int, timeout_s: float) -> dict:
    import torch

    from .profile import Runner
    from ..runtime.groups import build_groups, set_megatron_globals
    from ..runtime.model import build_model, causal_mask, transformer_config
    from ..runtime.rendezvous import init_distributed

    torch.set_num_threads(threads)
    init_distributed(plan, rank, world_size, timeout_s=timeout_s, dry_run=True)
    ctx = build_groups(plan, rank, world_size, timeout_s=timeout_s, dry_run=True)
    set_megatron_globals(ctx)
    spec, mbs = plan.model, plan.meshes[0].micro_batch_size
    model = build_model(ctx, spec, transformer_config(plan, ctx, spec), seed=0)
    layer = model.decoder.layers[0]
    s = spec.seq_length
    # Megatron's layout: [sequence, batch, hidden]; the dry run's causal mask (True = masked) and rotary table.
    x = torch.randn(s, mbs, spec.hidden_size).mul_(0.1).requires_grad_(True)
    mask = causal_mask(s)
    rope = model.rotary_pos_emb(s) if spec.position_embedding == "rope" else None
    params = [p for p in layer.parameters() if p.requires_grad]

    def fwd():
        out = layer(x, attention_mask=mask, rotary_pos_emb=rope)
        return out[0] if isinstance(out, tuple) else out
    return Runner(torch, "cpu", torch.float32).time_fn([x] + params, fwd, **timing)
