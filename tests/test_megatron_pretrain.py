"""The whole Megatron-LM training loop (megatron.training.pretrain) with --hetauto on CPU processes.

The --hetauto run of the 2-cluster tiny plan (cluster-a: TP 2 x 2 stages, cluster-b: TP 1 x DP 2) must give
the losses of Megatron's own homogeneous layout with the same pipeline stages (TP 1, DP 1, no hetauto):
Megatron seeds each stage by its pipeline rank and --use-cpu-initialization draws full weights before TP
slicing, so the two runs start from the same weights and see the same samples.
"""
import os
import subprocess
import sys

import pytest

from hetauto_megatron.megatron import demo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")


@pytest.fixture(scope="module")
def tiny_run():
    lines = []
    return demo.run_tiny(PLAN, iters=3, out=lines.append), lines


def test_hetauto_pretrain_matches_megatron_homogeneous_layout(tiny_run):
    result, lines = tiny_run
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


def test_checkpoint_per_mesh_shards_and_resume_gives_the_uninterrupted_losses(tiny_run, tmp_path):
    """--ckpt-format torch under --hetauto with TP 2 and TP 1 meshes: each (TP rank, stage) saves its own shard;
    2 iterations, save, resume for the 3rd: the 3rd loss is the uninterrupted run's."""
    from hetauto_megatron.plan.plan import load_plan

    plan = load_plan(PLAN)
    ckpt = tmp_path / "ckpt"
    first = demo.run_entry(demo.hetauto_argv(PLAN, plan, iters=2, seed=1234) +
                           ["--ckpt-format", "torch", "--save", str(ckpt), "--save-interval", "2"], plan.world_size,
                           log_dir=str(tmp_path))
    shards = sorted(p.name for p in (ckpt / "iter_0000002").iterdir())
    # cluster-a: TP 2 x stages 0, 1; cluster-b: TP 1 x stage 2 (its DP replica 1 does not write)
    assert shards == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_00_002", "mp_rank_01_000", "mp_rank_01_001"]
    resumed = demo.run_entry(demo.hetauto_argv(PLAN, plan, iters=3, seed=1234) +
                             ["--ckpt-format", "torch", "--load", str(ckpt), "--override-opt_param-scheduler"],
                             plan.world_size, log_dir=str(tmp_path))
    uninterrupted = tiny_run[0]["hetauto"]
    assert demo.last_rank_losses(first) == uninterrupted[:2]
    assert len(demo.last_rank_losses(resumed)) == 1
    assert abs(demo.last_rank_losses(resumed)[0] - uninterrupted[2]) <= 1e-6
