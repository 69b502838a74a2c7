"""DeepSpeed's pipeline engine schedule (plan/deepspeed_schedule.py) against hand computations from its rules: the
same order of forwards and backwards as 1F1B, every transfer holding both its ends. Its check against measured runs
is tests/test_sailor_iterations.py (Sailor's GH200 runs ran this engine)."""
import random

import pytest

from hetauto_megatron.plan.deepspeed_schedule import (BACKWARD, FORWARD, simulate_deepspeed, train_schedule)
from hetauto_megatron.plan.pipeline import simulate_1f1b


def test_each_stage_runs_the_1f1b_order_of_forwards_and_backwards():
    """Stage s of p: min(p - s, m) forwards first, then one backward and one forward by turns, then the rest of the
    backwards (the non-interleaved 1F1B order), every micro-batch once each way."""
    for p in (1, 2, 3, 4, 8):
        for m in (1, 2, 3, 5, 16):
            for s in range(p):
                comp = [(k, mb) for k, mb in train_schedule(m, p, s) if k in (FORWARD, BACKWARD)]
                warm = min(p - s, m)
                expect = [(FORWARD, j) for j in range(warm)]
                for j in range(m):
                    expect.append((BACKWARD, j))
                    if warm + j < m:
                        expect.append((FORWARD, warm + j))
                assert comp == expect, (p, m, s)


def test_with_instant_transfers_the_makespan_is_1f1b_s():
    """Zero-time transfers: only the order of the computations remains, the same as 1F1B's."""
    rng = random.Random(7)
    for _ in range(60):
        p, m = rng.randint(1, 6), rng.randint(1, 12)
        f = [rng.uniform(0.5, 2.0) for _ in range(p)]
        b = [rng.uniform(1.0, 4.0) for _ in range(p)]
        got, busy = simulate_deepspeed(f, b, [0.0] * (p - 1), m)
        assert got == pytest.approx(simulate_1f1b(f, b, [0.0] * (p - 1), m).makespan)
        assert busy == pytest.approx([m * (x + y) for x, y in zip(f, b)])


def test_every_transfer_holds_both_stages():
    """Equal stages (forward 1, backward 2) joined by transfers of x: in the steady state a two-stage pipeline's
    period is f + b + 2x (each stage runs two transfers per micro-batch), a middle stage's f + b + 4x (four). One
    micro-batch: the forwards, the backwards and the 2 (p - 1) transfers one after the other."""
    x = 0.25
    for p, per in ((2, 3 + 2 * x), (4, 3 + 4 * x)):
        t = [simulate_deepspeed([1.0] * p, [2.0] * p, [x] * (p - 1), m)[0] for m in (40, 41)]
        assert t[1] - t[0] == pytest.approx(per)
        assert simulate_deepspeed([1.0] * p, [2.0] * p, [x] * (p - 1), 1)[0] == pytest.approx(3 * p + 2 * (p - 1) * x)


@pytest.mark.parametrize("m, p", [(1, 1), (1, 2), (3, 2), (4, 3), (8, 4), (2, 5), (7, 6)])
def test_the_instruction_lists_are_deepspeeds_own(m, p):
    """Each stage's instructions, in their order, as DeepSpeed 0.19.8's own TrainSchedule yields them (its
    transfers, forward and backward passes; loads, reductions and the optimizer step left out). The order was
    documented and simulated the other way round inside a step (a receive before the send)."""
    from deepspeed.runtime.pipe import schedule as ds

    from hetauto_megatron.plan.deepspeed_schedule import RECV_ACT, RECV_GRAD, SEND_ACT, SEND_GRAD
    kinds = {ds.SendGrad: SEND_GRAD, ds.RecvActivation: RECV_ACT, ds.RecvGrad: RECV_GRAD,
             ds.SendActivation: SEND_ACT, ds.ForwardPass: FORWARD, ds.BackwardPass: BACKWARD}
    for s in range(p):
        sched = ds.TrainSchedule(micro_batches=m, stages=p, stage_id=s)
        theirs = [kinds[type(c)] for step in sched.steps() for c in step if type(c) in kinds]
        assert [k for k, _ in train_schedule(m, p, s)] == theirs, (m, p, s)
