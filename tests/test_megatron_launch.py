"""The real multi-cluster launch path: the scripts `hetauto emit megatron` writes, run as they are with torchrun.

The 2-cluster tiny CPU plan (cluster-a: TP 2 x 2 stages, 4 ranks; cluster-b: TP 1 x DP 2, 2 ranks) is emitted
with 2 devices per node, which gives three torchrun launches: cluster-a node 0 and node 1 (one rendezvous
inside cluster-a), cluster-b node 0 (its own rendezvous). torchrun gives every worker a cluster-relative
RANK / WORLD_SIZE; the scripts' HETAUTO_CLUSTER / HETAUTO_RANK_OFFSET / HETAUTO_WORLD_SIZE and the global
rendezvous HETAUTO_MASTER_ADDR/PORT join them into one world of 6 ranks. They run
examples/llama/pretrain_llama_hetauto.py through megatron.training.pretrain (the scripts' own bf16 and
distributed-optimizer flags included) and must print the losses of the same arguments launched as one
forked 6-process world.
"""
import json
import os
import re
import subprocess
import sys

from helpers import wait_all

from hetauto_megatron.cli import main as cli
from hetauto_megatron.megatron import demo
from hetauto_megatron.plan.plan import load_plan
from hetauto_megatron.runtime.launcher import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")
ITERS = 3
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ .*\| lm loss: ([0-9.E+-]+) \|")


def extra_args(plan):
    """What a job adds after the script name: data, tokenizer, optimizer, and here the CPU flags."""
    return demo.model_flags(plan) + demo.training_flags(ITERS, 1234) + demo.CPU_FLAGS


def test_emitted_scripts_run_with_torchrun_per_cluster_and_match_one_forked_world(tmp_path, capsys):
    plan = load_plan(PLAN)
    out = tmp_path / "launch"
    assert cli(["emit", "megatron", "--plan", PLAN, "--devices-per-node", "2", "-o", str(out)]) == 0
    capsys.readouterr()
    assert cli(["emit", "megatron", "--plan", PLAN, "--devices-per-node", "2", "--json"]) == 0
    launches = json.loads(capsys.readouterr().out)["launches"]
    by_cluster = {la["cluster"]: la for la in launches}
    assert sorted(by_cluster) == ["cluster-a", "cluster-b"]
    assert (by_cluster["cluster-a"]["nnodes"], by_cluster["cluster-b"]["nnodes"]) == (2, 1)

    global_port, a_port, b_port = free_port(), free_port(), free_port()
    base = dict(os.environ, TORCHRUN=TORCHRUN, MEGATRON_SCRIPT=demo.ENTRY_SCRIPT, HETAUTO_MASTER_ADDR="127.0.0.1",
                HETAUTO_MASTER_PORT=str(global_port), HETAUTO_TIMEOUT_S="60", CLUSTER_MASTER_ADDR="127.0.0.1",
                PYTHONWARNINGS="ignore")
    runs = [("cluster-a", 0, a_port), ("cluster-a", 1, a_port), ("cluster-b", 0, b_port)]
    procs, logs = [], []
    for cluster, node, port in runs:
        log = tmp_path / f"{cluster}.node{node}.log"
        env = dict(base, NODE_RANK=str(node), CLUSTER_MASTER_PORT=str(port))
        with open(log, "w") as fh:
            procs.append(subprocess.Popen(["bash", str(out / f"{cluster}.sh"), *extra_args(plan)], env=env,
                                          stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT))
        logs.append(log)
    codes = wait_all(procs, timeout=150)
    text = {str(log.name): log.read_text() for log in logs}
    assert codes == [0, 0, 0], {k: v[-3000:] for k, v in text.items()}

    # each torchrun worker found its global place from the cluster-relative RANK and the script's offset
    assert "[hetauto] rank 2: cluster cluster-a (cpu), mesh 0, stage 1" in text["cluster-a.node1.log"]
    assert "[hetauto] rank 4: cluster cluster-b (cpu), mesh 1, stage 2" in text["cluster-b.node0.log"]
    assert "[hetauto] rank 5: cluster cluster-b (cpu), mesh 1, stage 2, tp rank 0, dp rank 1" in \
        text["cluster-b.node0.log"]
    # Megatron logs from the last rank, which is on cluster-b
    torchrun_losses = logged_losses(text["cluster-b.node0.log"])

    # the same arguments (the emitted Megatron arguments of mesh 0 plus the job's) as one forked world
    argv = by_cluster["cluster-a"]["megatron_args"]["0"] + extra_args(plan)
    forked_logs = tmp_path / "forked"
    forked_logs.mkdir()
    forked = demo.run_entry(argv, plan.world_size, timeout_s=150, log_dir=str(forked_logs))
    steps = demo.last_rank_losses(forked)
    assert len(steps) == ITERS and steps[0] != steps[-1], f"the model did not train: {steps}"
    assert sum(r["bytes"].get("inter_cluster", 0) for r in forked) > 0
    # Compare Megatron's own log lines of both launches (the log averages since the previous log line in its
    # first iterations, so it is compared with itself, not with the per-step values). 7 significant digits.
    forked_losses = logged_losses((forked_logs / f"rank{plan.world_size - 1}.log").read_text())
    assert max(abs(a - b) for a, b in zip(torchrun_losses, forked_losses)) <= 1e-5, (torchrun_losses, forked_losses)
    assert abs(torchrun_losses[-1] - steps[-1]) <= 1e-5  # a complete log interval is the step's loss


def logged_losses(log: str) -> list[float]:
    found = sorted((int(i), float(v)) for i, v in LOSS.findall(log))
    assert [i for i, _ in found] == list(range(1, ITERS + 1)), log[-3000:]
    return [v for _, v in found]
