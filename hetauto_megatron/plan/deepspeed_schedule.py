"""The pipeline as DeepSpeed's pipeline engine runs it: its `TrainSchedule`, each transfer blocking both its ends.

DeepSpeed's engine (`deepspeed.runtime.pipe.schedule.TrainSchedule`, which `PipelineEngine.train_batch` executes
instruction by instruction) runs a lock-step schedule of 2 (m + p - 1) steps: at every step a stage runs one
forward or one backward (or nothing), and it exchanges with its neighbours as separate instructions, in this order:

    forward step:   SendGrad(the previous step's micro-batch), RecvActivation(this micro-batch), ForwardPass
    backward step:  RecvGrad(this micro-batch), SendActivation(the previous step's micro-batch), BackwardPass

(the first and the last stage have no neighbour on one side). Each instruction is one NCCL point-to-point transfer
of several MB, waited for before the next instruction: the sender's and the receiver's streams both wait until it
has been received, so a send and its receive start together, when both stages have reached them, and both stages
are held for the whole transfer. A middle stage therefore runs four transfers one after the other per micro-batch
(send the gradient, receive the activation, receive the gradient, send the activation), none overlapped with its
compute or with each other, where Megatron's 1F1B (plan/pipeline.py) holds only the sender and pairs each send with
the receive the stage needs next. With transfers of zero time the two schedules give the same makespan (the order
of the forwards and backwards is the same); each transfer's time is what differs: in a pipeline of equal stages
the period per micro-batch is forward + backward + 2 x transfer for two stages and + 4 x transfer for a middle
stage of more.

`simulate_deepspeed` plays every instruction of every stage with those rules (no extrapolation); the makespan is
when the last stage finishes its last instruction.

What each transfer carries (DeepSpeed 0.19.8, read in its source: docs/deepspeed.md, "What DeepSpeed's engine sends
between stages"). With TP 1 a send is the stage's whole activation (or its gradient) in the element it computes
in: `link_costs.boundary_transfer_time`, as for Megatron. With TP > 1 (a topology with a model axis) the engine
partitions both by default (`pipe_partitioned`, `grad_partitioned`): each TP rank sends a small int64 meta tensor
and then its 1/TP slice of the flattened tensor, in the tensor's own element type, to its counterpart, and the
receiving stage rebuilds the whole tensor with an all-gather over its TP ranks: the activation's in its
ForwardPass, and in its BackwardPass the gradient's plus one of its own output, whose data it dropped when it
sent the slices. `deepspeed_transfer_time` prices the send (the meta message, then 1/TP of the activation on
the boundary's link), `partition_gather_time` one such all-gather (on the stage's node link, where the TP
all-reduces run) and `partitioned_passes` adds the gathers to the passes that run them. Sailor's measured
GH200 runs ran this engine (benchmarks/sailor_iterations.py, docs/cost-model-learned.md).
"""
from __future__ import annotations

import heapq

from ..cost import comm
from ..spec.model import ModelSpec
from . import link_costs
from .pipeline import Event, estimate_1f1b
from .shared_uplinks import Uplinks, contended, with_waits

FORWARD, BACKWARD, SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD = range(6)


def train_schedule(m: int, p: int, s: int) -> list[tuple[int, int]]:
    """Stage s's instructions (kind, micro-batch) in DeepSpeed's TrainSchedule order, m micro-batches, p stages."""
    out: list[tuple[int, int]] = []
    prev = -1
    for step in range(2 * (m + p - 1)):
        forward = step % 2 == s % 2
        if forward:
            mb = (step if step % 2 == 0 else step - 1) // 2 - s // 2
        elif step % 2 == 0:
            mb = step // 2 - p + (s + 1) // 2
        else:
            mb = (step - 1) // 2 - p + 1 + s // 2
        valid, prev_valid = 0 <= mb < m, 0 <= prev < m
        if forward and s > 0:
            if prev_valid:
                out.append((SEND_GRAD, prev))
            if valid:
                out.append((RECV_ACT, mb))
        elif not forward and s < p - 1:
            if valid:
                out.append((RECV_GRAD, mb))
            if prev_valid:
                out.append((SEND_ACT, prev))
        if valid:
            out.append((FORWARD if forward else BACKWARD, mb))
        prev = mb
    return out


def _meeting(kind: int, s: int, mb: int) -> tuple[str, int, int]:
    """The key a send and its receive share: direction, boundary (the lower stage), micro-batch."""
    if kind in (SEND_ACT, RECV_ACT):
        return "act", s if kind == SEND_ACT else s - 1, mb
    return "grad", s - 1 if kind == SEND_GRAD else s, mb


def simulate_deepspeed(fwd: list[float], bwd: list[float], link: list[float], m: int,
                       uplinks=None, events: list | None = None) -> tuple[float, list[float]]:
    """(makespan, busy seconds per stage) of DeepSpeed's TrainSchedule. fwd[i], bwd[i]: one micro-batch's compute
    on stage i; link[l]: one micro-batch's transfer between stage l and l + 1 (latency included; the same time
    each way); uplinks[l]: the shared uplink directions its transfers cross (plan/shared_uplinks.py; on a
    contended one a transfer starts when both stages have reached it and the direction is free, and holds it for
    its seconds on it). `events`: a list that gets every operation as a pipeline.Event (for timelines): F and B
    on the stages, each transfer on its link and on both its stages, which it holds ("send" on the sender,
    "recv" on the receiver)."""
    p = len(fwd)
    assert len(bwd) == p and len(link) == p - 1 and m >= 1
    uplinks = contended(uplinks, link)      # (its link times: latency included)
    ups = Uplinks() if uplinks else None
    prog = [train_schedule(m, p, s) for s in range(p)]
    pc = [0] * p
    clock = [0.0] * p
    waiting: dict[tuple, tuple[int, float]] = {}    # meeting -> (stage that reached it first, when)
    met: list = []          # heap of transfers both stages have reached: (start, boundary, direction, mb, stages)

    def run(s: int) -> None:
        """Stage s's instructions until it reaches a transfer."""
        while pc[s] < len(prog[s]):
            kind, mb = prog[s][pc[s]]
            if kind in (FORWARD, BACKWARD):
                t = fwd[s] if kind == FORWARD else bwd[s]
                if events is not None:
                    events.append(Event(("stage", s), "F" if kind == FORWARD else "B", mb, clock[s], clock[s] + t))
                clock[s] += t
                pc[s] += 1
                continue
            key = _meeting(kind, s, mb)
            other = waiting.pop(key, None)
            if other is None:
                waiting[key] = (s, clock[s])     # this stage waits for its neighbour to reach the same transfer
            else:
                heapq.heappush(met, (max(clock[s], other[1]), key[1], key[0], mb, s, other[0]))
            return

    for s in range(p):
        run(s)
    # The transfers in the order they start (the uplinks, where shared, are taken first come, first served).
    while met:
        start, l, way, mb, s, o = heapq.heappop(met)
        needs = uplinks[l][0 if way == "act" else 1] if uplinks and uplinks[l] else ()
        if needs:
            start = ups.book(needs, start)
        if events is not None:
            end = start + link[l]
            sender, receiver = (l, l + 1) if way == "act" else (l + 1, l)
            events += [Event(("link", l, "fwd" if way == "act" else "bwd"), "F" if way == "act" else "B", mb,
                             start, end, end),
                       Event(("stage", sender), "send", mb, start, end), Event(("stage", receiver), "recv", mb, start, end)]
        clock[s] = clock[o] = start + link[l]
        pc[s] += 1
        pc[o] += 1
        run(s)
        run(o)
    if any(pc[s] < len(prog[s]) for s in range(p)):
        raise AssertionError("DeepSpeed schedule deadlocked: the instruction lists do not pair")
    busy = [m * (f + b) for f, b in zip(fwd, bwd)]
    return max(clock), busy


def deepspeed_links(link: list[float], uplinks=None) -> list[float]:
    """Boundary times for which Megatron's blocking 1F1B closed form (pipeline.estimate_1f1b with every boundary
    blocking) screens DeepSpeed's TrainSchedule: each link time twice. A DeepSpeed transfer holds both of its
    stages, so each boundary costs each neighbour a send and a receive per micro-batch and direction where 1F1B's
    blocking sender pays only its sends: in a pipeline of equal stages 1F1B's period is f + b + 2x per stage and
    DeepSpeed's f + b + 4x for a middle stage (f + b + 2x for two stages, whose shared cycle of two micro-batches
    1F1B prices at f + b + x). The search screens with it and re-ranks its best layouts with `simulate_deepspeed`.
    With `uplinks` (simulate_deepspeed's) each link time first takes its wait on the contended uplink directions
    (shared_uplinks.with_waits), as the simulation books them: on the link times themselves, not the doubled ones."""
    if uplinks:
        link = with_waits(link, contended(uplinks, link))
    return [2 * x for x in link]


def estimate_deepspeed(fwd, bwd, link, m: int, uplinks=None, **kw) -> float:
    """The search's screen of DeepSpeed's TrainSchedule: Megatron's closed form over `deepspeed_links`, without the
    rendezvous waits of Megatron's receives called on their own (the doubled link times already hold both
    stages). `kw`: estimate_1f1b's blocking and depth."""
    return estimate_1f1b(fwd, bwd, deepspeed_links(link, uplinks), m, rendezvous=False, **kw)


def _meta_bytes(tp: int) -> int:
    """PartitionedTensor.to_meta of an activation [micro, seq, hidden] over tp ranks: int64 [ndim, 3 sizes,
    tp, rank, the tp + 1 partition offsets]."""
    return 8 * (1 + 3 + 2 + tp + 1)


def deepspeed_transfer_time(model: ModelSpec, a, b, link, same_cluster: bool, samples_per_step: int) -> float:
    """One SendActivation / SendGrad of a micro-batch from stage profile a to b (DeepSpeed needs equal TP): with
    TP > 1 the meta tensor, a message of its own, then each TP rank's 1/TP slice (the whole step's activation
    still crosses a link between clusters once); with TP 1 the whole activation, as link_costs prices it."""
    if a.tp == 1:
        return link_costs.boundary_transfer_time(model, a, b, link, same_cluster, samples_per_step)
    return link.transfer_time(_meta_bytes(a.tp)) + link_costs.boundary_transfer_time(
        model, a, b, link, same_cluster, samples_per_step, partitions=a.tp)


def partition_gather_time(model: ModelSpec, prof) -> float:
    """PartitionedTensor.full of one micro-batch's activation (or gradient) on a stage of TP > 1: an all-gather
    of the whole tensor, in the stage's element, over its TP ranks on the link its TP collectives run on
    (costing.tp_collective_link); 0 with TP 1."""
    if prof.tp == 1:
        return 0.0
    nbytes = prof.cluster.device.dtype_bytes * prof.micro_batch_size * model.seq_length * model.hidden_size
    return comm.all_gather_time(nbytes, prof.tp, prof.tp_link or prof.cluster.intra_node)


def partitioned_passes(fwd: list[float], bwd: list[float], gather: list[float]) -> tuple[list[float], list[float]]:
    """(fwd, bwd) per stage with the all-gathers DeepSpeed's passes run (gather[i]: `partition_gather_time` of
    stage i): every forward but the first stage's gathers its received activation, every backward but the last
    stage's gathers its own output and the received gradient."""
    p = len(fwd)
    return ([f + (gather[i] if i > 0 else 0.0) for i, f in enumerate(fwd)],
            [b + (2 * gather[i] if i < p - 1 else 0.0) for i, b in enumerate(bwd)])
