"""Megatron-Core GPT model for one rank of a plan, initialised identically for any parallel layout.

Every parameter's initial value is a function of its GLOBAL name (layer index counted over the whole model)
and the seed: the full (unsharded) tensor is drawn from a generator seeded by both, then sliced to this
rank's tensor-parallel shard. So a plan with any mix of TP sizes and stage splits starts from exactly the
weights one process running the whole model starts from, which is what makes loss parity testable.

Every mesh builds the embedding table and output layer with the plan's one padded vocabulary
(`Plan.padded_vocab_size`, plan/vocab_padding.py), so tied tables and initial weights agree row for row across
meshes, and runs sequence parallelism as its `settings.sequence_parallel` says, with a norm that supports it (norm.py).
"""
from __future__ import annotations

import math
import zlib

from ..plan.layout import megatron_layout
from ..plan.plan import recompute_settings
from ..spec.model import ModelSpec


def shrink_model(spec: ModelSpec, plan) -> ModelSpec:
    """`--tiny`: keep the layer count and therefore the whole parallel layout, shrink everything else.

    Head counts stay divisible by every mesh's TP size (the plan's invariant), and so does the sequence (16
    positions, rounded up to a multiple of every TP: sequence parallelism splits it); the vocabulary is 128
    tokens, which the plan pads like any other (`Plan.padded_vocab_size`).
    """
    t = math.lcm(*(m.tp for m in plan.meshes))
    gqa = spec.num_query_groups < spec.num_attention_heads
    kv = t if gqa else max(t, 2)
    heads = kv * 2 if gqa else kv
    hidden = 16 * heads
    vocab = 128
    seq = t * math.ceil(16 / t)
    name = spec.name if spec.name.endswith("tiny") else f"{spec.name}-tiny"
    return spec.replace(name=name, hidden_size=hidden, num_attention_heads=heads,
                        num_query_groups=kv, ffn_hidden_size=2 * hidden, vocab_size=vocab, seq_length=seq,
                        max_position_embeddings=seq)


# the torch element type of each training precision the runtime's layers run (fp8 needs Transformer Engine)
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def causal_mask(seq: int, device="cpu"):
    """Megatron's causal attention mask as the dry run, the layer timing and the profiler give it: [1, 1, s, s],
    True = masked (the local attention fills those scores with -10000 before its softmax)."""
    import torch
    return torch.tril(torch.ones(1, 1, seq, seq, device=device)) < 0.5


def torch_dtype(precision: str):
    import torch
    return getattr(torch, TORCH_DTYPES[precision])


def transformer_config(plan, ctx, spec: ModelSpec):
    """TransformerConfig for this rank: its mesh's TP size and sequence parallelism, the plan's stages and layers,
    the rank's precision (`RankContext.precision`: fp32 in a dry run; on an accelerator the plan's, 16-bit
    parameters and pipeline tensors as Megatron-LM's --bf16 / --fp16 build them), the mesh's dropouts (settings:
    0 by default, so that every layout computes the same numbers)."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    mesh = ctx.mesh
    precision = ctx.precision
    dtype = torch_dtype(precision)
    kw = dict(
        num_layers=spec.num_layers, hidden_size=spec.hidden_size, num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_query_groups, ffn_hidden_size=spec.ffn_hidden_size,
        gated_linear_unit=spec.gated_mlp, activation_func=F.silu if spec.gated_mlp else F.gelu,
        add_bias_linear=spec.linear_biases, normalization="RMSNorm" if spec.gated_mlp else "LayerNorm",
        tensor_model_parallel_size=mesh.tp, pipeline_model_parallel_size=ctx.layout.num_stages,
        sequence_parallel=mesh.settings.sequence_parallel,
        use_cpu_initialization=True, params_dtype=dtype, pipeline_dtype=dtype,
        hidden_dropout=mesh.settings.hidden_dropout,
        attention_dropout=mesh.settings.attention_dropout, bf16=precision == "bf16", fp16=precision == "fp16",
        # Megatron-LM's default (its --attention-softmax-in-fp32 is off; the dataclass's default is on): the
        # unfused softmax of 16-bit scores runs, and is kept, in 16 bits (no effect in fp32)
        attention_softmax_in_fp32=False,
        gradient_accumulation_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False,
        # Megatron-LM's (training/argument_utils.py core_transformer_config_from_args sets it for every launch): a
        # stage frees its output's storage once sent; kept, every non-last stage held one s x b x h output per
        # micro-batch in flight that the launch it stands in for, and the memory model, do not
        deallocate_pipeline_outputs=True,
    )
    layout = megatron_layout(ctx.layout.stage_layers)
    if layout is not None:
        kw["pipeline_model_parallel_layout"] = layout
    kw.update(recompute_settings(mesh.recompute))
    return TransformerConfig(**kw)


def decoder_block_spec(config, stage: int):
    """Megatron's local layer spec for this stage's layers, its norms (and the final norm) replaced by
    `SequenceParallelTorchNorm`: the same torch modules, whose parameters are marked for sequence parallelism."""
    import dataclasses

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import (TransformerBlock, TransformerBlockSubmodules,
                                                             get_num_layers_to_build)

    from .norm import SequenceParallelTorchNorm

    layer = get_gpt_layer_local_spec(normalization=config.normalization)
    layer = dataclasses.replace(layer, submodules=dataclasses.replace(
        layer.submodules, input_layernorm=SequenceParallelTorchNorm, pre_mlp_layernorm=SequenceParallelTorchNorm))
    n = get_num_layers_to_build(config, pp_rank=stage)
    return ModuleSpec(module=TransformerBlock, submodules=TransformerBlockSubmodules(
        layer_specs=[layer] * n, layer_norm=SequenceParallelTorchNorm))


def build_model(ctx, spec: ModelSpec, config, *, seed: int, vocab_size: int | None = None):
    """GPTModel holding this rank's stage, with deterministic layout-independent initial weights.

    `vocab_size` is the padded table size; by default the plan's (`Plan.padded_vocab_size`). A single-process
    reference of a plan passes the plan's size so both build the same table."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(seed, tp_rank=ctx.coords.tp_rank, ep_rank=0, etp_rank=0)
    model = GPTModel(
        config=config, transformer_layer_spec=decoder_block_spec(config, ctx.coords.stage),
        vocab_size=vocab_size or ctx.plan.padded_vocab_size, max_sequence_length=spec.max_position_embeddings,
        pre_process=ctx.is_first_stage, post_process=ctx.is_last_stage,
        share_embeddings_and_output_weights=spec.tie_embeddings,
        position_embedding_type="rope" if spec.position_embedding == "rope" else "learned_absolute",
        rotary_base=spec.rotary_base, pg_collection=ctx.pg)
    init_weights(model, ctx, spec, seed=seed)
    if config.bf16 or config.fp16:
        # every parameter and buffer in 16 bits, as Megatron-LM's Float16Module casts the model it wraps (the
        # linear layers are built in params_dtype already; torch's norms are not)
        model.to(config.params_dtype)
    if ctx.device != "cpu":
        model.to(ctx.device)  # built and initialised on the host (layout-independent), then moved
    return model


def global_param_name(local_name: str, layer_offset: int, spec: ModelSpec) -> str:
    """Name of a rank's parameter in the single-process model (layer index shifted; tied head = embedding)."""
    parts = local_name.split(".")
    if local_name.startswith("decoder.layers."):
        parts[2] = str(int(parts[2]) + layer_offset)
    name = ".".join(parts)
    if spec.tie_embeddings and name == "output_layer.weight":
        return "embedding.word_embeddings.weight"
    return name


def full_initial_value(name: str, shape, *, seed: int):
    """The unsharded initial tensor of a parameter: normal(0, 0.02) for matrices, around 1 for norm weights,
    small values for biases. Drawn from a generator seeded by (seed, name), so it does not depend on layout."""
    import torch

    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 63))
    noise = torch.randn(tuple(shape), generator=g, dtype=torch.float32)
    if len(shape) >= 2 or name.endswith("bias"):
        return noise * 0.02
    return 1.0 + 0.1 * noise


def tp_shard(full, param, tp: int, tp_rank: int, *, gated_fc1: bool):
    """Slice a full tensor to this TP rank's shard the way Megatron partitions it."""
    import torch

    if tp == 1 or not getattr(param, "tensor_model_parallel", False):
        return full
    dim = param.partition_dim
    if gated_fc1:
        # SwiGLU fc1 holds [gate; up]; each TP rank holds [gate shard; up shard].
        gate, up = full.chunk(2, dim=dim)
        return torch.cat([gate.chunk(tp, dim=dim)[tp_rank], up.chunk(tp, dim=dim)[tp_rank]], dim=dim)
    return full.chunk(tp, dim=dim)[tp_rank]


def full_shape(param, tp: int):
    shape = list(param.shape)
    if tp > 1 and getattr(param, "tensor_model_parallel", False):
        shape[param.partition_dim] *= tp
    return shape


def init_weights(model, ctx, spec: ModelSpec, *, seed: int) -> None:
    import torch

    tp, tp_rank = ctx.mesh.tp, ctx.coords.tp_rank
    with torch.no_grad():
        for name, param in model.named_parameters():
            gname = global_param_name(name, ctx.layer_offset, spec)
            full = full_initial_value(gname, full_shape(param, tp), seed=seed)
            shard = tp_shard(full, param, tp, tp_rank,
                             gated_fc1=spec.gated_mlp and name.endswith("mlp.linear_fc1.weight"))
            if tuple(shard.shape) != tuple(param.shape):
                raise AssertionError(f"{name}: shard {tuple(shard.shape)} != parameter {tuple(param.shape)}")
            param.copy_(shard)
