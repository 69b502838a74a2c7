"""Whole iterations composed by the simulator with the learned model against Sailor's measured GH200 runs, each
model left out of the fit (benchmarks/sailor_iterations.py prints the table), the pipeline as DeepSpeed's engine
runs it (the fork's), in the job's precision (fp32 with TF32 GEMMs). The target is Sailor's own simulator's
error on the same runs (8.9 %)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import sailor_iterations as S  # noqa: E402


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    rows, skipped = S.whole_iterations(str(tmp_path_factory.mktemp("sailor-iterations")))
    return rows, skipped


def test_every_packaged_run_is_composed_with_the_learned_model(rows):
    rows, skipped = rows
    assert len(rows) + len(skipped) == len(S.load_runs())
    assert len(skipped) <= 1                      # only the record whose layout lists another model's entries
    assert all(x["cost_model"] == {"gh200": "learned"} for x in rows)


def test_whole_iteration_error_reaches_sailors_simulator(rows):
    """The job as it ran (fp32, GEMMs on TF32: 4-byte transfers, all-gathers and all-reduces): 7.0 % over the 26
    runs (OPT-350 7.7 %, GPT-Neo 6.1 %); 9.5 % while the plans were bf16 (docs/cost-model-learned.md)."""
    errs = [abs(S.error_pct(x)) for x in rows[0]]
    assert sum(errs) / len(errs) <= S.SAILOR_SIMULATOR_MAPE


def test_whole_iterations_at_micro_batch_4_to_8_within_10_percent(rows):
    """Where the layers' GPU work, not the host, sets their time (micro-batch size 4-8): target 10 %, the
    issue's per-pass target carried to the whole iteration."""
    errs = [abs(S.error_pct(x)) for x in rows[0] if x["run"]["micro_batch_size"] >= 4]
    assert len(errs) >= 10
    assert sum(errs) / len(errs) <= 10.0
