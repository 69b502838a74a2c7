"""A Hugging Face config.json as a ModelSpec (the shapes hetauto plans), and what of it a launch does not carry.

The planner needs the shapes (layers, widths, heads, vocabulary, positions) and the few switches that change
weights or Megatron's arguments (gated MLP, tied head, position embedding and its base). Some architectures
have more than the launch scripts build (emit/megatron.py architecture_args): those are named on stderr
(`not_carried`) rather than silently dropped, with the Megatron flag that adds them where one exists.
"""
from __future__ import annotations

import math
import os

from ..errors import InputError
from ._fields import require_mapping
from .files import read_json_file
from .model import ROTARY_BASE, ModelSpec

# Hugging Face config.json. The MLP kind, the default of tie_word_embeddings (a config.json omits keys equal to
# the transformers class default) and the position embedding are properties of the architecture
# (model_type), not of the activation name: Gemma is gated with a GELU, GPT-NeoX is not gated and uses rotary
# positions, GPT-2 and OPT tie their head by default. model_type -> (gated_mlp, tie default, position_embedding).
_HF_FAMILIES = {
    "llama": (True, False, "rope"), "mistral": (True, False, "rope"), "qwen2": (True, False, "rope"),
    "qwen3": (True, False, "rope"), "gemma": (True, True, "rope"), "gemma2": (True, True, "rope"),
    "internlm2": (True, False, "rope"), "baichuan": (True, False, "rope"), "yi": (True, False, "rope"),
    "gpt2": (False, True, "learned"), "opt": (False, True, "learned"), "gpt_neo": (False, True, "learned"),
    "gpt_neox": (False, False, "rope"), "gptj": (False, False, "rope"), "phi": (False, False, "rope"),
    "starcoder2": (False, True, "rope"), "gpt_bigcode": (False, True, "learned"),
}
# Families whose layers Megatron's GPT does not build: planned as a GPT they would be another model.
_REFUSED_FAMILIES = {
    "falcon": "parallel attention (attention and MLP side by side on one norm, Falcon's decoder)",
    "bloom": "ALiBi position biases",
    "mpt": "ALiBi position biases",
}
# Falcon's first releases name their family RefinedWeb (7B: RefinedWebModel, 40B: RefinedWeb), with GPT-2's key names
_REFUSED_FAMILIES.update({"refinedwebmodel": _REFUSED_FAMILIES["falcon"], "refinedweb": _REFUSED_FAMILIES["falcon"]})
# Families whose every layer runs attention and MLP side by side on one input (no switch says it, unlike GPT-NeoX's
# use_parallel_residual): Megatron's GPT layers run them one after the other
_PARALLEL_FAMILIES = {"gptj", "phi", "cohere"}
_GATED_ACTS = {"silu", "swiglu", "swish"}   # only consulted for a model_type the table does not know
# Mixture-of-experts keys: such a model is many times larger than its dense shape, which ModelSpec describes.
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# An encoder's block beside the language model's keys (Qwen2-VL's are at the top level): the encoder is no GPT layer
_MULTIMODAL_KEYS = ("vision_config", "audio_config")


# ModelSpec field -> the config.json keys it is read from, in the order they are tried: the reader below, and its
# errors, which name the key the file has (GPT-2's n_embd) rather than ModelSpec's field (hidden_size)
SOURCE_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_query_groups": ("num_key_value_heads", "multi_query_group_num", "num_kv_heads", "n_head_kv"),
    "ffn_hidden_size": ("intermediate_size", "ffn_dim", "n_inner"),
    "vocab_size": ("vocab_size",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
    "seq_length": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
    "rotary_base": ("rope_theta", "rotary_emb_base"),
}


def model_from_hf_config(cfg: dict, *, file: str | None = None, seq_length: int | None = None) -> ModelSpec:
    """Map a Hugging Face config.json (LLaMA/Mistral/Qwen2, GPT-2, GPT-NeoX, OPT, ...) onto a ModelSpec.
    `seq_length` (--seq-length) stands in for the positions when the config gives none (Baichuan-13B has
    only a tokenizer-style model_max_length): rotary embeddings have no table to size."""
    for key, kind in (("model_type", str), ("head_dim", int)):     # read below only when they have this type
        value = cfg.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise InputError(f"must be {'a string' if kind is str else 'an integer'}, got {value!r}"[:200], file=file,
                             field=key, fix="pass the model's config.json as its library wrote it")
    mt = str(cfg.get("model_type", "")).lower()
    unsupported_fix = "write a model YAML with the architecture's keys instead (docs/inputs.md)"

    def first(*keys, default=None, integer=True):
        for k in keys:
            if cfg.get(k) is not None:
                value = cfg[k]
                if integer and (isinstance(value, bool) or not isinstance(value, int)):
                    raise InputError(f"must be an integer, got {value!r}", file=file, field=k,
                                     fix="correct the value (config.json files from the Hugging Face Hub have it)")
                return value
        if default is None:
            raise InputError(f"none of {', '.join(keys)} is present (model_type {mt or 'unknown'})", file=file,
                             field=keys[0], fix="pass a decoder-only transformer config.json or " + unsupported_fix)
        return default

    if mt in _REFUSED_FAMILIES:
        raise InputError(f"describes a {mt} model, whose {_REFUSED_FAMILIES[mt]} Megatron's GPT layers do not "
                         "build: planned and launched as a GPT it would be another model", file=file,
                         field="model_type", fix=unsupported_fix)
    if cfg.get("is_encoder_decoder"):
        raise InputError(f"describes an encoder-decoder model (model_type {mt or 'unknown'}); hetauto plans "
                         "decoder-only transformers", file=file, field="is_encoder_decoder", fix=unsupported_fix)
    for key in _MOE_KEYS:
        if isinstance(cfg.get(key), int) and cfg[key] > 1:
            raise InputError(f"describes a mixture-of-experts model ({cfg[key]} experts), which hetauto does not "
                             "model: planning it as a dense model would under-count its weights", file=file,
                             field=key, fix="plan a dense model, or " + unsupported_fix)
    for key in _MULTIMODAL_KEYS:
        if isinstance(cfg.get(key), dict):
            raise InputError(f"describes a multimodal model (model_type {mt or 'unknown'}) whose {key} is an encoder "
                             "beside the language model: planned as the language model alone it would leave the "
                             "encoder's weights and compute out", file=file, field=key,
                             fix="plan the language model of a text-only config.json, or " + unsupported_fix)
    L = first(*SOURCE_KEYS["num_layers"])
    h = first(*SOURCE_KEYS["hidden_size"])
    heads = first(*SOURCE_KEYS["num_attention_heads"])
    # multi-query attention (GPT-BigCode, StarCoder): one key/value head, said by a flag rather than a count
    kv = first(*SOURCE_KEYS["num_query_groups"], default=1 if cfg.get("multi_query") is True else heads)
    if kv <= 0:       # ModelSpec reads 0 as "as many as the heads"
        key = next((k for k in SOURCE_KEYS["num_query_groups"] if cfg.get(k) is not None),
                   "num_attention_heads")      # no key/value key: the heads stand in for them
        raise InputError(f"must be a positive integer, got {kv}", file=file, field=key,
                         fix="set it to the model's key/value heads, or leave it out for plain multi-head attention")
    head_dim = cfg.get("head_dim")
    if isinstance(head_dim, int) and head_dim * heads != h:
        raise InputError(f"head_dim {head_dim} x {heads} heads is not hidden_size {h}; hetauto assumes "
                         "head_dim = hidden_size / num_attention_heads", file=file, field="head_dim",
                         fix=unsupported_fix)
    family = _HF_FAMILIES.get(mt)
    if mt == "gpt2":
        ffn = cfg.get("n_inner") or 4 * h
        max_pos = first("n_positions", "n_ctx")
    elif mt == "opt":
        ffn = first("ffn_dim")
        # OPT's position table has 2 extra rows (a fairseq offset): 1,536 parameters at 125M, not modelled.
        max_pos = first("max_position_embeddings")
    else:
        ffn = cfg.get("intermediate_size") or cfg.get("ffn_dim") or cfg.get("n_inner")
        if ffn is None and family is not None and not family[0]:
            ffn = 4 * h   # GPT-Neo / GPT-J leave it null: the classic 4h MLP
        ffn = ffn if ffn is not None else first(*SOURCE_KEYS["ffn_hidden_size"])
        keys = ("max_position_embeddings", "n_positions", "seq_length")
        if any(cfg.get(k) is not None for k in keys):
            max_pos = first(*keys)
        elif seq_length:
            max_pos = seq_length
        else:
            raise InputError(f"none of {', '.join(keys)} is present (model_type {mt or 'unknown'})", file=file,
                             field=keys[0], fix="pass the sequence length you train at with --seq-length N, or "
                             + unsupported_fix)
    if isinstance(ffn, bool) or not isinstance(ffn, int):
        raise InputError(f"the MLP width must be an integer, got {ffn!r}", file=file, field="intermediate_size",
                         fix="correct the value")
    proj = cfg.get("word_embed_proj_dim") if mt == "opt" else None
    if proj is not None and (isinstance(proj, bool) or not isinstance(proj, int)):
        raise InputError(f"must be an integer, got {proj!r}"[:200], file=file, field="word_embed_proj_dim",
                         fix="correct the value (config.json files from the Hugging Face Hub have it)")
    if proj is not None and proj != h:
        # OPT-350m: a narrower embedding projected in and out of every layer's width, the layers post-norm
        raise InputError(f"is {proj} where hidden_size is {h}: the embeddings are projected "
                         "to and from the layers' width (OPT-350m), which Megatron's GPT does not build: planned and "
                         "launched as a GPT it would be another model", file=file, field="word_embed_proj_dim",
                         fix=unsupported_fix)
    if family is not None:
        gated, tie_default, pos = family
    else:
        act = cfg.get("hidden_act") or cfg.get("hidden_activation") or cfg.get("activation_function") or "silu"
        # transformers' save_pretrained leaves tie_word_embeddings out only when it is true (PretrainedConfig's
        # default, and the class's): a family this table does not know, written without it, ties its head (a file
        # without model_type was not written so, and keeps the untied default)
        gated, tie_default, pos = str(act).lower() in _GATED_ACTS, bool(mt), "rope"
    tie = cfg.get("tie_word_embeddings", tie_default)
    if not isinstance(tie, bool):
        raise InputError(f"must be true or false, got {tie!r}", file=file, field="tie_word_embeddings",
                         fix="write true or false")
    name = cfg.get("_name_or_path") or mt or os.path.splitext(os.path.basename(file or "hf"))[0]
    theta = ROTARY_BASE
    if pos == "rope":
        key = next((k for k in SOURCE_KEYS["rotary_base"] if cfg.get(k) is not None), None)
        if key is not None:
            theta = cfg[key]
            # Megatron's --rotary-base takes an integer; nearly every published theta is one (10000.0, 500000.0,
            # 1e6), StarCoder2-3B's is 999999.4420358813: planned and launched at the nearest, which not_carried says
            if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) \
                    or round(theta) <= 1:
                raise InputError(f"must be an integer above 1, or a number that rounds to one (Megatron's "
                                 f"--rotary-base), got {theta!r}"[:200],
                                 file=file, field=key, fix="correct the value, or " + unsupported_fix)
            theta = int(round(theta))
    try:
        return ModelSpec(name=os.path.basename(str(name).rstrip("/")) or "hf-model", num_layers=L, hidden_size=h,
                         num_attention_heads=heads, num_query_groups=kv, ffn_hidden_size=ffn,
                         vocab_size=first(*SOURCE_KEYS["vocab_size"]), seq_length=max_pos, gated_mlp=gated,
                         tie_embeddings=tie, position_embedding=pos, max_position_embeddings=max_pos,
                         rotary_base=theta)
    except InputError as exc:
        # ModelSpec names its own field (hidden_size); the user's file has the config's key (GPT-2's n_embd)
        key = next((k for k in SOURCE_KEYS.get(exc.field, ()) if cfg.get(k) is not None), None)
        if key is None or key == exc.field:
            raise exc.within(file=file) from None
        fix = exc.fix.replace(f"set {exc.field} ", f"set {key} ") if exc.fix else exc.fix
        raise InputError(exc.reason, file=file, field=key, fix=fix) from None


def not_carried(cfg: dict) -> list[str]:
    """What the config describes that the plan's launch does not build (each with the Megatron flag that would)."""
    mt = str(cfg.get("model_type", "")).lower()
    out = []
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict) and scaling:
        kind = str(scaling.get("rope_type") or scaling.get("type") or "?")[:40]
        factor = str(scaling.get("factor"))[:40]
        # each kind has its own flag in Megatron-LM, or none (its arguments.py: --use-rope-scaling is LLaMA-3.x's,
        # --rotary-seq-len-interpolation-factor the linear kind's, an integer)
        flag = {"llama3": f"--use-rope-scaling --rope-scaling-factor {factor}",
                "linear": f"--rotary-seq-len-interpolation-factor {factor}"}.get(kind.lower(),
                                                                                "none for this kind")
        out.append(f"rope_scaling ({kind}, factor {factor}; Megatron: {flag})")
    if cfg.get("attention_bias") and mt not in ("qwen2",):
        # LLaMA-style attention_bias: the output projection has one too, which only --add-bias-linear builds
        out.append("biases on the query, key, value and output projections (Megatron: --add-qkv-bias for Q, K, V; "
                   "the output projection's needs the launch's --disable-bias-linear dropped, which adds the "
                   "MLP's too)")
    elif cfg.get("attention_bias") or cfg.get("qkv_bias") or mt == "qwen2":
        out.append("biases on the query, key and value projections (Megatron: --add-qkv-bias)")
    if cfg.get("mlp_bias") is True:
        out.append("biases on the MLP's projections (Megatron: the launch's --disable-bias-linear dropped, which "
                   "adds the attention output projection's too)")
    partial = cfg.get("rotary_pct", cfg.get("partial_rotary_factor"))
    rotary_dim = cfg.get("rotary_dim")      # GPT-J, CodeGen: the rotated dimensions of each head, a count
    hidden = next((cfg[k] for k in SOURCE_KEYS["hidden_size"] if cfg.get(k) is not None), None)
    heads = next((cfg[k] for k in SOURCE_KEYS["num_attention_heads"] if cfg.get(k) is not None), None)
    if partial is None and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                               for v in (rotary_dim, hidden, heads)):
        partial = rotary_dim / (hidden // heads) if hidden >= heads else None
    if isinstance(partial, (int, float)) and not isinstance(partial, bool) and 0 < partial < 1:
        out.append(f"rotary embeddings on {partial:g} of each head (Megatron: --rotary-percent {partial:g})")
    # Hugging Face applies a window wherever `sliding_window` is a number, unless use_sliding_window says it is
    # off (Qwen2 ships the key with use_sliding_window: false); Mistral and Phi-3 have no such switch
    window = cfg.get("sliding_window")
    if (isinstance(window, int) and not isinstance(window, bool) and cfg.get("use_sliding_window") is not False) \
            or cfg.get("use_sliding_window") is True:
        out.append(f"sliding-window attention (window {str(cfg.get('sliding_window'))[:40]}): planned and launched "
                   "as full causal attention")
    kinds = cfg.get("attention_layers")         # GPT-Neo: "global" and "local" (a window) layers, alternating
    if isinstance(kinds, list) and "local" in kinds:
        out.append(f"local attention (window {str(cfg.get('window_size'))[:40]}) in {kinds.count('local')} of "
                   f"{len(kinds)} layers: planned and launched as full causal attention")
    if cfg.get("use_parallel_residual") is True or cfg.get("parallel_attn") is True or mt in _PARALLEL_FAMILIES:
        out.append("attention and MLP side by side on each layer's input (a parallel residual, as GPT-NeoX's, GPT-J's "
                   "and Phi's): built one after the other, as Megatron's GPT layers are")
    act = cfg.get("hidden_act") or cfg.get("hidden_activation") or cfg.get("activation_function")
    gated = _HF_FAMILIES[mt][0] if mt in _HF_FAMILIES else str(act).lower() in _GATED_ACTS
    if isinstance(act, str) and gated and act.lower() not in _GATED_ACTS:
        out.append(f"an MLP gated through {act[:40]} (GeGLU, as Gemma's): built as SwiGLU, the gate through SiLU")
    elif isinstance(act, str) and not gated and "relu" in act.lower():
        out.append(f"a {act[:40]} MLP (as OPT's): built with GeLU, Megatron's GPT activation (it has no plain-ReLU "
                   "flag)")
    theta = next((cfg[k] for k in SOURCE_KEYS["rotary_base"] if cfg.get(k) is not None), None)
    if isinstance(theta, float) and math.isfinite(theta) and theta != round(theta):
        out.append(f"rotary base {theta!r} (Megatron's --rotary-base takes an integer: launched as {round(theta)})")
    eps = cfg.get("rms_norm_eps", cfg.get("layer_norm_eps", cfg.get("layer_norm_epsilon", cfg.get("norm_epsilon"))))
    if isinstance(eps, float) and math.isfinite(eps) and eps > 0 and eps != 1e-5:
        out.append(f"normalisation epsilon {eps:g} (Megatron: --norm-epsilon {eps:g})")
    return out


def hf_model(cfg: dict, *, file: str, seq_length: int | None, note) -> ModelSpec:
    """model_from_hf_config, telling `note` (a callable taking one line, or None) what the commands should say:
    the sequence length planned when --seq-length is not given, and what the launch will not build."""
    spec = model_from_hf_config(cfg, file=file, seq_length=seq_length)
    if note is not None:
        if not seq_length:
            note(f"{file} gives no training sequence length; planning at the longest its positions allow, "
                 f"{spec.seq_length:,} tokens. Pass --seq-length N to train shorter sequences")
        missing = not_carried(cfg)
        if missing:
            flags = any("Megatron: --" in item for item in missing)
            note(f"{file}: the launch scripts build the planned shapes without: {'; '.join(missing)}. The plan's "
                 "time and memory hardly depend on them" + ("; add the flags named to Megatron's arguments to build "
                                                            "them" if flags else ""))
    return spec


def read_hf_config(path: str) -> dict:
    return require_mapping(read_json_file(path, fix="pass the model's config.json"), "a Hugging Face config", path)
