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
    """The job as it ran (fp32, GEMMs on TF32: 4-byte transfers, all-gathers and all-reduces), the learned layers
    fitted in the same element size. Sailor's 8.9 % is its simulator's error on its OPT-350 runs, so those runs are
    held to it on their own (the GPT-Neo runs, predicted closer, must not average a miss away), and every run
    together to the same figure (docs/cost-model-learned.md: 5.8 % over the 26 runs, OPT-350 6.0 %, GPT-Neo 5.6 %)."""
    def mape(xs):
        errs = [abs(S.error_pct(x)) for x in xs]
        return sum(errs) / len(errs)
    opt = [x for x in rows[0] if x["run"]["model"].upper().startswith("OPT")]
    assert len(opt) >= 10, sorted({x["run"]["model"] for x in rows[0]})
    assert mape(opt) <= S.SAILOR_SIMULATOR_MAPE
    assert mape(rows[0]) <= S.SAILOR_SIMULATOR_MAPE


def test_whole_iterations_at_micro_batch_4_to_8_within_10_percent(rows):
    """Where the layers' GPU work, not the host, sets their time (micro-batch size 4-8): target 10 %, the
    issue's per-pass target carried to the whole iteration."""
    errs = [abs(S.error_pct(x)) for x in rows[0] if x["run"]["micro_batch_size"] >= 4]
    assert len(errs) >= 10
    assert sum(errs) / len(errs) <= 10.0


def test_fit_plan_and_memory_job_agree_in_element_size():
    """One element size for Sailor's jobs (cost/sailor_job.py: fp32, from their launch scripts): the fit sets each
    measured layer's TP all-reduces and softmax passes apart in it, the plans composing the measured runs move
    theirs in it, the learned model adds the softmax passes back in it, and the memory job holds it.

    The all-reduces set apart from a measured OPT-350M layer (GH200, TP 4, micro-batch 4) against a number derived
    by hand: its activation is 4 x 2,048 x 1,024 x 4 bytes (micro-batch x sequence x hidden x fp32) = 33,554,432
    bytes; Sailor's measured curve for 4 GH200s (data/sailor/intra_node_bandwidths.json, "GH-96" "4": GB/s =
    -0.75177369 x^2 + 26.46781337 x + 82.0621593 at x = log2(33.554432 MB) = 5.0684) gives 196.90 GB/s of bus
    bandwidth, so a ring all-reduce takes 2 x 3/4 x 33,554,432 / 196.90e9 = 0.2556 ms and the layer's two take
    0.5112 ms (with 2-byte elements: 0.2839 ms)."""
    from hetauto_megatron.cost.learned.sailor import load_sailor, sailor_device_infos
    from hetauto_megatron.cost.features import device_arithmetic
    from hetauto_megatron.plan.memory_fit import sailor_deepspeed_job
    layers = [r for r in load_sailor(S.L.SAILOR_DATA) if r.gpu == "GH-96"]
    run = next(r for r in S.load_runs() if S.run_plan(r) is not None)
    plan, inv = S.run_plan(run)
    dev = inv.with_precision(plan.precision).clusters[0].device
    info = sailor_device_infos(layers)["gh200"]
    assert {r.dtype_bytes for r in layers} == {dev.dtype_bytes} == {info.dtype_bytes}
    assert device_arithmetic(dev) == info.arithmetic == "tf32"
    assert sailor_deepspeed_job().dtype_bytes == dev.dtype_bytes
    r = next(r for r in layers if r.model == "OPT-350" and r.shape.kind == "transformer" and r.shape.tp == 4
             and r.shape.micro_batch == 4)
    assert (r.shape.seq, r.shape.hidden) == (2048, 1024)
    assert r.tp_comm_s == pytest.approx(0.5112e-3, rel=1e-3)
