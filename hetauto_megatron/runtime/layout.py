"""The stages of one pipeline of a plan as the runtime sees them: plan/layout.py's PipelineLayout (stages, layers,
samples; pure arithmetic the planner, emit and the `--hetauto` rewrite share) plus what needs the runtime's own
modules: the global ranks of a stage and the boundary shares the transfers are computed from.

Pure: no torch. Every part of the runtime asks this layout (not the plan's single-pipeline properties, which a
plan with alongside meshes does not have) where stages and samples are.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..plan import layout as _plan_layout
from .transfers import Share


@dataclass(frozen=True)
class PipelineLayout(_plan_layout.PipelineLayout):
    def stage_ranks(self, stage: int) -> list[int]:
        """Global ranks of a stage: mesh after mesh, inside a mesh Megatron's order (dp-major, tp fastest)."""
        from .ranks import stage_ranks

        return stage_ranks(self.plan, stage, self.pipeline)

    def shares(self, stage: int) -> list[Share]:
        """The meshes holding a stage as `compute_transfers` takes a boundary side: TP, DP, samples, SP."""
        out = []
        for i, _ in self.stages[stage]:
            mesh = self.plan.meshes[i]
            start = self.sample_range(i, 0)[0]
            out.append(Share(mesh.tp, mesh.dp, start, start + mesh.samples_per_step, mesh.settings.sequence_parallel))
        return out
