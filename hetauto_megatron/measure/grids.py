"""What `hetauto profile` times: grids of model-like shapes, cut into operators or whole layers (no torch).

An operator grid (`GridSpec`) is a product of model-like configurations (hidden size, heads and key/value heads,
FFN width, sequence, micro-batch, TP, vocabulary); each is cut into the operators one TP rank runs
(cost/features.py: `layer_ops`, `head_ops`, `embedding_ops`), shapes that repeat are kept once, and above
`max_ops` a deterministic sample keeps every operator kind; where the device runs unfused attention each attention
operator gets its unfused twin (`with_unfused_attention`). A layer grid (`LayerGridSpec`) names models and the
TP, micro-batch and sequence to time their whole layers at. measure/profile.py times them.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from ..cost import features as F
from ..errors import InputError
from ..spec.devices import DeviceType
from ..spec.model import ModelSpec


@dataclass(frozen=True)
class GridSpec:
    """Model-like configurations to cut into operators."""
    hidden: tuple
    head_dim: tuple
    kv_ratio: tuple      # heads per key/value head (1 = plain multi-head attention)
    ffn_mult: tuple      # ffn = mult * hidden
    seq: tuple
    micro_batch: tuple
    tp: tuple
    vocab: tuple
    max_ops: int         # deterministic subsample above this many distinct operators


GRIDS = {
    # A handful of operators: the pipeline test.
    "tiny": GridSpec(hidden=(32, 64), head_dim=(16,), kv_ratio=(1, 2), ffn_mult=(2,), seq=(16, 32),
                     micro_batch=(1,), tp=(1, 2), vocab=(128,), max_ops=40),
    # Under three minutes on a 2-core CPU; covers the toy models the CPU dry runs use.
    "quick-cpu": GridSpec(hidden=(64, 128, 192, 256, 384, 512), head_dim=(16, 32, 64), kv_ratio=(1, 2),
                          ffn_mult=(2, 4), seq=(32, 64, 128, 256), micro_batch=(1, 2, 4), tp=(1, 2, 4),
                          vocab=(128, 1024, 4096), max_ops=700),
    "full-cpu": GridSpec(hidden=(64, 128, 256, 512, 768, 1024), head_dim=(16, 32, 64), kv_ratio=(1, 2, 4),
                         ffn_mult=(2, 3, 4), seq=(32, 64, 128, 256, 512), micro_batch=(1, 2, 4, 8),
                         tp=(1, 2, 4, 8), vocab=(128, 4096, 32000), max_ops=1500),
    # Accelerators: shapes of real models, sharded.
    "quick-gpu": GridSpec(hidden=(1024, 2048, 4096, 8192), head_dim=(64, 128), kv_ratio=(1, 8), ffn_mult=(3, 4),
                          seq=(1024, 2048, 4096), micro_batch=(1, 2), tp=(1, 2, 4, 8), vocab=(32000, 128256),
                          max_ops=400),
    "full-gpu": GridSpec(hidden=(1024, 2048, 4096, 5120, 8192, 12288), head_dim=(64, 128), kv_ratio=(1, 4, 8),
                         ffn_mult=(2.6875, 3.5, 4), seq=(1024, 2048, 4096, 8192), micro_batch=(1, 2, 4),
                         tp=(1, 2, 4, 8), vocab=(32000, 128256), max_ops=2000),
}


@dataclass(frozen=True)
class LayerGridSpec:
    """Whole transformer layers to time: models (preset names or shapes) x TP x micro-batch x sequence."""
    models: tuple        # preset names, or ModelSpec objects
    tp: tuple
    micro_batch: tuple
    seq: tuple           # sequence lengths; 0 = the model's own


def _cpu_layer_models() -> tuple:
    # Toy shapes like the CPU dry runs' (hidden 64-512), GQA and plain attention, SwiGLU and GELU MLPs.
    return (ModelSpec("cpu-a", 1, 128, 4, 512, 1024, 64, num_query_groups=2),
            ModelSpec("cpu-b", 1, 256, 8, 704, 4096, 128, num_query_groups=8),
            ModelSpec("cpu-c", 1, 384, 6, 1536, 4096, 128, num_query_groups=6, gated_mlp=False,
                      position_embedding="learned"),
            ModelSpec("cpu-d", 1, 512, 8, 1408, 1024, 256, num_query_groups=2))


LAYER_GRIDS = {
    # Two toy models (GQA + SwiGLU + rotary; plain attention + GELU): the pipeline test.
    "layers-tiny": LayerGridSpec(models=("tiny", ModelSpec("tiny-gelu", 1, 64, 4, 256, 128, 32, gated_mlp=False,
                                                           position_embedding="learned")),
                                 tp=(1, 2), micro_batch=(1,), seq=(0,)),
    "layers-cpu": LayerGridSpec(models=_cpu_layer_models(), tp=(1, 2), micro_batch=(1, 2, 4), seq=(0,)),
    "layers-gpu": LayerGridSpec(models=("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "mistral-7b",
                                        "gpt3-175b"), tp=(1, 2, 4, 8), micro_batch=(1, 2), seq=(2048, 4096)),
}


def grid_name(device: DeviceType, quick: bool, layers: bool = False) -> str:
    kind = "cpu" if device.vendor == "cpu" else "gpu"
    if layers:
        return f"layers-{kind}"
    return ("quick-" if quick else "full-") + kind


def granularity(grid: str) -> str:
    """'layer' or 'op': what a grid times; an unknown grid name is an input error."""
    if grid not in GRIDS and grid not in LAYER_GRIDS:
        raise InputError(f"unknown grid {grid!r}", field="--grid",
                         fix=f"use one of: {', '.join(list(GRIDS) + list(LAYER_GRIDS))}")
    return "layer" if grid in LAYER_GRIDS else "op"


def grid_entry(grid: str, seed: int) -> dict:
    """How a profile's header lists a grid profiled into it (its "grids"): the name, and the seed where the seed
    picks the shapes. Every operator grid has more distinct operators than its max_ops, so the seed picks its
    sample (grid_ops; a test checks each grid); a layer grid times every shape whatever the seed, so its entry has
    none (and matches any: cost/learned/profile_merge.py `holds_grid`)."""
    return {"grid": grid} if grid in LAYER_GRIDS else {"grid": grid, "seed": seed}


def layer_shapes(grid: LayerGridSpec) -> list[tuple[str, F.LayerShape]]:
    """Every valid (model, TP, micro-batch, sequence) of the grid, in a fixed order, as (model name, layer
    shape); a shape two models share is timed once."""
    from ..spec.model import PRESETS
    seen, shapes = set(), []
    for m in grid.models:
        spec = PRESETS[m] if isinstance(m, str) else m
        for tp in (tp for tp in grid.tp if F.tp_divides(spec, tp)):
            for seq in grid.seq:
                for mb in grid.micro_batch:
                    shape = F.LayerShape.of(spec, tp, mb, seq or spec.seq_length)
                    if shape.key() not in seen:
                        seen.add(shape.key())
                        shapes.append((spec.name, shape))
    return shapes


def grid_ops(grid: GridSpec, seed: int = 0) -> list[F.Op]:
    """Distinct operators of every valid configuration of the grid (deterministic order and subsample)."""
    seen: dict[str, F.Op] = {}
    for h in grid.hidden:
        for hd in grid.head_dim:
            if h % hd:
                continue
            heads = h // hd
            for r in grid.kv_ratio:
                if heads % r:
                    continue
                for fm in grid.ffn_mult:
                    ffn = int(round(fm * h / 64.0)) * 64 or 64
                    for tp in grid.tp:
                        if heads // r % tp or ffn % tp:
                            continue
                        for v in grid.vocab:
                            for s in grid.seq:
                                for mb in grid.micro_batch:
                                    m = ModelSpec("grid", 1, h, heads, ffn, v, s, num_query_groups=heads // r)
                                    for op in F.layer_ops(m, tp, mb) + F.head_ops(m, tp, mb) + \
                                            F.embedding_ops(m, tp, mb):
                                        seen.setdefault(op.key(), op)
    ops = [seen[k] for k in sorted(seen)]
    if len(ops) > grid.max_ops:
        # Keep every kind represented: sample each kind in proportion.
        rng = random.Random(seed)
        by_kind: dict[str, list[F.Op]] = {}
        for op in ops:
            by_kind.setdefault(op.kind, []).append(op)
        keep = []
        for kind, lst in sorted(by_kind.items()):
            n = max(4, int(round(grid.max_ops * len(lst) / len(ops))))
            keep += lst if len(lst) <= n else rng.sample(lst, n)
        ops = sorted(keep, key=lambda o: o.key())
    return ops


def with_unfused_attention(ops: list[F.Op], unfused: bool) -> list[F.Op]:
    """`ops` and, where the device runs unfused attention (`unfused`: features.runs_unfused_attention), each attention
    operator's unfused twin of the same shape. Added after grid_ops's sample, so that the sample of every other kind
    stays what it was: a profile written before the unfused kind resumes into the same rows and adds the twins."""
    if not unfused:
        return ops
    twins = [F.Op(o.name, "attention_unfused", o.tokens, batch=o.batch, seq=o.seq, heads=o.heads,
                  kv_heads=o.kv_heads, head_dim=o.head_dim) for o in ops if o.kind == "attention"]
    return sorted(ops + twins, key=lambda o: o.key())
