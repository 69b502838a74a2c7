"""`hetauto emit megatron`: layout strings Megatron accepts, and launch scripts parsed back by running them.

The scripts are executed with bash; torchrun is replaced (through the TORCHRUN variable the scripts honour) by
a recorder that writes its argv and environment, and the recorded Megatron arguments are parsed by
Megatron-LM's own argument parser and layout class.
"""
import argparse
import json
import os
import subprocess
import sys

import pytest
from helpers import mesh
from megatron.core.transformer.enums import LayerType
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
from megatron.training.arguments import add_megatron_arguments

from hetauto_megatron.cli import main
from hetauto_megatron.errors import InputError
from hetauto_megatron.emit.megatron import emit_megatron, megatron_args
from hetauto_megatron.megatron.timeouts import env_timeout_s
from hetauto_megatron.plan.layout import megatron_layout
from hetauto_megatron.plan.plan import load_plan, plan_from_dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN_736 = os.path.join(ROOT, "examples", "llama", "plans", "llama2-70b-736.yaml")
INVENTORY_736 = os.path.join(ROOT, "examples", "llama", "inventory-4clusters-736.yaml")

RECORDER = """\
import json, os, sys
rec = {"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items()
                                     if k.startswith(("HETAUTO_", "CUDA_", "HCCL_", "OMP_"))}}
with open(os.environ["RECORD_TO"], "w") as fh:
    json.dump(rec, fh)
"""


def megatron_parser():
    return add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))


def parse_layout(layout, pp):
    parsed = PipelineParallelLayerLayout(layout, pp)
    return parsed, [parsed.layout[r][0].count(LayerType.decoder) for r in range(pp)]


@pytest.mark.parametrize("stage_layers", [[3, 2, 1], [0, 4, 4], [4, 4, 0], [0, 8, 0], [12, 1, 1, 10], [2] * 40])
def test_layout_accepted_by_megatron(stage_layers):
    text = megatron_layout(stage_layers)
    parsed, per_stage = parse_layout(text, len(stage_layers))
    parsed.validate_layer_layout(sum(stage_layers), None)   # raises AssertionError when Megatron rejects it
    assert per_stage == stage_layers
    assert parsed.layout[0][0][0] == LayerType.embedding and parsed.layout[-1][0][-1] == LayerType.loss


def test_layout_example():
    assert megatron_layout([3, 2, 1]) == "Et*3|t*2|tL"
    assert megatron_layout([0, 2, 0]) == "E|t*2|L"
    assert megatron_layout([8]) is None         # one stage: nothing to split, no flag


RUN_DIR = "run"


# an entry script with --hetauto: what hetauto patch-megatron adds to NVIDIA's pretrain_gpt.py (patches/)
PATCHED_ENTRY = "from hetauto_megatron.megatron import hook as hetauto  # --hetauto: one job across clusters\n"


def run_script(path, tmp_path, node_rank, extra_env=None, entries=()):
    """Run an emitted script with torchrun recorded, in a directory of its own (RUN_DIR) that holds the entry
    scripts it may start (pretrain_gpt.py, mine.py and `entries`: the script checks the one it starts is there)."""
    recorder = tmp_path / "recorder.py"
    recorder.write_text(RECORDER)
    out = tmp_path / f"rec-{os.path.basename(path)}-{node_rank}.json"
    run_dir = tmp_path / RUN_DIR
    run_dir.mkdir(exist_ok=True)
    for name in ("pretrain_gpt.py", "mine.py", *entries):
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(PATCHED_ENTRY)
    env = {"PATH": os.environ["PATH"], "NODE_RANK": str(node_rank), "CLUSTER_MASTER_ADDR": "10.0.0.1",
           "HETAUTO_MASTER_ADDR": "10.9.9.9", "TORCHRUN": f"{sys.executable} {recorder}", "RECORD_TO": str(out),
           **(extra_env or {})}
    proc = subprocess.run(["bash", str(path), "--mock-data"], env=env, capture_output=True, text=True, timeout=30,
                          cwd=run_dir)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def split_torchrun(argv):
    p = argparse.ArgumentParser()
    for name in ("--nnodes", "--nproc-per-node", "--node-rank", "--master-port"):
        p.add_argument(name, type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("script")
    tr, rest = p.parse_known_args(argv)
    return tr, rest


def test_736_launch_parses_back(tmp_path):
    plan = load_plan(PLAN_736)
    assert plan.world_size == 736   # the example uses every device of the inventory
    from hetauto_megatron.spec.inventory import load_inventory
    assert load_inventory(INVENTORY_736).num_devices == 736
    out = tmp_path / "launch"
    assert main(["emit", "megatron", "--plan", PLAN_736, "-o", str(out)]) == 0
    scripts = sorted(os.listdir(out))
    assert scripts == sorted(f"{m.cluster}.sh" for m in plan.meshes)
    total, micro_steps = 0, set()
    for i, mesh in enumerate(plan.meshes):
        rec = run_script(out / f"{mesh.cluster}.sh", tmp_path, node_rank=1)
        env = rec["env"]
        assert env["HETAUTO_CLUSTER"] == mesh.cluster
        assert int(env["HETAUTO_RANK_OFFSET"]) == plan.rank_offset(i) == total
        assert int(env["HETAUTO_WORLD_SIZE"]) == 736
        assert env["HETAUTO_MASTER_ADDR"] == "10.9.9.9" and env["HETAUTO_TIMEOUT_S"] == "600"
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"   # every mesh here has TP > 1
        tr, rest = split_torchrun(rec["argv"])
        assert tr.script == "pretrain_gpt.py" and tr.node_rank == 1 and tr.master_addr == "10.0.0.1"
        assert tr.master_port != int(env["HETAUTO_MASTER_PORT"])
        devices = tr.nnodes * tr.nproc_per_node
        total += devices
        args, unknown = megatron_parser().parse_known_args(rest)
        assert unknown == ["--hetauto", "--hetauto-plan", os.path.abspath(PLAN_736)]
        assert args.mock_data   # extra arguments reach Megatron
        assert args.tensor_model_parallel_size == mesh.tp
        assert args.pipeline_model_parallel_size == plan.pipeline_parallel_size == 23
        layout, per_stage = parse_layout(args.pipeline_model_parallel_layout, args.pipeline_model_parallel_size)
        layout.validate_layer_layout(args.num_layers, None)
        assert per_stage == plan.stage_layers
        mine = per_stage[plan.first_stage(i):plan.first_stage(i) + mesh.num_stages]
        assert mine == list(mesh.stage_layers)
        dp = devices // (args.tensor_model_parallel_size * len(mine))
        assert dp * args.tensor_model_parallel_size * len(mine) == devices and dp == mesh.dp
        assert args.global_batch_size % (args.micro_batch_size * dp) == 0
        micro_steps.add(args.global_batch_size // (args.micro_batch_size * dp))
        assert args.micro_batch_size == mesh.micro_batch_size
        assert args.recompute_granularity == (None if mesh.recompute == "none" else mesh.recompute)
        if mesh.recompute == "full":
            assert (args.recompute_method, args.recompute_num_layers) == ("uniform", 1)
        m = plan.model
        assert (args.num_layers, args.hidden_size, args.ffn_hidden_size, args.num_attention_heads) == \
            (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads)
        assert args.group_query_attention and args.num_query_groups == m.num_query_groups
        assert args.swiglu and args.untie_embeddings_and_output_weights and args.position_embedding_type == "rope"
        assert (args.seq_length, args.max_position_embeddings) == (m.seq_length, m.max_position_embeddings)
        assert args.bf16 and args.use_distributed_optimizer
    assert total == plan.world_size
    assert micro_steps == {plan.num_micro_batches}


def test_every_emitted_launch_passes_megatrons_own_validation(monkeypatch, tmp_path):
    """What the launch scripts pass (megatron_args), rewritten per rank by --hetauto, is accepted by Megatron-LM's
    own validate_args for every mesh: the 736-device example (3 device types, TP 2-8), LLaMA-3 with its rotary
    base, and LLaMA-2 trained at twice its config's context (before, Megatron's assertion on
    --max-position-embeddings stopped every rank of that launch)."""
    import megatron.training.arguments as margs

    from hetauto_megatron.megatron import cpu, launch_identity, rewrite
    from hetauto_megatron.megatron.args import hetauto_args_provider

    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    cpu.apply()       # validate_args asks the GPU architecture when TP > 1
    inv2 = os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")
    plans = [PLAN_736]
    for name, model, extra in (("llama3", "llama3-8b", []), ("long", "llama2-7b", ["--seq-length", "8192"])):
        out = str(tmp_path / f"{name}.yaml")
        assert main(["plan", "--model", model, "--inventory", inv2, "--global-batch-size", "256", "-o", out,
                     "--quiet", *extra]) == 0
        plans.append(out)
    for path in plans:
        plan = load_plan(path)
        for i, mesh in enumerate(plan.meshes):
            rank = plan.rank_offset(i)
            monkeypatch.setattr(sys, "argv", ["x", *megatron_args(plan, i, path), "--tokenizer-type", "NullTokenizer",
                                              "--vocab-size", str(plan.model.vocab_size), "--mock-data",
                                              "--train-iters", "1", "--lr", "1e-4"])
            args = margs.parse_args(hetauto_args_provider())
            placement = launch_identity.check_launch(plan, launch_identity.LaunchIdentity(rank, plan.world_size, None), None)
            assert placement.mesh_index == i
            rewrite.rewrite_args(args, plan, placement)
            margs.validate_args(args, {})
            assert (args.tensor_model_parallel_size, args.data_parallel_size) == (mesh.tp, mesh.dp)
            assert args.seq_length == plan.model.seq_length <= args.max_position_embeddings
            assert args.rotary_base == plan.model.rotary_base
    assert load_plan(plans[1]).model.rotary_base == 500000


def test_printed_output_is_the_scripts(tmp_path, capsys):
    out = tmp_path / "launch"
    assert main(["emit", "megatron", "--plan", PLAN_736, "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["emit", "megatron", "--plan", PLAN_736, "--cluster", "ascend"]) == 0
    printed = capsys.readouterr().out
    assert (out / "ascend.sh").read_text() in printed and "h800.sh" not in printed.split("=====")[1]


def tiny_plan(meshes, gbs=8, inventory=None):
    d = {"version": 1, "model": {"preset": "tiny"}, "global_batch_size": gbs, "meshes": meshes}
    if inventory is not None:
        d["inventory"] = inventory
    return d


def test_consecutive_meshes_of_one_cluster_share_a_launch(tmp_path):
    # cluster a hosts two meshes (different TP) on whole 2-device nodes: one launch, args chosen per node.
    plan = plan_from_dict(tiny_plan([mesh("a", 2, 1, 2, [2]), mesh("a", 1, 2, 1, [2, 2]), mesh("b", 1, 2, 1, [2])]))
    launches = emit_megatron(plan, plan_path="p.yaml", devices_per_node=2)
    assert [(la["cluster"], la["meshes"], la["rank_offset"], la["nnodes"]) for la in launches] == \
        [("a", [0, 1], 0, 3), ("b", [2], 6, 1)]
    path = tmp_path / "a.sh"
    path.write_text(launches[0]["script"])
    for node, want_tp, want_mbs in [(0, 2, 2), (1, 1, 1), (2, 1, 1)]:
        tr, rest = split_torchrun(run_script(path, tmp_path, node)["argv"])
        args, _ = megatron_parser().parse_known_args(rest)
        assert (args.tensor_model_parallel_size, args.micro_batch_size) == (want_tp, want_mbs)
        assert tr.nnodes == 3 and tr.nproc_per_node == 2


def test_cluster_split_by_another_gets_one_launch_per_run(tmp_path):
    """Each launch of a split cluster is a torchrun of its own, on nodes and a rendezvous of its own: its script
    said "run it on every node of this cluster with CLUSTER_MASTER_ADDR set to this cluster's node 0", which put
    both launches' rendezvous on one address and port, and named "node 0 of cluster a" for the job's rendezvous,
    which is node 0 of launch a.mesh0 (global rank 0)."""
    plan = plan_from_dict(tiny_plan([mesh("a", 1, 1, 1, [2]), mesh("b", 1, 1, 1, [4]), mesh("a", 1, 1, 1, [2])]))
    launches = emit_megatron(plan, plan_path="p.yaml", devices_per_node=1)
    assert [(la["name"], la["rank_offset"]) for la in launches] == [("a.mesh0", 0), ("b", 1), ("a.mesh2", 2)]
    assert [la["env"]["HETAUTO_RANK_OFFSET"] for la in launches] == ["0", "1", "2"]
    for la in launches:
        head = la["script"].split("set -euo")[0]
        assert "node 0 of launch a.mesh0 (cluster a)" in head, head
        assert ("One of 2 launches on cluster a (a.mesh0.sh, a.mesh2.sh)" in head and "this launch's node 0" in head
                and "this cluster's node 0" not in head) is (la["cluster"] == "a"), head
    path = tmp_path / "a.mesh2.sh"
    path.write_text(launches[2]["script"])
    tr, _ = split_torchrun(run_script(path, tmp_path, "00")["argv"])      # a zero-padded rank reads as its number
    assert tr.node_rank == 0


def test_launch_smaller_than_a_node_starts_on_one_node(tmp_path):
    # 3 of a 4-device node: torchrun starts 3 processes on that one node (what the planner may choose)
    plan = plan_from_dict(tiny_plan([mesh("a", 1, 3, 1, [8])], gbs=3, inventory=INVENTORY))
    [la] = emit_megatron(plan, plan_path="p.yaml")
    assert (la["nnodes"], la["nproc_per_node"]) == (1, 3)
    path = tmp_path / "a.sh"
    path.write_text(la["script"])
    tr, _ = split_torchrun(run_script(path, tmp_path, 0)["argv"])
    assert (tr.nnodes, tr.nproc_per_node) == (1, 3)


def test_launches_of_one_cluster_need_nodes_of_their_own(tmp_path, capsys):
    # a is split by b: its two launches start on two nodes, and the inventory gives it one
    inventory = {"clusters": [{"name": "a", "device": "cpu", "nodes": 1, "devices_per_node": 4},
                              {"name": "b", "device": "cpu", "nodes": 1, "devices_per_node": 4}]}
    d = tiny_plan([mesh("a", 1, 1, 1, [2]), mesh("b", 1, 1, 1, [4]), mesh("a", 1, 1, 1, [2])], inventory=inventory)
    path = tmp_path / "plan.yaml"
    path.write_text(json.dumps(d))
    assert main(["emit", "megatron", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "need 2 nodes" in err and "it has 1" in err and str(path) in err


def test_megatron_args_for_plain_gpt_model():
    d = tiny_plan([mesh("a", 1, 1, 1, [8])])
    d["model"] = {"preset": "tiny", "gated_mlp": False, "tie_embeddings": True, "position_embedding": "learned",
                  "num_query_groups": 4}
    args, _ = megatron_parser().parse_known_args(megatron_args(plan_from_dict(d), 0, "p.yaml"))
    assert not args.swiglu and not args.untie_embeddings_and_output_weights and not args.group_query_attention
    assert args.position_embedding_type == "learned_absolute" and args.pipeline_model_parallel_layout is None


INVENTORY = {"clusters": [{"name": "a", "device": "cpu", "nodes": 1, "devices_per_node": 4}]}


@pytest.mark.parametrize("plan_dict, words", [
    # 6 processes on 4-device nodes: torchrun starts the same number on every node of a launch
    ({**tiny_plan([mesh("a", 1, 6, 1, [8])], gbs=6), "inventory": {"clusters": [
        {"name": "a", "device": "cpu", "nodes": 2, "devices_per_node": 4}]}},
     ["not a whole number of 4-device nodes", "whole 4-device nodes of cluster a"]),
    (tiny_plan([mesh("z", 1, 4, 1, [8])]), ["meshes[0].cluster", "'z'", "use one of: a"]),
    (tiny_plan([mesh("a", 2, 4, 1, [8])]), ["uses 8 devices of cluster a", "only 4"]),
    (tiny_plan([mesh("a", 1, 4, 1, [8], device="h800")]), ["meshes[0].device_type", "cpu"]),
    (tiny_plan([mesh("a", 3, 4, 1, [8])]), ["meshes[0].tp", "divide"]),
    (tiny_plan([mesh("a", 1, 4, 1, [4, 0, 4])]), ["stage 1 holds no layers"]),
    # a mesh's cluster names the emitted NAME.sh and is a word of its script: an inventory's names only
    (tiny_plan([mesh("a$(id)", 1, 4, 1, [8])]), ["meshes[0].cluster", "not a usable cluster name"]),
])
def test_bad_plan_exits_2(tmp_path, capsys, plan_dict, words):
    if "inventory" not in plan_dict:
        plan_dict["inventory"] = INVENTORY
    path = tmp_path / "plan.yaml"
    path.write_text(json.dumps(plan_dict))
    assert main(["emit", "megatron", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "Traceback" not in err
    for w in words:
        assert w in err, err


def test_user_paths_are_quoted_in_the_scripts(tmp_path):
    """--plan, --plan-path and --script went into the script unquoted (inside "${HETAUTO_PLAN:-...}"): a quote broke
    the script and $(...) ran. Each reaches torchrun as the literal string, nothing runs, the environment still
    overrides the defaults."""
    folder = tmp_path / 'we"ird $(touch m0)'
    folder.mkdir()
    plan = folder / "p.yaml"
    plan.write_text(json.dumps(tiny_plan([mesh("a", 1, 4, 1, [8])], inventory=INVENTORY)))
    marks = [tmp_path / f"m{i}" for i in range(3)]
    plan_path, script = f"$(touch {marks[1]})/x", f"run it'\"$(touch {marks[2]}).py"
    for argv in ([], ["--plan-path", plan_path, "--script", script]):
        out = tmp_path / f"launch{len(argv)}"
        assert main(["emit", "megatron", "--plan", str(plan), "-o", str(out)] + argv) == 0
        path = out / "a.sh"
        check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        tr, rest = split_torchrun(run_script(path, tmp_path, node_rank=0, entries=[script])["argv"])
        assert rest[-3:] == ["--hetauto-plan", plan_path if argv else os.path.abspath(plan), "--mock-data"]
        assert tr.script == (script if argv else "pretrain_gpt.py")
        tr, rest = split_torchrun(run_script(path, tmp_path, node_rank=0, extra_env={
            "HETAUTO_PLAN": "/elsewhere/p.yaml", "MEGATRON_SCRIPT": "mine.py"})["argv"])
        assert rest[-2] == "/elsewhere/p.yaml" and tr.script == "mine.py"
    assert not any(m.exists() for m in marks) and not (tmp_path / RUN_DIR / "m0").exists()   # (their cwd)


def test_devices_per_node_applies_only_without_an_inventory(tmp_path, capsys):
    """--help says --devices-per-node is for plans without an inventory; it overrode the inventory's node size
    (4 -> 2: twice the nodes, scripts for a machine the plan was not made for). A different N is refused."""
    path = tmp_path / "plan.yaml"
    path.write_text(json.dumps(tiny_plan([mesh("a", 1, 4, 1, [8])], inventory=INVENTORY)))
    assert main(["emit", "megatron", "--plan", str(path), "--devices-per-node", "2"]) == 2
    err = capsys.readouterr().err
    assert "field '--devices-per-node'" in err and "4 devices per node, not 2" in err and "Fix:" in err
    assert main(["emit", "megatron", "--plan", str(path), "--devices-per-node", "4", "--json"]) == 0
    la, = json.loads(capsys.readouterr().out)["launches"]
    assert (la["nnodes"], la["nproc_per_node"]) == (1, 4)


def test_devices_per_node_errors_name_the_flag(tmp_path, capsys):
    """Without an inventory --devices-per-node sets the node size: a TP group across its nodes blamed
    meshes[0].tp and said re-plan, one process read '1 processes', and a value that is no number got argparse's
    message (no field, no fix, no full stop)."""
    def err_of(meshes, n, gbs=8):
        path = tmp_path / "plan.yaml"
        path.write_text(json.dumps(tiny_plan(meshes, gbs=gbs)))
        assert main(["emit", "megatron", "--plan", str(path), "--devices-per-node", n]) == 2
        return capsys.readouterr().err
    err = err_of([mesh("a", 2, 1, 1, [8])], "1")
    assert "field '--devices-per-node'" in err and "--devices-per-node 1 sets the node size" in err, err
    assert "meshes[0].tp" not in err and "re-plan" not in err and "a multiple of tp=2" in err, err
    err = err_of([mesh("a", 1, 3, 1, [8])], "2", gbs=3)
    assert "field '--devices-per-node'" in err and "runs 3 processes, not" in err and "divides 3" in err, err
    err = err_of([mesh("a", 1, 1, 1, [8])], "two")
    assert err.strip() == ("hetauto emit: error: field '--devices-per-node': must be a whole number, got 'two'. "
                           "Fix: give the processes per node, e.g. --devices-per-node 8.")
    # the launch-script flags on another target were taken and did nothing
    for target in ("deepspeed", "summary"):
        path = tmp_path / "plan.yaml"
        path.write_text(json.dumps(tiny_plan([mesh("a", 1, 1, 1, [8])])))
        assert main(["emit", target, "--plan", str(path), "--devices-per-node", "4"]) == 2
        err = capsys.readouterr().err
        assert "field '--devices-per-node'" in err and "is for 'hetauto emit megatron'" in err, err
    # the default node size (8) is an assumption too: --devices-per-node is named as the way out
    path = tmp_path / "plan.yaml"
    wide = tiny_plan([mesh("a", 16, 1, 1, [32])])
    wide["model"] = {"preset": "llama2-7b"}     # 32 heads: tp 16 divides them
    path.write_text(json.dumps(wide))
    assert main(["emit", "megatron", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "meshes[0].tp" in err and "8 devices per node are assumed" in err and "--devices-per-node" in err, err



@pytest.mark.parametrize("env, words", [
    ({"NODE_RANK": "32"}, "NODE_RANK=32, but the plan runs this cluster on 32 nodes: 0..31"),
    ({"NODE_RANK": "-1"}, "NODE_RANK=-1 is not a node index"),
    ({"NODE_RANK": None}, "set NODE_RANK"),
    ({"CLUSTER_MASTER_ADDR": None}, "set CLUSTER_MASTER_ADDR"),
    # the default launcher, hetauto-torchrun, missing where the script runs (an environment without hetauto)
    ({"TORCHRUN": None, "PATH": "/usr/bin:/bin"}, "the launcher hetauto-torchrun is not on PATH"),
    # a number no node has (bash's test said "integer expression expected" first)
    ({"NODE_RANK": "99999999999999999999"}, "NODE_RANK=99999999999999999999 is not a node index"),
    # no entry script where it runs: every worker's python exited 2, which read as a paragraph of hetauto's
    ({"MEGATRON_SCRIPT": "/nowhere/pretrain_gpt.py"},
     "the Megatron-LM entry script /nowhere/pretrain_gpt.py is not there"),
    # torchrun refused these ports on every node, with its usage text ('abc') or a ValueError traceback (70000)
    *[({"CLUSTER_MASTER_PORT": p}, f"CLUSTER_MASTER_PORT={p} is not a TCP port: set it to a port from 1 to 65535")
      for p in ("abc", "0", "70000", "-1")],
    # every worker refused these (megatron/world_store.py), after torchrun had started on every node
    *[({"HETAUTO_MASTER_PORT": p}, f"HETAUTO_MASTER_PORT={p} is not a TCP port: set it to a port from 1 to 65535")
      for p in ("abc", "0", "70000", "2²")],
    # every worker refused them (megatron/timeouts.py), after torchrun had started on every node
    *[({"HETAUTO_TIMEOUT_S": s}, f"HETAUTO_TIMEOUT_S={s} is not a positive number of seconds: unset it (default 600)")
      for s in ("-5", "abc", "0", "nan", "1e-400")],    # (1e-400: a float's underflow, 0.0 to the workers)
    # torch's deadlines overflowed (a store connect timed out at once) and Python's poll raised OverflowError
    *[({"HETAUTO_TIMEOUT_S": s}, f"HETAUTO_TIMEOUT_S={s} is more than a week (604800 s)")
      for s in ("604801", "1e12", "1_000_000", "1e999")],
])
def test_a_launch_script_refuses_a_node_it_does_not_have(tmp_path, env, words):
    """A node rank outside the cluster's nodes (or a missing address, a port that is no port, a timeout that is no
    positive number) stops the script with exit 2 before torchrun starts; before, torchrun waited for nodes that
    never come and every other cluster hung at the rendezvous."""
    proc = run_launch_check(tmp_path, env)
    assert proc.returncode == 2 and words in proc.stderr and "hetauto launch (cluster h800)" in proc.stderr, proc
    assert not (tmp_path / "launched").exists()


def run_launch_check(tmp_path, env):
    """Run h800.sh of the 736-device plan with `env` over valid values (None: unset), where it finds its entry
    script; its launcher, if started, records its arguments in the file `launched`."""
    out = tmp_path / "launch"
    if not out.exists():
        assert main(["emit", "megatron", "--plan", PLAN_736, "-o", str(out), "--cluster", "h800"]) == 0
        (tmp_path / "pretrain_gpt.py").write_text(PATCHED_ENTRY)
        (tmp_path / "recorder.py").write_text(RECORDER)
    base = {"PATH": os.environ["PATH"], "NODE_RANK": "1", "CLUSTER_MASTER_ADDR": "10.0.0.1",
            "HETAUTO_MASTER_ADDR": "10.9.9.9", "TORCHRUN": f"{sys.executable} {tmp_path / 'recorder.py'}",
            "RECORD_TO": str(tmp_path / "launched"), **env}
    return subprocess.run(["bash", str(out / "h800.sh")], env={k: v for k, v in base.items() if v is not None},
                          capture_output=True, text=True, timeout=30, cwd=tmp_path)


def test_a_launch_script_takes_the_timeouts_the_workers_take(tmp_path, monkeypatch):
    """The script refuses a HETAUTO_TIMEOUT_S where the workers' own reading of it (megatron/timeouts.py: Python's
    float, above 0, at most a week) does, on each value: a float's underflow (1e-400: 0.0) too, which only the
    workers refused, after torchrun had started on every node. Not listed: non-ASCII digits, which only the script
    refuses."""
    for value in ("600", "0.5", ".5", "5.", "+6e2", "6E-1", "1_000", " 600 ", "\t7\n", "00.001", "-5", "abc", "0",
                  "0.0", "0e5", "nan", "inf", "-inf", "1__0", "_1", "1_", "1e", ".", "0x10", "1,5", "1 2", "+-1",
                  "604800", "6.048e5", "604_800.0", "604800.5", "1e12", "1e999", "1_000_000",
                  "1e-400", "0.1e-330", "1_0e-400", "5e-324", "1e-320"):
        monkeypatch.setenv("HETAUTO_TIMEOUT_S", value)
        try:
            workers_take = env_timeout_s() > 0
        except InputError:
            workers_take = False
        proc = run_launch_check(tmp_path, {"HETAUTO_TIMEOUT_S": value})
        assert (proc.returncode == 0) == workers_take, (value, proc.stderr)


def test_a_launch_refuses_an_entry_script_without_hetauto_and_one_port_for_both_rendezvous(tmp_path):
    """Before torchrun starts, in one line (exit 2): an entry script that does not import hetauto's hook (NVIDIA's
    pretrain_gpt.py unpatched: every worker printed Megatron's whole usage text, 'unrecognized arguments:
    --hetauto', while the other clusters waited out their timeout), and, on the launch that holds global rank 0,
    whose node 0 hosts both rendezvous, one port for torchrun's and the world's (the other clusters' ranks met
    torchrun's store there and stopped with torch's C++ frames). The 736-device plan's first cluster is the
    H800s'."""
    assert run_launch_check(tmp_path, {}).returncode == 0
    (tmp_path / "launched").unlink()
    (tmp_path / "pretrain_gpt.py").write_text("import megatron  # NVIDIA's, not patched\n")
    proc = run_launch_check(tmp_path, {})
    assert proc.returncode == 2 and not (tmp_path / "launched").exists(), proc
    assert "has no --hetauto" in proc.stderr and "hetauto patch-megatron" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    (tmp_path / "pretrain_gpt.py").write_text(PATCHED_ENTRY)
    proc = run_launch_check(tmp_path, {"CLUSTER_MASTER_PORT": "29541", "HETAUTO_MASTER_PORT": "029541"})
    assert proc.returncode == 2 and "are both 029541" in proc.stderr, proc
    assert not (tmp_path / "launched").exists()
    assert len(proc.stderr.strip().splitlines()) == 1
    assert run_launch_check(tmp_path, {"CLUSTER_MASTER_PORT": "29541", "HETAUTO_MASTER_PORT": "29542"}).returncode == 0


def test_a_plan_that_does_not_fit_its_devices_is_said_before_its_launches_are_written(tmp_path, capsys):
    """The 736-device example plan with its 64 GiB cluster's memory given as 4 GiB in the plan's inventory (a hand
    edit, or an inventory corrected after planning): `simulate` says a stage does not fit, and `emit megatron` wrote
    the launches with exit 0 and no word (its DeepSpeed target said so). Now it says which stage needs what, before
    writing them; the plan as it was emits without that note."""
    import yaml

    src = os.path.join(os.path.dirname(__file__), "..", "examples", "llama", "plans", "llama2-70b-736.yaml")
    with open(src) as fh:
        data = yaml.safe_load(fh)
    assert main(["emit", "megatron", "--plan", src, "-o", str(tmp_path / "as-planned")]) == 0
    assert "does not fit" not in capsys.readouterr().err
    smaller = [c for c in data["inventory"]["clusters"] if c["memory_gib"] == 64.0]
    assert len(smaller) == 1
    smaller[0]["memory_gib"] = 4.0
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["simulate", "--plan", str(path), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    over = [i for i, st in enumerate(sim["stages"]) if st["memory_gib"] > st["memory_cap_gib"]]
    assert over and not sim["fits"]
    assert main(["emit", "megatron", "--plan", str(path), "-o", str(tmp_path / "edited")]) == 0
    err = capsys.readouterr().err
    assert f"as planned, stage {over[0]} needs {sim['stages'][over[0]]['memory_gib']:.1f} GiB of 4" in err, err
    assert "does not fit its devices" in err and os.path.exists(tmp_path / "edited"), err
