"""Timelines as Chrome / Perfetto traces (Trace Event Format, JSON): open in https://ui.perfetto.dev or
chrome://tracing.

One process per cluster (links between two clusters get their own process, and so do the gradient exchange
across holders: a thread for its steps, one per link it keeps busy; and the global gradient norm), one thread per
lane (stage, rank or link direction). Every span is a complete event: {"name", "ph": "X", "ts", "dur", "pid", "tid",
"cat", "args"}, times in microseconds. Process and thread names are metadata events ("ph": "M"), which also
carry ts and dur (0) so that every event has the same six fields. Several timelines (predicted and measured)
go into one file as separate process groups, named after their source.
"""
from __future__ import annotations

import json

from ..plan.timeline import Timeline

# Chrome's reserved colour names per kind (Perfetto picks its own; Chrome's viewer honours these).
_CNAME = {"forward": "good", "backward": "bad", "send": "grey", "receive": "yellow", "idle": "white",
          "dp-sync": "terrible", "optimizer": "black", "overhead": "olive", "exchange": "thread_state_iowait",
          "norm": "rail_load"}


def _label(span, lane) -> str:
    if span.label:
        return span.label
    what = {"forward": "F", "backward": "B", "send": "send", "receive": "receive", "idle": "idle",
            "dp-sync": "DP sync", "optimizer": "optimizer", "overhead": "overhead", "exchange": "exchange",
            "norm": "global gradient norm"}[span.kind]
    if lane.kind == "link" and span.micro_batch is not None:
        what = "activation" if lane.name.startswith("activations") else "gradient"
    return f"{what} {span.micro_batch}" if span.micro_batch is not None else what


def _process(group: str, kind: str) -> str:
    """A process's name: its cluster, the link between two clusters, or the gradient exchange or norm (named
    already)."""
    return group if kind in ("exchange", "norm") else f"{'link ' if '->' in group else 'cluster '}{group}"


def trace_events(timelines: list[Timeline]) -> list[dict]:
    events = []
    pid_base = 0
    for tl in timelines:
        groups = list(dict.fromkeys(lane.cluster for lane in tl.lanes))
        kind = {lane.cluster: lane.kind for lane in tl.lanes}
        pid = {g: pid_base + i + 1 for i, g in enumerate(groups)}
        prefix = f"{tl.source}: " if len(timelines) > 1 else ""
        for g in groups:
            events.append({"name": "process_name", "ph": "M", "ts": 0, "dur": 0, "pid": pid[g], "tid": 0,
                           "args": {"name": f"{prefix}{_process(g, kind[g])}"}})
            events.append({"name": "process_sort_index", "ph": "M", "ts": 0, "dur": 0, "pid": pid[g], "tid": 0,
                           "args": {"sort_index": pid[g]}})
        for i, lane in enumerate(tl.lanes):
            events.append({"name": "thread_name", "ph": "M", "ts": 0, "dur": 0, "pid": pid[lane.cluster],
                           "tid": i + 1, "args": {"name": lane.name}})
            events.append({"name": "thread_sort_index", "ph": "M", "ts": 0, "dur": 0, "pid": pid[lane.cluster],
                           "tid": i + 1, "args": {"sort_index": i + 1}})
        for s in tl.spans:
            lane = tl.lanes[s.lane]
            args = {"lane": lane.name, "cluster": lane.cluster, "seconds": s.duration}
            if lane.stage is not None:
                args["stage"] = lane.stage
            if s.micro_batch is not None:
                args["micro_batch"] = s.micro_batch
            events.append({"name": _label(s, lane), "ph": "X", "ts": s.start * 1e6, "dur": s.duration * 1e6,
                           "pid": pid[lane.cluster], "tid": s.lane + 1, "cat": s.kind, "cname": _CNAME[s.kind],
                           "args": args})
        pid_base += len(groups)
    return events


def chrome_trace(timelines: list[Timeline]) -> dict:
    return {"traceEvents": trace_events(timelines), "displayTimeUnit": "ms",
            "otherData": {"generator": "hetauto", "timelines": [
                {"title": tl.title, "source": tl.source, "iteration_s": tl.iteration_s} for tl in timelines]}}


def write_trace(timelines: list[Timeline], path: str) -> None:
    with open(path, "w") as fh:
        json.dump(chrome_trace(timelines), fh, separators=(",", ":"))
        fh.write("\n")
