"""Plan: the meshes of one or more pipelines in order, the job-wide settings, and the rules across meshes.

A plan is one or more pipelines joined by data parallelism (since format version 3; plan/shapes.py has the shapes).
What follows describes one pipeline. The pipeline, in order, is cut into meshes (plan/mesh.py: one cluster's share
of the pipeline, a Megatron grid with a rank offset).

Invariants (checked on construction, with messages that explain):
- every mesh processes the same samples per micro-batch step: dp_i * micro_batch_size_i is equal
  everywhere (a smaller DP is made up by a larger micro-batch), so all meshes run the same number of
  micro-batches per iteration;
- layer counts sum to the model's; tp divides heads and key/value heads;
- only the first stage of the pipeline (embedding) and the last (output head) may hold zero layers.
Several pipelines, and meshes standing `alongside` another (more replicas of the same stages), generalise these
rules per pipeline and per position (plan/shapes.py, docs/plan-format.md).

This module is where the rest of hetauto imports plans from: Mesh and its tables (plan/mesh.py) and the file's
reader (plan/plan_file.py) are importable from here too.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import InputError
from ..spec.devices import get_device
from ..spec.model import ModelSpec
from . import shapes
from .mesh import (BOUNDARY_SCHEDULES, MAX_GLOBAL_BATCH_SIZE, RECOMPUTE_MODES, RECOMPUTE_SETTINGS,  # noqa: F401
                   Mesh, check_global_batch_size, recompute_settings)
from .plan_file import (PLAN_VERSION, READABLE_VERSIONS, check_readable_version, load_plan, plan_from_dict,  # noqa: F401
                        plan_to_dict, plan_to_yaml, save_plan)
from .engines import DEFAULT_ENGINE, as_run_by, check_engine, selective_runs, recompute_as_run_by
from .precision import DEFAULT_PRECISION, check_precision
from .vocab_padding import model_padded_vocab_size


def launch_nodes(num_devices: int, devices_per_node: int) -> int | None:
    """The nodes one torchrun launch of `num_devices` processes takes, or None where it cannot start: torchrun
    starts the same number of processes on each node of a launch, so a launch takes whole nodes, or part of one
    node when it is smaller than a node (12 processes on 8-device nodes cannot start; 4 can, on one node)."""
    if num_devices < devices_per_node:
        return 1
    return num_devices // devices_per_node if num_devices % devices_per_node == 0 else None


# stages x micro-batches of one pipeline's iteration at most (a few hundred MB of simulation state): 128 stages x
# 65,536 micro-batches (8.4M) fit; published runs have thousands of micro-batches at most
MAX_SCHEDULE_CELLS = 20_000_000

@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    global_batch_size: int
    meshes: tuple[Mesh, ...]
    inventory: dict | None = None     # the inventory the plan was made for (Inventory.to_dict()), optional
    estimate: dict | None = None      # the planner's prediction (times, memory), informational
    version: int = PLAN_VERSION
    precision: str = DEFAULT_PRECISION   # training precision of the whole job (bf16, fp16, fp8, fp32)
    # Samples per iteration of each pipeline (version 3); () means one pipeline training the whole batch. A plan
    # of one pipeline always stores (), so replacing its global_batch_size keeps it valid.
    pipeline_samples: tuple[int, ...] = ()
    # Not in the file: the TP sizes of the other pipelines when this plan is one pipeline of a larger plan
    # (Plan.pipeline), so that its vocabulary is padded as the whole plan's: every pipeline builds one table size.
    vocab_pad_tps: tuple[int, ...] = ()
    # The pipeline engine the plan was made for (engines.py ENGINES): megatron (hetauto's runtime and Megatron-LM)
    # or deepspeed (DeepSpeed's pipeline engine); `simulate` and `emit` use it unless told otherwise.
    engine: str = DEFAULT_ENGINE

    def __post_init__(self):
        object.__setattr__(self, "meshes", tuple(self.meshes))
        samples = tuple(self.pipeline_samples)
        if samples == (self.global_batch_size,):
            samples = ()
        object.__setattr__(self, "pipeline_samples", samples)
        object.__setattr__(self, "vocab_pad_tps", tuple(sorted(set(self.vocab_pad_tps))))
        # Cached (not a field): the single-pipeline properties check it on every call.
        object.__setattr__(self, "_simple", shapes.is_simple(self.meshes))
        check_precision(self.precision)
        if check_engine(self.engine, field="engine").simple_only and not self._simple:
            raise InputError(f"engine {self.engine} runs one pipeline of single meshes; this plan has "
                             f"{shapes.describe_shape(self.meshes)[0]}", field="engine",
                             fix="drop 'engine' (hetauto's runtime runs every plan shape) or make the plan one pipeline")
        check_global_batch_size(self.global_batch_size)
        for i, mesh in enumerate(self.meshes):   # more micro-batches in flight than the batch has samples: a typo
            if mesh.boundary_depth > self.global_batch_size:
                raise InputError(f"is {mesh.boundary_depth}, more extra micro-batches in flight than the global batch "
                                 f"has samples ({self.global_batch_size})", field=f"meshes[{i}].boundary.depth",
                                 fix="write a depth of 0, 1, 2, ... (the planner chooses at most the micro-batch "
                                     "count; docs/plan-format.md)")
        m = self.model
        check_readable_version(self.version)
        if not self.meshes:
            raise InputError("a plan needs at least one mesh", field="meshes",
                             fix="list the meshes in pipeline order (docs/plan-format.md)")
        for i, mesh in enumerate(self.meshes):
            p = f"meshes[{i}]"
            if m.num_attention_heads % mesh.tp or m.num_query_groups % mesh.tp:
                ok = [t for t in range(1, m.num_query_groups + 1)
                      if m.num_attention_heads % t == 0 and m.num_query_groups % t == 0]
                raise InputError(f"tp={mesh.tp} must divide the model's {m.num_attention_heads} attention heads "
                                 f"and {m.num_query_groups} key/value heads", field=f"{p}.tp",
                                 fix=f"choose a tp that divides both: {', '.join(map(str, ok))}")
            if m.ffn_hidden_size % mesh.tp:
                # Megatron's column- and row-parallel MLP weights split the MLP width evenly (core's divide())
                raise InputError(f"tp={mesh.tp} must divide the model's MLP width ffn_hidden_size "
                                 f"{m.ffn_hidden_size}: Megatron shards it evenly over the TP ranks", field=f"{p}.tp",
                                 fix="choose a tp that divides it: " + ", ".join(
                                     str(t) for t in (1, 2, 4, 8, 16) if m.ffn_hidden_size % t == 0))
            if mesh.recompute == "selective" and not selective_runs(m, self.engine):
                raise InputError("is selective, which Megatron-Core 0.19 cannot run for a model with linear biases "
                                 f"({m.name}: its MLP checkpoint returns the bias parameter itself, and the backward "
                                 "re-enters the checkpoint without end)", field=f"{p}.recompute",
                                 fix="write full (whole layers re-run) or none")
            if as_run_by(mesh.settings, self.engine).sequence_parallel and m.seq_length % mesh.tp:
                # Megatron's scatter to the sequence-parallel region splits the sequence evenly, or stops
                raise InputError(f"sequence parallelism splits the {m.seq_length}-token sequence over tp={mesh.tp} "
                                 "ranks, which needs the sequence length to be a multiple of tp",
                                 field=f"{p}.settings.sequence_parallel",
                                 fix="set sequence_parallel: false in this mesh's settings, or choose a tp that "
                                     "divides the sequence length")
        if any(isinstance(n, bool) or not isinstance(n, int) for n in samples):
            raise InputError(f"samples must be whole numbers, got {list(samples)}", field="pipelines",
                             fix="write each pipeline as {samples: N} with N a whole number")
        if (self.version < 3 and not self.is_simple) or (self.version < 3 and samples):
            raise InputError(f"is {self.version}, but the plan uses version-3 keys (`pipelines`, `pipeline`, "
                             "`alongside`)", field="version", fix="write version: 3")
        shapes.check_shapes(self)
        for p in range(self.num_pipelines):
            # the event simulation keeps a time per stage and micro-batch (plan/pipeline.py): bounded, so that a
            # typo in the batch is a message, not gigabytes of memory and a MemoryError
            stages = self.pipeline_stages(p)
            m = self.pipeline_micro_batches(p)
            cells = stages * m
            if cells > MAX_SCHEDULE_CELLS:
                raise InputError(f"pipeline {p} runs {m:,} micro-batches through "
                                 f"{stages} stages per iteration: {cells:,} operations, more than the "
                                 f"{MAX_SCHEDULE_CELLS:,} its schedule is simulated with", field="global_batch_size",
                                 fix="check the global batch (published runs train thousands of samples), or give "
                                     "the meshes larger micro-batches or more DP replicas")

    # ---- the shapes (version 3; plan/shapes.py) --------------------------------------------------------
    @property
    def is_simple(self) -> bool:
        """One pipeline, no alongside mesh: every single-pipeline code path applies unchanged."""
        return self._simple

    @property
    def num_pipelines(self) -> int:
        return self.meshes[-1].pipeline + 1

    @property
    def samples_per_pipeline(self) -> tuple[int, ...]:
        """Samples per iteration of each pipeline (pipeline_samples, or the global batch for one pipeline)."""
        return self.pipeline_samples or (self.global_batch_size,)

    def _pipeline_range(self, p: int) -> range:
        if not 0 <= p < self.num_pipelines:
            raise IndexError(f"pipeline {p} of a plan with {self.num_pipelines} pipeline(s)")
        return shapes.pipeline_ranges(self.meshes)[p]

    def pipeline_mesh_indices(self, p: int) -> list[int]:
        return list(self._pipeline_range(p))

    def positions(self, p: int) -> list[list[int]]:
        """Mesh indices of each position of pipeline p (a mesh and the meshes alongside it), in stage order."""
        return shapes.positions_of(self.meshes, self._pipeline_range(p))

    def pipeline_stages(self, p: int) -> int:
        """Pipeline p's stage count: each position's stages once (meshes alongside one another share them)."""
        return sum(len(self.meshes[pos[0]].stage_layers) for pos in self.positions(p))

    def pipeline(self, p: int) -> "Plan":
        """Pipeline p as a plan of its own (its meshes with pipeline 0, global_batch_size = its samples): simple
        when it has no alongside mesh, so single-pipeline code runs on it. A plan of one pipeline is returned as
        it is; otherwise the estimate (the whole plan's) is left out. Its padded vocabulary is the whole plan's
        (vocab_pad_tps carries the other pipelines' TP sizes), so every pipeline builds the same table. A view
        to run or price, not to save: the file would lose vocab_pad_tps."""
        self._pipeline_range(p)   # IndexError for a pipeline the plan lacks
        if self.num_pipelines == 1:
            return self
        meshes = [dataclasses.replace(self.meshes[i], pipeline=0) for i in self.pipeline_mesh_indices(p)]
        return dataclasses.replace(self, meshes=tuple(meshes), global_batch_size=self.samples_per_pipeline[p],
                                   pipeline_samples=(), estimate=None,
                                   vocab_pad_tps=tuple(m.tp for m in self.meshes) + self.vocab_pad_tps)

    def pipeline_step(self, p: int) -> int:
        """Samples one micro-batch step moves through pipeline p (any of its positions)."""
        return shapes.position_step(self.meshes, self.positions(p)[0])

    def pipeline_micro_batches(self, p: int) -> int:
        return self.samples_per_pipeline[p] // self.pipeline_step(p)

    def locate(self, mesh_index: int) -> tuple[int, int, int]:
        """(pipeline, position inside it, pipeline stage of the mesh's first stage) of a mesh."""
        return shapes.locate(self.meshes, mesh_index)

    def sample_range(self, mesh_index: int, dp_rank: int) -> tuple[int, int]:
        """[start, stop) of a DP replica's samples inside one micro-batch step of its pipeline."""
        return shapes.sample_range(self.meshes, mesh_index, dp_rank)

    def layer_holders(self, layer: int) -> list[tuple[int, int]]:
        """(mesh index, stage in mesh) of every mesh stage holding transformer layer `layer` (0-based)."""
        return shapes.layer_holders(self.meshes, layer, self.model.num_layers)

    def embedding_holders(self) -> list[tuple[int, int]]:
        """(mesh index, stage in mesh) of every first stage of a pipeline (they hold the embedding)."""
        return shapes.end_holders(self.meshes, last=False)

    def head_holders(self) -> list[tuple[int, int]]:
        """(mesh index, stage in mesh) of every last stage of a pipeline (they hold the output head)."""
        return shapes.end_holders(self.meshes, last=True)

    def _simple_only(self, what: str) -> None:
        if not self._simple:
            raise shapes.not_simple_error(self.meshes, f"Plan.{what}")

    # ---- derived (one pipeline; on a plan that is not simple these raise InputError) -------------------
    @property
    def stage_layers(self) -> list[int]:
        self._simple_only("stage_layers")
        return [n for mesh in self.meshes for n in mesh.stage_layers]

    @property
    def pipeline_parallel_size(self) -> int:
        self._simple_only("pipeline_parallel_size")
        return sum(mesh.num_stages for mesh in self.meshes)

    @property
    def samples_per_step(self) -> int:
        self._simple_only("samples_per_step")
        return self.meshes[0].samples_per_step

    @property
    def num_micro_batches(self) -> int:
        self._simple_only("num_micro_batches")
        return self.global_batch_size // self.samples_per_step

    def for_engine(self, engine: str) -> "Plan":
        """This plan made for `engine` (engines.py ENGINES): the engine recorded, and each mesh's settings and
        recomputation written as that engine runs them (`as_run_by`: for DeepSpeed's, no overlaps and no sequence
        parallelism; `recompute_as_run_by`: its selective is full), so that the file says what runs rather than
        what was asked for. The Megatron engine runs every setting as set."""
        meshes = self.meshes if engine == "megatron" else tuple(
            dataclasses.replace(m, setting_overrides=self.settings_as_run(i, engine).to_dict(),
                                recompute=recompute_as_run_by(m.recompute, engine)) for i, m in enumerate(self.meshes))
        return dataclasses.replace(self, meshes=meshes, engine=engine)

    def settings_as_run(self, mesh_index: int, engine: str | None = None):
        """A mesh's settings as `engine` (by default the plan's) runs them at the precision the mesh trains in
        (engines.py `as_run_by`): what the emitters write and the pricing reads."""
        return as_run_by(self.meshes[mesh_index].settings, engine or self.engine, self.mesh_precision(mesh_index))

    def mesh_precision(self, mesh_index: int) -> str:
        """The precision a mesh's ranks train in: the plan's, except that CPU processes (dry runs) train in fp32
        (spec/devices.py); InputError if the mesh's device type lacks the plan's precision (fp8 on an A100)."""
        dev = get_device(self.meshes[mesh_index].device_type)
        try:
            return dev.at_precision(self.precision, field="precision").precision
        except InputError as exc:       # a fix in the plan's own terms (a version-1 file has no precision key)
            raise InputError(exc.reason, file=exc.file, field="precision",
                             fix=f"write precision: {' or '.join(dev.precisions)} in the plan"
                                 + (" (and version: 2: a version-1 file has no precision key)" if self.version == 1
                                    else "") + ", or re-plan without that cluster (hetauto plan --exclude-clusters)"
                             ) from None

    def check_precision(self, file: str | None = None) -> None:
        """Every mesh's device trains in the plan's precision (mesh_precision), the refusal naming `file`: checked
        by every command that runs or launches the plan (emit, dryrun), as simulate prices it."""
        for k in range(len(self.meshes)):
            try:
                self.mesh_precision(k)
            except InputError as exc:
                raise exc.within(file=file) from None

    @property
    def vocab_tps(self) -> list[int]:
        """The TP sizes the vocabulary is padded for: every mesh's, and a pipeline view's other pipelines'."""
        return [mesh.tp for mesh in self.meshes] + list(self.vocab_pad_tps)

    @property
    def padded_vocab_size(self) -> int:
        """The vocabulary every mesh builds: padded once for all meshes' TP sizes (plan.vocab_padding)."""
        return model_padded_vocab_size(self.model, self.vocab_tps)

    @property
    def world_size(self) -> int:
        return sum(mesh.num_devices for mesh in self.meshes)

    def launch_meshes(self, mesh_index: int) -> list[int]:
        """Indices of the meshes one launch serves with the mesh's: those of its cluster in its pipeline (one
        launch script each, emit/launches.py), whose arguments a typed flag may match."""
        mesh = self.meshes[mesh_index]
        return [i for i, m in enumerate(self.meshes) if m.cluster == mesh.cluster and m.pipeline == mesh.pipeline]

    def rank_offset(self, mesh_index: int) -> int:
        return sum(mesh.num_devices for mesh in self.meshes[:mesh_index])

    def launch_groups(self) -> list[tuple[int, ...]]:
        """The meshes each torchrun starts together: runs of consecutive meshes on one cluster in one pipeline
        (a launch starts on nodes of its own, whole nodes or part of one: its first rank is the first device of
        a node; launch_nodes)."""
        groups, i = [], 0
        while i < len(self.meshes):
            j = i
            while (j + 1 < len(self.meshes) and self.meshes[j + 1].cluster == self.meshes[i].cluster
                   and self.meshes[j + 1].pipeline == self.meshes[i].pipeline):
                j += 1
            groups.append(tuple(range(i, j + 1)))
            i = j + 1
        return groups

    def check_whole_nodes(self, node_shape, file: str | None = None) -> None:
        """InputError naming the first launch torchrun cannot start, or the first cluster whose launches need
        more nodes than it has. `node_shape(cluster)` gives (devices per node, nodes or None where unknown).
        torchrun starts the same number of processes on every node of a launch, and a launch starts on a node of
        its own (launch_nodes)."""
        nodes_taken: dict[str, int] = {}
        for group in self.launch_groups():
            cluster = self.meshes[group[0]].cluster
            dpn, nodes = node_shape(cluster)
            n = sum(self.meshes[k].num_devices for k in group)
            taken = launch_nodes(n, dpn)
            if taken is None:
                raise InputError(
                    f"cluster {cluster} runs {n} processes in one launch, not a whole number of {dpn}-device nodes "
                    "(nor fewer than one node), so torchrun cannot start them with one --nproc-per-node",
                    file=file, field=f"meshes[{group[0]}]",
                    fix=f"use whole {dpn}-device nodes of cluster {cluster} (change the meshes' dp or stages, or "
                        "re-plan: the planner uses whole nodes)")
            nodes_taken[cluster] = nodes_taken.get(cluster, 0) + taken
            if nodes is not None and nodes_taken[cluster] > nodes:
                raise InputError(
                    f"the launches on cluster {cluster} need {nodes_taken[cluster]} nodes (each launch starts on "
                    f"nodes of its own), and it has {nodes}", file=file, field=f"meshes[{group[0]}]",
                    fix=f"put cluster {cluster}'s meshes on fewer nodes, or re-plan")

    def check_tp_inside_nodes(self, devices_per_node, file: str | None = None) -> None:
        """InputError naming the first TP group that would span two nodes. `devices_per_node(cluster)` gives a
        cluster's node size. Ranks go mesh after mesh, TP fastest (docs/plan-format.md), from the first device of a
        launch's first node: a TP group of ranks [s, s + tp) stays in a node when s and s + tp - 1 fall in the same
        one."""
        for group in self.launch_groups():
            start = 0
            for k in group:
                mesh = self.meshes[k]
                dpn = devices_per_node(mesh.cluster)
                for s in range(start, start + mesh.num_devices, mesh.tp):
                    if s // dpn != (s + mesh.tp - 1) // dpn:
                        raise InputError(
                            f"tp={mesh.tp} puts devices {s}-{s + mesh.tp - 1} of cluster {mesh.cluster} (counted from "
                            f"its launch's first node) in one TP group, across two of its {dpn}-device nodes; tensor "
                            "parallelism must stay inside a node", file=file, field=f"meshes[{k}].tp",
                            fix=f"use a tp that divides {dpn} (and the devices of the meshes before it on that "
                                "cluster), and re-plan")
                start += mesh.num_devices

    def first_stage(self, mesh_index: int) -> int:
        """Global pipeline stage index of a mesh's first stage."""
        self._simple_only("first_stage")
        return sum(mesh.num_stages for mesh in self.meshes[:mesh_index])

    def stage_owner(self, stage: int) -> tuple[int, int]:
        """(mesh index, stage index inside that mesh) for a global pipeline stage."""
        self._simple_only("stage_owner")
        for i, mesh in enumerate(self.meshes):
            if stage < mesh.num_stages:
                return i, stage
            stage -= mesh.num_stages
        raise IndexError(stage)

    # ---- file format (plan/plan_file.py) ----------------------------------------------------------------
    def to_dict(self) -> dict:
        return plan_to_dict(self)

    def to_yaml(self) -> str:
        return plan_to_yaml(self)

    def save(self, path: str) -> None:
        save_plan(self, path)
