"""The tables a Hugging Face config.json is read by (spec/hf_config.py) and its notes written from (spec/hf_notes.py):
which families hetauto knows, how, and which key each planned field comes from."""
from __future__ import annotations

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
    # Falcon: a GELU MLP of 4h, LayerNorm, rotary positions (ALiBi where `alibi` says so: refused below), a tied head
    # (FalconConfig's default); 7B's first release names the family RefinedWebModel, 40B's RefinedWeb
    "falcon": (False, True, "rope"), "refinedwebmodel": (False, True, "rope"), "refinedweb": (False, True, "rope"),
}
_FALCON_FAMILIES = {"falcon", "refinedwebmodel", "refinedweb"}
# Families whose layers Megatron's GPT does not build: planned as a GPT they would be another model.
_REFUSED_FAMILIES = {
    "bloom": "ALiBi position biases",
    "mpt": "ALiBi position biases",
}
# Families whose every layer runs attention and MLP side by side on one input (no switch says it, unlike GPT-NeoX's
# use_parallel_residual, Falcon's parallel_attn): Megatron's GPT layers run them one after the other
_PARALLEL_FAMILIES = {"gptj", "phi", "cohere"}
_GATED_ACTS = {"silu", "swiglu", "swish"}   # only consulted for a model_type the table does not know
# Mixture-of-experts keys: such a model is many times larger than its dense shape, which ModelSpec describes.
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# An encoder's block beside the language model's keys (Qwen2-VL's are at the top level): the encoder is no GPT layer
_MULTIMODAL_KEYS = ("vision_config", "audio_config")
# A language model nested in a multimodal config (LLaVA, Mllama, Gemma-3: text_config; InternVL: llm_config)
_NESTED_KEYS = ("text_config", "llm_config")


# ModelSpec field -> the config.json keys it is read from, in the order they are tried: the reader below, and its
# errors, which name the key the file has (GPT-2's n_embd) rather than ModelSpec's field (hidden_size)
SOURCE_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_query_groups": ("num_key_value_heads", "multi_query_group_num", "num_kv_heads", "n_head_kv"),
    "ffn_hidden_size": ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size"),
    "vocab_size": ("vocab_size",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
    "seq_length": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
    "rotary_base": ("rope_theta", "rotary_emb_base"),
}

# Falcon's config.json written before transformers 4.33 has no max_position_embeddings: FalconConfig's default
FALCON_POSITIONS = 2048


def hf_linear_biases(cfg: dict, mt: str) -> bool | None:
    """Whether the config says that every linear layer has a bias (True) or that none has (False): Falcon's `bias`
    (FalconConfig's default false where a file leaves it out), else `mlp_bias` and `attention_bias` where both are
    given and agree (Nemotron's false). None where it says nothing, or biases on one part only (Megatron builds
    every linear layer's bias or none): the MLP kind's rule then (ModelSpec.linear_biases), the difference noted
    (spec/hf_notes.py). The values are bools (spec/hf_config.py refuses others)."""
    if mt in _FALCON_FAMILIES:
        return cfg.get("bias") is True
    mlp, attention = cfg.get("mlp_bias"), cfg.get("attention_bias")
    return mlp if isinstance(mlp, bool) and mlp is attention else None
