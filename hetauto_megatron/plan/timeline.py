"""A pipeline timeline: what every stage (or rank) and every link does over one iteration (pure data).

Lanes are pipeline stages, link directions, or (measured) ranks; spans are what a lane does from `start` to
`end` (seconds from the iteration's start), of these kinds:
    forward, backward    compute of one micro-batch;
    send                 on a link lane: one micro-batch's activation (or its gradient) crossing;
                         on a stage or rank lane: the time it is held by a send it does not overlap (predicted:
                         from when its receiver posted the receive; waiting for that is idle);
    receive              waiting for data that is on its link (exposed communication);
    idle                 waiting for another stage's compute (the bubble), or done and waiting for the others;
    dp-sync, optimizer   the gradient synchronisation not hidden by compute (the DP reduction; where several
                         stages hold a parameter, their exchange; the global norm), and the optimizer step;
    overhead             the cost model's fixed per-iteration time (zeroing gradients, grad norm, logging);
    exchange             on the lanes of the gradient exchange across holders (plan/exchange_lanes.py): a step
                         of it, or a link (uplink, cluster network) busy with it;
    norm                 on the lane of the global gradient norm: its all-reduce across every rank.
`predicted_timeline` builds one from the simulator (plan/simulate.py and the event simulation of
plan/pipeline.py; plan/multi_simulate.py for several pipelines or replica groups side by side);
runtime/op_timing.py builds the measured one of a dry run. emit/trace.py writes either as a
Chrome/Perfetto trace, emit/picture.py draws them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("forward", "backward", "send", "receive", "idle", "dp-sync", "optimizer", "overhead", "exchange", "norm")
_EVENT_KIND = {"F": "forward", "B": "backward", "send": "send", "recv": "receive"}


@dataclass(frozen=True)
class Lane:
    name: str                    # "stage 3", "activations a->b (3->4)", "rank 5 (stage 2)"
    cluster: str                 # the cluster it runs on; a link between clusters: "a -> b"
    kind: str                    # "stage" | "link" | "rank" | "exchange" (cluster: "gradient exchange") | "norm"
    stage: int | None = None     # pipeline stage (stage and rank lanes), first stage of the boundary (links)
    inter_cluster: bool = False  # a link lane between two clusters
    pipeline: int = 0            # the plan's pipeline (several: plan format version 3)
    mesh: int | None = None      # the plan's mesh of a stage or rank lane, where a stage has several (or measured)


@dataclass(frozen=True)
class Span:
    lane: int                    # index into Timeline.lanes
    kind: str                    # one of KINDS
    start: float                 # seconds from the iteration's start
    end: float
    micro_batch: int | None = None
    label: str | None = None     # what the trace names it, where its kind and micro-batch do not say it

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    title: str
    lanes: list[Lane]
    spans: list[Span]
    iteration_s: float
    clusters: list[str] = field(default_factory=list)   # in pipeline order: the colour order
    source: str = "predicted"                            # "predicted" | "measured"

    def busy(self, lane: int) -> float:
        """Compute seconds of a lane (its forward and backward spans)."""
        return sum(s.duration for s in self.spans if s.lane == lane and s.kind in ("forward", "backward"))


def _fill(spans: list[Span], lane: int, t0: float, t1: float, kind: str, out: list[Span], label=None) -> None:
    if t1 - t0 > 1e-12:
        out.append(Span(lane, kind, t0, t1, label=label))


# The most forwards and backwards a predicted timeline draws: every operation becomes events, spans, a rectangle
# and a trace entry (a few kB each), so a global batch of a million samples took gigabytes and minutes and ended in
# a MemoryError where the plan alone takes 0.2 s; a real plan's iteration (16,384 devices) takes tens of thousands.
MAX_TIMELINE_OPERATIONS = 200_000


def timeline_operations(plan) -> int:
    """Forwards and backwards of one iteration of `plan`, over every pipeline stage of every pipeline."""
    from .layout import PipelineLayout
    total = 0
    for pipe in sorted({m.pipeline for m in plan.meshes}):
        layout = PipelineLayout(plan, pipe)
        total += 2 * layout.num_stages * layout.num_micro_batches
    return total


def check_timeline_size(plan, flag: str = "--timeline") -> None:
    """Refuse a timeline too large to draw (MAX_TIMELINE_OPERATIONS), before anything is written."""
    from ..errors import InputError
    n = timeline_operations(plan)
    if n > MAX_TIMELINE_OPERATIONS:
        raise InputError(f"the plan's iteration runs {n:,} forwards and backwards, more than a timeline draws "
                         f"({MAX_TIMELINE_OPERATIONS:,}: every one takes a few kB of events and trace)", field=flag,
                         fix="draw the plan at a smaller --global-batch-size (its schedule repeats), or drop "
                             "--timeline")


def predicted_timeline(plan, inventory, cost_model=None, *, title: str | None = None,
                       engine: str | None = None) -> Timeline:
    """The simulator's schedule of one iteration of `plan` as `engine` runs it (None: the plan's; Megatron's 1F1B
    or DeepSpeed's lock-step TrainSchedule), then the DP sync and optimizer tail each stage has after the pipeline
    drained, as the iteration time counts it. Every plan shape: several pipelines or replica groups side by side
    are drawn by _shapes_timeline (Megatron's engine runs those)."""
    if not plan.is_simple:
        return _shapes_timeline(plan, inventory, cost_model, title)
    from .exchange_lanes import sync_spans
    from .explain import breakdown
    from .simulate import simulate, tail_sync_terms
    from .holders_exchange import holders_sync_time
    engine = engine or plan.engine
    priced: dict = {}       # the pipeline the estimate priced, replayed below: built once
    est = simulate(plan, inventory, cost_model, engine=engine, priced=priced).to_dict()
    st = est["stages"]
    p, m = len(st), plan.num_micro_batches
    events, makespan = _pipeline_events(plan, priced["model"], priced["pipe"], engine)
    T = est["iteration_time_s"]
    parts = breakdown(est, m)["parts"]
    tail_end = T - parts["overhead"]["seconds"]
    clusters = list(dict.fromkeys(s["cluster"] for s in st))
    lanes = [Lane(f"stage {i}", st[i]["cluster"], "stage", i) for i in range(p)]
    link_lane = _link_lanes("", 0, [([s["cluster"]], i) for i, s in enumerate(st)], lanes)
    spans: list[Span] = []
    per_stage = _link_spans(events, link_lane, spans)
    # the job-wide sync on every stage, as sync_s prices it: the tied table's holders' exchange (where its first
    # and last stages hold it), then the engine's result check and the global norm; lanes of their own show them
    # (plan/exchange_lanes.py)
    inv, blocks, check, norm = tail_sync_terms(plan, priced, engine)
    for i in range(p):
        t = 0.0
        for e in per_stage.get(i, []):         # F, B, send (held by a blocking send), recv (its input is on the link)
            _fill(spans, i, t, e.start, "idle", spans)      # waiting for another stage's compute
            spans.append(Span(i, _EVENT_KIND.get(e.kind, e.kind), e.start, e.end, e.micro_batch))
            t = max(t, e.end)
        _fill(spans, i, t, makespan, "idle", spans)
    start = _tail_spans(spans, [(i, st[i], i) for i in range(p)], makespan, makespan,
                        (holders_sync_time(inv, blocks), check, norm), tail_end, T)
    sync_spans(inv, blocks, norm, plan.world_size, start, lanes, spans, check)
    spans.sort(key=lambda s: (s.lane, s.start))
    name = title or (f"predicted: {plan.model.name}, {_count(p, 'stage')}, {_count(m, 'micro-batch')}, "
                     f"{T:.4g} s per iteration" + (f", as {ENGINE_NAMES[engine]} runs it" if engine != "megatron" else ""))
    return Timeline(name, lanes, spans, T, clusters, "predicted")


def _tail_spans(spans, lanes, makespan, exchange, sync, tail_end, T) -> float:
    """The tail of one pipeline's lanes [(lane, estimate row, stage)] as the runtime runs it and the iteration time
    counts it (tail_costs.iteration_tail): each lane's exposed DP reduction after `makespan`, the wait for the
    slowest (`exchange`: its end, or the slowest pipeline's), the job-wide sync (`sync`: the holders' exchange, the
    result check and the global norm, seconds; each a span of its own, named), the optimizer step (and a gather not
    overlapped), then the parameter gathers of the next iteration's first forwards, one stage after the other along
    the pipeline (each waits for its input, so they add up), then the fixed overhead. Returns where the sync starts."""
    exchange = max([exchange] + [makespan + row.get("dp_reduce_s", 0.0) for _, row, _ in lanes])
    exchanged = exchange + sync[0]
    checked = exchanged + sync[1]
    synced = checked + sync[2]
    stepped = synced + max(row.get("optimizer_s", 0.0) + row.get("gather_step_s", 0.0) for _, row, _ in lanes)
    chain, at = {}, stepped          # per stage: when its gather starts (after the stages before it gathered)
    for stage in sorted({s for _, _, s in lanes}):
        chain[stage] = at
        at += max(row.get("gather_fill_s", 0.0) for _, row, s in lanes if s == stage)
    for lane, row, stage in lanes:
        c = lambda x: min(x, tail_end)      # noqa: E731
        r = c(makespan + row.get("dp_reduce_s", 0.0))
        o = c(synced + row.get("optimizer_s", 0.0))
        g = c(o + row.get("gather_step_s", 0.0))
        f0 = c(chain[stage])
        f1 = c(f0 + row.get("gather_fill_s", 0.0))
        for kind, t0, t1, label in (
                ("dp-sync", makespan, r, None), ("idle", r, c(exchange), None),
                ("dp-sync", c(exchange), c(exchanged), "gradient exchange across holders"),
                ("dp-sync", c(exchanged), c(checked), "result check"),
                ("dp-sync", c(checked), c(synced), "global gradient norm"), ("optimizer", c(synced), o, None),
                ("dp-sync", o, g, None), ("idle", g, f0, None), ("dp-sync", f0, f1, None),
                ("idle", f1, tail_end, None), ("overhead", tail_end, T, None)):
            _fill(spans, lane, t0, t1, kind, spans, label)
    return exchange


def _link_spans(events, link_lane: dict, spans: list[Span]) -> dict[int, list]:
    """Appends each link transfer of a simulation's `events` to its link lane's spans; returns the other events
    per stage, in start order. A link lane shows the link busy with each transfer; the latency after it is in
    flight, not on the link (the next transfer may start): the data arrives at the event's `arrival`, after the
    span's end."""
    per_stage: dict[int, list] = {}
    for e in events:
        if e.resource[0] == "link":
            _, i, d = e.resource
            spans.append(Span(link_lane[(i, d)], "send", e.start, e.end, e.micro_batch))
        else:
            per_stage.setdefault(e.resource[1], []).append(e)
    for stage_events in per_stage.values():
        stage_events.sort(key=lambda e: e.start)
    return per_stage


ENGINE_NAMES = {"megatron": "Megatron's 1F1B", "deepspeed": "DeepSpeed's pipeline engine"}


def _pipeline_events(plan, model, pipe, engine: str) -> tuple[list, float]:
    """(every operation, makespan) of a simple plan's pipeline as the estimate of `engine` simulated it, from the
    same unrounded passes and links of the pipeline it priced (`pipe`, and the padded `model`: simulate's
    `priced`): Megatron's 1F1B with each boundary's schedule, DeepSpeed's TrainSchedule with the all-gathers of its
    partitioned transfers. (Re-run from the estimate's stages, rounded to the microsecond, 1F1B drifted from
    pipeline_s and busy_s by up to 0.1 ms over 128 micro-batches.)"""
    from .simulate import plan_boundaries
    m = plan.num_micro_batches
    p, layers = len(pipe.profs), plan.stage_layers
    passes = [prof.times(layers[i], i == 0, i == p - 1) for i, prof in enumerate(pipe.profs)]
    fwd, bwd = [f for f, _ in passes], [b for _, b in passes]
    if engine == "deepspeed":
        from .deepspeed_schedule import simulate_deepspeed
        from .simulate import deepspeed_passes
        events: list = []
        makespan, _ = simulate_deepspeed(*deepspeed_passes(model, pipe.profs, fwd, bwd), pipe.links, m, pipe.uplinks,
                                         events=events)
        return events, makespan
    from .pipeline import simulate_1f1b
    blocking, depth = pipe.boundary_schedule(plan_boundaries(plan))
    run = simulate_1f1b(fwd, bwd, pipe.links, m, latency=pipe.latency, blocking=blocking, depth=depth,
                        uplinks=pipe.uplinks, record=True)
    return list(run.events), run.makespan


def _link_lanes(tag: str, pipeline: int, ends: list[tuple[list[str], int]], lanes: list[Lane]) -> dict:
    """A lane per direction of each boundary between consecutive stages, appended to `lanes`; `ends[i]`: stage i's
    clusters (one per replica group) and its position. {(boundary, "fwd" | "bwd"): lane index}."""
    out = {}
    for i, ((a, pa), (b, pb)) in enumerate(zip(ends, ends[1:])):
        A, B = "+".join(a), "+".join(b)
        # inside a position each group sends to its own next stage on its own cluster; between positions the
        # samples cross to whichever clusters hold them
        inter = pa != pb and len(set(a) | set(b)) > 1
        cl = f"{A} -> {B}" if inter else A
        cross, back = (f" {A}->{B}", f" {B}->{A}") if inter else ("", "")
        for d, what in (("fwd", f"activations{cross} ({i}->{i + 1})"), ("bwd", f"gradients{back} ({i + 1}->{i})")):
            out[(i, d)] = len(lanes)
            lanes.append(Lane(f"{tag}{what}", cl, "link", i, inter, pipeline))
    return out


def _shapes_timeline(plan, inventory, cost_model, title: str | None) -> Timeline:
    """Several pipelines and/or replica groups side by side in a stage (plan/multi_simulate.py), as priced there.
    A lane per stage and replica group of each pipeline: a stage runs a micro-batch step when its slowest group
    has, so a faster group computes for its own time and then waits (idle). After its pipeline drained, each lane
    shows its own DP reduction, waits for the slowest pipeline, then the gradient exchange across the holders of
    each parameter and the global gradient norm (dp-sync), its optimizer step and the fixed overhead. Lanes of
    their own show that exchange's steps, the links it keeps busy and the norm (plan/exchange_lanes.py)."""
    from .exchange_lanes import sync_spans
    from .multi_simulate import price_shapes, shapes_of
    from .simulate import _DEFAULT_COST, check_plan_against_inventory
    check_plan_against_inventory(plan, inventory)
    inventory = inventory.with_precision(plan.precision)
    res = price_shapes(plan.model, inventory, shapes_of(plan), cost_model or _DEFAULT_COST, record=True)
    T = res.iteration_time_s
    exchange = max(t.before_sync for t in res.pipelines)
    tail_end = T - max(t.overhead_s for t in res.pipelines)
    lanes: list[Lane] = []
    spans: list[Span] = []
    several = len(res.pipelines) > 1
    for p, t in enumerate(res.pipelines):
        tag = f"P{p} " if several else ""
        by_stage: dict[int, list] = {}
        for row in t.stages:
            by_stage.setdefault(row["stage"], []).append(row)
        stage_lanes: dict[int, list] = {}
        for i, rows in sorted(by_stage.items()):
            for row in rows:
                group = f" mesh {row['mesh']}: {row['device_type']} TP{row['tp']} x{row['dp']}" if len(rows) > 1 else ""
                stage_lanes.setdefault(i, []).append((len(lanes), row))
                lanes.append(Lane(f"{tag}stage {i}{group}", row["cluster"], "stage", i, pipeline=p, mesh=row["mesh"]))
        link_lane = _link_lanes(tag, p, [([r["cluster"] for r in rows], rows[0]["position"])
                                      for _, rows in sorted(by_stage.items())], lanes)
        per_stage = _link_spans(t.events, link_lane, spans)
        for i, group_lanes in stage_lanes.items():
            events = per_stage.get(i, [])
            for lane, row in group_lanes:
                own = {"F": row["forward_s"], "B": row["backward_s"]}
                now = 0.0
                for e in events:
                    _fill(spans, lane, now, e.start, "idle", spans)
                    # the group's own compute (the rows' seconds are rounded to the microsecond: the slowest
                    # group's fill the step)
                    end = e.end if e.kind not in own or own[e.kind] >= e.end - e.start - 1e-6 else e.start + own[e.kind]
                    spans.append(Span(lane, _EVENT_KIND.get(e.kind, e.kind), e.start, end, e.micro_batch))
                    now = max(now, end)
                _fill(spans, lane, now, t.makespan, "idle", spans)
        _tail_spans(spans, [(lane, row, i) for i, group_lanes in stage_lanes.items() for lane, row in group_lanes],
                    t.makespan, exchange, (res.replica_sync_s, res.result_check_s, res.grad_norm_s), tail_end, T)
    sync_spans(inventory, res.extra["holders"], res.grad_norm_s, plan.world_size, exchange, lanes, spans,
               res.result_check_s)
    spans.sort(key=lambda s: (s.lane, s.start))
    clusters = list(dict.fromkeys(lane.cluster for lane in lanes if lane.kind == "stage"))
    per = [len({r["stage"] for r in t.stages}) for t in res.pipelines]     # each pipeline's own stages
    stages = sum(per)
    groups = sum(len(t.stages) for t in res.pipelines)
    shape = (f"1 pipeline of {_count(per[0], 'stage')}" if len(per) == 1 else
             f"{len(per)} pipelines of {' + '.join(str(n) for n in per)} stages")
    batches = [t.micro_batches for t in res.pipelines]
    name = title or (f"predicted: {plan.model.name}, {shape}"
                     + (f" ({groups} groups with the replica groups side by side)" if groups > stages else "")
                     + (f", {_count(batches[0], 'micro-batch')}" if len(batches) == 1 else
                        f", {' + '.join(str(b) for b in batches)} micro-batches (by pipeline)")
                     + f", {T:.4g} s per iteration")
    return Timeline(name, lanes, spans, T, clusters, "predicted")


def _count(n: int, word: str) -> str:
    """'1 stage', '2 stages', '1 micro-batch', '4 micro-batches' (a picture's title said '1 stages')."""
    return f"{n} {word}{'' if n == 1 else 'es' if word.endswith('batch') else 's'}"
