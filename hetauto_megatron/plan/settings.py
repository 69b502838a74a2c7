"""Runtime settings per mesh: the one table the cost model, the emitted arguments, the `--hetauto` rewrite,
the dry run and the DeepSpeed emitter all read.

A plan is only worth what its predictions are worth, and a prediction is only right if it prices what runs.
So every setting that changes time or memory lives here, once, with its default and its Megatron spelling;
nothing else in hetauto decides them:

    sequence_parallel       on for TP > 1: activations and element-wise work outside the TP regions are split
                            over the TP ranks (Megatron's --sequence-parallel)
    distributed_optimizer   Adam state and fp32 master weights sharded over the mesh's DP group (ZeRO-1,
                            Megatron's --use-distributed-optimizer); gradients are reduce-scattered
    overlap_grad_reduce     the DP gradient reduce-scatter runs bucket by bucket during the backward pass
    overlap_param_gather    the parameter all-gather of the distributed optimizer runs during the next forward
    grad_reduce_dtype       the element type of the DP gradient reduction: fp32 (Megatron's default,
                            grad_reduce_in_fp32) or the training precision ("param")
    hidden_dropout          dropout probability after the embedding and after each layer's attention and MLP
                            (Megatron's --hidden-dropout); above 0 every such dropout keeps its mask for the
                            backward pass
    attention_dropout       dropout probability on the attention probabilities (--attention-dropout); above 0 an
                            unfused attention keeps its mask and the dropped probabilities (flash attention
                            regenerates them)

Dropout defaults to 0: LLM pre-training runs without it (LLaMA, GPT-NeoX; Megatron-LM's own LLaMA examples pass
--attention-dropout 0.0 --hidden-dropout 0.0). Megatron's own default is 0.1 for both, so the emitted arguments
and the --hetauto rewrite always state the plan's values.

A mesh may override any of them in the plan file (`settings:` in a mesh, docs/plan-format.md); the defaults
are what `hetauto plan` assumes and what production Megatron jobs run.

Beside this table, and read by the same readers: what each pipeline engine does with these settings
(plan/engines.py `ENGINES`, `as_run_by`), their Megatron-LM spelling (plan/megatron_flags.py `MEGATRON_ARGS`), and
two job-wide properties: the training precision (plan/precision.py) and the padded vocabulary
(plan/vocab_padding.py).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from ..errors import InputError
from ..cache_keys import cached_hash
from .engines import DEFAULT_ENGINE, ENGINES, as_run_by

GRAD_REDUCE_DTYPES = ("fp32", "param")
DROPOUT_KEYS = ("hidden_dropout", "attention_dropout")
MEGATRON_DEFAULT_DROPOUT = 0.1      # Megatron-LM's --hidden-dropout and --attention-dropout when not given


@dataclass(frozen=True)
class RuntimeSettings:
    __hash__ = cached_hash                 # a cache key of the planner: hashed once (cache_keys.py)
    sequence_parallel: bool
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    grad_reduce_dtype: str = "fp32"
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    # The engine these settings are run by (`as_run_by`): not a setting a plan overrides, the engine dimension of
    # the table that decides what the cost model prices (e.g. the collective of the DP gradient reduction).
    engine: str = "megatron"

    def __post_init__(self):
        for f in ("sequence_parallel", "distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather"):
            if not isinstance(getattr(self, f), bool):
                raise InputError(f"must be true or false, got {getattr(self, f)!r}", field=f"settings.{f}",
                                 fix=f"write {f}: true or {f}: false")
        for f in DROPOUT_KEYS:
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise InputError(f"must be a probability from 0 up to (not including) 1, got {value!r}",
                                 field=f"settings.{f}", fix=f"write {f}: 0.0 (no dropout, the default) or e.g. 0.1")
            object.__setattr__(self, f, float(value))
        if self.grad_reduce_dtype not in GRAD_REDUCE_DTYPES:
            raise InputError(f"must be one of {', '.join(GRAD_REDUCE_DTYPES)}, got {self.grad_reduce_dtype!r}",
                             field="settings.grad_reduce_dtype",
                             fix="write grad_reduce_dtype: fp32 (reduce gradients in fp32, Megatron's default) "
                                 "or param (in the training precision)")
        if self.overlap_param_gather and not self.overlap_grad_reduce:
            raise InputError("overlap_param_gather needs overlap_grad_reduce (Megatron asserts it)",
                             field="settings.overlap_param_gather",
                             fix="set overlap_param_gather: false, or overlap_grad_reduce: true")
        if self.overlap_param_gather and not self.distributed_optimizer:
            raise InputError("overlap_param_gather needs the distributed optimizer (there is no parameter "
                             "all-gather without it)", field="settings.overlap_param_gather",
                             fix="set overlap_param_gather: false, or distributed_optimizer: true")

    def to_dict(self) -> dict:
        """The settings (the keys a plan may override), without the engine."""
        return {k: getattr(self, k) for k in SETTING_KEYS}

    @property
    def sharded_grad_reduce(self) -> bool:
        """The DP gradient reduction is a reduce-scatter (distributed optimizer, run as its engine runs it)."""
        return self.distributed_optimizer and ENGINES[self.engine].sharded_grad_reduce

    @property
    def pipe_buffers(self) -> bool:
        """The engine keeps DeepSpeed's pipe buffers, which the memory model adds (cost/pipe_buffers.py)."""
        return ENGINES[self.engine].pipe_buffers

    @property
    def loss(self) -> str:
        """The engine's cross entropy (Engine.loss), whose tensors over the logits the memory model prices on the
        last stage (cost/memory.py cross_entropy_bytes)."""
        return ENGINES[self.engine].loss

    @property
    def grad_accum_fp32(self) -> bool:
        """16-bit training accumulates its gradients in fp32 (the engine's gradient buffer is fp32):
        grad_reduce_dtype fp32, and under an engine that accumulates in fp32 only through ZeRO (DeepSpeed: its
        BF16 optimizer without ZeRO accumulates in bf16), the distributed optimizer too. What the DeepSpeed emitter
        writes as data_types.grad_accum_dtype and the memory model prices (cost/deepspeed_state.py)."""
        return self.grad_reduce_dtype == "fp32" and (self.distributed_optimizer
                                                     or not ENGINES[self.engine].fp32_accumulation_needs_zero)

    @property
    def optimizer_state(self) -> str:
        """Whose weights, gradients and optimizer state the memory model prices: "megatron" (Megatron-Core's
        DDP buffers and optimizer, cost/model_state.py) or "deepspeed" (DeepSpeed's optimizer wrappers,
        cost/deepspeed_state.py)."""
        return ENGINES[self.engine].optimizer_state

    def fused_attention(self, device) -> bool:
        """The engine's attention keeps no s x s score matrix (flash or memory-efficient attention) on `device` (a
        spec.devices.DeviceType at the job's precision): Transformer Engine's in 16 bits on a device that has it
        (DeviceType.fused_attention: not a V100), torch's scaled_dot_product_attention always (Engine.attention).
        The analytic and learned time models and the memory model all price the layer this way (plan/costing.py,
        plan/memory_fit.py; the learned model from the profile's fused or unfused attention operator)."""
        if ENGINES[self.engine].attention == "sdpa":
            return True
        from ..cost.features import runs_unfused_attention
        return not runs_unfused_attention(device, device.dtype_bytes)

    @property
    def reduce_bucket_elements(self) -> int:
        """Elements of the engine's gradient reduce bucket (DeepSpeed's zero_optimization.reduce_bucket_size, which
        the emitter writes; 0: the engine reduces in its gradient buffer, Megatron)."""
        return ENGINES[self.engine].reduce_bucket_elements


SETTING_KEYS = tuple(f.name for f in dataclasses.fields(RuntimeSettings) if f.name != "engine")
# The settings that belong to the job trained, not to how a mesh runs it: a dropout changes the model's training,
# so a search never chooses them; every mesh it builds runs the job's (SearchConfig.job_settings, `plan --from`).
JOB_SETTING_KEYS = DROPOUT_KEYS


def job_settings(overrides) -> tuple:
    """The job's own settings among a mesh's overrides ((key, value) pairs or a dict), as the sorted pairs that
    differ from the defaults: what every mesh of a search is built with (() for the default job)."""
    base = RuntimeSettings(sequence_parallel=False)
    return tuple(sorted((k, float(v)) for k, v in dict(overrides).items()
                        if k in JOB_SETTING_KEYS and float(v) != getattr(base, k)))


def shared_job_settings(meshes) -> tuple | None:
    """The job settings (`job_settings`) every one of a plan's meshes runs, None where they differ."""
    each = {job_settings(m.settings.to_dict()) for m in meshes}
    return next(iter(each)) if len(each) == 1 else None


def default_settings(tp: int) -> RuntimeSettings:
    """What production Megatron jobs run: SP whenever TP shards the layers, the distributed optimizer with both
    overlaps, gradients reduced in fp32."""
    return RuntimeSettings(sequence_parallel=tp > 1)


def resolve_settings(tp: int, overrides: dict | None = None) -> RuntimeSettings:
    """The defaults for a mesh of this TP, with a plan's per-mesh overrides applied (validated)."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(SETTING_KEYS))
    if unknown:
        raise InputError(f"unknown setting(s) {', '.join(unknown)}", field="settings",
                         fix=f"use only: {', '.join(SETTING_KEYS)}")
    if overrides.get("sequence_parallel") and tp == 1:
        raise InputError("sequence_parallel needs tp > 1 (it splits the sequence over the TP ranks)",
                         field="settings.sequence_parallel", fix="drop the override or raise tp")
    if "overlap_param_gather" not in overrides:
        # Its default follows what it needs: there is no parameter gather to overlap without the distributed
        # optimizer, and Megatron overlaps it only together with the gradient reduction.
        overrides["overlap_param_gather"] = (overrides.get("distributed_optimizer", True)
                                             and overrides.get("overlap_grad_reduce", True))
    return dataclasses.replace(default_settings(tp), **overrides)


@functools.lru_cache(maxsize=None)
def settings_as_run(tp: int, overrides: tuple = (), engine: str = DEFAULT_ENGINE,
                    precision: str = "") -> RuntimeSettings:
    """A mesh's settings (the defaults for its TP with the plan's overrides, as (key, value) pairs) as `engine`
    runs them (engines.py `as_run_by`; `precision`, the mesh's device's, for its precision rules): what the planner prices a mesh with (the search's evaluator and bounds,
    plan/simulate.py). One object per (TP, overrides, engine): resolving them builds and validates settings objects
    (~7 us, a fifth of a new profile), and one object hashes once."""
    return as_run_by(resolve_settings(tp, dict(overrides)), engine, precision)


def minimal_overrides(tp: int, overrides) -> tuple:
    """The overrides that change something, as sorted (key, value) pairs: a key whose value the others already
    imply is dropped, so equal settings give equal overrides (and equal meshes). Cached per TP and overrides, with
    their types (True and 1 are equal keys): every mesh built runs it (the search's groups alongside, thousands)."""
    items = dict(overrides)
    try:
        key = (type(tp), tp, tuple((k, type(v), v) for k, v in sorted(items.items())))
        hash(key)
    except TypeError:               # (a value that cannot be a key: resolved as it is)
        return _minimal_overrides(tp, items)
    return _cached_minimal_overrides(key)


@functools.lru_cache(maxsize=4096)
def _cached_minimal_overrides(key: tuple) -> tuple:
    return _minimal_overrides(key[1], {k: v for k, _, v in key[2]})


def _minimal_overrides(tp: int, items: dict) -> tuple:
    settings = resolve_settings(tp, items)      # validates
    keep = {}
    for key in sorted(items):
        rest = {k: v for k, v in items.items() if k != key}
        try:
            implied = getattr(resolve_settings(tp, rest), key)
        except InputError:
            implied = None          # the others alone are not a valid combination: this key is needed
        if implied != items[key]:
            keep[key] = items[key]
    if resolve_settings(tp, keep) != settings:      # dropping keys one at a time changed the whole: keep all
        keep = items
    return tuple(sorted(keep.items()))
