"""The DP tail's bucket terms (plan/bucket_exposure.py, cost/ddp_buffer.py stage_buckets) against what they stand
for: the exposures against the collectives' schedule played out event by event (the reductions issued one after
the other as the buckets' gradients are produced, the gathers chained through the forward pre-hooks), and the
share of a stage's backward done once a bucket's gradients are produced against the published FLOP count of the
work the backward ran by then (Narayanan et al. 2021: 24 h^2 + 4 s h per token and layer, 2 h V for the logits)."""
import random

from hetauto_megatron.cost.ddp_buffer import stage_buckets
from hetauto_megatron.plan.bucket_exposure import Buckets
from hetauto_megatron.spec.model import ModelSpec


def _played_out(elements, shares, reduce, bwd, gather, fwd):
    """(reduction still running after the backward, the gathers after the first one's waits), event by event."""
    w = [e / sum(elements) for e in elements]
    t = 0.0
    for wj, sj in zip(w, shares):           # each issued once its gradients exist, after the one before it
        t = max(t, bwd * sj) + reduce * wj
    work = [shares[0]] + [b - a for a, b in zip(shares, shares[1:])]
    waits = sum(max(0.0, gather * w[k] - fwd * work[k + 1]) for k in range(len(w) - 2, -1, -1))
    return t - bwd, waits


def test_exposures_are_the_schedule_played_out():
    rng = random.Random(7)
    for _ in range(3000):
        n = rng.randint(1, 7)
        elements = [rng.randint(1, 100) for _ in range(n)]
        shares = sorted(rng.random() for _ in range(n))
        shares[-1] = 1.0 if rng.random() < 0.7 else shares[-1]
        if n > 1 and rng.random() < 0.3:
            shares[-2] = shares[-1]              # a bucket of no work (a first stage's input table)
        times = [rng.random() * rng.choice((0.1, 1.0, 10.0)) for _ in range(4)]
        left, waits = _played_out(elements, shares, *times)
        b = Buckets(tuple(zip(elements, shares)))
        assert abs(b.reduce_left(times[0], times[1]) - left) < 1e-9
        assert abs(b.gather_chain(times[2], times[3]) - waits) < 1e-9


def test_a_whole_pipelines_tied_output_layer_is_backward_work_done_before_every_bucket():
    """One stage, tied table: the backward runs the output layer (the table's GEMM) first, then the layers from
    the last. The first bucket (the last 3 layers and the first layer's MLP down projection) is ready once 94 %
    of the FLOPs have run; priced without the output layer's work it was 83 %."""
    h, f, vocab, seq = 1024, 4096, 128_000, 1024
    model = ModelSpec(name="tied", num_layers=4, hidden_size=h, num_attention_heads=16, ffn_hidden_size=f,
                      vocab_size=vocab, seq_length=seq, gated_mlp=False, tie_embeddings=True)
    buckets = stage_buckets(model, 1, 2, 4, True, True, True, True)
    assert len(buckets) == 2
    layer, logits, down = 24 * h * h + 4 * seq * h, 2 * h * vocab, 2 * h * f
    published = (logits + 3 * layer + down) / (logits + 4 * layer)
    assert abs(buckets[0][1] - published) < 0.02, (buckets, published)
