"""The 1F1B event simulator against a brute-force discrete-time reference, and the boundary schedules."""
import random

import pytest

from hetauto_megatron.plan.deepspeed_schedule import deepspeed_links, simulate_deepspeed
from hetauto_megatron.plan.pipeline import estimate_1f1b, simulate_1f1b, warmup_counts, warmup_forwards
from hetauto_megatron.plan.pipeline_memory import memory_terms
from helpers import random_pipeline, shared_uplinks_draw, side_by_side
from pipeline_reference import reference_makespan


def _case(rng, slow=True):
    p, m = rng.randint(1, 7), rng.randint(1, 16)
    f = [rng.randint(1, 9) for _ in range(p)]
    b = [rng.randint(1, 18) for _ in range(p)]
    top = 3 * max(f + b) if slow else 3          # links as slow as the stages, or slower
    occ = [rng.randint(0, top) for _ in range(p - 1)]
    lat = [rng.randint(0, top // 2) for _ in range(p - 1)]
    blk = [rng.random() < 0.5 for _ in range(p - 1)]
    depth = [0 if x else rng.randint(0, 3) for x in blk]
    return p, m, f, b, occ, lat, blk, depth


def test_event_simulation_equals_brute_force_reference():
    """300 random heterogeneous pipelines, slow links, mixed blocking / overlapped boundaries of random depth: the
    event simulation and the tick-by-tick reference agree within 0.1% (whole-tick durations: exactly)."""
    rng = random.Random(13)
    worst = 0.0
    for _ in range(300):
        p, m, f, b, occ, lat, blk, depth = _case(rng)
        ref = reference_makespan(f, b, occ, lat, m, blk, depth)
        got = simulate_1f1b(f, b, [o + a for o, a in zip(occ, lat)], m, latency=lat, blocking=blk,
                            depth=depth).makespan
        worst = max(worst, abs(got / ref - 1))
    assert worst <= 1e-3


def test_each_micro_batch_its_own_compute_time_matches_the_reference():
    """Replaying measured operations (benchmarks/overlap.py): every forward and backward with its own duration,
    on random pipelines with slow links and mixed schedules, agrees with the tick-by-tick reference."""
    rng = random.Random(11)
    for _ in range(60):
        p, m, f, b, occ, lat, blk, depth = _case(rng)
        fs = [[rng.randint(1, 9) for _ in range(m)] for _ in range(p)]
        bs = [[rng.randint(1, 18) for _ in range(m)] for _ in range(p)]
        ref = reference_makespan(fs, bs, occ, lat, m, blk, depth)
        got = simulate_1f1b(fs, bs, [o + a for o, a in zip(occ, lat)], m, latency=lat, blocking=blk,
                            depth=depth)
        assert got.makespan == ref and got.busy == tuple(sum(x) + sum(y) for x, y in zip(fs, bs))


def test_many_micro_batches_jumping_the_steady_state_equal_the_reference(monkeypatch):
    """The search's case (one compute time per stage, many micro-batches) runs in rounds and jumps over the steady
    state once a round repeats an earlier one (plan/pipeline_rounds.py). On random pipelines with slow links, mixed
    schedules and depths, and 40-160 micro-batches, it equals the tick-by-tick reference exactly; among the cases
    are schedules whose period spans one round and ones whose period spans several."""
    from hetauto_megatron.plan import pipeline_rounds
    periods = []
    repeats = pipeline_rounds._repeats

    def counted(now, seen, longest):
        c = repeats(now, seen, longest)
        periods.append(c)
        return c
    monkeypatch.setattr(pipeline_rounds, "_repeats", counted)
    rng = random.Random(29)
    for _ in range(40):
        p, _, f, b, occ, lat, blk, depth = _case(rng)
        m = rng.randint(40, 160)
        ref = reference_makespan(f, b, occ, lat, m, blk, depth)
        got = simulate_1f1b(f, b, [o + a for o, a in zip(occ, lat)], m, latency=lat, blocking=blk, depth=depth)
        assert got.makespan == ref, (p, m, f, b, occ, lat, blk, depth)
        assert got.busy == tuple(m * (x + y) for x, y in zip(f, b))
    assert 1 in periods and any(c > 1 for c in periods), sorted(set(periods))


def test_a_million_micro_batches_keep_only_the_arrival_times_the_rounds_touch(monkeypatch):
    """With many micro-batches per stage the rounds keep their arrival times in a dict of those written
    (pipeline_rounds.SPARSE_FROM), and a stage's busy time is added up without a list of its m compute times: a
    global batch of 1,000,000 allocated lists of millions of zeros per simulation and took most of a search. On
    random pipelines (2-6 stages, slow links, mixed schedules and depths) the result is the list's to the last bit,
    and the event loop's (each micro-batch its own compute time: every operation visited); and it does not build
    the lists (a million micro-batches on three stages: under 2 MiB at the peak, where the lists took 92 MiB)."""
    import tracemalloc
    from hetauto_megatron.plan import pipeline_rounds
    rng = random.Random(41)
    for _ in range(12):
        p, _, f, b, occ, lat, blk, depth = _case(rng)
        m = rng.randint(32 * p * p, 32 * p * p + 600)
        x = [o + a for o, a in zip(occ, lat)]
        sparse = simulate_1f1b(f, b, x, m, latency=lat, blocking=blk, depth=depth)
        with monkeypatch.context() as mp:
            mp.setattr(pipeline_rounds, "SPARSE_FROM", 10 ** 9)     # the list, as before
            dense = simulate_1f1b(f, b, x, m, latency=lat, blocking=blk, depth=depth)
        loop = simulate_1f1b([[v] * m for v in f], [[v] * m for v in b], x, m, latency=lat, blocking=blk,
                             depth=depth)
        assert (sparse.makespan, sparse.finish, sparse.busy) == (dense.makespan, dense.finish, dense.busy)
        assert sparse.makespan == loop.makespan and sparse.busy == loop.busy
    tracemalloc.start()
    try:
        big = simulate_1f1b([0.011, 0.013, 0.012], [0.022, 0.026, 0.025], [0.004, 0.03], 1_000_000,
                            latency=[0.001, 0.002], blocking=[True, False], depth=[0, 2])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2 ** 20, peak
    assert big.makespan > 1_000_000 * 0.039 and big.busy[1] == pytest.approx(1_000_000 * 0.039, rel=1e-12)


def test_a_simulation_stopped_above_a_bound_only_stops_where_the_full_simulation_is_above_it():
    """simulate_1f1b(above=T) may stop its rounds once it proves the makespan above T (pipeline_rounds._beyond:
    the round map is max-plus linear, so a growth seen over c rounds repeats). On random pipelines (3-10 stages,
    300-500 micro-batches, links of any speed, mixed schedules), for bounds from 0.5x to 1.05x the makespan of the
    operation-by-operation simulation (record=True: no rounds): it answers None only below that makespan (never at
    1x or above), else that makespan; and it does stop on some (most schedules repeat within a few rounds, and
    then the jump leaves nothing to stop)."""
    rng = random.Random(31)

    def stops(pipeline) -> int:
        p, m, f, b, link, lat, blk, depth = pipeline
        full = simulate_1f1b(f, b, link, m, latency=lat, blocking=blk, depth=depth, record=True).makespan
        stopped = 0
        for share in (0.5, 0.8, 0.95, 0.999, 1.0, 1.05):
            got = simulate_1f1b(f, b, link, m, latency=lat, blocking=blk, depth=depth, above=share * full)
            if got is None:
                assert full > share * full, (p, m, f, b, link, lat, blk, depth, share)
                stopped += 1
            else:
                assert got.makespan == pytest.approx(full, rel=1e-9)
        return stopped

    stopped = sum(side_by_side(stops, [random_pipeline(rng, 3, (300, 500)) for _ in range(40)]))
    assert stopped >= 4, stopped


def test_the_event_simulation_of_a_losing_depth_stops_early_and_the_choice_is_the_same():
    """The final ranking simulates a layout at depth 0 and at the deeper warm-up overlap.choose_depths tries, and
    keeps the faster: depth 0 now only until it is proven slower. LLaMA-2-70B on the 736-device example without its
    H800s, 1,024 micro-batches on 56 stages: at depth 0 the links are exposed (44 s against 23 s) and that
    simulation's transient ran 823 rounds before its period repeated. The layout's price is the plan's own
    (simulate() of the plan written from it, which simulates in full), and the depth-0 simulation stops within
    CHECK_EVERY rounds of its start."""
    import os
    from hetauto_megatron.cost.analytic import AnalyticCostModel
    from hetauto_megatron.plan import pipeline_rounds
    from hetauto_megatron.plan.layout_pricing import evaluate_layout, layout_to_plan
    from hetauto_megatron.plan.simulate import MeshChoice, simulate
    from hetauto_megatron.spec.inventory import inventory_from_dict, load_inventory
    from hetauto_megatron.spec.model import PRESETS
    d = load_inventory(os.path.join(os.path.dirname(__file__), "..", "examples", "llama",
                                    "inventory-4clusters-736.yaml")).to_dict()
    d["clusters"] = [c for c in d["clusters"] if c["name"] != "h800"]
    d["links"] = [x for x in d.get("links", []) if "h800" not in x["between"]]
    inv, model = inventory_from_dict(d), PRESETS["llama2-70b"]
    choices = [MeshChoice("ascend", 8, 1, 1, "none", 13), MeshChoice("a100", 8, 1, 1, "none", 31),
               MeshChoice("mi300x", 8, 1, 1, "none", 12)]
    rounds = []
    beyond = pipeline_rounds._beyond

    def counted(now, seen, r, *args):
        out = beyond(now, seen, r, *args)
        rounds.append((r, out))
        return out
    pipeline_rounds._beyond = counted
    try:
        res = evaluate_layout(model, inv, choices, 1024, AnalyticCostModel(), exact=True)
    finally:
        pipeline_rounds._beyond = beyond
    assert res.boundaries == (3, 3, None)
    plan = layout_to_plan(model, 1024, choices, res.stage_layers, inv, boundaries=res.boundaries)
    assert res.iteration_time_s == simulate(plan, inv).iteration_time_s
    assert [r for r, out in rounds if out] == [pipeline_rounds.CHECK_EVERY], rounds


def test_blocking_send_holds_the_sender():
    """Two stages, a link as slow as the forward: blocking holds the sender for every send, overlapped does not.
    Each send holds its stage the link's 1 s once the receiver has posted its receive (rendezvous): stage 0's
    forward 1 ends at 3, but stage 1 posts its receive with the send of its backward 0, which ends at 5 (forward
    0 from 2 to 3, backward 0 until 5), so the activation moves from 5 to 6; stage 0 is held from 5 (from 3 to 5
    it waits for stage 1's compute: the bubble, not a send)."""
    f, b, x, m = [1.0, 1.0], [2.0, 2.0], [1.0], 8
    blocking = simulate_1f1b(f, b, x, m, blocking=[True], record=True)
    overlapped = simulate_1f1b(f, b, x, m, blocking=[False], record=True)
    assert overlapped.makespan < blocking.makespan
    held = {(e.resource[1], e.micro_batch): (e.start, e.end) for e in blocking.events if e.kind == "send"}
    assert len(held) == 2 * m and held[(0, 1)] == (5.0, 6.0)
    assert all(end - start == pytest.approx(1.0) for start, end in held.values())
    assert not [e for e in overlapped.events if e.kind == "send"]


def test_link_queue_and_latency():
    """A link slower than the stage is its own pipeline stage: transfers queue in one direction, the latency does
    not occupy it. Forward-only chain: stage 0 forwards every 1 s, the link needs 3 s a transfer plus 5 s flight."""
    t = simulate_1f1b([1.0, 1.0], [1e-9, 1e-9], [8.0], 4, latency=[5.0], blocking=[False], depth=[4], record=True)
    starts = [e.start for e in t.events if e.resource == ("link", 0, "fwd")]
    assert starts == pytest.approx([1.0, 4.0, 7.0, 10.0])


def test_overlapped_depth_lets_the_link_hide():
    """Depth d keeps d more micro-batches on the wire: with a link round trip of 3 stage times (mostly latency),
    overlapping with depth 3 comes within 10% of the pipeline with a free link; blocking and depth 0 do not."""
    f, b, m = [1.0] * 4, [2.0] * 4, 64
    free = simulate_1f1b(f, b, [0.0] * 3, m).makespan
    x, lat = [0.0, 4.5, 0.0], [0.0, 4.0, 0.0]
    blocking = simulate_1f1b(f, b, x, m, latency=lat).makespan
    kw = dict(latency=lat, blocking=[True, False, True])
    shallow = simulate_1f1b(f, b, x, m, depth=[0, 0, 0], **kw).makespan
    deep = simulate_1f1b(f, b, x, m, depth=[0, 3, 0], **kw).makespan
    assert deep <= free * 1.10 < shallow < blocking
    assert warmup_counts(4, m, [0, 3, 0]) == (6, 5, 1, 0)


def test_a_plans_overlapped_boundaries_set_warm_up_and_memory():
    # one rule for the planner's memory model, the dry run's prediction and the runtime's warm-up (what Megatron's
    # 1F1B reads from the communicator's total_stages): cluster a's two stages, then an overlapped boundary of
    # depth 2 into cluster b's two stages
    from helpers import mesh

    from hetauto_megatron.plan.layout import PipelineLayout
    from hetauto_megatron.plan.plan import plan_from_dict

    plan = plan_from_dict({"version": 2, "model": {"preset": "tiny"}, "global_batch_size": 16, "meshes": [
        {**mesh("a", 1, 1, 2, [2, 2]), "boundary": {"schedule": "overlapped", "depth": 2}},
        mesh("b", 1, 1, 2, [2, 2])]})
    layout = PipelineLayout(plan)
    assert layout.boundary_depths == [None, 2, None]
    assert layout.warmup_forwards == warmup_forwards(4, [0, 2, 0]) == (5, 4, 1, 0)   # 1F1B's p - s - 1, plus 2
    assert warmup_counts(4, 3, [0, 2, 0]) == (3, 3, 1, 0)    # never more than the micro-batches
    assert layout.num_micro_batches == 8
    assert layout.memory_terms_on(lambda mesh: False) == memory_terms(4, 8, [True, False, True], [0, 2, 0]) == \
        ([6, 5, 2, 1], [0, 4, 3, 0])
    # on CPU processes each side also holds its sends in flight (plan/pipeline_memory.py side_buffers): the side before its
    # last d + 2 = 4 activations, the side after (2 in flight, 6 messages left) min(6, 2d + 3) messages ahead and
    # gradients sent together
    assert layout.memory_terms == ([6, 5, 2, 1], [0, 8, 6, 0])


def _closed_form_errors() -> list[float]:
    """1 - simulation / closed form over 400 random pipelines of 32-128 micro-batches, sorted; every closed form
    at or above its simulation (asserted here)."""
    rng = random.Random(0)
    errs = []
    for _ in range(400):
        p, m, f, b, link, lat, blk, depth = random_pipeline(rng)
        kw = dict(latency=lat, blocking=blk, depth=depth)
        sim, est = simulate_1f1b(f, b, link, m, **kw).makespan, estimate_1f1b(f, b, link, m, **kw)
        assert sim <= est * (1 + 1e-9)
        errs.append(1 - sim / est)
    return sorted(errs)


def test_closed_form_never_undercuts_the_event_simulation():
    """The search screens with the closed form and re-ranks with the simulation: a closed form below a candidate's
    simulation would drop it unseen."""
    assert len(_closed_form_errors()) == 400


@pytest.mark.xfail(strict=True, reason="measured 1.1 % at the median and 5.0 % at the 90th percentile since the "
                   "rendezvous of blocking transfers is priced (the warm-up's and cool-down's waits counted in full, "
                   "pipeline.py `_rendezvous_waits`; 0.8 % and 4.1 % before); a tighter count undercut the "
                   "simulation by up to 2.8 %")
def test_closed_form_is_within_1_percent_at_the_median_and_5_at_the_90th_percentile():
    """The screen's accuracy target over the same 400 random pipelines."""
    errs = _closed_form_errors()
    assert errs[len(errs) // 2] < 0.01 and errs[int(0.9 * len(errs))] < 0.05


def _period_by_every_run(f, b, link, m, blk, depth):
    """The closed form's period as its definition reads (pipeline.py's docstring): every run of stages i..k and
    every overlapped link direction, one by one."""
    p = len(f)
    stage = [x + y for x, y in zip(f, b)]
    for l in range(p - 1):
        if blk[l]:
            stage[l] += link[l]
            stage[l + 1] += link[l]
    w = [min(m, p - i - 1 + sum(depth[i:])) for i in range(p)]
    if m > 1:   # each receive Megatron calls on its own waits for its whole transfer (rendezvous), per period
        for q in range(p):
            if q and blk[q - 1]:
                stage[q] += min(w[q], m - 1) * link[q - 1] / (m - 1)
            if q < p - 1 and blk[q]:
                stage[q] += w[q] * link[q] / (m - 1)
    best = max([0.0] + [x for x, bl in zip(link, blk) if not bl])      # latency 0: the whole transfer occupies
    for i in range(p):
        for k in range(i, p):
            if k > i and w[i] == m:         # its warm-up takes every micro-batch: no forward after a backward
                continue
            run = sum(stage[i:k + 1]) + sum(2 * link[l] for l in range(i, k) if not blk[l])
            best = max(best, run / min(w[i] - w[k] + 1, m))
    return best


def test_closed_form_with_fewer_micro_batches_than_the_warm_up():
    """Where the first stage's warm-up takes every micro-batch, it and the stages like it run no forward after a
    backward. Hand figures: 4 equal stages (f 1 s, b 2 s), 2 micro-batches: (m + p - 1)(f + b) = 15 s, with or
    without an overlapped boundary's depth (the closed form gave 18 and 21: the whole pipeline's round trip shared
    by 2 micro-batches, or by 4/3 with the depth, as the period). Random pipelines with m at most the first stage's
    warm-up, against the event simulation: never below it, within 10 % at the median (was 22-67 %,
    benchmarks/closed_forms.py)."""
    f, b, x = [1.0] * 4, [2.0] * 4, [0.0] * 3
    assert estimate_1f1b(f, b, x, 2) == pytest.approx(15.0) == simulate_1f1b(f, b, x, 2).makespan
    kw = dict(blocking=[False] * 3, depth=[1] * 3)
    assert estimate_1f1b(f, b, x, 2, **kw) == pytest.approx(15.0) == simulate_1f1b(f, b, x, 2, **kw).makespan
    rng = random.Random(4)
    errs = []
    while len(errs) < 300:
        p, m, f, b, link, lat, blk, depth = random_pipeline(rng, 2, micro_batches=tuple(range(2, 40)))
        if m > warmup_forwards(p, depth)[0]:
            continue
        kw = dict(latency=lat, blocking=blk, depth=depth)
        sim, est = simulate_1f1b(f, b, link, m, **kw).makespan, estimate_1f1b(f, b, link, m, **kw)
        assert sim <= est * (1 + 1e-9)
        errs.append(est / sim - 1)
    assert sorted(errs)[len(errs) // 2] < 0.10, sorted(errs)[len(errs) // 2]


def test_closed_form_equals_its_definition_run_by_run():
    """estimate_1f1b finds the period in a few linear passes (single stages, Dinkelbach's iteration where an
    overlapped link beats its depth; no run from a saturated front): the same as trying every run of
    stages, on pipelines of up to 60 stages, few micro-batches (a saturated front) or many, equal stages (ties)
    or not, every boundary schedule."""
    rng = random.Random(21)
    worst = 0.0
    for _ in range(600):
        p, m = rng.choice([1, 2, 3, 5, 9, 20, 60]), rng.choice([1, 2, 3, 5, 16, 64, 512])
        even = rng.random() < 0.5
        f = [1.0 if even else rng.uniform(0.2, 3) for _ in range(p)]
        b = [2 * x for x in f]
        link = [rng.choice([0.0, rng.uniform(0, 0.3), rng.uniform(0, 8)]) for _ in range(p - 1)]
        blk = [rng.random() < 0.6 for _ in range(p - 1)]
        depth = [0 if x else rng.choice([0, 0, 1, 3, 30]) for x in blk]
        got = estimate_1f1b(f, b, link, m, blocking=blk, depth=depth)
        want = sum(f) + sum(b) + 2 * sum(link) + (m - 1) * _period_by_every_run(f, b, link, m, blk, depth)
        worst = max(worst, abs(got - want) / want)
    assert worst < 1e-12


def test_recorded_events_never_overlap_on_a_resource():
    rng = random.Random(5)
    for _ in range(60):
        p, m, f, b, occ, lat, blk, depth = _case(rng)
        t = simulate_1f1b(f, b, [o + a for o, a in zip(occ, lat)], m, latency=lat, blocking=blk, depth=depth,
                          record=True)
        by = {}
        for e in t.events:
            by.setdefault(e.resource, []).append(e)
            if e.resource[0] == "link":
                assert e.arrival == e.end + lat[e.resource[1]]
        for evs in by.values():
            evs.sort(key=lambda e: (e.start, e.end))
            assert all(a.end <= c.start for a, c in zip(evs, evs[1:]))


def test_overlapped_boundary_memory_counts_warmup_and_buffers():
    """Depth d on the boundary after mesh 0: each stage of mesh 0 holds d more micro-batches of its layers'
    activations (and the first stage d more token ids, their masks at TP > 1, and embedding dropout masks with
    dropout on); the two stages at the boundary hold the messages they receive ahead, boundary tensors (sequence x
    micro-batch x hidden): d + 2 gradients before it, d + 1 activations after it (the one taken is the stage's
    input, priced with its layers); mesh 1 beyond the boundary stage is unchanged."""
    import dataclasses

    from hetauto_megatron.cost.activations import layer_activation_bytes
    from hetauto_megatron.cost.memory import GIB
    from hetauto_megatron.plan.plan import Mesh, Plan
    from hetauto_megatron.plan.simulate import simulate
    from hetauto_megatron.spec.inventory import load_inventory
    from hetauto_megatron.spec.model import PRESETS

    inv = load_inventory("examples/llama/inventory-2clusters.yaml")
    model = PRESETS["llama2-13b"]
    a = Mesh("h800", "h800", 2, 4, 1, "none", (10, 10))
    b = Mesh("ascend", "ascend-910b", 4, 2, 2, "selective", (12, 8))
    d = 3
    base = simulate(Plan(model, 128, (a, b)), inv)
    deep = simulate(Plan(model, 128, (dataclasses.replace(a, boundary_schedule="overlapped", boundary_depth=d), b)),
                    inv)
    h, s = model.hidden_size, model.seq_length
    act = layer_activation_bytes(model, 2, 1, "none", sequence_parallel=a.settings.sequence_parallel)
    # each rank's piece of a boundary tensor: split over TP by sequence under sequence parallelism
    sp_a, sp_b = (m.tp if m.settings.sequence_parallel else 1 for m in (a, b))
    boundary_a, boundary_b = (d + 2) * 2 * s * 1 * h / sp_a, (d + 1) * 2 * s * 2 * h / sp_b
    # int64 ids, the vocabulary-parallel embedding's bool mask at TP 2 (1 byte per id), and a 1-byte embedding
    # dropout mask when the mesh's settings have hidden dropout (default: none)
    mask = s * h / (2 if a.settings.sequence_parallel else 1) if a.settings.hidden_dropout else 0.0
    first_extra = d * (8 * s + s + mask)
    want = [d * 10 * act + first_extra, d * 10 * act + boundary_a, boundary_b, 0.0]
    got = [(x - y) * GIB for x, y in zip(deep.memory_gib, base.memory_gib)]
    assert got == pytest.approx(want, rel=1e-9, abs=1.0)


def test_shared_uplinks_event_simulation_equals_brute_force_reference():
    """200 random pipelines through several clusters whose uplinks the two boundaries of a middle cluster share
    (plan/shared_uplinks.py), shares of the uplink from a half to all of it: the event simulation and the
    tick-by-tick reference, which starts waiting transfers tick by tick, agree. In many cases the uplink slows
    the pipeline (it would not test much otherwise)."""
    rng = random.Random(7)
    slower = 0
    for _ in range(200):
        p, m, f, b, occ, lat, blk, depth = _case(rng)
        occ = [max(o, 1) for o in occ]
        ups = shared_uplinks_draw(rng, p, occ)
        x = [o + a for o, a in zip(occ, lat)]
        ref = reference_makespan(f, b, occ, lat, m, blk, depth, ups)
        got = simulate_1f1b(f, b, x, m, latency=lat, blocking=blk, depth=depth, uplinks=ups).makespan
        assert got == pytest.approx(ref, rel=1e-9)
        slower += got > simulate_1f1b(f, b, x, m, latency=lat, blocking=blk, depth=depth).makespan
    assert slower >= 40


def test_closed_form_with_shared_uplinks_does_not_undercut_the_event_simulation():
    """With shared uplinks the closed form adds each transfer's wait for the others' time on a contended uplink
    direction and that direction's own period: the search screens with it, so it must not promise a pipeline
    faster than the event simulation gives, for Megatron's 1F1B and for DeepSpeed's schedule (its closed form:
    the waits on its link times, then doubled), with many micro-batches or few. Within 0.5 %: on 12,000 such
    random pipelines (9,002 with a contended uplink) it fell short once, by 0.3 %."""
    rng = random.Random(0)
    for k in range(400):
        p, m, f, b, link, lat, blk, depth = random_pipeline(rng, min_stages=2)
        m = m if k % 2 else rng.choice([1, 2, 3, 5, 8])
        ups = shared_uplinks_draw(rng, p, [x - a for x, a in zip(link, lat)], whole=False)
        kw = dict(latency=lat, blocking=blk, depth=depth, uplinks=ups)
        assert simulate_1f1b(f, b, link, m, **kw).makespan <= estimate_1f1b(f, b, link, m, **kw) * 1.005
        ds = estimate_1f1b(f, b, deepspeed_links(link, ups), m, rendezvous=False)
        assert simulate_deepspeed(f, b, link, m, ups)[0] <= ds * 1.005
