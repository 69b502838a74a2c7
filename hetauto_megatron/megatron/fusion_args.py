"""Megatron-LM's fused kernels turned off on a mesh of accelerators, against what the plan priced (pure, no torch).

A mesh of accelerators is priced with Megatron-LM's default layers, Transformer Engine's with Megatron-Core's fused
kernels on (cost/activations.py TRANSFORMER_ENGINE, cost/analytic.py); a mesh of CPU processes with the local,
unfused layers its launch gives it (plan/megatron_flags.py CPU_LAYER_ARGS, which settings_args.py sets on a CPU rank
whatever the launch says). On an accelerator rank a flag of that table that turns a fusion off is refused, naming
the flag and the mesh, where the unfused path changes the memory or time priced for the plan's model and the mesh's
settings (`FUSIONS`, each entry's `priced`):

--no-gradient-accumulation-fusion   Transformer Engine's linears write each weight gradient into a tensor of its
    own (fuse_wgrad_accumulation, core/extensions/transformer_engine.py), which Megatron's DDP hook then adds into
    the fp32 main gradient: a transient weight gradient, and one more pass over every weight's gradient (2 + 4 + 4
    bytes a parameter) each micro-batch, where the plan prices the weight-gradient GEMMs accumulating in place.
--no-bias-swiglu-fusion (a gated MLP)   Megatron's unfused GLU (core/transformer/mlp.py, glu) keeps two more
    s*b*f/TP tensors per layer than the fused kernel, 5 against 3 (cost/activations.py gated_mlp_tensors), and makes
    more passes over the MLP's activation than the fused kernel's priced three (cost/analytic.py act_bytes).
--no-bias-gelu-fusion (a plain MLP with biases)   the bias add and the GeLU as two kernels: twice the activation's
    passes priced. Without biases Megatron's validate_args turns the fusion off itself (what the plan prices
    there), and a gated MLP never reads it.
--no-rope-fusion (rotary positions)   the unfused rotary embedding keeps its cos and sin for Q and K (fused_rope)
    and makes passes of its own; with learned positions Megatron's validate_args turns the fusion off itself.
--no-bias-dropout-fusion (linear biases, or a hidden dropout on the mesh)   the bias add, the dropout and the
    residual add as separate kernels (core/fusions/fused_bias_dropout.py, unfused): more passes over [s, b, h] than
    the one per bias-dropout-add priced (docs/cost-model.md). With neither, the unfused path is the one residual add
    the fused one is (PyTorch's dropout at probability 0 returns its input).

Changing nothing priced on an accelerator mesh, so not refused (`priced` None):
--no-masked-softmax-fusion   read only by Megatron's local attention (core/transformer/dot_product_attention.py);
    Transformer Engine's attention never reads it (and --transformer-impl local is refused there:
    unpriced.py check_attention_args).
--no-persist-layer-norm   read only by the APEX LayerNorm of Megatron's local layers (core/fusions/fused_layer_norm.py);
    Transformer Engine's norms never read it.
(--no-gradient-reduce-div-fusion, not in the table: read only by Megatron FSDP, which unpriced.py refuses.)
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

from ..errors import InputError
from ..plan.megatron_flags import CPU_LAYER_ARGS
from ..plan.plan import Plan
from ..runtime.ranks import RankCoords


class Fusion(NamedTuple):
    # (model, mesh settings) -> whether the unfused path changes what the plan priced; None: it never does
    priced: Optional[Callable]
    what: str            # what the unfused path changes, for messages; or why it changes nothing


# Megatron attribute (a key of CPU_LAYER_ARGS, whose flag turns the fusion off) -> Fusion
FUSIONS = {
    # (only where this rank's Megatron can build it: without APEX's kernel its output layer refuses the fusion,
    # so that launch has no other way, and check_fusion_args turns the fusion off there)
    "gradient_accumulation_fusion": Fusion(
        lambda model, s: fused_accumulation_available(),
        "each weight gradient written apart and added into the fp32 main gradient every micro-batch: one more pass "
        "over the weights' gradients and a transient weight gradient, where the plan prices accumulation in place"),
    "bias_swiglu_fusion": Fusion(
        lambda model, s: model.gated_mlp,
        "Megatron's unfused GLU keeps two more s*b*f/TP tensors per layer and makes more passes over the MLP's "
        "activation than the fused SwiGLU priced"),
    "bias_gelu_fusion": Fusion(
        lambda model, s: not model.gated_mlp and model.linear_biases,
        "the MLP's bias add and GeLU as two kernels: twice the activation's passes the fused kernel was priced"),
    "apply_rope_fusion": Fusion(
        lambda model, s: model.position_embedding == "rope",
        "the unfused rotary embedding keeps its cos and sin for Q and K and makes passes of its own, where the plan "
        "priced Transformer Engine's fused kernel"),
    "bias_dropout_fusion": Fusion(
        lambda model, s: model.linear_biases or s.hidden_dropout > 0,
        "the bias add, the dropout and the residual add as separate kernels: more passes over each layer's output "
        "than the one fused bias-dropout-add priced"),
    "masked_softmax_fusion": Fusion(None, "read only by Megatron's local attention, which accelerator meshes do not "
                                          "build"),
    "no_persist_layer_norm": Fusion(None, "read only by the APEX LayerNorm of Megatron's local layers, which "
                                          "accelerator meshes do not build"),
}


def fused_accumulation_available() -> bool:
    """Whether APEX's fused weight-gradient kernel is installed here: Megatron-Core's ColumnParallelLinear (the
    output layer, also under Transformer Engine's layers) raises at build time when gradient_accumulation_fusion
    is on without it (tensor_parallel/layers.py), so an install without APEX (pip's megatron-core, some ROCm
    stacks) can only run the unfused accumulation."""
    import importlib.util
    return importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None


def check_fusion_args(args, plan: Plan, placement: RankCoords, *, file: str | None = None) -> dict:
    """Refuse, on a rank of an accelerator mesh, every flag of CPU_LAYER_ARGS that turns off a fusion whose unfused
    path changes what the plan priced there (see the module docstring). A CPU mesh runs the unfused layers as
    priced. Returns the overrides of an accelerator rank that cannot build a fusion: the gradient accumulation's
    without APEX's kernel is turned off (Megatron stopped every rank at the model's build with a RuntimeError),
    its extra pass over the weights' gradients unpriced, as the start-up log's changed arguments say."""
    k = placement.mesh_index
    mesh = plan.meshes[k]
    if mesh.device_type == "cpu":
        return {}
    off = [(CPU_LAYER_ARGS[dest][0], f.what) for dest, f in FUSIONS.items()
           if f.priced is not None and getattr(args, dest, None) == CPU_LAYER_ARGS[dest][1]
           and f.priced(plan.model, mesh.settings)]
    if off:
        flags = [flag for flag, _ in off]
        raise InputError(f"the launch turns off fused kernels that the plan priced on meshes[{k}] "
                         f"({mesh.device_type}): " + "; ".join(f"{flag} ({what})" for flag, what in off),
                         file=file, field=flags[0],
                         fix="drop " + ", ".join(flags) + " (Megatron-LM's fused defaults run what the plan priced "
                             "for a mesh of accelerators; the unfused layers are priced only for meshes of cpu "
                             "processes)")
    return {} if fused_accumulation_available() else {"gradient_accumulation_fusion": False}
