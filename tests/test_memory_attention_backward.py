"""The transients of Megatron's local (unfused) attention against what a layer really allocates on CPU.

A layer of Megatron-Core's local spec (the dry run's and the accelerator runs' layers: DotProductAttention, torch's
softmax, the mask applied in place) is built with its real spec function and run forward and backward in one gloo
rank, fp32 as on CPU, at LLaMA-1B's proportions (heads x sequence / hidden = 16: the s x s tensors dominate as
there) and a causal mask. torch's profiler reads every CPU allocation (runtime/memory_meter.py allocator_peak):
- the score buffer: what the first forward leaves in parallel_state's global memory buffer, exact;
- the peak from the forward's start to the backward's end, after a warm-up step (the buffer already held), against
  the layer's kept activations (and under full recomputation the recomputed layer) plus the attention backward's
  s x s gradients beyond them (cost/activations.py attention_backward_bytes).
Target: the peak within 10 % (the issue's per-stage target). Measured +5.7 % (none) and +4.2 % (full): the
smaller tensors freed before the attention's backward (the second norm's, the context, V) stay counted. Without
the backward's gradients priced the prediction was -43 % (none) and -44 % (full). torch's autograd runs the same nodes on CUDA
(CopySlices around the in-place mask, the softmax's backward), so these are the transients the H200 runs hold too
(benchmarks/accelerator_runs.py).
"""
from __future__ import annotations

import pytest

from hetauto_megatron.cost.activations import (DRY_RUN_IMPL, attention_backward_bytes, layer_activation_bytes,
                                               recompute_buffer_bytes, score_buffer_bytes)
from hetauto_megatron.spec.model import ModelSpec

S, B, H, FFN, HEADS, GROUPS = 256, 2, 256, 704, 16, 8
MODEL = ModelSpec(name="probe", num_layers=1, hidden_size=H, num_attention_heads=HEADS, num_query_groups=GROUPS,
                  ffn_hidden_size=FFN, vocab_size=128, seq_length=S, gated_mlp=True, position_embedding="learned")
TARGET = 0.10

PROBE = r"""  # after helpers.ONE_RANK_PROBE
from megatron.core.models.gpt import gpt_layer_specs
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer
from hetauto_megatron.runtime.memory_meter import allocator_peak
S, B, H, FFN, HEADS, GROUPS = %(shape)s
cfg = TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=HEADS, num_query_groups=GROUPS,
                        ffn_hidden_size=FFN, gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
                        normalization="RMSNorm", hidden_dropout=0.0, attention_dropout=0.0,
                        use_cpu_initialization=True, gradient_accumulation_fusion=False, masked_softmax_fusion=False,
                        bias_dropout_fusion=False, apply_rope_fusion=False, bias_activation_fusion=False,
                        persist_layer_norm=False, attention_softmax_in_fp32=False)
layer = TransformerLayer(cfg, gpt_layer_specs.get_gpt_layer_local_submodules(normalization="RMSNorm"))
for p in layer.parameters():
    p.requires_grad_(False)      # the weights' gradients go to their buffers: not the layer's transients
mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)[None, None]
out = {}

def step(recompute):
    x = torch.randn(S, B, H, requires_grad=True)
    f = lambda x: layer(x, attention_mask=mask)[0]
    res = {}
    with allocator_peak(res):
        y = tensor_parallel.checkpoint(f, False, x) if recompute == "full" else f(x)
        y.backward(torch.ones_like(y))
        del y
    return res["peak"]

step("none")
out["score_buffer"] = sum(t.untyped_storage().nbytes()
                          for t in parallel_state.get_global_memory_buffer().buffer.values())
for recompute in ("none", "full"):
    step(recompute)              # warm
    out[recompute] = step(recompute)
print(json.dumps(out), flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from helpers import run_one_rank_probe
    return run_one_rank_probe(tmp_path_factory.mktemp("attention-backward"),
                              PROBE % {"shape": (S, B, H, FFN, HEADS, GROUPS)})


def _predicted(recompute: str) -> float:
    kw = dict(sequence_parallel=False, dtype_bytes=4, impl=DRY_RUN_IMPL)
    return (layer_activation_bytes(MODEL, 1, B, recompute, **kw) + recompute_buffer_bytes(MODEL, 1, B, recompute, **kw)
            + attention_backward_bytes(MODEL, 1, B, recompute, **kw))


def test_score_buffer_is_the_global_memory_buffer(measured):
    assert measured["score_buffer"] == score_buffer_bytes(MODEL, 1, B, dtype_bytes=4, impl=DRY_RUN_IMPL)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_layer_backward_peak_within_target(measured, recompute):
    predicted, got = _predicted(recompute), measured[recompute]
    assert abs(predicted - got) <= TARGET * got, (recompute, predicted, got)
