"""What each stage of a 1F1B pipeline holds beyond one micro-batch's activations: the micro-batches in flight
and, at an overlapped cross-cluster boundary, the messages (and their pieces, and on CPU processes the sends)
each side keeps. Apart from plan/pipeline.py, which times the schedule: these terms price memory, read by the
memory model's callers (simulate, the evaluator, a plan's layout). Pure functions.
"""
from __future__ import annotations

from .pipeline import warmup_counts


def memory_terms(p: int, m: int, blocking, depth, staged=None) -> tuple[list, list]:
    """(in-flight micro-batches, boundary buffers) per stage, what the memory model prices and the dry run
    predicts. 1F1B holds w_i + 1 micro-batches on stage i (its warm-up forwards and the one it runs); an overlapped
    boundary of depth d adds the messages its sides hold received ahead at their peaks (`boundary_buffers`):
    min(d + 2, m) gradients on the side before it (one fewer where it recomputes); on the side after it the
    activations ahead of its input, min(d + 1, m - its in-flight micro-batches); on CPU processes their sends in
    flight too (`side_buffers`).
    `p`: stages; `blocking`, `depth`: per boundary; `staged`: per boundary (or None), what its sides hold
    besides (plan/staged_pieces.py `BoundarySides`: received pieces and sends in flight where a side runs on CPU),
    priced by `side_buffers`."""
    in_flight = [min(w + 1, m) for w in warmup_counts(p, m, depth)]
    buffers = [0] * p
    for l, (blk, d) in enumerate(zip(blocking, depth)):
        if not blk:
            sides = staged[l] if staged is not None else None
            buffers[l] += side_buffers(d, m, sides)
            buffers[l + 1] += side_buffers(d, m, sides, in_flight[l + 1])
    return in_flight, buffers


def boundary_buffers(d: int, m: int, in_flight: int | None = None) -> int:
    """Boundary tensors a side of an overlapped boundary of depth d holds at its peak beyond its activations, in a
    step of m micro-batches: the messages it receives (runtime/cross_link.py `CrossLink.receive`), each posted
    ahead into a buffer of its own until the stage takes it. The link keeps d + 1 messages posted ahead (no more
    than the step has left) and, while it takes one, posts the next: d + 2 held at once.
    The side receiving gradients (`in_flight` None: the stage before the boundary) posts its first d + 1 as it
    sends its first activation across (runtime/communicator.py `_gradients_ahead`), held through a warm-up whose
    activations only grow, takes its first gradient right after a forward, its activations at their peak, and the
    one taken is no activation of its own: min(d + 2, m)
    (a step has only m messages: the dry run's sender measured min(d + 2, m), depth 3 over 3 micro-batches held 3,
    not the 5 priced).
    The side receiving activations (`in_flight`: the micro-batches the stage holds at its peak, memory_terms')
    holds fewer. The message it takes is its input, the very storage its first layer (or a head-only stage's
    final norm) keeps, which its activations price already; and it reaches its peak right after the forward of
    its in_flight-th message, when min(d + 1, m - in_flight) are left ahead (each take before it trades one
    message ahead for a micro-batch's activations, which hold at least that input). Priced min(d + 2, m), the
    dry run measured one boundary tensor less on a head-only last stage at depths 0 to 3 over 1 to 6
    micro-batches, TP 1 and 2, with and without sequence parallelism, DP 1 and 2 (+8.9 % to +16.5 % of its
    activations), and m - in_flight less on the first stage of a receiving mesh of several stages
    (min(d + 1, m - 1) was one tensor over at depth 2 over 4 micro-batches with 2 in flight, two at depth 1 over
    3 with 3 in flight)."""
    if in_flight is None:
        return min(d + 2, m)
    return max(0, min(d + 1, m - in_flight))


def side_buffers(d: int, m: int, sides=None, in_flight: int | None = None) -> float:
    """Boundary tensors one side of an overlapped boundary of depth d holds at its peak beyond its activations, in
    a step of m micro-batches: the messages it holds received (`boundary_buffers`), the pieces they landed in
    (below) and, on CPU processes, its sends in flight. `sides`: the boundary's
    plan/staged_pieces.py `BoundarySides` (None: none of these extras); `in_flight`: None on the side before the
    boundary (it receives gradients), else the micro-batches the side after holds at its peak.

    Sends: the link completes an overlapped send late (runtime/cross_link.py: gloo reports a send complete only
    once it is waited for, so a link keeps its last d + 2 sends, the oldest waited for when a newer one would make
    d + 3), and on CPU each keeps the blocks it sends, one boundary tensor per message (the stage's output or
    input gradient, which Megatron's schedule has let go, or contiguous copies of parts of it). The side before
    has sent min(d + 2, m) activations by its peak (its warm-up forwards are at least d + 1). The side after
    sends gradients, one per backward: at its j-th backward it holds min(d + 2, j) sends and min(d + 1,
    m - in_flight - j) activations ahead, at the same activations, so a send replaces a message ahead until the
    d + 1 ahead run out: min(m - in_flight, 2d + 3) tensors at most. Pieces (plan/staged_pieces.py): every message
    held keeps its pieces, `share` of a tensor each; the taken one's are gone once copied into the stage's input
    (the dry run measured d + 2 messages' pieces on an embedding-only stage receiving gradients, and d + 1 on a
    head-only stage receiving activations).

    The taken gradient: the side before counts the gradient it takes among the messages it holds (the link
    posts the next while it takes one) only where nothing larger forms after it. Under recomputation ('selective',
    'full') its backward pass rebuilds a layer's (or an MLP's) activations, more than a boundary tensor, while the
    taken gradient is that backward's input, which no stage's activations count (a blocking boundary's neither):
    its peak is there, with the d + 1 messages still ahead. The dry run measured one tensor below min(d + 2, m)
    on a TP 1 x DP 2 full-recomputation first stage (depth 0, 2 micro-batches: +2.9 % of its activations) and a
    DP 2 selective middle stage (depth 1, 3 micro-batches: +1.2 %). (A stage set to recompute but holding no
    layer rebuilds nothing; it is priced as recomputing, one tensor low.)"""
    if in_flight is None:
        held = boundary_buffers(d, m) - (1 if sides is not None and sides.before_recomputes else 0)
        if sides is None:
            return held
        return held + sides.grad_share * held + (min(d + 2, m) if sides.before_sends else 0)
    ahead = boundary_buffers(d, m, in_flight)
    if sides is None:
        return ahead
    sends = max(0, min(m - in_flight, 2 * d + 3) - ahead) if sides.after_sends else 0
    return ahead + sides.act_share * ahead + sends
