"""What a predicted timeline draws as a send, and that every span shows in its picture.

A blocking send is a rendezvous (plan/pipeline.py): the transfer starts once the receiver has posted its receive,
then takes its link's time. Until then the sender waits for its peer's compute, the pipeline bubble: drawn blank
(idle), not grey as a send, so a stage's send spans add up to its transfers as `simulate` prices them
(`send_next_s`, each direction once per micro-batch), however long it waits for its neighbours."""
import json
import os
from collections import Counter, defaultdict

import pytest
from helpers import ROOT

from hetauto_megatron.cli import main
from hetauto_megatron.plan.plan import load_plan

PLAN = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")
INVENTORY = os.path.join(ROOT, "examples", "llama", "inventory-cpu-tiny-2clusters.yaml")


def _stage_spans(trace: dict) -> dict:
    """{stage: {kind: seconds}} of the predicted stage lanes of a Chrome trace."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    out: dict = defaultdict(lambda: defaultdict(float))
    for e in trace["traceEvents"]:
        name = names.get((e["pid"], e["tid"]), "")
        if e["ph"] == "X" and name.startswith("stage "):
            out[int(name.split()[1])][e["cat"]] += e["dur"] / 1e6
    return out


@pytest.mark.parametrize("gbps", [0.01, 0.1])
def test_a_stage_s_sends_are_its_transfers_not_its_wait_for_the_receiver(tmp_path, capsys, gbps):
    """The 2-cluster CPU plan, its link between the clusters slowed down (10 and 100 Mbit/s): every stage waits for
    its neighbours most of the iteration. Each stage's send spans sum to m x its links' times (the activation
    to the next stage, the gradient to the one before), what simulate prices, not the waits: before, a stage held
    in a send while its receiver was still computing drew that whole wait grey (at 10 Mbit/s the first stage's
    sends came to 37 % of the iteration; its transfers take 0.08 %)."""
    trace = tmp_path / "t.json"
    assert main(["simulate", "--plan", PLAN, "--inventory", INVENTORY, "--json", "--timeline", str(trace),
                 "--set", f"link.cluster-a-cluster-b.bandwidth_gbps={gbps}"]) == 0
    est = json.loads(capsys.readouterr().out)
    st, m = est["stages"], load_plan(PLAN).num_micro_batches
    spans = _stage_spans(json.loads(trace.read_text()))
    assert sorted(spans) == list(range(len(st)))
    for i, kinds in spans.items():
        links = (st[i]["send_next_s"] if i < len(st) - 1 else 0.0) + (st[i - 1]["send_next_s"] if i else 0.0)
        # (send_next_s is to the microsecond: 2 m x 0.5 us of rounding)
        assert kinds["send"] == pytest.approx(m * links, abs=m * 1e-6), (i, dict(kinds))
        # and the lane still covers the iteration, the waits as idle or receive
        assert sum(kinds.values()) == pytest.approx(est["iteration_time_s"], rel=1e-5)


@pytest.mark.parametrize("shared", [False, True])
def test_a_send_is_drawn_from_the_rendezvous_not_while_its_receiver_computes(shared):
    """Random pipelines of blocking and overlapped boundaries (through shared uplinks too: plan/pipeline_shared.py),
    few micro-batches or many. Megatron's P2P moves a message once its receive is posted, which the receiver
    does in a communication call, not during a forward or backward: so no recorded send may start while its
    receiver computes (before, it started when the sender's compute ended). Each covers its transfer and ends when
    it arrived, and where no uplink is shared it is the transfer itself, its link's time."""
    import random

    from helpers import random_pipeline, shared_uplinks_draw

    from hetauto_megatron.plan.pipeline import simulate_1f1b
    rng = random.Random(11 + shared)
    waited = 0
    for k in range(150):
        p, m, f, b, link, lat, blk, depth = random_pipeline(rng, min_stages=2)
        m = m if k % 2 else rng.choice([1, 2, 3, 5, 8])
        ups = shared_uplinks_draw(rng, p, [x - a for x, a in zip(link, lat)], whole=False) if shared else None
        ev = simulate_1f1b(f, b, link, m, latency=lat, blocking=blk, depth=depth, uplinks=ups, record=True).events
        transfer = {(e.resource[1], e.resource[2], e.micro_batch): e for e in ev if e.resource[0] == "link"}
        computes = defaultdict(list)
        for e in ev:
            if e.resource[0] == "stage" and e.kind in ("F", "B"):
                computes[e.resource[1]].append(e)
        for s in (e for e in ev if e.kind == "send"):
            i, j = s.resource[1], s.micro_batch
            # the activation to stage i + 1 or the gradient to stage i - 1: the one arriving as the send ends
            to, t = next((r, transfer[key]) for r, key in ((i + 1, (i, "fwd", j)), (i - 1, (i - 1, "bwd", j)))
                         if key in transfer and transfer[key].arrival == s.end)
            assert s.start <= t.start + 1e-12
            if not shared:
                assert s.start == t.start and s.end - s.start == pytest.approx(link[min(i, to)])
            assert not [c for c in computes[to] if c.start + 1e-9 < s.start < c.end - 1e-9], (k, s)
            waited += t.start > max(c.end for c in computes[i] if c.end <= s.start + 1e-12) + 1e-9
    assert waited > 100     # senders often wait for their receivers: the cases test what is drawn then


def test_every_kind_of_span_shows_in_the_picture_however_short(tmp_path):
    """A lane of each kind whose spans are 13 us in a 1 s iteration (the CPU plans' transfers between clusters,
    the exchange inside a cluster of the side-by-side plans): drawn to scale they are a hundredth of a pixel and
    the lane looked empty (only the global norm's was widened). Drawn above a timeline ten times as long (a dry
    run's measured panel shares the time axis of its prediction) and read back from the picture: every kind's
    colour is there; the JSON trace keeps the spans' own times."""
    from PIL import Image

    from hetauto_megatron.emit.picture import KIND_COLOURS, cluster_colour, draw_timelines
    from hetauto_megatron.emit.trace import trace_events
    from hetauto_megatron.plan.timeline import Lane, Span, Timeline
    kinds = ["send", "receive", "dp-sync", "optimizer", "overhead", "exchange", "norm"]
    lanes = [Lane("stage 0", "a", "stage", 0)] + [Lane(k, "a", "link", 0, True) for k in kinds]
    spans = [Span(lane, "forward" if lane == 0 else kinds[lane - 1], t / 20, t / 20 + 13e-6, t)
             for lane in range(len(lanes)) for t in range(20)]
    tl = Timeline("t", lanes, spans, 1.0, ["a"])
    measured = Timeline("m", [Lane("rank 0", "b", "rank", 0)], [Span(0, "forward", 0.0, 10.0, 0)], 10.0, ["b"])

    def colours(timeline):
        path = str(tmp_path / "t.png")
        draw_timelines([timeline, measured], path)
        with Image.open(path) as im:
            # above the legend (the bottom 9 % of the figure: emit/picture.py's tight_layout rect), which names only
            # the kinds drawn, so the empty picture's has none of these colours and would count as the spans'
            w, h = im.size
            return Counter({c: n for n, c in im.convert("RGB").crop((0, 0, w, int(h * 0.91))).getcolors(1 << 24)})
    # the pixels the spans add to the same lanes drawn empty (the labels have some of these colours)
    added = colours(tl)
    added.subtract(colours(Timeline("t", lanes, [], 1.0, ["a"])))
    for kind, hexc in [("forward", cluster_colour(0))] + [(k, KIND_COLOURS[k]) for k in kinds]:
        rgb = tuple(int(hexc[i:i + 2], 16) for i in (1, 3, 5))
        near = sum(n for c, n in added.items() if max(abs(x - y) for x, y in zip(c, rgb)) <= 12)
        assert near >= 20 * 10, (kind, near)    # 20 slivers, each a pixel or more wide and many high
    durations = [e["dur"] for e in trace_events([tl]) if e["ph"] == "X"]
    assert len(durations) == len(spans) and all(d == pytest.approx(13) for d in durations)
