"""Plan and Mesh: the file format every other part of hetauto reads.

A plan is one or more pipelines joined by data parallelism (format version 3; plan/shapes.py has the shapes).
What follows describes one pipeline. The pipeline, in order, is cut into meshes. A mesh is one cluster's share
of the pipeline: some consecutive stages that all use the same TP and DP degree on the same device type. Ranks
are numbered mesh after mesh (mesh 0 owns ranks [0, n0), mesh 1 the next n1, ...); inside a mesh Megatron's own
order applies (tp fastest, then dp, then pp), so each mesh is a Megatron grid with a rank offset.

Invariants (checked on construction, with messages that explain):
- every mesh processes the same samples per micro-batch step: dp_i * micro_batch_size_i is equal
  everywhere (a smaller DP is made up by a larger micro-batch), so all meshes run the same number of
  micro-batches per iteration;
- layer counts sum to the model's; tp divides heads and key/value heads;
- only the first stage of the pipeline (embedding) and the last (output head) may hold zero layers.
Several pipelines, and meshes standing `alongside` another (more replicas of the same stages), generalise these
rules per pipeline and per position (plan/shapes.py, docs/plan-format.md).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import yaml

from ..errors import InputError
from ..spec._fields import get, reject_unknown, require_mapping
from ..spec.devices import canonical_device_name, get_device
from ..spec.inventory import inventory_from_dict
from ..spec.model import ModelSpec, model_from_dict, load_yaml_file
from . import shapes
from .settings import (DEFAULT_ENGINE, DEFAULT_PRECISION, RuntimeSettings, as_run_by, check_engine, check_precision,
                       minimal_overrides, padded_vocab_size, resolve_settings)

PLAN_VERSION = 3
# Version 1 has no per-mesh `settings` (the defaults apply) and no `precision` (bf16, what it was made for).
# Version 3 adds several pipelines (`pipelines`, `meshes[*].pipeline`) and mixed replicas (`meshes[*].alongside`).
READABLE_VERSIONS = (1, 2, 3)
RECOMPUTE_MODES = ("none", "selective", "full")
BOUNDARY_SCHEDULES = ("blocking", "overlapped")
# What each mode means in Megatron's TransformerConfig; the cost model, the emitted arguments and the runtime all
# follow this one table. 'selective' re-runs the MLP: with flash attention Megatron's default module
# (core_attn) saves almost nothing.
RECOMPUTE_SETTINGS = {
    "none": {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None,
             "recompute_modules": None},
    "selective": {"recompute_granularity": "selective", "recompute_method": None, "recompute_num_layers": None,
                  "recompute_modules": ["mlp"]},
    "full": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1,
             "recompute_modules": None},
}


def recompute_settings(mode: str) -> dict:
    """Megatron's recompute settings for a mesh's `recompute` mode (a fresh dict: callers may keep it)."""
    return {k: (list(v) if isinstance(v, list) else v) for k, v in RECOMPUTE_SETTINGS[mode].items()}


@dataclass(frozen=True)
class Mesh:
    cluster: str
    device_type: str
    tp: int
    dp: int
    micro_batch_size: int
    recompute: str
    stage_layers: tuple[int, ...]
    # The plan's overrides of the runtime-settings defaults (plan/settings.py), as sorted (key, value) pairs so
    # the mesh stays hashable; a dict is accepted. `settings` resolves them.
    setting_overrides: tuple = ()
    # The schedule of the pipeline boundary after this mesh (plan/pipeline.py): "blocking" (the sender waits for
    # its transfer) or "overlapped" (asynchronous, `boundary_depth` extra warm-up micro-batches in flight); only a
    # boundary into another cluster may be overlapped.
    boundary_schedule: str = "blocking"
    boundary_depth: int = 0
    # Version 3: the pipeline this mesh belongs to (0, 1, ...), and whether it stands alongside the mesh before it
    # (more data-parallel replicas of the same stages, possibly another device type, TP and micro-batch).
    pipeline: int = 0
    alongside: bool = False

    def __post_init__(self):
        object.__setattr__(self, "stage_layers", tuple(int(x) for x in self.stage_layers))
        overrides = self.setting_overrides
        if isinstance(overrides, dict):
            overrides = overrides.items()
        # Normalised to the values that change something, so equal settings mean equal meshes.
        object.__setattr__(self, "setting_overrides", minimal_overrides(self.tp, dict(overrides)))
        canon = canonical_device_name(self.device_type)
        if canon is None:
            get_device(self.device_type, field="device_type")  # raises with the catalog listed
        object.__setattr__(self, "device_type", canon)
        for key in ("tp", "dp", "micro_batch_size"):
            if getattr(self, key) < 1:
                raise InputError(f"must be at least 1, got {getattr(self, key)}", field=key,
                                 fix=f"set {key}: 1 or more")
            if getattr(self, key) > MAX_GLOBAL_BATCH_SIZE:    # no mesh is wider than the largest batch is long
                raise InputError(f"is {getattr(self, key)}, more than {MAX_GLOBAL_BATCH_SIZE:,}", field=key,
                                 fix=f"set {key} to the mesh's size (docs/plan-format.md)")
        if self.recompute not in RECOMPUTE_MODES:
            raise InputError(f"must be one of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}", field="recompute",
                             fix="write recompute: none, selective (attention only) or full (whole layers)")
        if self.boundary_schedule not in BOUNDARY_SCHEDULES:
            raise InputError(f"must be one of {', '.join(BOUNDARY_SCHEDULES)}, got {self.boundary_schedule!r}",
                             field="boundary.schedule", fix="write schedule: blocking or schedule: overlapped")
        if isinstance(self.boundary_depth, bool) or not isinstance(self.boundary_depth, int) or \
                self.boundary_depth < 0 or (self.boundary_schedule == "blocking" and self.boundary_depth):
            raise InputError(f"must be a whole number >= 0 (0 for a blocking boundary), got {self.boundary_depth!r}",
                             field="boundary.depth", fix="write depth: 0, 1, 2, ... (extra warm-up micro-batches)")
        if isinstance(self.pipeline, bool) or not isinstance(self.pipeline, int) or self.pipeline < 0:
            raise InputError(f"must be a whole number >= 0, got {self.pipeline!r}", field="pipeline",
                             fix="write pipeline: 0 for the first pipeline, 1 for the second, ...")
        if not isinstance(self.alongside, bool):
            raise InputError(f"must be true or false, got {self.alongside!r}", field="alongside",
                             fix="write alongside: true, or leave the key out")
        if not self.stage_layers:
            raise InputError("is empty: a mesh needs at least one pipeline stage", field="stage_layers",
                             fix="list the transformer layers of each stage, e.g. [10, 10]")
        if any(x < 0 for x in self.stage_layers):
            raise InputError(f"layer counts must not be negative: {list(self.stage_layers)}", field="stage_layers",
                             fix="give each stage 0 or more transformer layers")
        self.settings  # validates the overrides

    @property
    def settings(self) -> RuntimeSettings:
        """The runtime settings this mesh runs with: the defaults for its TP, with the plan's overrides."""
        return resolve_settings(self.tp, dict(self.setting_overrides))

    @property
    def num_stages(self) -> int:
        return len(self.stage_layers)

    @property
    def num_devices(self) -> int:
        return self.tp * self.dp * self.num_stages

    @property
    def samples_per_step(self) -> int:
        """Samples one micro-batch step moves through this mesh (all DP replicas together)."""
        return self.dp * self.micro_batch_size

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["stage_layers"] = list(self.stage_layers)
        del d["setting_overrides"], d["boundary_schedule"], d["boundary_depth"], d["pipeline"], d["alongside"]
        d["settings"] = self.settings.to_dict()   # written in full: the file says what runs
        return d


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
    # The pipeline engine the plan was made for (settings.py ENGINES): megatron (hetauto's runtime and Megatron-LM)
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
        m = self.model
        if self.version not in READABLE_VERSIONS:
            raise InputError(f"plan version {self.version} is not supported (this hetauto reads versions "
                             f"{', '.join(map(str, READABLE_VERSIONS))})", field="version",
                             fix=f"re-create the plan with this hetauto's 'hetauto plan', or set version: {PLAN_VERSION} "
                                 "if the file follows docs/plan-format.md")
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
        if any(isinstance(n, bool) or not isinstance(n, int) for n in samples):
            raise InputError(f"samples must be whole numbers, got {list(samples)}", field="pipelines",
                             fix="write each pipeline as {samples: N} with N a whole number")
        if (self.version < 3 and not self.is_simple) or (self.version < 3 and samples):
            raise InputError(f"is {self.version}, but the plan uses version-3 keys (`pipelines`, `pipeline`, "
                             "`alongside`)", field="version", fix="write version: 3")
        shapes.check_shapes(self)

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
        """This plan made for `engine` (settings.py ENGINES): the engine recorded, and each mesh's settings written
        as that engine runs them (`as_run_by`: for DeepSpeed's, no overlaps and no sequence parallelism), so that
        the file says what runs rather than what was asked for. The Megatron engine runs every setting as set."""
        meshes = self.meshes if engine == "megatron" else tuple(
            dataclasses.replace(m, setting_overrides=as_run_by(m.settings, engine).to_dict()) for m in self.meshes)
        return dataclasses.replace(self, meshes=meshes, engine=engine)

    def mesh_precision(self, mesh_index: int) -> str:
        """The precision a mesh's ranks train in: the plan's, except that CPU processes (dry runs) train in fp32
        (spec/devices.py); InputError if the mesh's device type lacks the plan's precision (fp8 on an A100)."""
        dev = get_device(self.meshes[mesh_index].device_type)
        return dev.at_precision(self.precision, field="precision").precision

    @property
    def vocab_tps(self) -> list[int]:
        """The TP sizes the vocabulary is padded for: every mesh's, and a pipeline view's other pipelines'."""
        return [mesh.tp for mesh in self.meshes] + list(self.vocab_pad_tps)

    @property
    def padded_vocab_size(self) -> int:
        """The vocabulary every mesh builds: padded once for all meshes' TP sizes (plan.settings)."""
        return padded_vocab_size(self.model.vocab_size, self.vocab_tps)

    @property
    def world_size(self) -> int:
        return sum(mesh.num_devices for mesh in self.meshes)

    def rank_offset(self, mesh_index: int) -> int:
        return sum(mesh.num_devices for mesh in self.meshes[:mesh_index])

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

    # ---- file format ----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {"version": PLAN_VERSION, "model": self.model.to_dict(), "global_batch_size": self.global_batch_size,
             "precision": self.precision}
        if self.engine != DEFAULT_ENGINE:       # optional: absent means megatron (files without it read as before)
            d["engine"] = self.engine
        if self.num_pipelines > 1:
            d["pipelines"] = [{"samples": n} for n in self.samples_per_pipeline]
        d["meshes"] = [mesh.to_dict() for mesh in self.meshes]
        for i, (mesh, out) in enumerate(zip(self.meshes, d["meshes"])):
            if self.num_pipelines > 1:
                out["pipeline"] = mesh.pipeline
            if mesh.alongside:
                out["alongside"] = True
            nxt = self.meshes[i + 1] if i + 1 < len(self.meshes) else None
            # Written in full where a boundary crosses clusters between single meshes: it says what runs.
            if (nxt is not None and nxt.pipeline == mesh.pipeline and not nxt.alongside and nxt.cluster != mesh.cluster
                    and not mesh.alongside and not (i + 2 < len(self.meshes) and self.meshes[i + 2].alongside
                                                    and self.meshes[i + 2].pipeline == mesh.pipeline)) \
                    or mesh.boundary_schedule != "blocking":
                out["boundary"] = {"schedule": mesh.boundary_schedule, "depth": mesh.boundary_depth}
        if self.inventory is not None:
            d["inventory"] = self.inventory
        if self.estimate is not None:
            d["estimate"] = self.estimate
        return d

    def to_yaml(self) -> str:
        return "# hetauto plan: pipeline order, one mesh per cluster share (docs/plan-format.md)\n" + \
            yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=120)

    def save(self, path: str) -> None:
        text = json.dumps(self.to_dict(), indent=2) + "\n" if path.endswith(".json") else self.to_yaml()
        with open(path, "w") as fh:
            fh.write(text)


# Samples per iteration: far above any published run (thousands), and what keeps the simulator's 1F1B events
# (micro-batch steps x stages, ~10 s per million steps) from running for ever on a typo.
MAX_GLOBAL_BATCH_SIZE = 1_000_000


def check_global_batch_size(value: int, *, field: str = "global_batch_size", file: str | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"must be a whole number of samples, at least 1, got {value!r}", file=file, field=field,
                         fix="give the samples per iteration of the whole job, e.g. 512")
    if value > MAX_GLOBAL_BATCH_SIZE:
        raise InputError(f"is {value:,} samples per iteration, more than {MAX_GLOBAL_BATCH_SIZE:,} (published runs "
                         "train thousands)", file=file, field=field,
                         fix="give the samples per iteration of the whole job, e.g. 512")
    return value


_MESH_KEYS = {"cluster", "device_type", "tp", "dp", "micro_batch_size", "recompute", "stage_layers", "settings",
              "boundary", "pipeline", "alongside"}


def _layer_counts(values: list, prefix: str, file: str | None) -> list[int]:
    # Checked here, not by int(): 2.5 layers must not silently become 2, nor `true` become 1.
    for j, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(f"must be a whole number of layers, got {v!r}", file=file,
                             field=f"{prefix}stage_layers[{j}]", fix="write integer layer counts, e.g. [10, 10]")
    return values


def plan_from_dict(data: dict, *, file: str | None = None) -> Plan:
    data = require_mapping(data, "a plan", file)
    reject_unknown(data, {"version", "model", "global_batch_size", "precision", "engine", "pipelines", "meshes",
                          "inventory", "estimate"}, file=file)
    version = get(data, "version", int, file=file, fix=f"add 'version: {PLAN_VERSION}' at the top")
    model = model_from_dict(require_mapping(get(data, "model", dict, file=file), "model", file), file=file,
                            prefix="model.")
    gbs = get(data, "global_batch_size", int, file=file)
    precision = check_precision(get(data, "precision", str, default=DEFAULT_PRECISION, file=file), file=file)
    engine = get(data, "engine", str, default=DEFAULT_ENGINE, file=file)
    check_engine(engine, field="engine", file=file)
    pipeline_samples = []
    for p, raw in enumerate(get(data, "pipelines", list, default=[], file=file)):
        raw = require_mapping(raw, f"pipelines[{p}]", file)
        reject_unknown(raw, {"samples"}, file=file, prefix=f"pipelines[{p}].")
        pipeline_samples.append(get(raw, "samples", int, file=file, prefix=f"pipelines[{p}].",
                                    fix="write {samples: N}: the samples this pipeline trains per iteration"))
    meshes = []
    for i, raw in enumerate(get(data, "meshes", list, file=file)):
        p = f"meshes[{i}]."
        raw = require_mapping(raw, f"meshes[{i}]", file)
        reject_unknown(raw, _MESH_KEYS, file=file, prefix=p)
        boundary = require_mapping(raw.get("boundary") or {}, f"meshes[{i}].boundary", file)
        reject_unknown(boundary, {"schedule", "depth"}, file=file, prefix=f"{p}boundary.")
        try:
            meshes.append(Mesh(
                cluster=str(get(raw, "cluster", (str, int), file=file, prefix=p)),
                device_type=get(raw, "device_type", str, file=file, prefix=p),
                tp=get(raw, "tp", int, default=1, file=file, prefix=p),
                dp=get(raw, "dp", int, default=1, file=file, prefix=p),
                micro_batch_size=get(raw, "micro_batch_size", int, file=file, prefix=p),
                recompute=get(raw, "recompute", str, default="none", file=file, prefix=p),
                stage_layers=tuple(_layer_counts(get(raw, "stage_layers", list, file=file, prefix=p), p, file)),
                setting_overrides=require_mapping(raw.get("settings") or {}, f"meshes[{i}].settings", file),
                boundary_schedule=get(boundary, "schedule", str, default="blocking", file=file, prefix=f"{p}boundary."),
                boundary_depth=get(boundary, "depth", int, default=0, file=file, prefix=f"{p}boundary."),
                pipeline=get(raw, "pipeline", int, default=0, file=file, prefix=p),
                alongside=get(raw, "alongside", bool, default=False, file=file, prefix=p),
            ))
        except InputError as exc:
            raise exc.within(file=file, prefix=f"meshes[{i}]") if exc.file is None else exc from None
        except (TypeError, ValueError) as exc:
            raise InputError(f"has a malformed value ({exc})", file=file, field=f"meshes[{i}]",
                             fix="compare it with docs/plan-format.md") from None
    if data.get("estimate") is not None:     # informational, but every reader takes it for a mapping
        require_mapping(data["estimate"], "the plan's estimate", file)
    if data.get("inventory") is not None:
        # the stored inventory is what emit reads node sizes and memory from: a broken one is named here, not as a
        # plan that "does not list" its own clusters
        try:
            inventory_from_dict(data["inventory"], file=file)
        except InputError as exc:
            raise exc.within(file=file, prefix="inventory") from None
    try:
        return Plan(model=model, global_batch_size=gbs, meshes=tuple(meshes),
                    inventory=data.get("inventory"), estimate=data.get("estimate"), version=version,
                    precision=precision, pipeline_samples=tuple(pipeline_samples), engine=engine)
    except InputError as exc:
        raise exc.within(file=file) from None


def load_plan(path: str) -> Plan:
    return plan_from_dict(load_yaml_file(path, "plan"), file=path)
