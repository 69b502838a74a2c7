"""Per-stage costs of one mesh configuration, the shared currency of the simulator, the layer split and the search.

A `StageProfile` answers, for a cluster running (tp, dp, micro_batch_size, recompute): how long one transformer
layer takes forward and backward on one micro-batch (TP collectives and recomputation included), what the
embedding and the output head add on the first and last stage, how many bytes a layer costs in memory, and how
long DP gradient synchronisation and the optimizer step take per parameter. Stage time is then linear in its
layer count, which is what makes the exact layer split cheap (plan/split.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..cost import comm
from ..cost.memory import GIB, stage_memory_bytes, stage_params
from ..spec.inventory import Cluster, LinkSpec
from ..spec.model import ModelSpec


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

    def times(self, layers: int, first: bool, last: bool) -> tuple[float, float]:
        f = layers * self.layer_fwd + (self.emb_fwd if first else 0.0) + (self.head_fwd if last else 0.0)
        b = layers * self.layer_bwd + (self.emb_bwd if first else 0.0) + (self.head_bwd if last else 0.0)
        return f, b


@lru_cache(maxsize=65536)
def stage_profile(model: ModelSpec, cluster: Cluster, tp: int, dp: int, micro_batch_size: int, recompute: str,
                  cost_model) -> StageProfile:
    dev = cluster.device
    lf, lb = cost_model.layer_times(model, dev, tp, micro_batch_size)
    lb += cost_model.recompute_time(model, dev, tp, micro_batch_size, recompute)
    # Two all-reduces (or reduce-scatter + all-gather with sequence parallel) per layer forward, two backward,
    # two more when a full recompute re-runs the forward. TP stays inside a node (enforced by the search).
    act = dev.dtype_bytes * micro_batch_size * model.seq_length * model.hidden_size
    ar = comm.allreduce_time(act, tp, cluster.intra_node)
    lf += 2 * ar
    lb += 2 * ar + (2 * ar if recompute == "full" else 0.0)
    ef, eb = cost_model.embedding_times(model, dev, tp, micro_batch_size)
    hf, hb = cost_model.head_times(model, dev, tp, micro_batch_size)
    dp_link = cluster.intra_node if tp * dp <= cluster.devices_per_node else cluster.inter_node
    return StageProfile(cluster, tp, dp, micro_batch_size, recompute, lf, lb, ef, eb, hf, hb, dp_link,
                        dev.memory_gib * GIB)


def stage_memory(model: ModelSpec, prof: StageProfile, layers: int, in_flight: int, first: bool,
                 last: bool) -> dict[str, float]:
    return stage_memory_bytes(model, layers=layers, tp=prof.tp, dp=prof.dp, micro_batch_size=prof.micro_batch_size,
                              recompute=prof.recompute, in_flight=in_flight, first=first, last=last,
                              vendor=prof.cluster.device.vendor, dtype_bytes=prof.cluster.device.dtype_bytes)


@lru_cache(maxsize=262144)
def max_layers_in_memory(model: ModelSpec, prof: StageProfile, in_flight: int, first: bool, last: bool) -> int:
    """Largest layer count a stage can hold (memory is linear in layers), -1 if even zero layers do not fit."""
    base = stage_memory(model, prof, 0, in_flight, first, last)["total"]
    if base > prof.memory_cap:
        return -1
    per = stage_memory(model, prof, 1, in_flight, first, last)["total"] - base
    return int((prof.memory_cap - base) // per) if per > 0 else model.num_layers


def dp_sync_times(model: ModelSpec, prof: StageProfile, layers: int, first: bool, last: bool) -> tuple[float, float]:
    """(gradient reduce-scatter, parameter all-gather) seconds of the distributed optimizer, and the optimizer step
    is added by the caller. Gradients and parameters in the device's training precision (bf16 on accelerators,
    fp32 on cpu) on the ring of the DP group's link."""
    nbytes = prof.cluster.device.dtype_bytes * stage_params(model, prof.tp, layers, first, last)
    return (comm.reduce_scatter_time(nbytes, prof.dp, prof.dp_link),
            comm.all_gather_time(nbytes, prof.dp, prof.dp_link))


def optimizer_time(model: ModelSpec, prof: StageProfile, layers: int, first: bool, last: bool) -> float:
    """Adam on the local shard: read/write the fp32 weight (the master copy under bf16), two moments, read the
    gradient (and write the bf16 weight): ~32 bytes per parameter in bf16 mixed precision, 28 in fp32."""
    per_param = 28 if prof.cluster.device.dtype_bytes == 4 else 32
    return stage_params(model, prof.tp, layers, first, last) / prof.dp * per_param / (prof.cluster.device.hbm_gbps * 1e9)


def boundary_transfer_time(model: ModelSpec, a: StageProfile, b: StageProfile, link: LinkSpec, same_cluster: bool,
                           samples_per_step: int) -> float:
    """One micro-batch's activation (or its gradient) crossing a stage boundary.

    Inside a cluster every sending device has its own path: it sends its 1/tp sequence shard of its replica's
    activation. Between clusters the inventory's link is the whole site-to-site bandwidth, shared by all
    replicas; hetauto sends each byte across once, so the whole step's activation crosses it."""
    B = a.cluster.device.dtype_bytes   # what the sender computes in (the receiver casts if it differs)
    if same_cluster:
        nbytes = B * a.micro_batch_size * model.seq_length * model.hidden_size / max(a.tp, b.tp)
    else:
        nbytes = B * samples_per_step * model.seq_length * model.hidden_size
    return link.transfer_time(nbytes)
