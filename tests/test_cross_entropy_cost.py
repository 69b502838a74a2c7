"""The output head's price covers at least what its cross entropy moves through memory, as each engine's loss runs
it: a lower bound from the datasheet (H100 SXM: 989 dense bf16 TFLOP/s, 3.35 TB/s) and the kernels' passes over
the logits counted in their sources, so a price that forgets passes fails."""
from hetauto_megatron.cost.analytic import AnalyticCostModel
from hetauto_megatron.plan import costing
from hetauto_megatron.plan.settings import settings_as_run
from hetauto_megatron.spec.inventory import load_inventory
from hetauto_megatron.spec.model import PRESETS

H100_BF16_FLOPS = 989e12      # NVIDIA H100 SXM5 datasheet, dense bf16
H100_BYTES_S = 3.35e12        # its HBM3 bandwidth

# Bytes per logits element, counted in the sources (bf16 training: the logits are 2 bytes).
CAST = 2 + 4                  # logits.float(): read bf16, write fp32; its backward casts the gradient back: 4 + 2
MEGATRON_FWD = CAST + (       # megatron/core/tensor_parallel/cross_entropy.py, unfused, in place on the fp32 copy
    4                         # calculate_logits_max: torch.max over the vocabulary reads it
    + 4 + 4                   # calculate_predicted_logits: vocab_parallel_logits -= logits_max
    + 4 + 4                   # torch.exp(vocab_parallel_logits, out=exp_logits)
    + 4                       # exp_logits.sum(dim=-1)
    + 4 + 4)                  # calculate_cross_entropy_loss: exp_logits.div_(sum_exp_logits)
MEGATRON_BWD = CAST + 4 + 4   # calculate_gradients: grad_input.mul_(grad_output)
TORCH_FWD = CAST + 3 * 4 + 4  # aten/src/ATen/native/cuda/SoftMax.cu cunn_SoftMaxForward (a row wider than shared
                              # memory): reads the row for the max, the sum of exps and the output, writes it once
TORCH_BWD = CAST + 4 + (      # Loss.cu nll_loss_backward_out_cuda: grad_input.zero_()
    4 + 4 + 4 + 4)            # cunn_SoftMaxBackward: reads gradOutput (sum), gradOutput and output, writes gradInput


def _big_vocab():
    """A 2048-wide model with a 131072-token vocabulary (Llama-3.2-1B's width, a 128K vocabulary), 4096 tokens."""
    return PRESETS["llama2-7b"].replace(name="big-vocab", hidden_size=2048, num_attention_heads=16,
                                        num_query_groups=16, ffn_hidden_size=5632, vocab_size=131072,
                                        seq_length=4096)


def test_head_pays_at_least_the_bytes_its_engines_cross_entropy_moves(tmp_path):
    """One micro-batch of 4096 tokens on one H100 in bf16, priced as each engine runs it (the stage profile the
    planner prices a last stage with): the head's forward is at least the logits GEMM at peak plus the loss's
    forward bytes at full bandwidth, its backward the two gradient GEMMs plus the loss's backward bytes."""
    (tmp_path / "inv.yaml").write_text(
        "clusters:\n  - {name: h100, device: h100-sxm, nodes: 1, devices_per_node: 8}\n")
    cluster = load_inventory(str(tmp_path / "inv.yaml")).with_precision("bf16").cluster("h100")
    model, dev = _big_vocab(), cluster.device
    assert dev.dtype_bytes == 2 and dev.peak_tflops * 1e12 <= H100_BF16_FLOPS
    assert dev.hbm_gbps * 1e9 <= H100_BYTES_S
    tokens, elements = 4096, 4096 * 131072
    gemm = 2.0 * tokens * model.hidden_size * model.vocab_size / H100_BF16_FLOPS   # the logits GEMM at peak
    head = {}
    for engine, (fwd_bytes, bwd_bytes) in {"megatron": (MEGATRON_FWD, MEGATRON_BWD),
                                           "deepspeed": (TORCH_FWD, TORCH_BWD)}.items():
        prof = costing.stage_profile(model, cluster, 1, 1, 1, "none", AnalyticCostModel(),
                                     settings_as_run(1, (), engine))
        fwd, bwd = head[engine] = prof.head_fwd, prof.head_bwd
        assert fwd >= gemm + fwd_bytes * elements / H100_BYTES_S, (engine, fwd)
        assert bwd >= 2 * gemm + bwd_bytes * elements / H100_BYTES_S, (engine, bwd)
    # Both heads run the same GEMMs (TP 1: no collectives): what one costs more than the other is the passes its
    # loss makes more, at the bandwidth they are bound by (1 % for rounding).
    extra_fwd = (MEGATRON_FWD - TORCH_FWD) * elements / H100_BYTES_S
    extra_bwd = (TORCH_BWD - MEGATRON_BWD) * elements / H100_BYTES_S
    assert head["megatron"][0] - head["deepspeed"][0] >= 0.99 * extra_fwd, (head, extra_fwd)
    assert head["deepspeed"][1] - head["megatron"][1] >= 0.99 * extra_bwd, (head, extra_bwd)
