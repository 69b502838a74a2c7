"""What the layers accelerator launches run keep, measured with Megatron-Core's own modules on CPU where they decide.

Transformer Engine's modules need CUDA (module/base.py refuses to build one without it), so each check measures the
part of the job that is Megatron-Core's code, the same under Transformer Engine, and cites Transformer Engine's source
(v2.14) for what its modules do in that place:

- the gated MLP: Megatron's MLP picks its activation's path itself (core/transformer/mlp.py); accelerator launches
  leave bias_swiglu_fusion on (only CPU ranks turn it off: plan/megatron_flags.py CPU_LAYER_ARGS), so the fused
  SwiGLU's autograd function runs (core/fusions/fused_bias_swiglu.py), which saves fc1's output alone; fc2 saves its
  input (Transformer Engine's Linear in 16 bits: module/linear.py saves the input it was given, as Megatron's local
  linear does);
- recompute 'selective' under Transformer Engine's layer spec (core/models/gpt/gpt_layer_specs.py): the second norm
  is fused into fc1 (TELayerNormColumnParallelLinear, pre_mlp_layernorm IdentityOp), so the MLP's checkpoint takes
  the norm's input and re-runs the norm. Built here with the real spec function and TransformerLayer, with a CPU
  stand-in for the fused module that keeps what Transformer Engine's keeps (module/layernorm_linear.py saves its
  input, the norm's output for the weight gradient, and the norm's per-row statistics);
- the loss: Megatron-Core's unfused vocabulary-parallel cross entropy (hetauto emits no
  --cross-entropy-loss-fusion: megatron/unpriced.py refuses it) on the output layer's logits, its peak read by
  torch's profiler from every CPU allocation (runtime/memory_meter.py allocator_peak);
- fp8's cached fp8 weights: Transformer Engine's alone, so checked against its source (the last test).

Saved tensors are counted per unique storage (runtime/memory_meter.py SavedTensorMeter), the inputs and parameters
left out. Targets: the saved bytes exact to the byte; the loss's peak within 0.5 % (what it also allocates per
token: the maxima, sums, masks and indices, tens of bytes a row against the row's 4 to 6 bytes per vocabulary
entry; measured +0.02 %). The output layer's weight is frozen in the probe: its gradient, a transient of the
output layer's backward and not of the loss, is accumulated in place into the fp32 main gradient by the
gradient-accumulation fusion, which accelerator launches keep on where APEX's kernel is installed
(megatron/fusion_args.py).
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from hetauto_megatron.cost.activations import DRY_RUN_IMPL, TRANSFORMER_ENGINE, _layer_parts, layer_activation_bytes
from hetauto_megatron.cost.memory import cross_entropy_bytes
from hetauto_megatron.cost.model_state import FP32
from hetauto_megatron.plan.settings import default_settings
from hetauto_megatron.spec.model import ModelSpec

S, B, H, FFN, HEADS, V = 32, 2, 64, 160, 4, 32768
MODEL = ModelSpec(name="probe", num_layers=1, hidden_size=H, num_attention_heads=HEADS, ffn_hidden_size=FFN,
                  vocab_size=V, seq_length=S, gated_mlp=True, position_embedding="learned")
LOSS_TOLERANCE = 0.005

# One rank of a gloo world (the layers need their TP group), fp32 layers as on CPU; prints one JSON line.
PROBE = r"""  # after helpers.ONE_RANK_PROBE
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt import gpt_layer_specs
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear, vocab_parallel_cross_entropy
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer
from hetauto_megatron.runtime.memory_meter import SavedTensorMeter, allocator_peak
S, B, H, FFN, HEADS, V = %(shape)s
out = {}

def config(**kw):
    return TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=HEADS, ffn_hidden_size=FFN,
                             gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
                             normalization="LayerNorm", hidden_dropout=0.0, attention_dropout=0.0,
                             use_cpu_initialization=True, gradient_accumulation_fusion=False,
                             masked_softmax_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
                             persist_layer_norm=False, **kw)

def kept(module, **kwargs):
    x = torch.randn(S, B, H, requires_grad=True)
    exclude = {p.untyped_storage().data_ptr() for p in module.parameters()} | {x.untyped_storage().data_ptr()}
    meter = SavedTensorMeter(exclude)
    with meter.metering():
        y = module(x, **kwargs)      # (y keeps the graph, and so the saved tensors, alive while read)
    return meter.live

for fused in (True, False):
    out["mlp", fused] = kept(MLP(config(bias_activation_fusion=fused),
                                 MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)))

class NormedColumnParallelLinear(ColumnParallelLinear):
    # Transformer Engine's LayerNormColumnParallelLinear on CPU: the norm, then the GEMM on its output
    def __init__(self, input_size, output_size, *, config, **kw):
        super().__init__(input_size, output_size, config=config, **kw)
        self.norm = torch.nn.LayerNorm(input_size)

    def forward(self, x, **kw):
        return super().forward(self.norm(x), **kw)

class CpuTransformerEngine(LocalSpecProvider):
    def fuse_layernorm_and_linear(self):
        return True

    def column_parallel_layer_norm_linear(self):
        return NormedColumnParallelLinear

gpt_layer_specs.TESpecProvider = CpuTransformerEngine      # the spec function builds with this provider
specs = {"te": (gpt_layer_specs.get_gpt_layer_with_transformer_engine_submodules(), True),
         "local": (gpt_layer_specs.get_gpt_layer_local_submodules(normalization="LayerNorm"), False)}
for name, (submodules, fused) in specs.items():
    for recompute in ("none", "selective"):
        extra = {"recompute_granularity": "selective", "recompute_modules": ["mlp"]} if recompute != "none" else {}
        layer = TransformerLayer(config(bias_activation_fusion=fused, **extra), submodules)
        out["structure", name] = [type(layer.pre_mlp_layernorm).__name__, type(layer.mlp.linear_fc1).__name__]
        out["layer", name, recompute] = kept(layer, attention_mask=None)

for dtype in ("bfloat16", "float32"):
    cfg = config(bias_activation_fusion=False, params_dtype=getattr(torch, dtype))
    head = ColumnParallelLinear(8, V, config=cfg, init_method=cfg.init_method, bias=False, gather_output=False)
    head.weight.requires_grad_(False)    # its weight gradient: not the loss's (the module docstring)
    x = torch.randn(S, B, 8, dtype=getattr(torch, dtype), requires_grad=True)
    labels = torch.randint(V, (S, B))
    res = {}
    with allocator_peak(res):
        logits, _ = head(x)
        loss = vocab_parallel_cross_entropy(logits, labels)
        del logits                   # GPTModel's forward lets the logits go once the loss is returned
        loss.sum().backward()
    out["loss", dtype] = res["peak"]
print(json.dumps({json.dumps(k): v for k, v in out.items()}), flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from helpers import run_one_rank_probe
    rows = run_one_rank_probe(tmp_path_factory.mktemp("te-layers"), PROBE % {"shape": (S, B, H, FFN, HEADS, V)})
    return {tuple(json.loads(k)): v for k, v in rows.items()}


def test_the_fused_swiglu_mlp_keeps_three_ffn_tensors(measured):
    """Fused (accelerators): fc1's output, 2f wide, and fc2's input; 3 s*b*f. Unfused (CPU): also silu's output and
    the linear half plus Megatron's GLU offset; 5. Priced 4 for the fused path before."""
    mlp = {impl: _layer_parts(MODEL, B, S, FP32, impl, 0.0, 0.0, 1)["mlp"] for impl in (TRANSFORMER_ENGINE,
                                                                                           DRY_RUN_IMPL)}
    sbf = S * B * FFN * FP32
    assert measured["mlp", True] == mlp[TRANSFORMER_ENGINE] == 3 * sbf
    assert measured["mlp", False] == mlp[DRY_RUN_IMPL] == 5 * sbf


def test_selective_recompute_under_transformer_engines_spec_recomputes_the_second_norm(measured):
    """What 'selective' leaves out of a layer (none less selective): under Transformer Engine's spec the MLP and the
    second norm's output (its per-row statistics too, which the priced fused norm leaves out: 2 fp32 a row for
    torch's LayerNorm); under the local spec, whose norm runs before the checkpoint, the MLP alone."""
    assert measured["structure", "te"] == ["IdentityOp", "NormedColumnParallelLinear"]
    assert measured["structure", "local"] == ["LayerNorm", "ColumnParallelLinear"]

    def dropped(impl):
        kw = dict(sequence_parallel=False, dtype_bytes=FP32, impl=impl)
        return layer_activation_bytes(MODEL, 1, B, "none", **kw) - layer_activation_bytes(MODEL, 1, B, "selective",
                                                                                          **kw)
    te = measured["layer", "te", "none"] - measured["layer", "te", "selective"]
    assert te == dropped(TRANSFORMER_ENGINE) + 2 * FP32 * S * B
    assert te - 2 * FP32 * S * B - measured["mlp", True] == S * B * H * FP32      # the norm's output
    local = measured["layer", "local", "none"] - measured["layer", "local", "selective"]
    assert local == dropped(DRY_RUN_IMPL) == measured["mlp", False]
    # the priced norms of a spec that runs the norm before its checkpoint keep its output (the local spec's count)
    assert dropped(dataclasses.replace(TRANSFORMER_ENGINE, pre_mlp_norm_in_fc1=False)) == measured["mlp", True]


@pytest.mark.parametrize("dtype, element", [("bfloat16", 2), ("float32", 4)])
def test_the_vocabulary_parallel_losss_peak_is_its_softmax_and_one_logits_copy(measured, dtype, element):
    """The loss's peak over the logits: the fp32 softmax it keeps plus, in 16 bits, the 16-bit logits (forward) or
    gradient (backward) beside it: 6 bytes per logit in bf16, 4 in fp32 (in place throughout). Priced 8 before (the
    softmax and an fp32 gradient formed beside it)."""
    assert default_settings(1).loss == "vocab_parallel"      # what the Megatron engine's stages are priced with
    kept, peak = cross_entropy_bytes("vocab_parallel", element)
    per_logit = measured["loss", dtype] / (S * B * V)
    assert per_logit == pytest.approx(kept + peak, rel=LOSS_TOLERANCE), (dtype, per_logit)
    assert kept + peak == {2: 6, 4: 4}[element]


def test_fp8_prices_transformer_engines_cached_fp8_weights():
    """fp8 training keeps Transformer Engine's fp8 copies of every GEMM weight of the layers for the whole run, 2
    bytes per element of the TP shard (cost/model_state.py FP8_WEIGHT_COPY_BYTES: Megatron passes
    is_first_microbatch, core/extensions/transformer_engine.py TELinear.forward, so TransformerEngine v2.14 caches
    the quantized weight in _fp8_workspaces["weight"], module/base.py get_weight_workspace; under Megatron's default
    delayed scaling it is a Float8Tensor with its 1-byte data and, below compute capability 10.0, its 1-byte
    transpose, csrc/quantizer.cpp). Priced as bf16 before. LLaMA-2-7B's layer: QKV 4096 x 12288, output 4096 x
    4096, MLP 3 x 4096 x 11008 weights; on an H800 mesh at TP 2, 16 layers: 3.24 GB more than in bf16."""
    from hetauto_megatron.cost.analytic import AnalyticCostModel
    from hetauto_megatron.plan.costing import stage_profile
    from hetauto_megatron.plan.memory_fit import stage_memory
    from hetauto_megatron.spec.inventory import inventory_from_dict
    from hetauto_megatron.spec.model import PRESETS

    model = PRESETS["llama2-7b"]
    per_layer = 4096 * 12288 + 4096 * 4096 + 3 * 4096 * 11008
    assert model.layer_linear_weights == per_layer
    inventory = inventory_from_dict({"clusters": [{"name": "h", "device": "h800", "nodes": 1, "devices_per_node": 8}]})
    held = {}
    for precision in ("bf16", "fp8"):
        prof = stage_profile(model, inventory.with_precision(precision).cluster("h"), 2, 4, 1, "none",
                             AnalyticCostModel())
        held[precision] = stage_memory(model, prof, 16, 2, False, False)
    copies = 2 * 16 * per_layer / 2
    assert held["fp8"]["fp8_weight_copies"] == copies == 3_238_002_688
    assert held["bf16"]["fp8_weight_copies"] == 0
    assert held["fp8"]["weights_grads_optimizer"] - held["bf16"]["weights_grads_optimizer"] == copies
    assert held["fp8"]["activations"] == held["bf16"]["activations"]
    assert held["fp8"]["total"] - held["bf16"]["total"] >= copies
