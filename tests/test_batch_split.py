"""plan/batch_split.py: the global batch split across pipelines by speed, against hand-computed splits and an
exhaustive search over every split."""
import itertools

import pytest

from hetauto_megatron.errors import InputError
from hetauto_megatron.plan.batch_split import split_batch


def test_equal_pipelines_split_evenly():
    assert split_batch(1024, [8, 8], [1.0, 1.0]) == [512, 512]


def test_proportional_to_throughput():
    # pipeline 0 trains a sample in 1 s, pipeline 1 in 2 s: 8 and 4 samples both take 8 s
    assert split_batch(12, [1, 1], [1.0, 2.0]) == [8, 4]
    # three pipelines, 1 : 2 : 4 samples per second, steps 2, 4, 8: 4 + 8 + 16 samples all take 4 s
    assert split_batch(28, [2, 4, 8], [1.0, 0.5, 0.25]) == [4, 8, 16]


def test_rounding_to_steps_minimises_the_slowest_pipeline():
    # ideal 75 / 25; in steps of 10: 70/30 takes max(70, 90) = 90 s, 80/20 takes max(80, 60) = 80 s
    assert split_batch(100, [10, 10], [1.0, 3.0]) == [80, 20]
    # steps 4 and 2, equal speed: 4/6 takes 6 s, 8/2 takes 8 s
    assert split_batch(10, [4, 2], [1.0, 1.0]) == [4, 6]
    # a pipeline far slower still gets its one step: every pipeline trains
    assert split_batch(16, [4, 4], [1.0, 100.0]) == [12, 4]


def test_exact_sum_against_exhaustive_search():
    cases = [(48, [4, 6, 2], [0.3, 0.2, 1.1]), (60, [6, 4], [0.7, 0.2]), (30, [3, 5, 2], [1.0, 1.0, 1.0]),
             (1024, [16, 24], [0.4, 0.25])]
    for gbs, steps, secs in cases:
        got = split_batch(gbs, steps, secs)
        assert sum(got) == gbs and all(g % s == 0 and g >= s for g, s in zip(got, steps))
        best = min(max(n * s * t for n, s, t in zip(ns, steps, secs))
                   for ns in itertools.product(*[range(1, gbs // s + 1) for s in steps])
                   if sum(n * s for n, s in zip(ns, steps)) == gbs)
        assert max(g * t for g, t in zip(got, secs)) == pytest.approx(best)


def test_a_million_sequences_split_as_the_exhaustive_search_does():
    """The least feasible iteration time is found by a binary search per pipeline over its step counts, not over
    every candidate time sorted (two million of them here, a tenth of a second per split, many splits per
    search): against every count of the first pipeline, the second taking the rest."""
    gbs, steps, secs = 1_000_000, [8, 12], [0.3, 0.5]
    got = split_batch(gbs, steps, secs)
    assert sum(got) == gbs and all(g % s == 0 and g >= s for g, s in zip(got, steps))
    best = min(max(n * steps[0] * secs[0], (gbs - n * steps[0]) * secs[1]) for n in range(1, gbs // steps[0])
               if (gbs - n * steps[0]) % steps[1] == 0)
    assert max(g * t for g, t in zip(got, secs)) == pytest.approx(best, rel=1e-12)


def test_impossible_splits_are_input_errors():
    with pytest.raises(InputError) as exc:
        split_batch(15, [4, 6], [1.0, 1.0])   # 4a + 6b is even
    assert exc.value.field == "global_batch_size" and "14 or 16" in exc.value.fix
    with pytest.raises(InputError, match="smaller than one micro-batch step"):
        split_batch(8, [8, 8], [1.0, 1.0])
