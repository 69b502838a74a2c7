"""What a Hugging Face config.json describes that the plan's launch does not build, said on stderr
(spec/hf_config.py hf_model) rather than silently dropped, with the Megatron flag that adds each where one exists;
and the dropouts the config trains with, which the plan does not run."""
from __future__ import annotations

import math

from .hf_families import _FALCON_FAMILIES, _GATED_ACTS, _HF_FAMILIES, _PARALLEL_FAMILIES, SOURCE_KEYS, \
    hf_linear_biases

# config.json keys of the dropouts after the embedding and each residual branch (Megatron's --hidden-dropout) and on
# the attention probabilities (--attention-dropout), as the families spell them; a classifier head's are not here
HIDDEN_DROPOUT_KEYS = ("resid_pdrop", "embd_pdrop", "hidden_dropout", "hidden_dropout_prob", "residual_dropout",
                       "embedding_dropout", "embed_dropout", "resid_dropout", "dropout")
ATTENTION_DROPOUT_KEYS = ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob", "attn_dropout")
# Gemma's embeddings are multiplied by sqrt(hidden_size) (Megatron-Core 0.19's GPT has no such switch)
_SCALED_EMBEDDING_FAMILIES = {"gemma", "gemma2", "gemma3_text"}
# families whose attention always normalises its queries and keys (Qwen3Attention, Olmo2Attention, Gemma3Attention:
# q_norm and k_norm), which Megatron builds only under --qk-layernorm
_QK_NORM_FAMILIES = {"qwen3", "olmo2", "gemma3", "gemma3_text"}


def not_carried(cfg: dict) -> list[str]:
    """What the config describes that the plan's launch does not build (each with the Megatron flag that would)."""
    mt = str(cfg.get("model_type", "")).lower()
    act = cfg.get("hidden_act") or cfg.get("hidden_activation") or cfg.get("activation_function") \
        or cfg.get("activation")
    gated = _HF_FAMILIES[mt][0] if mt in _HF_FAMILIES else str(act).lower() in _GATED_ACTS
    said = hf_linear_biases(cfg, mt)
    built = (not gated) if said is None else said       # whether the launch builds linear biases (ModelSpec's rule)
    out = []
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict) and scaling:
        kind = str(scaling.get("rope_type") or scaling.get("type") or "?")[:40]
        # (a positive number or absent: hf_config refuses any other factor)
        factor = scaling.get("factor")
        whole = isinstance(factor, (int, float)) and not isinstance(factor, bool) and math.isfinite(factor) \
            and factor == int(factor)
        # each kind has its own flag in Megatron-LM, or none (its arguments.py: --use-rope-scaling is LLaMA-3.x's,
        # --rotary-seq-len-interpolation-factor the linear kind's, an integer)
        flag = {"llama3": "--use-rope-scaling" + (f" --rope-scaling-factor {factor}" if factor is not None else ""),
                "linear": f"--rotary-seq-len-interpolation-factor {int(factor)}" if whole else
                "none for a factor that is not a whole number"}.get(kind.lower()) or "none for this kind"
        out.append(f"rope_scaling ({kind}, factor {factor}; Megatron: {flag})")
    # (with linear biases built, every projection has its bias: nothing to say of these)
    if cfg.get("attention_bias") and mt not in ("qwen2",) and not built:
        # LLaMA-style attention_bias: the output projection has one too, which only --add-bias-linear builds
        out.append("biases on the query, key, value and output projections (Megatron: --add-qkv-bias for Q, K, V; "
                   "the output projection's needs the launch's --disable-bias-linear dropped, which adds the "
                   "MLP's too)")
    elif (cfg.get("attention_bias") or cfg.get("qkv_bias") or mt == "qwen2") and not built:
        out.append("biases on the query, key and value projections (Megatron: --add-qkv-bias)")
    if cfg.get("mlp_bias") is True and not built:
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
    # one rule for every parallel block (GPT-NeoX's switch, Falcon's parallel_attn, which FalconConfig defaults
    # to true, and the families that always run one): accepted, and built sequentially, which this says
    falcon_parallel = mt in _FALCON_FAMILIES and cfg.get("parallel_attn", True) is True
    if cfg.get("use_parallel_residual") is True or cfg.get("parallel_attn") is True or mt in _PARALLEL_FAMILIES \
            or falcon_parallel:
        out.append("attention and MLP side by side on each layer's input (a parallel residual, as GPT-NeoX's, GPT-J's, "
                   "Phi's, Cohere's and Falcon's): built one after the other, as Megatron's GPT layers are, each "
                   "with a norm of its own")
    if isinstance(act, str) and gated and act.lower() not in _GATED_ACTS:
        out.append(f"an MLP gated through {act[:40]} (GeGLU, as Gemma's): built as SwiGLU, the gate through SiLU")
    elif isinstance(act, str) and not gated and act.lower() in ("relu2", "squared_relu", "relu_squared"):
        out.append(f"a squared-ReLU MLP ({act}, as Nemotron's): built with GeLU (Megatron: --squared-relu)")
    elif isinstance(act, str) and not gated and "relu" in act.lower():
        out.append(f"a {act[:40]} MLP (as OPT's): built with GeLU, Megatron's GPT activation (it has no plain-ReLU "
                   "flag)")
    out += _bias_and_norm_notes(cfg, mt, built)
    theta = next((cfg[k] for k in SOURCE_KEYS["rotary_base"] if cfg.get(k) is not None), None)
    if isinstance(theta, float) and math.isfinite(theta) and theta != round(theta):
        out.append(f"rotary base {theta!r} (Megatron's --rotary-base takes an integer: launched as {round(theta)})")
    eps = cfg.get("rms_norm_eps", cfg.get("layer_norm_eps", cfg.get("layer_norm_epsilon", cfg.get("norm_epsilon"))))
    number = isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps)
    if number and eps > 0 and eps != 1e-5:
        out.append(f"normalisation epsilon {eps:g} (Megatron: --norm-epsilon {eps:g})")
    elif eps is not None and not (number and eps > 0):
        # 0, a negative, or a string ("1e-6" quoted): no epsilon Megatron's flag would take as meant
        out.append(f"normalisation epsilon {str(eps)[:40]} is not a positive number: launched with Megatron's "
                   "default 1e-05 (write it as a number, e.g. 1e-06, and pass --norm-epsilon)")
    return out


def _bias_and_norm_notes(cfg: dict, mt: str, built: bool) -> list[str]:
    """Biases, norms and scalings the plan's Megatron GPT builds otherwise (`built`: whether the launch builds the
    linear layers' biases, ModelSpec.linear_biases; a plain MLP's layers have LayerNorm, a gated MLP's RMSNorm)."""
    out = []
    if built:
        # Megatron builds every linear layer's bias or none (--disable-bias-linear): a config without them on one
        # part (attention_bias false beside mlp_bias true), or in words hf_linear_biases does not read (use_bias),
        # is built with them, a few vectors per layer, under 0.1 per mille of the weights
        no_bias = [k for k in ("bias", "use_bias") if cfg.get(k) is False]
        part = [k for k in ("attention_bias", "mlp_bias") if cfg.get(k) is False]
        if no_bias:
            out.append(f"no biases in the linear layers ({' and '.join(no_bias)} false): built and priced with "
                       "them, as the launch builds a plain MLP's layers (without --disable-bias-linear)")
        elif part:
            where = "the attention's projections" if part == ["attention_bias"] else "the MLP's projections"
            out.append(f"no biases on {where} ({part[0]} false): built and priced with them, as Megatron builds "
                       "every linear layer's bias or none (--disable-bias-linear)")
    if mt == "cohere":
        out.append("LayerNorm without a shift (Cohere's): built as RMSNorm, the same weights, the mean not subtracted")
    # Cohere's behind a switch; Qwen3, OLMo-2 and Gemma-3 always (their q_norm and k_norm)
    if (mt == "cohere" and cfg.get("use_qk_norm") is True) or mt in _QK_NORM_FAMILIES:
        out.append("norms on the queries and keys (" + ("use_qk_norm" if mt == "cohere" else f"{mt}'s q_norm and "
                   "k_norm") + "; Megatron: --qk-layernorm, which the plan does not price: hetauto's launches refuse "
                   "it): planned and launched without them")
    scale = cfg.get("logit_scale")
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale != 1:
        out.append(f"logits multiplied by logit_scale {scale:g} (Cohere's): built unscaled (Megatron's GPT has no "
                   "such flag)")
    if mt in _SCALED_EMBEDDING_FAMILIES:
        out.append("embeddings multiplied by sqrt(hidden_size) (Gemma's): built unscaled (Megatron's GPT has no such "
                   "flag)")
    capped = [k for k in ("attn_logit_softcapping", "final_logit_softcapping") if cfg.get(k) is not None]
    if capped:
        out.append(f"soft-capped logits ({', '.join(capped)}, Gemma-2's): built uncapped (Megatron's GPT has no "
                   "such flag)")
    if mt == "nemotron":      # NemotronLayerNorm1P: the weight is stored as its offset from 1
        out.append("LayerNorm scaled by 1 + its weight (Nemotron's layernorm1p; Megatron: --apply-layernorm-1p)")
    return out


def dropout_note(cfg: dict, file: str) -> str | None:
    """The config's nonzero dropouts (GPT-2's 0.1, Phi-2's resid_pdrop, OPT's dropout): the plan runs its own
    (plan/settings.py, 0 unless a mesh's settings say otherwise), which the launch passes as --hidden-dropout and
    --attention-dropout; the note says so, and how a plan trains with the config's."""
    given = [f"{k} {cfg[k]:g}" for k in HIDDEN_DROPOUT_KEYS + ATTENTION_DROPOUT_KEYS
             if isinstance(cfg.get(k), (int, float)) and not isinstance(cfg[k], bool) and math.isfinite(cfg[k])
             and cfg[k] > 0]
    if not given:
        return None
    from ..plan.settings import RuntimeSettings        # (the plan's defaults, one table)
    plan = RuntimeSettings(sequence_parallel=False)
    return (f"{file} trains with dropout ({', '.join(given)}); the plan runs hidden dropout {plan.hidden_dropout:g} "
            f"and attention dropout {plan.attention_dropout:g} (--hidden-dropout, --attention-dropout), as LLM "
            "pre-training does, and prices that. To train with the config's, write settings: {hidden_dropout: P, "
            "attention_dropout: P} in each mesh of the plan file (docs/plan-format.md) and price it again with "
            "hetauto simulate; hetauto plan has no flag for it")
