"""Per-rank rewrite of Megatron-LM's arguments from a hetauto plan (pure functions, no torch).

Megatron-LM assumes one TP degree, one DP degree and one micro-batch size for the whole job. Under a
heterogeneous plan those are properties of a mesh, so every rank gets the values of ITS mesh, while the
values that are global by nature (pipeline depth, per-stage layer layout, global batch) are the plan's:

    tensor_model_parallel_size   <- mesh.tp
    data_parallel_size           <- mesh.dp   (Megatron derives it from world_size; see `validation_world_size`)
    micro_batch_size             <- mesh.micro_batch_size
    recompute_*                  <- mesh.recompute (plan.mesh.RECOMPUTE_SETTINGS: selective = the MLP)
    sequence_parallel            <- mesh.settings.sequence_parallel (plan/settings.py)
    pipeline_model_parallel_size <- the stages of the rank's pipeline (plan.layout.PipelineLayout)
    pipeline_model_parallel_layout <- that pipeline's stage layers, e.g. "Et*4|t*4L"
    global_batch_size            <- the samples the rank's mesh trains per iteration: its pipeline's micro-batches
                                    x the mesh's dp x micro_batch_size (= plan.global_batch_size for a plan of
                                    one pipeline; the user's --global-batch-size must be the plan's, the job's)
    sequence_parallel, use_distributed_optimizer, overlap_grad_reduce, overlap_param_gather,
    grad_reduce_in_bf16 / accumulate_allreduce_grads_in_fp32, hidden_dropout, attention_dropout
                                 <- mesh.settings (plan/settings.py, the table the cost model priced)
    bf16, fp16, fp8 (+ transformer_impl) <- plan.precision
    padded_vocab_size, make_vocab_size_divisible_by
                                 <- one padded vocabulary for every mesh (Plan.padded_vocab_size)

Megatron computes micro-batches = global_batch_size / (dp * micro_batch_size), so every rank of a pipeline
(all meshes of its stages, side by side or not) computes its pipeline's number, which the 1F1B schedule needs.
Several pipelines each run their own Megatron pipeline (depth, layout, micro-batches); what joins them (each
pipeline's samples, the gradient sum across them, the logged loss of the whole batch) is hook.py's. Model-shape arguments are checked against the plan's model:
a value the user left unset is filled in, a contradicting one is an error (the plan was made for another
model, so its layout and memory estimate do not apply). The same holds for the runtime settings and the
precision: Megatron's flags for them are switches that default to off, so a flag the user did not give is
filled in from the plan (per mesh, like TP), and one the user gave that no mesh of the plan runs (e.g.
--sequence-parallel where every mesh has sequence_parallel: false, or --fp16 in a bf16 plan) is refused, naming
the flag and the plan field: the plan's time and memory were priced for what the plan says. The dropouts are
probabilities whose Megatron default (0.1) is not 0: each rank gets its mesh's value, and a value the user gave
(also 0.1: the parser's default is marked, args.py ParserDefault) that no mesh runs is refused in the same way.
The architecture switches (SwiGLU, the normalization, linear biases, the position embedding and its rotary base, an
untied output layer: emit/megatron.py architecture_args, the table the launch scripts emit) are checked and never
filled in: Megatron's defaults are GPT-2's, and an absent store_true flag cannot be told from a deliberate choice.
"""
from __future__ import annotations

from ..emit.megatron import architecture_args
from ..errors import InputError
from ..plan.layout import mesh_layout, megatron_layout
from ..plan.plan import Plan, recompute_settings
from ..plan.megatron_flags import MEGATRON_ARGS, megatron_values
from ..plan.vocab_padding import padded_vocab_size
from ..spec.model import MAKE_VOCAB_SIZE_DIVISIBLE_BY
from ..runtime.groups import RankCoords
from .args import ParserDefault, ParserDefaultInt
from .unpriced import check_attention_args, check_ddp_bucket_args, check_unpriced

# Megatron argument -> ModelSpec attribute; checked (or filled in) on every rank.
MODEL_ARGS = {
    "num_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "ffn_hidden_size": "ffn_hidden_size",
    "seq_length": "seq_length",
}

# Arguments that choose a pipeline split some other way; the plan's layout replaces them.
# (the interleaved schedule's virtual stages are refused: megatron/unpriced.py)
_OTHER_SPLIT_ARGS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")


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


def layout_overrides(plan: Plan, placement: RankCoords) -> dict:
    """The per-rank parallel-layout arguments (see the module docstring)."""
    mesh = plan.meshes[placement.mesh_index]
    layout = mesh_layout(plan, placement.mesh_index)
    out = {
        "tensor_model_parallel_size": mesh.tp,
        "pipeline_model_parallel_size": layout.num_stages,
        "context_parallel_size": 1,
        "micro_batch_size": mesh.micro_batch_size,
        "global_batch_size": mesh_batch_size(plan, placement.mesh_index),
        "pipeline_model_parallel_layout": megatron_layout(layout.stage_layers),
        **recompute_settings(mesh.recompute),
        # Megatron's legacy spelling of selective recomputation, which its validate_args would turn into
        # recompute_granularity after this rewrite: the plan's recomputation is what runs
        "recompute_activations": False,
        # what the mesh's activations look like at its boundaries: the communicator cuts them by this setting
        "sequence_parallel": mesh.settings.sequence_parallel,
        "account_for_embedding_in_pipeline_split": False,
        "account_for_loss_in_pipeline_split": False,
    }
    out.update({k: None for k in _OTHER_SPLIT_ARGS})
    return out


def mesh_batch_size(plan: Plan, mesh_index: int) -> int:
    """Samples one mesh trains per iteration, Megatron's --global-batch-size on its ranks: its pipeline's
    micro-batches x dp x micro_batch_size (the plan's global batch for a plan of one pipeline of single meshes)."""
    mesh = plan.meshes[mesh_index]
    return mesh_layout(plan, mesh_index).num_micro_batches * mesh.samples_per_step


# Megatron arguments counted in samples: under several pipelines (or meshes side by side) Megatron's sample count
# is the mesh's share of the batch, so a schedule in samples would end or decay at a different iteration on each.
_SAMPLE_ARGS = (("train_samples", "--train-samples", "--train-iters"),
                ("lr_warmup_samples", "--lr-warmup-samples", "--lr-warmup-iters"),
                ("lr_decay_samples", "--lr-decay-samples", "--lr-decay-iters"),
                ("lr_wsd_decay_samples", "--lr-wsd-decay-samples", "--lr-wsd-decay-iters"),
                ("rampup_batch_size", "--rampup-batch-size", None))


def check_job_args(args, plan: Plan, *, file: str | None = None) -> None:
    """The user's job-wide arguments against the plan: --global-batch-size must be the plan's (its time and memory
    were priced for it); a plan that is not one pipeline of single meshes takes iteration-based schedules only
    (and checkpoints in the per-rank `torch` format: `check_checkpoint_format`)."""
    check_checkpoint_format(args, plan, file=file)
    have = getattr(args, "global_batch_size", None)
    if have is not None and int(have) != plan.global_batch_size:
        split = ""
        if plan.num_pipelines > 1:
            split = f" (pipelines: {' + '.join(map(str, plan.samples_per_pipeline))} samples)"
        raise InputError(f"--global-batch-size {have} is not the plan's global batch of {plan.global_batch_size} "
                         f"samples{split}", file=file, field="global_batch_size",
                         fix=f"pass --global-batch-size {plan.global_batch_size} (or drop it: --hetauto sets each "
                             "mesh's share), or make a plan for this batch with 'hetauto plan'")
    if plan.is_simple:
        return
    for arg, flag, instead in _SAMPLE_ARGS:
        if getattr(args, arg, None):
            raise InputError(f"{flag} is not supported with a plan of several pipelines or meshes side by side: "
                             "Megatron counts samples per mesh there", file=file, field=flag,
                             fix=f"use {instead}" if instead else "drop the flag (a plan has one global batch)")
    for arg in ("eval_global_batch_size", "eval_micro_batch_size", "full_validation", "calculate_per_token_loss"):
        if getattr(args, arg, None):
            flag = "--" + arg.replace("_", "-")
            raise InputError(f"{flag} is not supported with a plan of several pipelines or meshes side by side: "
                             "evaluation reads the global batch as training does, and losses and gradients are "
                             "weighted by each mesh's share of the samples", file=file, field=flag,
                             fix="drop the flag")


def checkpoint_stage(plan: Plan, placement: RankCoords) -> int:
    """The stage number in this rank's checkpoint file name (Megatron's mp_rank_TT_SSS): the index of its mesh
    stage counted over every mesh of the plan in order, so that stages of different pipelines (each has a stage
    0) and meshes side by side at one stage (each with its own TP shards) never share a file. For a plan of one
    pipeline of single meshes it is the pipeline stage, Megatron's own name."""
    return sum(m.num_stages for m in plan.meshes[:placement.mesh_index]) + placement.stage_in_mesh


def _switch_values(plan: Plan, mesh_index: int) -> dict[str, tuple[object, str]]:
    """Megatron argument -> (value the mesh runs, plan field) for every argument the plan decides
    (megatron_flags.megatron_values)."""
    at = f"meshes[{mesh_index}].settings"
    values = megatron_values(plan.meshes[mesh_index].settings, plan.mesh_precision(mesh_index))
    return {arg: (v, "precision" if MEGATRON_ARGS[arg][1] == "precision" else f"{at}.{MEGATRON_ARGS[arg][1]}")
            for arg, v in values.items()}


def runtime_setting_overrides(args, plan: Plan, placement: RankCoords, *, file: str | None = None) -> dict:
    """Megatron's values for the mesh's runtime settings, the job's precision and the padded vocabulary.
    Raises InputError naming every flag the user gave that the plan does not run (see the module docstring)."""
    mesh = plan.meshes[placement.mesh_index]
    try:
        precision = plan.mesh_precision(placement.mesh_index)     # fp8 only where the device has it
    except InputError as exc:
        raise exc.within(file=file) from None
    out, clashes = {}, []
    # A flag is refused when no mesh of the plan runs it: one argument list may serve several meshes (a node
    # holding ranks of two meshes gets the first mesh's), and each rank takes its own mesh's value, like TP.
    every = [_switch_values(plan, i) for i in range(len(plan.meshes))]
    mine = every[placement.mesh_index]
    for arg, (want, field) in mine.items():
        flag = MEGATRON_ARGS[arg][0]
        if isinstance(want, float):
            # A probability (the dropouts): given when typed on the command line (an absent flag leaves the
            # parser's marked default, args.py ParserDefault), and then, like a switch, it must be one a mesh runs.
            have = getattr(args, arg, None)
            if have is not None and not isinstance(have, ParserDefault) and \
                    not any(v[arg][0] == float(have) for v in every):
                clashes.append((f"{flag} {have} (plan: {field} is {want})", field))
            out[arg] = want
            continue
        if not isinstance(want, bool):
            continue                # fp8 format and transformer_impl: checked below
        if getattr(args, arg, False) and not any(v.get(arg, (False,))[0] for v in every):
            clashes.append((f"{flag} (plan: {field} is {_plan_word(plan, precision, field)})", field))
        out[arg] = want
    fp8 = mine["fp8"][0]
    have_fp8 = getattr(args, "fp8", None)
    if have_fp8 not in (None, fp8):
        clashes.append((f"--fp8-format {have_fp8} (plan: precision is {precision})", "precision"))
    out["fp8"] = fp8
    if fp8:
        want_impl = mine["transformer_impl"][0]
        impl = getattr(args, "transformer_impl", want_impl)
        if impl != want_impl:
            clashes.append((f"--transformer-impl {impl} (plan: precision is fp8, which runs on Transformer Engine)",
                            "precision"))
        out["transformer_impl"] = want_impl
    if clashes:
        raise InputError("the Megatron arguments ask for something the plan does not run: "
                         + "; ".join(text for text, _ in clashes), file=file, field=clashes[0][1],
                         fix="drop these flags (--hetauto sets every runtime setting from the plan), or change the "
                             "plan's settings / precision and re-check it with 'hetauto simulate'")
    # One vocabulary for every mesh: Megatron pads to make_vocab_size_divisible_by x TP, and TP differs per
    # mesh; the plan pads once for all of them (Plan.padded_vocab_size, with its model's divisor, Megatron's 128
    # unless the model file says otherwise), the cost model priced that table, and each mesh is given that size,
    # with a divisor that reproduces it should Megatron recompute the padding. A divisor the user gave that builds
    # another table is refused (Megatron's default, 128, counts as not given).
    padded = plan.padded_vocab_size
    divisor = plan.model.make_vocab_size_divisible_by
    given = getattr(args, "make_vocab_size_divisible_by", None)
    if given not in (None, MAKE_VOCAB_SIZE_DIVISIBLE_BY, divisor, padded // mesh.tp):
        theirs = padded_vocab_size(plan.model.vocab_size, plan.vocab_tps, int(given))
        if theirs != padded:
            raise InputError(f"--make-vocab-size-divisible-by {given} pads the vocabulary to {theirs} rows; the "
                             f"plan priced {padded}, the smallest multiple of {divisor} x every mesh's TP "
                             f"({', '.join(map(str, sorted(set(plan.vocab_tps))))}) above {plan.model.vocab_size}, "
                             "and every mesh builds it", file=file, field="--make-vocab-size-divisible-by",
                             fix="drop the flag (--hetauto gives every mesh the plan's padded vocabulary), or plan "
                                 f"for a model file with make_vocab_size_divisible_by: {given} (docs/inputs.md)")
    out["padded_vocab_size"] = padded
    out["make_vocab_size_divisible_by"] = padded // mesh.tp
    return out


def _plan_word(plan: Plan, precision: str, field: str) -> str:
    if field == "precision":
        return precision + ("" if precision == plan.precision else f" (a CPU process; the plan says {plan.precision})")
    if field.endswith("grad_reduce_dtype"):
        return plan.meshes[int(field.split("[")[1].split("]")[0])].settings.grad_reduce_dtype
    return "false"


def validation_world_size(plan: Plan, placement: RankCoords) -> int:
    """The world size Megatron's validate_args must see so that it derives this rank's mesh DP
    (data_parallel_size = world_size / (tp * pp)): the homogeneous job this mesh would be on its own."""
    mesh = plan.meshes[placement.mesh_index]
    return mesh.tp * mesh.dp * mesh_layout(plan, placement.mesh_index).num_stages


def check_checkpoint_format(args, plan: Plan, *, file: str | None = None) -> None:
    """Checkpointing a plan whose meshes shard a parameter differently needs Megatron's per-rank `torch` format:
    meshes with different TP sizes, and any plan of several pipelines or meshes side by side (several meshes hold
    each parameter, each with its own sharding).

    The default `torch_dist` format describes every tensor as one global tensor with one sharding for the
    whole job; a layer sharded TP 2 in one mesh and TP 1 in another fails Megatron's sharding-integrity check
    at the first save (an AssertionError naming the tensor's two local shapes). With `--ckpt-format torch`
    every (TP rank, mesh stage) writes its own file (mp_rank_TT_SSS, the stage unique across meshes:
    `checkpoint_stage`), so each mesh saves and loads its own shards; resuming gives the uninterrupted run's
    losses."""
    fmt = getattr(args, "ckpt_format", "torch_dist")
    if not (getattr(args, "save", None) or getattr(args, "load", None)) or fmt == "torch":
        return
    tps = sorted({m.tp for m in plan.meshes})
    if len(tps) > 1:
        why = (f"its meshes shard the layers with different TP sizes ({', '.join(map(str, tps))}), and that format "
               "needs one sharding for the whole job")
    elif not plan.is_simple:
        why = "it has several pipelines or meshes side by side: several meshes hold each parameter"
    else:
        return
    raise InputError(f"--ckpt-format {fmt} cannot checkpoint this plan: {why}", file=file, field="--ckpt-format",
                     fix="add --ckpt-format torch (each mesh stage saves and loads its own shards; "
                         "docs/megatron-integration.md, Checkpoints)")


def check_layout_args(args, plan: Plan, placement: RankCoords, *, file: str | None = None) -> None:
    """A parallel layout the launch gave must be one the plan runs there, or the user meant another job: TP and
    the micro-batch of some mesh of the rank's cluster in its pipeline (a launch script lists one of them where
    meshes share a node; the rewrite then gives each rank its own), the stages of its pipeline (the interleaved
    schedule is refused first: megatron/unpriced.py). Megatron's default (1, marked: args.py ParserDefaultInt, or
    unset) passes; a typed 1 is checked."""
    mesh = plan.meshes[placement.mesh_index]
    here = [m for m in plan.meshes if m.cluster == mesh.cluster and m.pipeline == mesh.pipeline]
    clashes = []
    for dest, values in (("tensor_model_parallel_size", sorted({m.tp for m in here})),
                         ("micro_batch_size", sorted({m.micro_batch_size for m in here})),
                         ("pipeline_model_parallel_size", [mesh_layout(plan, placement.mesh_index).num_stages])):
        have = getattr(args, dest, None)
        if have is not None and not isinstance(have, ParserDefaultInt) and int(have) not in values:
            clashes.append(f"--{dest.replace('_', '-')} {have} (plan: {' or '.join(map(str, values))} on cluster "
                           f"{mesh.cluster})")
    if clashes:
        raise InputError("the launch asks for another parallel layout than the plan's: " + "; ".join(clashes),
                         file=file, field="meshes",
                         fix="drop those flags (the --hetauto hook sets each rank's layout from the plan), or make "
                             "a plan of that layout")


def rewrite_args(args, plan: Plan, placement: RankCoords, *, file: str | None = None) -> dict:
    """Rewrite a parsed (not yet validated) Megatron argument namespace in place for this rank.
    Returns {argument: (old, new)} for every value that changed, for the start-up log."""
    check_unpriced(args, file=file)
    check_job_args(args, plan, file=file)
    check_layout_args(args, plan, placement, file=file)
    check_attention_args(args, plan, placement, file=file)
    check_ddp_bucket_args(args, plan, placement, file=file)
    new = {**check_model_args(args, plan, file=file), **layout_overrides(plan, placement),
           **runtime_setting_overrides(args, plan, placement, file=file)}
    new["rank"] = placement.rank
    new["world_size"] = validation_world_size(plan, placement)
    changed = {}
    for key, value in new.items():
        old = getattr(args, key, None)
        if old != value:
            changed[key] = (old, value)
        setattr(args, key, value)
    return changed
