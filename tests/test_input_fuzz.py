"""Broken inputs never crash or hang the command line: a deterministic sample of scripts/fuzz_inputs.py's
mutations (every field of the example inventories, models and plans made the wrong type, negative, NaN,
infinite, huge, missing, unknown; whole files empty, binary, missing, a directory; bad --set values), each run
through the commands that read it, must exit 0, 2 or 3, print no traceback, end within the time limit and, on
exit 2, name the field or the file. Then one test per class of defect the fuzzing found, through the real CLI.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest
from helpers import ROOT, run_cli

from hetauto_megatron import cli

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_INV = os.path.join(REPO, "examples", "llama", "inventory-cpu-dryrun.yaml")
with open(CPU_INV) as _fh:
    CPU_INVENTORY = _fh.read()     # block style: the cases below edit single lines of it


def test_fuzzed_inputs_exit_cleanly(tmp_path):
    """The script in a process of its own: its children fork from a process that has not imported torch (forked
    from this one, which has, the same cases took twice as long), two cases at a time. DeepSpeed's parser imports
    torch: the script's full run covers 'emit deepspeed'."""
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "fuzz_inputs.py"), "--sample", "150",
                           "--no-deepspeed", "--jobs", "2", "--show", "3"], cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    assert " cases in " in proc.stdout and ": 0 findings" in proc.stdout, proc.stdout[-3000:]


def check_error(rc, err, *, field, words=(), fix=True):
    assert rc == 2, err
    assert "Traceback" not in err
    assert len([x for x in err.splitlines() if x.strip()]) == 1, err
    assert f"field '{field}'" in err, err
    assert "Fix: " in err or not fix, err
    for w in words:
        assert w in err, err


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---- NaN and infinity in files: they passed every `> 0` check and crashed deep in the planner ------------
NONFINITE_FILES = {
    "link-latency-nan": (CPU_INVENTORY.replace("latency_ms: 0.1", "latency_ms: .nan"), "links[0].latency_ms"),
    "intra-node-bandwidth-inf": (CPU_INVENTORY.replace("intra_node: {bandwidth_gbps: 80,",
                                                       "intra_node: {bandwidth_gbps: .inf,", 1),
                                 "clusters[0].intra_node.bandwidth_gbps"),
    "overheads-nan": (CPU_INVENTORY.replace("devices_per_node: 4", "devices_per_node: 4\n    overheads: "
                                            "{context_gib: .nan}", 1), "clusters[0].overheads.context_gib"),
    "node-gbps-inf": (CPU_INVENTORY.replace("devices_per_node: 4", "devices_per_node: 4\n    inter_node: "
                                            "{node_gbps: .inf}", 1), "clusters[0].inter_node.node_gbps"),
}


@pytest.mark.parametrize("case", sorted(NONFINITE_FILES))
def test_nonfinite_figures_in_an_inventory(case, tmp_path, capsys):
    text, field = NONFINITE_FILES[case]
    assert text != CPU_INVENTORY
    inv = write(tmp_path, "inv.yaml", text)
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8", "--quiet"],
                         capsys)
    check_error(rc, err, field=field, words=["finite number"])


def test_nonfinite_figure_in_a_measured_overheads_file(tmp_path, capsys):
    (tmp_path / "overheads-cpu.json").write_text(json.dumps({"device_type": "cpu", "fragmentation": float("nan")}))
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY.replace("devices_per_node: 4", "devices_per_node: 4\n"
                                                            "    overheads: overheads-cpu.json", 1))
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8", "--quiet"],
                         capsys)
    check_error(rc, err, field="fragmentation", words=["overheads-cpu.json", "finite number"])


def test_an_overheads_file_naming_its_device_by_an_alias_is_read():
    """A file whose device_type is an alias the inventory takes ("A100", "H100 SXM") was refused as measured on
    another device; one of another type still is."""
    import tempfile

    from hetauto_megatron.errors import InputError
    from hetauto_megatron.spec.devices import get_device
    from hetauto_megatron.spec.overheads import overhead_from_value
    with tempfile.TemporaryDirectory() as d:
        for alias, device, ok in (("A100", "a100", True), ("H100 SXM", "h100", True), ("a100", "h100", False)):
            path = os.path.join(d, "o.json")
            open(path, "w").write(json.dumps({"device_type": alias, "context_gib": 0.75}))
            dev = get_device(device)
            try:
                got = overhead_from_value(path, device=dev, file=None, field="clusters[0].overheads")
                assert ok and got.context_gib == 0.75, (alias, device)
            except InputError as exc:
                assert not ok and f"measured on a {get_device(alias).name}" in str(exc), (alias, str(exc))


# ---- --set: NaN/inf accepted, a connection faster than its link accepted ---------------------------------
@pytest.mark.parametrize("item, words", [
    ("link.site-a-site-b.bandwidth_gbps=nan", ["finite number"]),
    ("link.site-a-site-b.latency_ms=inf", ["finite number"]),
    ("cluster.site-a.memory_gib=nan", ["finite number"]),
    ("link.site-a-site-b.flow_gbps=1000", ["faster than the whole link"]),
])
def test_bad_set_values(item, words, capsys):
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet",
                          "--set", item], capsys)
    check_error(rc, err, field="--set", words=words)


def test_a_slower_link_and_its_connection_set_in_either_order(capsys):
    """A link's bandwidth below its connection's flow was refused at once, before the next --set lowered the flow:
    the order of two --set items decided whether a what-if ran. Checked once both are applied."""
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.spec.inventory import load_inventory
    from hetauto_megatron.spec.whatif import apply_overrides
    inv = load_inventory(os.path.join(ROOT, "examples", "peers", "inventory-cross-region.yaml"))
    slower, flow = "link.a100-v100.bandwidth_gbps=2", "link.a100-v100.flow_gbps=1"
    for items in ([slower, flow], [flow, slower]):
        link = apply_overrides(inv, items).link("a100", "v100")
        assert (link.bandwidth_gbps, link.flow_gbps) == (2, 1), items
    with pytest.raises(InputError, match="one connection \\(3.2 Gbit/s\\) would be faster"):
        apply_overrides(inv, [slower])


def test_set_link_key_read_two_ways_is_refused(tmp_path, capsys):
    """Clusters a-b, c, a and b-c: link.a-b-c is a-b to c or a to b-c; one of them was set silently."""
    clusters = "".join(f"  - {{name: {n}, device: cpu, nodes: 1, devices_per_node: 2}}\n"
                       for n in ("a-b", "c", "a", "b-c"))
    links = "".join(f"  - {{between: [{x}, {y}], bandwidth_gbps: 10, latency_ms: 0.1}}\n"
                    for x, y in (("a-b", "c"), ("a", "b-c"), ("a", "c")))
    inv = write(tmp_path, "inv.yaml", "clusters:\n" + clusters + "links:\n" + links)
    rc, _, err = run_cli(["simulate", "--model", "tiny", "--inventory", inv, "--tp", "1", "--pp", "1", "--dp", "2",
                          "--micro-batch-size", "1", "--global-batch-size", "8", "--set",
                          "link.a-b-c.bandwidth_gbps=1"], capsys)
    check_error(rc, err, field="--set", words=["'a-b' and 'c'", "'a' and 'b-c'"])
    rc, _, err = run_cli(["simulate", "--model", "tiny", "--inventory", inv, "--tp", "1", "--pp", "1", "--dp", "2",
                          "--micro-batch-size", "1", "--global-batch-size", "8", "--set",
                          "link.a-c.bandwidth_gbps=1"], capsys)
    assert rc == 0, err


# ---- numbers that hang the planner: a huge model or batch ran for ever --------------------------------------
def test_huge_model_and_batch_are_refused(tmp_path, capsys):
    model = write(tmp_path, "m.yaml", "preset: tiny\nnum_layers: 1000000000000000000000000000000\n")
    rc, _, err = run_cli(["simulate", "--model", model, "--inventory", CPU_INV, "--tp", "1", "--pp", "2", "--dp",
                          "1", "--micro-batch-size", "1", "--global-batch-size", "8"], capsys)
    check_error(rc, err, field="num_layers", words=["more than any transformer"])
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", str(10 ** 26),
                          "--quiet"], capsys)
    check_error(rc, err, field="--global-batch-size", words=["samples per iteration"])
    rc, _, err = run_cli(["simulate", "--model", "tiny", "--inventory", CPU_INV, "--plan",
                          os.path.join(REPO, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml"),
                          "--global-batch-size", "0"], capsys)
    check_error(rc, err, field="--global-batch-size")


@pytest.mark.parametrize("flag", [["--tp", "2"], ["--recompute", "full"], ["--cluster", "site-b"]])
def test_layout_flags_beside_a_plan_are_refused(flag, capsys):
    """--recompute and --cluster beside --plan were silently ignored (--tp was refused): each is refused,
    the message naming it and what may change with --plan."""
    plan = os.path.join(REPO, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")
    rc, _, err = run_cli(["simulate", "--model", "tiny", "--inventory", CPU_INV, "--plan", plan] + flag, capsys)
    check_error(rc, err, field="--plan", words=[flag[0], "--global-batch-size, --seq-length"])


def test_figure_beyond_any_hardware_is_refused(tmp_path, capsys):
    """memory_gib: 1e30 made the search run for ever (its memory arithmetic loses precision); a denormal
    bandwidth (1e-320 Gbit/s) passed as positive and crashed the pricing with a traceback."""
    for line, field, words in (("memory_gib: 1.0e+30", "clusters[0].memory_gib", "beyond any device"),
                               ("uplink_gbps: 1.0e-320", "clusters[0].uplink_gbps", "below any device")):
        inv = write(tmp_path, "inv.yaml", CPU_INVENTORY.replace("devices_per_node: 4", "devices_per_node: 4\n"
                                                                f"    {line}", 1))
        rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8", "--quiet"],
                             capsys)
        check_error(rc, err, field=field, words=[words])
    for value, words in (("1e12", "beyond any device"), ("1e-320", "below any device")):
        rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet",
                              "--set", f"link.site-a-site-b.bandwidth_gbps={value}"], capsys)
        check_error(rc, err, field="--set", words=[words])
    rc, _, err = run_cli(["simulate", "--model", "tiny", "--inventory", CPU_INV, "--tp", "1", "--pp", "1", "--dp", "1",
                          "--micro-batch-size", "1", "--global-batch-size", "8", "--cluster", "nowhere"], capsys)
    check_error(rc, err, field="--cluster", words=["site-a"])


def test_a_layout_megatron_cannot_shard_names_the_flag(capsys):
    """simulate's layout flags become a plan; its refusal names the flag the user typed, not the plan's field, with
    a fix in flags (there is no settings block to edit)."""
    inv = os.path.join(REPO, "examples", "llama", "inventory-2clusters.yaml")
    base = ["simulate", "--inventory", inv, "--pp", "1", "--dp", "4", "--micro-batch-size", "1",
            "--global-batch-size", "64", "--tp", "2"]
    rc, _, err = run_cli([*base, "--model", "llama2-7b", "--seq-length", "4097"], capsys)
    check_error(rc, err, field="--tp", words=["4097-token sequence", "a --seq-length that 2 divides"])
    assert "settings" not in err
    rc, _, err = run_cli([*base, "--model", "llama2-7b"], capsys)      # its 4,096 tokens split over TP 2
    assert rc == 0, err


def test_huge_mesh_is_refused(tmp_path, capsys):
    plan = write(tmp_path, "p.yaml", "version: 1\nmodel: {preset: tiny}\nglobal_batch_size: 8\nmeshes:\n"
                 "- {cluster: site-a, device_type: cpu, dp: 100000000000000000000, micro_batch_size: 1, "
                 "stage_layers: [8]}\n")
    rc, _, err = run_cli(["emit", "summary", "--plan", plan], capsys)
    check_error(rc, err, field="meshes[0].dp", words=["more than"])


def test_negative_position_table_is_refused(tmp_path, capsys):
    model = write(tmp_path, "m.yaml", "preset: tiny\nposition_embedding: learned\nmax_position_embeddings: -4\n")
    rc, _, err = run_cli(["plan", "--model", model, "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet"],
                         capsys)
    check_error(rc, err, field="max_position_embeddings")


# ---- a plan's stored inventory and estimate ------------------------------------------------------------------
def _written_plan(tmp_path, capsys) -> dict:
    path = str(tmp_path / "plan.yaml")
    assert cli.main(["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet",
                     "--shapes", "simple", "-o", path]) == 0      # (a plan every command takes)
    capsys.readouterr()
    import yaml
    with open(path) as fh:
        return yaml.safe_load(fh)


def test_broken_stored_inventory_is_named(tmp_path, capsys):
    import yaml
    data = _written_plan(tmp_path, capsys)
    data["inventory"]["clusters"][0]["memory_gib"] = float("inf")
    plan = write(tmp_path, "broken.yaml", yaml.safe_dump(data))
    rc, _, err = run_cli(["emit", "megatron", "--plan", plan], capsys)
    check_error(rc, err, field="inventory.clusters[0].memory_gib", words=["finite number"])
    data["inventory"]["clusters"] = 7
    plan = write(tmp_path, "broken2.yaml", yaml.safe_dump(data))
    rc, _, err = run_cli(["emit", "summary", "--plan", plan], capsys)
    check_error(rc, err, field="inventory.clusters", words=["must be a list"])


@pytest.mark.parametrize("key, value", [("send_next_depth", float("-inf")), ("send_next_depth", "two"),
                                        ("forward_s", float("nan")), ("send_next_latency_s", "x")])
def test_broken_stored_estimate_still_summarises(key, value, tmp_path, capsys):
    """The estimate is informational: a hand-edited one prints without its breakdown, never a traceback."""
    import yaml
    data = _written_plan(tmp_path, capsys)
    data["estimate"]["stages"][0][key] = value
    plan = write(tmp_path, "edited.yaml", yaml.safe_dump(data))
    rc, out, err = run_cli(["emit", "summary", "--plan", plan], capsys)
    assert rc == 0, err
    assert "plan: tiny" in out


@pytest.mark.parametrize("stages", [7, "x", {"a": 1}, [5], [[1, 2]]])
def test_stored_estimate_whose_stages_are_not_stage_rows_still_summarises(stages, tmp_path, capsys):
    """Found by the fuzzing: 'emit summary' read every stage row of the estimate as a mapping (AttributeError)."""
    import yaml
    data = _written_plan(tmp_path, capsys)
    data["estimate"]["stages"] = stages
    plan = write(tmp_path, "edited.yaml", yaml.safe_dump(data))
    rc, out, err = run_cli(["emit", "summary", "--plan", plan], capsys)
    assert rc == 0 and "Traceback" not in err, err
    assert "plan: tiny" in out


# ---- YAML alias bombs: a few hundred bytes of nested anchors load as 10^10 shared elements ---------------------
def _alias_bomb(levels: int) -> str:
    names = [chr(ord("a") + i) for i in range(levels)]
    rows = ['&a ["x","x","x","x","x","x","x","x","x","x"]'] + [
        f"&{n} [{','.join([f'*{p}'] * 10)}]" for p, n in zip(names, names[1:])]
    return "[" + ", ".join(rows) + "]"


def _bounded_run(code: str, tmp_path) -> subprocess.CompletedProcess:
    """Python `code` in a child limited to 4 GiB and 120 s: an unbounded walk of a bomb hits either and fails."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              cwd=str(tmp_path), preexec_fn=limit)
    except subprocess.TimeoutExpired:
        pytest.fail("did not end within 120 s")


def test_yaml_alias_bomb_is_refused_at_once(tmp_path):
    """A 10-level bomb in a model's name took minutes and tens of GB: its error message was built from the whole
    repr before being shortened. The loader refuses the expansion; a self-referring alias is refused too."""
    bomb = write(tmp_path, "bomb.yaml", f"name: {_alias_bomb(10)}\nnum_layers: 8\nhidden_size: 64\n"
                                         "num_attention_heads: 4\nvocab_size: 128\nseq_length: 32\n")
    loop = write(tmp_path, "loop.yaml", "name: &a [x, *a]\nnum_layers: 8\n")
    for model, words in ((bomb, ["aliases", "expand"]), (loop, ["alias", "contains it"])):
        res = _bounded_run("import sys; from hetauto_megatron import cli; sys.exit(cli.main(['plan', '--model', "
                           f"{model!r}, '--inventory', {CPU_INV!r}, '--global-batch-size', '8', '--quiet']))", tmp_path)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert model in res.stderr and "Fix: " in res.stderr and all(w in res.stderr for w in words), res.stderr


def test_messages_show_a_bounded_part_of_a_huge_value(tmp_path):
    """A value shared 10^10 times (what an alias bomb loads as) is shown in a message without walking all of it."""
    res = _bounded_run("from hetauto_megatron.spec._fields import get\n"
                       "v = ['x'] * 10\n"
                       "for _ in range(10): v = [v] * 10\n"
                       "try: get({'name': v}, 'name', str, file='m.yaml')\n"
                       "except Exception as e: print(e)\n", tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "field 'name': must be a string, got a list [[[" in res.stdout and len(res.stdout) < 400, res.stdout


# ---- files the commands write or read beside the inputs -----------------------------------------------------
def test_unwritable_output_is_refused_before_the_search(tmp_path, capsys):
    for target in (str(tmp_path / "no-such-dir" / "plan.yaml"), str(tmp_path)):
        rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8",
                              "--quiet", "-o", target], capsys)
        check_error(rc, err, field="-o")


def test_output_over_an_input_is_refused_before_the_search(tmp_path, capsys):
    """-o inv.yaml (or a --timeline, through a link too) silently overwrote the inventory the plan was made from."""
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY)
    os.symlink(inv, tmp_path / "link.yaml")
    base = ["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8", "--quiet"]
    for extra, flag in ((["-o", inv], "-o"), (["-o", str(tmp_path / "link.yaml")], "-o"),
                        (["--timeline", str(tmp_path / "p.json"), "-o", str(tmp_path / "p.json")], "--timeline")):
        rc, _, err = run_cli(base + extra, capsys)
        check_error(rc, err, field=flag, words=["overwrite"])
    assert (tmp_path / "inv.yaml").read_text() == CPU_INVENTORY
    plan = str(tmp_path / "p.yaml")
    assert run_cli(base + ["-o", plan], capsys)[0] == 0
    before = open(plan).read()
    rc, _, err = run_cli(base + ["--from", plan, "-o", plan], capsys)
    check_error(rc, err, field="-o", words=["--from", plan])
    trace = str(tmp_path / "t.json")
    model = write(tmp_path, "t.json", json.dumps({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                                  "vocab_size": 128, "seq_length": 32}))
    rc, _, err = run_cli(["simulate", "--model", model, "--inventory", inv, "--plan", plan, "--timeline", trace],
                         capsys)
    check_error(rc, err, field="--timeline", words=["--model"])
    assert open(plan).read() == before and "num_layers" in open(model).read()


def test_emitted_files_never_land_on_the_plan_or_an_input(tmp_path, capsys):
    """`plan -o out/summary.txt --emit out` wrote the plan and then the summary over it; `emit summary -o DIR`
    with the plan in DIR named summary.txt did the same: refused, before the plan is written (plan), or with the
    plan kept (emit)."""
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY)
    plan = str(tmp_path / "summary.txt")
    argv = ["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8", "--quiet", "--shapes", "simple",
            "-o", plan]
    rc, _, err = run_cli(argv + ["--emit", str(tmp_path)], capsys)
    check_error(rc, err, field="--emit", words=["-o", "overwrite"])
    assert not os.path.exists(plan)
    assert run_cli(argv, capsys)[0] == 0
    before = open(plan).read()
    assert before.lstrip().startswith(("#", "version")) or "meshes" in before
    rc, _, err = run_cli(["emit", "summary", "--plan", plan, "-o", str(tmp_path)], capsys)
    check_error(rc, err, field="-o", words=["--plan", "overwrite"])
    assert open(plan).read() == before
    # a --timeline named as an emitted file (a cluster's DeepSpeed config): the config was written and the
    # timeline then over it, both reported written; now refused before either, the earlier config kept
    out = tmp_path / "out"
    out.mkdir()
    base = ["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8", "--quiet", "--engine",
            "deepspeed", "-o", str(out / "p.yaml"), "--emit", str(out)]      # (one DP size: DeepSpeed configs written)
    assert run_cli(base, capsys)[0] == 0
    config = sorted(out.glob("ds_config.*.json"))[0]
    rc, _, err = run_cli(base + ["--timeline", str(config)], capsys)
    check_error(rc, err, field="--emit", words=["--timeline", "overwrite", "another folder"])
    assert "traceEvents" not in config.read_text() and "train_batch_size" in config.read_text()


def test_messages_say_what_the_path_is(tmp_path, capsys):
    """-o afile/p.yaml said "the folder 'afile' does not exist" though it exists as a file; a malformed .json plan
    was "not valid YAML"."""
    (tmp_path / "afile").write_text("x")
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet",
                          "-o", str(tmp_path / "afile" / "p.yaml")], capsys)
    check_error(rc, err, field="-o", words=["is a file, not a folder"])
    assert "does not exist" not in err
    plan = write(tmp_path, "p.json", '{"version": 4, "meshes": [1,\n')
    rc, _, err = run_cli(["emit", "summary", "--plan", plan], capsys)
    assert rc == 2 and "Traceback" not in err and f"{plan}: is not valid JSON at line 2" in err, err
    assert "YAML" not in err and "Fix: " in err


@pytest.mark.skipif(not os.path.isfile("/proc/version"), reason="needs Linux's /proc")
def test_output_the_system_refuses_is_named(tiny_cpu_model, tmp_path, capsys):
    """/proc passes every check made before the work (it exists, root may write to it) but takes no new files,
    and /proc/version refuses writes (EIO): each write's OSError was a traceback."""
    base = ["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet", "-o"]
    for target in ("/proc/hetauto-p.yaml", "/proc/version"):
        rc, _, err = run_cli(base + [target], capsys)
        check_error(rc, err, field="-o", words=[target, "cannot write"])
    # a folder that takes no new file is refused before the work (root passes os.access there): a dry run's
    # --timeline in /sys was refused only once the ranks had trained
    rc, _, err = run_cli(["dryrun", "--plan", os.path.join(ROOT, "examples", "llama", "plans", "cpu-small-tp2.yaml"),
                          "--tiny", "--steps", "1", "--timeline", "/sys/hetauto-t.json"], capsys)
    check_error(rc, err, field="--timeline", words=["/sys/hetauto-t.json", "takes no new file"])
    # ... while a file that is there is written in place, in a folder that takes no new one (/dev/fd)
    from helpers import run_hetauto     # (a process of its own: its stdout is the file written)
    r = run_hetauto("plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet",
                     "-o", "/dev/stdout")
    assert r.returncode == 0 and "version: 4" in r.stdout, r.stderr
    rc, _, err = run_cli(["profile", "--device-type", "cpu", "--grid", "tiny", "--out", "/proc/hetauto-zz"], capsys)
    check_error(rc, err, field="--out", words=["/proc/hetauto-zz"])
    profile, _ = tiny_cpu_model
    rc, _, err = run_cli(["fit", str(profile), "-o", "/proc/hetauto-zz", "--holdout", "0"], capsys)
    check_error(rc, err, field="-o", words=["/proc/hetauto-zz"])


def test_output_file_name_taken_by_a_directory(tiny_cpu_model, tmp_path, capsys):
    """A directory where emit, plan --emit or fit writes a file (site-a.sh, summary.txt, manifest.json, ...)."""
    plan = str(tmp_path / "p.yaml")
    base = ["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet", "--shapes",
            "simple"]
    assert run_cli(base + ["-o", plan], capsys)[0] == 0
    ds_plan = str(tmp_path / "ds.yaml")      # one DP size in every mesh: a plan DeepSpeed's emitter takes
    assert run_cli(base + ["--engine", "deepspeed", "-o", ds_plan], capsys)[0] == 0
    for target, name, path in (("megatron", "site-a.sh", plan), ("summary", "summary.txt", plan),
                               ("deepspeed", "ds_config.site-a.json", ds_plan)):
        out = tmp_path / f"out-{target}"
        (out / name).mkdir(parents=True)
        rc, _, err = run_cli(["emit", target, "--plan", path, "-o", str(out)], capsys)
        check_error(rc, err, field="-o", words=[name, "directory"])
    rc, _, err = run_cli(base + ["-o", str(tmp_path / "p2.yaml"), "--emit", str(tmp_path / "out-megatron")], capsys)
    check_error(rc, err, field="--emit", words=["site-a.sh"])
    (tmp_path / "fx" / "manifest.json").mkdir(parents=True)
    rc, _, err = run_cli(["fit", str(tiny_cpu_model[0]), "-o", str(tmp_path / "fx"), "--holdout", "0"], capsys)
    check_error(rc, err, field="-o", words=["manifest.json", "directory"])


def test_dryrun_timeout_must_be_a_number_of_seconds(capsys):
    plan = os.path.join(REPO, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")
    for value in ("nan", "inf", "-1"):
        rc, _, err = run_cli(["dryrun", "--plan", plan, "--timeout", value], capsys)
        check_error(rc, err, field="--timeout")


def test_dryrun_refuses_a_plan_its_inventory_cannot_hold_before_any_rank_starts(tmp_path, capsys):
    """A plan using more devices of a cluster than the inventory has was refused only after the whole run (--compare:
    12 s of 6 ranks, the measurements lost) or not at all (the plan's own stored inventory): now before any
    process starts, naming the inventory's file, and no timeline is written."""
    import time

    import yaml
    from helpers import cpu_inventory
    plan = os.path.join(REPO, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")
    small = write(tmp_path, "small.yaml", cpu_inventory(2, 2))
    picture = tmp_path / "t.png"
    t0 = time.perf_counter()
    rc, _, err = run_cli(["dryrun", "--plan", plan, "--tiny", "--timeline", str(picture), "--compare",
                          "--inventory", small], capsys)
    check_error(rc, err, field="meshes", words=["small.yaml", "cluster-a"])
    assert time.perf_counter() - t0 < 5 and not picture.exists()
    stored = yaml.safe_load(open(plan))
    stored["inventory"] = yaml.safe_load(cpu_inventory(2, 2))
    own = write(tmp_path, "own.yaml", yaml.safe_dump(stored, sort_keys=False))
    rc, _, err = run_cli(["dryrun", "--plan", own, "--tiny"], capsys)
    check_error(rc, err, field="meshes", words=["own.yaml", "cluster-a"])


def test_a_mesh_key_left_empty_is_refused_not_read_as_its_default(tmp_path, capsys):
    """`tp:` with no value (YAML's null) was read as TP 1, silently or with a sequence-parallel message."""
    import yaml
    plan = yaml.safe_load(open(os.path.join(REPO, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")))
    for key in ("tp", "dp", "recompute"):
        data = yaml.safe_load(yaml.safe_dump(plan))
        data["meshes"][0][key] = None
        bad = write(tmp_path, f"null-{key}.yaml", yaml.safe_dump(data, sort_keys=False))
        rc, _, err = run_cli(["emit", "summary", "--plan", bad], capsys)
        check_error(rc, err, field=f"meshes[0].{key}", words=["no value", f"null-{key}.yaml"])


def test_set_takes_a_price_of_zero_as_the_inventory_and_price_do():
    """docs/inputs.md: a price is a number >= 0 (devices one owns); the inventory and --price took 0, --set refused."""
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.spec.inventory import load_inventory
    from hetauto_megatron.spec.whatif import apply_overrides
    inv = load_inventory(os.path.join(REPO, "examples", "llama", "inventory-2clusters.yaml"))
    assert apply_overrides(inv, ["cluster.h800.price_per_device_hour=0"]).cluster("h800").price_per_device_hour == 0
    with pytest.raises(InputError):
        apply_overrides(inv, ["cluster.h800.price_per_device_hour=-1"])
    with pytest.raises(InputError):
        apply_overrides(inv, ["cluster.h800.nodes=0"])


def test_published_table_of_the_wrong_shape(tmp_path, capsys):
    table = write(tmp_path, "table.yaml", "source_x: 3\n")
    rc, _, err = run_cli(["validate-cost-model", "--published", table], capsys)
    check_error(rc, err, field="source_x", words=["list of rows"])
    garbage = tmp_path / "garbage.yaml"
    garbage.write_bytes(bytes(range(256)))
    rc, _, err = run_cli(["validate-cost-model", "--published", str(garbage)], capsys)
    assert rc == 2 and "Traceback" not in err and str(garbage) in err, err


# ---- a fitted cost model's manifest (hetauto fit writes it; an edited or truncated one is named) -------------
def _manifest() -> dict:
    from hetauto_megatron.cost import features as F
    from hetauto_megatron.cost.learned.samples import MODEL_FORMAT
    return {"format": MODEL_FORMAT, "feature_version": F.FEATURE_VERSION, "boosters": {},
            "calibration": {"a100-40gb|layer|fwd|0|16-bit": {"rate": 1.2, "overhead_s": 0.001},
                            "a100-40gb|layer|bwd|0|16-bit": {"rate": 1.1, "overhead_s": 0.0}},
            "devices": {"a100-40gb": {"name": "a100-40gb", "granularity": "layer", "dtype_bytes": 2,
                                      "peak_tflops": 312.0, "hbm_gbps": 1555.0, "rows": 10, "source": "sailor",
                                      "arithmetic": "16-bit"}}}


def _edit(doc, path, value):
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return doc


@pytest.mark.parametrize("path, value, field", [
    (("devices", "a100-40gb", "peak_tflops"), float("nan"), "devices.a100-40gb"),
    (("devices", "a100-40gb", "peak_tflops"), 1e300, "devices.a100-40gb"),     # beyond any device (the inventory's)
    (("devices", "a100-40gb", "hbm_gbps"), 1e-30, "devices.a100-40gb"),
    (("devices", "a100-40gb", "name"), {"a": 1}, "devices.a100-40gb"),
    (("devices", "a100-40gb", "extra"), 1, "devices.a100-40gb"),
    (("devices", "a100-40gb", "arithmetic"), "fp64", "devices.a100-40gb"),
    (("devices", "a100-40gb", "arithmetic"), "tf32", "devices.a100-40gb"),     # TF32 runs hold 4-byte elements
    (("devices", "a100-40gb"), [1, 2], "devices.a100-40gb"),
    (("calibration", "a100-40gb|layer|fwd|0|16-bit", "rate"), float("inf"), "calibration.a100-40gb|layer|fwd|0|16-bit"),
    (("calibration", "not-a-key"), {"rate": 1.0, "overhead_s": 0.0}, "calibration.not-a-key"),
    # a rate of 0 or below priced the work as free or negative: accepted
    (("calibration", "a100-40gb|layer|fwd|0|16-bit", "rate"), -2.0, "calibration.a100-40gb|layer|fwd|0|16-bit.rate"),
    (("calibration", "a100-40gb|layer|fwd|0|16-bit", "rate"), 0, "calibration.a100-40gb|layer|fwd|0|16-bit.rate"),
    (("score_bwd_weight",), float("inf"), "score_bwd_weight"),
    # figures no fit writes: an overhead of 1.7e308 s or -1 s crashed plan, explain and simulate --timeline
    # (ZeroDivisionError, TypeError) and printed Infinity or a negative pipeline time under --json; a rate of 1e300
    (("calibration", "a100-40gb|layer|fwd|0|16-bit", "overhead_s"), 1.7e308,
     "calibration.a100-40gb|layer|fwd|0|16-bit.overhead_s"),
    (("calibration", "a100-40gb|layer|fwd|0|16-bit", "overhead_s"), -1,
     "calibration.a100-40gb|layer|fwd|0|16-bit.overhead_s"),
    (("calibration", "a100-40gb|layer|fwd|0|16-bit", "rate"), 1e300, "calibration.a100-40gb|layer|fwd|0|16-bit.rate"),
    (("host_floor",), {"a100-40gb|fwd|tp1": 1e300}, "host_floor.a100-40gb|fwd|tp1"),
    (("tp_allreduce_bytes_per_s",), {"a100-40gb|tp2": 1e300}, "tp_allreduce_bytes_per_s"),
    (("gemm_bwd_weight",), 1e300, "gemm_bwd_weight"),
    (("boosters",), 3, "boosters"),
    (("boosters",), {"layer_fwd": 4}, "boosters"),
    (("boosters",), {"layer_fwd": "layer_fwd.txt"}, "boosters"),
    # an entry of another device's name, a booster file outside the model's directory: they were read
    (("devices", "a100-40gb", "name"), "h100-sxm", "devices.a100-40gb"),
    (("boosters",), {"layer_fwd": "/etc/passwd"}, "boosters.layer_fwd"),
    (("boosters",), {"layer_fwd": "../other/layer_fwd.txt"}, "boosters.layer_fwd"),
    # a calibration table emptied (a device then "not in the model, it covers: none"), a booster no fit writes
    (("calibration",), {}, "calibration"),
    (("boosters",), {"foo": "foo.txt"}, "boosters.foo"),
])
def test_garbled_cost_model_manifest(path, value, field, tmp_path, capsys):
    d = tmp_path / "model"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps(_manifest()))
    argv = ["simulate", "--model", "tiny", "--inventory", CPU_INV, "--tp", "1", "--pp", "2", "--dp", "1",
            "--micro-batch-size", "1", "--global-batch-size", "8", "--cost-model", str(d)]
    rc, _, err = run_cli(argv, capsys)
    assert rc == 0, err          # the hand-written manifest itself is a valid (tiny) model
    if path == ("boosters",) and isinstance(value, dict) and value.get("layer_fwd") == "layer_fwd.txt":
        (d / "layer_fwd.txt").write_bytes(bytes(range(256)))      # a booster file that is not LightGBM's
    (d / "manifest.json").write_text(json.dumps(_edit(_manifest(), path, value)))
    rc, _, err = run_cli(argv, capsys)
    check_error(rc, err, field=field, words=["manifest.json" if field != "boosters" or "txt" not in str(value)
                                             else "LightGBM"])


def test_cost_model_manifest_without_its_devices_table_is_refused(tmp_path, capsys):
    """A manifest without `devices` (which every fit writes) was read as covering no device: every device then
    fell back to the analytic model without a word."""
    d = tmp_path / "model"
    d.mkdir()
    doc = _manifest()
    del doc["devices"]
    (d / "manifest.json").write_text(json.dumps(doc))
    rc, _, err = run_cli(["simulate", "--model", "tiny", "--inventory", CPU_INV, "--tp", "1", "--pp", "2", "--dp",
                          "1", "--micro-batch-size", "1", "--global-batch-size", "8", "--cost-model", str(d)], capsys)
    check_error(rc, err, field="devices", words=["manifest.json"])


def test_a_json_document_given_as_a_profile_is_named_so(tmp_path, capsys):
    """Sailor's packaged profiles (one JSON document) or a model's manifest given to `fit` as a profile: the message
    said its first line "is not JSON ... (a cut-off last line can be deleted)", of a valid JSON file."""
    doc = tmp_path / "profiles.json"
    doc.write_text(json.dumps({"LLAMA-3-8": {"A100-40": {"2": [0.1, 0.2]}}}, indent=2))
    rc, _, err = run_cli(["fit", str(doc), "-o", str(tmp_path / "model")], capsys)
    check_error(rc, err, field="format", words=["is one JSON document, not a profile", "--sailor"])
    assert "cut-off" not in err, err


@pytest.mark.parametrize("search, field", [(7, "estimate.search"),
                                           ({"constraints": {"tp": "eight"}}, "estimate.search.constraints.tp"),
                                           ({"objective": "speed"}, "estimate.search.objective"),
                                           ({"constraints": {"max_devices": "all"}},
                                            "estimate.search.constraints.max_devices")])
def test_garbled_search_record_is_named_by_explain(search, field, tmp_path, capsys):
    import yaml
    data = _written_plan(tmp_path, capsys)
    data["estimate"]["search"] = search
    plan = write(tmp_path, "edited.yaml", yaml.safe_dump(data))
    rc, _, err = run_cli(["explain", "--plan", plan, "--runners-up", "1"], capsys)
    check_error(rc, err, field=field, words=[plan])


# ---- the launch environment the --hetauto hook reads on every torchrun worker ----------------------------------
@pytest.mark.parametrize("name, value", [("HETAUTO_TIMEOUT_S", "nan"), ("HETAUTO_TIMEOUT_S", "inf"),
                                         ("HETAUTO_TIMEOUT_S", "1e12"),   # torch's deadlines overflow
                                         ("HETAUTO_MASTER_PORT", "http"), ("HETAUTO_MASTER_PORT", "70000"),
                                         ("HETAUTO_MASTER_PORT", "2\u00b2")])     # a digit int() does not read
def test_launch_environment_figures(name, value, monkeypatch):
    """Read before the process groups are made: a NaN timeout or a port that is not one stopped every rank with a
    bare ValueError/OverflowError inside torch; now one InputError (the hook's excepthook prints it, exit 2)."""
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.megatron import timeouts, world_store
    monkeypatch.setenv(name, value)
    with pytest.raises(InputError) as exc:
        timeouts.env_timeout_s() if name == "HETAUTO_TIMEOUT_S" else world_store.master_port()
    assert exc.value.field == name and "Fix: " in exc.value.message


@pytest.mark.parametrize("argv, field", [
    (["compare", "PLAN", "--inventory", CPU_INV, "--price", "site-a=inf"], "--price"),
    (["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--budget-s", "nan"],
     "--budget-s"),
    (["probe-link", "--timeout", "inf"], "--timeout"),
    (["probe-link", "--timeout", "1e12"], "--timeout"),    # was an OverflowError traceback in Python's poll
])
def test_nonfinite_command_line_figures(argv, field, tmp_path, capsys):
    _written_plan(tmp_path, capsys)
    argv = [str(tmp_path / "plan.yaml") if a == "PLAN" else a for a in argv]
    rc, _, err = run_cli(argv, capsys)
    check_error(rc, err, field=field, fix=argv[0] != "probe-link")


@pytest.mark.parametrize("argv, field", [
    # characters str.isdigit() takes and int() refuses: each was a ValueError traceback
    (["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--tp", "site-a=\u00b2"], "--tp"),
    (["probe-link", "--rank", "1", "--master", "127.0.0.1:\u00b2"], "--master"),
    # a count beyond a long long: a traceback on both sides once they had connected
    (["probe-link", "--local", "--iters", "99999999999999999999"], "--iters"),
    # 100,000 threads crashed the process (exit 139, no word) and left a profile header that asked for them again
    (["profile", "--device-type", "cpu", "--threads", "100000", "--out", "OUT"], "--threads"),
])
def test_figures_the_commands_cannot_hold(argv, field, tmp_path, capsys):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    rc, _, err = run_cli(argv, capsys)
    check_error(rc, err, field=field)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="a system without /dev/zero")
@pytest.mark.parametrize("where", ["model", "overheads"])
def test_an_input_without_an_end_is_refused(where, tmp_path, capsys):
    """A path to a device that never ends (or a multi-gigabyte file): the whole of it was read into memory, 2.8 GB
    in 5 s and on."""
    inv = CPU_INV
    if where == "overheads":
        inv = tmp_path / "inv.yaml"
        inv.write_text(CPU_INVENTORY.replace("    device: cpu\n", "    device: cpu\n    overheads: /dev/zero\n", 1))
    rc, _, err = run_cli(["plan", "--model", "/dev/zero" if where == "model" else "tiny", "--inventory", str(inv),
                          "--global-batch-size", "8"], capsys)
    assert rc == 2 and "Traceback" not in err and "/dev/zero" in err and "larger than 64 MiB" in err, err


def test_an_abbreviated_json_flag_gets_the_json_error(capsys):
    """argparse takes --jso for --json; a parser refusal then printed no JSON object, where --json gets one."""
    with pytest.raises(SystemExit):
        cli.main(["plan", "--model", "tiny", "--jso", "--inventory", CPU_INV, "--global-batch-size", "x"])
    out, _ = capsys.readouterr()
    assert json.loads(out)["error"]["field"] == "--global-batch-size", out


def test_a_cluster_list_that_names_none_is_refused(capsys):
    """--use-clusters ',' (or an empty shell variable) ran as if the flag were not there: every cluster."""
    with pytest.raises(SystemExit) as exc:     # the parser's refusal, as for any malformed flag
        cli.main(["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8",
                  "--use-clusters", ",", "--json"])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and "Traceback" not in err
    assert json.loads(out)["error"]["field"] == "--use-clusters" and "names no cluster" in err, (out, err)
    # an empty list of clusters to leave out leaves none out
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8",
                          "--exclude-clusters", "", "--quiet"], capsys)
    assert rc == 0, err


def test_a_json_plan_is_read_as_json(tmp_path, capsys):
    """A .json plan indented with tabs (jq --tab) was refused as invalid (the YAML parser reads JSON but not its
    tabs); a missing value was "field 'model' is missing" and a trailing comma passed: a JSON file is read as JSON."""
    from hetauto_megatron.plan.plan import load_plan
    from hetauto_megatron.plan.plan_file import plan_to_dict

    tabbed = write(tmp_path, "tabs.json", json.dumps(plan_to_dict(load_plan(os.path.join(
        REPO, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml"))), indent="\t"))
    rc, out, err = run_cli(["emit", "summary", "--plan", tabbed], capsys)
    assert rc == 0, err
    for name, text, where in [("missing.json", '{"version": 4,\n "model": }', "line 2"),
                              ("comma.json", '{"version": 4,\n "meshes": [],\n}', "line 3")]:
        rc, _, err = run_cli(["emit", "summary", "--plan", write(tmp_path, name, text)], capsys)
        assert rc == 2 and "is not valid JSON at " + where in err and "Traceback" not in err, err


@pytest.mark.parametrize("edit, named", [({"precision": "fp32"}, "precision"),
                                         ({"settings": {"distributed_optimizer": False}}, "meshes[*].settings")])
def test_a_version_1_plan_with_version_2_keys_is_refused(tmp_path, capsys, edit, named):
    """docs/plan-format.md: version 1 has no `precision` and no per-mesh `settings`; such a file was read with them
    (fp32, or another optimizer: other prices than the file's version means) where version-3 keys are refused."""
    import yaml

    data = yaml.safe_load(open(os.path.join(REPO, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")))
    data["version"] = 1
    if "precision" in edit:
        data.update(edit)
    else:
        data["meshes"][0].update(edit)
    rc, _, err = run_cli(["emit", "summary", "--plan", write(tmp_path, "v1.yaml", yaml.safe_dump(data))], capsys)
    assert rc == 2 and "field 'version'" in err and named in err and "Traceback" not in err, err


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("edit, named", [({"pipelines": [{"samples": 8}]}, "pipelines"),
                                         ({"pipeline": 0}, "meshes[*].pipeline"),
                                         ({"alongside": False}, "meshes[*].alongside")])
def test_a_version_1_or_2_plan_with_version_3_keys_is_refused_also_at_their_defaults(tmp_path, capsys, version,
                                                                                      edit, named):
    """docs/plan-format.md refuses version 1 or 2 with any version-3 key; a key at its default value (one pipeline
    of the whole batch, pipeline 0, not alongside) was read without a word."""
    import yaml

    data = yaml.safe_load(open(os.path.join(REPO, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")))
    data["version"] = version
    data.pop("precision", None)
    for m in data["meshes"]:
        m.pop("settings", None)
    assert data["global_batch_size"] == 8
    if "pipelines" in edit:
        data.update(edit)
    else:
        data["meshes"][0].update(edit)
    rc, _, err = run_cli(["emit", "summary", "--plan", write(tmp_path, "old.yaml", yaml.safe_dump(data))], capsys)
    assert rc == 2 and "field 'version'" in err and named in err and "write version: 3" in err, err


def test_a_batch_whose_schedule_no_simulation_holds_is_refused(tmp_path, capsys):
    """200 one-layer stages and a million micro-batches (a typo in the batch): simulate took gigabytes and ended in
    a MemoryError traceback; now exit 2 naming global_batch_size, before any simulation."""
    import yaml

    data = {"version": 4, "model": {"name": "deep", "num_layers": 200, "hidden_size": 64, "num_attention_heads": 4,
                                    "ffn_hidden_size": 256, "vocab_size": 128, "seq_length": 32},
            "global_batch_size": 1_000_000,
            "meshes": [{"cluster": "a", "device_type": "cpu", "micro_batch_size": 1, "stage_layers": [1] * 200}]}
    plan = write(tmp_path, "huge.yaml", yaml.safe_dump(data))
    rc, _, err = run_cli(["emit", "summary", "--plan", plan], capsys)
    assert rc == 2 and "field 'global_batch_size'" in err and "200,000,000 operations" in err, err


def test_a_setting_given_twice_is_refused(capsys):
    """link.a-b and link.b-a are the same link: with both given, the last one counted silently (7,161 or 83,502
    tokens/s on the README's plan, by the order of the flags)."""
    for items in (["link.site-a-site-b.bandwidth_gbps=1", "link.site-b-site-a.bandwidth_gbps=100"],
                  ["cluster.site-a.memory_gib=10", "cluster.site-a.memory_gib=12"]):
        argv = ["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet"]
        for item in items:
            argv += ["--set", item]
        rc, _, err = run_cli(argv, capsys)
        check_error(rc, err, field="--set", words=[items[0], items[1], "set the same thing"])


def test_a_what_if_sequence_the_tp_degrees_do_not_divide_names_the_flag(readme_plan, capsys):
    """simulate --plan P --seq-length 4098 named the plan's meshes[0].settings.sequence_parallel and told the user
    to edit the plan; the flag is what changed, and a multiple of every mesh's tp is what suits the plan."""
    import math

    from hetauto_megatron.plan.plan import load_plan
    step = math.lcm(*(m.tp for m in load_plan(readme_plan[0]).meshes))
    assert step > 1
    rc, _, err = run_cli(["simulate", "--plan", readme_plan[0], "--seq-length", str(4096 + step // 2)], capsys)
    check_error(rc, err, field="--seq-length", words=[f"give a multiple of {step}"])


# ---- figures far beyond any machine, unquoted numeric aliases, a documented vocabulary at the limit ----------
def test_a_node_count_beyond_any_machine_is_named(tmp_path, capsys):
    """`nodes: <400 digits>` in the file (--set already refused 1e11) raised OverflowError in the search's bounds."""
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY.replace("nodes: 1", "nodes: " + "9" * 400, 1))
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8"], capsys)
    check_error(rc, err, field="clusters[0].nodes", words=[inv])
    assert "9" * 40 not in err


def test_an_overhead_beyond_any_measurement_is_named(tmp_path, capsys):
    """`overheads: {fragmentation: 1e300}` ended in exit 3 with a 300-digit GiB figure."""
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY.replace("devices_per_node: 4", "devices_per_node: 4\n    "
                                                            "overheads: {fragmentation: 1.0e+300}", 1))
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8"], capsys)
    check_error(rc, err, field="clusters[0].overheads.fragmentation", words=[inv])


def test_an_unquoted_numeric_device_alias_is_read(tmp_path, capsys):
    """`device: 3090` is a documented alias; YAML reads it as an integer, which was refused ("must be a string")."""
    text = CPU_INVENTORY.replace("device: cpu", "device: 3090", 1)
    rc, out, err = run_cli(["simulate", "--model", "tiny", "--inventory", write(tmp_path, "inv.yaml", text), "--tp",
                            "1", "--pp", "1", "--dp", "1", "--micro-batch-size", "1", "--global-batch-size", "8",
                            "--json"], capsys)
    assert rc == 0, err
    assert json.loads(out)["stages"][0]["device_type"] == "rtx-3090"


def test_a_vocabulary_at_the_documented_limit_plans(tmp_path, capsys):
    """vocab_size 10,000,000 (the most a model file may say) pads to 10,000,128 for Megatron's table: the search
    rebuilt the model with the padded size, which the same limit refused mid-search, naming no file."""
    model = write(tmp_path, "model.yaml", "preset: tiny\nvocab_size: 10000000\n")
    rc, out, err = run_cli(["plan", "--model", model, "--inventory", CPU_INV, "--global-batch-size", "8", "--json",
                            "--quiet"], capsys)
    assert rc == 0 and "Traceback" not in err, err
    assert json.loads(out)["tokens_per_s"] > 0


def test_a_link_latency_beyond_any_network_is_named(tmp_path, capsys):
    """`latency_ms: 1e300` was taken: simulate printed a table hundreds of characters wide and --json 4e304 s."""
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY.replace("latency_ms: 0.1", "latency_ms: 1.0e+300"))
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8"], capsys)
    check_error(rc, err, field="links[0].latency_ms", words=[inv, "ms"])
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--set",
                          "link.site-a-site-b.latency_ms=1e8"], capsys)
    assert rc == 2 and "latency_ms" in err and "Traceback" not in err, err


def test_a_wrapped_model_file_with_another_top_level_key_names_that_key(tmp_path, capsys):
    """A model under 'model:' with a stray key beside it was told "unknown key(s) extra, model": the wrapper
    itself named unknown. A plan file given as --model is still named as a plan file."""
    model = write(tmp_path, "model.yaml", "model:\n  preset: tiny\nextra: 1\n")
    rc, _, err = run_cli(["plan", "--model", model, "--inventory", CPU_INV, "--global-batch-size", "8"], capsys)
    check_error(rc, err, field="extra", words=[model, "'model:'"])
    plan = os.path.join(REPO, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")
    rc, _, err = run_cli(["plan", "--model", plan, "--inventory", CPU_INV, "--global-batch-size", "8"], capsys)
    assert rc == 2 and "it looks like a plan file" in err, err


def test_a_garbled_search_record_is_a_paragraph_for_plan_from(tmp_path, capsys):
    """`plan --from OLD` reads how OLD was searched (estimate.search); hand-edited into a list, or its `shapes` into
    a string, it was an AttributeError traceback. Now exit 2 naming the field."""
    import yaml
    plan = str(tmp_path / "p.yaml")
    base = ["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet"]
    assert run_cli(base + ["-o", plan], capsys)[0] == 0
    good = yaml.safe_load(open(plan))
    for field, garble in (("estimate.search", lambda s: [1]),
                          ("estimate.search.shapes", lambda s: {**s, "shapes": "x"})):
        bad = {**good, "estimate": {**good["estimate"], "search": garble(good["estimate"]["search"])}}
        old = write(tmp_path, "old.yaml", yaml.safe_dump(bad))
        rc, _, err = run_cli(base + ["--from", old, "-o", str(tmp_path / "new.yaml")], capsys)
        check_error(rc, err, field=field, words=["old.yaml"])


def test_emit_summary_refuses_the_cluster_it_would_not_read(capsys):
    """`emit summary --cluster NAME` checked NAME and then printed every cluster's stages, as without it; like
    --script or --plan-path, a flag the summary does not read is refused."""
    plan = os.path.join(os.path.dirname(__file__), "..", "examples", "llama", "plans", "llama2-70b-736.yaml")
    rc, _, err = run_cli(["emit", "summary", "--plan", plan, "--cluster", "ascend"], capsys)
    check_error(rc, err, field="--cluster", words=["summary"])
    assert run_cli(["emit", "megatron", "--plan", plan, "--cluster", "ascend"], capsys)[0] == 0


def test_an_option_the_parser_refuses_is_a_json_error_under_json(capsys):
    """`--json` promises one object on stdout; a value of the wrong type (argparse's own error) printed nothing
    there, and its message no fix."""
    for argv, field in ((["plan", "--model", "tiny", "--inventory", CPU_INV, "--json", "--seq-length", "abc"],
                         "--seq-length"),
                        (["explain", "--plan", "p.yaml", "--json", "--runners-up", "x"], "--runners-up")):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        out, err = capsys.readouterr()
        assert exc.value.code == 2 and "Fix: " in err and "Traceback" not in err, err
        error = json.loads(out)["error"]
        assert error["exit_code"] == 2 and error["field"] == field and "invalid" in error["reason"], error
    with pytest.raises(SystemExit):     # an unknown option is the field too (it was null)
        cli.main(["simulate", "--plan", "p.yaml", "--json", "--bogus", "3"])
    assert json.loads(capsys.readouterr().out)["error"]["field"] == "--bogus"
    with pytest.raises(SystemExit):
        cli.main(["plan", "--model", "tiny", "--inventory", CPU_INV, "--seq-length", "abc"])
    assert capsys.readouterr().out == ""        # without --json nothing on stdout


def test_a_hand_edited_estimate_of_no_prediction_is_not_summarised(tmp_path, capsys):
    """`emit summary` printed an estimate edited to NaN, infinity or -1 s as the plan's ("iteration nan s",
    "-1.000 s" with its bottleneck at 0 %), and --json wrote NaN, which strict JSON readers refuse."""
    import yaml
    plan = str(tmp_path / "p.yaml")
    assert run_cli(["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet",
                    "--shapes", "simple", "-o", plan], capsys)[0] == 0
    good = yaml.safe_load(open(plan))
    for value in (float("nan"), float("inf"), -1.0):
        bad = write(tmp_path, "bad.yaml", yaml.safe_dump({**good, "estimate": {**good["estimate"],
                                                                              "iteration_time_s": value}}))
        rc, out, err = run_cli(["emit", "summary", "--plan", bad], capsys)
        assert rc == 0 and "no prediction gives" in err and "nan" not in out and "-1.000" not in out, out
        rc, out, _ = run_cli(["emit", "summary", "--plan", bad, "--json"], capsys)
        doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
        assert rc == 0 and doc["estimate"] is None


def test_a_recorded_constraint_that_cannot_hold_names_the_plans_record(tmp_path, capsys):
    """`plan --from OLD` keeps the constraints OLD records; one edited into something impossible (recompute bogus,
    TP 3 on 2 devices per node) was refused naming --recompute or --tp, flags the user did not give, and no file."""
    import yaml
    plan = str(tmp_path / "p.yaml")
    base = ["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet"]
    assert run_cli(base + ["-o", plan], capsys)[0] == 0
    good = yaml.safe_load(open(plan))
    cluster = good["meshes"][0]["cluster"]
    for constraint, flag in (({"recompute": {cluster: "bogus"}}, "--recompute"), ({"tp": {cluster: 3}}, "--tp")):
        search = {**good["estimate"]["search"], "constraints": constraint}
        old = write(tmp_path, "old.yaml", yaml.safe_dump({**good, "estimate": {**good["estimate"], "search": search}}))
        rc, _, err = run_cli(base + ["--from", old, "-o", str(tmp_path / "new.yaml")], capsys)
        check_error(rc, err, field="estimate.search", words=["old.yaml", f"as {flag}", f"give {flag}"])


def test_a_boundary_or_settings_block_of_another_kind_is_refused(tmp_path, capsys):
    """`boundary: false` (or []) was read as no block, a blocking boundary, where `boundary: overlapped` is refused
    as not a mapping; so was `settings: false`. Only null means no block."""
    import yaml
    plan = str(tmp_path / "p.yaml")
    assert run_cli(["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--quiet",
                    "--shapes", "simple", "-o", plan], capsys)[0] == 0
    good = yaml.safe_load(open(plan))
    for key, value in (("boundary", False), ("boundary", []), ("settings", False)):
        meshes = [{**good["meshes"][0], key: value}] + good["meshes"][1:]
        bad = write(tmp_path, "bad.yaml", yaml.safe_dump({**good, "meshes": meshes}))
        rc, _, err = run_cli(["simulate", "--plan", bad], capsys)
        assert rc == 2 and f"expected a mapping (key: value pairs) for meshes[0].{key}" in err and "Fix: " in err, err
    meshes = [{**good["meshes"][0], "boundary": None}] + good["meshes"][1:]
    assert run_cli(["simulate", "--plan", write(tmp_path, "ok.yaml", yaml.safe_dump({**good, "meshes": meshes}))],
                   capsys)[0] == 0


def test_a_number_with_a_leading_zero_is_refused_not_read_as_octal(tmp_path, capsys):
    """YAML 1.1 reads 01000 as octal: `global_batch_size: 01000` planned a batch of 512 without a word (and
    `nodes: 010` 8 nodes); a name written so (cluster 007) stays the text it is."""
    inv = write(tmp_path, "inv.yaml", CPU_INVENTORY.replace("nodes: 1", "nodes: 01", 1))
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8", "--quiet"],
                         capsys)
    assert rc == 2 and "starts with a 0, which YAML reads as octal" in err and "Fix: write 1 " in err, err


def test_inventory_messages_name_what_was_written(tmp_path, capsys):
    """An unknown key under inter_node listed the known keys without node_gbps; a link `between: [a, null]` named a
    cluster 'None'."""
    inv = write(tmp_path, "inv.yaml", "clusters:\n  - {name: a, device: a100, nodes: 1, devices_per_node: 8, "
                                      "inter_node: {bandwidth_gbps: 100, foo: 1}}\n")
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8"], capsys)
    check_error(rc, err, field="clusters[0].inter_node", words=["node_gbps"])
    inv = write(tmp_path, "inv.yaml", "clusters:\n  - {name: a, device: a100, nodes: 1, devices_per_node: 8}\n"
                                      "  - {name: b, device: a100, nodes: 1, devices_per_node: 8}\n"
                                      "links:\n  - {between: [a, null], bandwidth_gbps: 10}\n")
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8"], capsys)
    check_error(rc, err, field="links[0].between", words=["empty entry"])
    assert "'None'" not in err


def test_every_emit_target_refuses_a_layout_no_launch_starts(tmp_path, capsys):
    """A plan edited to a TP group across two nodes, a launch that is not whole nodes, or clusters next to each
    other without a link in the plan's inventory: simulate and `emit megatron` refused them, `emit deepspeed` and
    `emit summary` wrote a config and a summary. And `compare` of a plan whose device memory rounds to 0 GiB divided
    by it (ZeroDivisionError)."""
    import yaml
    inv = os.path.join(os.path.dirname(__file__), "..", "examples", "llama", "inventory-2clusters.yaml")
    plan = str(tmp_path / "p.yaml")
    assert run_cli(["plan", "--model", "llama2-70b", "--inventory", inv, "--shapes", "simple", "--quiet", "-o", plan],
                   capsys)[0] == 0
    good = yaml.safe_load(open(plan))
    assert len({m["cluster"] for m in good["meshes"]}) == 2      # one pipeline across both clusters
    first = good["meshes"][0]
    cases = [({**good, "meshes": [{**first, "tp": 16}] + good["meshes"][1:]}, "meshes[0]"),
             ({**good, "inventory": {**good["inventory"], "clusters": [
                 {**c, "devices_per_node": 6, "nodes": 100} if c["name"] == first["cluster"] else c
                 for c in good["inventory"]["clusters"]]}}, "meshes[0]"),
             ({**good, "inventory": {**good["inventory"], "links": []}}, "inventory.links")]
    for bad, field in cases:
        path = write(tmp_path, "bad.yaml", yaml.safe_dump(bad))
        for target in ("deepspeed", "summary", "megatron"):
            rc, _, err = run_cli(["emit", target, "--plan", path, "-o", str(tmp_path / "out")], capsys)
            assert rc == 2 and f"field '{field}" in err and "Fix: " in err, (target, err)
        for argv in (["simulate"], ["explain", "--no-search"], ["compare"]):     # named 'links' of the plan file
            rc, _, err = run_cli(argv[:1] + (["--plan"] if argv[0] != "compare" else []) + [path] + argv[1:], capsys)
            assert rc == 2 and f"field '{field}" in err and "Fix: " in err, (argv, err)
    rc, out, _ = run_cli(["compare", plan, "--set", f"cluster.{first['cluster']}.memory_gib=0.004", "--json"], capsys)
    assert rc == 0 and json.loads(out, parse_constant=lambda c: pytest.fail(c))["plans"][0]["fits"] is False


def test_a_timeline_too_large_to_draw_is_refused_before_anything_is_written(tmp_path, capsys):
    """A million micro-batches: the plan alone takes a fraction of a second, its timeline took gigabytes and ended in
    a MemoryError traceback (plan/timeline.py MAX_TIMELINE_OPERATIONS)."""
    plan = os.path.join(ROOT, "examples", "llama", "plans", "cpu-small-pp2.yaml")
    inv = os.path.join(ROOT, "examples", "llama", "inventory-cpu-dryrun.yaml")
    picture = tmp_path / "t.png"
    rc, out, err = run_cli(["simulate", "--plan", plan, "--inventory", inv, "--global-batch-size", "1000000",
                            "--timeline", str(picture)], capsys)
    assert rc == 2 and "field '--timeline'" in err and "2,000,000 forwards and backwards" in err, err
    written = tmp_path / "p.yaml"
    rc, out, err = run_cli(["plan", "--model", "tiny", "--inventory", os.path.join(
        ROOT, "examples", "llama", "inventory-cpu-tiny-2clusters.yaml"), "--global-batch-size", "1000000",
        "--micro-batch-size", "1", "--quiet", "-o", str(written), "--timeline", str(picture)], capsys)
    assert rc == 2 and "field '--timeline'" in err, err
    assert not picture.exists() and not written.exists()
    # a plan's own size draws
    rc, out, err = run_cli(["simulate", "--plan", plan, "--inventory", inv, "--timeline", str(picture)], capsys)
    assert rc == 0 and picture.exists(), err


def test_clusters_named_alike_but_for_case_are_refused_with_the_inventory(tmp_path, capsys):
    """Clusters `a` and `A` planned (a whole search), and `-o plan.yaml --emit DIR` then blamed the plan file's
    meshes[1].cluster, a file never written: their launch scripts a.sh and A.sh are one file on macOS and Windows."""
    inv = tmp_path / "inv.yaml"
    inv.write_text("clusters:\n"
                   "  - {name: a, device: cpu, nodes: 1, devices_per_node: 2}\n"
                   "  - {name: A, device: cpu, nodes: 1, devices_per_node: 2}\n"
                   "links:\n  - {between: [a, A], bandwidth_gbps: 10, latency_ms: 1}\n")
    out = tmp_path / "p.yaml"
    rc, _, err = run_cli(["plan", "--model", "tiny", "--inventory", str(inv), "--quiet", "-o", str(out),
                          "--emit", str(tmp_path / "em")], capsys)
    assert rc == 2 and str(inv) in err and "'clusters[1].name'" in err and "differ only in case" in err, err
    assert not out.exists()


def test_a_folder_named_like_a_preset_is_told_apart(tmp_path, monkeypatch, capsys):
    """A downloaded checkpoint folder ./llama2-7b (2 layers here): --model llama2-7b planned the 32-layer preset
    without a word; it still does (presets first), saying so and how to read the folder."""
    (tmp_path / "llama2-7b").mkdir()
    (tmp_path / "llama2-7b" / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 128}))
    monkeypatch.chdir(tmp_path)
    inv = os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")
    args = ["--cluster", "h800", "--tp", "1", "--pp", "1", "--dp", "1", "--micro-batch-size", "1",
            "--global-batch-size", "8", "--inventory", inv, "--json"]
    from hetauto_megatron.spec import model as M
    monkeypatch.setattr(M, "_SHADOWED", set())
    rc, out, err = run_cli(["simulate", "--model", "llama2-7b", *args], capsys)
    assert rc == 0 and "names the preset llama2-7b, not the file or folder" in err and "./llama2-7b" in err, err
    assert json.loads(out)["stages"][0]["layers"] == 32
    rc, out, err = run_cli(["simulate", "--model", "./llama2-7b", *args], capsys)
    assert rc == 0 and "names the preset" not in err and json.loads(out)["stages"][0]["layers"] == 2, err


@pytest.mark.parametrize("pp, dp, words", [("33", "1", ["33 processes", "change --dp or --pp"]),
                                           ("4", "64", ["256 devices", "reduce --tp, --dp or --pp"])])
def test_a_layout_given_by_flags_is_blamed_on_the_flags(pp, dp, words, capsys):
    """simulate --tp/--pp/--dp: no meshes were written, yet the error named field 'meshes[0]' and told the user to
    change the meshes' dp or stages."""
    inv = os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")
    rc, _, err = run_cli(["simulate", "--model", "llama2-7b", "--inventory", inv, "--cluster", "h800", "--tp", "1",
                          "--pp", pp, "--dp", dp, "--micro-batch-size", "1", "--global-batch-size", "64"], capsys)
    assert rc == 2 and "field '--tp/--pp/--dp'" in err and "meshes" not in err, err
    assert all(w in err for w in words), err


@pytest.mark.parametrize("scale", ['"x"', "0", "-5", "true"])
def test_a_dry_run_reports_link_scale_is_checked(scale, tmp_path):
    """A hand-edited link_scale was read as a run without emulation: its prediction priced the links at full speed
    beside a measurement of links slowed that many times."""
    from hetauto_megatron.commands._dryrun_comparison import load_dryrun_report
    from hetauto_megatron.errors import InputError
    path = tmp_path / "r.json"
    path.write_text('{"iteration_s": 0.5, "steps": [{}, {}], "link_scale": %s}' % scale)
    with pytest.raises(InputError) as e:
        load_dryrun_report(str(path))
    assert e.value.field == "link_scale" and e.value.file == str(path)
    path.write_text('{"iteration_s": 0.5, "steps": [{}, {}], "link_scale": null}')
    assert load_dryrun_report(str(path))["link_scale"] is None
    with pytest.raises(InputError, match="is a directory"):
        load_dryrun_report(str(tmp_path))
