"""A Hugging Face config.json as a ModelSpec (the shapes hetauto plans), and what of it a launch does not carry.

The planner needs the shapes (layers, widths, heads, vocabulary, positions) and the few switches that change
weights or Megatron's arguments (gated MLP, linear biases, tied head, position embedding and its base). Some
architectures have more than the launch scripts build (emit/megatron.py architecture_args): those are named on stderr
(spec/hf_notes.py `not_carried`) rather than silently dropped, with the Megatron flag that adds them where one
exists. The family tables live in spec/hf_families.py.
"""
from __future__ import annotations

import math
import os

from ..errors import InputError
from ._fields import require_mapping
from .files import read_json_file
from .model import ROTARY_BASE, ModelSpec

from .hf_families import (_FALCON_FAMILIES, _GATED_ACTS, _HF_FAMILIES, _MOE_KEYS, _MULTIMODAL_KEYS,
                          _NESTED_KEYS, _REFUSED_FAMILIES, FALCON_POSITIONS, SOURCE_KEYS, hf_linear_biases)
from .hf_notes import dropout_note, not_carried    # (not_carried: imported from here by callers too)


def model_from_hf_config(cfg: dict, *, file: str | None = None, seq_length: int | None = None) -> ModelSpec:
    """Map a Hugging Face config.json (LLaMA/Mistral/Qwen2, GPT-2, GPT-NeoX, OPT, ...) onto a ModelSpec.
    `seq_length` (--seq-length) stands in for the positions when the config gives none (Baichuan-13B has
    only a tokenizer-style model_max_length): rotary embeddings have no table to size."""
    for key, kind in (("model_type", str), ("head_dim", int)):     # read below only when they have this type
        value = cfg.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise InputError(f"must be {'a string' if kind is str else 'an integer'}, got {value!r}"[:200], file=file,
                             field=key, fix="pass the model's config.json as its library wrote it")
    # switches read as `is True` below (Falcon's; GPT-NeoX's parallel residual): "true" or 1 was read as false
    for key in ("alibi", "multi_query", "new_decoder_architecture", "parallel_attn", "use_parallel_residual"):
        if cfg.get(key) is not None and not isinstance(cfg[key], bool):
            raise InputError(f"must be true or false, got {cfg[key]!r}"[:200], file=file, field=key,
                             fix="write true or false, as the model's published config.json has it")
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

    for key in _NESTED_KEYS:
        if isinstance(cfg.get(key), dict) and cfg[key]:      # an empty block nests nothing: the top level is read
            # LLaVA, Mllama, Gemma-3: the language model's keys are one level down, beside a vision encoder
            encoder = next((k for k in _MULTIMODAL_KEYS if isinstance(cfg.get(k), dict)), None)
            beside = (f", beside an encoder ({encoder}): planned as the language model alone it would leave the "
                      "encoder's weights and compute out" if encoder else ": the top level does not describe it")
            raise InputError(f"holds the language model's config one level down (model_type {mt or 'unknown'})"
                             + beside, file=file, field=key,
                             fix=f"to plan the language model alone, save the {key} block as a config.json of its "
                             "own (with its model_type) and pass that; or " + unsupported_fix)
    if mt == "chatglm":
        # ChatGLM2/3 name their shapes their own way, and ChatGLM-6B's layers rotate half of each head in two
        # dimensions: read with the other families' keys, it was refused for a key it does not have
        raise InputError("describes a ChatGLM model, whose own key names (num_layers, ffn_hidden_size, "
                         "padded_vocab_size, kv_channels, multi_query_group_num) and layers (rotary embeddings on "
                         "half of each head, QKV biases) this reader does not map", file=file, field="model_type",
                         fix="write a model YAML (docs/inputs.md) with its num_layers, hidden_size, "
                         "num_attention_heads, num_query_groups (multi_query_group_num), ffn_hidden_size, vocab_size "
                         "(padded_vocab_size) and gated_mlp: true, which approximates it without those layers' "
                         "differences")
    if mt in _REFUSED_FAMILIES:
        raise InputError(f"describes a {mt} model, whose {_REFUSED_FAMILIES[mt]} Megatron's GPT layers do not "
                         "build: planned and launched as a GPT it would be another model", file=file,
                         field="model_type", fix=unsupported_fix)
    if mt in _FALCON_FAMILIES and cfg.get("alibi") is True:       # Falcon-RW: its rotary otherwise
        raise InputError(f"describes a {mt} model with ALiBi position biases, which Megatron's GPT layers do not "
                         "build: planned and launched as a GPT it would be another model", file=file, field="alibi",
                         fix=unsupported_fix)
    if cfg.get("is_encoder_decoder"):
        raise InputError(f"describes an encoder-decoder model (model_type {mt or 'unknown'}); hetauto plans "
                         "decoder-only transformers", file=file, field="is_encoder_decoder", fix=unsupported_fix)
    if cfg.get("sliding_window") is not None:     # ("4096": a window the notes passed over in silence)
        first("sliding_window")
    for key in _MOE_KEYS:
        if cfg.get(key) is not None:    # a count written otherwise ("8", 8.0) was planned as a dense model
            first(key)
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
    if heads <= 0:
        key = next(k for k in SOURCE_KEYS["num_attention_heads"] if cfg.get(k) is not None)
        raise InputError(f"must be a positive integer, got {heads}", file=file, field=key,
                         fix="set it to the model's attention heads, as its published config.json has it")
    # multi-query attention (GPT-BigCode, StarCoder): one key/value head, said by a flag rather than a count
    kv = first(*SOURCE_KEYS["num_query_groups"], default=1 if cfg.get("multi_query") is True else heads)
    # Falcon-7B: multi-query (FalconConfig's default; it writes num_kv_heads = the heads, which only the new decoder
    # of 40B and 180B reads, as RefinedWeb, 40B's first release, does)
    new_decoder = cfg.get("new_decoder_architecture") is True or mt == "refinedweb"
    if mt in _FALCON_FAMILIES and cfg.get("multi_query", True) is True and not new_decoder:
        kv = 1
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
        ffn = first("n_inner", default=4 * h)     # (null: 4h; 0 or false was read as 4h too)
        # (GPT2Config maps max_position_embeddings onto n_positions: a hand-written file may use that name)
        max_pos = first("n_positions", "n_ctx", "max_position_embeddings")
    elif mt == "opt":
        ffn = first("ffn_dim")
        # OPT's position table has 2 extra rows (a fairseq offset): 1,536 parameters at 125M, not modelled.
        max_pos = first("max_position_embeddings")
    else:
        # the first key written (0 or false was passed over as absent, and GPT-NeoX's 0 became 4h)
        written = next((k for k in ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
                        if cfg.get(k) is not None), None)
        ffn = first(written) if written is not None else None
        if ffn is None and family is not None and not family[0]:
            ffn = 4 * h   # GPT-Neo / GPT-J leave it null: the classic 4h MLP
        ffn = ffn if ffn is not None else first(*SOURCE_KEYS["ffn_hidden_size"])
        keys = ("max_position_embeddings", "n_positions", "seq_length")
        if any(cfg.get(k) is not None for k in keys):
            max_pos = first(*keys)
        elif seq_length:
            max_pos = seq_length
        elif mt in _FALCON_FAMILIES:
            max_pos = FALCON_POSITIONS
        else:
            raise InputError(f"none of {', '.join(keys)} is present (model_type {mt or 'unknown'})", file=file,
                             field=keys[0], fix="pass the sequence length you train at with --seq-length N, or "
                             + unsupported_fix)
    if isinstance(ffn, bool) or not isinstance(ffn, int):
        # named by the key the file gave it in (GPT-2's n_inner, OPT's ffn_dim), not the one Llama's files use
        key = next((k for k in ({"gpt2": ("n_inner",), "opt": ("ffn_dim",)}.get(mt) or SOURCE_KEYS["ffn_hidden_size"])
                    if cfg.get(k) is not None), "intermediate_size")
        raise InputError(f"the MLP width must be an integer, got {ffn!r}"[:200], file=file, field=key,
                         fix="correct the value (a whole number, as the model's published config.json has it)")
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
        act_key = next((k for k in ("hidden_act", "hidden_activation", "activation_function") if cfg.get(k)), None)
        act = cfg[act_key] if act_key else "silu"
        if not isinstance(act, str):    # (a number was read as an ungated MLP without a word)
            raise InputError(f"must be an activation's name, got {act!r}", file=file, field=act_key,
                             fix="write the activation's name, e.g. \"silu\" or \"gelu\"")
        # transformers' save_pretrained leaves tie_word_embeddings out only when it is true (PretrainedConfig's
        # default, and the class's): a family this table does not know, written without it, ties its head (a file
        # without model_type was not written so, and keeps the untied default)
        gated, tie_default, pos = str(act).lower() in _GATED_ACTS, bool(mt), "rope"
    tie = cfg.get("tie_word_embeddings", tie_default)
    if not isinstance(tie, bool):
        raise InputError(f"must be true or false, got {tie!r}", file=file, field="tie_word_embeddings",
                         fix="write true or false")
    _check_rope_scaling(cfg.get("rope_scaling"), file)
    for key in ("rotary_pct", "partial_rotary_factor"):       # ("x", 2.0 or NaN passed without a word)
        part = cfg.get(key)
        if part is not None and (isinstance(part, bool) or not isinstance(part, (int, float)) or not 0 < part <= 1):
            raise InputError(f"must be the fraction of each head rotated, above 0 and at most 1, got {part!r}"[:200],
                             file=file, field=key, fix="correct the value, as the model's published config.json has it")
    for key in ("bias", "mlp_bias", "attention_bias"):     # whether the linear layers have biases (hf_linear_biases)
        if cfg.get(key) is not None and not isinstance(cfg[key], bool):
            raise InputError(f"must be true or false, got {cfg[key]!r}"[:200], file=file, field=key,
                             fix="write true or false (whether those linear layers have biases), as the model's "
                                 "published config.json has it")
    name = (cfg.get("_name_or_path") or _directory_name(file) or mt
            or os.path.splitext(os.path.basename(file or "hf"))[0])
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
                         rotary_base=theta, linear_biases=hf_linear_biases(cfg, mt))
    except InputError as exc:
        # ModelSpec names its own field (hidden_size); the user's file has the config's key (GPT-2's n_embd)
        key = next((k for k in SOURCE_KEYS.get(exc.field, ()) if cfg.get(k) is not None), None)
        if key is None or key == exc.field:
            raise exc.within(file=file) from None
        fix = exc.fix.replace(f"set {exc.field} ", f"set {key} ") if exc.fix else exc.fix
        raise InputError(exc.reason, file=file, field=key, fix=fix) from None


def _check_rope_scaling(scaling, file):
    """rope_scaling is null or a mapping whose factor, where given, is a positive number: the note quotes it as the
    value of a Megatron flag (a dict or a string there was printed into the suggested --rope-scaling-factor)."""
    fix = "correct the value (the model's published config.json has e.g. {\"rope_type\": \"llama3\", \"factor\": 8.0})"
    if scaling is None:
        return
    if not isinstance(scaling, dict):
        raise InputError(f"must be a mapping or null, got {scaling!r}"[:200], file=file, field="rope_scaling", fix=fix)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind is not None and not isinstance(kind, str):
        raise InputError(f"must be a string, got {kind!r}"[:200], file=file,
                         field="rope_scaling." + ("rope_type" if "rope_type" in scaling else "type"), fix=fix)
    factor = scaling.get("factor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                               or not math.isfinite(factor) or factor <= 0):
        raise InputError(f"must be a positive number, got {factor!r}"[:200], file=file, field="rope_scaling.factor",
                         fix=fix)


# Directory names that say nothing about the model: a checkpoint's config.json in one of them keeps the other rule
_GENERIC_DIRS = {"", ".", "..", "tmp", "model", "models", "config", "configs", "checkpoint", "checkpoints", "hf",
                 "huggingface", "snapshots", "latest", "main"}


def _directory_name(file: str | None) -> str | None:
    """The name of the directory a config.json sits in (Llama-3.1-8B/config.json: Llama-3.1-8B), which most Hub
    configs, written without _name_or_path, name the model by; in the Hub's cache (models--ORG--NAME/snapshots/
    COMMIT/config.json) the repository's name. None for another file name or a directory that names nothing."""
    if not file or os.path.basename(file) != "config.json":
        return None
    path = os.path.dirname(os.path.abspath(file))
    parent = os.path.basename(path)
    if len(parent) == 40 and all(c in "0123456789abcdef" for c in parent):       # a snapshot's commit
        repo = os.path.basename(os.path.dirname(os.path.dirname(path)))
        return repo.split("--")[-1] if repo.startswith("models--") else None
    return None if parent.lower() in _GENERIC_DIRS else parent


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
            window = cfg.get("sliding_window")
            # a window shorter than the sequence planned: full attention does much more work than it would
            longer = isinstance(window, int) and not isinstance(window, bool) and window < spec.seq_length \
                and cfg.get("use_sliding_window") is not False
            weight = (f"The plan prices what they launch, full attention over the {spec.seq_length:,} tokens (the "
                      f"window of {window:,} would attend over far fewer: less work than planned); its time and memory "
                      "hardly depend on the rest") if longer else "The plan's time and memory hardly depend on them"
            note(f"{file}: the launch scripts build the planned shapes without: {'; '.join(missing)}. {weight}"
                 + ("; add the flags named to Megatron's arguments to build them" if flags else ""))
        dropout = dropout_note(cfg, file)
        if dropout:
            note(dropout)
    return spec


def read_hf_config(path: str) -> dict:
    return require_mapping(read_json_file(path, fix="pass the model's config.json"), "a Hugging Face config", path)
