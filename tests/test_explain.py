"""hetauto explain / compare / simulate what-ifs, and the summary's link column and bottleneck mark.

The bottleneck cases are built so the answer follows from first principles on the simulator's per-stage
numbers (forward f, backward b, link transfer x per micro-batch), not from explain's own arithmetic:
- bubble-bound: one micro-batch, so the pipeline is a chain: every stage waits for all others, and the idle
  time of the slowest stage is sum(f + b) - max(f + b), (p - 1) / p of the chain for equal stages;
- link-bound: a link carries one micro-batch at a time, so the pipeline takes at least m * x, while with
  instant links 1F1B needs at most (m + p - 1) * max(f + b);
- compute-bound: many micro-batches on two stages and fast links, so the slowest stage's m * (f + b) is
  at least m / (m + p - 1) of the pipeline.
"""
import json
import os

import pytest
import yaml

from hetauto_megatron.cli import main
from hetauto_megatron.emit.summary import format_summary
from hetauto_megatron.plan.constraints import TIME_WEIGHT
from hetauto_megatron.plan.plan import load_plan


def _inventory(path, clusters, link_gbps=None):
    data = {"clusters": [{"name": n, "device": "H800", "nodes": k, "devices_per_node": 8} for n, k in clusters]}
    if link_gbps is not None:
        data["links"] = [{"between": [clusters[0][0], clusters[1][0]], "bandwidth_gbps": link_gbps, "latency_ms": 1}]
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _plan(path, meshes, gbs, model="llama2-7b"):
    from hetauto_megatron.spec.model import load_model
    data = {"version": 2, "model": load_model(model).to_dict(), "global_batch_size": gbs,
            "meshes": [{"cluster": c, "device_type": "h800", "tp": 8, "dp": 1, "micro_batch_size": 1,
                        "recompute": "none", "stage_layers": layers} for c, layers in meshes]}
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _case(tmp_path, capsys, inv, plan):
    est = _json(capsys, "simulate", "--model", "llama2-7b", "--inventory", inv, "--plan", plan, "--json")
    rep = _json(capsys, "explain", "--plan", plan, "--inventory", inv, "--no-search", "--json")
    st = est["stages"]
    fb = [s["forward_s"] + s["backward_s"] for s in st]
    x = [s["send_next_s"] for s in st[:-1]]
    parts = rep["breakdown"]["parts"]
    assert sum(p["seconds"] for p in parts.values()) == pytest.approx(est["iteration_time_s"], rel=1e-6)
    return est, rep, fb, x, parts


def test_bottleneck_bubble_bound(tmp_path, capsys):
    inv = _inventory(tmp_path / "inv.yaml", [("a", 8)])
    plan = _plan(tmp_path / "p.yaml", [("a", [4] * 8)], gbs=1)          # 8 stages, ONE micro-batch
    est, rep, fb, x, parts = _case(tmp_path, capsys, inv, plan)
    # one micro-batch: a chain forward through every stage and back
    us = 1e-6 * 4 * len(fb)          # the per-stage figures are printed to the microsecond
    assert est["pipeline_s"] == pytest.approx(sum(fb) + 2 * sum(x), abs=us)
    assert parts["bubble"]["seconds"] == pytest.approx(sum(fb) - max(fb), abs=us)
    assert rep["breakdown"]["bottleneck"] == "bubble"
    assert parts["bubble"]["share"] > 0.7                                  # ~ (p - 1) / p of the chain


def test_bottleneck_link_bound(tmp_path, capsys):
    inv = _inventory(tmp_path / "inv.yaml", [("a", 1), ("b", 1)], link_gbps=0.5)
    plan = _plan(tmp_path / "p.yaml", [("a", [16]), ("b", [16])], gbs=32)
    est, rep, fb, x, parts = _case(tmp_path, capsys, inv, plan)
    m, p = 32, 2
    assert est["pipeline_s"] >= m * x[0]                   # the link carries one micro-batch at a time
    bound = m * x[0] - (m + p - 1) * max(fb)               # what the link adds at least
    assert bound > m * max(fb)                             # the construction: more than the whole compute
    assert parts["link"]["seconds"] >= bound * (1 - 1e-6)
    assert rep["breakdown"]["bottleneck"] == "link" and rep["breakdown"]["boundary"] == 0


def test_bottleneck_compute_bound(tmp_path, capsys):
    inv = _inventory(tmp_path / "inv.yaml", [("a", 2)])
    plan = _plan(tmp_path / "p.yaml", [("a", [16, 16])], gbs=128)       # 2 stages, 128 micro-batches
    est, rep, fb, x, parts = _case(tmp_path, capsys, inv, plan)
    m, p = 128, 2
    slow = max(range(p), key=lambda i: fb[i])
    assert parts["compute"]["seconds"] == pytest.approx(m * fb[slow], rel=1e-5)
    assert parts["compute"]["seconds"] / est["pipeline_s"] >= m / (m + p - 1) * 0.99
    assert rep["breakdown"]["bottleneck"] == "compute" and rep["breakdown"]["stage"] == slow
    assert "stage %d" % slow in rep["bottleneck"]


def test_explain_full_report_on_the_readme_plan(readme_plan, capsys):
    # overlapped boundaries: the README inventory's plan of the tour (its 910B holds the first stage)
    plan, _ = readme_plan          # (plan --explain: the demo test)
    rep = _json(capsys, "explain", "--plan", plan, "--json")
    assert len(rep["runners_up"]) == 5
    base = rep["tokens_per_s"]
    assert all(r["tokens_per_s"] <= base * 1.0001 and r["differs"] for r in rep["runners_up"])
    assert [m["headroom_gib"] >= 0 for m in rep["memory"]] == [True] * rep["stages"]
    whats = [r["what"] for r in rep["sensitivity"]]
    assert "global batch" in whats and any(w.startswith("link") for w in whats)
    assert sum(w.startswith("cluster") for w in whats) == 2
    link = next(r for r in rep["sensitivity"] if r["what"].startswith("link"))
    slow, fast = link["cases"]
    assert slow["tokens_per_s"] <= base <= fast["tokens_per_s"]     # a slower link never helps this layout
    # its overlapped boundary (ascend -> h800) blocking instead: the search chose overlap there, so it cannot be faster
    blocking = rep["blocking_boundaries"]
    assert blocking["boundaries"] == ["ascend -> h800"] and blocking["tokens_per_s"] < base


def test_simulate_what_if_flags(readme_plan, capsys):
    plan, inv = readme_plan
    sim = lambda *extra: _json(capsys, "simulate", "--model", "llama2-70b", "--inventory", inv, "--plan", plan,
                               "--json", *extra)
    base = sim()
    slow = sim("--set", "link.h800-ascend.bandwidth_gbps=2.5")
    assert slow["iteration_time_s"] > base["iteration_time_s"]
    # either order of the link's ends; a latency of 500 ms (the inventory says 2) cannot be free
    far = sim("--set", "link.ascend-h800.latency_ms=500")["iteration_time_s"]
    assert far == sim("--set", "link.h800-ascend.latency_ms=500")["iteration_time_s"] > base["iteration_time_s"]
    big = sim("--global-batch-size", "1024")
    assert big["iteration_time_s"] > 1.8 * base["iteration_time_s"]
    for bad in (["--set", "link.h800-mars.bandwidth_gbps=1"], ["--set", "cluster.ascend.gpus=4"],
                ["--set", "cluster.ascend.nodes=two"], ["--set", "nodes=4"], ["--set", "cluster.ascend.nodes=1"],
                ["--global-batch-size", "1022"]):
        assert main(["simulate", "--model", "llama2-70b", "--inventory", inv, "--plan", plan, *bad]) == 2, bad
        err = capsys.readouterr().err
        assert "error:" in err and "Traceback" not in err


def test_summary_link_column_and_bottleneck_mark(tmp_path, capsys):
    inv = _inventory(tmp_path / "inv.yaml", [("a", 1), ("b", 1)], link_gbps=0.5)
    plan = _plan(tmp_path / "p.yaml", [("a", [16]), ("b", [16])], gbs=32)
    est = _json(capsys, "simulate", "--model", "llama2-7b", "--inventory", inv, "--plan", plan, "--json")
    lines = format_summary(load_plan(plan), est).splitlines()
    assert "link s" in lines[1]
    assert lines[3].endswith("<- bottleneck (link)") and f"{est['stages'][0]['send_next_s']:.4f}" in lines[3]
    assert lines[-1].startswith("bottleneck: exposed link time")


def test_compare(readme_plan, tmp_path, capsys):
    a, inv = readme_plan
    b = str(tmp_path / "b.yaml")
    assert main(["plan", "--model", "llama2-70b", "--inventory", inv, "--global-batch-size", "512", "-o", b,
                 "--quiet", "--json", "--boundary-schedule", "overlapped",
                 "--set", "link.h800-ascend.bandwidth_gbps=100"]) == 0
    capsys.readouterr()
    rep = _json(capsys, "compare", a, b, "--price", "h800=2", "--price", "ascend=1", "--json")
    ra, rb = rep["plans"]
    assert rb["tokens_per_s"] > ra["tokens_per_s"] and "tokens_per_s" in rep["differ"]
    # $/1M tokens from first principles: device-hours of one iteration over its tokens
    plan = load_plan(a)
    hours = ra["iteration_time_s"] / 3600
    usd = sum(m.num_devices * (2 if m.cluster == "h800" else 1) for m in plan.meshes) * hours
    # (the JSON's time is to the microsecond; the cost is of the unrounded time, as simulate and explain give it)
    assert ra["cost_per_million_tokens"] == pytest.approx(usd / (512 * 4096) * 1e6, rel=1e-6)
    # 2 x (activation + gradient) x m x samples x seq x hidden x 2 bytes at the one cross-cluster boundary
    assert ra["cross_cluster_bytes"] == 2 * 2 * plan.num_micro_batches * plan.samples_per_step * 4096 * 8192
    assert main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "* " in out and " <" in out
    assert main(["compare", a, "--price", "h800"]) == 2
    assert main(["compare", a, "--price", "mars=1"]) == 2
    # a cluster the plan uses left unpriced: no cost row, and stderr says which price is missing
    capsys.readouterr()
    assert _json(capsys, "compare", a, "--price", "h800=2", "--json")["plans"][0]["cost_per_million_tokens"] is None
    assert main(["compare", a, "--price", "h800=2"]) == 0
    assert "cluster(s) ascend it uses have no price (--price ascend=PRICE" in capsys.readouterr().err
    # plans of different inventories: a price of a cluster only one of them has is that one's (it prices only the
    # devices it uses), not an error of the other
    c = yaml.safe_load(open(a))
    extra = dict(next(x for x in c["inventory"]["clusters"] if x["name"] == "ascend"), name="mars")
    c["inventory"]["clusters"].append(extra)
    c["inventory"]["links"].append({"between": ["h800", "mars"], "bandwidth_gbps": 100, "latency_ms": 1})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(c, sort_keys=False))
    capsys.readouterr()
    rep = _json(capsys, "compare", a, str(tmp_path / "c.yaml"), "--price", "h800=2", "--price", "ascend=1",
                "--price", "mars=3", "--json")
    assert [r["cost_per_million_tokens"] for r in rep["plans"]] == pytest.approx([ra["cost_per_million_tokens"]] * 2)
    # prices in the inventory file give the same figure
    data = yaml.safe_load(open(inv))
    for c in data["clusters"]:
        c["price_per_device_hour"] = 2 if c["name"] == "h800" else 1
    priced = tmp_path / "priced.yaml"
    priced.write_text(yaml.safe_dump(data))
    capsys.readouterr()
    rep = _json(capsys, "compare", a, "--inventory", str(priced), "--json")
    assert rep["plans"][0]["cost_per_million_tokens"] == pytest.approx(ra["cost_per_million_tokens"], rel=1e-9)


def test_demo_explains_its_plan_and_draws_the_timeline(tmp_path, capfd):
    assert main(["demo", "--out", str(tmp_path), "--skip-training"]) == 0
    out = capfd.readouterr().out
    assert "bottleneck: " in out and "runners-up" in out and "sensitivity of throughput" in out
    with open(tmp_path / "llama2-70b-timeline.png", "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "llama2-70b-timeline.json").read_text())["traceEvents"]


def test_demo_help_promises_no_layout_of_the_searched_plan():
    """Step 2 dry-runs whatever the planner picks for the tiny model (now two even stages, groups side by
    side): its text names no layout; step 3's hand-written plan is named, and its stages are uneven."""
    import os

    from hetauto_megatron.commands import demo
    from hetauto_megatron.megatron.demo import _ROOT, DEFAULT_PLAN
    step2, step3 = demo.DESCRIPTION.split("\n  2. ")[1].split("\n  3. ")
    assert "uneven" not in step2 and "whatever plan it picks" in " ".join(step2.split())
    assert os.path.relpath(DEFAULT_PLAN, _ROOT) in step3 and "uneven" in step3
    assert len({n for m in load_plan(DEFAULT_PLAN).meshes for n in m.stage_layers}) > 1


def test_explain_replans_under_the_plans_own_constraints(readme_plan, tmp_path, capsys):
    # The unconstrained best plan uses both clusters; a plan made without 'ascend' must be explained against
    # runners-up that also leave it out, or the comparison is with plans the user ruled out.
    _, inv = readme_plan
    out = str(tmp_path / "h800-only.yaml")
    assert main(["plan", "--model", "llama2-70b", "--inventory", inv, "--global-batch-size", "512", "-o", out,
                 "--quiet", "--exclude-clusters", "ascend"]) == 0
    capsys.readouterr()
    rep = _json(capsys, "explain", "--plan", out, "--json")
    assert rep["runners_up"], "the search found no runner-up"
    assert all(r["clusters"] and set(r["clusters"]) == {"h800"} for r in rep["runners_up"]), rep["runners_up"]


def test_explain_replans_a_deepspeed_plan_for_deepspeeds_engine(readme_plan, tmp_path, capsys):
    """A plan made with --engine deepspeed is explained against layouts DeepSpeed's engine runs, priced as it runs
    them: re-planning the unchanged inventory finds the plan itself (an unused cluster's what-if changes nothing;
    before, explain re-planned for Megatron's engine and reported +17.5 % runners-up DeepSpeed cannot run), no
    runner-up is the plan again, and `plan --explain` and `explain --plan` agree."""
    _, inv = readme_plan
    out = str(tmp_path / "ds.yaml")
    assert main(["plan", "--model", "llama2-70b", "--inventory", inv, "--global-batch-size", "512", "-o", out,
                 "--quiet", "--engine", "deepspeed", "--use-clusters", "h800", "--explain", "--json"]) == 0
    at_plan = json.loads(capsys.readouterr().out)
    rep = _json(capsys, "explain", "--plan", out, "--json")
    plan = load_plan(out)
    assert {m.cluster for m in plan.meshes} == {"h800"}
    assert rep["runners_up"] and all(r["iteration_time_s"] > rep["iteration_time_s"] for r in rep["runners_up"])
    for r in rep["runners_up"]:
        assert "runtime settings" not in "; ".join(r["differs"]) and "selective" not in "; ".join(r["differs"]), r
    unused = next(row for row in rep["sensitivity"] if row["what"].startswith("cluster ascend size"))
    assert unused["base_tokens_per_s"] == pytest.approx(rep["tokens_per_s"], rel=1e-5)    # (the report rounds)
    assert all(c["tokens_per_s"] == pytest.approx(unused["base_tokens_per_s"], rel=1e-9) for c in unused["cases"])
    assert [r["differs"] for r in at_plan["explain"]["runners_up"]] == [r["differs"] for r in rep["runners_up"]]


def test_explain_of_a_cost_plan_ranks_runners_up_by_cost(readme_plan, tmp_path, capsys):
    """A plan made with --objective cost is the best per token the search found by that objective (cost per
    token x seconds^TIME_WEIGHT, docs/search.md): its runners-up are listed by it, none better than the plan, each
    cost the devices' prices x time over the tokens (computed here from the inventory's prices); before, they were
    listed by speed (+92 % tokens/s at a higher cost) with no cost shown."""
    _, inv = readme_plan
    out = str(tmp_path / "cost.yaml")
    prices = {"h800": 2.5, "ascend": 0.9}
    sets = [a for c, p in prices.items() for a in ("--set", f"cluster.{c}.price_per_device_hour={p}")]
    assert main(["plan", "--model", "llama2-70b", "--inventory", inv, "--global-batch-size", "512", "-o", out,
                 "--quiet", "--objective", "cost", *sets]) == 0
    capsys.readouterr()
    rep = _json(capsys, "explain", "--plan", out, "--json")
    tokens = 512 * 4096
    plan = load_plan(out)
    per_s = sum(m.num_devices * prices[m.cluster] / 3600 for m in plan.meshes)
    assert rep["objective"] == "cost"
    assert rep["cost_per_million_tokens"] == pytest.approx(per_s * rep["iteration_time_s"] / tokens * 1e6, rel=1e-4)
    value = [r["cost_per_million_tokens"] * r["iteration_time_s"] ** TIME_WEIGHT for r in rep["runners_up"]]
    mine = rep["cost_per_million_tokens"] * rep["iteration_time_s"] ** TIME_WEIGHT
    assert value and value == sorted(value) and min(value) >= mine * (1 - 1e-9)
    # the text report of the same figures (what `explain` without --json prints of them)
    from hetauto_megatron.commands.explain import format_report
    assert "ranked by the plan's objective: cost per token weighed by time" in format_report(rep)


def test_the_what_ifs_searched_ahead_are_those_the_sensitivity_replans(tmp_path):
    """explain searches the re-planned what-ifs ahead, in worker processes, and answers the sensitivity's re-plans
    from those searches (plan/explain.py replanned_inventories): the list must be what the sensitivity asks for.
    A plan on cluster a (1 node) of a and b (2 nodes): the unchanged inventory; the a-b link it does not cross at
    x2; a at 2 nodes (half a node is none); b at 1 and 4 nodes."""
    from types import SimpleNamespace

    from hetauto_megatron.commands.explain import plan_inputs
    from hetauto_megatron.plan import sensitivity as S

    inv = _inventory(tmp_path / "inv.yaml", [("a", 1), ("b", 2)], link_gbps=100)
    plan_file = _plan(tmp_path / "plan.yaml", [("a", [32])], 64)
    plan, inventory, cost_model = plan_inputs(SimpleNamespace(inventory=inv), plan_file)
    asked = []
    S.sensitivity(plan, inventory, cost_model, replan=lambda i: asked.append(i) or 1.0)
    assert asked == S.replanned_inventories(plan, inventory)
    assert [([c.nodes for c in i.clusters], [k.bandwidth_gbps for k in i.links.values()]) for i in asked] == \
        [([1, 2], [100]), ([1, 2], [200]), ([2, 2], [100]), ([1, 1], [100]), ([1, 4], [100])]


def test_a_what_if_without_a_feasible_plan_is_noted_also_when_searched_ahead(tmp_path, capsys):
    """LLaMA-2-70B on 2 H800 nodes and an A100-40 node: with one H800 node no layout fits. Searched in a worker
    process that what-if ended explain with exit 3 (the search's error escaped the pool); now each way it is
    the same row: 'no feasible plan'."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"clusters": [{"name": "big", "device": "H800", "nodes": 2, "devices_per_node": 8},
                                                {"name": "small", "device": "A100-40GB", "nodes": 1,
                                                 "devices_per_node": 8}],
                                   "links": [{"between": ["big", "small"], "bandwidth_gbps": 25, "latency_ms": 2}]}))
    plan = str(tmp_path / "plan.yaml")
    assert main(["plan", "--model", "llama2-70b", "--inventory", str(inv), "--global-batch-size", "64", "-o", plan,
                 "--quiet"]) == 0
    capsys.readouterr()
    reps = [_json(capsys, "explain", "--plan", plan, "--json", "--quiet", "--workers", w) for w in ("1", "2")]
    assert reps[0] == reps[1]
    big = next(r for r in reps[1]["sensitivity"] if r["what"] == "cluster big size (nodes)")
    assert big["cases"][0]["value"] == 1 and big["cases"][0]["note"] == "no feasible plan"


def test_explain_runners_up_zero_shows_none(readme_plan, capsys):
    """--runners-up 0 listed every runner-up the search kept (31), and the table's columns slid from row 10 on."""
    plan, _ = readme_plan
    assert main(["explain", "--plan", plan, "--runners-up", "0", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["runners_up"] == []
    assert main(["explain", "--plan", plan, "--runners-up", "12", "--quiet"]) == 0
    out = capsys.readouterr().out
    rows = out.split("decision that differs")[1].split("\n\n")[0].strip("\n").splitlines()
    assert len(rows) == 12 and len({r.index(",") for r in rows}) == 1, rows    # (tokens/s right-aligned)


def test_runners_up_of_a_plan_whose_throughput_rounds_to_zero(tmp_path, capsys):
    """A device of 1e-9 TFLOP/s (the smallest figure the inventory takes): the plan's tokens/s is stored rounded, as
    0, and the runners-up's 'vs plan' divided by it (ZeroDivisionError). Their ratio is the inverse of their
    iteration times, which never round to 0."""
    inv = tmp_path / "inv.yaml"
    inv.write_text("clusters:\n  - {name: a, device: cpu, nodes: 1, devices_per_node: 4, peak_tflops: 1.0e-9}\n")
    plan = str(tmp_path / "p.yaml")
    assert main(["plan", "--model", "tiny", "--inventory", str(inv), "--global-batch-size", "8", "-o", plan,
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["explain", "--plan", plan, "--runners-up", "2"]) == 0
    out = capsys.readouterr().out
    rows = out.split("runners-up")[1].splitlines()[2:4]
    assert len(rows) == 2 and all("%" in r for r in rows)
    # and the JSON's rates are not 0 beside an iteration time that says otherwise (they were rounded to 0.0)
    assert main(["simulate", "--plan", plan, "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    tokens = 8 * load_plan(plan).model.seq_length / est["iteration_time_s"]
    assert est["tokens_per_s"] == pytest.approx(tokens, rel=1e-3) and est["tflops_per_device"] > 0 < est["mfu"]


def test_explain_of_a_plan_of_two_pipelines_lists_the_alternatives_weighed(tmp_path, capsys):
    """explain of a plan of several pipelines showed no runners-up (and never read its search record). Now it
    lists what the search weighed: the best single pipeline of single meshes is what a separate `plan --shapes
    simple` finds, no alternative is faster than the plan, and `plan --explain` reuses its own search for the
    same list."""
    from helpers import run_cli, twins_and_l40s
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(twins_and_l40s()))
    (tmp_path / "m8.yaml").write_text("preset: llama2-7b\nnum_layers: 8\n")
    base = ["plan", "--model", str(tmp_path / "m8.yaml"), "--inventory", str(tmp_path / "inv.yaml"),
            "--global-batch-size", "512", "--json", "--quiet", "--workers", "1"]

    def run(argv):
        rc, out, err = run_cli(argv, capsys)
        assert rc == 0, err
        return json.loads(out), err

    planned, _ = run(base + ["-o", str(tmp_path / "p.yaml"), "--explain"])
    assert planned["plan"].get("pipelines"), "the case needs a plan of several pipelines"
    simple, _ = run(base + ["--shapes", "simple"])
    rep, err = run(["explain", "--plan", str(tmp_path / "p.yaml"), "--json", "--workers", "2"])
    alts = rep["runners_up"]
    assert alts == planned["explain"]["runners_up"]
    # plan --explain re-planned the what-ifs one after another (--workers 1), explain in two worker processes
    assert rep["sensitivity"] == planned["explain"]["sensitivity"]
    one = next(a for a in alts if a["what"] == "one pipeline of single meshes")
    assert one["iteration_time_s"] == pytest.approx(simple["iteration_time_s"], abs=1e-6)   # (6 decimals)
    assert any(a["what"].startswith("pipelines ") for a in alts)
    assert all(a["vs_plan"] >= -1e-9 for a in alts if a["iteration_time_s"] is not None)
    from hetauto_megatron.commands.explain import format_report     # (the text the command prints for it)
    text = format_report(rep)
    assert "alternatives the search weighed" in text and "one pipeline of single meshes" in text
    # The cluster sizes are re-planned, every shape searched: c at twice its nodes is what a cold plan on an
    # inventory with c doubled finds (the runtime's what-if, priced by an independent run of the planner).
    rows = {row["what"]: row for row in rep["sensitivity"]}
    assert {"cluster a size (nodes)", "cluster b size (nodes)", "cluster c size (nodes)"} <= set(rows)
    bigger = twins_and_l40s()
    bigger["clusters"][2]["nodes"] = 2
    (tmp_path / "inv2.yaml").write_text(yaml.safe_dump(bigger))
    cold, _ = run(base[:4] + [str(tmp_path / "inv2.yaml")] + base[5:])
    doubled = rows["cluster c size (nodes)"]["cases"][1]
    assert doubled["value"] == 2 and rows["cluster c size (nodes)"]["method"] == "re-planned"
    tokens = rep["tokens_per_s"] * rep["iteration_time_s"]
    assert doubled["tokens_per_s"] == pytest.approx(tokens / cold["iteration_time_s"], rel=1e-5)
    assert rows["cluster c size (nodes)"]["cases"][0]["note"] == "fewer than one node"
    assert "[re-planned]" in text and "re-planned 1 of" in err
    # what the plan owes to its overlapped boundaries: the search chose overlap, so blocking cannot be faster
    blocking = rep["blocking_boundaries"]
    assert blocking and blocking["boundaries"] and blocking["tokens_per_s"] <= rep["tokens_per_s"] * (1 + 1e-9)
    assert all(" -> " in b for b in blocking["boundaries"])



def test_the_end_of_iteration_sync_is_not_called_dp(capsys):
    """Two clusters 20 s apart (latency): the global norm's all-reduce at the iteration's end crosses that link 4
    times (80 s), which explain named "DP synchronisation" although no mesh's DP reduction waits on it; a user would
    shrink DP for nothing. It is its own part now, and the DP part is what DP costs (almost nothing here). Megatron-LM's
    result check before the norm is one more scalar around the same ring: 80 s more."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rc = main(["explain", "--plan", os.path.join(root, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml"),
               "--inventory", os.path.join(root, "examples", "llama", "inventory-cpu-tiny-2clusters.yaml"),
               "--set", "link.cluster-a-cluster-b.latency_ms=20000", "--no-search", "--json"])
    breakdown = json.loads(capsys.readouterr().out)["breakdown"]
    parts = breakdown["parts"]
    assert rc == 0
    assert abs(parts["tail_sync"]["seconds"] - 2 * 4 * 20.0) < 0.5, parts
    assert parts["dp_sync"]["seconds"] < 0.01, parts
    assert abs(sum(p["seconds"] for p in parts.values()) - breakdown["iteration_s"]) < 1e-6, parts
    # the untied plan's tail sync is the norm and the check alone, and the breakdown says so (the text on the
    # part's line)
    assert abs(breakdown["grad_norm_s"] - 4 * 20.0) < 0.5, breakdown
    assert abs(breakdown["result_check_s"] - 4 * 20.0) < 0.5, breakdown
    main(["explain", "--plan", os.path.join(root, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml"),
          "--inventory", os.path.join(root, "examples", "llama", "inventory-cpu-tiny-2clusters.yaml"),
          "--set", "link.cluster-a-cluster-b.latency_ms=20000", "--no-search"])
    line = next(x for x in capsys.readouterr().out.splitlines() if "iteration-end sync" in x and x.startswith("  "))
    assert "(of which the global gradient norm 80.000 s, the result check 80.000 s)" in line, line


def test_what_ifs_leave_out_the_clusters_the_plan_excluded(tmp_path, capsys):
    """A plan made with --exclude-clusters old: explain re-planned old's size and its link under the same
    constraints (+0.0 %, read as 'old does not matter', and whole searches spent); those rows are left out now."""
    inv = tmp_path / "inv.yaml"
    inv.write_text("clusters:\n  - {name: h, device: h800, nodes: 1, devices_per_node: 8}\n"
                   "  - {name: hw, device: ascend-910b, nodes: 1, devices_per_node: 8}\n"
                   "  - {name: old, device: a100, nodes: 1, devices_per_node: 8}\n"
                   "links:\n  - {between: [h, hw], bandwidth_gbps: 25, latency_ms: 2}\n"
                   "  - {between: [hw, old], bandwidth_gbps: 25, latency_ms: 2}\n")
    plan = tmp_path / "p.yaml"
    assert main(["plan", "--model", "llama2-7b", "--inventory", str(inv), "--exclude-clusters", "old", "--quiet",
                 "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["explain", "--plan", str(plan), "--json"]) == 0
    rows = [r["what"] for r in json.loads(capsys.readouterr().out)["sensitivity"]]
    assert "cluster h size (nodes)" in rows and not any("old" in r for r in rows), rows


def test_explain_takes_a_budget_for_its_re_plans(tmp_path, capsys):
    """A large inventory's re-plans took minutes with no way to cap them short of --no-search: --budget-s caps
    each, as plan's caps its search; a budget that is not positive is refused."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    plan = os.path.join(root, "examples", "llama", "plans", "llama2-70b-736.yaml")
    assert main(["explain", "--plan", plan, "--budget-s", "0", "--quiet"]) == 2
    assert "field '--budget-s'" in capsys.readouterr().err
    assert main(["explain", "--plan", plan, "--budget-s", "0.5", "--quiet", "--json", "--runners-up", "1"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert any(r["method"] == "re-planned" for r in rep["sensitivity"])


def test_runners_up_that_add_a_cluster_say_what_it_runs():
    """Two runners-up that differ only in how a cluster the plan leaves out joins (another TP) were listed with
    the same words: the decisions of a joining cluster were skipped."""
    from hetauto_megatron.plan.explain import differences
    from hetauto_megatron.plan.simulate import MeshChoice
    plan = [MeshChoice("h800", 2, 4, 1, "none", 8)]
    one = plan + [MeshChoice("ascend", 4, 1, 4, "none", 1)]
    other = plan + [MeshChoice("ascend", 2, 2, 2, "full", 2)]
    a, b = differences(plan, [10] * 8, one, [9] * 8 + [8]), differences(plan, [10] * 8, other, [8] * 8 + [8, 8])
    assert a != b
    assert any("ascend: TP 4, DP 1, micro-batch 4, 1 stage, recompute none" in d for d in a), a
    assert any("ascend: TP 2, DP 2, micro-batch 2, 2 stages, recompute full" in d for d in b), b


def test_explain_of_a_plan_made_under_a_floor_that_a_what_if_breaks(tmp_path, capsys):
    """A plan made with --max-iteration-s, explained on an inventory where nothing meets that floor any more
    (--set slows the H800s): explain exited 3 ("no plan that fits runs within ..."); it explains the plan, with the
    best layouts the search found as runners-up."""
    out = str(tmp_path / "floor.yaml")
    assert main(["plan", "--model", "llama2-7b", "--inventory", "examples/llama/inventory-2clusters.yaml",
                 "--global-batch-size", "64", "--max-iteration-s", "0.37", "-o", out, "--quiet"]) == 0
    capsys.readouterr()
    rep = _json(capsys, "explain", "--plan", out, "--set", "cluster.h800.peak_tflops=300", "--json")
    assert rep["iteration_time_s"] > 0.37 and rep["runners_up"]


def test_explain_re_searches_a_plan_that_crosses_no_cluster_boundary_with_the_default_schedule(tmp_path, capsys):
    """Two A100 sites whose plan is one stage with a replica group alongside (no boundary between clusters): the
    meshes' schedules say nothing, and explain re-searched with blocking boundaries, listing 'one pipeline of
    single meshes' at 5.156 s where the plan's own search (overlapped, the default) had 4.792 s."""
    model = tmp_path / "m8.yaml"
    model.write_text("preset: llama2-7b\nnum_layers: 8\n")
    inv = tmp_path / "two-a100.yaml"
    site = "{name: %s, device: A100-80GB, nodes: 2, devices_per_node: 8, intra_node: {bandwidth_gbps: 2400, " \
           "latency_us: 5}, inter_node: {bandwidth_gbps: 200, latency_us: 10}}"
    inv.write_text(f"clusters:\n  - {site % 'a'}\n  - {site % 'b'}\n"
                   "links:\n  - {between: [a, b], bandwidth_gbps: 400, latency_ms: 1}\n")
    out = str(tmp_path / "plan.yaml")
    args = ["--model", str(model), "--inventory", str(inv), "--global-batch-size", "512", "--quiet"]
    assert main(["plan", *args, "-o", out]) == 0
    capsys.readouterr()
    simple = _json(capsys, "plan", *args, "--shapes", "simple", "--json")
    rep = _json(capsys, "explain", "--plan", out, "--json")
    row = next(r for r in rep["runners_up"] if r["what"] == "one pipeline of single meshes")
    assert not load_plan(out).is_simple
    assert row["iteration_time_s"] == pytest.approx(512 * 4096 / simple["tokens_per_s"], rel=1e-5)


def test_explain_of_a_plan_of_two_pipelines_on_an_inventory_nothing_fits_is_exit_3(capsys):
    """A plan of two pipelines explained on an inventory where no layout fits (--set shrinks every cluster's memory):
    the re-plan finds nothing and the plan itself does not fit, so there is nothing to weigh it against. Before, the
    sensitivity's reference indexed the missing outcome: a TypeError traceback, exit 1. Now exit 3, one paragraph;
    --no-search still explains the plan alone."""
    root = os.path.join(os.path.dirname(__file__), "..", "examples", "llama")
    argv = ["explain", "--plan", os.path.join(root, "plans", "tiny-2pipelines-cpu.yaml"), "--inventory",
            os.path.join(root, "inventory-cpu-tiny-2clusters.yaml"), "--quiet"]
    sets = []
    for cluster in yaml.safe_load(open(argv[4]))["clusters"]:
        sets += ["--set", f"cluster.{cluster['name']}.memory_gib=0.01"]
    assert main(argv + sets) == 3
    err = capsys.readouterr().err
    assert "no feasible plan" in err and "Traceback" not in err, err
    assert main(argv + sets + ["--no-search"]) == 0
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_compare_names_the_plan_whose_inventory_lacks_a_set_key(readme_plan, tmp_path, capsys):
    """`compare a.yaml b.yaml --set cluster.X.nodes=4` where only b's inventory has X: refused, naming the plan
    whose inventory lacks it (the paragraph named only the clusters it has); the same file twice in two folders is
    headed by its paths."""
    a, inv = readme_plan
    three = os.path.join(os.path.dirname(__file__), "..", "examples", "llama", "inventory-3clusters.yaml")
    b = str(tmp_path / "b.yaml")
    assert main(["plan", "--model", "llama2-70b", "--inventory", three, "--global-batch-size", "512", "-o", b,
                 "--quiet"]) == 0
    extra = [c["name"] for c in yaml.safe_load(open(three))["clusters"]
             if c["name"] not in {c["name"] for c in yaml.safe_load(open(inv))["clusters"]}][0]
    capsys.readouterr()
    assert main(["compare", a, b, "--set", f"cluster.{extra}.nodes=4"]) == 2
    assert f"(in the inventory {a} is priced on)" in capsys.readouterr().err
    for d in ("x", "y"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "p.yaml").write_text(open(a).read())
    assert main(["compare", str(tmp_path / "x" / "p.yaml"), str(tmp_path / "y" / "p.yaml")]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert str(tmp_path / "x" / "p.yaml") in head and str(tmp_path / "y" / "p.yaml") in head


def test_explain_of_a_plan_whose_throughput_rounds_to_zero(tmp_path, capsys):
    """A link of 1e-6 Gbit/s between the only two clusters: the plan's estimate is 0 tokens/s, and explain divided
    the blocking boundaries' throughput by it (ZeroDivisionError, exit 1); now the change is against the unrounded
    rate (and '-' where that is 0)."""
    inv = tmp_path / "inv.yaml"
    inv.write_text("clusters:\n  - {name: a, device: a100, nodes: 1, devices_per_node: 8}\n"
                   "  - {name: b, device: h100, nodes: 1, devices_per_node: 8}\n"
                   "links:\n  - {between: [a, b], bandwidth_gbps: 0.000001}\n")
    plan = str(tmp_path / "x.yaml")
    assert main(["plan", "--model", "llama2-7b", "--inventory", str(inv), "--use-clusters", "a,b", "--quiet",
                 "-o", plan]) == 0
    capsys.readouterr()
    assert main(["explain", "--plan", plan, "--no-search"]) == 0
    # (the change is against the unrounded rate, 0.007 tokens/s: a change of under 0.05 %)
    assert "blocking instead (same layout) 0 tokens/s (-0.0%)" in capsys.readouterr().out


def test_explain_no_search_reads_a_plan_whose_search_record_is_garbled(readme_plan, tmp_path, capsys):
    """`estimate.search: x` (hand-edited): simulate, compare and emit read the plan, and explain --no-search, which
    searches nothing, refused it; explain with its re-plans still names the record."""
    a, _ = readme_plan
    plan = yaml.safe_load(open(a))
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**plan, "estimate": {**plan["estimate"], "search": "x"}}))
    assert main(["explain", "--plan", str(path), "--no-search", "--quiet"]) == 0
    assert main(["explain", "--plan", str(path), "--quiet", "--runners-up", "0"]) == 2
    assert "field 'estimate.search'" in capsys.readouterr().err


def test_the_slow_boundary_of_a_deep_one_mesh_pipeline_is_found_among_the_boundaries_tried():
    """A pipeline of 40 stages in one mesh (no boundary between meshes, so the breakdown tries the boundaries
    inside it, at most MAX_BOUNDARIES_TRIED of them: one simulation each had made a 200-stage summary take 30 s):
    the one slow link is still the one named, checked against the makespan with each link made instant alone."""
    from hetauto_megatron.plan import explain
    from hetauto_megatron.plan.simulate import stage_makespan
    n, m, slow = 40, 8, 29
    stages = [{"mesh": 0, "forward_s": 0.01, "backward_s": 0.02, "busy_s": m * 0.03,
               "send_next_s": (0.05 if i == slow else 1e-4) if i < n - 1 else 0.0} for i in range(n)]
    makespan = stage_makespan(stages, m)
    got = explain.breakdown({"stages": stages, "iteration_time_s": makespan, "pipeline_s": makespan}, m)
    links = [s["send_next_s"] for s in stages[:-1]]
    saves = [makespan - stage_makespan(stages, m, [0.0 if k == i else x for k, x in enumerate(links)])
             for i in range(n - 1)]
    assert n - 1 > explain.MAX_BOUNDARIES_TRIED
    assert got["link_boundary"] == slow == max(range(n - 1), key=lambda i: saves[i]), (got, saves)


def test_explain_checks_the_plan_against_the_inventory_before_it_replans(readme_plan, tmp_path, capsys):
    """--inventory without the plan's clusters: the what-ifs were re-planned first (seconds on a large inventory),
    and only then the plan was refused."""
    plan, _ = readme_plan
    inv = tmp_path / "one.yaml"
    inv.write_text("clusters:\n  - {name: a, device: h800, nodes: 1, devices_per_node: 1}\n")
    assert main(["explain", "--plan", plan, "--inventory", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "re-plan" not in err and "which the inventory" in err and f"{plan}: field 'meshes[0].cluster'" in err, err


def test_compare_marks_only_plans_that_fit_and_says_what_else_differs(readme_plan, tmp_path, capsys):
    """The README's plan beside itself with its stored H800s cut to 60 GiB (no longer fits) and beside its fp32
    twin: '<' marked the plan over its memory the fastest; plans priced on different stored inventories were ranked
    without a word; the precision was nowhere (fp16 marked 2.4x "better" than fp32)."""
    a, inv = readme_plan
    raw = yaml.safe_load(open(a))
    raw["inventory"]["clusters"] = [dict(c, memory_gib=60) if c["name"] == "h800" else c
                                    for c in raw["inventory"]["clusters"]]
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(raw))
    slow = str(tmp_path / "slow.yaml")      # fewer devices, on the plan's own inventory: slower, and fits
    assert main(["plan", "--model", "llama2-70b", "--inventory", inv, "--global-batch-size", "512", "-o", slow,
                 "--quiet", "--max-devices", "64"]) == 0
    capsys.readouterr()
    assert main(["compare", str(small), slow]) == 0
    out, err = capsys.readouterr()
    rows = {line[3:31].strip(): line[31:] for line in out.splitlines() if line[:1] in "* "}
    times = rows["iteration s"].split()
    assert rows["fits in memory"].split() == ["NO", "yes"] and float(times[0]) < float(times[1]), rows
    assert times[1:] == [times[1], "<"], rows["iteration s"]       # the plan that fits, not the faster one
    assert "priced on different inventories" in err and f"({small}; {slow})" in err, err
    twin = tmp_path / "fp16.yaml"
    twin.write_text(yaml.safe_dump(dict(yaml.safe_load(open(a)), precision="fp16")))
    assert main(["compare", a, str(twin)]) == 0
    out, err = capsys.readouterr()
    assert any(line.startswith("*  precision") and "bf16" in line and "fp16" in line for line in out.splitlines())
    assert "train different jobs" in err and "different inventories" not in err, err


def test_the_breakdown_of_a_deepspeed_plan_prices_deepspeeds_schedule():
    """The breakdown's link share is what the iteration would save with the links instant. For a plan run by
    DeepSpeed's engine it was taken against Megatron's 1F1B of the same passes (without the engine's all-gathers):
    on the README's inventory planned with --engine deepspeed it claimed 0.494 s for one boundary that carries 0.35 s
    in all (the gap between the two schedules). Against the same plan re-simulated with the link between the
    clusters made instant (the inventory's link, priced afresh): the link share, within a tenth of a millisecond
    per boundary crossed, and the compute share is the slowest stage's busy time, the all-gathers included."""
    from hetauto_megatron.plan.explain import breakdown
    from hetauto_megatron.plan.plan import Mesh, Plan
    from hetauto_megatron.plan.simulate import simulate
    from hetauto_megatron.spec.inventory import inventory_from_dict
    from hetauto_megatron.spec.model import PRESETS

    def inventory(gbps, latency_ms):
        return inventory_from_dict({"clusters": [{"name": n, "device": "h800", "nodes": 1, "devices_per_node": 8}
                                                 for n in "ab"],
                                    "links": [{"between": ["a", "b"], "bandwidth_gbps": gbps,
                                               "latency_ms": latency_ms}]})
    model = PRESETS["llama2-7b"].replace(num_layers=8)
    plan = Plan(model, 64, tuple(Mesh(c, "h800", 2, 4, 1, "full", (4,)) for c in "ab"), engine="deepspeed")
    slow = simulate(plan, inventory(1, 5), engine="deepspeed")
    fast = simulate(plan, inventory(1e9, 0), engine="deepspeed")
    est = slow.to_dict()
    parts = {k: v["seconds"] for k, v in breakdown(est, plan.num_micro_batches)["parts"].items()}
    assert parts["link"] == pytest.approx(slow.pipeline_s - fast.pipeline_s, abs=1e-4)
    assert parts["link"] > 0.05 * slow.pipeline_s          # the 1 Gbit/s link matters
    assert parts["compute"] == pytest.approx(max(s["busy_s"] for s in est["stages"]), abs=1e-6)
    assert sum(parts.values()) == pytest.approx(slow.iteration_time_s, abs=1e-5)


def test_the_plan_the_search_picked_is_among_the_alternatives_it_weighed(tmp_path, capsys):
    """The tiny model over the two CPU clusters at a global batch of 18 (14 before the tree offered steps above the
    devices, where one mesh of cluster-a now runs the batch in two steps): the search's plan is cluster-a's pipeline
    with a group of cluster-b alongside, grown from the best single pipeline. explain listed neither it nor anything
    as fast (its fastest alternative, one pipeline of single meshes, was 25 % slower than the plan), and its
    "cluster-a with groups alongside" row was slower than cluster-a alone, where a group had been kept from no
    score at all. Now the alternatives hold the plan itself, and each cluster's row with groups alongside is no
    slower than that cluster alone."""
    from helpers import ROOT, run_cli
    (tmp_path / "m.yaml").write_text("preset: tiny\ntie_embeddings: true\n")
    inv = os.path.join(ROOT, "examples", "llama", "inventory-cpu-tiny-2clusters.yaml")
    plan = str(tmp_path / "p.yaml")
    rc, out, err = run_cli(["plan", "--model", str(tmp_path / "m.yaml"), "--inventory", inv, "--global-batch-size",
                            "18", "--quiet", "--workers", "1", "-o", plan, "--json"], capsys)
    assert rc == 0, err
    planned = json.loads(out)
    assert not load_plan(plan).is_simple, "the case needs a plan of the new shapes"
    rc, out, err = run_cli(["explain", "--plan", plan, "--json", "--workers", "1", "--runners-up", "10"], capsys)
    assert rc == 0, err
    alts = json.loads(out)["runners_up"]
    timed = [a for a in alts if a["iteration_time_s"] is not None]
    assert min(a["iteration_time_s"] for a in timed) == pytest.approx(planned["iteration_time_s"], abs=1e-6), alts
    names = ("cluster-a", "cluster-b")
    for c in names:     # each cluster alone, as a separate plan finds it: a row for c never says slower than that
        row = next((a for a in timed if a["what"] in (f"{c} with groups alongside", f"{c} alone")), None)
        if row is None:
            continue
        rc, out, err = run_cli(["plan", "--model", str(tmp_path / "m.yaml"), "--inventory", inv,
                                "--global-batch-size", "18", "--quiet", "--workers", "1", "--shapes", "simple",
                                "--exclude-clusters", next(n for n in names if n != c), "--json"], capsys)
        assert rc == 0, err
        assert row["iteration_time_s"] <= json.loads(out)["iteration_time_s"] * (1 + 1e-6), (c, alts)


def test_a_ctrl_c_of_explain_is_its_one_line_without_the_workers_tracebacks(tmp_path):
    """A terminal's Ctrl-C (SIGINT to the whole process group) while explain re-plans its what-ifs in two worker
    processes: the command said "hetauto explain: interrupted" (exit 130), and above it each worker printed its
    KeyboardInterrupt traceback. The workers now leave the Ctrl-C to the command, whose pool ends them."""
    import signal
    import subprocess
    import sys

    from helpers import ROOT
    plan = tmp_path / "plan.yaml"
    inv = os.path.join(ROOT, "examples", "llama", "inventory-3clusters.yaml")
    assert main(["plan", "--model", "llama2-70b", "--inventory", inv, "--quiet", "--workers", "1", "-o",
                 str(plan)]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "hetauto_megatron.cli", "explain", "--plan", str(plan),
                             "--workers", "2"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err = []
    try:
        for line in proc.stderr:            # the first what-if done: the workers are at their next ones
            err.append(line)
            if "re-planned 1 of" in line:
                os.killpg(proc.pid, signal.SIGINT)
                break
        err.append(proc.communicate(timeout=120)[1])
    finally:
        proc.kill()
    text = "".join(err)
    assert proc.returncode == 130 and "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert text.strip().endswith("hetauto explain: interrupted"), text[-3000:]
