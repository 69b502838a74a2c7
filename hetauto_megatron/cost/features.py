"""What the learned cost model sees: operators, their shapes, a roofline prior, and one feature vector.

Shared by the profiler (which ops to time), the fit (rows -> matrix) and the prediction (a model/TP/micro-batch
-> the same ops -> the same matrix), so the three can never disagree on what a feature means. Pure Python; no
torch, no LightGBM.

A transformer layer, as one tensor-parallel rank runs it, is cut into operators (Megatron's order):
norm, QKV projection, rotary, attention core, output projection, residual add, norm, FC1 (gate+up when gated),
activation (SwiGLU or GELU), FC2, residual add. The output head is norm, logits GEMM and the cross-entropy.
TP is "simulated" by dividing the sharded dimension (heads, FFN width, vocabulary) by the TP degree, which is
exactly what each rank computes; TP collectives are the communication model's business, not ours.

The learned target is the log of measured time over a roofline prior (max of FLOPs at peak and bytes at
memory bandwidth, per operator). Learning a correction to a physical prior instead of raw time keeps
predictions sane outside the profiled grid: far from data the trees fall back to a constant efficiency,
not to a constant time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# Bump when the meaning of a feature or of the prior changes: fitted models record it and refuse a mismatch.
# 5: the unfused attention operator ("attention_unfused"), which CPU meshes and Transformer Engine without its fused
# backends run (a model fitted before priced their attention from the fused kernel's rate).
FEATURE_VERSION = 5

# "attention": a fused (flash / memory-efficient) attention, torch's scaled_dot_product_attention, what Transformer
# Engine runs in 16 bits on sm80+ and DeepSpeed's layers call. "attention_unfused": the attention that materialises
# the s x s scores, as Megatron's local DotProductAttention computes it (CPU meshes, --transformer-impl local) and
# Transformer Engine's UnfusedDotProductAttention (fp32, V100): a full (not causal-half) score GEMM, the mask filled
# in, a softmax, the context GEMM. Appended last: the kind's index is a feature, the others keep theirs.
OP_KINDS = ("gemm", "attention", "norm", "rotary", "activation", "add", "loss", "embedding", "attention_unfused")
ATTENTION_KINDS = ("attention", "attention_unfused")


def runs_unfused_attention(device, dtype_bytes: int) -> bool:
    """Whether Megatron's attention on `device` (a spec.devices.DeviceType) with `dtype_bytes`-wide tensors keeps
    the s x s scores: Transformer Engine's fused backends take 16-bit inputs on a device that has them
    (DeviceType.fused_attention: not a V100); in fp32 it runs its unfused attention, and a CPU mesh (always fp32)
    Megatron's local one. The one rule RuntimeSettings.fused_attention (what a plan's mesh runs), the profiler (which
    attention it times) and the fit (which kinds a profile must hold) read."""
    return not (dtype_bytes <= 2 and device.fused_attention)
# Whole-layer rows (measured per layer, e.g. the shipped GPU measurements).
LAYER_KINDS = ("transformer", "head", "embedding")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# The arithmetic a measurement ran in and the backward-GEMM weighting: cost/arithmetic.py (re-exported here, where the
# profiler, the fit and the prediction read them).
from .arithmetic import (ARITHMETIC_BYTES, TF32_K_MAJOR_ONLY, arithmetic_of, backward_gemm_weight,  # noqa: E402,F401
                         backward_gemm_weighted, device_arithmetic)


# Backward costs relative to forward, for the prior only (the trees learn the real ratio):
# GEMMs compute grad-input and grad-weight (2x); attention recomputes probabilities (~2.5x).
_BWD_FLOP_FACTOR = {"gemm": 2.0, "attention": 2.5}


@dataclass(frozen=True)
class Op:
    """One operator on one rank. Unused dimensions are 0. `tokens` = micro-batch x sequence."""
    name: str          # role in the layer, e.g. "qkv", "fc2", "logits" (for reports)
    kind: str          # one of OP_KINDS: what decides the cost
    tokens: int
    k: int = 0         # GEMM reduction dim / embedding vocabulary rows
    n: int = 0         # GEMM output dim / width of an elementwise op
    batch: int = 0     # attention: micro-batch
    seq: int = 0       # attention: sequence length
    heads: int = 0     # attention: query heads on this rank; rotary: q + k heads rotated
    kv_heads: int = 0  # attention: key/value heads on this rank
    head_dim: int = 0
    gated: int = 0     # activation: 1 = SwiGLU (two inputs), 0 = GELU

    def __post_init__(self):
        if self.kind not in OP_KINDS:
            raise ValueError(f"unknown operator kind {self.kind!r}; expected one of {OP_KINDS}")
        if self.tokens <= 0:
            raise ValueError(f"operator {self.name} needs a positive token count, got {self.tokens}")

    def key(self) -> str:
        """Identity of the measurement (the name is a label, two roles with one shape share a row)."""
        return (f"{self.kind}:t{self.tokens}:k{self.k}:n{self.n}:b{self.batch}:s{self.seq}:h{self.heads}"
                f":g{self.kv_heads}:d{self.head_dim}:a{self.gated}")

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in Op.__dataclass_fields__}

    @staticmethod
    def from_dict(d: dict) -> "Op":
        return Op(**{f: d[f] for f in Op.__dataclass_fields__ if f in d})

    # ---- analytic size of the forward pass ------------------------------------------------------------
    def flops(self) -> float:
        t = self.tokens
        if self.kind == "gemm":
            return 2.0 * t * self.k * self.n
        if self.kind == "attention":
            # QK^T and PV, causal: half of the s x s score matrix is computed.
            return 2.0 * self.batch * self.heads * self.seq * self.seq * self.head_dim
        if self.kind == "attention_unfused":
            # QK^T and PV over the whole s x s matrix: the mask is filled in after the GEMM, nothing is skipped.
            return 4.0 * self.batch * self.heads * self.seq * self.seq * self.head_dim
        if self.kind == "rotary":
            return 3.0 * t * self.heads * self.head_dim
        if self.kind == "activation":
            return (5.0 if self.gated else 8.0) * t * self.n
        if self.kind == "norm":
            return 4.0 * t * self.n
        if self.kind == "loss":
            return 5.0 * t * self.n
        return 1.0 * t * self.n   # add, embedding

    def elements_moved(self) -> float:
        """Elements read + written once each (a lower bound on traffic)."""
        t = self.tokens
        if self.kind == "gemm":
            return t * self.k + self.k * self.n + t * self.n
        if self.kind in ATTENTION_KINDS:
            return self.batch * self.seq * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        if self.kind == "rotary":
            return 2.0 * t * self.heads * self.head_dim
        if self.kind == "activation":
            return (3.0 if self.gated else 2.0) * t * self.n
        if self.kind == "add":
            return 3.0 * t * self.n
        if self.kind == "embedding":
            return 2.0 * t * self.n
        return 2.0 * t * self.n   # norm, loss

    def score_elements(self) -> float:
        """Size of the attention score matrix: what an unfused attention writes and reads back."""
        return float(self.batch * self.heads * self.seq * self.seq) if self.kind in ATTENTION_KINDS else 0.0


def roofline_s(flops: float, nbytes: float, peak_tflops: float, hbm_gbps: float) -> float:
    """The prior: an operator is bound by compute or by memory traffic, whichever is slower."""
    return max(flops / (peak_tflops * 1e12), nbytes / (hbm_gbps * 1e9), 1e-9)


def op_prior_s(op: Op, phase: str, dtype_bytes: int, peak_tflops: float, hbm_gbps: float) -> float:
    f = _BWD_FLOP_FACTOR.get(op.kind, 2.0) if phase == "bwd" else 1.0
    elements = f * op.elements_moved()
    if op.kind == "attention_unfused":
        # the s x s scores go through memory kernel by kernel (SCORE_BYTES_PER_ELEMENT: the score GEMM's output,
        # the mask filled in, the softmax, the context GEMM's input; the backward's), beside Q, K, V and the context
        per_elem, mask = SCORE_BYTES_PER_ELEMENT[phase]
        return roofline_s(f * op.flops(), elements * dtype_bytes + op.score_elements() * (per_elem * dtype_bytes + mask),
                          peak_tflops, hbm_gbps)
    if op.kind == "embedding" and phase == "bwd":
        # The table's gradient is written whole (zeroed, then the looked-up rows accumulated into it): its cost
        # grows with vocabulary x hidden, not only with the tokens.
        elements = 2.0 * op.tokens * op.n + 2.0 * op.k * op.n
    return roofline_s(f * op.flops(), elements * dtype_bytes, peak_tflops, hbm_gbps)


# ---- operator decomposition of a model --------------------------------------------------------------------
_TP_SHARDED = ("num_attention_heads", "num_query_groups", "ffn_hidden_size")


def tp_divides(model, tp: int) -> bool:
    """Whether `tp` ranks can split the model's heads, key/value groups and FFN width evenly."""
    return all(getattr(model, attr) % tp == 0 for attr in _TP_SHARDED)


def _check_tp(model, tp: int):
    for attr in _TP_SHARDED:
        if getattr(model, attr) % tp:
            raise ValueError(f"tp {tp} does not divide {attr} {getattr(model, attr)} of {model.name}")


def layer_ops(model, tp: int, micro_batch_size: int, seq_length: int | None = None, *,
              unfused_attention: bool = False) -> list[Op]:
    """The operators one TP rank runs for one transformer layer and one micro-batch; its attention unfused where
    the layer runs it so (`runs_unfused_attention`, RuntimeSettings.fused_attention)."""
    _check_tp(model, tp)
    s = seq_length or model.seq_length
    t, h, d = micro_batch_size * s, model.hidden_size, model.head_dim
    heads, kv = model.num_attention_heads // tp, model.num_query_groups // tp
    ffn = model.ffn_hidden_size // tp
    ops = [Op("norm1", "norm", t, n=h),
           Op("qkv", "gemm", t, k=h, n=(heads + 2 * kv) * d)]
    if model.position_embedding == "rope":
        ops.append(Op("rotary", "rotary", t, heads=heads + kv, head_dim=d))
    ops += [Op("attention", ATTENTION_KINDS[bool(unfused_attention)], t, batch=micro_batch_size, seq=s, heads=heads, kv_heads=kv, head_dim=d),
            Op("proj", "gemm", t, k=heads * d, n=h),
            Op("residual1", "add", t, n=h),
            Op("norm2", "norm", t, n=h),
            Op("fc1", "gemm", t, k=h, n=(2 if model.gated_mlp else 1) * ffn),
            Op("act", "activation", t, n=ffn, gated=int(model.gated_mlp)),
            Op("fc2", "gemm", t, k=ffn, n=h),
            Op("residual2", "add", t, n=h)]
    return ops


def head_ops(model, tp: int, micro_batch_size: int, seq_length: int | None = None) -> list[Op]:
    """Final norm, logits GEMM against the vocabulary shard, and the (vocab-parallel) cross-entropy; without an
    output layer (ModelSpec.output_layer) no GEMM, and the loss over the norm's outputs."""
    t = micro_batch_size * (seq_length or model.seq_length)
    if not getattr(model, "output_layer", True):
        return [Op("final_norm", "norm", t, n=model.hidden_size), Op("loss", "loss", t, n=model.hidden_size)]
    v = -(-model.vocab_size // tp)
    return [Op("final_norm", "norm", t, n=model.hidden_size),
            Op("logits", "gemm", t, k=model.hidden_size, n=v),
            Op("loss", "loss", t, n=v)]


def embedding_ops(model, tp: int, micro_batch_size: int, seq_length: int | None = None) -> list[Op]:
    t = micro_batch_size * (seq_length or model.seq_length)
    return [Op("embedding", "embedding", t, k=-(-model.vocab_size // tp), n=model.hidden_size)]


# ---- feature vectors ----------------------------------------------------------------------------------------
def _log(x: float) -> float:
    return math.log2(max(float(x), 1.0))


# No TP here: an operator's shape already is the shard one rank computes (TP collectives are not operators of
# this model), so two TP degrees that give one shape are one measurement.
OP_FEATURES = ("kind", "phase_bwd", "log_tokens", "log_k", "log_n", "log_batch", "log_seq", "log_heads",
               "log_kv_heads", "log_head_dim", "gated", "dtype_bytes", "log_flops", "log_bytes",
               "intensity", "log_score_elems", "peak_tflops", "hbm_gbps", "log_prior")


def op_row(op: Op, phase: str, *, dtype_bytes: int, peak_tflops: float,
           hbm_gbps: float) -> tuple[list[float], float]:
    """(feature vector, roofline prior in seconds) of one operator and phase."""
    flops, nbytes = op.flops(), op.elements_moved() * dtype_bytes
    prior = op_prior_s(op, phase, dtype_bytes, peak_tflops, hbm_gbps)
    return [float(OP_KINDS.index(op.kind)), float(phase == "bwd"), _log(op.tokens), _log(op.k), _log(op.n),
            _log(op.batch), _log(op.seq), _log(op.heads), _log(op.kv_heads), _log(op.head_dim), float(op.gated),
            float(dtype_bytes), _log(flops), _log(nbytes), flops / max(nbytes, 1.0),
            _log(op.score_elements()), float(peak_tflops), float(hbm_gbps), math.log(prior)], prior


@dataclass(frozen=True)
class LayerShape:
    """A whole layer (transformer block, output head or embedding) as measured end to end on one rank."""
    kind: str          # one of LAYER_KINDS
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    micro_batch: int
    tp: int
    gated: int
    rope: int

    def model(self, name: str = "layer"):
        """The (one-layer) model this layer belongs to, at the layer's sequence length."""
        from ..spec.model import ModelSpec
        return ModelSpec(name=name, num_layers=1, hidden_size=self.hidden, num_attention_heads=self.heads,
                         ffn_hidden_size=self.ffn, vocab_size=self.vocab, seq_length=self.seq,
                         num_query_groups=self.kv_heads, gated_mlp=bool(self.gated),
                         position_embedding="rope" if self.rope else "learned")

    def ops(self, unfused_attention: bool = False) -> list[Op]:
        if self.kind == "transformer":
            return layer_ops(self.model(), self.tp, self.micro_batch, unfused_attention=unfused_attention)
        fn = {"head": head_ops, "embedding": embedding_ops}[self.kind]
        return fn(self.model(), self.tp, self.micro_batch)

    def key(self) -> str:
        return (f"{self.kind}:h{self.hidden}:a{self.heads}:g{self.kv_heads}:f{self.ffn}:v{self.vocab}:s{self.seq}"
                f":b{self.micro_batch}:tp{self.tp}:glu{self.gated}:rope{self.rope}")

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in LayerShape.__dataclass_fields__}

    @staticmethod
    def from_dict(d: dict) -> "LayerShape":
        return LayerShape(**{f: d[f] for f in LayerShape.__dataclass_fields__})

    @staticmethod
    def of(model, tp: int, micro_batch_size: int, seq_length: int | None = None) -> "LayerShape":
        """A transformer layer of `model` as one TP rank runs it."""
        return LayerShape("transformer", model.hidden_size, model.num_attention_heads, model.num_query_groups,
                          model.ffn_hidden_size, model.vocab_size, seq_length or model.seq_length, micro_batch_size,
                          tp, int(model.gated_mlp), int(model.position_embedding == "rope"))


LAYER_FEATURES = ("kind", "phase_bwd", "log_hidden", "log_heads", "log_kv_heads", "log_ffn", "log_vocab",
                  "log_seq", "log_micro_batch", "tp", "gated", "rope", "dtype_bytes", "log_flops", "log_bytes",
                  "intensity", "log_score_elems", "attn_flop_share", "peak_tflops", "hbm_gbps", "log_prior",
                  "gemm_share", "attention_share", "score_share")


# Bytes moved per attention-score element by an unfused attention (the measured framework's path: the shipped
# per-layer data never ran flash attention), counted kernel by kernel with d = element size. With one more
# element-wise pass over the scores that reads a 1-byte mask (`extra_score_pass`):
# forward: QK^T writes S (d); scale-mask-softmax reads S, writes P (2d); the extra pass reads P and the mask,
# writes P' (2d + 1); PV reads P' (d) -> 6d + 1.  Backward: dP' written (d); dV reads P' (d); the extra pass's
# backward reads dP' and the mask, writes dP (2d + 1); softmax backward reads dP and P, writes dS (3d); dQ and dK
# each read dS (2d) -> 9d + 1.  Without it: 4d forward, 7d backward.
SCORE_BYTES_PER_ELEMENT = {"fwd": (6, 1), "bwd": (9, 1)}
SCORE_BYTES_ONE_PASS = {"fwd": 4, "bwd": 7}
# Megatron-DeepSpeed (the software of the shipped per-layer GPU data) runs its fused scale-mask-softmax kernel only
# for keys of 16 to 4096 tokens (megatron/model/fused_softmax.py, is_kernel_available); longer sequences take
# PyTorch's path, separate passes over the scores in fp32 (a 16-bit input is cast up and back):
# forward: QK^T writes S (d); [cast: read d, write 4]; scale: read 4, write 4; mask: read 4 and the 1-byte mask,
# write 4; softmax: read 4, write 4; [cast back: read 4, write d]; PV reads P (d).
# backward: dP written (d); dV reads P (d); [cast back's backward: read d, write 4]; softmax backward: read the
# gradient and the saved output, write (12); mask backward: read 4 and the mask, write 4; scale backward: read 4,
# write 4; [cast's backward: read 4, write d]; dQ and dK read dS (2d).
FUSED_SOFTMAX_MAX_KEYS = 4096


def extra_score_pass(shape) -> bool:
    """Whether the learned prior counts one more pass over a measured layer's scores (2d + 1 bytes each way, see
    above): for the GPT-style layers with learned positions of the shipped data (OPT, GPT-Neo), not for rotary
    (LLaMA-style) ones; chosen by leave-one-model-out (docs/cost-model-learned.md, "The softmax path"). It describes
    the measured framework's kernels, not dropout: that framework applies none to the attention probabilities
    (plan/memory_fit.py sailor_deepspeed_job prices its memory so). A plan's own dropouts are runtime settings
    (plan/settings.py) that the memory model reads."""
    return not shape.rope


def unfused_softmax_bytes(phase: str, d: int) -> float:
    """Bytes per score element of PyTorch's softmax path, kernel by kernel (see above)."""
    cast = 6 if d < 4 else 0
    return (d + cast + 8 + 9 + 8 + cast + d) if phase == "fwd" else (2 * d + cast + 12 + 9 + 8 + cast + 2 * d)


def host_floored(gpu_work_s: float, floor_s: float) -> float:
    """A transformer layer's pass as it runs: the GPU's work, compute and the TP all-reduces together, but no less
    than the host floor, the time the host takes to issue the pass (Python, PyTorch's dispatcher, the launches and
    the all-reduces' NCCL calls, all from one thread; where the host is slower, the GPU waits for each kernel and
    the all-reduces hide in that wait). The one rule the fit (sailor_host_floor.host_bound_times measures the floor on the
    whole pass), the learned model's predictions of measured layers (fitted.predict_samples) and the planner's
    stage profiles (plan/costing.stage_profile) apply. floor_s 0: no floor (the analytic model, a GPU none of
    whose measured configurations is host-bound)."""
    return max(gpu_work_s, floor_s)


def unfused_softmax_s(shape, phase: str, dtype_bytes: int, hbm_gbps: float) -> float:
    """Seconds a layer of more than FUSED_SOFTMAX_MAX_KEYS keys spends in PyTorch's softmax path beyond what
    the fused kernel would have moved: element-wise passes over the scores, priced at the memory bandwidth
    (not at the learned rate, which describes the fused kernels and the GEMMs). 0 for shorter sequences."""
    if shape.kind != "transformer" or shape.seq <= FUSED_SOFTMAX_MAX_KEYS:
        return 0.0
    scores = sum(o.score_elements() for o in shape.ops())
    fused = SCORE_BYTES_ONE_PASS[phase] * dtype_bytes
    return scores * (unfused_softmax_bytes(phase, dtype_bytes) - fused) / (hbm_gbps * 1e9)


def layer_prior_parts(ops: list[Op], phase: str, dtype_bytes: int, peak_tflops: float,
                      hbm_gbps: float, score_bwd_weight: float = 1.0, extra_pass: bool = True,
                      gemm_bwd_weight: float = 1.0) -> dict[str, float]:
    """The prior of a whole layer, by part: GEMM rooflines, attention (core roofline plus the full, not
    causal-half, score FLOPs), the score matrix's traffic, and the memory-bound rest (norms, activation, adds,
    rotary). Whole-layer measurements (the shipped GPU data) come from runs that materialise the s x s score
    matrix (their activation sizes include it), hence the score terms; without them long-sequence layers look
    several times less efficient than short ones. The parts' shares are features: a layer dominated by score
    traffic behaves like other score-bound layers, whatever model it belongs to.
    `score_bwd_weight`: how many times the counted traffic the backward's score kernels cost (they reach a
    lower share of the memory bandwidth than the forward's); fitted by `hetauto fit`
    (cost/learned/backward_weights.py: choose_weights), 1 = as counted. `extra_pass`: `extra_score_pass` of the layer. `gemm_bwd_weight`: how many
    times their roofline at the forward's efficiency the backward's GEMMs take where `backward_gemm_weighted` (TF32 on
    a GPU whose TF32 instruction wants K-major operands), fitted the same way; 1 elsewhere.
    A sequence beyond the fused softmax kernel's reach adds `unfused_softmax_s`, outside this prior."""
    f = 2.0 if phase == "bwd" else 1.0
    parts = {"gemm": 0.0, "attention": 0.0, "scores": 0.0, "other": 0.0}
    for o in ops:
        t = op_prior_s(o, phase, dtype_bytes, peak_tflops, hbm_gbps)
        parts["gemm" if o.kind in ("gemm", "loss") else "attention" if o.kind in ATTENTION_KINDS else "other"] += t
    if phase == "bwd":
        parts["gemm"] *= gemm_bwd_weight
    scores = sum(o.score_elements() for o in ops)
    attn_flops = sum(o.flops() for o in ops if o.kind == "attention")
    per_elem, mask = SCORE_BYTES_PER_ELEMENT[phase]
    per_score = per_elem * dtype_bytes + mask if extra_pass else SCORE_BYTES_ONE_PASS[phase] * dtype_bytes
    weight = score_bwd_weight if phase == "bwd" else 1.0
    parts["scores"] = weight * scores * per_score / (hbm_gbps * 1e9)
    parts["attention"] += f * attn_flops / (peak_tflops * 1e12)
    return parts


def layer_row(shape: LayerShape, phase: str, *, dtype_bytes: int, peak_tflops: float,
              hbm_gbps: float, score_bwd_weight: float = 1.0, gemm_bwd_weight: float = 1.0) -> tuple[list[float], float]:
    """(feature vector, prior in seconds) of one whole layer and phase."""
    ops = shape.ops()
    flops = sum(o.flops() for o in ops)
    nbytes = sum(o.elements_moved() for o in ops) * dtype_bytes
    attn = sum(o.flops() for o in ops if o.kind == "attention")
    parts = layer_prior_parts(ops, phase, dtype_bytes, peak_tflops, hbm_gbps, score_bwd_weight,
                              extra_score_pass(shape), gemm_bwd_weight)
    prior = sum(parts.values())
    return [float(LAYER_KINDS.index(shape.kind)), float(phase == "bwd"), _log(shape.hidden), _log(shape.heads),
            _log(shape.kv_heads), _log(shape.ffn), _log(shape.vocab), _log(shape.seq), _log(shape.micro_batch),
            float(shape.tp), float(shape.gated), float(shape.rope), float(dtype_bytes), _log(flops), _log(nbytes),
            flops / max(nbytes, 1.0), _log(sum(o.score_elements() for o in ops)), attn / max(flops, 1.0),
            float(peak_tflops), float(hbm_gbps), math.log(prior), parts["gemm"] / prior, parts["attention"] / prior,
            parts["scores"] / prior], prior
