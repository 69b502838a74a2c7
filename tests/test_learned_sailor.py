"""The shipped Sailor per-layer GPU measurements: shapes check out, a fit on three models predicts the fourth
within bounds, and the learned model answers for the GPU types it saw."""
import json
import os

import pytest

from hetauto_megatron.cost import learned as L
from hetauto_megatron.spec.devices import get_device

SAILOR = L.SAILOR_DATA   # the copy shipped inside the package


@pytest.fixture(scope="module")
def layers():
    return L.load_sailor(SAILOR)


def test_model_shapes_match_sailor_parameter_counts():
    info = json.load(open(os.path.join(SAILOR, "llm_info.json")))
    for name, spec in L.SAILOR_MODELS.items():
        measured = info[name]["1"]["1"]
        # llm_info counts biases too; our layer_params ignores them (< 0.5% of a layer).
        assert abs(measured["params_floats"] - spec.layer_params) / spec.layer_params < 0.005, name
        assert measured["act_output_floats"] == spec.seq_length * spec.hidden_size, name


def test_loader_reads_layers_and_heads(layers):
    kinds = {(r.model, r.shape.kind) for r in layers}
    assert {(m, k) for m in L.SAILOR_MODELS for k in ("transformer", "head")} <= kinds
    assert {r.device for r in layers} >= {"a100-40gb", "a100-80gb", "v100-16gb", "gh200"}
    assert all(r.fwd_s > 0 for r in layers if r.shape.kind == "transformer")


def test_leave_one_model_out_error_is_bounded(layers):
    """Train on three models, predict OPT-350's layers on the A100-40 and GH-96 (the benchmark prints all folds)."""
    train = L.sailor_samples([r for r in layers if r.model != "OPT-350"])
    boosters = L.train_boosters(train, seed=0, rounds=200)
    test = [s for s in L.sailor_layer_samples([r for r in layers if r.model == "OPT-350"
                                               and r.shape.kind == "transformer"]) if s.device in ("a100-40gb", "gh200")]
    pred = L.predict_samples(boosters, test)
    err = L.mape(pred, [s.measured_s for s in test])
    prior_err = L.mape([s.prior_s for s in test], [s.measured_s for s in test])
    assert err < 35.0 and err < prior_err / 2, (err, prior_err)


def test_fit_with_sailor_covers_gpus_and_falls_back_for_others(tmp_path, capsys):
    from hetauto_megatron.cli import main
    from hetauto_megatron.spec.model import PRESETS
    # '--sailor' alone: the packaged measurements, no path needed from an installed package
    assert main(["fit", "-o", str(tmp_path), "--holdout", "0", "--sailor"]) == 0
    m = L.LearnedCostModel(str(tmp_path))
    a100, h800 = get_device("a100-40gb"), get_device("h800")
    assert m.source(a100) == "learned" and m.source(h800) == "analytic"
    f, b = m.layer_times(PRESETS["llama2-7b"], a100, 2, 1, 2048)
    assert 1e-4 < f < b < 10
    assert m.embedding_times(PRESETS["llama2-7b"], a100, 2, 1) == m.fallback.embedding_times(
        PRESETS["llama2-7b"], a100, 2, 1)


def test_sailor_flag_given_a_file_explains_the_order(tmp_path, capsys):
    from hetauto_megatron.cli import main
    prof = tmp_path / "profile-cpu.jsonl"
    prof.write_text("{}\n")
    assert main(["fit", "--sailor", str(prof), "-o", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "--sailor" in err and "after the profile files" in err
