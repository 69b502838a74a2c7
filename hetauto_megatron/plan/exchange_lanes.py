"""The gradient exchange across holders and the global gradient norm on a timeline: where the seconds of the
iteration-end sync (`sync_s`) sit.

After the slowest pipeline's exposed DP reduction (`start`), every parameter several mesh stages hold is
summed across them (plan/multi_simulate.py, priced by holders_exchange.holders_sync_time; in one pipeline of single
meshes a tied embedding table whose first and last stages hold it, tail_costs.tied_table_blocks: the runtime's
"pair" phase), exposed in full: nothing overlaps it, and the global gradient norm, the optimizer step and the
rest of the tail follow it. Its steps run
one after the other (holders_exchange.holders_sync_steps: the gather phase, where pairs swap too; the
scatter phase; the broadcasts inside every holder), each as long as its busiest resource. The timeline gets:

- one lane `gradient exchange across holders` with a span per step (its seconds as priced; the lane ends where
  the iteration time counts the exchange's end), named after the step and its busiest resource;
- a lane per resource: each direction of an inventory link between clusters (`exchange link a->b`), each
  direction of a cluster's uplink where the inventory gives one, and each cluster's own network
  (`exchange inside a`: the root ranks' sends and receives inside the cluster, then the broadcasts inside its
  holders), busy from a step's start for that resource's own seconds (the busiest fills the step);
- after it, under Megatron-LM's loop, a lane `result check` with one span: whether any rank rejected its step's
  loss (its rerun state machine, --rerun-mode validate_results), one scalar all-reduced over every rank
  (tail_costs.result_check_time);
- then a lane `global gradient norm` (a process of its own in a trace) with one span: the all-reduce of one
  scalar over every rank, as tail_costs.grad_norm_time prices it (the hops' latencies around gloo's ring).
"""
from __future__ import annotations

EXCHANGE = "gradient exchange"      # the lanes' `cluster` (one process of their own in a trace)
STEPS = "gradient exchange across holders"     # the lane of its steps
NORM = "global gradient norm"       # the norm's lane, and its `cluster` (a process of its own in a trace)
CHECK = "result check"              # the result check's lane and `cluster`


def _resource_lane(res) -> str:
    if res[0] == "link":
        return f"exchange link {res[1]}->{res[2]}"
    if res[0] == "uplink":
        return f"exchange uplink {res[1]} {res[2]}"
    return f"exchange inside {res[2]}"       # ("ranks", holder, cluster, dir) and ("copies", holder, cluster)


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3g} MB"


def exchange_spans(inventory, blocks, start: float, lanes: list, spans: list) -> float:
    """Appends the exchange's lanes (plan/timeline.Lane, kind "exchange") to `lanes` and their spans to `spans`
    for the holders' `blocks` (price_shapes' extra["holders"]) on `inventory` (the one they were priced on),
    starting at `start`; returns the exchange's end. No lane where nothing is exchanged."""
    from .holders_exchange import holders_sync_steps
    from .timeline import Lane, Span
    steps = [(name, step) for name, step in holders_sync_steps(inventory, blocks)
             if max((sec for sec, _ in step.values()), default=0.0) > 0]
    if not steps:
        return start
    # a resource busy at all (without `uplink_gbps` an uplink is priced as taking no time: no lane for it)
    names = [_resource_lane(res) for _, step in steps for res, (sec, _) in step.items() if sec > 0]
    order = sorted(dict.fromkeys(names), key=lambda n: ("inside" in n, "uplink" in n, n))
    index = {}
    for name in [STEPS] + order:
        index[name] = len(lanes)
        lanes.append(Lane(name, EXCHANGE, "exchange"))
    t = start
    for name, step in steps:
        per: dict = {}          # lane -> (seconds, bytes): its busiest resource, the bytes of all of them
        for res, (sec, nbytes) in step.items():
            lane = _resource_lane(res)
            s0, b0 = per.get(lane, (0.0, 0.0))
            per[lane] = (max(s0, sec), b0 + nbytes)
        seconds = max(sec for sec, _ in step.values())
        busiest = max(per, key=lambda n: per[n][0])
        spans.append(Span(index[STEPS], "exchange", t, t + seconds,
                          label=f"{name} ({busiest.removeprefix('exchange ')})"))
        for lane, (sec, nbytes) in per.items():
            if sec > 0:
                spans.append(Span(index[lane], "exchange", t, t + sec, label=f"{name}: {_mb(nbytes)}"))
        t += seconds
    return t


def sync_spans(inventory, blocks, norm_s: float, ranks: int, start: float, lanes: list, spans: list,
               check_s: float = 0.0) -> float:
    """The iteration-end sync from `start`: the exchange across the holders' `blocks` (exchange_spans), then the
    engine's result check (`check_s`: tail_costs.result_check_time) and the global norm's all-reduce over `ranks`
    ranks (`norm_s`: tail_costs.grad_norm_time), each on its own lane (kind "norm"); returns where the norm ends.
    No lane for what takes no time."""
    from .timeline import Lane, Span
    t = exchange_spans(inventory, blocks, start, lanes, spans)
    if check_s > 0:
        lanes.append(Lane(CHECK, CHECK, "norm"))
        spans.append(Span(len(lanes) - 1, "norm", t, t + check_s,
                          label=f"result check: whether any of {ranks} ranks rejected its loss, all-reduced"))
        t += check_s
    if norm_s > 0:
        lanes.append(Lane(NORM, NORM, "norm"))
        spans.append(Span(len(lanes) - 1, "norm", t, t + norm_s,
                          label=f"global gradient norm: all-reduce of one scalar over {ranks} ranks"))
    return t + norm_s
