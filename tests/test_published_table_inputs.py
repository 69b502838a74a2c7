"""validate-cost-model --published=FILE on a table whose figures the analytic model cannot price, or which
describe no layout Megatron-LM runs: one paragraph naming the file and the field in the table's own terms
(`source.rows[N].tp`, `source.seq_len`), exit 2, one JSON error object under --json; never a traceback, an
infinite prediction printed as Infinity, or a silently wrong published time."""
from __future__ import annotations

import json
import os

import pytest
from helpers import ROOT, run_cli
from test_measure_cli_inputs import _published_table

from hetauto_megatron.plan.calibration import TABLE, published_runs


def _source(**kw):
    return lambda d: d["source_a_a100"].update(kw)


def _row(**kw):
    return lambda d: d["source_a_a100"]["rows"][0].update(kw)


@pytest.mark.parametrize("edit, field, words", [
    (_source(micro_batch_size=0), "source_a_a100.micro_batch_size", "not a positive whole number"),  # ZeroDivision
    (_source(micro_batch_size=1000), "source_a_a100.rows[0].batch", "micro-batches of 1000"),     # inf predicted
    (_row(pp=32), "source_a_a100.rows[0].pp", "24 layers"),                                        # inf predicted
    (_source(flops_count="vibes"), "source_a_a100.flops_count", "hardware"),       # read as model FLOPs
    (_source(recompute="maybe"), "source_a_a100.recompute", "none, selective, full"),
    (_row(tp=5, gpus=40), "source_a_a100.rows[0].tp", "24 heads"),                # TP 5 of 24 heads priced
    (_row(tp=16, gpus=512), "source_a_a100.rows[0].tp", "24 heads"),
    (_row(heads=48, tp=16, gpus=512), "source_a_a100.rows[0].tp", "more than one node"),
    (_row(gpus=12), "source_a_a100.rows[0].gpus", "nodes of 8"),             # priced on 8 of the 12 GPUs
    (_row(batch=511), "source_a_a100.rows[0].batch", "32 data-parallel ranks"),
    (_row(tflops_per_gpu=100000), "source_a_a100.rows[0].tflops_per_gpu", "dense peak of 312"),
    (_source(vocab=-1), "source_a_a100.vocab", "vocab"),                     # named ModelSpec's vocab_size
    (_row(heads=7), "source_a_a100.rows[0].heads", "not divisible by heads 7"),    # named hidden_size
    (_source(intra_node_gbps=-5), "source_a_a100.intra_node_gbps", "Gbit/s"),  # named clusters[0].intra_node
    (_source(seq_len="abc"), "source_a_a100.seq_len", "'abc'"),              # "row 0 ... is incomplete ('<=' ...)"
    (_source(seq_len=0), "source_a_a100.seq_len", "seq_len"),
])
def test_a_published_row_megatron_could_not_run_is_named(tmp_path, capsys, edit, field, words):
    path = _published_table(tmp_path, edit)
    rc, out, err = run_cli(["validate-cost-model", f"--published={path}", "--json"], capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert f"{path}: field '{field}'" in err and words in err and "Fix:" in err, err
    error = json.loads(out)["error"]        # one JSON object, no Infinity
    assert error["file"] == path and error["field"] == field and error["exit_code"] == 2


def test_the_tables_that_ship_pass_the_checks():
    """The packaged runs and the benchmark's other rows of the same two tables are layouts Megatron-LM ran: none
    is refused by the checks (their published times are what the calibration reports)."""
    assert len(published_runs(TABLE)) == 5
    assert len(published_runs(os.path.join(ROOT, "benchmarks", "published-megatron-other-rows.yaml"))) == 14
