"""Measured timelines of a dry run: wall-clock stamps of every operation of every rank, per training step.

`OpClock.install` wraps, in the rank's own process only:
- Megatron's `schedules.forward_step` / `schedules.backward_step` (the 1F1B schedule calls them by their
  module-level names): forward and backward of one micro-batch, numbered in call order;
- the communicator's `_communicate`, which every send and receive of the schedule goes through: "receive"
  when the call receives (the rank waits for its peer), "send" otherwise;
- the finalize-model-grads hook (DP gradient synchronisation: "dp-sync"); the caller stamps the optimizer.
Stamps are time.perf_counter(): the dry run's ranks are processes on one machine, which share that clock,
so their timelines line up. `measured_timeline` turns the stamps of all ranks into a plan/timeline.Timeline.
"""
from __future__ import annotations

import time
from contextlib import contextmanager


class OpClock:
    def __init__(self):
        self.steps: list[dict] = []          # {"start", "end", "ops": [[kind, micro_batch, start, end], ...]}
        self._ops: list = []
        self._count: dict = {}
        self._t0 = 0.0
        self._undo: list = []

    @contextmanager
    def span(self, kind: str, micro_batch: int | None = None):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._ops.append([kind, micro_batch, t0, time.perf_counter()])

    def _timed(self, fn, kind, numbered=False):
        def wrapper(*args, **kwargs):
            mb = None
            if numbered:
                mb = self._count.get(kind, 0)
                self._count[kind] = mb + 1
            with self.span(kind, mb):
                return fn(*args, **kwargs)
        return wrapper

    def install(self, comm, config) -> "OpClock":
        from megatron.core.pipeline_parallel import schedules
        for name, kind in (("forward_step", "forward"), ("backward_step", "backward")):
            original = getattr(schedules, name)
            setattr(schedules, name, self._timed(original, kind, numbered=True))
            self._undo.append((schedules, name, original))
        communicate = comm._communicate

        def timed_communicate(**kwargs):
            kind = "receive" if kwargs.get("recv_prev") or kwargs.get("recv_next") else "send"
            with self.span(kind):
                return communicate(**kwargs)
        comm._communicate = timed_communicate
        if config.finalize_model_grads_func is not None:
            config.finalize_model_grads_func = self._timed(config.finalize_model_grads_func, "dp-sync")
        return self

    def uninstall(self) -> None:
        for obj, name, original in self._undo:
            setattr(obj, name, original)
        self._undo = []

    def begin_step(self, at: float) -> None:
        """`at`/`end_step`'s: the step's own perf_counter stamps, so that the lanes span exactly the step time the
        run reports (two reads of the clock differ by whatever preempted the process between them)."""
        self._ops, self._count, self._t0 = [], {}, at

    def end_step(self, at: float) -> None:
        self.steps.append({"start": self._t0, "end": at, "ops": self._ops})


def measured_timeline(plan, rank_steps: list[list[dict]], *, step: int = -1, per_stage: bool = False,
                      title: str | None = None):
    """The Timeline of one step of a dry run from every rank's `OpClock.steps` (rank order).

    per_stage: one lane per pipeline stage and mesh, the rank with TP and DP rank 0 (what a predicted timeline
    shows: a stage of several replica groups has one per group); otherwise one lane per rank. Times count from the
    earliest start of that step on any rank."""
    from ..plan.timeline import Lane, Span, Timeline
    from .ranks import rank_coords
    steps = [r[step] for r in rank_steps]
    t0 = min(s["start"] for s in steps)
    lanes, spans = [], []
    for rank, s in enumerate(steps):
        c = rank_coords(plan, rank)
        if per_stage and (c.tp_rank or c.dp_rank):
            continue
        lane = len(lanes)
        where = f"pipeline {c.pipeline}, " if plan.num_pipelines > 1 else ""
        tag = f"P{c.pipeline} " if plan.num_pipelines > 1 else ""
        group = "" if plan.is_simple else f" mesh {c.mesh_index}"
        name = (f"{tag}stage {c.stage}{group} (rank {rank})" if per_stage
                else f"rank {rank} ({where}stage {c.stage}, tp {c.tp_rank}, dp {c.dp_rank})")
        lanes.append(Lane(name, c.cluster, "stage" if per_stage else "rank", c.stage, pipeline=c.pipeline,
                          mesh=c.mesh_index))
        t = s["start"]
        for kind, mb, a, b in sorted(s["ops"], key=lambda o: o[2]):
            if a > t:
                spans.append(Span(lane, "idle", t - t0, a - t0))
            spans.append(Span(lane, kind, a - t0, b - t0, mb))
            t = max(t, b)
        if s["end"] > t:
            spans.append(Span(lane, "idle", t - t0, s["end"] - t0))
    T = max(s["end"] for s in steps) - t0
    clusters = list(dict.fromkeys(m.cluster for m in plan.meshes))
    shape = (f"{plan.pipeline_parallel_size} stages, {plan.num_micro_batches} micro-batches" if plan.is_simple
             else f"{plan.num_pipelines} pipeline{'s' if plan.num_pipelines > 1 else ''}, {len(plan.meshes)} meshes")
    name = title or f"measured: dry run of {plan.model.name}, {shape}, {T:.3g} s (step {step % len(rank_steps[0])})"
    return Timeline(name, lanes, spans, T, clusters, "measured")
