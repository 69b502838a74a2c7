"""Megatron's 1F1B calls as the simulation needs them: which receive a blocking transfer waits for (pure functions).

gloo, and NCCL for large messages, move a message only once its receive is posted (rendezvous). A blocking
transfer therefore starts when the sender has posted its send, the receiver its receive and the link direction
is free. Megatron-Core's forward_backward_pipelining_without_interleaving posts a stage's receive when the stage
reaches the call that holds it:

- paired calls, the steady state's send_forward_recv_backward and send_backward_recv_forward: the receive of
  the forward of micro-batch j > w (w: the stage's warm-up forwards) is posted with the send of the backward
  before it, and the receive of the backward of i < m - w with the send of the forward before it, as soon as
  that compute ends;
- unpaired calls: the warm-up's and the loop's first recv_forward (forwards j <= w) and the cool-down's
  recv_backward (backwards i >= m - w) are posted once the call before them has returned, i.e. once the
  stage's previous operation and the blocking send that holds it are done.

(Overlapped boundaries post their receives ahead, runtime/cross_link.py: there a transfer starts when it is sent.)

`call_walk` orders the simulation's steps, the computes and the blocking transfers apart, so that every step's
inputs are known before it: a blocking transfer comes after its sender's compute and its receiver's post, and the
sender's next compute after the transfer. Two paired calls of neighbours wait for each other's transfers (each
holds the send the other receives), which is why a compute and its transfer are separate steps.
"""
from __future__ import annotations

# step codes of `call_walk`
COMPUTE_F, COMPUTE_B, SEND_F, SEND_B = 0, 1, 2, 3


def op_at(k: int, m: int, w: int) -> tuple[bool, int]:
    """A stage's operation number k of its 2m in 1F1B order: (is forward, micro-batch)."""
    if k < w:
        return True, k
    if k < 2 * m - w:
        q, odd = divmod(k - w, 2)
        return (False, q) if odd else (True, w + q)
    return False, k - m


def index_of(fw: bool, j: int, m: int, w: int) -> int:
    """The position of forward (fw) or backward j in a stage's 1F1B order (`op_at`'s inverse)."""
    if fw:
        return j if j < w else w + 2 * (j - w)
    return w + 2 * j + 1 if j < m - w else m + j


def paired(fw: bool, j: int, m: int, w: int) -> bool:
    """Whether the receive of forward (fw) or backward j, at a stage with w warm-up forwards, is posted with the
    send of the stage's previous operation (a paired call: at that compute's end) rather than after it returned."""
    return j > w if fw else j < m - w


def call_walk(p: int, m: int, warm: tuple, blocking: tuple, done=None):
    """Every step not yet done, in an order in which each step's inputs come first: (stage, code, micro-batch,
    paired) with code COMPUTE_F / COMPUTE_B (a compute; its transfer too where the boundary is overlapped) or
    SEND_F / SEND_B (the blocking transfer of the stage's last compute; `paired`: how the receiver posted, see
    `paired`). Each stage keeps its 1F1B order, and so each link direction its micro-batch order. A stage goes
    on until it waits for a neighbour; the neighbours of a stage that moved are looked at again.
    done: the state after the steps already run, per stage (operations computed, forward inputs arrived,
    backward inputs arrived), every operation computed then also returned; default none."""
    last = p - 1
    n = 2 * m
    if done:
        comp, got_f, got_b = (list(x) for x in done)
    else:
        comp, got_f, got_b = [0] * p, [0] * p, [0] * p
    ret = list(comp)                    # operations returned (a blocking send holds its stage until it arrived)
    todo = list(range(last, -1, -1))
    while todo:
        i = todo.pop()
        moved = False
        while True:
            k = comp[i]
            if ret[i] < k:              # held by the blocking send of operation k - 1
                fw, j = op_at(k - 1, m, warm[i])
                r = i + 1 if fw else i - 1
                kr = index_of(fw, j, m, warm[r])
                pair = paired(fw, j, m, warm[r])
                if (comp[r] if pair else ret[r]) < kr:
                    break               # the receiver has not posted its receive yet
                yield i, SEND_F if fw else SEND_B, j, pair
                ret[i] = k
                if fw:
                    got_f[r] += 1
                else:
                    got_b[r] += 1
                moved = True
                continue
            if k >= n:
                break
            fw, j = op_at(k, m, warm[i])
            if fw and i and got_f[i] <= j:
                break
            if not fw and i < last and got_b[i] <= j:
                break
            yield i, COMPUTE_F if fw else COMPUTE_B, j, False
            comp[i] = k + 1
            moved = True
            if fw and i < last:
                if not blocking[i]:
                    ret[i] = k + 1
                    got_f[i + 1] += 1
            elif not fw and i:
                if not blocking[i - 1]:
                    ret[i] = k + 1
                    got_b[i - 1] += 1
            else:
                ret[i] = k + 1
        if moved:
            todo.extend(s for s in (i - 1, i + 1) if 0 <= s <= last)
