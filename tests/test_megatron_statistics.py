"""Megatron-LM's reductions over the world under --hetauto, on two real gloo processes and Megatron-LM's own
functions: the per-iteration statistics every rank holds (megatron/training_seams.py install_job_statistics), and
the collectives with accelerator tensors that go through host memory (runtime/world_collectives.py)."""
import json
import os
import subprocess
import sys

import pytest
from helpers import kill_launches

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TWO_RANKS = r"""
import functools, json, sys, types
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

# The staging of world collectives, its CPU tensors staged as an accelerator's would be. Each call torch's own
# collectives receive is recorded: which of the caller's tensors (by storage) they were handed.
import torch
from hetauto_megatron.runtime import world_collectives
handed = []
def recording(name):
    original = getattr(dist, name)
    @functools.wraps(original)
    def call(*a, **k):
        handed.append([t.data_ptr() for t in a + tuple(k.values()) if isinstance(t, torch.Tensor)])
        return original(*a, **k)
    return call
for name in ("all_reduce", "broadcast", "all_gather_into_tensor"):
    setattr(dist, name, recording(name))
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t, op=dist.ReduceOp.MIN)                # not staged: a CPU tensor passes through
through = handed.pop() == [t.data_ptr()]
world_collectives.install()
world_collectives.install()                             # once per process
world_collectives.STAGE_CPU = True
out = {"through": through}
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t, op=dist.ReduceOp.MIN)
out["min"], out["min_handed_own"] = t.item(), t.data_ptr() in handed.pop()
t = torch.tensor([float(rank + 1)])
work = dist.all_reduce(t, group=world, async_op=True)
out["sum_async"], out["waited"] = t.item(), work.wait()
t = torch.tensor([10.0 * rank, 1.0])
dist.broadcast(t, 1)
out["broadcast"] = t.tolist()
gathered = torch.zeros(4)
dist.all_gather_into_tensor(gathered, torch.tensor([rank, rank + 0.5]))
out["gathered"] = gathered.tolist()
parts = [torch.zeros(1), torch.zeros(1)]
dist.all_gather(parts, torch.tensor([rank * 3.0]))
out["parts"] = [p.item() for p in parts]
t = torch.tensor([rank + 1.0])
dist.reduce(t, 0)
out["reduced_on_0"] = t.item() if rank == 0 else None
# Megatron's own world collectives: the result validation's any-rank reduction (every iteration), and the timers'
# all-gather, bound at import to torch's function
from megatron.core.rerun_state_machine import get_rerun_state_machine
rerun = get_rerun_state_machine()
out["any"], out["any_list"] = rerun._reduce_any(rank == 1), list(rerun._reduce_any([False, rank == 0]))
import megatron.core.timers as timers
out["timers_alias"] = hasattr(timers.dist_all_gather_func, "_hetauto_staged")
clock = timers.Timers(2, "minmax")
clock("step", log_level=0).start()
clock("step").stop()
times = clock._get_elapsed_time_all_ranks(["step"], reset=True, barrier=False)
out["timers_shape"], out["timers_all_set"] = list(times.shape), bool((times > 0).all())
print("STAGED " + json.dumps(out), flush=True)
dist.barrier()
# as every hetauto rank ends (the hook's exit: groups destroyed, then no interpreter teardown, in which a gloo worker
# thread still releasing a finished operation's tensor can abort the process after the work is done: "terminate
# called without an active exception", pytorch/pytorch#190489; rank 1 here, once in some 50 runs while the groups
# were destroyed and the script left to end by itself)
from hetauto_megatron.megatron import hook
hook._take_charge_of_exit(60.0)
hook.exit_after_training()
"""


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    store = tmp_path_factory.mktemp("world") / "store"
    procs = []
    try:
        for r in (0, 1):
            procs.append(subprocess.Popen([sys.executable, "-c", TWO_RANKS, str(store), str(r)], cwd=ROOT,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))
        outs = [p.communicate(timeout=120) for p in procs]
    finally:        # a rank left waiting in the file:// rendezvous would wait torch's default 30 minutes
        kill_launches(procs)
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    return [o.splitlines() for o, _ in outs]


def test_statistics_every_rank_holds_are_not_reduced_over_the_world_again(two_ranks):
    """Megatron-LM's train_step and training_log reduce the update's success and the gradient norm (and the
    learning rate) over the model-parallel group every iteration; under --hetauto that group is the world's gloo
    group, whose ranks hold the job's values already (the norm comes from one reduction over the world,
    count_grad_norm_once): the three walks around the world's ring (0.47 s each at 16,384 ranks) are dropped.
    Given different values, two ranks keep their own on the world's group (no collective ran: a reduction
    would have given both the max, 2.0, and False), rounded as Megatron's fp32 scalar rounds them (0.1); on any
    other group Megatron's reduction still runs."""
    assert two_ranks[0][0].split() == ["0.10000000149011612", "0.10000000149011612", "None", "True", "2.0", "False"]
    assert two_ranks[1][0].split() == ["2.0", "2.0", "None", "False", "2.0", "False"]


def test_world_collectives_with_accelerator_tensors_go_through_host_memory(two_ranks):
    """A collective over the world (the default group, or a gloo group of every rank) with an accelerator tensor
    would span vendors' libraries; it runs on host copies over gloo and the results land in the caller's tensors.
    Here CPU tensors stand in for the accelerator's (world_collectives.STAGE_CPU): torch's collectives are handed
    copies, never the caller's tensors, and every result is the collective's own (MIN of 1 and 2, the sum 3, rank 1's
    broadcast, both ranks' gathers in rank order, the sum on rank 0), through torch's functions and through
    Megatron's own calls: the result validation's any-rank reduction of every iteration and the timers' all-gather
    (bound at import, rebound). Without the switch a CPU tensor is handed through as it is."""
    staged = [json.loads(line.split(" ", 1)[1]) for line in (lines[-1] for lines in two_ranks)]
    for rank, out in enumerate(staged):
        assert out["through"] and not out["min_handed_own"]
        assert out["min"] == 1.0 and out["sum_async"] == 3.0 and out["waited"] is True
        assert out["broadcast"] == [10.0, 1.0]
        assert out["gathered"] == [0.0, 0.5, 1.0, 1.5] and out["parts"] == [0.0, 3.0]
        assert out["reduced_on_0"] == (3.0 if rank == 0 else None)
        assert out["any"] is True and out["any_list"] == [False, True]
        assert out["timers_alias"] and out["timers_shape"] == [2, 1] and out["timers_all_set"]
