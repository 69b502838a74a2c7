"""The Megatron-LM spelling of what a plan decides per mesh: its runtime settings, the job's precision, and on CPU
processes the layers (CPU_LAYER_ARGS), and what every launch runs (JOB_ARGS).

Apart from plan/settings.py (what the settings are, their defaults and overrides) because this is how Megatron-LM
names them: one table of Megatron attributes and flags (`MEGATRON_ARGS`), filled for one mesh by
`megatron_values`. The launch scripts' flags (emit/megatron.py), the `--hetauto` rewrite's values and checks
(megatron/settings_args.py) and its parser marks (megatron/args.py) all read it, so what is emitted and what is
checked cannot drift apart. It imports only the settings and the precision (no torch): megatron/args.py, which reads it,
must cost nothing to import.
"""
from __future__ import annotations

from .precision import DEFAULT_PRECISION, check_precision, sixteen_bit_dtype
from .settings import RuntimeSettings, default_settings

# Every Megatron-LM argument the plan decides: attribute (args.<name>) -> (its flag, what in the plan decides it:
# a setting of the mesh, or the job's "precision"). The emitted flags and the --hetauto rewrite's values and
# checks all come from `megatron_values`, which fills this table for one mesh.
MEGATRON_ARGS = {
    "sequence_parallel": ("--sequence-parallel", "sequence_parallel"),
    "use_distributed_optimizer": ("--use-distributed-optimizer", "distributed_optimizer"),
    "overlap_grad_reduce": ("--overlap-grad-reduce", "overlap_grad_reduce"),
    "overlap_param_gather": ("--overlap-param-gather", "overlap_param_gather"),
    "grad_reduce_in_bf16": ("--grad-reduce-in-bf16", "grad_reduce_dtype"),
    "hidden_dropout": ("--hidden-dropout", "hidden_dropout"),
    "attention_dropout": ("--attention-dropout", "attention_dropout"),
    "accumulate_allreduce_grads_in_fp32": ("--accumulate-allreduce-grads-in-fp32", "grad_reduce_dtype"),
    "bf16": ("--bf16", "precision"),
    "fp16": ("--fp16", "precision"),
    "fp8": ("--fp8-format", "precision"),
    "transformer_impl": ("--transformer-impl", "precision"),
}
# fp8 runs Transformer Engine's GEMMs in fp8 ("hybrid": E4M3 forward, E5M2 gradients) on bf16 parameters.
FP8_FORMAT = "hybrid"

# The layers a mesh of CPU processes builds: Megatron's local layer spec without its fused kernels, the layers the
# dry run builds (runtime/model.py) and the cost model prices for CPU meshes (cost/activations.py DRY_RUN_IMPL).
# Every fused kernel needs CUDA (Transformer Engine, APEX, torch.compile for a GPU): at Megatron-LM's defaults a CPU
# rank stops with a traceback in TransformerConfig ("apply_rope_fusion is not available"), in ColumnParallelLinear
# (APEX's fused_weight_gradient_mlp_cuda), in torch's LayerNorm (persist_layer_norm) or inside torch.compile (the
# fused bias kernels); without --transformer-impl local, in Transformer Engine's layer spec. Megatron attribute ->
# (its flag, the value the flag gives it).
CPU_LAYER_ARGS = {
    "transformer_impl": ("--transformer-impl", "local"),
    "gradient_accumulation_fusion": ("--no-gradient-accumulation-fusion", False),
    "no_persist_layer_norm": ("--no-persist-layer-norm", True),
    "bias_gelu_fusion": ("--no-bias-gelu-fusion", False),
    "bias_swiglu_fusion": ("--no-bias-swiglu-fusion", False),
    "bias_dropout_fusion": ("--no-bias-dropout-fusion", False),
    "masked_softmax_fusion": ("--no-masked-softmax-fusion", False),
    "apply_rope_fusion": ("--no-rope-fusion", False),
}

# What every launch of a plan runs, whatever its meshes: Megatron attribute -> (its flag, the value the flag gives it).
# No attention mask made by the data loader: at Megatron-LM's default the first and last stages load, per micro-batch,
# an s x s boolean mask per sample (GPTDataset; core/utils.py get_batch_on_this_tp_rank copies it to the device and
# broadcasts it over TP: 16 MiB a sample at 4,096 tokens, 1 GiB at 32,768) that a causal model's attention does not
# read (Transformer Engine's causal kernels; the local layers' softmax builds its causal mask itself when given
# none: fusions/fused_softmax.py). The plan prices neither its bytes nor its broadcast. Megatron needs it only where
# --reset-attention-mask cuts it at document ends (settings_args.py builds it there, unpriced).
JOB_ARGS = {
    "create_attention_mask_in_dataloader": ("--no-create-attention-mask-in-dataloader", False),
}


def megatron_values(s: RuntimeSettings, precision: str = DEFAULT_PRECISION) -> dict:
    """{Megatron attribute: value} for one mesh's settings at the job's precision (keys of MEGATRON_ARGS; a
    switch is True/False, the dropouts are probabilities (floats, always given: Megatron's default is not 0), fp8
    and transformer_impl are strings or None). The gradient dtype's spelling depends
    on the precision: bf16 (and fp8, which trains on bf16 parameters) reduces in fp32 unless
    --grad-reduce-in-bf16; fp16 reduces in fp16 unless --accumulate-allreduce-grads-in-fp32; fp32 training has
    fp32 gradients either way (neither attribute is decided)."""
    sixteen_bit = sixteen_bit_dtype(check_precision(precision))
    out = {"sequence_parallel": s.sequence_parallel, "use_distributed_optimizer": s.distributed_optimizer,
           "overlap_grad_reduce": s.overlap_grad_reduce, "overlap_param_gather": s.overlap_param_gather}
    if sixteen_bit == "bf16":
        out["grad_reduce_in_bf16"] = s.grad_reduce_dtype == "param"
    elif sixteen_bit == "fp16":
        out["accumulate_allreduce_grads_in_fp32"] = s.grad_reduce_dtype == "fp32"
    out["hidden_dropout"] = s.hidden_dropout
    out["attention_dropout"] = s.attention_dropout
    out["bf16"] = sixteen_bit == "bf16"
    out["fp16"] = sixteen_bit == "fp16"
    out["fp8"] = FP8_FORMAT if precision == "fp8" else None
    if precision == "fp8":
        out["transformer_impl"] = "transformer_engine"
    return out


def _flags(values: dict, from_precision: bool) -> list[str]:
    out = []
    for attr, value in values.items():
        flag, source = MEGATRON_ARGS[attr]
        if (source == "precision") != from_precision or value is False or value is None:
            continue
        out += [flag] if value is True else [flag, str(value)]
    return out


def megatron_setting_args(s: RuntimeSettings, precision: str = DEFAULT_PRECISION) -> list[str]:
    """Megatron-LM flags for one mesh's settings (the gradient dtype's spelling depends on the precision)."""
    return _flags(megatron_values(s, precision), from_precision=False)


def precision_args(precision: str) -> list[str]:
    """Megatron-LM flags for the job's training precision (fp32: none, Megatron's default)."""
    return _flags(megatron_values(default_settings(1), precision), from_precision=True)


def job_setting_args() -> list[str]:
    """Megatron-LM flags every launch of a plan carries (JOB_ARGS)."""
    return [flag for flag, _ in JOB_ARGS.values()]


def layer_args(device_type: str) -> list[str]:
    """Megatron-LM flags for the layers a mesh of this device type builds: CPU processes' (CPU_LAYER_ARGS); none for
    an accelerator, whose launch runs Megatron-LM's defaults (Transformer Engine's layers, which the plan prices)."""
    if device_type != "cpu":
        return []
    return [token for flag, value in CPU_LAYER_ARGS.values()
            for token in ([flag] if isinstance(value, bool) else [flag, value])]
