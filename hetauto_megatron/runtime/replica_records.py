"""What each rank publishes about the parameters it holds, the input of the holders' exchange (replica_sync.py).

Once, at construction of the exchange, each rank sends every other (one all-gather) a record per parameter: its
global name, its holder (mesh index, stage in mesh), weight, TP layout, the interval of the local tensor whose
reduced gradient it holds and whether it is the source of those elements in its mesh stage (`owner_records`);
`owners_from` turns every rank's records into shard_regions' owners, from which every rank derives the same
moves. Apart from replica_sync.py because it is the one place that reads Megatron's model (its wrappers, TP
attributes and distributed-optimizer buckets) for the exchange; the exchange itself only sees records.
"""
from __future__ import annotations

from collections import defaultdict

from .gradients import _sharded_ownership
from .shard_regions import Owner, tp_layout


def unwrap_chunk(chunk):
    """The model inside Megatron's wrappers (DDP, and Float16Module under Megatron-LM's --bf16 / --fp16)."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def owner_records(ctx, model_chunks, *, weight: float) -> list[dict]:
    """This rank's share of every parameter it holds (JSON-able; the input of shard_regions.sync_moves)."""
    from .model import global_param_name

    c, spec = ctx.coords, ctx.plan.model
    out = []
    for chunk in model_chunks:
        for name, param in unwrap_chunk(chunk).named_parameters():
            if not param.requires_grad:
                continue
            owned = _sharded_ownership(chunk, param)
            sharded = owned is not None
            tp_split = bool(getattr(param, "tensor_model_parallel", False)) and ctx.mesh.tp > 1
            out.append({
                "name": global_param_name(name, ctx.layer_offset, spec), "local_name": name,
                "rank": c.rank, "cluster": c.cluster, "holder": (ctx.mesh_index, c.stage_in_mesh),
                "dp_rank": c.dp_rank, "sharded": sharded,
                "weight": weight, "shape": list(param.shape), "tp": ctx.mesh.tp, "tp_rank": c.tp_rank,
                "partition_dim": param.partition_dim if tp_split else None,
                "gated": spec.gated_mlp and name.endswith("mlp.linear_fc1.weight"),
                "lo": owned[0] if sharded else 0, "hi": owned[1] if sharded else param.numel(),
                # one copy of each element counts: DP rank 0 without sharding, TP rank 0 for TP duplicates
                "source": (sharded or c.dp_rank == 0) and (tp_split or c.tp_rank == 0),
                "shared": bool(getattr(param, "shared", False)),
            })
    return out


def owners_from(records) -> dict[str, list[Owner]]:
    """Per global parameter name, its owners (pure)."""
    by_name = defaultdict(list)
    for r in records:
        layout = tp_layout(r["shape"], r["tp"], r["tp_rank"], r["partition_dim"], gated=r["gated"])
        by_name[r["name"]].append(Owner(r["rank"], tuple(r["holder"]), r["weight"], layout, r["lo"], r["hi"],
                                        r["source"]))
    return dict(by_name)
