"""The unfused attention `hetauto profile` times where the runtime runs it (cost/features.py
`runs_unfused_attention`: CPU meshes, Transformer Engine in fp32 or on a V100): the kernels of Megatron-Core's local
DotProductAttention (megatron/core/transformer/dot_product_attention.py, the dry run's and `--transformer-impl local`'s
attention), in plain torch so that it runs wherever the profiler does.

Kernel by kernel: the key/value groups repeated to every query head (repeat_interleave, GQA only), the score GEMM
over the whole s x s matrix (baddbmm with beta 0, the softmax scale folded in), the causal mask filled in place
(attention_mask_func: masked_fill_ with -10000), the softmax (FusedScaleMaskSoftmax's torch path: the dry run turns
masked_softmax_fusion off), the context GEMM (bmm) and the [s, b, heads x d] layout the output projection takes. The
attention dropout is 0 (plan/settings.py), which torch returns as its input: no kernel. Transformer Engine's
UnfusedDotProductAttention runs the same GEMMs and s x s passes (in 16 bits its scale-mask-softmax is one kernel:
its fitted rate absorbs that).
"""
from __future__ import annotations


def megatron_local_attention(torch, q, k, v, mask):
    """Context [s, b, heads x d] of q [s, b, heads, d] and k, v [s, b, kv_heads, d], as Megatron's local
    DotProductAttention computes it (see above)."""
    s, b, heads, d = q.shape
    groups = heads // k.shape[2]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    qm, km = q.reshape(s, b * heads, d), k.reshape(s, b * heads, d)
    out = torch.empty(b * heads, s, s, dtype=q.dtype, device=q.device)   # Megatron's global buffer: not read
    scores = torch.baddbmm(out, qm.transpose(0, 1), km.transpose(0, 1).transpose(1, 2), beta=0.0,
                           alpha=d ** -0.5).view(b, heads, s, s)
    scores.masked_fill_(mask, -10000.0)
    probs = torch.nn.functional.softmax(scores, dim=-1)
    ctx = torch.bmm(probs.view(b * heads, s, s), v.reshape(s, b * heads, d).transpose(0, 1))
    return ctx.view(b, heads, s, d).permute(2, 0, 1, 3).contiguous().view(s, b, heads * d)
