"""Timelines: predicted (simulate --timeline) and measured (dryrun --timeline --compare) as Chrome traces and
pictures. A trace must load as Trace Event Format, and what it shows must add up to what the simulator and the
dry run report on their own: per stage the compute spans sum to the simulated busy time; per rank the spans
cover the step time the dry run measured."""
import json
import os
from collections import Counter, defaultdict

import pytest
from conftest import TINY_PLAN
from helpers import CPU_INVENTORY, ROOT

from hetauto_megatron.cli import main
from hetauto_megatron.plan.plan import load_plan

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

FIELDS = ("name", "ph", "ts", "dur", "pid", "tid")


def _lanes(events):
    """{(pid, tid): (thread name, process name, [X events sorted by ts])}"""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    spans = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            spans[(e["pid"], e["tid"])].append(e)
    return {k: (names[k], procs[k[0]], sorted(v, key=lambda e: e["ts"])) for k, v in spans.items()}


def _check_format(trace):
    events = trace["traceEvents"]
    assert events
    for e in events:
        assert all(k in e for k in FIELDS), e
        assert e["ph"] in ("X", "M") and isinstance(e["name"], str)
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    lanes = _lanes(events)
    for name, _, spans in lanes.values():     # a lane does one thing at a time
        for a, b in zip(spans, spans[1:]):
            assert b["ts"] >= a["ts"] + a["dur"] - 1e-3, (name, a, b)
    return lanes


def _is_png(path):
    with open(path, "rb") as fh:
        return fh.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 10_000


def test_predicted_timeline_of_the_readme_plan(readme_plan, tmp_path, capsys):
    plan, inv = readme_plan      # overlapped boundaries: with blocking ones the best plan leaves the 910B out
    trace, png = str(tmp_path / "t.json"), str(tmp_path / "t.png")
    assert main(["simulate", "--model", "llama2-70b", "--inventory", inv, "--plan", plan, "--json",
                 "--timeline", trace, "--timeline", png]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["written"] == [trace, png] and _is_png(png)
    with open(trace) as fh:
        lanes = _check_format(json.load(fh))
    p, m = len(est["stages"]), load_plan(plan).num_micro_batches
    stage_lanes = {int(n.split()[1]): spans for n, _, spans in lanes.values() if n.startswith("stage ")}
    assert sorted(stage_lanes) == list(range(p))
    T = est["iteration_time_s"] * 1e6
    for i, spans in stage_lanes.items():
        kinds = Counter(e["cat"] for e in spans)
        assert kinds["forward"] == kinds["backward"] == m
        busy = sum(e["dur"] for e in spans if e["cat"] in ("forward", "backward")) / 1e6
        # (the simulator reports forward and backward per micro-batch to the microsecond: m x 1 us of rounding)
        assert busy == pytest.approx(est["stages"][i]["busy_s"], abs=m * 1e-6)
        # the lane covers the whole iteration: compute, waits, DP sync and optimizer tail
        assert sum(e["dur"] for e in spans) == pytest.approx(T, rel=1e-6)
        assert spans[-1]["ts"] + spans[-1]["dur"] == pytest.approx(T, rel=1e-6)
    links = [spans for n, _, spans in lanes.values() if n.startswith(("activations", "gradients"))]
    assert len(links) == 2 * (p - 1) and all(len(s) == m for s in links)
    # the cross-cluster link: each transfer occupies it for what the simulator prices per micro-batch, less the
    # latency (in flight, not occupying it)
    cross = [i for i in range(p - 1) if est["stages"][i]["cluster"] != est["stages"][i + 1]["cluster"]]
    assert len(cross) == 1
    x = (est["stages"][cross[0]]["send_next_s"] - est["stages"][cross[0]]["send_next_latency_s"]) * 1e6
    cross_lanes = [s for _, proc, s in lanes.values() if proc.startswith("link ")]   # the process between clusters
    # (the estimate's send_next_s is to the microsecond; the trace draws the simulated transfer itself)
    assert len(cross_lanes) == 2 and all(e["dur"] == pytest.approx(x, abs=1.0) for s in cross_lanes for e in s)


def test_measured_and_predicted_timelines_of_a_dry_run(tiny_dryrun_files):
    out, files = tiny_dryrun_files
    report = json.loads(out)
    assert _is_png(files["picture"])
    with open(files["trace"]) as fh:
        trace = json.load(fh)
    assert [t["source"] for t in trace["otherData"]["timelines"]] == ["predicted", "measured"]
    lanes = _check_format(trace)
    plan = load_plan(os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml"))
    m = plan.num_micro_batches
    ranks = {n: spans for n, proc, spans in lanes.values() if proc.startswith("measured") and n.startswith("rank ")}
    assert len(ranks) == plan.world_size
    for name, spans in ranks.items():
        kinds = Counter(e["cat"] for e in spans)
        assert kinds["forward"] == kinds["backward"] == m, name
        assert kinds["optimizer"] == 1 and kinds["receive"] >= 1
    # every rank's lane covers its own step; the longest is the step time the dry run reports (last step)
    covered = max(sum(e["dur"] for e in spans) for spans in ranks.values()) / 1e6
    assert covered == pytest.approx(report["step_times_s"][-1], rel=0.01, abs=1e-3)
    predicted = {n: s for n, proc, s in lanes.values() if proc.startswith("predicted") and n.startswith("stage ")}
    assert len(predicted) == plan.pipeline_parallel_size
    assert all(Counter(e["cat"] for e in s)["forward"] == m for s in predicted.values())


def test_the_prediction_beside_a_dry_run_without_the_distributed_optimizer_is_of_what_ran(tiny_dryrun_files,
                                                                                           tmp_path, capsys):
    """`dryrun --no-distributed-optimizer --compare`: the run's settings say the plain optimizer, but the prediction
    drawn beside it priced the plan's distributed one (each DP rank stepping 1/DP of the parameters, then their
    all-gather). Now it is the plain optimizer's: on the stage whose mesh has DP 2 a longer step and no gather, the
    same elsewhere, against the prediction of the run with the distributed optimizer (the session's dry run)."""
    from helpers import CPU_INVENTORY
    (tmp_path / "inv.yaml").write_text(CPU_INVENTORY)
    trace = tmp_path / "plain.json"
    assert main(["dryrun", "--plan", TINY_PLAN, "--tiny", "--steps", "2", "--no-distributed-optimizer", "--json",
                 "--timeline", str(trace), "--compare", "--inventory", str(tmp_path / "inv.yaml")]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert all(s["distributed_optimizer"] is False for s in ran["settings"]), ran["settings"]

    def predicted(path):
        with open(path) as fh:
            lanes = _lanes(json.load(fh)["traceEvents"])
        return {n: Counter({k: 0.0 for k in ("optimizer", "dp-sync")}) + Counter(
            {cat: sum(e["dur"] for e in spans if e["cat"] == cat) for cat in ("optimizer", "dp-sync")})
            for n, proc, spans in lanes.values() if proc.startswith("predicted") and n.startswith("stage ")}, {
            n: sum(e["cat"] == "dp-sync" for e in spans)
            for n, proc, spans in lanes.values() if proc.startswith("predicted") and n.startswith("stage ")}

    (plain, plain_syncs), (sharded, sharded_syncs) = predicted(trace), predicted(tiny_dryrun_files[1]["trace"])
    plan = load_plan(TINY_PLAN)
    wide = [f"stage {i}" for i, m in enumerate(m for m in plan.meshes for _ in m.stage_layers) if m.dp > 1]
    assert wide and set(plain) == set(sharded)
    for name in plain:
        if name in wide:
            assert plain[name]["optimizer"] > 1.5 * sharded[name]["optimizer"], (name, plain, sharded)
            assert plain_syncs[name] < sharded_syncs[name], (name, plain_syncs, sharded_syncs)
        else:
            assert plain[name]["optimizer"] == pytest.approx(sharded[name]["optimizer"], rel=1e-6), name


def test_timeline_errors(tmp_path, capsys):
    inv = os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")
    assert main(["simulate", "--model", "llama2-7b", "--inventory", inv, "--tp", "8", "--pp", "1", "--dp", "1",
                 "--micro-batch-size", "1", "--global-batch-size", "8", "--timeline", str(tmp_path / "t.txt")]) == 2
    assert "--timeline" in capsys.readouterr().err
    tiny = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")
    assert main(["dryrun", "--plan", tiny, "--tiny", "--compare"]) == 2            # before any process starts
    assert main(["dryrun", "--plan", tiny, "--tiny", "--timeline", "x.png", "--compare"]) == 2   # no inventory
    err = capsys.readouterr().err
    assert "--compare" in err and "--inventory" in err and "Traceback" not in err
    # What the run reads after training is read before it: a missing inventory ran the whole dry run and exited 0
    # (nothing came to read it), a bad cost model or a missing folder failed only after the run.
    inv = str(tmp_path / "inv.yaml")
    with open(inv, "w") as f:
        f.write(CPU_INVENTORY)
    for argv, needle in ((["--inventory", str(tmp_path / "none.yaml")], "--emulate-links"),
                         (["--timeline", "x.png", "--compare", "--inventory", str(tmp_path / "none.yaml")], "not found"),
                         (["--timeline", "x.png", "--compare", "--inventory", inv, "--cost-model", str(tmp_path)],
                          "not a fitted cost model"),
                         (["--cost-model", str(tmp_path)], "only --compare"),
                         (["--timeline", str(tmp_path / "no" / "x.png")], "does not exist")):
        assert main(["dryrun", "--plan", tiny, "--tiny", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_planner_never_imports_matplotlib_or_torch():
    import subprocess
    import sys
    # every module of the planner's packages (new ones included) and every command's parser
    code = ("import sys, importlib, pkgutil, hetauto_megatron.cli as c; c.build_parser()\n"
            "for name in ('spec', 'cost', 'plan', 'emit', 'commands'):\n"
            "    pkg = importlib.import_module('hetauto_megatron.' + name)\n"
            "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
            "        importlib.import_module(m.name)\n"
            "print(sorted(m for m in ('matplotlib', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_predicted_timeline_as_deepspeeds_engine_runs_it(tmp_path, capsys):
    """`simulate --engine deepspeed --timeline`: DeepSpeed's TrainSchedule, every transfer holding both its stages
    (its source, deepspeed/runtime/pipe/schedule.py: a middle stage receives the activation, sends the gradient,
    sends the activation and receives the gradient of every micro-batch, the end stages two of those); per stage
    the compute adds up to the simulated busy time and the spans to the iteration."""
    inv = os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")
    trace = str(tmp_path / "ds.json")
    assert main(["simulate", "--model", "llama2-7b", "--inventory", inv, "--tp", "8", "--pp", "4", "--dp", "1",
                 "--micro-batch-size", "1", "--global-batch-size", "6", "--engine", "deepspeed", "--json",
                 "--timeline", trace]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["engine"] == "deepspeed"
    with open(trace) as fh:
        trace = json.load(fh)
    assert "DeepSpeed's pipeline engine" in trace["otherData"]["timelines"][0]["title"]
    lanes = _check_format(trace)
    stages = {int(n.split()[1]): spans for n, _, spans in lanes.values() if n.startswith("stage ")}
    m, p, T = 6, 4, est["iteration_time_s"] * 1e6
    for i, spans in stages.items():
        kinds = Counter(e["cat"] for e in spans)
        held = 2 if i in (0, p - 1) else 4
        assert kinds["forward"] == kinds["backward"] == m and kinds["send"] + kinds["receive"] == held * m, kinds
        busy = sum(e["dur"] for e in spans if e["cat"] in ("forward", "backward")) / 1e6
        assert busy == pytest.approx(est["stages"][i]["busy_s"], abs=m * 1e-6)
        assert sum(e["dur"] for e in spans) == pytest.approx(T, rel=1e-6)
    # a transfer holds its link and both its stages for the same span
    links = [s for n, _, s in lanes.values() if n.startswith(("activations", "gradients"))]
    assert len(links) == 2 * (p - 1) and all(len(s) == m for s in links)


def test_a_timeline_suffix_in_capitals_is_the_same_format(readme_plan, tmp_path, capsys):
    """FILE.JSON is a trace as FILE.json is (the path check took it so; the writer sent it to the picture writer,
    which failed after the whole run)."""
    plan, inv = readme_plan
    trace = str(tmp_path / "T.JSON")
    assert main(["simulate", "--model", "llama2-70b", "--inventory", inv, "--plan", plan, "--timeline", trace]) == 0
    with open(trace) as fh:
        _check_format(json.load(fh))


def _union(intervals) -> float:
    total, cur = 0.0, None
    for a, b in sorted(intervals):
        if cur is None or a > cur[1]:
            total += 0.0 if cur is None else cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    return total + (0.0 if cur is None else cur[1] - cur[0])


def _dp_views(plan_path, monkeypatch):
    """(explain's DP part, what the iteration saves with DP priced away, the optimizer step, each pipeline's
    dp-sync time in the timeline less the job-wide sync, the tail's time with every stage lane idle)."""
    from hetauto_megatron.plan import explain, multi_explain, tail_costs
    from hetauto_megatron.plan.simulate import simulate
    from hetauto_megatron.plan.timeline import predicted_timeline
    from hetauto_megatron.spec.inventory import inventory_from_dict

    plan = load_plan(plan_path)
    inv = inventory_from_dict(plan.inventory)
    est = simulate(plan, inv).to_dict()
    parts = (explain.breakdown(est, plan.num_micro_batches) if plan.is_simple
             else multi_explain.shapes_breakdown(est))["parts"]
    with monkeypatch.context() as m:
        m.setattr(tail_costs, "dp_sync_times", lambda *a, **k: (0.0, 0.0))
        saved = est["iteration_time_s"] - simulate(plan, inv).iteration_time_s
    tl = predicted_timeline(plan, inv)
    stage = {i for i, lane in enumerate(tl.lanes) if lane.kind == "stage"}
    per: dict = defaultdict(list)
    for s in tl.spans:
        if s.lane in stage and s.kind == "dp-sync":
            per[tl.lanes[s.lane].pipeline].append((s.start, s.end))
    shown = {p: _union(v) - est["sync_s"] for p, v in per.items()}
    cuts = sorted({x for s in tl.spans if s.lane in stage for x in (s.start, s.end)})
    all_idle = 0.0
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        kinds = [s.kind for s in tl.spans if s.lane in stage and s.start <= mid < s.end]
        if mid > est["pipeline_s"] and kinds and all(k == "idle" for k in kinds):
            all_idle += b - a
    return parts["dp_sync"]["seconds"], saved, est["optimizer_s"], shown, all_idle


def test_explain_simulate_and_the_timeline_show_the_same_dp_time(readme_plan, tmp_path, capsys, monkeypatch):
    """The parameter gathers of the distributed optimizer run at the next iteration's first forwards, one stage
    after the other along the pipeline (each waits for its input): the iteration's DP time includes the chain.
    explain's DP part must be what the iteration saves with DP priced away (within one optimizer step: the step
    that becomes critical may differ), and the timeline must draw it as DP, not as idle time of every stage. Before,
    the timeline drew each stage's own gather only (0.03 of 0.26 s on the README's plan; 0.23 s with every stage
    idle), and on plans of several pipelines explain and simulate counted the reductions only, putting the gathers
    under "norm, optimizer, overhead"."""
    from helpers import run_cli, twins_and_l40s
    import yaml

    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(twins_and_l40s()))
    (tmp_path / "m8.yaml").write_text("preset: llama2-7b\nnum_layers: 8\n")
    rc, _, err = run_cli(["plan", "--model", str(tmp_path / "m8.yaml"), "--inventory", str(tmp_path / "inv.yaml"),
                          "--global-batch-size", "512", "--quiet", "--workers", "1", "-o", str(tmp_path / "p.yaml")],
                         capsys)
    assert rc == 0, err
    assert not load_plan(str(tmp_path / "p.yaml")).is_simple, "the case needs a plan of several pipelines"
    for path in (readme_plan[0], str(tmp_path / "p.yaml")):
        dp, saved, opt, shown, all_idle = _dp_views(path, monkeypatch)
        assert saved > 0.01, (path, saved)          # a case where DP is exposed at all
        assert abs(dp - saved) <= opt + 1e-4, (path, dp, saved, opt)
        # the pipeline whose DP ends last shows all of it
        assert max(shown.values()) == pytest.approx(dp, abs=1e-3), (path, shown, dp)
        assert all_idle < 1e-3, (path, all_idle)


def test_the_gradient_exchange_across_clusters_has_its_own_lanes(tmp_path, capsys):
    """Two pipelines, one per cluster, sum every gradient across the clusters after their DP reductions: the
    timeline shows that exchange on lanes of its own (before, only the stages' red tail held it, with the global
    norm, and no lane said which link it keeps busy). Its steps must add up to the exchange `simulate --json`
    reports (`replica_sync_s`: price_shapes' holders_exchange.holders_sync_time, summed there; the lanes lay out
    holders_sync_steps one after the other from the slowest pipeline's end), start where the slowest pipeline's DP
    reduction ends (`before_sync_s`) and end inside the stages' gradient sync, before the iteration ends."""
    plan = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2pipelines-cpu.yaml")
    inv = os.path.join(ROOT, "examples", "llama", "inventory-cpu-tiny-2clusters.yaml")
    trace, png = str(tmp_path / "t.json"), str(tmp_path / "t.png")
    assert main(["simulate", "--plan", plan, "--inventory", inv, "--json", "--timeline", trace,
                 "--timeline", png]) == 0
    est = json.loads(capsys.readouterr().out)
    assert _is_png(png)
    with open(trace) as fh:
        lanes = _check_format(json.load(fh))
    exchange = {n: spans for n, proc, spans in lanes.values() if proc == "gradient exchange"}
    steps = exchange.pop("gradient exchange across holders")
    assert est["replica_sync_s"] > 1e-3                   # the case: 2 MB each way over the 10 Gbit/s link
    assert sum(e["dur"] for e in steps) / 1e6 == pytest.approx(est["replica_sync_s"], abs=1e-6)
    start = max(p["before_sync_s"] for p in est["pipelines"])
    assert steps[0]["ts"] / 1e6 == pytest.approx(start, abs=1e-6)
    end = (steps[-1]["ts"] + steps[-1]["dur"]) / 1e6
    assert end == pytest.approx(start + est["replica_sync_s"], abs=2e-6)
    # the iteration after it: the result check and the global norm (sync_s less the exchange), the optimizer step,
    # the overhead
    assert end + est["sync_s"] - est["replica_sync_s"] + est["optimizer_s"] <= est["iteration_time_s"] + 2e-6
    # Megatron-LM's result check, then the norm, each on a lane of its own, right after the exchange, as long as
    # they are priced: each one scalar around the same ring of every rank
    check = [e for n, proc, spans in lanes.values() if proc == "result check" for e in spans]
    norm = [e for n, proc, spans in lanes.values() if proc == "global gradient norm" for e in spans]
    assert len(check) == 1 and check[0]["ts"] / 1e6 == pytest.approx(end, abs=1e-6)
    assert len(norm) == 1 and norm[0]["ts"] == pytest.approx(check[0]["ts"] + check[0]["dur"], abs=1)
    assert (check[0]["dur"] + norm[0]["dur"]) / 1e6 == pytest.approx(est["sync_s"] - est["replica_sync_s"], abs=2e-6)
    assert norm[0]["dur"] / 1e6 == pytest.approx(est["grad_norm_s"], abs=1e-6) and est["grad_norm_s"] > 1e-4
    assert check[0]["dur"] / 1e6 == pytest.approx(est["result_check_s"], abs=1e-6)
    assert est["result_check_s"] == pytest.approx(est["grad_norm_s"], abs=2e-6)
    for n, _, spans in lanes.values():                  # every stage is in its gradient sync meanwhile
        if " stage " in f" {n}":
            assert any(e["cat"] == "dp-sync" and e["ts"] <= steps[0]["ts"] + 1 and
                       e["ts"] + e["dur"] >= steps[-1]["ts"] + steps[-1]["dur"] - 1 for e in spans), n
    # both directions of the link between the clusters carry it; in each step some lane is busy all of it
    assert {"exchange link cluster-a->cluster-b", "exchange link cluster-b->cluster-a"} <= set(exchange)
    for step in steps:
        busy = [e["dur"] for spans in exchange.values() for e in spans if e["ts"] == step["ts"]]
        assert max(busy) == pytest.approx(step["dur"], rel=1e-9) and all(b <= step["dur"] * (1 + 1e-9) for b in busy)


def _sync_lanes(lanes):
    """The exchange's lanes {thread: spans} (its steps popped as the second item), the result check's spans and the
    norm's spans."""
    exchange = {n: spans for n, proc, spans in lanes.values() if proc == "gradient exchange"}
    check = [e for n, proc, spans in lanes.values() if proc == "result check" for e in spans]
    norm = [e for n, proc, spans in lanes.values() if proc == "global gradient norm" for e in spans]
    return exchange, exchange.pop("gradient exchange across holders", []), check, norm


def test_a_tied_table_across_clusters_has_the_exchange_lanes_and_the_norm_its_own(tmp_path, capsys):
    """One pipeline whose first stage (cluster-a) and last stage (cluster-b) hold the tied embedding table: the
    runtime sums the table's gradients across the two clusters (runtime/replica_sync.py, the pair phase) after the
    DP reduction, then all-reduces the global norm over every rank. Before, both hid inside the stages' red tail;
    now the exchange gets the lanes the exchange between pipelines has (the same pricing, holders_sync_steps) and
    the norm a lane of its own, as Megatron-LM's result check between them. What the lanes draw must be what
    `simulate --json` prices: the exchange is what the tie adds to the iteration's sync (`sync_s` of the same plan
    untied, which has no exchange, is the check and the norm alone), the check is `result_check_s`, the norm
    `grad_norm_s`, one after the other, before the optimizer step; the stages name them."""
    import yaml

    src = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")
    inv = os.path.join(ROOT, "examples", "llama", "inventory-cpu-tiny-2clusters.yaml")
    with open(src) as fh:
        data = yaml.safe_load(fh)
    ests = {}
    for tie in (False, True):
        data["model"]["tie_embeddings"] = tie
        plan, trace, png = (str(tmp_path / f"{tie}.{ext}") for ext in ("yaml", "json", "png"))
        (tmp_path / f"{tie}.yaml").write_text(yaml.safe_dump(data))
        assert main(["simulate", "--plan", plan, "--inventory", inv, "--json", "--timeline", trace,
                     "--timeline", png]) == 0
        ests[tie] = json.loads(capsys.readouterr().out)
        assert _is_png(png)
        with open(trace) as fh:
            exchange, steps, check, norm = _sync_lanes(_check_format(json.load(fh)))
        est = ests[tie]
        # the norm and the check: every plan of Megatron-LM's loop prices them (0.48 ms each here: the ring's hop
        # latencies), drawn where they are priced
        assert est["grad_norm_s"] > 1e-4 and len(norm) == 1 and len(check) == 1
        assert norm[0]["dur"] / 1e6 == pytest.approx(est["grad_norm_s"], abs=1e-6)
        assert check[0]["dur"] / 1e6 == pytest.approx(est["result_check_s"], abs=1e-6)
        assert norm[0]["ts"] == pytest.approx(check[0]["ts"] + check[0]["dur"], abs=1e-3)
        if not tie:
            assert not exchange and not steps          # untied: nothing is held twice, no exchange lanes
            assert est["sync_s"] == pytest.approx(est["grad_norm_s"] + est["result_check_s"], abs=2e-6)
    with open(str(tmp_path / "True.json")) as fh:
        lanes = _check_format(json.load(fh))
    exchange, steps, check, norm = _sync_lanes(lanes)
    est = ests[True]
    tied = est["sync_s"] - ests[False]["sync_s"]     # what the tie adds: the table's exchange
    assert tied > 1e-4                               # the case: 64 kB each way over the 10 Gbit/s link, latency
    assert sum(e["dur"] for e in steps) / 1e6 == pytest.approx(tied, abs=2e-6)
    assert (sum(e["dur"] for e in steps) + check[0]["dur"] + norm[0]["dur"]) / 1e6 == pytest.approx(est["sync_s"],
                                                                                                    abs=2e-6)
    # both directions of the link between the two clusters carry the pair's swap, the busiest filling the step
    assert {"exchange link cluster-a->cluster-b", "exchange link cluster-b->cluster-a"} <= set(exchange)
    for step in steps:
        busy = [e["dur"] for spans in exchange.values() for e in spans if e["ts"] == step["ts"]]
        assert max(busy) == pytest.approx(step["dur"], rel=1e-9)
    # the check follows the exchange, the norm the check; the optimizer step follows the norm; the iteration ends
    # after them
    end = steps[-1]["ts"] + steps[-1]["dur"]
    assert check[0]["ts"] == pytest.approx(end, abs=1e-3)
    assert (norm[0]["ts"] + norm[0]["dur"]) / 1e6 + est["optimizer_s"] <= est["iteration_time_s"] + 2e-6
    for n, _, spans in lanes.values():      # every stage waits in the same two spans, named after them
        if n.startswith("stage "):
            named = {e["name"]: e for e in spans if e["cat"] == "dp-sync"}
            for what, drawn in (("gradient exchange across holders", (steps[0]["ts"], end)),
                                ("result check", (check[0]["ts"], check[0]["ts"] + check[0]["dur"])),
                                ("global gradient norm", (norm[0]["ts"], norm[0]["ts"] + norm[0]["dur"]))):
                assert (named[what]["ts"], named[what]["ts"] + named[what]["dur"]) == pytest.approx(drawn, abs=1e-3)
            opt = next(e for e in spans if e["cat"] == "optimizer")
            assert opt["ts"] >= norm[0]["ts"] + norm[0]["dur"] - 1e-3, n


def test_a_timeline_picture_is_the_same_bytes_for_the_same_plan(tmp_path, capsys):
    """SVG and PDF pictures carried the time they were drawn (and the SVG a random salt in every id): two runs on
    the same plan differed in every file. Plans are deterministic; so are their pictures."""
    plan = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")
    inv = os.path.join(ROOT, "examples", "llama", "inventory-cpu-tiny-2clusters.yaml")
    files = {}
    for run in ("a", "b"):
        paths = [str(tmp_path / f"{run}.svg"), str(tmp_path / f"{run}.pdf")]
        assert main(["simulate", "--plan", plan, "--inventory", inv, "--timeline", paths[0], "--timeline", paths[1]]) \
            == 0
        files[run] = [open(p, "rb").read() for p in paths]
    capsys.readouterr()
    assert files["a"][0].startswith(b"<?xml") and files["a"][1].startswith(b"%PDF")
    assert files["a"] == files["b"]


@pytest.mark.parametrize("engine", ["megatron", "deepspeed"])
def test_the_readme_plans_timeline_is_its_simulation(readme_plan, tmp_path, capsys, engine):
    """The trace of the README's plan, as each engine runs it: per stage the forward and backward spans add up to the
    simulated busy time and the last ends at pipeline_s (Megatron's 1F1B was re-run from the estimate's passes
    rounded to the microsecond: 99 us short over 128 micro-batches, 44-72 us off per stage); and the fixed overhead
    is drawn whole, the cost model's 10 ms, after the stage that finishes last (under DeepSpeed the tail's parts
    were taken from two stages, the largest step's and the largest DP exposure's, and the overhead drawn 5.8 ms
    with an idle gap the iteration does not have)."""
    from hetauto_megatron.cost.analytic import DEFAULT_CALIBRATION

    plan, inv = readme_plan
    trace = str(tmp_path / "t.json")
    assert main(["simulate", "--plan", plan, "--inventory", inv, "--engine", engine, "--json", "--timeline",
                 trace]) == 0
    est = json.loads(capsys.readouterr().out)
    with open(trace) as fh:
        lanes = _check_format(json.load(fh))
    stages = {int(n.split()[1]): spans for n, _, spans in lanes.values() if n.startswith("stage ")}
    ends = []
    for i, spans in stages.items():
        passes = [e for e in spans if e["cat"] in ("forward", "backward")]
        assert sum(e["dur"] for e in passes) / 1e6 == pytest.approx(est["stages"][i]["busy_s"], abs=2e-6)
        ends.append(max(e["ts"] + e["dur"] for e in passes) / 1e6)
        overhead = [e for e in spans if e["cat"] == "overhead"]
        assert len(overhead) == 1 and overhead[0]["dur"] / 1e6 == pytest.approx(
            DEFAULT_CALIBRATION.iteration_overhead_s, abs=2e-6), overhead
        before = max(e["ts"] + e["dur"] for e in spans if e["cat"] not in ("overhead", "idle"))
        if before / 1e6 == pytest.approx(est["iteration_time_s"] - DEFAULT_CALIBRATION.iteration_overhead_s,
                                          abs=2e-6):
            ends.append(None)                     # this stage's tail ends where the overhead starts
    assert max(e for e in ends if e is not None) == pytest.approx(est["pipeline_s"], abs=2e-6)
    assert None in ends, "no stage's tail ends where the overhead starts"


def test_a_pictures_title_counts_in_words_and_gives_the_time_to_four_digits():
    """A one-stage plan's title said '1 stages', and an iteration of 1.003 s was written '1 s'."""
    from hetauto_megatron.plan.simulate import simulate
    from hetauto_megatron.plan.timeline import predicted_timeline
    from hetauto_megatron.spec.inventory import load_inventory

    plan = load_plan(os.path.join(ROOT, "examples", "llama", "plans", "cpu-small-tp2.yaml"))
    inv = load_inventory(os.path.join(ROOT, "examples", "llama", "inventory-cpu-dryrun.yaml"))
    title = predicted_timeline(plan, inv).title
    assert "1 stage," in title and f"{plan.num_micro_batches} micro-batch" in title, title
    assert f"{simulate(plan, inv).iteration_time_s:.4g} s per iteration" in title, title


def test_a_pictures_legend_names_only_what_it_draws(tmp_path, capsys):
    """The legend listed every kind of span, also those a plan has none of (link transfers and waits on a plan of
    one stage, the exchange across holders on an untied plan). The SVG keeps each label's text."""
    import re

    from helpers import run_cli
    inv = os.path.join(ROOT, "examples", "llama", "inventory-cpu-dryrun.yaml")

    def labels(plan):
        svg = tmp_path / "t.svg"
        rc, _, err = run_cli(["simulate", "--plan", os.path.join(ROOT, "examples", "llama", "plans", plan),
                              "--inventory", inv, "--timeline", str(svg)], capsys)
        assert rc == 0, err
        return set(re.findall(r"<!-- (.*?) -->", svg.read_text()))

    one = labels("cpu-small-tp2.yaml")
    assert {"optimizer", "site-a forward"} <= one, one
    assert not {"link transfer / send", "receive: waiting for a link / peer", "gradient exchange across holders"} & one
    two = labels("cpu-small-pp2.yaml")
    assert "link transfer / send" in two, two
