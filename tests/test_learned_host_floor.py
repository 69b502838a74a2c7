"""The host floor of the per-layer GPU data (Sailor's measurements): where doubling a layer's micro-batch adds
under half to its time, the host issuing its kernels sets the time, not the GPU (cost/learned/sailor_host_floor.py,
HOST_BOUND_RATIO). Those configurations are left out of the calibration and their time becomes a floor under the
device's layer passes. Checked against the measurements, every model left out in turn as the fit would see it."""
import json
import os
import statistics

import pytest

from hetauto_megatron.cost import learned as L


@pytest.fixture(scope="module")
def layers():
    return L.load_sailor(L.SAILOR_DATA)


@pytest.fixture(scope="module")
def folds(layers):
    """Per held-out model: the fit without it (score weight chosen among the others, calibration, host floor) and
    its transformer-layer rows on the GPUs the others were measured on. The cross-validation keeps no boosting
    rounds on this data (benchmarks/learned_cost.py), so the calibration is the fit."""
    out = {}
    for held in sorted({r.model for r in layers}):
        # the TP all-reduces' rates from the training models only: load_sailor reads them from every model
        train, held_layers = L.leave_model_out(layers, held)
        weight, gemm_weight, _ = L.choose_weights(train, L.read_allreduce_fits(L.SAILOR_DATA))
        gpus = {r.gpu for r in train}
        test = L.sailor_layer_samples([r for r in held_layers if r.gpu in gpus and r.shape.kind == "transformer"],
                                      weight, gemm_weight)
        out[held] = (train, (weight, gemm_weight),
                     L.train_sailor_model(train, weight, rounds=0, gemm_bwd_weight=gemm_weight), test)
    return out


def test_host_bound_configurations_are_the_flat_ones(layers):
    """OPT-350 on the GH200 at TP 4: forward 1.50, 1.70, 1.70, 2.68 ms at micro-batch 1, 2, 4, 8, so 1 and 2 are
    host-bound and 4 is not (8 takes 1.6x); GPT-Neo-2.7 on the A100-40 at TP 1 grows with its work throughout."""
    hb = {(k[0], k[3], k[4], ph) for k, ph in L.host_bound_times(layers)}
    assert ("OPT-350", 1, 4, "fwd") in hb and ("OPT-350", 2, 4, "fwd") in hb
    assert ("OPT-350", 4, 4, "fwd") not in hb
    assert not any(k[0] == "GPT-Neo-2.7" and k[2] == 1 for k in hb)
    floors = L.sailor_host_floors(layers)
    assert 1e-3 < floors[L.host_floor_key("gh200", "fwd", 4)] < 1.6e-3


def test_floor_bounds_compute_and_all_reduces_together(layers):
    """On the GH200 at TP 4, micro-batch 1, OPT-350's and GPT-Neo-2.7's forwards are both host-bound (1.500 and
    1.505 ms) though their TP all-reduces differ twofold (0.16 and 0.34 ms): the host issues the NCCL calls with the
    kernels and the GPU waits for it either way. The floor measured on one model alone, on the whole pass, prices
    the other's within 5 %; a floor on compute alone with the all-reduces added after it (the rule before) misses
    one of them by more than 10 %."""
    comm = {(r.model, r.gpu, r.shape.kind, r.shape.micro_batch, r.shape.tp): r.tp_comm_s for r in layers}
    hb = L.host_bound_times(layers)       # (configuration key, phase) -> the measured pass (median layer)
    key = L.host_floor_key("gh200", "fwd", 4)
    errs_whole, errs_compute = [], []
    for model, other in (("OPT-350", "GPT-Neo-2.7"), ("GPT-Neo-2.7", "OPT-350")):
        conf = (other, "GH-96", "transformer", 1, 4)
        measured = hb[(conf, "fwd")]
        errs_whole.append(abs(L.sailor_host_floors([r for r in layers if r.model == model])[key] / measured - 1))
        compute_floor = min(t - comm[k] for (k, ph), t in hb.items() if k[0] == model and k[1] == "GH-96"
                            and ph == "fwd")
        errs_compute.append(abs((compute_floor + comm[conf]) / measured - 1))
    assert max(errs_whole) <= 0.05, errs_whole
    assert max(errs_compute) > 0.10, errs_compute


def test_floor_from_other_models_prices_host_bound_layers_of_a_model_left_out(layers, folds):
    """Fitted without OPT-350, the GH200 forward floor comes from GPT-Neo-2.7's host-bound layer alone; OPT-350's
    host-bound forwards (TP 4, micro-batch 1-2) are then predicted several times better than by the calibration,
    which puts them at a third of their time, and its GH200 forward rows as a whole within the 10 % target."""
    train, weights, model, test = folds["OPT-350"]
    assert L.host_floor_key("gh200", "fwd", 4) in model.host_floor
    bare = L.train_model(L.sailor_samples(train, *weights), rounds=0)
    flat = [s for s in test if s.device == "gh200" and s.phase == "fwd" and "tp=4 " in s.label
            and ("mb=1 " in s.label or "mb=2 " in s.label)]
    meas = [s.measured_s for s in flat]
    with_floor, without = L.mape(L.predict_samples(model, flat), meas), L.mape(L.predict_samples(bare, flat), meas)
    assert with_floor < without / 3, (with_floor, without)
    fwd = [s for s in test if s.device == "gh200" and s.phase == "fwd"]
    assert L.mape(L.predict_samples(model, fwd), [s.measured_s for s in fwd]) <= 10.0


def test_per_pass_error_leave_one_model_out_within_10_percent(folds):
    """The issue's target: leave-one-model-out error per pass (forward and backward rows apart) <= 10 % on the
    GH200 and the A100-40, over every fold (benchmarks/learned_cost.py prints the table)."""
    errs: dict[str, list[float]] = {}
    for _, _, model, test in folds.values():
        for s, p in zip(test, L.predict_samples(model, test)):
            errs.setdefault(s.device, []).append(abs(p - s.measured_s) / s.measured_s)
    for dev in ("gh200", "a100-40gb"):
        assert 100 * sum(errs[dev]) / len(errs[dev]) <= 10.0, dev


def test_planner_layers_of_the_peer_gpus_within_10_percent_of_sailors_measurements(sailor_model_dir):
    """The layer as the planner charges it (plan/costing.stage_profile: the learned compute, the TP all-reduces on
    the peer inventory's 4-GPU link, the host floor at that TP degree), forward + backward, against Sailor's measured
    median layer, for OPT-350 and GPT-Neo-2.7 on the A100-40 and the V100-16 at micro-batch 1-4 and TP 1-4 (in
    sample; benchmarks/peer_scenarios.py --layers prints the table): every configuration within the 10 % target.
    With one floor for every TP > 1 degree (the A100-40's, 1.91 ms, from TP 2, under its host-bound TP 4 forwards,
    2.13-2.45 ms) and the all-reduces added back on the inventory's alpha-beta link, 10-20 % faster than the
    curve the fit set them apart with at 8-34 MB, the TP 4 layers at micro-batch 1-2 came out 6-10 % short
    (A100-40 OPT-350 at micro-batch 2 -10.4 %, V100-16 OPT-350 at 1 -10.3 %)."""
    from hetauto_megatron.cost.sailor_job import SAILOR_JOB_PRECISION
    from hetauto_megatron.plan import costing
    from hetauto_megatron.spec.inventory import load_inventory
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    inv = load_inventory(os.path.join(root, "examples", "peers", "inventory-same-zone.yaml"))
    inv = inv.with_precision(SAILOR_JOB_PRECISION)
    with open(os.path.join(L.SAILOR_DATA, "profiles_tmp.json")) as f:
        prof = json.load(f)
    cm = L.LearnedCostModel(sailor_model_dir)
    errs = {}
    for cluster, gpu in (("a100", "A100-40"), ("v100", "V100-16")):
        c = inv.cluster(cluster)
        for name in ("OPT-350", "GPT-Neo-2.7"):
            spec = L.SAILOR_MODELS[name]
            for mb in (1, 2, 4):
                for tp in (1, 2, 4):
                    e = prof[name][gpu].get(str(mb), {}).get(str(tp))
                    if not e:
                        continue
                    want = statistics.median(e[str(i)][0] + e[str(i)][1] for i in range(1, spec.num_layers + 1))
                    p = costing.stage_profile(spec, c, tp, 1, mb, "none", cm)
                    errs[(gpu, name, mb, tp)] = (p.layer_fwd + p.layer_bwd) / want - 1
    assert len(errs) == 36
    worst = max(errs, key=lambda k: abs(errs[k]))
    assert abs(errs[worst]) <= 0.10, (worst, errs[worst])
