"""Megatron-Core's DDP buffer of one pipeline stage, to the element: what its `param_data` and `grad_data` hold
and how many of the stage's elements the busiest DP rank's optimizer state covers (cost/model_state.py prices
the bytes). One rule, read by every figure of a stage's weights, gradients and optimizer state (cost/memory.py).

Megatron-Core 0.19.2 lays a stage's parameters out in one contiguous buffer per (parameter dtype, gradient
dtype), one here (every parameter has the training precision), in the reverse of the module's
`named_parameters()` order (the order the backward pass produces gradients), and cuts it into buckets:

- without the distributed optimizer (param_and_grad_buffer.py `_compute_default_per_buffer_param_layout`)
  nothing is padded: `grad_data` holds the parameters' elements, and there is no `param_data` (the parameters
  keep their own tensors);
- with it (distrib_optimizer.py `_compute_per_buffer_param_layout`, param_layout.py) every parameter starts on
  a 64-element boundary (`pad_param_start`) and every bucket's end is padded to a multiple of lcm(DP, 128)
  (`pad_bucket_end`; --ddp-pad-buckets-for-high-nccl-busbw pads to lcm(DP, 128, 2^16) and is refused as
  unpriced, megatron/unpriced.py). A bucket closes after the parameter that brings it (padding included) to
  `bucket_size` elements or more, and a tied embedding table of a pipeline of several stages
  (`shared_embedding`: the first stage's table, the last stage's copy) gets a bucket of its own. `param_data`
  and `grad_data` both have the padded size;
- `bucket_size` is max(40M, 1M x DP) with overlap_grad_reduce on pipeline rank 0, none (one bucket) otherwise
  (distributed_data_parallel.py: "Turn off bucketing if we are on a pipeline stage that is not the first");
- the distributed optimizer gives DP rank r the r-th of DP equal pieces of every bucket; its fp32 master
  weights, Adam's moments (and the fp32 gradient copies) are made per parameter from the part of the parameter
  in that piece (`_build_model_gbuf_param_range_map`, `shard_model_param.clone().float()`), so they cover the
  parameters' elements of the piece, never its padding, and DP ranks differ by the padding their pieces hold.
  The busiest rank is priced.

At real widths every tensor is a multiple of 64 elements and only the bucket ends are padded (under lcm(DP, 128)
elements a bucket); at the dry run's --tiny widths a 32-element bias or LayerNorm vector takes 64.
tests/test_memory_megatron.py and tests/test_memory_dryrun.py compare these counts with the buffers of real
Megatron-Core stages, to the element.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache

from ..spec.model import ModelSpec

PARAM_START_ALIGN = 64        # param_layout.pad_param_start
BUCKET_END_ALIGN = 128        # param_layout.bucket_end_divisor: lcm(DP, 128)
# Megatron-Core's DDP: a gradient bucket of max(40M, 1M x DP) parameters (training.py resolve_ddp_bucket_size), and
# one bucket for the whole stage on every pipeline rank but the first.
DDP_BUCKET_PARAMS = 40_000_000
DDP_BUCKET_PARAMS_PER_DP_RANK = 1_000_000


def ddp_bucket_params(dp: int) -> int:
    """Parameters per gradient bucket of Megatron-Core's DDP at DP `dp`, the size priced (a launch's
    --ddp-bucket-size or --ddp-num-buckets that cuts others is refused: megatron/unpriced.py check_ddp_bucket_args)."""
    return max(DDP_BUCKET_PARAMS, DDP_BUCKET_PARAMS_PER_DP_RANK * dp)


def stage_bucket_size(dp: int, first: bool, overlap_grad_reduce: bool) -> int | None:
    """The bucket_size Megatron-Core's DDP cuts a stage's buffer with: ddp_bucket_params on pipeline rank 0 with
    overlap_grad_reduce, None (one bucket) otherwise."""
    return ddp_bucket_params(dp) if first and overlap_grad_reduce else None


@dataclass(frozen=True)
class StageBuffer:
    """Elements one rank of a stage holds: `params` its parameters, `param_data` its weights (the padded buffer
    with the distributed optimizer, else the parameters), `grad_data` its gradient buffer, `optimizer` the
    parameters' elements the busiest DP rank's optimizer state covers (its shard; all of them without the
    distributed optimizer)."""
    params: int
    param_data: int
    grad_data: int
    optimizer: int


def _split(n: int, tp: int) -> int:
    # Megatron splits evenly (the plan's TP divides heads, groups, MLP width and the padded vocabulary); a TP that
    # does not, asked about by a search's bound, gets the larger piece
    return -(-n // tp)


def stage_tensors(model: ModelSpec, tp: int, first: bool, last: bool) -> tuple[tuple, tuple, tuple]:
    """(what the first stage adds, one layer, what the last stage adds): (elements, own bucket) of each parameter
    tensor one TP rank holds, in the module's `named_parameters()` order (Megatron-Core's GPTModel with the local
    layer spec, which hetauto's runtime builds: embedding, position table, per layer the input norm, the attention
    output and QKV projections, the MLP norm, MLP up and down, each weight before its bias, the final norm, the
    output layer; Transformer Engine's spec fuses each norm into the projection after it, which moves the input
    norm after the attention output projection: the same sizes, so the same padding except where a first stage's
    bucket is cut, which may move by a parameter, fewer than lcm(DP, 128) elements). The same inventory as
    memory.stage_params counts: norms, the row-parallel biases and a learned position table whole on every TP
    rank, the rest split. `own bucket`: a tied table when the stage is not the whole pipeline."""
    h, kv, f = model.hidden_size, model.kv_hidden, model.ffn_hidden_size
    bias = model.linear_biases
    norm = (h,) if model.gated_mlp else (h, h)          # RMSNorm's scale; LayerNorm's scale and shift
    table = _split(model.vocab_size, tp) * h
    pre = []
    if first:
        pre.append((table, model.tie_embeddings and not last))
        if model.position_embedding == "learned":
            pre.append((model.max_position_embeddings * h, False))
    qkv, up = _split(h + 2 * kv, tp), _split(f * (2 if model.gated_mlp else 1), tp)
    # Megatron's attention builds its output projection before its QKV projection
    layer = [*norm, h * _split(h, tp), *((h,) if bias else ()), qkv * h, *((qkv,) if bias else ()),
             *norm, up * h, *((up,) if bias else ()), h * _split(f, tp), *((h,) if bias else ())]
    post = []
    if last:
        post += [(n, False) for n in norm]
        if model.output_layer and not (first and model.tie_embeddings):
            post.append((table, model.tie_embeddings))
    return tuple(pre), tuple((n, False) for n in layer), tuple(post)


def _ceil(x: int, to: int) -> int:
    return -(-x // to) * to


# The layout's state between parameters: (start of the next parameter before its alignment, start of the open
# bucket, end of the last parameter, whether the open bucket holds a parameter).
_EMPTY = (0, 0, 0, False)


def _walk(state: tuple, tensors: tuple, repeat: int, div: int, bucket_size: int | None, closed: list,
          spans: list | None, align: int = PARAM_START_ALIGN) -> tuple:
    """Megatron-Core's loop of `_compute_per_buffer_param_layout` over `repeat` x `tensors` ((elements, own bucket)
    each) from `state`, buckets' ends padded to a multiple of `div`: appends each bucket it closes to `closed` as
    (start, end of its last parameter, padded end) and, unless `spans` is None, where the parameters lie to `spans`:
    (start, end, None) for a parameter, (start, end, tensors) for repeats of `tensors` from `start`. Whole repeats
    that close no bucket are stepped over at once (the same buckets). Parameters start on multiples of `align`.
    Returns the state after them."""
    start, bstart, end, filled = state
    if not tensors:
        return state
    step = sum(_ceil(n, align) for n, _ in tensors)
    last_gap = _ceil(tensors[-1][0], align) - tensors[-1][0]
    skippable = not any(shared for _, shared in tensors)
    done = 0
    while done < repeat:
        if skippable:
            s0 = _ceil(start, align)
            k = repeat - done
            if bucket_size is not None:        # every parameter of the repeats stepped over ends below the cap
                k = min(k, (bucket_size - 1 - (s0 - bstart)) // step)
            if k > 0:
                if spans is not None:
                    spans.append((s0, s0 + k * step, tensors))
                end = start = s0 + k * step - last_gap
                filled = True
                done += k
                continue
        for n, shared in tensors:
            start = _ceil(start, align)
            if shared and filled:              # a tied table starts a bucket of its own
                padded = _ceil(start, div)
                closed.append((bstart, start, padded))
                start = bstart = padded
                filled = False
            end = start + n
            if spans is not None:
                spans.append((start, end, None))
            filled = True
            if (bucket_size is not None and end - bstart >= bucket_size) or shared:
                padded = _ceil(end, div)
                closed.append((bstart, end, padded))
                start = bstart = padded
                filled = False
            else:
                start = end
        done += 1
    return start, bstart, end, filled


def _finish(state: tuple, div: int, closed: list) -> None:
    """Close the open bucket, as Megatron does after its loop."""
    _, bstart, end, filled = state
    if filled:
        closed.append((bstart, end, _ceil(end, div)))


def buffer_layout(segments, dp: int, bucket_size: int | None, every_param: bool = True, padded: bool = True):
    """Megatron-Core's `_compute_per_buffer_param_layout` over `segments`, ((tensors, repeat), ...) in layout
    order, each tensor (elements, own bucket), at DP `dp`: (buckets as (start, end of its last parameter, padded
    end), where the parameters lie (`_walk`'s spans), or [] when not `every_param`). Not `padded`: the layout
    without the distributed optimizer (`_compute_default_per_buffer_param_layout`: nothing aligned or padded, no
    bucket of its own for a tied table)."""
    div, align = (math.lcm(dp, BUCKET_END_ALIGN), PARAM_START_ALIGN) if padded else (1, 1)
    closed, spans = [], ([] if every_param else None)
    state = _EMPTY
    for tensors, repeat in segments:
        if not padded:
            tensors = tuple((n, False) for n, _ in tensors)
        state = _walk(state, tensors, repeat, div, bucket_size, closed, spans, align)
    _finish(state, div, closed)
    return closed, spans or []


def _aligned_shard(bucket: tuple, dp: int) -> int:
    """The busiest DP rank's parameter elements in a bucket without gaps between its parameters: its padding is
    at its end, so rank 0's piece holds the most."""
    bs, end, be = bucket
    return min(end - bs, (be - bs) // dp)


@lru_cache(maxsize=4096)
def _period(tensors: tuple) -> tuple:
    """(elements a repeat of `tensors` spans, its parameters' elements, each parameter's (offset, elements))."""
    offsets, at = [], 0
    for n, _ in tensors:
        offsets.append((at, n))
        at += _ceil(n, PARAM_START_ALIGN)
    return at, sum(n for n, _ in tensors), tuple(offsets)


def _elements_before(tensors: tuple, x: int) -> int:
    """Parameters' elements in the first `x` elements of repeats of `tensors` laid out from an aligned start."""
    step, per, offsets = _period(tensors)
    q, rem = divmod(x, step)
    return q * per + sum(min(max(rem - o, 0), n) for o, n in offsets)


def _busiest_shard(buckets, spans, dp: int) -> int:
    """Parameters' elements in the busiest DP rank's pieces: rank r owns [start + r S, start + (r+1) S) of every
    bucket, S = its padded size / DP."""
    owned = [0] * dp
    b = 0
    for ps, pe, run in spans:
        while ps >= buckets[b][2]:
            b += 1
        bs, _, be = buckets[b]
        size = (be - bs) // dp
        for r in range((ps - bs) // size, (pe - 1 - bs) // size + 1):
            lo, hi = max(ps, bs + r * size), min(pe, bs + (r + 1) * size)
            owned[r] += hi - lo if run is None else _elements_before(run, hi - ps) - _elements_before(run, lo - ps)
    return max(owned)


@lru_cache(maxsize=4096)
def _layout_tensors(model: ModelSpec, tp: int, first: bool, last: bool) -> tuple:
    """stage_tensors in layout order, the reverse of named_parameters(): (what the first stage adds, one layer,
    what the last stage adds, the elements of the first and the last stage's additions, of one layer, whether every
    tensor is a multiple of 64 elements)."""
    pre, layer, post = stage_tensors(model, tp, first, last)
    return (pre[::-1], layer[::-1], post[::-1], sum(n for n, _ in pre + post), sum(n for n, _ in layer),
            all(n % PARAM_START_ALIGN == 0 for n, _ in pre + layer + post))


@lru_cache(maxsize=65536)     # pure; every memory reading of a stage asks for its layer count's buffer
def stage_buffer(model: ModelSpec, tp: int, dp: int, layers: int, first: bool, last: bool,
                 distributed_optimizer: bool, overlap_grad_reduce: bool) -> StageBuffer:
    """The elements of one rank's DDP buffer for a stage of `layers` layers under the mesh's settings (module
    docstring)."""
    if not distributed_optimizer:          # nothing padded, nothing sharded
        _, _, _, fixed, per_layer, _ = _layout_tensors(model, tp, first, last)
        params = fixed + layers * per_layer
        return StageBuffer(params, params, params, params)
    return padded_buffer(model, tp, dp, layers, first, last, stage_bucket_size(dp, first, overlap_grad_reduce))


def padded_buffer(model: ModelSpec, tp: int, dp: int, layers: int, first: bool, last: bool,
                  bucket_size: int | None) -> StageBuffer:
    """The distributed optimizer's buffer of a stage of `layers` layers at DP `dp`, cut into buckets of
    `bucket_size` elements (None: one bucket)."""
    pre, layer, post, fixed, per_layer, aligned = _layout_tensors(model, tp, first, last)
    params = fixed + layers * per_layer
    segments = ((post, 1), (layer, layers), (pre, 1))
    if not aligned:
        buckets, spans = buffer_layout(segments, dp, bucket_size, every_param=dp > 1)
        padded = buckets[-1][2] if buckets else 0
        return StageBuffer(params, padded, padded, params if dp == 1 else _busiest_shard(buckets, spans, dp))
    # every parameter a multiple of 64 elements (every real width): no gap between parameters
    if bucket_size is None:
        buckets, _ = buffer_layout(segments, dp, None, every_param=False)
        padded = buckets[-1][2] if buckets else 0
        return StageBuffer(params, padded, padded, sum(_aligned_shard(b, dp) for b in buckets))
    walk = _layer_buckets(model, tp, dp, first, last, bucket_size, True)
    state, before = walk.after(layers)
    closed = list(before)
    _finish(_walk(state, pre, 1, walk.div, bucket_size, closed, None), walk.div, closed)
    padded = closed[-1][2] if closed else 0
    return StageBuffer(params, padded, padded, sum(_aligned_shard(b, dp) for b in closed))


class _LayerBuckets:
    """The buckets closed while laying out what the last stage adds and k layers, and the layout's state then, for
    the k asked so far (buffer_layout's walk, padded or not): the layout of n layers continues that of the nearest
    k < n asked before (the layers come before the first stage's tables), so a search asking about many layer
    counts of a first stage walks each bucket once. stage_buffer and stage_buckets share it."""

    def __init__(self, post: tuple, layer: tuple, dp: int, bucket_size: int | None, padded: bool):
        if not padded:
            post, layer = (tuple((n, False) for n, _ in ts) for ts in (post, layer))
        self.layer, self.bucket_size = layer, bucket_size
        self.div, self.align = (math.lcm(dp, BUCKET_END_ALIGN), PARAM_START_ALIGN) if padded else (1, 1)
        closed: list = []
        state = _walk(_EMPTY, post, 1, self.div, bucket_size, closed, None, self.align)
        self.known = [0]
        self.steps = {0: (state, tuple(closed))}

    def after(self, layers: int) -> tuple:
        got = self.steps.get(layers)
        if got is None:
            k = self.known[bisect.bisect_right(self.known, layers) - 1]
            state, before = self.steps[k]
            closed = list(before)
            state = _walk(state, self.layer, layers - k, self.div, self.bucket_size, closed, None, self.align)
            got = self.steps[layers] = (state, tuple(closed))
            bisect.insort(self.known, layers)
        return got


@lru_cache(maxsize=4096)
def _layer_buckets(model: ModelSpec, tp: int, dp: int, first: bool, last: bool, bucket_size: int | None,
                   padded: bool) -> _LayerBuckets:
    _, layer, post, *_ = _layout_tensors(model, tp, first, last)
    return _LayerBuckets(post, layer, dp, bucket_size, padded)


@lru_cache(maxsize=65536)     # pure; the search's iteration tail asks for every stage it prices
def stage_buckets(model: ModelSpec, tp: int, dp: int, layers: int, first: bool, last: bool,
                  distributed_optimizer: bool, overlap_grad_reduce: bool) -> tuple[tuple[int, float], ...]:
    """The buckets of one rank's DDP buffer for a stage, in layout order, as (elements its collective moves, the
    share of the stage's backward done once the bucket's gradients are all produced). Layout order is the order
    Megatron-Core starts their gradient reductions (each bucket its own group, partition_buckets; a group's
    reduction starts once the last micro-batch's backward has produced all its gradients, register_grad_ready,
    and the layout follows the backward) and the reverse of the order the next forward all-gathers their
    parameters (finish_param_sync dispatches `next_param_gather_bucket_group`, the bucket before it). The last
    bucket holds the stage's first layers, or on a first stage whose tied table is a bucket of its own, the table.
    The share counts the parameters' elements up to the bucket's end, the input tables' lookups (the first
    stage's additions, at the layout's end) as no work, a whole pipeline's tied output layer as done first: how
    the plan splits a stage's time among its buckets."""
    pre, _, _, fixed, per_layer, _ = _layout_tensors(model, tp, first, last)
    walk = _layer_buckets(model, tp, dp, first, last, stage_bucket_size(dp, first, overlap_grad_reduce),
                          distributed_optimizer)
    state, closed = walk.after(layers)
    buckets = list(closed)
    tail = pre if distributed_optimizer else tuple((n, False) for n, _ in pre)
    _finish(_walk(state, tail, 1, walk.div, walk.bucket_size, buckets, None, walk.align), walk.div, buckets)
    # a whole pipeline's tied table is its output layer too, whose backward runs first: work done before every
    # bucket's gradients, though its elements lie at the layout's end with the lookup's
    head = pre[-1][0] if first and last and model.tie_embeddings and model.output_layer else 0
    work = fixed + layers * per_layer - sum(n for n, _ in pre) + head
    out, padding = [], 0
    for start, end, padded_end in buckets:
        done = end - padding + head    # the parameters' elements up to the bucket's end (64-element gaps aside)
        out.append((padded_end - start, min(1.0, done / work) if work > 0 else 1.0))
        padding += padded_end - end
    return tuple(out)
