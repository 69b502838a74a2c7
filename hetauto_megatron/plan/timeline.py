"""A pipeline timeline: what every stage (or rank) and every link does over one iteration (pure data).

Lanes are pipeline stages, link directions, or (measured) ranks; spans are what a lane does from `start` to
`end` (seconds from the iteration's start), of these kinds:
    forward, backward    compute of one micro-batch;
    send                 on a link lane: one micro-batch's activation (or its gradient) crossing;
                         on a stage or rank lane: the time it is held by a send it does not overlap;
    receive              waiting for data that is on its link (exposed communication);
    idle                 waiting for another stage's compute (the bubble), or done and waiting for the others;
    dp-sync, optimizer   the DP synchronisation not hidden by compute, and the optimizer step;
    overhead             the cost model's fixed per-iteration time (zeroing gradients, grad norm, logging).
`predicted_timeline` builds one from the simulator (plan/simulate.py and the event simulation of
plan/pipeline.py); runtime/op_timing.py builds the measured one of a dry run. emit/trace.py writes either as a
Chrome/Perfetto trace, emit/picture.py draws them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("forward", "backward", "send", "receive", "idle", "dp-sync", "optimizer", "overhead")
_EVENT_KIND = {"F": "forward", "B": "backward", "send": "send", "recv": "receive"}


@dataclass(frozen=True)
class Lane:
    name: str                    # "stage 3", "activations a->b (3->4)", "rank 5 (stage 2)"
    cluster: str                 # the cluster it runs on; a link between clusters: "a -> b"
    kind: str                    # "stage" | "link" | "rank"
    stage: int | None = None     # pipeline stage (stage and rank lanes), first stage of the boundary (links)
    inter_cluster: bool = False  # a link lane between two clusters


@dataclass(frozen=True)
class Span:
    lane: int                    # index into Timeline.lanes
    kind: str                    # one of KINDS
    start: float                 # seconds from the iteration's start
    end: float
    micro_batch: int | None = None

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


def _fill(spans: list[Span], lane: int, t0: float, t1: float, kind: str, out: list[Span]) -> None:
    if t1 - t0 > 1e-12:
        out.append(Span(lane, kind, t0, t1))


def predicted_timeline(plan, inventory, cost_model=None, *, title: str | None = None) -> Timeline:
    """The simulator's schedule of one iteration of `plan` (its 1F1B pipeline, then the DP sync and optimizer
    tail each stage has after the pipeline drained, as the iteration time counts it)."""
    from .explain import breakdown
    from .pipeline import simulate_1f1b
    from .simulate import simulate, stage_schedule
    est = simulate(plan, inventory, cost_model).to_dict()
    st = est["stages"]
    p, m = len(st), plan.num_micro_batches
    fwd = [s["forward_s"] for s in st]
    bwd = [s["backward_s"] for s in st]
    links = [s["send_next_s"] for s in st[:-1]]
    # the simulation the estimate made (each boundary as simulated), every operation recorded
    run = simulate_1f1b(fwd, bwd, links, m, record=True, **stage_schedule(st))
    makespan, T = run.makespan, est["iteration_time_s"]
    parts = breakdown(est, m)["parts"]
    tail_end = T - parts["overhead"]["seconds"]
    clusters = list(dict.fromkeys(s["cluster"] for s in st))
    lanes = [Lane(f"stage {i}", st[i]["cluster"], "stage", i) for i in range(p)]
    link_lane = {}
    for i in range(p - 1):
        a, b = st[i]["cluster"], st[i + 1]["cluster"]
        cl = a if a == b else f"{a} -> {b}"
        cross = f" {a}->{b}" if a != b else ""
        back = f" {b}->{a}" if a != b else ""
        for d, what in (("fwd", f"activations{cross} ({i}->{i + 1})"), ("bwd", f"gradients{back} ({i + 1}->{i})")):
            link_lane[(i, d)] = len(lanes)
            lanes.append(Lane(what, cl, "link", i, a != b))
    spans: list[Span] = []
    per_stage: list[list] = [[] for _ in range(p)]
    # A link lane shows the link busy with each transfer; the latency after it is in flight, not on the link
    # (the next transfer may start): the data arrives at the event's `arrival`, after the span's end.
    for e in run.events:
        if e.resource[0] == "link":
            _, i, d = e.resource
            spans.append(Span(link_lane[(i, d)], "send", e.start, e.end, e.micro_batch))
        else:
            per_stage[e.resource[1]].append(e)
    sync = est.get("sync_s", 0.0)      # the job-wide tied-table holders' / grad-norm exchange, on every stage
    for i, events in enumerate(per_stage):
        events.sort(key=lambda e: e.start)
        t = 0.0
        for e in events:         # F, B, send (held by a blocking send), recv (its input is on the link)
            _fill(spans, i, t, e.start, "idle", spans)      # waiting for another stage's compute
            spans.append(Span(i, _EVENT_KIND.get(e.kind, e.kind), e.start, e.end, e.micro_batch))
            t = max(t, e.end)
        _fill(spans, i, t, makespan, "idle", spans)
        a = min(makespan + st[i].get("dp_exposed_s", 0.0) + sync, tail_end)
        b = min(a + st[i].get("optimizer_s", 0.0), tail_end)
        _fill(spans, i, makespan, a, "dp-sync", spans)
        _fill(spans, i, a, b, "optimizer", spans)
        _fill(spans, i, b, tail_end, "idle", spans)
        _fill(spans, i, tail_end, T, "overhead", spans)
    spans.sort(key=lambda s: (s.lane, s.start))
    name = title or (f"predicted: {plan.model.name}, {p} stages, {m} micro-batches, "
                     f"{T:.3g} s per iteration")
    return Timeline(name, lanes, spans, T, clusters, "predicted")
