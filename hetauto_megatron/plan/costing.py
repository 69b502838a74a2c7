"""Per-stage costs of one mesh configuration, the shared currency of the simulator, the layer split and the search.

A `StageProfile` answers, for a cluster running (tp, dp, micro_batch_size, recompute): how long one transformer
layer takes forward and backward on one micro-batch (TP collectives and recomputation included), what the
embedding and the output head add on the first and last stage, which link its DP collectives run on, how many
bytes a device holds, and what the optimizer step costs per byte of its traffic. Stage time is then linear in its
layer count, which is what makes the exact layer split cheap (plan/split.py).

Every term is priced under the mesh's runtime settings (plan/settings.py, `StageProfile.settings`), the same
table the emitted arguments and the runtime read. What is priced from a profile lives in a module per concept:
- plan/memory_fit.py: a stage's bytes and the layers that fit (and the memory job a plan must also fit as);
- plan/link_costs.py: the links DP rings and pipeline boundaries run on and what a boundary transfer costs;
- plan/tail_costs.py: the iteration tail, DP gradient synchronisation, the optimizer step and the exchanges
  every rank waits for (shared parameters' gradients, the global gradient norm).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache

from ..cost import comm
from ..cost.features import host_floored
from ..cost.memory import GIB, JobMemory
from ..spec.inventory import Cluster, LinkSpec
from ..spec.model import ModelSpec
from .engines import ENGINES
from .link_costs import dp_ring_link
from .settings import RuntimeSettings, default_settings
from .memory_fit import memory_job_of


@dataclass(frozen=True, eq=False)      # identity hash: profiles are unique (cached) and used as cache keys
class StageProfile:
    cluster: Cluster
    tp: int
    dp: int
    micro_batch_size: int
    recompute: str
    layer_fwd: float            # seconds per micro-batch, TP all-reduces included
    layer_bwd: float            # recompute included
    emb_fwd: float
    emb_bwd: float
    head_fwd: float
    head_bwd: float
    dp_link: LinkSpec           # the link DP collectives of this mesh run on
    memory_cap: float           # usable bytes per device
    settings: RuntimeSettings   # what this mesh runs with (plan/settings.py)
    optimizer_rate: float = 1.0     # the optimizer step: rate x its memory traffic + optimizer_step_s
    optimizer_step_s: float = 0.0   # (the cost model's optimizer_calibration; analytic: 1, 0)
    memory_job: JobMemory | None = None   # every stage must also fit as this job holds memory (--memory-job)
    tp_link: LinkSpec | None = None       # the link its TP collectives run on (tp_collective_link); None: intra_node

    def times(self, layers: int, first: bool, last: bool) -> tuple[float, float]:
        f = layers * self.layer_fwd + (self.emb_fwd if first else 0.0) + (self.head_fwd if last else 0.0)
        b = layers * self.layer_bwd + (self.emb_bwd if first else 0.0) + (self.head_bwd if last else 0.0)
        return f, b


@lru_cache(maxsize=65536)
def stage_profile(model: ModelSpec, cluster: Cluster, tp: int, dp: int, micro_batch_size: int, recompute: str,
                  cost_model, settings: RuntimeSettings | None = None) -> StageProfile:
    """`settings`: the mesh's runtime settings; None = the defaults for its TP (what `hetauto plan` emits)."""
    settings = settings or default_settings(tp)
    dev = cluster.device
    cost_model = _as_mesh_runs(cost_model, settings.sequence_parallel or tp == 1,    # (at TP 1 nothing to split)
                               settings.fused_attention(dev), ENGINES[settings.engine].loss)
    lf, lb = cost_model.layer_times(model, dev, tp, micro_batch_size)
    rec = cost_model.recompute_time(model, dev, tp, micro_batch_size, recompute)
    # Two all-reduces (or reduce-scatter + all-gather with sequence parallel) per layer forward, two backward,
    # two more when a full recompute re-runs the forward. TP stays inside a node (enforced by the search).
    # The host floor bounds each pass's compute and all-reduces together (one host thread issues both).
    act = dev.dtype_bytes * micro_batch_size * model.seq_length * model.hidden_size
    tp_link = tp_collective_link(cost_model, dev, tp, cluster.intra_node, act)
    ar = comm.allreduce_time(act, tp, tp_link)
    tp_f = tp_b = 2 * ar
    overlapping = _tp_overlap_pricer(cost_model)
    if tp > 1 and settings.sequence_parallel and overlapping is not None:   # a published job's --tp-comm-overlap
        f, b = overlapping.exposed_tp_comm(model, dev, tp, micro_batch_size, ar / 2)   # one RS or AG: ar / 2
        tp_f, tp_b = min(f, tp_f), min(b, tp_b)      # hiding them never costs more than leaving them exposed
    floor_f, floor_b = cost_model.host_floors(dev, tp)
    lf = host_floored(lf + tp_f, floor_f)
    lb = host_floored(lb + tp_b, floor_b) + (host_floored(rec + tp_f, floor_f) if recompute == "full" else rec)
    ef, eb = cost_model.embedding_times(model, dev, tp, micro_batch_size)
    hf, hb = cost_model.head_times(model, dev, tp, micro_batch_size)
    ef_tp, eb_tp, hf_tp, hb_tp = edge_tp_collectives(model, settings.sequence_parallel, tp, act, tp_link,
                                                      micro_batch_size)
    ef, eb, hf, hb = ef + ef_tp, eb + eb_tp, hf + hf_tp, hb + hb_tp
    dp_link = dp_ring_link(cluster, tp, dp)
    opt_rate, opt_step = cost_model.optimizer_calibration(dev)
    return StageProfile(cluster, tp, dp, micro_batch_size, recompute, lf, lb, ef, eb, hf, hb, dp_link,
                        dev.memory_gib * GIB, settings, opt_rate, opt_step, memory_job_of(cost_model, dev), tp_link)


def edge_tp_collectives(model: ModelSpec, sequence_parallel: bool, tp: int, act: float, link: LinkSpec,
                        micro_batch_size: int) -> tuple[float, float, float, float]:
    """(embedding forward, embedding backward, head forward, head backward) seconds of the TP collectives the
    first and last stage run outside their transformer layers, per micro-batch, as Megatron-Core 0.19 issues them
    (`act`: bytes of one [seq, micro-batch, hidden] activation; `link`: the mesh's TP collective link):
    - VocabParallelEmbedding sums its vocabulary shards' lookups over the TP group: an all-reduce of the output in
      the forward (tensor_parallel/layers.py), or with sequence parallelism and no learned position table
      (LanguageModelEmbedding.reduce_scatter_embeddings) a reduce-scatter; with sequence parallelism the
      backward of that scatter (or of the split that follows the all-reduce) is an all-gather;
    - the output layer (a ColumnParallelLinear) all-gathers the sequence shards of its input in the forward and
      reduce-scatters their gradient in the backward with sequence parallelism; without it the forward is a copy
      and the backward all-reduces the input's gradient;
    - the vocabulary-parallel cross-entropy all-reduces three fp32 values per token (max, sum, target logit).
    None at TP 1. Priced exposed, as the layers' collectives are. Not priced, as in the layers: with sequence
    parallelism the output layer's backward also gathers its input's shards again for the weight gradient
    (tensor_parallel/layers.py), started under the input-gradient GEMM (Transformer Engine's column-parallel
    layers do the same). The embedding and head times of the cost models are compute only (cost/features.py: TP
    collectives are not operators), as the layers' are (their all-reduces are added in stage_profile)."""
    if tp <= 1:
        return 0.0, 0.0, 0.0, 0.0
    tokens = micro_batch_size * model.seq_length
    if sequence_parallel and model.position_embedding != "learned":
        ef = comm.reduce_scatter_time(act, tp, link)
    else:
        ef = comm.allreduce_time(act, tp, link)
    eb = comm.all_gather_time(act, tp, link) if sequence_parallel else 0.0
    if not model.output_layer:
        return ef, eb, 0.0, 0.0
    loss = 3 * comm.allreduce_time(4 * tokens, tp, link)
    if sequence_parallel:
        return ef, eb, comm.all_gather_time(act, tp, link) + loss, comm.reduce_scatter_time(act, tp, link)
    return ef, eb, loss, comm.allreduce_time(act, tp, link)


def tp_collective_link(cost_model, device, tp: int, intra_node: LinkSpec, nbytes: float | None = None) -> LinkSpec:
    """The link a mesh's TP collectives of `nbytes` (a layer's activation) run on: the node's, unless the cost
    model measured that device's layers running them slower at this TP degree (a learned model's `tp_link`: PCIe
    GPUs without peer access, whose all-reduces go through host memory), in which case at that measured rate, read
    at that message size. The analytic model has none."""
    pick = getattr(cost_model, "tp_link", None)
    return pick(device, tp, intra_node, nbytes) if pick is not None and tp > 1 else intra_node


def _tp_overlap_pricer(cost_model):
    """The analytic model that prices TP collectives run under the GEMMs (`tp_comm_overlap`: only a published job
    that ran --tp-comm-overlap, plan/calibration.py; hetauto's runtime does not, so no plan's model has it), the
    cost model itself or the analytic fallback a learned model is given; None when the collectives are exposed."""
    for m in (cost_model, getattr(cost_model, "fallback", None), getattr(cost_model, "base", None)):
        if m is not None and getattr(m, "tp_comm_overlap", False):
            return m
    return None


def _as_mesh_runs(cost_model, sequence_parallel: bool, fused_attention: bool, loss: str = "vocab_parallel"):
    """The cost model pricing the layers as the mesh runs them. A model with the switches (the analytic one, and
    a learned model's analytic fallback for the device types it has no measurements of) gets the mesh's sequence
    parallelism (without it every TP rank repeats the norms, dropout and residuals of the whole sequence),
    whether its attention is fused on the device at its precision (RuntimeSettings.fused_attention: unfused attention
    moves the s x s scores through memory; a model without flash attention stays without) and its engine's cross
    entropy (Engine.loss: Megatron-Core's and torch's make different passes over the logits). A learned model's own
    layers are what its measurements ran, the attention included: its profile's fused or unfused attention operator
    (its own `flash_attention`, set here as the analytic model's)."""
    for inner in ("fallback", "base"):      # a learned model's analytic fallback; a wrapper's model (shared_cores.py)
        wrapped = getattr(cost_model, inner, None)
        if wrapped is not None:
            priced = _as_mesh_runs(wrapped, sequence_parallel, fused_attention, loss)
            own = inner == "fallback" and getattr(cost_model, "flash_attention", fused_attention) != fused_attention
            if priced is wrapped and not own:
                return cost_model
            other = copy.copy(cost_model)
            setattr(other, inner, priced)
            if own:
                other.flash_attention = fused_attention
            return other
    # A model told its software has no flash attention (plan/calibration.py: the 2021 runs) keeps it off.
    want = {"sequence_parallel": sequence_parallel,
            "flash_attention": fused_attention and getattr(cost_model, "flash_attention", True), "loss": loss}
    change = {k: v for k, v in want.items() if hasattr(cost_model, k) and getattr(cost_model, k) != v}
    if not change:
        return cost_model
    other = copy.copy(cost_model)
    for k, v in change.items():
        setattr(other, k, v)
    return other
