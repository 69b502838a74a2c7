"""Review findings on what explain / simulate / compare tell a user (each checked against something other than
the code path that produced it: the simulator re-run on a changed inventory, the pixels of the picture)."""
import json
import re

import pytest
import yaml

from hetauto_megatron.cli import main


def _json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _three_sites(tmp_path, gbps=0.5):
    inv = {"clusters": [{"name": n, "device": "H800", "nodes": 1, "devices_per_node": 8} for n in "abc"],
           "links": [{"between": ["a", "b"], "bandwidth_gbps": gbps, "latency_ms": 1},
                     {"between": ["b", "c"], "bandwidth_gbps": gbps, "latency_ms": 1}]}
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
    from hetauto_megatron.spec.model import load_model
    plan = {"version": 2, "model": load_model("llama2-7b").to_dict(), "global_batch_size": 32,
            "meshes": [{"cluster": c, "device_type": "h800", "tp": 8, "dp": 1, "micro_batch_size": 1,
                        "recompute": "none", "stage_layers": layers}
                       for c, layers in (("a", [11]), ("b", [10]), ("c", [11]))]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(plan))
    return str(tmp_path / "inv.yaml"), str(tmp_path / "p.yaml")


def test_a_link_bottleneck_names_every_boundary_that_binds(tmp_path, capsys):
    """Two equally slow links in one pipeline: each alone hides behind the other, so naming one of them as THE
    bottleneck sends a user to upgrade a link that buys nothing. Whatever the sentence names, making exactly
    those links fast (the simulator on a changed inventory) must recover at least half the exposed link time."""
    inv, plan = _three_sites(tmp_path)
    rep = _json(capsys, "explain", "--plan", plan, "--inventory", inv, "--no-search", "--json")
    assert rep["breakdown"]["bottleneck"] == "link"
    named = set(re.findall(r"(\w+) -> (\w+)", rep["bottleneck"]))
    named = {frozenset(p) for p in named if not p[0].isdigit()}
    assert named, rep["bottleneck"]
    sets = []
    for pair in named:
        sets += ["--set", f"link.{'-'.join(sorted(pair))}.bandwidth_gbps=100000"]
    base = rep["iteration_time_s"]
    fast = _json(capsys, "simulate", "--plan", plan, "--inventory", inv, "--json", *sets)["iteration_time_s"]
    link_part = rep["breakdown"]["parts"]["link"]["seconds"]
    assert base - fast >= 0.5 * link_part, (rep["bottleneck"], base, fast, link_part)


def test_a_replanned_what_if_that_only_adds_capacity_is_never_worse_than_the_plan(tmp_path, capsys):
    """explain's re-planned rows ask a search; a search that misses (MCTS noise, a path changed by an unused
    cluster) must not be reported as 'a bigger cluster / a faster link makes it slower': the plan itself still runs
    there. Here the search is made to miss on purpose; the figure must be at least the plan's own throughput on
    that inventory, which `hetauto simulate --set` prices independently."""
    from hetauto_megatron.plan import sensitivity as S
    from hetauto_megatron.plan.plan import load_plan
    from hetauto_megatron.spec.inventory import load_inventory
    inv_path, plan_path = _three_sites(tmp_path, gbps=100)
    plan, inv = load_plan(plan_path), load_inventory(inv_path)
    rows = S.sensitivity(plan, inv, None, replan=lambda i: 1.0)        # a search that found almost nothing
    row = next(r for r in rows if r["key"] == "cluster.b.nodes")
    x2 = next(c for c in row["cases"] if c["factor"] == 2)
    own = _json(capsys, "simulate", "--plan", plan_path, "--inventory", inv_path, "--json",
                "--set", "cluster.b.nodes=2")["tokens_per_s"]
    assert x2["tokens_per_s"] >= own * (1 - 1e-6), (x2, own)
    assert x2["change"] >= -1e-9


def test_cost_objective_what_ifs_show_the_cost_they_minimise(tmp_path, capsys):
    """Under --objective cost the re-planned what-ifs minimise cost per token; tokens/s alone can fall where the
    cost falls too. Each re-planned case carries its cost per 1M tokens, checked against price x devices / tokens."""
    inv = {"clusters": [{"name": "a", "device": "H800", "nodes": 1, "devices_per_node": 8,
                         "price_per_device_hour": 2.0}]}
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({
        "name": "m4", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "ffn_hidden_size": 4096,
        "vocab_size": 32000, "seq_length": 1024}))
    assert main(["plan", "--model", str(tmp_path / "m.yaml"), "--inventory", str(tmp_path / "inv.yaml"),
                 "--global-batch-size", "64", "--objective", "cost", "-o", str(tmp_path / "p.yaml"), "--quiet"]) == 0
    capsys.readouterr()
    rep = _json(capsys, "explain", "--plan", str(tmp_path / "p.yaml"), "--json", "--quiet", "--workers", "1")
    row = next(r for r in rep["sensitivity"] if r["key"] == "cluster.a.nodes")
    case = next(c for c in row["cases"] if c["factor"] == 2)
    assert case.get("cost_per_million_tokens") is not None, case
    # independent: the cheapest any layout on at least one device can be is bounded by what the plan pays
    used = sum(m["tp"] * m["dp"] * len(m["stage_layers"]) for m in yaml.safe_load(
        open(tmp_path / "p.yaml"))["meshes"])
    assert rep["cost_per_million_tokens"] == pytest.approx(
        used * 2.0 / 3600 / rep["tokens_per_s"] * 1e6, rel=1e-3)
    assert case["cost_per_million_tokens"] <= rep["cost_per_million_tokens"] * (1 + 1e-6)   # 2 nodes: never dearer


def test_every_json_output_names_its_schema_and_keeps_its_keys(tmp_path, capsys):
    """A script that reads plan / simulate / explain / compare / emit summary --json must be able to tell which
    version of the keys it got, and find the same keys whether or not the inventory has prices."""
    import os
    root = os.path.join(os.path.dirname(__file__), "..", "examples", "llama")
    inv = os.path.join(root, "inventory-cpu-dryrun.yaml")
    plan = str(tmp_path / "tiny.yaml")
    outs = {"plan": _json(capsys, "plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8",
                          "-o", plan, "--json", "--quiet", "--shapes", "simple")}
    outs["simulate"] = _json(capsys, "simulate", "--plan", plan, "--json")
    outs["explain"] = _json(capsys, "explain", "--plan", plan, "--json", "--no-search", "--quiet")
    outs["compare"] = _json(capsys, "compare", plan, plan, "--json")
    outs["emit-summary"] = _json(capsys, "emit", "summary", "--plan", plan, "--json")
    for kind, doc in outs.items():
        assert re.fullmatch(r"hetauto\.%s/\d+" % re.escape(kind), str(doc.get("schema"))), (kind, list(doc)[:5])
        assert doc.get("hetauto_version"), kind
    clusters = {c["name"] for c in yaml.safe_load(open(plan))["inventory"]["clusters"]}
    priced = _json(capsys, "simulate", "--plan", plan, "--json",
                   *sum((["--set", f"cluster.{c}.price_per_device_hour=1"] for c in clusters), []))
    assert set(priced) == set(outs["simulate"])


def test_emit_summary_json_takes_a_plan_with_replica_groups_side_by_side(capsys):
    """`hetauto plan` writes such plans (the tiny CPU example's own plan is one) and the text summary prints them;
    the --json summary exited 2 with an internal message. Its stage count is read from the file: the distinct
    stage_layers lists of a pipeline's positions."""
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "examples", "llama", "plans", "tiny-alongside-cpu.yaml")
    doc = _json(capsys, "emit", "summary", "--plan", path, "--json")
    data = yaml.safe_load(open(path))
    stages = sum(len(m["stage_layers"]) for m in data["meshes"] if not m.get("alongside"))
    pipes = doc.get("pipelines")
    got = pipes[0]["pipeline_parallel_size"] if pipes else doc["pipeline_parallel_size"]
    assert got == stages


def test_the_timeline_title_of_two_pipelines_gives_each_pipelines_own_stages():
    """'2 pipelines of 4 stages' read as four stages each; the file has two per pipeline."""
    import os
    from hetauto_megatron.plan.plan import load_plan
    from hetauto_megatron.plan.timeline import predicted_timeline
    from hetauto_megatron.spec.inventory import load_inventory
    root = os.path.join(os.path.dirname(__file__), "..", "examples", "llama")
    path = os.path.join(root, "plans", "tiny-2pipelines-cpu.yaml")
    data = yaml.safe_load(open(path))
    per = {}
    for m in data["meshes"]:
        if not m.get("alongside"):
            per[m.get("pipeline", 0)] = per.get(m.get("pipeline", 0), 0) + len(m["stage_layers"])
    tl = predicted_timeline(load_plan(path), load_inventory(os.path.join(root, "inventory-cpu-tiny-2clusters.yaml")))
    assert f"{len(per)} pipelines of {' + '.join(str(per[p]) for p in sorted(per))} stages" in tl.title, tl.title


def test_timeline_cluster_colours_stay_apart_from_each_other_and_from_the_kinds(tmp_path):
    """Draw a 10-cluster timeline (one stage each) and read the colours back from the picture: every cluster's
    forward colour must differ from every other's and from the link/receive/sync colours a reader looks for."""
    from PIL import Image
    from hetauto_megatron.emit.picture import KIND_COLOURS, draw_timelines
    from hetauto_megatron.plan.timeline import Lane, Span, Timeline
    names = [f"c{i}" for i in range(10)]
    lanes = [Lane(f"stage {i}", n, "stage", i) for i, n in enumerate(names)]
    spans = [Span(i, "forward", 0.0, 1.0, 0) for i in range(len(names))]
    path = str(tmp_path / "t.png")
    draw_timelines([Timeline("t", lanes, spans, 1.0, names)], path)
    im = Image.open(path).convert("RGB")
    w, h = im.size
    # the bars fill the axes' width; sample each one's colour at mid-width, rows from the top = lanes reversed
    col = [im.getpixel((w // 2, y)) for y in range(h)]
    runs = []                                   # (colour, rows) of each vertical run of one colour
    for c in col:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    bars = [c for c, n in runs if n >= 5 and max(c) - min(c) > 30]   # the bars' insides: coloured, not grey
    assert len(set(bars)) == len(names), bars

    def rgb(hexc):
        return tuple(int(hexc[i:i + 2], 16) for i in (1, 3, 5))
    kinds = [rgb(KIND_COLOURS[k]) for k in ("send", "receive", "dp-sync")]
    dist = lambda a, b: sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5
    assert min(dist(a, b) for a in bars for b in kinds) > 50
    assert min(dist(a, b) for i, a in enumerate(bars) for b in bars[i + 1:]) > 40


def test_a_what_if_that_leaves_the_plans_devices_but_not_a_node_per_launch_is_re_planned(tmp_path, capsys):
    """Two pipelines of 4 devices on a cluster of two 8-device nodes: each launch takes a node of its own
    (Plan.check_whole_nodes, as emit refuses otherwise). Halved to one node the cluster still has the 8 devices, but
    the plan no longer runs there; the what-if is the re-plan's, and explain must not stop with the plan's own
    error (it did: exit 2 blaming meshes[1] of a plan that runs as it is). Checked independently by simulate
    --set, which refuses the plan on the halved cluster."""
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(
        {"clusters": [{"name": "a", "device": "H800", "nodes": 2, "devices_per_node": 8}], "links": []}))
    model = {"name": "tiny", "num_layers": 8, "hidden_size": 512, "num_attention_heads": 8, "ffn_hidden_size": 2048,
             "vocab_size": 1024, "seq_length": 256, "num_query_groups": 8, "gated_mlp": True,
             "tie_embeddings": False, "position_embedding": "rope", "max_position_embeddings": 256}
    mesh = {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 4, "micro_batch_size": 1, "recompute": "none",
            "stage_layers": [8]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(
        {"version": 3, "model": model, "global_batch_size": 16, "pipelines": [{"samples": 8}, {"samples": 8}],
         "meshes": [mesh, {**mesh, "pipeline": 1}]}))
    inv, plan = str(tmp_path / "inv.yaml"), str(tmp_path / "p.yaml")
    assert main(["simulate", "--plan", plan, "--inventory", inv, "--set", "cluster.a.nodes=1"]) == 2
    capsys.readouterr()
    rep = _json(capsys, "explain", "--plan", plan, "--inventory", inv, "--workers", "1", "--json")
    row = next(r for r in rep["sensitivity"] if r["key"] == "cluster.a.nodes")
    half = next(c for c in row["cases"] if c["factor"] == 0.5)
    assert half.get("note") != "the plan itself: the re-plan found nothing better", half


from test_plan_objective import PRICED as TWO_PRICED  # noqa: E402  (a fast dear cluster, a slow cheap one)


@pytest.mark.parametrize("case", ["free devices", "floor"])
@pytest.mark.parametrize("form", ["with its devices", "tokens/s and cost"])
def test_a_replan_is_judged_against_the_plan_by_the_searchs_objective(tmp_path, capsys, case, form):
    """explain keeps the plan itself for a re-planned what-if where the plan beats the re-plan, judged by the rule the
    search minimises (constraints.objective_value), not by a cost per token of its own. Two cases where they differ,
    the re-plan being another real plan of the same inventory, priced by `hetauto simulate`:
    - every device free (owned hardware), --objective cost: both cost nothing, and the search's objective is then the
      time (docs/search.md); the cost-per-token rule called them equal and kept a re-plan on the A100s alone, slower;
    - --objective cost under --max-iteration-s: the cheapest plan, above the floor, against the plan within it; the
      search ranks any plan above the floor below every plan within it, the cost-per-token rule kept the cheaper.
    Every re-planned case where the plan still runs must be the plan itself, at its own simulated throughput there
    (`hetauto simulate --set`), whether the re-plan comes with its devices (as explain's searches give it) or not."""
    from hetauto_megatron.cost.analytic import AnalyticCostModel
    from hetauto_megatron.plan import sensitivity as S
    from hetauto_megatron.plan.plan import load_plan
    from hetauto_megatron.spec.inventory import load_inventory
    inv = tmp_path / "inv.yaml"
    inv.write_text(TWO_PRICED.replace("10.0", "0.0").replace("1.0}", "0.0}") if case == "free devices" else TWO_PRICED)
    plan = ["plan", "--model", "llama2-7b", "--inventory", str(inv), "--global-batch-size", "64", "--workers", "1",
            "--quiet"]
    base = plan + ["--objective", "cost"]
    tokens = 64 * 4096
    if case == "floor":
        cheapest = _json(capsys, *base, "-o", str(tmp_path / "other.yaml"), "--json")
        fastest = _json(capsys, *plan, "--json")
        floor = (tokens / cheapest["tokens_per_s"] * tokens / fastest["tokens_per_s"]) ** 0.5   # between the two
        assert main(base + ["--max-iteration-s", f"{floor:.3f}", "-o", str(tmp_path / "p.yaml")]) == 0
    else:
        assert main(base + ["-o", str(tmp_path / "p.yaml")]) == 0
        assert main(base + ["--exclude-clusters", "fast", "-o", str(tmp_path / "other.yaml")]) == 0
    capsys.readouterr()
    mine = _json(capsys, "simulate", "--plan", str(tmp_path / "p.yaml"), "--inventory", str(inv), "--json")
    other = _json(capsys, "simulate", "--plan", str(tmp_path / "other.yaml"), "--inventory", str(inv), "--json")
    # the case as built: the two rules disagree
    if case == "floor":
        assert tokens / other["tokens_per_s"] > float(f"{floor:.3f}") >= tokens / mine["tokens_per_s"]
        assert other["cost_per_million_tokens"] < mine["cost_per_million_tokens"]
    else:
        assert other["cost_per_million_tokens"] == mine["cost_per_million_tokens"] == 0
        assert other["tokens_per_s"] < mine["tokens_per_s"] * 0.99
    used: dict = {}
    for m in yaml.safe_load((tmp_path / "other.yaml").read_text())["meshes"]:
        used[m["cluster"]] = used.get(m["cluster"], 0) + m["tp"] * m["dp"] * len(m["stage_layers"])
    found = (other["tokens_per_s"], other["cost_per_million_tokens"])
    found += (used,) if form == "with its devices" else ()
    rows = S.sensitivity(load_plan(str(tmp_path / "p.yaml")), load_inventory(str(inv)), AnalyticCostModel(),
                         replan=lambda i: found)
    checked = 0
    for row in (r for r in rows if r["method"] == "re-planned"):
        assert row["base_tokens_per_s"] == pytest.approx(mine["tokens_per_s"], rel=1e-6), row
        for c in row["cases"]:
            if c["tokens_per_s"] is None:
                continue
            own = _json(capsys, "simulate", "--plan", str(tmp_path / "p.yaml"), "--inventory", str(inv), "--json",
                        "--set", f"{row['key']}={c['value']}")
            assert c["tokens_per_s"] == pytest.approx(own["tokens_per_s"], rel=1e-6), (row["what"], c)
            assert c.get("note") == "the plan itself: the re-plan found nothing better", (row["what"], c)
            checked += 1
    assert checked


@pytest.mark.parametrize("command", [["simulate", "--plan"], ["explain", "--no-search", "--plan"],
                                     ["compare"]])
def test_a_plan_that_set_shrinks_below_names_the_override(command, readme_plan, capsys):
    """The README's plan uses the 64 H800s; with --set cluster.h800.nodes=1 only 8 are left. The plan fitted its
    inventory, so the paragraph says that the override changed it, in every command that takes --set (explain and
    compare told the user to change the plan's TP or DP)."""
    plan, _ = readme_plan
    rc = main([*command, plan, "--set", "cluster.h800.nodes=1"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{plan}: field 'meshes'" in err and "which has 8" in err, err
    assert "as --set cluster.h800.nodes=1 changed it" in err and "change --set" in err, err
