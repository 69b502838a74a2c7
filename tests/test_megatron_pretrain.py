"""The whole Megatron-LM training loop (megatron.training.pretrain) with --hetauto on CPU processes.

The --hetauto run of the 2-cluster tiny plan (cluster-a: TP 2 x 2 stages, cluster-b: TP 1 x DP 2) must give
the losses of Megatron's own homogeneous layout with the same pipeline stages (TP 1, DP 1, no hetauto):
Megatron seeds each stage by its pipeline rank and --use-cpu-initialization draws full weights before TP
slicing, so the two runs start from the same weights and see the same samples.
"""
import os
import subprocess
import sys

from hetauto_megatron.megatron import demo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")


def test_hetauto_pretrain_matches_megatron_homogeneous_layout():
    lines = []
    result = demo.run_tiny(PLAN, iters=3, out=lines.append)
    het, ref = result["hetauto"], result["reference"]
    assert len(het) == 3 and len(ref) == 3, result
    assert result["max_abs_diff"] <= 1e-5, result
    assert het[0] != het[-1], "the model did not train"
    # activations really crossed between the two clusters through hetauto's communicator
    assert result["bytes"].get("inter_cluster", 0) > 0, result["bytes"]
    assert any("max |loss difference|" in line for line in lines)


def test_entry_script_rejects_a_launch_that_does_not_match_the_plan():
    from hetauto_megatron.plan.plan import load_plan

    plan = load_plan(PLAN)
    argv = demo.hetauto_argv(PLAN, plan, iters=1, seed=1)
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    proc = subprocess.run([sys.executable, demo.ENTRY_SCRIPT] + argv, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "launched with 2 processes but the plan needs 6" in proc.stderr
    assert "Traceback" not in proc.stderr
