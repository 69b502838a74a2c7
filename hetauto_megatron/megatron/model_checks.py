"""Megatron-LM's model arguments against the plan's model: shape filled in or checked, architecture checked.

The plan was made for one model, so its layout and memory estimate apply to that model only. A shape argument
(layers, hidden size, heads, key/value heads, FFN size, sequence, position table) the user left unset is filled in
from the plan's model; a contradicting one is an error naming every clash. The architecture switches (SwiGLU,
the normalization, linear biases, the position embedding and its rotary base, an untied output layer:
emit/megatron.py architecture_args, the table the launch scripts emit) are checked and never filled in:
Megatron's defaults are GPT-2's, and an absent store_true flag cannot be told from a deliberate choice. The
tokenizer Megatron builds is checked against the plan's vocabulary once it exists (`check_tokenizer_vocab`).

Apart from rewrite.py, which gives each rank its mesh's layout: these checks are the same on every rank and
depend on the model alone (pure functions, no torch).
"""
from __future__ import annotations

from ..emit.megatron import architecture_args
from ..errors import InputError
from ..plan.plan import Plan

# Megatron argument -> ModelSpec attribute; checked (or filled in) on every rank.
MODEL_ARGS = {
    "num_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "ffn_hidden_size": "ffn_hidden_size",
    "seq_length": "seq_length",
}


def model_arg_values(plan: Plan) -> dict:
    """The plan model's values of Megatron's model-shape arguments."""
    m = plan.model
    values = {arg: getattr(m, attr) for arg, attr in MODEL_ARGS.items()}
    values["group_query_attention"] = m.num_query_groups != m.num_attention_heads
    values["num_query_groups"] = m.num_query_groups if values["group_query_attention"] else None
    return values


def check_model_args(args, plan: Plan, *, file: str | None = None) -> dict:
    """Compare Megatron's model-shape arguments with the plan's model. Returns the values to fill in (the ones
    the user left unset); raises InputError listing every contradiction."""
    want = model_arg_values(plan)
    fill, clashes = {}, []
    for arg in MODEL_ARGS:
        have = getattr(args, arg, None)
        if have is None:
            fill[arg] = want[arg]
        elif int(have) != want[arg]:
            clashes.append(f"--{arg.replace('_', '-')} {have} (plan: {want[arg]})")
    # Megatron's other spelling of the sequence: its validate_args copies --encoder-seq-length into seq_length
    # when that is unset, and asserts that not both are given (the hook's filled-in seq_length tripped it: a
    # traceback on every rank). It must be the plan's; then Megatron copies it.
    enc = getattr(args, "encoder_seq_length", None)
    if enc is not None:
        if int(enc) != plan.model.seq_length:
            clashes.append(f"--encoder-seq-length {enc} (plan: {plan.model.seq_length})")
        elif getattr(args, "seq_length", None) is not None:
            clashes.append("--encoder-seq-length next to --seq-length (Megatron takes one of them: drop "
                           "--encoder-seq-length)")
        fill.pop("seq_length", None)
    # Key/value heads: Megatron spells "no GQA" by leaving --group-query-attention off, so an absent flag
    # counts as unset and takes the plan's value; an explicit --num-query-groups must agree.
    if getattr(args, "group_query_attention", False):
        have_kv = getattr(args, "num_query_groups", None)
        if have_kv is None:
            fill["num_query_groups"] = plan.model.num_query_groups
        elif int(have_kv) != plan.model.num_query_groups:
            clashes.append(f"--num-query-groups {have_kv} (plan: {plan.model.num_query_groups})")
    elif want["group_query_attention"]:
        fill["group_query_attention"] = True
        fill["num_query_groups"] = want["num_query_groups"]
    # The position table: a learned one was priced at the plan's rows; with rotary embeddings the value only has
    # to reach the sequence (Megatron's validate_args asserts it), so a larger one is left alone.
    m = plan.model
    have_pos = getattr(args, "max_position_embeddings", None)
    if have_pos is None:
        fill["max_position_embeddings"] = m.max_position_embeddings
    elif m.position_embedding == "learned" and int(have_pos) != m.max_position_embeddings:
        clashes.append(f"--max-position-embeddings {have_pos} (plan: {m.max_position_embeddings} learned positions)")
    elif int(have_pos) < m.seq_length:
        clashes.append(f"--max-position-embeddings {have_pos}, shorter than the plan's sequence of {m.seq_length} "
                       f"tokens (plan: {m.max_position_embeddings})")
    # The architecture switches: Megatron's defaults are GPT-2's (LayerNorm, biases, GeLU, learned positions, tied
    # head), so a LLaMA plan launched without its flags would build, and train, a model the plan never priced.
    # They are store_true flags or choices whose absence cannot be told from a typed default: a contradiction is
    # refused, never filled in behind the user's back.
    for arch in architecture_args(m):
        have = getattr(args, arch.dest, None)
        if have is not None and have != arch.value:
            how = "add " + " ".join(arch.flags) if arch.flags else "Megatron's default: leave the flag out"
            clashes.append(f"{arch.dest} {have} where the plan's model has {arch.why} ({how})")
    # Megatron-Core's TransformerConfig accepts the residual-fused RMSNorm with RMSNorm only: beside a LayerNorm model
    # every rank stopped at the model's build with its ValueError (with RMSNorm it builds nothing priced: unpriced.py)
    norm = getattr(args, "normalization", None)
    if getattr(args, "fused_residual_rmsnorm", False) and norm != "RMSNorm":
        clashes.append(f"--fused-residual-rmsnorm, which Megatron-Core runs with RMSNorm only, beside normalization "
                       f"{norm} (drop the flag)")
    # Megatron's legacy spelling of rotary embeddings, which its validate_args turns into position_embedding_type
    # after this check: rotary is the plan's model's, or the launch builds another model
    if getattr(args, "use_rotary_position_embeddings", False) and m.position_embedding != "rope":
        clashes.append(f"--use-rotary-position-embeddings where the plan's model has {m.position_embedding} "
                       "positions (drop the flag)")
    # The head width: Megatron derives it (hidden / heads) unless --kv-channels says otherwise, which would resize
    # every attention projection the plan priced.
    have_kv_ch = getattr(args, "kv_channels", None)
    if have_kv_ch is not None and int(have_kv_ch) != m.head_dim:
        clashes.append(f"--kv-channels {have_kv_ch} (plan: heads of {m.head_dim}, hidden_size / num_attention_heads)")
    # The tokenizer's vocabulary (given explicitly for NullTokenizer) must be the plan's: its table was priced.
    have_vocab = getattr(args, "vocab_size", None)
    if have_vocab is not None and int(have_vocab) != plan.model.vocab_size:
        clashes.append(f"--vocab-size {have_vocab} (plan: {plan.model.vocab_size})")
    if clashes:
        raise InputError(f"the Megatron arguments describe another model than the plan's '{plan.model.name}': "
                         + "; ".join(clashes), file=file, field="model",
                         fix="pass the plan's model arguments ('hetauto emit megatron --plan PLAN' prints them; the "
                             "shape arguments may be left out: --hetauto fills them in), or make a plan for this "
                             "model with 'hetauto plan'")
    return fill


def check_tokenizer_vocab(vocab_size, plan: Plan, *, file: str | None = None) -> None:
    """The tokenizer Megatron built against the plan's vocabulary: more tokens than the plan's rows would index past
    the embedding table at the first forward pass (a LLaMA-3 tokenizer on a LLaMA-2 plan). Fewer is how configs are
    written (Qwen2's 151,646 tokens in 152,064 rows), and runs."""
    if isinstance(vocab_size, int) and vocab_size > plan.model.vocab_size:
        raise InputError(f"the tokenizer has {vocab_size:,} tokens, more than the {plan.model.vocab_size:,} of the "
                         f"plan's vocabulary (the embedding table the plan priced, {plan.padded_vocab_size:,} rows "
                         "with padding): its ids would index past the table", file=file, field="model.vocab_size",
                         fix=f"make a plan for a vocabulary of {vocab_size:,} (vocab_size in the model file, or the "
                             "tokenizer's model config.json), or give Megatron the tokenizer the plan was made for")
