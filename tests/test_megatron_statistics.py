"""Megatron-LM's per-iteration statistics reductions under --hetauto (megatron/training_seams.py
install_job_statistics), on two real gloo processes and Megatron-LM's own functions."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TWO_RANKS = r"""
import sys, types
import torch.distributed as dist
from hetauto_megatron.runtime import device
device.enable_cpu_redirects()          # Megatron's reductions put their scalar on the current device
rank = int(sys.argv[2])
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=rank, world_size=2)
world = dist.new_group([0, 1], backend="gloo")      # the hook's pg.mp: the world's gloo group
other = dist.new_group([0, 1], backend="gloo")
from megatron.core import parallel_state
parallel_state._MODEL_PARALLEL_GROUP = world        # as the hook hands its groups to Megatron (mpu_globals.py)
import megatron.training.training as training
from hetauto_megatron.megatron.training_seams import install_job_statistics
install_job_statistics(types.SimpleNamespace(context=types.SimpleNamespace(pg=types.SimpleNamespace(mp=world))))
mine = [0.1, 2.0][rank]
print(training.reduce_max_stat_across_model_parallel_group(mine, group=world),
      training.reduce_max_stat_across_model_parallel_group(mine),     # no group: Megatron's model-parallel one
      training.reduce_max_stat_across_model_parallel_group(None, group=world),
      training.logical_and_across_model_parallel_group(rank == 0, group=world),
      training.reduce_max_stat_across_model_parallel_group(mine, group=other),
      training.logical_and_across_model_parallel_group(rank == 0, group=other), flush=True)
dist.barrier()
"""


def test_statistics_every_rank_holds_are_not_reduced_over_the_world_again(tmp_path):
    """Megatron-LM's train_step and training_log reduce the update's success and the gradient norm (and the
    learning rate) over the model-parallel group every iteration; under --hetauto that group is the world's gloo
    group, whose ranks hold the job's values already (the norm comes from one reduction over the world,
    count_grad_norm_once): the three walks around the world's ring (0.47 s each at 16,384 ranks) are dropped.
    Given different values, two ranks keep their own on the world's group (no collective ran: a reduction
    would have given both the max, 2.0, and False), rounded as Megatron's fp32 scalar rounds them (0.1); on any
    other group Megatron's reduction still runs."""
    procs = [subprocess.Popen([sys.executable, "-c", TWO_RANKS, str(tmp_path / "store"), str(r)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    assert outs[0][0].split() == ["0.10000000149011612", "0.10000000149011612", "None", "True", "2.0", "False"]
    assert outs[1][0].split() == ["2.0", "2.0", "None", "False", "2.0", "False"]
