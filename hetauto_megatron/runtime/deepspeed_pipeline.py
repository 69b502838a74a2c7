"""Run an emitted DeepSpeed config with DeepSpeed's pipeline engine (docs/deepspeed.md).

`hetauto emit deepspeed` writes one ds_config per mesh with the plan's uneven layer split in its own
`hetauto.partition` key, because DeepSpeed's `PipelineModule` accepts only named partition methods. This module
is the other half:

- `layer_specs(model, stages)`: a small GPT-like layer list for the plan's model, `[embedding, L transformer layers,
  head]` (the layout `hetauto.partition` counts in), as DeepSpeed `LayerSpec`s so each stage builds only its
  own layers. Pre-norm layers (RMSNorm and SwiGLU for gated models, LayerNorm and GELU otherwise), grouped-query
  attention, RoPE or learned positions, tied embeddings through a `TiedLayerSpec`. Not tensor-parallel: for
  TP > 1 use Megatron's layers with an mpu.
- `PlanPipelineModule`: a `PipelineModule` whose stage boundaries are the given list (it overrides the private
  `_partition_layers`, so the DeepSpeed version is pinned: 0.19.8).
- `pipeline_module(model, ds_config)` and `initialize(model, ds_config)`: the module from an emitted config
  (partition, stage count, activation checkpointing), checked against DeepSpeed's process topology, and
  `deepspeed.initialize` with a torch optimizer (no JIT-compiled DeepSpeed optimizer).
- `reference_layers(model)`: the same layers, with the same per-layer seeds, in one process: what a pipeline run
  must reproduce.
"""
from __future__ import annotations

import importlib
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from ..cost.deepspeed_layers import FLASH_GQA_MAX_HEAD_DIM
from ..errors import InputError
from ..spec.model import ModelSpec
from .device import set_fp32_gemms

BASE_SEED = 1234   # layer i is initialised from seed BASE_SEED + i, on whichever stage builds it
# How these layers keep activations, for the memory model: cost/deepspeed_layers.py (DEEPSPEED_PIPELINE_IMPL and its
# variants by device), which the planner prices every --engine deepspeed stage with (plan/memory_fit.py layers_of).


def import_deepspeed():
    """`import deepspeed`, on CPU without probing for a GPU and without the JIT build of its shared-memory
    all-reduce (about 20 s and a C++ compiler; gloo's own all-reduce is used instead)."""
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed
    if os.environ.get("DS_ACCELERATOR") == "cpu":
        # "import deepspeed.comm.torch" would bind the name torch to the torch package: go through importlib
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    return deepspeed


# ---- the layers ------------------------------------------------------------------------------------------
def _norm(model: ModelSpec) -> nn.Module:
    return nn.RMSNorm(model.hidden_size, eps=1e-5) if model.gated_mlp else nn.LayerNorm(model.hidden_size)


def _rotate(x: torch.Tensor, base: int) -> torch.Tensor:
    """RoPE on [batch, heads, seq, head_dim] (rotate-half form, the model's base: ModelSpec.rotary_base)."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(x.dtype), torch.cat([angles.sin()] * 2, -1).to(x.dtype)
    half = dim // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class Embedding(nn.Module):
    """Layer 0: token (and learned position) embedding. With tied embeddings it also holds the final norm and
    computes the logits on the last stage (`tied_head`), so its weights are shared between the two stages.
    `embeds` / `head`: which ends this copy serves; each stage builds only what its end uses (the first no final
    norm, the last no position table), as Megatron builds and the memory model prices them."""

    def __init__(self, model: ModelSpec, *, embeds: bool = True, head: bool = True):
        super().__init__()
        self.word = nn.Embedding(model.vocab_size, model.hidden_size)
        nn.init.normal_(self.word.weight, std=0.02)
        self.position = None
        if model.position_embedding == "learned" and embeds:
            self.position = nn.Embedding(model.max_position_embeddings, model.hidden_size)
            nn.init.normal_(self.position.weight, std=0.02)
        self.final_norm = _norm(model) if model.tie_embeddings and head else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.word(tokens)
        if self.position is not None:
            h = h + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        return h


def tied_head(embedding: Embedding, hidden: torch.Tensor) -> torch.Tensor:
    return F.linear(embedding.final_norm(hidden), embedding.word.weight)


def sdpa_takes_gqa(x: torch.Tensor, head_dim: int) -> bool:
    """Whether torch's scaled_dot_product_attention runs grouped K and V (`enable_gqa`) in a fused kernel for
    activations like `x` with heads of `head_dim`: CPU's flash kernel does; on an accelerator only the flash
    kernel, in 16 bits from compute capability 8.0, up to FLASH_GQA_MAX_HEAD_DIM; the memory-efficient kernel
    (fp32, a V100) does not, and enable_gqa would take the math kernel and its s x s score matrix, so K and V are
    repeated to every head there. The memory model prices each case by the same rule
    (cost/deepspeed_layers.py deepspeed_pipeline_impl)."""
    if x.device.type == "cpu":
        return True
    if x.device.type != "cuda":     # another accelerator's torch (an Ascend's npu): its kernels are not known here
        return False
    return (x.dtype in (torch.float16, torch.bfloat16) and head_dim <= FLASH_GQA_MAX_HEAD_DIM
            and torch.cuda.get_device_capability(x.device) >= (8, 0))


class TransformerLayer(nn.Module):
    """Pre-norm decoder layer: causal grouped-query self-attention and an MLP, each with a residual."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        h, d = model.hidden_size, model.head_dim
        self.heads, self.groups, self.rope = model.num_attention_heads, model.num_query_groups, \
            model.position_embedding == "rope"
        self.rotary_base = model.rotary_base
        self.norm1, self.norm2 = _norm(model), _norm(model)
        bias = model.linear_biases      # as Megatron builds the model (and the memory model prices it)
        self.qkv = nn.Linear(h, (self.heads + 2 * self.groups) * d, bias=bias)
        self.proj = nn.Linear(self.heads * d, h, bias=bias)
        self.gated = model.gated_mlp
        self.up = nn.Linear(h, model.ffn_hidden_size * (2 if self.gated else 1), bias=bias)
        self.down = nn.Linear(model.ffn_hidden_size, h, bias=bias)
        for linear in (self.qkv, self.proj, self.up, self.down):
            if linear.bias is not None:     # Megatron's initialisation of biases
                nn.init.zeros_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.head_dim, self.groups * self.head_dim, self.groups * self.head_dim], -1)
        q = q.view(b, s, self.heads, -1).transpose(1, 2)
        k = k.view(b, s, self.groups, -1).transpose(1, 2)
        v = v.view(b, s, self.groups, -1).transpose(1, 2)
        # What the attention keeps is what the memory model counts (cost/activations.py _layer_parts): Q, K and V at
        # their GQA width and the context. Without rope Q, K and V are views of the fused QKV output, kept whole
        # once (the three of them). With rope Q and K are rotated copies, and V, a view, would keep the whole
        # fused output beside them: it is copied out (kv wide) so that output is freed.
        grouped = self.groups != self.heads
        native = not grouped or sdpa_takes_gqa(x, self.head_dim)
        if self.rope:
            q, k = _rotate(q, self.rotary_base), _rotate(k, self.rotary_base)
            if native:
                v = v.contiguous()
        if not native:      # the fused kernel that runs would not take grouped K and V: repeat them to every head
            k = k.repeat_interleave(self.heads // self.groups, 1)
            v = v.repeat_interleave(self.heads // self.groups, 1)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped and native)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, -1))
        up = self.up(self.norm2(x))
        if self.gated:
            gate, up = up.chunk(2, -1)
            up = F.silu(gate) * up
        else:
            up = F.gelu(up)
        return x + self.down(up)

    @property
    def head_dim(self) -> int:
        return self.proj.in_features // self.heads


class Head(nn.Module):
    """The last layer of an untied model: final norm and output projection to the vocabulary."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        self.norm = _norm(model)
        self.out = nn.Linear(model.hidden_size, model.vocab_size, bias=False)
        nn.init.normal_(self.out.weight, std=0.02 / math.sqrt(2 * model.num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over the micro-batch (the pipeline's loss_fn)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def layer_specs(model: ModelSpec, stages: int) -> list:
    """[embedding, model.num_layers transformer layers, head] as DeepSpeed layer specs."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    if model.tie_embeddings:
        # a stage builds the tied module from the first of its specs; one stage alone serves both ends with it
        one = stages == 1
        first = TiedLayerSpec("embedding", Embedding, model, tied_weight_attr=["word.weight"], head=one)
        last = TiedLayerSpec("embedding", Embedding, model, forward_fn=tied_head, tied_weight_attr=["word.weight"],
                             embeds=one)
    else:
        first, last = LayerSpec(Embedding, model), LayerSpec(Head, model)
    return [first] + [LayerSpec(TransformerLayer, model) for _ in range(model.num_layers)] + [last]


def reference_layers(model: ModelSpec, *, base_seed: int = BASE_SEED) -> list:
    """The same layers in one process, each built from the seed the pipeline uses for it; the callable list a
    single-process run applies in order (the head reuses the embedding when the model ties them)."""
    out = []
    for i in range(model.num_layers + 2):
        torch.manual_seed(base_seed + i)
        if i == 0:
            out.append(Embedding(model))
        elif i <= model.num_layers:
            out.append(TransformerLayer(model))
        elif model.tie_embeddings:
            embedding = out[0]
            out.append(lambda x, e=embedding: tied_head(e, x))
        else:
            out.append(Head(model))
    return out


def synthetic_batch(model: ModelSpec, indices, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token samples by index (each from its own generator, so any split of a step's samples over ranks and
    micro-batches sees the same data): inputs [n, seq] and next-token labels [n, seq]."""
    rows = []
    for i in indices:
        g = torch.Generator().manual_seed(seed * 1_000_003 + int(i))
        rows.append(torch.randint(0, model.vocab_size, (model.seq_length + 1,), generator=g))
    data = torch.stack(rows)
    return data[:, :-1], data[:, 1:]


# ---- the pipeline module from an emitted config ----------------------------------------------------------
def _pipeline_module_class():
    from deepspeed.pipe import PipelineModule

    class PlanPipelineModule(PipelineModule):
        """A PipelineModule whose stage boundaries are an explicit list: stage s builds layers
        partition[s]..partition[s+1]-1."""

        def __init__(self, layers, partition: list[int], **kwargs):
            self._hetauto_partition = [int(x) for x in partition]   # read by _partition_layers during __init__
            super().__init__(layers, partition_method="uniform", **kwargs)

        def _partition_layers(self, method="uniform"):
            parts = self._hetauto_partition
            if len(parts) != self.num_stages + 1 or parts[0] != 0 or parts[-1] != len(self._layer_specs) or \
                    any(a >= b for a, b in zip(parts, parts[1:])):
                raise InputError(f"partition {parts} does not split {len(self._layer_specs)} layers into "
                                 f"{self.num_stages} non-empty stages", field="hetauto.partition",
                                 fix="use the config 'hetauto emit deepspeed' wrote for this plan")
            self.parts = parts
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=parts[stage], stop=parts[stage + 1])

    return PlanPipelineModule


def _check_config(model: ModelSpec, ds_config: dict) -> dict:
    block = ds_config.get("hetauto")
    if not isinstance(block, dict) or "partition" not in block:
        raise InputError("has no 'hetauto' block with the stage partition", field="hetauto",
                         fix="use a config written by 'hetauto emit deepspeed'")
    if block["tensor_parallel_size"] != 1:
        raise InputError(f"tensor_parallel_size {block['tensor_parallel_size']}: these layers are not "
                         "tensor-parallel", field="hetauto.tensor_parallel_size",
                         fix="plan with tp 1, or build the model from Megatron's layers and pass its mpu")
    for key in ("hidden_dropout", "attention_dropout"):     # the mesh's settings, as the memory model priced them
        if (block.get("settings") or {}).get(key):
            raise InputError(f"{key} {block['settings'][key]}: these layers apply no dropout",
                             field=f"hetauto.settings.{key}", fix="plan with dropout 0 (the default), or build the "
                             "model from layers that apply the config's dropouts")
    padded = block.get("padded_vocab_size", model.vocab_size)      # (configs written before it: the vocabulary)
    if not isinstance(padded, int) or isinstance(padded, bool) or padded < model.vocab_size:
        raise InputError(f"padded_vocab_size {padded!r} is not a table of at least the model's {model.vocab_size} "
                         "tokens", field="hetauto.padded_vocab_size",
                         fix="use the config 'hetauto emit deepspeed' wrote for this plan and model")
    layers = sum(block["stage_layers"])
    if layers != model.num_layers:
        raise InputError(f"the config splits {layers} transformer layers, the model has {model.num_layers}",
                         field="hetauto.stage_layers", fix="pass the model of the plan the config was emitted from")
    return block


def pipeline_module(model: ModelSpec, ds_config: dict, *, base_seed: int = BASE_SEED):
    """This rank's PipelineModule for an emitted config (torch.distributed initialised, every rank of the
    plan launched). Checks that DeepSpeed's (pipe, data) coordinates of this rank are the plan's stage and
    DP rank, so the rank numbering of the launch and of the plan agree."""
    import torch.distributed as dist

    block = _check_config(model, ds_config)
    stages = block["pipeline_parallel_size"]
    # DeepSpeed's PipelineModule lays the whole launch out as one grid of stages x DP (x TP 1): a plan whose meshes
    # differ in DP launches another number of ranks, which DeepSpeed refuses with its own RuntimeError (or, where
    # the count happens to divide, places ranks in other stages than the plan): said first, in the plan's terms, by
    # the rule 'hetauto emit deepspeed' refuses such a plan by (configs written by hand, or by an older hetauto)
    from ..emit.deepspeed import check_one_grid
    check_one_grid([block], dist.get_world_size())
    # the tables padded as the plan priced them (the tokens, synthetic_batch's, stay in the model's vocabulary)
    built = model.with_padded_vocab(block.get("padded_vocab_size", model.vocab_size))
    module = _pipeline_module_class()(
        layer_specs(built, stages), block["partition"], num_stages=stages, loss_fn=lm_loss, seed_layers=True,
        base_seed=base_seed,
        activation_checkpoint_interval=ds_config.get("pipeline", {}).get("activation_checkpoint_interval", 0),
        # only the transformer layers, as Megatron's full recomputation: DeepSpeed would checkpoint any layer with
        # parameters (module.py _is_checkpointable), the embedding too, whose integer input makes its reentrant
        # checkpoint's output need no gradient, and the first stage's backward fails
        checkpointable_layers=[TransformerLayer.__name__])
    rank = dist.get_rank()
    coord = module.topology().get_coord(rank)
    local = rank - block["rank_offset"]
    dp, first = block["data_parallel_size"], block["first_stage"]
    in_mesh = 0 <= local < dp * block["num_stages"]
    if not in_mesh or (coord.pipe, coord.data) != (first + local // dp, local % dp):
        raise InputError(f"rank {rank} is stage {coord.pipe}, data-parallel rank {coord.data} for DeepSpeed, "
                         f"which is not where mesh {block['mesh']} ({block['cluster']}) of the plan puts it",
                         field="hetauto.rank_offset",
                         fix="give each rank the config of its own cluster, with the plan's rank order")
    return module


def initialize(model: ModelSpec, ds_config: dict, *, lr: float = 1e-3, base_seed: int = BASE_SEED,
               file: str | None = None):
    """`deepspeed.initialize` of this rank's pipeline module with an Adam optimizer (torch's: DeepSpeed's own
    would be JIT-compiled). Returns the PipelineEngine; train with `engine.train_batch(data_iter)`. `file`: the
    config's path, named in the errors about a hand-edited config.

    From here the process holds torch.distributed's groups (DeepSpeed's, gloo's on CPU): it takes charge of the
    process's exit (clean_exit.py), so that the groups are destroyed at a clean exit and an entry script run by
    `main_guard` ends after main without interpreter finalisation, in which a gloo thread could abort a finished
    run (SIGABRT, pytorch#190489), as Megatron's ranks end; a refusal below ends the same way after its paragraph."""
    from ..emit.deepspeed import check_hand_edits
    from .clean_exit import take_charge_of_exit

    deepspeed = import_deepspeed()
    # bounded as DeepSpeed's own waits are (DEEPSPEED_TIMEOUT, 10 minutes by default)
    take_charge_of_exit(importlib.import_module("deepspeed.constants").default_pg_timeout.total_seconds())
    # before any layer is built: what DeepSpeed would ignore, or refuse only by an assert after building the optimizer
    check_hand_edits(ds_config, file=file)
    module = pipeline_module(model, ds_config, base_seed=base_seed)
    if "tf32" in ds_config["hetauto"]:     # an fp32 plan: its GEMMs on TF32 or not, as the plan priced them
        set_fp32_gemms(bool(ds_config["hetauto"]["tf32"]))
    params = [p for p in module.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=torch.optim.Adam(params, lr=lr),
                                           model_parameters=params, config=ds_config)
    return engine


def config_for_rank(configs: list[dict], rank: int) -> dict:
    """Of a plan's per-mesh configs, the one of the mesh that holds global `rank`."""
    for cfg in configs:
        block = cfg["hetauto"]
        if 0 <= rank - block["rank_offset"] < block["data_parallel_size"] * block["tensor_parallel_size"] * \
                block["num_stages"]:
            return cfg
    raise InputError(f"no config holds rank {rank}", field="hetauto.rank_offset",
                     fix="pass every mesh's config of the plan")
