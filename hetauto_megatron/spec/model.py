"""ModelSpec: the shape of a decoder-only transformer, from a YAML file, a Hugging Face config.json or a preset.

Everything the cost model needs (parameter counts, FLOPs, activation sizes) is derived here from the
architecture keys, so GQA (fewer key/value heads) and gated SwiGLU MLPs (three FFN matrices) are counted
correctly once, for every caller.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import sys
from dataclasses import dataclass

from ..errors import InputError
from ._fields import MAX_FIGURE, file_kind, get, reject_unknown, shorten
from .files import is_json_name, load_yaml_file
from ..cache_keys import cached_hash


# Bounds far above any published transformer (a few hundred layers; widths, vocabularies and contexts in the
# millions at most): a figure beyond them is a typo, and the search and simulator would run for ever on it.
MAX_LAYERS = 10_000
MAX_SIZE = 10_000_000
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128     # Megatron's default --make-vocab-size-divisible-by
ROTARY_BASE = 10000                    # Megatron's default --rotary-base (LLaMA-2's RoPE theta)
MAX_ROTARY_BASE = int(MAX_FIGURE)      # above every published RoPE theta (10^7 at most): a typo, not a model


@dataclass(frozen=True)
class ModelSpec:
    __hash__ = cached_hash                 # a cache key of the planner: hashed once (cache_keys.py)
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    num_query_groups: int = 0          # 0 -> equal to num_attention_heads (no GQA)
    gated_mlp: bool = True             # SwiGLU (LLaMA) vs a plain GELU/ReLU MLP (GPT-2, OPT)
    tie_embeddings: bool = False
    position_embedding: str = "rope"   # "rope" or "learned" (GPT-2/OPT/GPT-3 absolute positions)
    max_position_embeddings: int = 0   # 0 -> seq_length
    # False: no logits layer; the loss takes its cross-entropy over the final norm's outputs (how Sailor's
    # Megatron-DeepSpeed fork builds GPT-Neo, whose measured runs are priced with it: cost/learned/sailor.py).
    # Not a model hetauto's runtimes build: model files cannot set it, and it is written only when False.
    output_layer: bool = True
    # Megatron's --make-vocab-size-divisible-by: the embedding table and the output layer are padded to a multiple
    # of this x TP (plan/vocab_padding.py padded_vocab_size). Megatron's default 128; 1 (no padding beyond TP) is what
    # a checkpoint converted from Hugging Face often needs. Written only when not 128.
    make_vocab_size_divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY
    # The base (theta) of rotary embeddings, Megatron's --rotary-base: 10,000 for LLaMA-2, 500,000 for LLaMA-3,
    # a config.json's rope_theta. No weight and no cost; carried so that the launch trains the model described.
    # Written only when not 10,000.
    rotary_base: int = ROTARY_BASE
    # Whether the linear layers carry biases (Megatron's --add-bias-linear, its default, or --disable-bias-linear).
    # None follows the MLP kind: biases with a plain MLP (GPT-2, GPT-3, OPT), none with a gated one (LLaMA); a plain
    # MLP without biases (Falcon, Nemotron) says false. Resolved here, so that every reader sees a bool; written
    # only where it differs from the MLP kind's rule, so files written before stay the same.
    linear_biases: bool | None = None

    def __post_init__(self):
        if self.linear_biases is None:
            object.__setattr__(self, "linear_biases", not self.gated_mlp)
        elif not isinstance(self.linear_biases, bool):
            raise InputError(f"must be true or false, got {self.linear_biases!r}"[:200], field="linear_biases",
                             fix="write true if the model's linear layers have biases (GPT-2, OPT), false if not "
                                 "(LLaMA, Falcon's bias: false), or leave it out to follow gated_mlp")
        if self.num_query_groups == 0:
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
        if self.max_position_embeddings == 0:
            object.__setattr__(self, "max_position_embeddings", self.seq_length)
        if self.position_embedding != "learned" and 0 < self.max_position_embeddings < self.seq_length:
            # Megatron's validate_args refuses --max-position-embeddings below --seq-length for every position
            # type. Rotary embeddings have no table, so reaching the sequence changes no weight and no cost: a
            # LLaMA config.json (4,096) trained at --seq-length 8192 gets 8192, the value its launch must carry.
            object.__setattr__(self, "max_position_embeddings", self.seq_length)
        for key in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size",
                    "seq_length", "num_query_groups", "max_position_embeddings", "make_vocab_size_divisible_by"):
            fix = (f"set {key} to the architecture's value (see the model's config.json)"
                   if key != "make_vocab_size_divisible_by" else
                   "write Megatron's --make-vocab-size-divisible-by: 128 (its default), or 1 to pad only for TP")
            if getattr(self, key) <= 0:
                raise InputError(f"must be a positive integer, got {getattr(self, key)}", field=key, fix=fix)
            limit = MAX_LAYERS if key == "num_layers" else MAX_SIZE
            if getattr(self, key) > limit:
                # a typo, not a model: the planner's work grows with these, so it would run for ever
                raise InputError(f"is {getattr(self, key)}, more than any transformer has (at most {limit:,} here)",
                                 field=key, fix=fix)
        # (published thetas reach 10^7; a 301-digit one was written into plans and launch scripts)
        if isinstance(self.rotary_base, bool) or not isinstance(self.rotary_base, int) or \
                not 1 < self.rotary_base <= MAX_ROTARY_BASE:
            raise InputError(f"must be an integer above 1 and at most {MAX_ROTARY_BASE:,}, got "
                             f"{shorten(repr(self.rotary_base), 40)}", field="rotary_base",
                             fix="write the model's RoPE theta (config.json: rope_theta), e.g. 10000 or 500000")
        if self.position_embedding == "learned" and self.rotary_base != ROTARY_BASE:
            raise InputError(f"is {self.rotary_base}, but the model has learned positions, not rotary ones",
                             field="rotary_base", fix=f"leave rotary_base out (over a preset of rotary positions, "
                             f"write rotary_base: {ROTARY_BASE}), or write position_embedding: rope")
        if self.position_embedding == "learned" and self.max_position_embeddings < self.seq_length:
            raise InputError(f"is {self.max_position_embeddings}, fewer learned positions than the sequence's "
                             f"{self.seq_length} tokens", field="max_position_embeddings",
                             fix=f"set it to at least {self.seq_length}, or write a shorter seq_length")
        if self.hidden_size % self.num_attention_heads:
            raise InputError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                             f"{self.num_attention_heads}", field="hidden_size",
                             fix="use a hidden size that is a multiple of the head count")
        if self.position_embedding == "rope" and (self.hidden_size // self.num_attention_heads) % 2:
            # Megatron's RotaryEmbedding turns pairs of a head's channels (frequencies arange(0, head_dim, 2),
            # written twice): an odd head is one channel short, and the first forward pass fails on the shapes
            raise InputError(f"hidden_size {self.hidden_size} over num_attention_heads {self.num_attention_heads} "
                             f"gives heads of {self.hidden_size // self.num_attention_heads} channels, an odd number, "
                             "which rotary positions cannot turn (they rotate pairs of channels)", field="hidden_size",
                             fix="use a hidden size that gives heads of an even width (hidden_size / "
                                 "num_attention_heads even), or write position_embedding: learned")
        if self.num_attention_heads % self.num_query_groups:
            raise InputError(f"num_query_groups {self.num_query_groups} must divide num_attention_heads "
                             f"{self.num_attention_heads}", field="num_query_groups",
                             fix="set it to a divisor of the head count (equal to it for plain multi-head attention)")
        if self.position_embedding not in ("rope", "learned"):
            raise InputError(f"must be 'rope' or 'learned', got {self.position_embedding!r}", field="position_embedding",
                             fix="write rope for rotary models (LLaMA, Mistral, Qwen, GPT-NeoX) or learned for "
                                 "absolute position tables (GPT-2, GPT-3, OPT)")

    # ---- derived sizes -------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_hidden(self) -> int:
        """Width of the K (and of the V) projection: kv heads * head dim; smaller than hidden under GQA."""
        return self.num_query_groups * self.head_dim

    @property
    def norm_params(self) -> int:
        """Parameters of one norm: RMSNorm's scale (gated family), or LayerNorm's scale and shift."""
        return self.hidden_size * (1 if self.gated_mlp else 2)

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer layer: the four projections' weights, their biases where the model has
        them (linear_biases) and the two norms (tests/test_spec_models.py checks the counts against published
        ones, to the parameter for GPT-2 and LLaMA). Qwen2's QKV-only biases are not a model hetauto builds."""
        return self.layer_linear_weights + self.layer_replicated_params + self._column_biases

    @property
    def layer_linear_weights(self) -> int:
        """The four projections' weights of one layer (QKV, attention output, MLP up, MLP down): the GEMM
        weights, split over TP."""
        h = self.hidden_size
        attn = h * (h + 2 * self.kv_hidden) + h * h
        return attn + (3 if self.gated_mlp else 2) * h * self.ffn_hidden_size

    @property
    def layer_replicated_params(self) -> int:
        """The part of layer_params that every TP rank holds whole (Megatron-Core's layout): the two norms and
        the row-parallel projections' biases (attention output, MLP down), which are added after the reduction."""
        return 2 * self.norm_params + (2 * self.hidden_size if self.linear_biases else 0)

    @property
    def _column_biases(self) -> int:
        """Biases of the column-parallel projections (QKV, MLP up), split over TP with their weights."""
        if not self.linear_biases:
            return 0
        return self.hidden_size + 2 * self.kv_hidden + self.ffn_hidden_size * (2 if self.gated_mlp else 1)

    @property
    def embedding_params(self) -> int:
        pos = self.max_position_embeddings * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    @property
    def output_params(self) -> int:
        """Output head (no bias, as Megatron's) + final norm; the head shares the embedding when tied (still stored
        on the last stage)."""
        return (self.vocab_size * self.hidden_size if self.output_layer else 0) + self.norm_params

    def logits_width(self, tp: int) -> float:
        """Elements per token of the loss's input on one TP rank: the vocabulary shard the output layer computes,
        or, without an output layer, the final norm's outputs, whole on every rank."""
        return self.vocab_size / tp if self.output_layer else self.hidden_size

    @property
    def total_params(self) -> int:
        out = self.norm_params if self.tie_embeddings else self.output_params
        return self.num_layers * self.layer_params + self.embedding_params + out

    def layer_flops_per_token(self) -> float:
        """Forward matmul FLOPs of one layer for one token (2 per multiply-add), attention scores included."""
        h, s = self.hidden_size, self.seq_length
        proj = 2 * h * (h + 2 * self.kv_hidden) + 2 * h * h
        attn = 2 * 2 * s * h  # QK^T and attention*V over the full (non-causal-skipped) sequence
        mlp = 2 * (3 if self.gated_mlp else 2) * h * self.ffn_hidden_size
        return proj + attn + mlp

    def logits_flops_per_token(self) -> float:
        return 2 * self.hidden_size * self.vocab_size if self.output_layer else 0.0

    def model_flops_per_token(self) -> float:
        """Forward + backward model FLOPs per token (3x forward), no recomputation."""
        return 3 * (self.num_layers * self.layer_flops_per_token() + self.logits_flops_per_token())

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if self.output_layer:          # every model a plan runs: its files stay as they were
            del d["output_layer"]
        if self.make_vocab_size_divisible_by == MAKE_VOCAB_SIZE_DIVISIBLE_BY:   # files written before stay the same
            del d["make_vocab_size_divisible_by"]
        if self.rotary_base == ROTARY_BASE:
            del d["rotary_base"]
        if self.linear_biases == (not self.gated_mlp):
            del d["linear_biases"]
        return d

    def replace(self, **changes) -> "ModelSpec":
        if "gated_mlp" in changes and "linear_biases" not in changes and self.linear_biases == (not self.gated_mlp):
            changes["linear_biases"] = None     # it followed the MLP kind: it follows the new one
        return dataclasses.replace(self, **changes)

    def with_padded_vocab(self, vocab_size: int) -> "ModelSpec":
        """The spec with Megatron's padded table. Not re-validated: MAX_SIZE bounds the vocabulary the user wrote,
        and padding (make_vocab_size_divisible_by x TP) may pass it (a vocab_size of 9,999,872 at TP 8 pads to
        10,000,384, which replace() refused mid-search with a message naming no file)."""
        new = copy.copy(self)
        new.__dict__.pop("_cached_hash", None)      # (cache_keys.cached_hash: the copy hashes anew)
        object.__setattr__(new, "vocab_size", vocab_size)
        return new


MODEL_KEYS = [f.name for f in dataclasses.fields(ModelSpec) if f.name != "output_layer"]   # (see the field)


def _p(name, L, h, heads, ffn, vocab, seq, kv=0, gated=True, tie=False, pos="rope", theta=ROTARY_BASE):
    return ModelSpec(name=name, num_layers=L, hidden_size=h, num_attention_heads=heads, ffn_hidden_size=ffn,
                     vocab_size=vocab, seq_length=seq, num_query_groups=kv, gated_mlp=gated, tie_embeddings=tie,
                     position_embedding=pos, rotary_base=theta)


PRESETS: dict[str, ModelSpec] = {m.name: m for m in [
    _p("llama2-7b", 32, 4096, 32, 11008, 32000, 4096),
    _p("llama2-13b", 40, 5120, 40, 13824, 32000, 4096),
    _p("llama2-70b", 80, 8192, 64, 28672, 32000, 4096, kv=8),
    _p("llama3-8b", 32, 4096, 32, 14336, 128256, 8192, kv=8, theta=500000),
    _p("llama3-70b", 80, 8192, 64, 28672, 128256, 8192, kv=8, theta=500000),
    _p("mistral-7b", 32, 4096, 32, 14336, 32000, 4096, kv=8),
    _p("gpt3-175b", 96, 12288, 96, 49152, 51200, 2048, gated=False, tie=True, pos="learned"),
    # A toy model whose whole parallel layout still means something: used by dry runs and tests.
    _p("tiny", 8, 64, 4, 256, 128, 32, kv=2),
]}


def model_from_dict(data: dict, *, file: str | None = None, prefix: str = "") -> ModelSpec:
    if "preset" in data:
        preset = get(data, "preset", str, file=file, prefix=prefix, fix=f"use one of: {', '.join(PRESETS)}")
        base = PRESETS.get(preset)
        if base is None:
            raise InputError(f"unknown preset {preset!r}", file=file, field=f"{prefix}preset",
                             fix=f"use one of: {', '.join(PRESETS)}")
        overrides = {k: v for k, v in data.items() if k != "preset"}
        reject_unknown(overrides, MODEL_KEYS, file=file, prefix=prefix)
        defaults = base.to_dict()
        # Keys the preset only derived (kv heads = heads without GQA, position table = sequence length) must
        # follow an override of what they derive from, not keep the preset's number: overriding the heads of
        # llama2-7b must not silently turn it into a GQA model.
        if base.num_query_groups == base.num_attention_heads:
            defaults["num_query_groups"] = 0
        if base.max_position_embeddings == base.seq_length:
            defaults["max_position_embeddings"] = 0
        data = {**defaults, **overrides}
    else:
        overrides = data
    for key, follows in (("num_query_groups", "num_attention_heads"), ("max_position_embeddings", "seq_length")):
        # 0 is the ModelSpec's "follow the other key"; written in a file it is a mistake, not "leave it out"
        if isinstance(overrides.get(key), int) and not isinstance(overrides[key], bool) and overrides[key] <= 0:
            raise InputError(f"must be a positive integer, got {overrides[key]}", file=file, field=f"{prefix}{key}",
                             fix=f"set it to the architecture's value, or leave it out to use {follows}'s")
    reject_unknown(data, MODEL_KEYS, file=file, prefix=prefix)
    kw = {}
    for key in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size", "seq_length"):
        kw[key] = get(data, key, int, file=file, prefix=prefix)
    kw["name"] = str(get(data, "name", (str, int, float), default=os.path.splitext(os.path.basename(file or "model"))[0],
                         file=file, prefix=prefix))
    if not kw["name"].strip():     # name: '' gave summaries and plans a model without a name
        raise InputError("is empty", file=file, field=f"{prefix}name",
                         fix="give the model a name, or leave the key out (the file's own name is taken)")
    kw["num_query_groups"] = get(data, "num_query_groups", int, default=0, file=file, prefix=prefix)
    kw["gated_mlp"] = get(data, "gated_mlp", bool, default=True, file=file, prefix=prefix)
    kw["tie_embeddings"] = get(data, "tie_embeddings", bool, default=False, file=file, prefix=prefix)
    kw["position_embedding"] = get(data, "position_embedding", str, default="rope", file=file, prefix=prefix)
    kw["max_position_embeddings"] = get(data, "max_position_embeddings", int, default=0, file=file, prefix=prefix)
    kw["make_vocab_size_divisible_by"] = get(data, "make_vocab_size_divisible_by", int, default=MAKE_VOCAB_SIZE_DIVISIBLE_BY, file=file,
                                             prefix=prefix)
    kw["rotary_base"] = get(data, "rotary_base", int, default=ROTARY_BASE, file=file, prefix=prefix)
    kw["linear_biases"] = get(data, "linear_biases", bool, default=None, file=file, prefix=prefix,
                              fix="write true or false (whether the linear layers have biases), or leave it out "
                                  "to follow gated_mlp")
    try:
        return ModelSpec(**kw)
    except InputError as exc:
        raise exc.within(file=file, prefix=prefix.rstrip(".") or None) from None


def _named_by_file(data, source: str):
    """A model file's keys; a preset with overrides and no name is another model, named by its file (docs/inputs.md),
    not as the preset."""
    if isinstance(data, dict) and "preset" in data and "name" not in data and set(data) - {"preset"}:
        return {**data, "name": os.path.splitext(os.path.basename(source))[0]}
    return data


_SHADOWED: set[str] = set()     # preset names a path here shadows, warned about once per process


def load_model(source: str, *, seq_length: int | None = None, note=None) -> ModelSpec:
    """A preset name, a config.json (Hugging Face) or a model YAML. `seq_length` overrides the file's.

    A Hugging Face checkpoint directory stands for its config.json; a .json file written with this project's
    own model keys (no model_type) is read like a model YAML. A config.json holds no training sequence length,
    only the longest one the positions allow: without `seq_length` that is the one planned, and `note` (a
    callable taking one line) is told so, since 131,072 tokens of a long-context model is rarely what is meant.
    """
    return model_at(read_model(source), seq_length=seq_length, note=note)


@dataclass(frozen=True)
class ModelSource:
    """A --model read once (`read_model`), to be built at any sequence length (`model_at`) without reading it again:
    a command that tries several lengths must not read a file twice (a pipe holds its text once)."""
    source: str                         # as given: a preset name or a path
    spec: ModelSpec | None = None       # a preset, or a file of this project's own model keys
    hf: dict | None = None              # else a Hugging Face config, which the sequence length shapes
    file: str | None = None             # the config.json it came from (a directory stands for its config.json)


def model_at(read: ModelSource, *, seq_length: int | None = None, note=None) -> ModelSpec:
    """The model `read` holds, trained at `seq_length` (None: its own); `note` as for load_model."""
    from .hf_config import hf_model
    spec = read.spec if read.hf is None else hf_model(read.hf, file=read.file, seq_length=seq_length, note=note)
    return with_seq_length(spec, seq_length, read.source, note) if seq_length else spec


def read_model(source: str) -> ModelSource:
    """Read a preset name, a config.json (Hugging Face, or its directory) or a model YAML (load_model)."""
    from .hf_config import read_hf_config     # (hf_config builds ModelSpecs: imported here, not at the top)

    if source in PRESETS:
        spec = PRESETS[source]
        if os.path.exists(source) and source not in _SHADOWED:
            # a downloaded checkpoint folder named like a preset was passed over without a word
            _SHADOWED.add(source)
            print(f"hetauto: warning: --model {source} names the preset {source}, not the file or folder "
                  f"{source} here; write ./{source} to read that instead", file=sys.stderr)
    elif not os.path.exists(source) and not source.lower().endswith((".json", ".yaml", ".yml")):
        raise InputError(f"'{source}' is neither a preset nor an existing file", field="--model",
                         fix=f"pass a model YAML, a Hugging Face config.json, or a preset: {', '.join(PRESETS)}")
    elif os.path.isdir(source):
        config = os.path.join(source, "config.json")
        if not os.path.isfile(config):
            raise InputError("is a directory without a config.json", file=source, field="--model",
                             fix="pass a model YAML, a Hugging Face config.json (or its directory), or a preset")
        return ModelSource(source, hf=read_hf_config(config), file=config)
    elif is_json_name(source):      # (.JSON too: the one rule every reader and writer follows)
        if not os.path.exists(source):
            raise InputError("model file not found", file=source, field="--model", fix="check the path")
        cfg = read_hf_config(source)
        if "model_type" not in cfg and ("preset" in cfg or {"num_layers", "ffn_hidden_size"} <= set(cfg)):
            spec = model_from_dict(_named_by_file(cfg, source), file=source)
        else:
            return ModelSource(source, hf=cfg, file=source)
    else:
        data = load_yaml_file(source, "model")
        if "model" in data and isinstance(data["model"], dict):
            other = sorted(str(k) for k in data if k != "model")
            if not other:
                data = data["model"]
            elif file_kind(other) is None:      # (a whole plan file is named as one by model_from_dict)
                raise InputError(f"wraps the model under 'model:' beside other top-level keys: {', '.join(other)}",
                                 file=source, field=other[0],
                                 fix="move those keys inside the 'model:' block, or drop them")
        spec = model_from_dict(_named_by_file(data, source), file=source)
    return ModelSource(source, spec=spec)


def with_seq_length(spec: ModelSpec, seq_length: int, source: str, note=None) -> ModelSpec:
    """`spec` trained at --seq-length `seq_length` (of the model read from `source`): a longer learned table is what
    training at that length builds, and `note` is told so (rotary: ModelSpec raises its reach)."""
    if spec.position_embedding == "learned" and seq_length > spec.max_position_embeddings and note is not None:
        note(f"--seq-length {seq_length:,} is longer than the {spec.max_position_embeddings:,} learned positions "
             f"of {source}: the plan builds a {seq_length:,}-row position table (a model trained from scratch; a "
             f"checkpoint with {spec.max_position_embeddings:,} positions will not load into it)")
    return spec.replace(seq_length=seq_length, max_position_embeddings=max(seq_length, spec.max_position_embeddings)
                        if spec.position_embedding == "learned" else spec.max_position_embeddings)
