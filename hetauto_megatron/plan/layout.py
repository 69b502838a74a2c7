"""The stages of one pipeline of a plan: which meshes hold each stage, their layers, and which samples of a
micro-batch step each replica holds. Pure arithmetic on the plan (no torch): the emitted arguments, the
`--hetauto` rewrite and the runtime (runtime/layout.py adds the rank lists and transfer shares) all ask it.

A pipeline stage may be held by several meshes side by side (a *position*: a mesh and its `alongside` meshes,
docs/plan-format.md): more data-parallel replicas of the same layers, possibly with another TP degree and
micro-batch size. The step's samples are split mesh after mesh inside the position, replica after replica inside
a mesh (`Plan.sample_range`). For a plan of single-mesh positions this is the familiar pipeline: stage s is held
by one mesh, replica d holds samples [d * mbs, (d + 1) * mbs).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..spec.devices import get_device
from .pipeline import warmup_forwards
from .pipeline_memory import memory_terms
from .shapes import boundary_depth
from .staged_pieces import BoundarySides, boundary_staging


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
        return [n for pos in self.positions for n in self.plan.meshes[pos[0]].stage_layers]

    def first_stage(self, mesh_index: int) -> int:
        """Pipeline stage of a mesh's first stage."""
        pipeline, _, stage = self.plan.locate(mesh_index)
        if pipeline != self.pipeline:
            raise ValueError(f"mesh {mesh_index} is not in pipeline {self.pipeline}")
        return stage

    def position_of(self, mesh_index: int) -> list[int]:
        """Mesh indices of the position holding a mesh (the mesh and those alongside it), in mesh order."""
        return next(pos for pos in self.positions if mesh_index in pos)

    # ---- schedule ---------------------------------------------------------------------------------------
    @cached_property
    def boundary_depths(self) -> list[int | None]:
        """Per boundary (between stages s and s + 1): the warm-up depth of an overlapped boundary, None where it
        is blocking: inside a mesh always, between positions as plan/shapes.py `boundary_depth` says."""
        meshes, positions = self.plan.meshes, self.positions
        out = []
        for pos, nxt in zip(positions, positions[1:] + [None]):
            out += [None] * (meshes[pos[0]].num_stages - 1)
            if nxt is not None:      # no boundary after the last stage
                out.append(boundary_depth([meshes[i] for i in pos], [meshes[i] for i in nxt]))
        return out

    @cached_property
    def warmup_forwards(self) -> tuple[int, ...]:
        """Per stage, its 1F1B warm-up forwards before the cap at the micro-batches (plan/pipeline.py
        `warmup_forwards`: the stages after it plus the depths of the overlapped boundaries after it)."""
        return warmup_forwards(self.num_stages, [d or 0 for d in self.boundary_depths])

    @cached_property
    def memory_terms(self) -> tuple[list, list]:
        """(in-flight micro-batches, boundary buffers) per stage, as the planner's memory model prices them
        (plan/pipeline_memory.py `memory_terms`), received pieces and sends in flight priced where a side's devices are
        CPUs."""
        return self.memory_terms_on(lambda mesh: get_device(mesh.device_type).vendor == "cpu")

    def memory_terms_on(self, on_cpu) -> tuple[list, list]:
        """`memory_terms` with `on_cpu(mesh)` saying where a mesh's processes run on CPU (the dry run: all of
        them), where the pieces an overlapped boundary receives and the blocks it sends are the same memory
        (plan/staged_pieces.py)."""
        depths = self.boundary_depths
        meshes, seq = self.plan.meshes, self.plan.model.seq_length
        staged = []
        for s, d in enumerate(depths):
            if d is None:
                staged.append(BoundarySides())
                continue
            (a, _), (b, _) = self.stages[s][0], self.stages[s + 1][0]   # one mesh each side where overlapped
            before, after = meshes[a], meshes[b]
            staged.append(boundary_staging(before, after, seq, on_cpu(before), on_cpu(after)))
        return memory_terms(self.num_stages, self.num_micro_batches, [d is None for d in depths],
                            [d or 0 for d in depths], staged)

    # ---- samples ----------------------------------------------------------------------------------------
    @cached_property
    def step(self) -> int:
        """Samples one micro-batch step moves through every stage (all replicas of all meshes of a position)."""
        return self.plan.pipeline_step(self.pipeline)

    @property
    def samples(self) -> int:
        """Samples this pipeline trains per iteration."""
        return self.plan.samples_per_pipeline[self.pipeline]

    @property
    def num_micro_batches(self) -> int:
        return self.samples // self.step

    def sample_range(self, mesh_index: int, dp_rank: int) -> tuple[int, int]:
        return tuple(self.plan.sample_range(mesh_index, dp_rank))

    def sample_share(self, mesh_index: int) -> float:
        """The fraction of each step's samples a mesh holds (1 for a mesh alone at its position)."""
        return self.plan.meshes[mesh_index].samples_per_step / self.step


def mesh_layout(plan, mesh_index: int) -> PipelineLayout:
    """The layout of the pipeline a mesh belongs to."""
    return PipelineLayout(plan, plan.meshes[mesh_index].pipeline)


def megatron_layout(stage_layers) -> str | None:
    """Megatron's --pipeline-model-parallel-layout for an uneven split: 'E' (embedding) opens the first stage,
    'L' (loss/output head) closes the last, 't*n' are n transformer layers, '|' separates stages.
    E.g. [3, 2, 1] -> 'Et*3|t*2|tL'; an empty first stage is just 'E'. None for one stage (nothing to split)."""
    last = len(stage_layers) - 1
    if last < 1:
        return None
    parts = []
    for s, n in enumerate(stage_layers):
        body = "" if n == 0 else ("t" if n == 1 else f"t*{n}")
        parts.append(("E" if s == 0 else "") + body + ("L" if s == last else ""))
    return "|".join(parts)
