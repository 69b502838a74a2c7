"""Mesh: one cluster's share of a pipeline, the unit a plan is made of (plan/plan.py puts meshes in order).

A mesh is some consecutive pipeline stages that all use the same TP and DP degree on the same device type. Ranks
are numbered mesh after mesh (mesh 0 owns ranks [0, n0), mesh 1 the next n1, ...); inside a mesh Megatron's own
order applies (tp fastest, then dp, then pp), so each mesh is a Megatron grid with a rank offset. A mesh checks
what it can alone (degrees, recomputation mode, boundary schedule, layer counts, its settings); the rules across
meshes are the plan's (plan/plan.py, plan/shapes.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import InputError
from ..spec.devices import canonical_device_name, get_device
from .settings import RuntimeSettings, minimal_overrides, resolve_settings

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
                             fix="write recompute: none, selective (the MLP re-run) or full (whole layers)")
        if self.boundary_schedule not in BOUNDARY_SCHEDULES:
            raise InputError(f"must be one of {', '.join(BOUNDARY_SCHEDULES)}, got {self.boundary_schedule!r}",
                             field="boundary.schedule", fix="write schedule: blocking or schedule: overlapped")
        if isinstance(self.boundary_depth, bool) or not isinstance(self.boundary_depth, int) or \
                self.boundary_depth < 0:
            raise InputError(f"must be a whole number >= 0, got {self.boundary_depth!r}",
                             field="boundary.depth", fix="write depth: 0, 1, 2, ... (extra warm-up micro-batches)")
        if self.boundary_schedule == "blocking" and self.boundary_depth:
            raise InputError(f"is {self.boundary_depth} on a blocking boundary, which has no extra warm-up",
                             field="boundary.depth", fix="write depth: 0, or schedule: overlapped for a boundary "
                                                         "that sends while the stages compute")
        if isinstance(self.pipeline, bool) or not isinstance(self.pipeline, int) or self.pipeline < 0:
            raise InputError(f"must be a whole number >= 0, got {self.pipeline!r}", field="pipeline",
                             fix="write pipeline: 0 for the first pipeline, 1 for the second, and so on")
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
