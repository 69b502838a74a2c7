"""What the --json documents carry whatever the plan: keys that do not apply are null, never absent, and a plan
of several pipelines reports its cost per 1M tokens as a plan of one does (docs/explain.md)."""
import json
import os

from helpers import CPU_INVENTORY, ROOT, run_hetauto

from hetauto_megatron.plan.plan import load_plan

LLAMA = os.path.join(ROOT, "examples", "llama")
TWO_PIPELINES = os.path.join(LLAMA, "plans", "tiny-2pipelines-cpu.yaml")
TWO_PIPELINES_INVENTORY = os.path.join(LLAMA, "inventory-cpu-tiny-2clusters.yaml")


def run_json(*argv):
    r = run_hetauto(*argv, "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def test_plan_json_has_the_same_keys_priced_or_not(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(CPU_INVENTORY)
    args = ("plan", "--model", "tiny", "--inventory", str(inv), "--global-batch-size", "8", "--quiet")
    bare = run_json(*args)
    priced = run_json(*args, "--set", "cluster.cluster-a.price_per_device_hour=1",
                      "--set", "cluster.cluster-b.price_per_device_hour=1")
    assert set(bare) == set(priced), set(bare) ^ set(priced)
    # no price, no cost; nor an --explain report or a --from re-plan's moves where neither was asked for
    # and no reason why a learned model prices a device where the analytic model prices them all
    for key in ("cost_per_million_tokens", "explain", "moved", "kept_from_plan", "cost_model_why"):
        assert bare[key] is None, key
    assert priced["cost_per_million_tokens"] > 0
    plan = tmp_path / "plan.yaml"
    run_hetauto(*args, "-o", str(plan))
    sim = run_json("simulate", "--plan", str(plan))
    assert sim["cost_model_why"] is None and sim["cost_per_million_tokens"] is None


def test_explain_of_two_pipelines_gives_the_cost_per_token(tmp_path):
    prices = {"cluster-a": 1.5, "cluster-b": 4.0}
    sets = [a for name, p in prices.items() for a in ("--set", f"cluster.{name}.price_per_device_hour={p}")]
    rep = run_json("explain", "--plan", TWO_PIPELINES, "--inventory", TWO_PIPELINES_INVENTORY, "--no-search", *sets)
    plan = load_plan(TWO_PIPELINES)
    # by hand: the devices each cluster gives the plan, paid for an hour, over the tokens an hour trains
    per_hour = sum(prices[m.cluster] * m.tp * m.dp * len(m.stage_layers) for m in plan.meshes)
    tokens_per_hour = plan.global_batch_size * plan.model.seq_length / rep["iteration_time_s"] * 3600
    want = per_hour / tokens_per_hour * 1e6
    assert rep["shape"] == "pipelines" and rep["objective"] == "throughput"
    assert abs(rep["cost_per_million_tokens"] - want) <= 1e-9 * want, (rep["cost_per_million_tokens"], want)
    text = run_hetauto("explain", "--plan", TWO_PIPELINES, "--inventory", TWO_PIPELINES_INVENTORY, "--no-search",
                       *sets)
    assert text.returncode == 0, text.stderr
    assert f"tokens/s, {want:.4f} per 1M tokens" in text.stdout.splitlines()[0], text.stdout.splitlines()[0]
    # unpriced: the key is there, null
    assert run_json("explain", "--plan", TWO_PIPELINES, "--inventory", TWO_PIPELINES_INVENTORY,
                    "--no-search")["cost_per_million_tokens"] is None


def test_simulate_json_of_several_pipelines_has_their_keys_together(tmp_path):
    """`pipelines`, `replica_sync_s` and `exchange_roots` are present or absent together, as the plan's shape
    decides (docs/explain.md); before, `exchange_roots` was left out where no parameter had three or more holders
    (here each has two: one mesh per pipeline, DP 1)."""
    text = open(TWO_PIPELINES).read()
    text = text.replace("tp: 1, dp: 2, micro_batch_size: 2, recompute: none, stage_layers: [2, 6]",
                        "tp: 1, dp: 1, micro_batch_size: 2, recompute: none, stage_layers: [8]")
    text = text.replace("tp: 2, dp: 1, micro_batch_size: 2, recompute: none, stage_layers: [4, 4]",
                        "tp: 1, dp: 1, micro_batch_size: 2, recompute: none, stage_layers: [8]")
    plan = tmp_path / "two-holders.yaml"
    plan.write_text(text)
    sim = run_json("simulate", "--plan", str(plan), "--inventory", TWO_PIPELINES_INVENTORY)
    assert len(sim["pipelines"]) == 2 and sim["replica_sync_s"] > 0 and sim["exchange_roots"] == [], sim
    one = run_json("simulate", "--plan", os.path.join(LLAMA, "plans", "tiny-2clusters-cpu.yaml"),
                   "--inventory", TWO_PIPELINES_INVENTORY)
    assert not {"pipelines", "replica_sync_s", "exchange_roots"} & set(one), set(one)


def test_no_command_prints_nan_or_infinity_as_json():
    """Python's json writes NaN and Infinity, which no JSON parser reads: a learned model's overhead of 1.7e308 s
    printed Infinity from simulate and compare --json, a published table's micro-batch of 1000 from
    validate-cost-model --json. Every command's --json goes through outputs.json_text, which refuses a figure that
    is not finite naming where it sits (exit 2, and one JSON error object like every invalid input)."""
    import glob
    import re

    import pytest

    from hetauto_megatron.errors import InputError
    from hetauto_megatron.outputs import json_text
    with pytest.raises(InputError) as exc:
        json_text({"estimate": {"stages": [{"time_s": 1.0}, {"time_s": float("inf")}]}})
    assert exc.value.field == "estimate.stages[1].time_s", exc.value.message
    assert json.loads(json_text({"a": [1.5, None]})) == {"a": [1.5, None]}
    printed = [f"{os.path.basename(p)}: {line.strip()}" for p in glob.glob(os.path.join(ROOT, "hetauto_megatron",
                                                                                          "commands", "*.py"))
               for line in open(p) if re.search(r"print\(json\.dumps\(", line)]
    assert not printed, printed
