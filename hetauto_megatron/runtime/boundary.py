"""One rank's view of its pipeline boundaries: who is its neighbour at the next and previous stage, and which
blocks it sends to and receives from each mesh holding that stage.

The communicator (communicator.py) moves the blocks; this module only says which: the rank's coordinates and the
plan's layout decide them (transfers.py cuts the whole boundary into blocks; here a rank keeps those between its
own mesh and one mesh of the other side). No process group is touched.
"""
from __future__ import annotations

from dataclasses import dataclass

from .gradients import activation_grad_scale
from .ranks import global_rank
from .transfers import Transfer, compute_transfers


@dataclass(frozen=True)
class Crossing:
    """The blocks between this rank's mesh and one mesh holding the neighbouring stage, for one tensor shape."""
    fwd: list[tuple[int, Transfer]]     # activations, (k, block): k is the block's place in the whole boundary's
    bwd: list[tuple[int, Transfer]]     # list (its tag); bwd: activation gradients, the other way
    peer_mesh: int                      # the other mesh, and its stage (inside that mesh) at this boundary
    peer_sim: int
    scale: float                        # factor on the gradients received from the other mesh (DP mismatch)
    inter: bool                         # the meshes are in different clusters: staged through host memory
    group: object                       # the boundary's gloo group when `inter` (None otherwise)

    def blocks(self, grad: bool) -> list[tuple[int, Transfer]]:
        return self.bwd if grad else self.fwd

    def peer_rank(self, plan, dp_rank: int, tp_rank: int) -> int:
        """Global rank of the other mesh's rank at this boundary with these DP and TP coordinates."""
        return global_rank(plan, self.peer_mesh, self.peer_sim, dp_rank, tp_rank)


def neighbour(ctx, direction: int):
    """('mesh', partner rank) inside a mesh, ('cross', [mesh indices]) at a boundary into the meshes holding the
    neighbouring stage (one, or several side by side); None at an end of the pipeline. direction: +1 the next
    stage, -1 the previous one."""
    c, plan, layout = ctx.coords, ctx.plan, ctx.layout
    stage = c.stage + direction
    if not 0 <= stage < layout.num_stages:
        return None
    holders = layout.stages[stage]
    for mi, sim in holders:
        if mi == c.mesh_index:
            return "mesh", global_rank(plan, mi, sim, c.dp_rank, c.tp_rank)
    return "cross", [mi for mi, _ in holders]


def crossing(ctx, other: int, shape) -> Crossing:
    """The blocks between the rank's mesh and mesh `other` (at the neighbouring stage) for a local tensor of
    `shape` (seq, micro-batch, hidden)."""
    plan, c, layout = ctx.plan, ctx.coords, ctx.layout
    me_mesh, other_mesh = plan.meshes[c.mesh_index], plan.meshes[other]
    seq, _, hidden = shape
    full = (seq * me_mesh.tp if me_mesh.settings.sequence_parallel else seq, layout.step, hidden)
    if other > c.mesh_index:   # I am the last stage of my mesh; `other` holds the next stage
        before, after = layout.shares(c.stage), layout.shares(c.stage + 1)
        up, down = c.mesh_index, other
        peer_sim = 0
        scale = activation_grad_scale(me_mesh, other_mesh)   # for the gradients I receive from `other`
    else:                      # I am the first stage of my mesh; `other` holds the previous stage
        before, after = layout.shares(c.stage - 1), layout.shares(c.stage)
        up, down = other, c.mesh_index
        peer_sim = other_mesh.num_stages - 1
        scale = 1.0
    up_k = layout.position_of(up).index(up)       # which mesh of its position (the boundary side's list)
    down_k = layout.position_of(down).index(down)
    fwd = [(k, tr) for k, tr in enumerate(compute_transfers(before, after, full))
           if (tr.src_mesh, tr.dst_mesh) == (up_k, down_k)]
    bwd = [(k, tr) for k, tr in enumerate(compute_transfers(after, before, full))
           if (tr.src_mesh, tr.dst_mesh) == (down_k, up_k)]
    inter = me_mesh.cluster != other_mesh.cluster
    return Crossing(fwd=fwd, bwd=bwd, peer_mesh=other, peer_sim=peer_sim, scale=scale, inter=inter,
                    group=ctx.boundary_groups.get((up, down)) if inter else None)
