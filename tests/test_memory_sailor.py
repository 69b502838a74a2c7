"""Peak memory per GPU predicted for Sailor's measured GH200 runs against what the GPUs held
(benchmarks/memory_sailor.py prints the table). The memory model is configured to the job as its framework runs it
(plan/memory_fit.py sailor_deepspeed_job: fp32, Adam state on every rank, no sequence parallelism, unfused attention
without dropout on the probabilities, DeepSpeed's 8 bytes per parameter) with our NVIDIA runtime overheads; nothing
is fitted to the runs."""
import os
import statistics
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import memory_sailor as M  # noqa: E402


@pytest.fixture(scope="module")
def job():
    runs = M.load_runs()
    return runs, M.ratios(runs)[M.JOB]


def _mape(rows):
    return 100 * statistics.mean(abs(x - 1) for _, x in rows)


def test_every_run_whose_layout_holds_its_model_is_compared(job):
    runs, rows = job
    assert len(rows) == sum(M.layout_holds_model(r) for r in runs) >= len(runs) - 1


def test_peak_memory_within_10_percent_at_every_micro_batch_size(job):
    """MAPE within 10 % at micro-batch 1-2 (parameter and optimizer state dominate) and 4-8 (activations
    dominate) alike: a mean over the runs, not a bound on each (benchmarks/memory_sailor.py prints every run; a
    few miss 10 % on their own, the worst GPT-Neo-2.7 at 8 nodes x 2). The per-stage 10 % bound is on the CPU dry
    runs, whose every tensor is measured (test_memory_dryrun.py); Sailor's own simulator reaches 5.9 % MAPE here
    (the strict xfail below)."""
    _, rows = job
    for sel in (lambda r: r["micro_batch_size"] <= 2, lambda r: r["micro_batch_size"] >= 4):
        part = [(r, x) for r, x in rows if sel(r)]
        assert len(part) >= 5
        assert _mape(part) <= 10.0


@pytest.mark.xfail(strict=True, reason="MAPE measured 6.3 % over 26 runs (6.2 % while GPT-Neo was given an output layer the fork does not build and OPT-350 a tied one; 6.3 % before DeepSpeed's pipe buffers were counted); Sailor's own simulator reaches 5.9 %")
def test_peak_memory_reaches_sailors_simulator(job):
    assert _mape(job[1]) <= 5.9
