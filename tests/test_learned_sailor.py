"""The shipped Sailor per-layer GPU measurements: shapes check out, a fit on three models predicts the fourth
within bounds, and the learned model answers for the GPU types it saw."""
import dataclasses
import json
import os
import statistics

import pytest

from hetauto_megatron.cost import learned as L
from hetauto_megatron.spec.devices import get_device

SAILOR = L.SAILOR_DATA   # the copy shipped inside the package
FITS = L.read_allreduce_fits(SAILOR)   # each fold's TP all-reduce rates from its training models (leave_model_out)


@pytest.fixture(scope="module")
def layers():
    return L.load_sailor(SAILOR)


def left_out(layers, model: str) -> tuple[list, list]:
    """(training layers, held-out layers) of a fit without `model`: the TP all-reduces' rates read from the
    training models only, for the held-out rows too (L.with_tp_comm)."""
    return L.leave_model_out(layers, model, SAILOR)


def test_model_shapes_match_sailor_parameter_counts():
    info = json.load(open(os.path.join(SAILOR, "llm_info.json")))
    for name, spec in L.SAILOR_MODELS.items():
        measured = info[name]["1"]["1"]
        assert abs(measured["params_floats"] - spec.layer_params) / spec.layer_params < 0.005, name
        assert measured["act_output_floats"] == spec.seq_length * spec.hidden_size, name


def test_layer_parameters_per_tp_rank_to_the_parameter():
    """The fork's GPT/OPT layers (linear biases, LayerNorm) as each TP rank holds them, counted by the fork: the
    weights and the QKV and MLP-up biases split over TP, the norms and the output projections' biases whole on every
    rank. LLAMA-3-8's entries hold two norms and no head (see below), so it is not compared."""
    from hetauto_megatron.cost.memory import stage_params
    info = json.load(open(os.path.join(SAILOR, "llm_info.json")))
    for name in ("OPT-350", "OPT-30", "GPT-Neo-2.7"):
        spec = L.SAILOR_MODELS[name]
        assert spec.linear_biases
        for tp, entries in info[name].items():
            assert stage_params(spec, int(tp), 1, False, False) == entries["1"]["params_floats"], (name, tp)


def test_output_layers_match_sailor_parameter_counts():
    """The entries after the transformer layers hold, per TP rank, the output layer as the fork builds it and the
    final norm (weight and bias, 2 x hidden): OPT's logits GEMM over the padded vocabulary, and for GPT-Neo
    nothing but the norm (no output layer: gpt_neo_model.py). LLAMA-3-8's entries hold two norms and no head in
    llm_info.json, so it is not compared."""
    from hetauto_megatron.cost.memory import stage_params
    from hetauto_megatron.plan.vocab_padding import padded_vocab_size
    info = json.load(open(os.path.join(SAILOR, "llm_info.json")))
    assert not L.SAILOR_MODELS["GPT-Neo-2.7"].output_layer and L.SAILOR_MODELS["OPT-350"].output_layer
    for name in ("OPT-350", "OPT-30", "GPT-Neo-2.7"):
        spec = L.SAILOR_MODELS[name]
        for tp, entries in info[name].items():
            tail = sum(entries[str(i)]["params_floats"] for i in range(spec.num_layers + 1, len(entries)))
            run = spec.replace(vocab_size=padded_vocab_size(spec.vocab_size, [int(tp)]))
            head = run.output_params - 2 * spec.hidden_size         # the output layer, without the final norm
            assert tail == head / int(tp) + 2 * spec.hidden_size, (name, tp)
            assert stage_params(run, int(tp), 0, False, True) == tail, (name, tp)


def test_loader_reads_layers_and_heads(layers):
    kinds = {(r.model, r.shape.kind) for r in layers}
    assert {(m, k) for m in L.SAILOR_MODELS for k in ("transformer", "head")} <= kinds
    assert {r.device for r in layers} >= {"a100-40gb", "a100-80gb", "v100-16gb", "gh200"}
    assert all(r.fwd_s > 0 for r in layers if r.shape.kind == "transformer")


def test_leave_one_model_out_error_is_bounded(layers):
    """Train on three models, predict OPT-350's layers on the A100-40 and GH-96 (the benchmark prints all folds):
    within 20 %, and at most half the error of the roofline prior with the known parts (the prior alone is a
    physical estimate, 41 % off since the runs' fp32 elements and TF32 ceiling are priced, 64 % before)."""
    train_layers, held = left_out(layers, "OPT-350")
    model = L.train_model(L.sailor_samples(train_layers), seed=0)
    held = [r for r in held if r.shape.kind == "transformer"]
    test = [s for s in L.sailor_layer_samples(held) if s.device in ("a100-40gb", "gh200")]
    pred = L.predict_samples(model, test)
    err = L.mape(pred, [s.measured_s for s in test])
    prior_err = L.mape([s.baseline_s for s in test], [s.measured_s for s in test])
    assert err < 20.0 and err < prior_err / 2, (err, prior_err)


@pytest.fixture(scope="module")
def llama_left_out(layers):
    """LLAMA-3-8's GH-96 layers predicted by a fit without LLAMA-3-8: (held layers, rows, predictions)."""
    train_layers, held = left_out(layers, "LLAMA-3-8")
    weight, gemm_weight, _ = L.choose_weights(train_layers, FITS)
    model = L.train_model(L.sailor_samples(train_layers, weight, gemm_weight), rounds=0)
    held = [r for r in held if r.gpu == "GH-96" and r.shape.kind == "transformer"]
    test = L.sailor_layer_samples(held, weight, gemm_weight)
    return held, test, L.predict_samples(model, test)


def test_unfused_softmax_of_long_sequences_carries_over_to_a_model_left_out(layers, llama_left_out):
    """LLAMA-3-8 ran 8192 keys, past the 4096 that Megatron-DeepSpeed's fused softmax kernel takes: PyTorch's
    softmax passes over the scores (counted kernel by kernel in the job's 4-byte elements, at the memory
    bandwidth) and no attention dropout. Without LLAMA-3-8 in the fit (no other run takes that path), its GH-96
    layers are predicted within 10 % per pass (forward and backward rows, the benchmark's measure: the target),
    its backward rows alone too, and its layers' forward + backward time."""
    from hetauto_megatron.cost import features as F
    llama = next(r for r in layers if r.model == "LLAMA-3-8" and r.shape.kind == "transformer")
    opt = next(r for r in layers if r.model == "OPT-350" and r.shape.kind == "transformer")
    assert llama.dtype_bytes == opt.dtype_bytes == 4
    assert F.unfused_softmax_s(llama.shape, "fwd", 4, 4000.0) > 0 == F.unfused_softmax_s(opt.shape, "fwd", 4, 4000.0)
    assert F.unfused_softmax_bytes("fwd", 2) == 41 and F.unfused_softmax_bytes("fwd", 4) == 33
    held, test, pred = llama_left_out
    pairs = L.layer_time_pairs(test, pred)
    assert len(pairs) == len(held)
    assert sum(m for _, m in pairs) == pytest.approx(sum(r.fwd_s + r.bwd_s for r in held))
    assert L.mape(pred, [s.measured_s for s in test]) <= 10.0
    bwd = [(p, s.measured_s) for p, s in zip(pred, test) if s.phase == "bwd"]
    assert L.mape(*zip(*bwd)) <= 10.0
    assert L.mape(*zip(*pairs)) <= 10.0


@pytest.mark.xfail(strict=True, reason="priced in the job's fp32 elements, LLAMA-3-8's GH-96 forward passes come "
                                       "out 10-21 % short with LLAMA-3-8 left out (MAPE 15.9 %); "
                                       "docs/cost-model-learned.md, 'The folds over 10 %'")
def test_llama_forward_alone_within_ten_percent(llama_left_out):
    """The forward rows alone, the stricter measure (within 10 % while the runs were read as 2-byte fp16)."""
    _, test, pred = llama_left_out
    fwd = [(p, s.measured_s) for p, s in zip(pred, test) if s.phase == "fwd"]
    assert L.mape(*zip(*fwd)) <= 10.0


def test_fork_kernels_put_llama_forward_with_the_other_models_and_not_its_backward(layers):
    """Measured GH200 passes (TF32 runs, not host-bound, less their TP all-reduces) over the rooflines of the kernels
    Sailor's fork runs for each layer (benchmarks/learned_folds.py, read from its code: the PyTorch scale, mask and
    softmax passes, the fork's RMSNorm, rotary and SwiGLU as PyTorch ops, the attention bmm's, each kernel at its own
    roofline). LLAMA-3-8's forward then sits with the other two models (median 1.60 against 1.49 and 1.58; over the
    learned prior 1.88 against 1.46 and 1.55, the fold's forward error), and its backward below both (2.16 against
    2.54 and 2.84): no count of what the fork runs makes both passes agree (docs/cost-model-learned.md, "The folds
    over 10 %")."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import learned_folds
    ratios = learned_folds.roofline_ratios(layers, "GH-96", 1.0, 1.0)   # x[1], read here, takes no weight
    med = {k: statistics.median(x[1] for x in v) for k, v in ratios.items()}
    others = ("GPT-Neo-2.7", "OPT-350")
    assert all(abs(med[("LLAMA-3-8", "fwd")] / med[(m, "fwd")] - 1) < 0.10 for m in others), med
    assert all(med[("LLAMA-3-8", "bwd")] < 0.90 * med[(m, "bwd")] for m in others), med


def test_backward_score_weight_is_chosen_on_training_models_and_carries_over(layers):
    """The weight on the backward's score traffic is chosen by leave-one-model-out among the training models
    only; fitted without GPT-Neo-2.7 it predicts GPT-Neo's A100 layers better than the counted traffic does."""
    train_layers, held = left_out(layers, "GPT-Neo-2.7")
    weight, gemm_weight, scores = L.choose_weights(train_layers, FITS)
    assert set(scores["score"]) == set(L.SCORE_WEIGHTS) and weight > 1.0
    assert scores["score"][weight] < scores["score"][1.0]
    held = [r for r in held if r.shape.kind == "transformer" and r.device in ("a100-40gb", "a100-80gb")]
    errs = {}
    for w in (1.0, weight):
        test = L.sailor_layer_samples(held, w, gemm_weight)
        pred = L.predict_samples(L.train_model(L.sailor_samples(train_layers, w, gemm_weight), rounds=0), test)
        errs[w] = L.mape(pred, [s.measured_s for s in test])
    assert errs[weight] < 10.0 < errs[1.0], errs


def test_hopper_tf32_backward_gemm_weight_is_chosen_on_training_models_and_carries_over(layers):
    """TF32 backward GEMMs on a GPU whose TF32 instruction wants K-major operands (Hopper: the GH200) get a weight
    chosen, with the score weight, by leave-one-model-out among the training models. Fitted without GPT-Neo-2.7 (the
    GEMM-heaviest backward of the GH200 runs: 40 % of its prior, OPT-350's 13 %), it is above 1 and predicts
    GPT-Neo's GH200 backward passes better than the forward's efficiency (weight 1) does, within the 10 % target;
    the other GPUs' rows do not depend on it."""
    from hetauto_megatron.cost import features as F
    train_layers, held = left_out(layers, "GPT-Neo-2.7")
    weight, gemm_weight, scores = L.choose_weights(train_layers, FITS)
    assert gemm_weight > 1.0 and set(scores["gemm"]) == set(L.GEMM_BWD_WEIGHTS)
    assert F.backward_gemm_weighted("gh200", "tf32") and not F.backward_gemm_weighted("a100-40gb", "tf32")
    assert not F.backward_gemm_weighted("gh200", "16-bit")
    held = [r for r in held if r.gpu == "GH-96" and r.shape.kind == "transformer"]
    errs = {}
    for g in (1.0, gemm_weight):
        test = [s for s in L.sailor_layer_samples(held, weight, g) if s.phase == "bwd"]
        model = L.train_sailor_model(train_layers, weight, rounds=0, gemm_bwd_weight=g)
        errs[g] = L.mape(L.predict_samples(model, test), [s.measured_s for s in test])
    assert errs[gemm_weight] < min(10.0, errs[1.0]), errs
    # the A100's TF32 rows (its fp32 rows could never take the weight) do not depend on it
    a100 = [r for r in layers if r.gpu == "A100-40" and r.shape.kind == "transformer" and r.precision == "tf32"][:4]
    assert len(a100) == 4
    assert [s.prior_s for s in L.sailor_layer_samples(a100, weight, 1.0)] == [
        s.prior_s for s in L.sailor_layer_samples(a100, weight, gemm_weight)]


def test_precision_of_each_run_is_recovered(layers):
    """The A100-40's OPT-30 and LLAMA-3-8 runs never beat the A100's FP32 peak (19.5 TFLOP/s) and are labelled
    fp32 (CUDA cores), its GPT-Neo run (78 TFLOP/s) tf32; every V100 run is FP32-bound, every GH200 run used the
    tensor cores. All of them are fp32 jobs (cost/sailor_job.py): 4-byte elements whichever unit ran the GEMMs,
    and a TF32 run's ceiling is the datasheet's dense TF32 peak (A100 156, GH200 494.7 TFLOP/s)."""
    from hetauto_megatron.cost.sailor_job import SAILOR_ELEMENT_BYTES, SAILOR_JOB_PRECISION
    assert SAILOR_JOB_PRECISION == "fp32" and SAILOR_ELEMENT_BYTES == 4
    prec = L.sailor_precisions(layers)
    assert prec[("OPT-30", "A100-40")] == prec[("LLAMA-3-8", "A100-40")] == "fp32"
    assert prec[("GPT-Neo-2.7", "A100-40")] == prec[("OPT-350", "A100-40")] == "tf32"
    assert {prec[(m, "V100-16")] for m in L.SAILOR_MODELS} == {"fp32"}
    assert {p for (m, g), p in prec.items() if g == "GH-96"} == {"tf32"}
    assert all(r.dtype_bytes == 4 for r in layers)
    assert all(r.compute_tflops == L.SAILOR_FP32_TFLOPS[r.gpu] for r in layers if r.precision == "fp32")
    assert {(r.gpu, r.compute_tflops) for r in layers if r.precision == "tf32"} == {
        ("A100-40", 156.0), ("A100-80", 156.0), ("GH-96", 494.7)}


def test_tp_all_reduces_are_the_known_part_of_a_measured_layer(layers):
    """A TP>1 layer carries its two all-reduces per pass as known time (priced from the measured all-reduce
    bandwidth); the learned part excludes it, and a TP=1 layer has none."""
    r2 = next(r for r in layers if r.gpu == "A100-40" and r.model == "GPT-Neo-2.7" and r.shape.tp == 2
              and r.shape.micro_batch == 8 and r.shape.kind == "transformer")
    r1 = next(r for r in layers if r.gpu == "A100-40" and r.model == "GPT-Neo-2.7" and r.shape.tp == 1
              and r.shape.micro_batch == 8 and r.shape.kind == "transformer")
    nbytes = 8 * 2048 * 2560 * 4      # the fp32 job's activation
    c = r2.tp_comm_s
    # two all-reduces of 168 MB between 2 A100s, each at the ~198 GB/s bus bandwidth measured for that message
    assert 2 * nbytes / 250e9 < c < 2 * nbytes / 100e9, c
    assert r1.tp_comm_s == 0.0
    s = L.sailor_layer_samples([r2])[0]
    assert s.known_s == c and s.learned_part_s() == s.measured_s - c


def test_calibration_recovers_rate_and_overhead():
    """Stage 1 is pure arithmetic: rows made as 3 x prior + 50 us come back as (3, 50 us), within the overhead
    grid's step; a group of two rows gets the median ratio and no overhead."""
    prior = [1e-5 * 2 ** i for i in range(12)]
    rate, t0 = L._fit_rate_overhead(prior, [3.0 * p + 5e-5 for p in prior])
    assert abs(rate - 3.0) / 3.0 < 0.05 and abs(t0 - 5e-5) < 0.1 * 5e-5, (rate, t0)
    assert L._fit_rate_overhead([1.0, 2.0], [2.0, 6.0]) == (pytest.approx(2.449, rel=1e-3), 0.0)


def test_rounds_are_chosen_among_the_offered_choices(layers):
    train = L.sailor_samples([r for r in layers if r.model in ("OPT-350", "GPT-Neo-2.7", "LLAMA-3-8")])
    chosen, scores = L.choose_rounds(train, seed=0)
    assert set(chosen) == {"layer_fwd", "layer_bwd"}
    for name, k in chosen.items():
        assert k in L.ROUND_CHOICES and set(scores[name]) == set(L.ROUND_CHOICES)
        best = min(m for m, _ in scores[name].values())
        assert scores[name][k][0] <= best + max(se for _, se in scores[name].values()) + 1e-9


def test_fit_with_sailor_covers_gpus_and_falls_back_for_others(sailor_model_dir):
    from hetauto_megatron.spec.model import PRESETS
    # '--sailor' alone: the packaged measurements, no path needed from an installed package (tests/conftest.py)
    m = L.LearnedCostModel(sailor_model_dir)
    assert m.fitted.score_bwd_weight in L.SCORE_WEIGHTS and m.fitted.score_bwd_weight > 1.0
    # Sailor's A100-40 runs were fp32 jobs with TF32 GEMMs: they price such a job, not a 16-bit one
    tf32 = dataclasses.replace(get_device("a100-40gb"), tf32=True)
    a100, h800 = tf32.at_precision("fp32"), get_device("h800").at_precision("fp32")
    assert m.source(a100) == "learned" and m.source(h800) == "analytic"
    info, why = m.coverage(tf32.at_precision("bf16"))
    assert info is None and "fp32 with TF32 GEMMs" in why and "16-bit" in why
    info, why = m.coverage(dataclasses.replace(get_device("a100-40gb"), tf32=False).at_precision("fp32"))
    assert info is None and "without tensor cores" in why and "tf32: false" in why
    f, b = m.layer_times(PRESETS["llama2-7b"], a100, 2, 1, 2048)
    assert 1e-4 < f < b < 10
    # 'V100' is the 32 GB v100, which the data does not cover: analytic, saying which types are covered and
    # naming the 16 GB type of the same chip
    info, why = m.coverage(get_device("V100"))
    assert info is None and "v100-16gb" in why and "a100-40gb" in why and m.source(get_device("V100")) == "analytic"
    assert "the same chip" in why
    # ... and no other chip: the RTX 2080 is not the 2080 Ti or the 3090 the data covers (a name's prefix said it
    # was, and told the user to price it with their rates)
    info, why = m.coverage(get_device("2080"))
    assert info is None and "rtx-2080-ti" in why and "the same chip" not in why, why
    # the V100-16 was measured in fp32 only: a 2-byte plan is not priced with other GPUs' tensor-core rates ...
    info, why = m.coverage(get_device("v100-16gb"))
    assert info is None and "fp32 without tensor cores" in why and "16-bit" in why
    # ... a 4-byte one is, with the V100's own (FP32-peak) figures
    info, _ = m.coverage(get_device("v100-16gb").with_overrides(dtype_bytes=4))
    assert info is not None and info.dtype_bytes == 4 and info.peak_tflops == L.SAILOR_FP32_TFLOPS["V100-16"]
    assert any(line.startswith("v100: analytic") for line in m.describe([get_device("V100"), a100]))
    # heads and embeddings: not measured alike across the data's models, so analytic
    for piece in ("embedding", "head"):
        assert getattr(m, f"{piece}_times")(PRESETS["llama2-7b"], a100, 2, 1) == getattr(
            m.fallback, f"{piece}_times")(PRESETS["llama2-7b"], a100, 2, 1)


def test_sailor_flag_given_a_file_explains_the_order(tmp_path, capsys):
    from hetauto_megatron.cli import main
    prof = tmp_path / "profile-cpu.jsonl"
    prof.write_text("{}\n")
    assert main(["fit", "--sailor", str(prof), "-o", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "--sailor" in err and "after the profile files" in err


def test_optimizer_step_of_a_model_left_out_is_predicted_from_the_others():
    """Sailor's measured optimizer step (the third figure of its entries: one Adam call over the profiled model, the
    embedding, two transformer layers and the output-layer entry) against what the planner would charge that model
    with the model left out of the fit (computed here, each model in turn): rate x the Adam memory traffic + a
    fixed cost per step where `fit_optimizer`, given the other models only, keeps the fit for the GPU, else the
    traffic at full bandwidth. Target 25 % on the A100-40 and the GH200. (As the step of one layer with a fixed
    cost per layer, the reading before, the traffic alone was 76-84 % off.)"""
    from hetauto_megatron.cost.learned.optimizer_step import fit_optimizer
    from hetauto_megatron.cost.learned.sailor_updates import load_sailor_updates
    ups = load_sailor_updates(L.SAILOR_DATA)
    for dev in ("a100-40gb", "gh200"):
        rows = [u for u in ups if u.device == dev]
        models = sorted({u.model for u in rows})
        assert len(models) >= 3
        pred, meas = [], []
        for held in models:
            table, _ = fit_optimizer([u for u in ups if u.model != held])
            rate, fixed = table.get(dev, (1.0, 0.0))
            pred += [rate * u.prior_s + fixed for u in rows if u.model == held]
            meas += [u.update_s for u in rows if u.model == held]
        err = L.mape(pred, meas)
        assert err <= 25.0, (dev, err, pred, meas)


def test_tp_all_reduces_set_apart_match_what_the_tp4_layers_measure(layers):
    """Sailor's all-reduce curve read at the whole message, as its profiler measured it (sailor_allreduce_s), against
    what the A100-40's TP 4 layers contain: at one micro-batch, the TP 4 forward less the TP 1 forward's multiple of
    its prior applied to the TP 4 prior is the time of the two all-reduces (GPT-Neo-2.7 and OPT-350, micro-batch 4 and
    8, 34-168 MB messages): 0.97-1.09 of it; within 15 % each (read at the ring's chunk, as Sailor's simulator does,
    1.38-1.58)."""
    from hetauto_megatron.cost import features as F
    med = {}
    for r in layers:
        if r.gpu == "A100-40" and r.shape.kind == "transformer" and r.model in ("GPT-Neo-2.7", "OPT-350"):
            med.setdefault((r.model, r.shape.micro_batch, r.shape.tp), []).append(r)
    checked = 0
    for (model, mb, tp), rs in med.items():
        if tp != 4 or mb < 4 or (model, mb, 1) not in med:
            continue
        one = med[(model, mb, 1)]
        prior = {t: F.layer_row(g[0].shape, "fwd", dtype_bytes=4, peak_tflops=g[0].compute_tflops,
                                hbm_gbps=g[0].hbm_gbps)[1] for t, g in ((1, one), (4, rs))}
        rate = statistics.median(r.fwd_s for r in one) / prior[1]
        implied = statistics.median(r.fwd_s for r in rs) - rate * prior[4]
        assert abs(rs[0].tp_comm_s / implied - 1) < 0.15, (model, mb, rs[0].tp_comm_s, implied)
        checked += 1
    assert checked == 4


def test_validation_rows_are_distinct_readings_naming_their_layers(sailor_model_dir, capsys):
    """profiles_tmp.json repeats one reading for most layers of a model (OPT-350's layers 2-24 on the RTX 3090 at
    micro-batch 16, TP 4: 63.397 ms each), and `validate-cost-model --sailor` listed each copy as its own row: 23
    identical lines. Each row is now one distinct reading and names its layers (#2-24); read back from the data
    file itself, every transformer layer of every configuration is named by exactly one row of its phase, with
    the row's time."""
    from hetauto_megatron.cli import main
    assert main(["validate-cost-model", "--cost-model", sailor_model_dir, "--sailor", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    with open(os.path.join(SAILOR, "profiles_tmp.json")) as fh:
        raw = json.load(fh)
    named: dict[tuple, list[int]] = {}
    for row in rows:
        model, gpu, kind, mb, tp, index, _ = row["label"].split()
        assert kind == "transformer"
        key = (model, gpu, mb[3:], tp[3:], row["phase"])
        layers = []
        for part in index[1:].split(","):
            first, _, last = part.partition("-")
            layers += range(int(first), int(last or first) + 1)
        per_layer = raw[model][gpu][mb[3:]][tp[3:]]
        assert {per_layer[str(i)][row["phase"] == "bwd"] for i in layers} == {row["measured_s"]}, row
        named.setdefault(key, []).extend(layers)
    lines = [(r["device"], r["phase"], r["measured_s"], r["label"].split("#")[0]) for r in rows]
    assert len(set(lines)) == len(lines)          # no two rows of one configuration alike
    for (model, gpu, mb, tp, _), layers in named.items():
        assert sorted(layers) == list(range(1, L.SAILOR_MODELS[model].num_layers + 1)), (model, gpu, mb, tp)
    assert ("OPT-350", "RTX-3090", "16", "4", "fwd") in named


def test_weight_choice_counts_each_reading_once(layers):
    """profiles_tmp.json repeats one reading for most layers of a model (copies, not measurements): the weights'
    leave-one-model-out errors count each distinct reading once, so more copies of the same readings (here every
    layer of GPT-Neo-2.7 written twice more, as further layers) change neither the weights nor their scores."""
    tr = [r for r in layers if r.shape.kind == "transformer"]
    copies = sum(1 for r in tr) - len({(r.model, r.gpu, r.shape.micro_batch, r.shape.tp, r.fwd_s, r.bwd_s) for r in tr})
    assert copies > len(tr) // 2          # most per-layer rows repeat another of their configuration
    train = [r for r in layers if r.model != "OPT-350"]
    top = max(r.index for r in train)
    more = [dataclasses.replace(r, index=r.index + k * top) for k in (1, 2) for r in train
            if r.model == "GPT-Neo-2.7" and r.shape.kind == "transformer"]
    assert L.choose_weights(train + more) == L.choose_weights(train)


def test_runs_of_models_and_gpus_the_reader_does_not_know_are_named(tmp_path, capsys):
    """A GPU (B200) or a model (FOO-1) added to profiles_tmp.json was left out of the fit without a word; the reading
    names them now, and the packaged file, every run of which it knows, reads without one."""
    import shutil
    d = tmp_path / "sailor"
    shutil.copytree(SAILOR, d)
    data = json.loads((d / "profiles_tmp.json").read_text())
    model = next(iter(data))
    gpu = next(iter(data[model]))
    data[model]["B200"] = data[model][gpu]
    data["FOO-1"] = {gpu: data[model][gpu]}
    (d / "profiles_tmp.json").write_text(json.dumps(data))
    known = L.load_sailor(str(d))
    err = capsys.readouterr().err
    assert f"left out GPU B200 ({model}), model FOO-1" in err and "this reader knows the models" in err, err
    assert len(known) == len(L.load_sailor(SAILOR)) and "left out" not in capsys.readouterr().err


def test_a_held_out_models_measurements_do_not_reach_its_folds_fit(layers):
    """The TP all-reduce rates are read from measured layers (sailor_tp_allreduce_rates), and load_sailor reads them
    from every model: a fold that kept them let the held-out model's own times into its prediction. Its times slowed
    by half: the fold's training rows and the all-reduces set apart on its held-out rows are the same (as in each of
    choose_weights' folds when given the curves, what `hetauto fit --sailor` does)."""
    held = "GPT-Neo-2.7"
    slowed = [dataclasses.replace(r, fwd_s=r.fwd_s * 1.5, bwd_s=r.bwd_s * 1.5) if r.model == held else r
              for r in layers]
    (train_a, held_a), (train_b, held_b) = left_out(layers, held), left_out(slowed, held)
    assert train_a == train_b
    assert [r.tp_comm_s for r in held_a] == [r.tp_comm_s for r in held_b]
    # (the leak: read from every model, the held-out rows' set-apart all-reduces follow their own times)
    leaky = L.with_tp_comm(slowed, slowed, FITS)
    assert [r.tp_comm_s for r in leaky if r.model == held] != [r.tp_comm_s for r in held_a]
