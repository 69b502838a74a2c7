"""The memory caps table (plan/memory_caps.py) against the exact memory model, where the stage's peak is the
largest of several candidates (cost/memory.py `_reading`): the state with the activations, the state at DeepSpeed's
gradient reduction, the state at the optimizer's step, and a memory job's. A table that fits one line through
their largest misses the kinks between them and allows more layers than fit."""
import math

import pytest
from helpers import small_inventory

from hetauto_megatron.cost.analytic import AnalyticCostModel
from hetauto_megatron.plan import costing, memory_fit
from hetauto_megatron.plan import space as space_mod
from hetauto_megatron.plan.evaluator import LayoutEvaluator
from hetauto_megatron.plan.layout_pricing import evaluate_layout
from hetauto_megatron.plan.memory_caps import CapTable
from hetauto_megatron.plan.settings import settings_as_run
from hetauto_megatron.plan.vocab_padding import padded_vocab_size
from hetauto_megatron.spec.model import PRESETS

# (engine, settings overrides, precision, memory job): DeepSpeed fp16 (its FP16 optimizer; ZeRO-1 is its
# default distributed optimizer), DeepSpeed fp16 without ZeRO, Megatron with the gradients reduced in the
# parameters' type (the step's fp32 copies then a candidate of their own), Megatron's defaults, and Sailor's
# Megatron-DeepSpeed job as a memory job (its candidates beside the plan's own)
RUNS = [("deepspeed", (), "fp16", False), ("deepspeed", (("distributed_optimizer", False),), "fp16", False),
        ("megatron", (("grad_reduce_dtype", "param"),), "fp16", False), ("megatron", (), "fp16", False),
        ("megatron", (), "fp32", True)]


def _cost_model(job: bool) -> AnalyticCostModel:
    cost = AnalyticCostModel()
    if job:
        cost.memory_job = memory_fit.sailor_deepspeed_job()
    return cost


def _run_id(run) -> str:
    engine, overrides, precision, job = run
    return "-".join([engine, precision, *(k for k, _ in overrides)] + (["memory-job"] if job else []))


@pytest.mark.parametrize("run", RUNS, ids=_run_id)
def test_cap_table_is_the_exact_cap(run):
    """Every cap the table gives is memory_fit.max_layers_in_memory's, which bisects the memory model's total
    itself (an independent computation: no line is fitted there), over every in-flight count and boundary-buffer
    count asked here. With one line fitted through the largest candidate, llama2-7b on an H800 under DeepSpeed
    fp16, TP 1, DP 1, micro-batch 4, full recomputation, a middle stage with 1 in flight was allowed 23 layers, which
    need 98.4 GiB of its 80 (18 fit)."""
    engine, overrides, precision, job = run
    cost = _cost_model(job)
    inv = small_inventory([("h", "H800", 1, 8), ("v", "V100", 1, 8)], [("h", "v", 100, 1)]).with_precision(precision)
    checked, wrong = 0, []
    for name in ("llama2-7b", "llama2-13b"):
        for cl in inv.clusters:
            for tp in (1, 2, 8):
                model = PRESETS[name].replace(vocab_size=padded_vocab_size(PRESETS[name].vocab_size, [tp]))
                settings = settings_as_run(tp, overrides, engine, precision)
                for dp in (1, 2, 8):
                    for mb in (1, 4):
                        for rc in ("none", "full"):
                            prof = costing.stage_profile(model, cl, tp, dp, mb, rc, cost, settings)
                            for first, last in ((False, False), (True, False), (False, True)):
                                table = CapTable(model, prof, first, last)
                                for f in (1, 2, 5, 16):
                                    for buf in (0, 3):
                                        exact = memory_fit.max_layers_in_memory(model, prof, f, first, last, buf)
                                        got = table.cap(f, buf)
                                        checked += 1
                                        if got != exact:
                                            wrong.append((name, cl.name, tp, dp, mb, rc, first, last, f, buf, got,
                                                          exact))
    assert not wrong and checked > 2000, (len(wrong), wrong[:5])


def test_cap_table_example_of_the_kink():
    """The example above, by itself: 18 layers, not 23."""
    inv = small_inventory([("h", "H800", 1, 8)], []).with_precision("fp16")
    model = PRESETS["llama2-7b"].replace(vocab_size=padded_vocab_size(PRESETS["llama2-7b"].vocab_size, [1]))
    prof = costing.stage_profile(model, inv.clusters[0], 1, 1, 4, "full", AnalyticCostModel(),
                                 settings_as_run(1, (), "deepspeed", "fp16"))
    exact = memory_fit.max_layers_in_memory(model, prof, 1, False, False, 0)
    assert CapTable(model, prof, False, False).cap(1) == exact
    # the exact cap is the edge of the memory model's total: one more layer does not fit
    assert memory_fit.stage_memory(model, prof, exact, 1, False, False)["total"] <= prof.memory_cap \
        < memory_fit.stage_memory(model, prof, exact + 1, 1, False, False)["total"]


def test_layout_evaluator_agrees_with_evaluate_layout_under_deepspeed_fp16():
    """The search's evaluator, which splits the layers by the caps tables, against evaluate_layout, which splits
    them by the memory model's exact caps: the same time (or both infeasible) for every layout of an H800 beside
    seven V100s under DeepSpeed fp16, where the tables' caps were too large."""
    cost = AnalyticCostModel()
    inv = small_inventory([("fast", "H800", 1, 1), ("slow", "V100", 1, 7)], [("fast", "slow", 400, 0.01)]) \
        .with_precision("fp16")
    gbs = 64
    compared, disagree = 0, []
    for name in ("llama2-7b", "llama2-13b"):
        model = PRESETS[name]
        sp = space_mod.SearchSpace(model, inv, gbs, cost, engine="deepspeed")
        ev = LayoutEvaluator(model, inv, gbs, cost, "blocking", engine="deepspeed")
        for leaf in space_mod.leaves(sp, limit=4000):
            meshes = sp.decode(leaf)[3]
            if min(m.num_stages for m in meshes) < 1:
                continue
            t, resolved = ev.resolve(meshes)
            # exact=False: the closed-form time the evaluator also takes; the layer split is from the exact caps
            ref = evaluate_layout(model, inv, list(resolved), gbs, cost, exact=False, schedule=ev.schedule,
                                  engine="deepspeed")
            rt = ref.iteration_time_s if ref.stage_layers is not None else math.inf
            compared += 1
            if not ((math.isinf(t) and math.isinf(rt)) or abs(rt - t) <= 1e-9 * max(abs(t), 1)):
                disagree.append((name, [(m.cluster, m.tp, m.dp, m.micro_batch_size, m.recompute, m.num_stages)
                                        for m in resolved], t, rt))
    assert not disagree and compared > 50, (compared, disagree[:3])
