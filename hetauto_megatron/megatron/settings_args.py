"""Megatron-LM's runtime-setting, precision and vocabulary arguments from the plan's mesh settings.

Megatron's flags for the runtime settings and the precision (sequence_parallel, use_distributed_optimizer,
overlap_grad_reduce, overlap_param_gather, grad_reduce_in_bf16 / accumulate_allreduce_grads_in_fp32, bf16, fp16,
fp8 and its transformer_impl: plan/megatron_flags.py, the table the cost model priced) are switches that default
to off, so a flag the user did not give is filled in from the plan (per mesh, like TP), and one the user gave
that no mesh of the rank's cluster in its pipeline runs (e.g. --sequence-parallel where every such mesh of TP > 1
has sequence_parallel: false, or --fp16 in a bf16 plan) is refused, naming the flag and the plan field: the plan's
time and memory were priced for what the plan says. The dropouts are probabilities whose Megatron default (0.1) is
not 0: each rank gets its mesh's value, and a value the user gave (also 0.1: the parser's default is marked,
args.py ParserDefault) that no such mesh runs is refused in the same way. Every mesh gets the plan's one padded
vocabulary (Plan.padded_vocab_size), and a mesh of CPU processes Megatron's local layers without fused kernels
(megatron_flags.CPU_LAYER_ARGS), as priced, and every rank what every launch runs (megatron_flags.JOB_ARGS: no
attention mask from the data loader).

Apart from rewrite.py, which applies these values with the parallel layout: this is the one place that reads
the plan's per-mesh settings table for Megatron's arguments (pure functions, no torch).
"""
from __future__ import annotations

from ..errors import InputError
from ..plan.megatron_flags import CPU_LAYER_ARGS, JOB_ARGS, MEGATRON_ARGS, megatron_values
from ..plan.plan import Plan
from ..plan.vocab_padding import padded_vocab_size
from ..runtime.ranks import RankCoords
from ..spec.model import MAKE_VOCAB_SIZE_DIVISIBLE_BY
from .args import ParserDefault, ParserDefaultStr

# The fp8 recipe the cost model prices (cost/model_state.py FP8_WEIGHT_COPY_BYTES: delayed scaling's weight copies),
# Megatron-LM's default --fp8-recipe
PRICED_FP8_RECIPE = "delayed"


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
    # A flag is refused when no mesh of the rank's cluster in its pipeline runs it, as rewrite.check_layout_args
    # judges TP: one launch's argument list may serve several of those meshes (a node holding ranks of two meshes
    # gets the first mesh's), and each rank takes its own mesh's value. Judged against every mesh of the plan, a
    # setting only another cluster runs, typed on this one, was turned off there without a word.
    near = plan.launch_meshes(placement.mesh_index)
    every = {i: _switch_values(plan, i) for i in near}
    mine = every[placement.mesh_index]
    for arg, (want, field) in mine.items():
        flag = MEGATRON_ARGS[arg][0]
        if isinstance(want, float):
            # A probability (the dropouts): given when typed on the command line (an absent flag leaves the
            # parser's marked default, args.py ParserDefault), and then, like a switch, it must be one a mesh runs.
            have = getattr(args, arg, None)
            if have is not None and not isinstance(have, ParserDefault) and \
                    not any(v[arg][0] == float(have) for v in every.values()):
                clashes.append((f"{flag} {have} (plan: {field} is {want})", field))
            out[arg] = want
            continue
        if not isinstance(want, bool):
            continue                # fp8 format and transformer_impl: checked below
        # --sequence-parallel on a TP 1 mesh builds nothing: Megatron turns it off there (arguments.py
        # validate_args, "Disabling sequence parallelism because tensor model parallelism is disabled"), so where
        # those meshes are all TP 1 the flag runs what the plan says (NVIDIA's example scripts pass it whatever the
        # TP); where one has TP > 1, only those can run it
        runs = [v.get(arg, (False,))[0] for i, v in every.items()
                if arg != "sequence_parallel" or plan.meshes[i].tp > 1]
        if arg == "sequence_parallel" and all(plan.meshes[i].tp == 1 for i in near):
            runs = [True]
        if getattr(args, arg, False) and not any(runs):
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
        if getattr(args, "first_last_layers_bf16", False):
            # Megatron-Core's fp8_utils: the first and last layers' GEMMs in bf16, slower than the fp8 priced
            clashes.append(("--first-last-layers-bf16 (plan: precision is fp8, every layer's GEMMs priced in fp8)",
                            "precision"))
        if getattr(args, "fp8_wgrad", True) is False:
            # --no-fp8-wgrad (or --disable-fp8-wgrad): Megatron-Core's fp8 recipe overrides the weight-gradient
            # GEMMs' precision (fp8_utils.py get_fp8_recipe, override_linear_precision=(False, False, not
            # config.fp8_wgrad)), so a third of every layer's GEMMs run in bf16, slower than the fp8 rate priced.
            # Outside fp8 plans Megatron builds no fp8 recipe, so the flag changes nothing there and passes.
            clashes.append(("--no-fp8-wgrad (plan: precision is fp8, the weight-gradient GEMMs priced in fp8)",
                            "precision"))
        recipe = getattr(args, "fp8_recipe", PRICED_FP8_RECIPE)
        recipe = getattr(recipe, "value", recipe)
        if recipe != PRICED_FP8_RECIPE:
            # Megatron-Core's get_fp8_recipe (fp8_utils.py) builds Transformer Engine's current scaling
            # (tensorwise), 128-element block scaling (blockwise), MXFP8 (Blackwell only) or a user factory
            # (custom): other weight copies and scales than the delayed-scaling copies the plan prices
            # (cost/model_state.py FP8_WEIGHT_COPY_BYTES), other GEMM rates. The amax history's length and
            # algorithm (--fp8-amax-history-len, --fp8-amax-compute-algo) pass: a few fp32 numbers per GEMM.
            # Outside fp8 plans Megatron builds no recipe, and the flag changes nothing priced.
            clashes.append((f"--fp8-recipe {recipe} (plan: precision is fp8, priced with Megatron's default "
                            f"recipe, --fp8-recipe {PRICED_FP8_RECIPE}: delayed scaling)", "precision"))
    if mesh.device_type == "cpu":
        # CPU processes build the local, unfused layers the plan priced for them, whatever the launch says
        # (megatron_flags.CPU_LAYER_ARGS: Megatron-LM's fused defaults stop a CPU rank with a traceback); a typed
        # --transformer-impl of another kind is refused when none of those meshes is an accelerator that runs it
        impl = getattr(args, "transformer_impl", None)
        if impl not in (None, "local") and not isinstance(impl, ParserDefaultStr) and \
                all(plan.meshes[i].device_type == "cpu" for i in near):
            clashes.append((f"--transformer-impl {impl} (plan: meshes[{placement.mesh_index}] is CPU processes, "
                            "which build Megatron's local layers)", f"meshes[{placement.mesh_index}].device_type"))
        out.update({arg: value for arg, (_, value) in CPU_LAYER_ARGS.items()})
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
    # What every launch runs (JOB_ARGS), also where the launch left the flags out. --reset-attention-mask cuts the
    # data loader's mask at document ends, which Megatron then needs (GPTDataset drops the cuts without a word when
    # it builds no mask): the mask is built there, as Megatron builds it, whatever the emitted flag says (unpriced).
    job = {arg: value for arg, (_, value) in JOB_ARGS.items()}
    if getattr(args, "reset_attention_mask", False):
        job["create_attention_mask_in_dataloader"] = True
    out.update(job)
    return out


def _plan_word(plan: Plan, precision: str, field: str) -> str:
    if field == "precision":
        return precision + ("" if precision == plan.precision else f" (a CPU process; the plan says {plan.precision})")
    if field.endswith("grad_reduce_dtype"):
        return plan.meshes[int(field.split("[")[1].split("]")[0])].settings.grad_reduce_dtype
    return "false"
