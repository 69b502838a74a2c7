"""The stages of one pipeline of a plan as the runtime sees them: which meshes hold each stage, and which samples
of a micro-batch step each replica holds.

A pipeline stage may be held by several meshes side by side (a *position*: a mesh and its `alongside` meshes,
docs/plan-format.md): more data-parallel replicas of the same layers, possibly with another TP degree and
micro-batch size. The step's samples are split mesh after mesh inside the position, replica after replica inside
a mesh (`Plan.sample_range`). For a plan of single-mesh positions this is the familiar pipeline: stage s is held
by one mesh, replica d holds samples [d * mbs, (d + 1) * mbs).

Pure: no torch. Every part of the runtime asks this layout (not the plan's single-pipeline properties, which a
plan with alongside meshes does not have) where stages and samples are.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .transfers import Share


@dataclass(frozen=True)
class PipelineLayout:
    plan: object
    pipeline: int = 0

    # ---- stages -----------------------------------------------------------------------------------------
    @cached_property
    def positions(self) -> list[list[int]]:
        """Mesh indices of each position (meshes side by side), in pipeline order."""
        return [list(p) for p in self.plan.positions(self.pipeline)]

    @cached_property
    def stages(self) -> list[list[tuple[int, int]]]:
        """Per pipeline stage: (mesh index, stage inside that mesh) of every mesh holding it, in mesh order."""
        out = []
        for pos in self.positions:
            for s in range(self.plan.meshes[pos[0]].num_stages):
                out.append([(i, s) for i in pos])
        return out

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @cached_property
    def stage_layers(self) -> list[int]:
        """Transformer layers of each stage (the same on every mesh holding it)."""
        return [self.plan.meshes[pos[0]].stage_layers[s] for pos in self.positions
                for s in range(self.plan.meshes[pos[0]].num_stages)]

    def first_stage(self, mesh_index: int) -> int:
        """Pipeline stage of a mesh's first stage."""
        stage = 0
        for pos in self.positions:
            if mesh_index in pos:
                return stage
            stage += self.plan.meshes[pos[0]].num_stages
        raise ValueError(f"mesh {mesh_index} is not in pipeline {self.pipeline}")

    def position_of(self, mesh_index: int) -> list[int]:
        """Mesh indices of the position holding a mesh (the mesh and those alongside it), in mesh order."""
        return next(pos for pos in self.positions if mesh_index in pos)

    def stage_ranks(self, stage: int) -> list[int]:
        """Global ranks of a stage: mesh after mesh, inside a mesh Megatron's order (dp-major, tp fastest)."""
        from .groups import stage_ranks

        return stage_ranks(self.plan, stage, self.pipeline)

    # ---- samples ----------------------------------------------------------------------------------------
    @cached_property
    def step(self) -> int:
        """Samples one micro-batch step moves through every stage (all replicas of all meshes of a position)."""
        return sum(self.plan.meshes[i].samples_per_step for i in self.positions[0])

    @property
    def samples(self) -> int:
        """Samples this pipeline trains per iteration."""
        return self.plan.pipeline(self.pipeline).global_batch_size

    @property
    def num_micro_batches(self) -> int:
        return self.samples // self.step

    def sample_range(self, mesh_index: int, dp_rank: int) -> tuple[int, int]:
        return tuple(self.plan.sample_range(mesh_index, dp_rank))

    def shares(self, stage: int) -> list[Share]:
        """The meshes holding a stage as `compute_transfers` takes a boundary side: TP, DP, samples, SP."""
        out = []
        for i, _ in self.stages[stage]:
            mesh = self.plan.meshes[i]
            start = self.sample_range(i, 0)[0]
            out.append(Share(mesh.tp, mesh.dp, start, start + mesh.samples_per_step, mesh.settings.sequence_parallel))
        return out

    def sample_share(self, mesh_index: int) -> float:
        """The fraction of each step's samples a mesh holds (1 for a mesh alone at its position)."""
        return self.plan.meshes[mesh_index].samples_per_step / self.step
