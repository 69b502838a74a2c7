"""ModelSpec: the shape of a decoder-only transformer, from a YAML file, a Hugging Face config.json or a preset.

Everything the cost model needs (parameter counts, FLOPs, activation sizes) is derived here from the
architecture keys, so GQA (fewer key/value heads) and gated SwiGLU MLPs (three FFN matrices) are counted
correctly once, for every caller.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

import yaml

from ..errors import InputError
from ._fields import get, reject_unknown, require_mapping


@dataclass(frozen=True)
class ModelSpec:
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

    def __post_init__(self):
        if self.num_query_groups == 0:
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
        if self.max_position_embeddings == 0:
            object.__setattr__(self, "max_position_embeddings", self.seq_length)
        for key in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size",
                    "seq_length", "num_query_groups"):
            if getattr(self, key) <= 0:
                raise InputError(f"must be a positive integer, got {getattr(self, key)}", field=key)
        if self.hidden_size % self.num_attention_heads:
            raise InputError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                             f"{self.num_attention_heads}", field="hidden_size",
                             fix="use a hidden size that is a multiple of the head count")
        if self.num_attention_heads % self.num_query_groups:
            raise InputError(f"num_query_groups {self.num_query_groups} must divide num_attention_heads "
                             f"{self.num_attention_heads}", field="num_query_groups",
                             fix="set it to a divisor of the head count (equal to it for plain multi-head attention)")
        if self.position_embedding not in ("rope", "learned"):
            raise InputError(f"must be 'rope' or 'learned', got {self.position_embedding!r}", field="position_embedding")

    # ---- derived sizes -------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_hidden(self) -> int:
        """Width of the K (and of the V) projection: kv heads * head dim; smaller than hidden under GQA."""
        return self.num_query_groups * self.head_dim

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer layer (weights and biases are ignored where LLaMA has none)."""
        h = self.hidden_size
        attn = h * (h + 2 * self.kv_hidden) + h * h
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn_hidden_size
        norms = 2 * h
        return attn + mlp + norms

    @property
    def embedding_params(self) -> int:
        pos = self.max_position_embeddings * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    @property
    def output_params(self) -> int:
        """Output head + final norm; the head shares the embedding when tied (still stored on the last stage)."""
        return self.vocab_size * self.hidden_size + self.hidden_size

    @property
    def total_params(self) -> int:
        out = self.hidden_size if self.tie_embeddings else self.output_params
        return self.num_layers * self.layer_params + self.embedding_params + out

    def layer_flops_per_token(self) -> float:
        """Forward matmul FLOPs of one layer for one token (2 per multiply-add), attention scores included."""
        h, s = self.hidden_size, self.seq_length
        proj = 2 * h * (h + 2 * self.kv_hidden) + 2 * h * h
        attn = 2 * 2 * s * h  # QK^T and attention*V over the full (non-causal-skipped) sequence
        mlp = 2 * (3 if self.gated_mlp else 2) * h * self.ffn_hidden_size
        return proj + attn + mlp

    def logits_flops_per_token(self) -> float:
        return 2 * self.hidden_size * self.vocab_size

    def model_flops_per_token(self) -> float:
        """Forward + backward model FLOPs per token (3x forward), no recomputation."""
        return 3 * (self.num_layers * self.layer_flops_per_token() + self.logits_flops_per_token())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "ModelSpec":
        return dataclasses.replace(self, **changes)


MODEL_KEYS = [f.name for f in dataclasses.fields(ModelSpec)]


def _p(name, L, h, heads, ffn, vocab, seq, kv=0, gated=True, tie=False, pos="rope"):
    return ModelSpec(name=name, num_layers=L, hidden_size=h, num_attention_heads=heads, ffn_hidden_size=ffn,
                     vocab_size=vocab, seq_length=seq, num_query_groups=kv, gated_mlp=gated, tie_embeddings=tie,
                     position_embedding=pos)


PRESETS: dict[str, ModelSpec] = {m.name: m for m in [
    _p("llama2-7b", 32, 4096, 32, 11008, 32000, 4096),
    _p("llama2-13b", 40, 5120, 40, 13824, 32000, 4096),
    _p("llama2-70b", 80, 8192, 64, 28672, 32000, 4096, kv=8),
    _p("llama3-8b", 32, 4096, 32, 14336, 128256, 8192, kv=8),
    _p("llama3-70b", 80, 8192, 64, 28672, 128256, 8192, kv=8),
    _p("mistral-7b", 32, 4096, 32, 14336, 32000, 4096, kv=8),
    _p("gpt3-175b", 96, 12288, 96, 49152, 51200, 2048, gated=False, tie=True, pos="learned"),
    # A toy model whose whole parallel layout still means something: used by dry runs and tests.
    _p("tiny", 8, 64, 4, 256, 128, 32, kv=2),
]}


def load_yaml_file(path: str, what: str) -> dict:
    """Read a YAML (or JSON) file into a mapping, turning every I/O or syntax failure into an InputError."""
    if not os.path.exists(path):
        raise InputError(f"{what} file not found", file=path, fix="check the path")
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"is not valid YAML{at}: {problem}", file=path,
                         fix="correct the syntax (indentation, colons, quotes)") from None
    except OSError as exc:
        raise InputError(f"cannot be read: {exc.strerror}", file=path) from None
    return require_mapping(data, what, path)


def model_from_dict(data: dict, *, file: str | None = None, prefix: str = "") -> ModelSpec:
    if "preset" in data:
        base = PRESETS.get(data["preset"])
        if base is None:
            raise InputError(f"unknown preset {data['preset']!r}", file=file, field=f"{prefix}preset",
                             fix=f"use one of: {', '.join(PRESETS)}")
        overrides = {k: v for k, v in data.items() if k != "preset"}
        reject_unknown(overrides, MODEL_KEYS, file=file, prefix=prefix)
        data = {**base.to_dict(), **overrides}
    reject_unknown(data, MODEL_KEYS, file=file, prefix=prefix)
    kw = {}
    for key in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size", "seq_length"):
        kw[key] = get(data, key, int, file=file, prefix=prefix)
    kw["name"] = str(get(data, "name", (str, int, float), default=os.path.splitext(os.path.basename(file or "model"))[0],
                         file=file, prefix=prefix))
    kw["num_query_groups"] = get(data, "num_query_groups", int, default=0, file=file, prefix=prefix)
    kw["gated_mlp"] = get(data, "gated_mlp", bool, default=True, file=file, prefix=prefix)
    kw["tie_embeddings"] = get(data, "tie_embeddings", bool, default=False, file=file, prefix=prefix)
    kw["position_embedding"] = get(data, "position_embedding", str, default="rope", file=file, prefix=prefix)
    kw["max_position_embeddings"] = get(data, "max_position_embeddings", int, default=0, file=file, prefix=prefix)
    try:
        return ModelSpec(**kw)
    except InputError as exc:
        raise exc.within(file=file, prefix=prefix.rstrip(".") or None) from None


# Hugging Face config.json: the key names of each family, by model_type.
_GATED_ACTS = {"silu", "swiglu", "swish"}


def model_from_hf_config(cfg: dict, *, file: str | None = None) -> ModelSpec:
    """Map a Hugging Face config.json (LLaMA/Mistral/Qwen2, GPT-2, GPT-NeoX, OPT, ...) onto a ModelSpec."""
    mt = str(cfg.get("model_type", "")).lower()

    def first(*keys, default=None):
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        if default is None:
            raise InputError(f"none of {', '.join(keys)} is present (model_type {mt or 'unknown'})", file=file,
                             field=keys[0], fix="pass a decoder-only transformer config.json or write a model YAML")
        return default

    L = int(first("num_hidden_layers", "n_layer", "num_layers"))
    h = int(first("hidden_size", "n_embd", "d_model"))
    heads = int(first("num_attention_heads", "n_head"))
    kv = int(cfg.get("num_key_value_heads") or cfg.get("multi_query_group_num") or heads)
    if mt == "gpt2":
        act, ffn, tie, pos = cfg.get("activation_function", "gelu_new"), cfg.get("n_inner") or 4 * h, \
            cfg.get("tie_word_embeddings", True), "learned"
        max_pos = int(first("n_positions", "n_ctx"))
    elif mt == "opt":
        act, ffn, tie, pos = cfg.get("activation_function", "relu"), first("ffn_dim"), \
            cfg.get("tie_word_embeddings", True), "learned"
        max_pos = int(first("max_position_embeddings"))
    else:
        act = cfg.get("hidden_act") or cfg.get("hidden_activation") or cfg.get("activation_function") or "silu"
        ffn = first("intermediate_size", "ffn_dim", "n_inner")
        tie = cfg.get("tie_word_embeddings", False)
        pos = "rope" if mt != "gpt_neo" else "learned"
        max_pos = int(first("max_position_embeddings", "n_positions", "seq_length"))
    gated = str(act).lower() in _GATED_ACTS
    name = cfg.get("_name_or_path") or mt or os.path.splitext(os.path.basename(file or "hf"))[0]
    try:
        return ModelSpec(name=os.path.basename(str(name)) or "hf-model", num_layers=L, hidden_size=h,
                         num_attention_heads=heads, num_query_groups=kv, ffn_hidden_size=int(ffn),
                         vocab_size=int(first("vocab_size")), seq_length=max_pos, gated_mlp=gated,
                         tie_embeddings=bool(tie), position_embedding=pos, max_position_embeddings=max_pos)
    except InputError as exc:
        raise exc.within(file=file) from None


def load_model(source: str, *, seq_length: int | None = None) -> ModelSpec:
    """A preset name, a config.json (Hugging Face) or a model YAML. `seq_length` overrides the file's."""
    if source in PRESETS:
        spec = PRESETS[source]
    elif not os.path.exists(source) and not source.endswith((".json", ".yaml", ".yml")):
        raise InputError(f"'{source}' is neither a preset nor an existing file", field="--model",
                         fix=f"pass a model YAML, a Hugging Face config.json, or a preset: {', '.join(PRESETS)}")
    elif source.endswith(".json"):
        if not os.path.exists(source):
            raise InputError("model file not found", file=source, fix="check the path")
        try:
            with open(source) as fh:
                cfg = json.load(fh)
        except json.JSONDecodeError as exc:
            raise InputError(f"is not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", file=source,
                             fix="correct the syntax") from None
        spec = model_from_hf_config(require_mapping(cfg, "a Hugging Face config", source), file=source)
    else:
        data = load_yaml_file(source, "model")
        if "model" in data and isinstance(data["model"], dict) and len(data) == 1:
            data = data["model"]
        spec = model_from_dict(data, file=source)
    if seq_length:
        spec = spec.replace(seq_length=seq_length, max_position_embeddings=max(seq_length, spec.max_position_embeddings)
                            if spec.position_embedding == "learned" else spec.max_position_embeddings)
    return spec
