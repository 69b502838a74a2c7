"""Launch-time failures: a plan that does not fit the launched job fails fast with exit 2 and a clear message;
a rank that dies makes its peers fail with an error naming it instead of hanging; the device layer."""
import os
import time

import pytest

from hetauto_megatron.cli import main
from hetauto_megatron.errors import InputError
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.runtime.device import backend_for, check_local_device, init_backend, torch_device_for
from hetauto_megatron.runtime import launcher
from hetauto_megatron.runtime.launcher import LaunchError, launch
from hetauto_megatron.runtime.ranks import global_rank, rank_coords, validate_launch
from hetauto_megatron.spec.model import PRESETS

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

TINY = PRESETS["tiny"].to_dict()


def two_cluster_plan(dev_a="cpu", dev_b="cpu"):
    return plan_from_dict({"version": 1, "model": TINY, "global_batch_size": 4, "meshes": [
        {"cluster": "a", "device_type": dev_a, "tp": 2, "dp": 1, "micro_batch_size": 2, "stage_layers": [2, 2]},
        {"cluster": "b", "device_type": dev_b, "tp": 1, "dp": 2, "micro_batch_size": 1, "stage_layers": [4]}]})


def test_rendezvous_ports_come_from_below_the_kernels_own_range():
    """A port checked free and bound later must not be one the kernel hands out meanwhile (another launch's
    connections and gloo's port-0 listeners take ports of the ephemeral range)."""
    with open(launcher._EPHEMERAL_RANGE_FILE) as f:
        low = int(f.read().split()[0])          # the kernel's own statement, not the module's reading of it
    if low < 11000:
        pytest.skip(f"this kernel's own ports start at {low}: no room below them, the kernel picks (the fallback)")
    ports = [launcher.free_port() for _ in range(20)]
    assert all(10000 <= p < low for p in ports), (low, ports)
    assert len(set(ports)) > 10                  # drawn, not one fixed number two workers would share
    import socket
    with socket.socket() as held:                # each is free: a listener can take it
        held.bind(("127.0.0.1", ports[0]))


def test_rank_coords_follow_megatron_order_inside_each_mesh():
    p = two_cluster_plan()
    got = [(c.mesh_index, c.stage, c.tp_rank, c.dp_rank) for c in (rank_coords(p, r) for r in range(p.world_size))]
    assert got == [(0, 0, 0, 0), (0, 0, 1, 0), (0, 1, 0, 0), (0, 1, 1, 0), (1, 2, 0, 0), (1, 2, 0, 1)]
    for r in range(p.world_size):
        c = rank_coords(p, r)
        assert global_rank(p, c.mesh_index, c.stage_in_mesh, c.dp_rank, c.tp_rank) == r


@pytest.mark.parametrize("rank", [-1, 6, 100])
def test_rank_outside_the_plan_is_an_input_error(rank):
    with pytest.raises(InputError) as err:
        rank_coords(two_cluster_plan(), rank, file="plan.yaml")
    msg = err.value.message
    assert f"global rank {rank} is outside the plan's 6 ranks (a: ranks 0-3, b: ranks 4-5)" in msg
    assert "plan.yaml" in msg and "HETAUTO_RANK_OFFSET" in msg


def test_groups_carry_megatrons_dense_expert_and_optimizer_groups():
    """build_groups sets the expert / distributed-optimizer groups the way Megatron does for a dense model,
    so every user of the collection (DDP, optimizer, the --hetauto hook) gets them from one place."""
    from hetauto_megatron.runtime.dryrun import preload_megatron

    preload_megatron()
    launch(_expert_groups, 6, args=(two_cluster_plan(),), timeout_s=60)


def _expert_groups(rank, world, plan):
    import torch.distributed as dist
    from hetauto_megatron.runtime.groups import build_groups
    from hetauto_megatron.runtime.rendezvous import init_distributed

    init_distributed(plan, rank, world, timeout_s=20, dry_run=True)
    pg = build_groups(plan, rank, world, timeout_s=20, dry_run=True).pg
    assert pg.expt_tp is pg.tp and pg.tp_ep is pg.tp and pg.expt_dp is pg.dp
    assert pg.tp_ep_pp is pg.mp and pg.intra_dist_opt is pg.dp_cp
    assert dist.get_world_size(pg.expt_dp) == plan.meshes[rank_coords(plan, rank).mesh_index].dp
    dist.barrier()
    dist.destroy_process_group()


def test_world_size_mismatch_names_the_counts():
    with pytest.raises(InputError) as err:
        validate_launch(two_cluster_plan(), 4, file="plan.yaml")
    msg = err.value.message
    assert "launched with 4 processes but the plan needs 6" in msg and "plan.yaml" in msg and "Fix:" in msg


def test_rank_on_the_wrong_device_type():
    p = two_cluster_plan("h800", "mi300x")
    with pytest.raises(InputError) as err:
        validate_launch(p, 6, device_types=["h800"] * 4 + ["h800", "mi300x"])
    assert "rank 4 runs on h800" in err.value.message and "meshes[1].device_type" in err.value.message
    validate_launch(p, 6, device_types=["H800"] * 4 + ["MI300X"] * 2)  # aliases and case are fine


def test_device_layer_mapping_and_local_check():
    assert (torch_device_for("h800"), backend_for("h800")) == ("cuda", "nccl")
    assert (torch_device_for("mi300x"), backend_for("mi300x")) == ("cuda", "nccl")
    assert (torch_device_for("910b"), backend_for("910b")) == ("npu", "hccl")
    assert (torch_device_for("cpu"), backend_for("cpu")) == ("cpu", "gloo")
    assert init_backend(["cpu"]) == "gloo"
    assert init_backend(["h800", "cpu"]) == "cpu:gloo,cuda:nccl"
    check_local_device("cpu", rank=0)
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="rank 3 is planned on device type h800"):
            check_local_device("h800", rank=3)


def test_without_an_accelerator_megatron_imports_without_torchdynamo_and_compiles_at_the_first_call():
    """A fresh process as a CPU rank starts (the runtime imported first, as the hook's import in the patched
    pretrain_gpt.py does): Megatron-Core's and Megatron-LM's imports, the GPT model's included, no longer import
    TorchDynamo and Inductor (about 2 s of each rank's start-up); torch.compile still compiles, at the first call
    (TorchDynamo is imported then), with the function's result, and a module is still compiled at once."""
    import subprocess
    import sys
    code = "\n".join([
        "import sys, torch",
        "import hetauto_megatron.megatron.hook",
        "import megatron.training, megatron.core.models.gpt",
        "from megatron.core.jit import jit_fuser",
        "assert not any(m in sys.modules for m in ('torch._dynamo', 'torch._inductor')), 'imported at start-up'",
        "f = torch.compile(lambda x: x * 2 + 1, backend='eager')",
        "g = jit_fuser(lambda x: x - 1)",
        "assert 'torch._dynamo' not in sys.modules, 'compiled before the first call'",
        "x = torch.arange(4.0)",
        "assert torch.equal(f(x), x * 2 + 1) and 'torch._dynamo' in sys.modules",
        "m = torch.compile(torch.nn.Linear(2, 2), backend='eager')",
        "assert type(m).__name__ == 'OptimizedModule', type(m)",
        "print('ok')"])
    import torch
    if torch.cuda.device_count() > 0:
        pytest.skip("a process with an accelerator keeps torch.compile as it is")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_launch_reports_a_world_size_mismatch_as_input_error():
    from hetauto_megatron.runtime.rendezvous import init_distributed

    p = two_cluster_plan()

    def rank_fn(rank, world):
        init_distributed(p, rank, world, timeout_s=10, dry_run=True)

    with pytest.raises(InputError, match="launched with 2 processes but the plan needs 6"):
        launch(rank_fn, 2, timeout_s=60)


def test_dryrun_layer_count_mismatch_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(open("examples/llama/plans/tiny-2clusters-cpu.yaml").read().replace("stage_layers: [3]",
                                                                                        "stage_layers: [4]"))
    assert main(["dryrun", "--plan", str(bad), "--tiny"]) == 2
    err = capsys.readouterr().err
    assert "stage_layers add up to 9 layers but the model has 8" in err and "Traceback" not in err


def test_dryrun_sequence_tp_does_not_divide_names_the_plan_file(tmp_path, capsys):
    """The sequence-parallel split is checked before any process starts (runtime/dryrun.py prepare_plan); its
    exit-2 message names the plan file like every other plan error (it named only the field)."""
    bad = tmp_path / "odd-seq.yaml"
    bad.write_text(open("examples/llama/plans/tiny-2clusters-cpu.yaml").read().replace(
        "seq_length: 32", "seq_length: 31"))
    assert main(["dryrun", "--plan", str(bad), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: field 'meshes[0].settings.sequence_parallel'" in err and "Traceback" not in err, err


def test_dryrun_the_machine_cannot_hold_is_refused_before_any_process_starts(tmp_path, capsys, monkeypatch):
    """A full-size model dry-run without --tiny: every rank is a process on this machine, so the memory model's
    prediction for all of them is checked against the host's memory first. Without the check the kernel kills the
    ranks (exit -9) and the run fails minutes later."""
    big = tmp_path / "big.yaml"
    big.write_text(open("examples/llama/plans/tiny-2clusters-cpu.yaml").read().replace(
        "hidden_size: 64, num_attention_heads: 4, ffn_hidden_size: 256, vocab_size: 128,\n  seq_length: 32",
        "hidden_size: 16384, num_attention_heads: 128, ffn_hidden_size: 53248, vocab_size: 128000,\n"
        "  seq_length: 32").replace("max_position_embeddings: 32", "max_position_embeddings: 4096"))
    import hetauto_megatron.runtime.dryrun as dryrun
    monkeypatch.setattr(dryrun, "available_host_bytes", lambda: 64 << 30)   # any machine's figure: 64 GiB free
    assert main(["dryrun", "--plan", str(big)]) == 2
    err = capsys.readouterr().err
    assert "GiB of host memory" in err and "add --tiny" in err and "Traceback" not in err, err
    assert "failed" not in err      # refused, not launched and killed


def _failing_peer(rank, world, plan, timeout_s, mode):
    """Rank 2 (first stage of mesh b) dies (mode 'die') or goes silent ('hang') right after the groups exist."""
    import torch
    from hetauto_megatron.runtime.communicator import HeteroP2PCommunicator
    from hetauto_megatron.runtime.groups import build_groups, set_megatron_globals
    from hetauto_megatron.runtime.model import transformer_config
    from hetauto_megatron.runtime.rendezvous import init_distributed

    init_distributed(plan, rank, world, timeout_s=timeout_s, dry_run=True)
    ctx = build_groups(plan, rank, world, timeout_s=timeout_s, dry_run=True)
    set_megatron_globals(ctx)
    comm = HeteroP2PCommunicator(ctx, transformer_config(plan, ctx, plan.model), timeout_s=timeout_s)
    if rank == 2:
        if mode == "die":
            os._exit(9)
        time.sleep(120)
    shape = (plan.model.seq_length, ctx.mesh.micro_batch_size, plan.model.hidden_size)
    if ctx.is_last_stage:
        comm.recv_forward(shape, False)       # rank 3: waits for its (dead) neighbour's activation
    else:
        comm.send_forward(torch.ones(shape), False)
        comm.recv_backward(shape, False)     # ranks 0, 1: wait for gradients that never come
    return "finished"


def _two_cluster_pipeline(boundary=None):
    a = {"cluster": "a", "device_type": "cpu", "tp": 2, "dp": 1, "micro_batch_size": 2, "stage_layers": [4]}
    return plan_from_dict({"version": 2, "model": TINY, "global_batch_size": 4, "meshes": [
        {**a, "boundary": boundary or {"schedule": "blocking"}},
        {"cluster": "b", "device_type": "cpu", "tp": 1, "dp": 1, "micro_batch_size": 2, "stage_layers": [2, 2]}]})


def test_killed_peer_fails_the_others_instead_of_hanging(monkeypatch):
    # the cross-cluster boundary overlapped, its sends posted by the communication thread (as on accelerators):
    # the late waits still name the dead peer (the silent-peer test below runs the blocking path)
    from hetauto_megatron.runtime import host_staging
    monkeypatch.setattr(host_staging, "THREAD_ON_CPU", True)
    p = _two_cluster_pipeline({"schedule": "overlapped", "depth": 1})
    from hetauto_megatron.runtime.dryrun import preload_megatron

    preload_megatron()  # import Megatron once here, not in every forked rank
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(_failing_peer, 4, args=(p, 5.0, "die"), timeout_s=90, grace_s=30)
    elapsed = time.monotonic() - t0
    failures = err.value.failures
    assert "process died (exit code 9)" in failures[2]
    # the survivors raised their own error naming the dead rank, before the launcher had to kill them
    for r in (0, 1):
        assert "PeerError" in failures[r] and "with rank 2 (cluster b" in failures[r], failures[r]
    assert "PeerError" in failures[3] and "killed" not in failures[3]
    assert elapsed < 30


def test_silent_peer_times_out_with_a_clear_error():
    from hetauto_megatron.runtime.dryrun import preload_megatron

    preload_megatron()
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(_failing_peer, 4, args=(_two_cluster_pipeline(), 3.0, "hang"), timeout_s=90, grace_s=4)
    failures = err.value.failures
    for r in (0, 1, 3):
        assert "PeerError" in failures[r] and "Timed out waiting 3000ms" in failures[r], failures[r]
    assert "killed" in failures[2]          # the launcher ends the stuck rank after the grace period
    assert time.monotonic() - t0 < 30


def _join(rank, world_size, plans, timeout_s, absent):
    """One rank of a launch: joins the world with its own plan file's plan, or (rank in `absent`) never starts, as
    a cluster whose launch refused its arguments; returns the error it stopped with."""
    from hetauto_megatron.runtime.rendezvous import init_distributed
    if rank in absent:              # (its process ends at once: the others wait for its join all the same)
        return {"error": None}
    try:
        init_distributed(plans[rank], rank, world_size, timeout_s=timeout_s, dry_run=True, file=f"plan{rank}.yaml")
    except InputError as exc:
        return {"error": exc.message, "field": exc.field}
    return {"error": None}


def test_clusters_started_with_different_plans_stop_on_every_rank():
    """Two clusters launched with two versions of a plan (here: one copy edited to another micro-batch) would build
    other batches on each and train silently wrong (measured: 7 of 8 samples, a loss 12 % off); every rank stops
    with one paragraph naming the ranks whose plan is not rank 0's. The same plan everywhere joins."""
    def plan(mbs, gbps=80):
        inventory = {"clusters": [{"name": c, "device": "cpu", "nodes": 1, "devices_per_node": 1} for c in "ab"],
                     "links": [{"between": ["a", "b"], "bandwidth_gbps": gbps, "latency_ms": 1}]}
        return plan_from_dict({"version": 2, "model": TINY, "global_batch_size": 4, "inventory": inventory, "meshes": [
            {"cluster": "a", "device_type": "cpu", "dp": 1, "micro_batch_size": mbs, "stage_layers": [4]},
            {"cluster": "b", "device_type": "cpu", "dp": 1, "micro_batch_size": mbs, "stage_layers": [4]}]})
    # the same plan, its inventory written another way by another tool (80 and 80.0): one plan
    assert [r["error"] for r in launch(_join, 2, args=([plan(1), plan(1, 80.0)], 60, ()), timeout_s=120)] == [None] * 2
    results = launch(_join, 2, args=([plan(1), plan(2)], 60, ()), timeout_s=120)
    for rank, r in enumerate(results):
        assert r["field"] == "--hetauto-plan", r
        assert "started with different plans: rank(s) 1 loaded another plan than rank 0" in r["error"]
        assert f"plan{rank}.yaml" in r["error"]


def test_a_rank_that_never_joins_is_a_paragraph_not_a_rendezvous_traceback():
    """A cluster whose launch stopped (a refused argument) or starts other ranks than the plan's leaves the others
    waiting at the rendezvous; after the timeout they stop with one paragraph that says where to look, not with
    torch's DistStoreError traceback."""
    plan = plan_from_dict({"version": 2, "model": TINY, "global_batch_size": 4, "meshes": [
        {"cluster": "a", "device_type": "cpu", "dp": 2, "micro_batch_size": 1, "stage_layers": [8]}]})
    results = launch(_join, 2, args=([plan, plan], 4, (1,)), timeout_s=120)
    assert results[1]["error"] is None
    assert results[0]["field"] == "HETAUTO_TIMEOUT_S"
    assert "waited 4 s for the plan's 2 ranks to join" in results[0]["error"] and "NODE_RANK" in results[0]["error"]
    assert "give a larger HETAUTO_TIMEOUT_S" in results[0]["error"]


def _early_rank_zero(rank, world_size):
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    if rank == 0:
        return "done"          # rank 0, the rendezvous store's host, is through first
    time.sleep(0.5)            # its peers still read the store: a group of their own, built from it
    group = dist.new_group([1, 2], use_local_synchronization=True)
    return dist.get_world_size(group)


def test_a_rank_done_first_keeps_the_rendezvous_store_for_its_peers():
    """Rank 0 hosts the env:// rendezvous store. Before, a rank 0 that was through left at once, and a peer still in
    its rendezvous or building a group from the store failed with 'Connection reset by peer' (a refused DeepSpeed
    launch failed so on CI: one rank still connecting when rank 0 left with its refusal). As torchrun's agent keeps
    the store, the launch keeps a finished rank until every rank has its result."""
    assert launch(_early_rank_zero, 3, timeout_s=120) == ["done", 2, 2]


def _rank_zero_leaves_its_peer_in_a_collective(rank, world_size):
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=240))
    if rank == 0:
        return "done"          # returns without the all-reduce its peer waits in (a defect of the function)
    dist.all_reduce(torch.ones(3))
    return "reduced"


def test_a_rank_done_first_closes_its_groups_so_a_peer_waiting_on_it_fails_at_once():
    """A finished rank stays for the rendezvous store (the test above), but its groups close: a peer waiting on it
    in a collective reports gloo's closed connection at once, instead of waiting out the collective's timeout
    (240 s here) with the finished rank's connections still open."""
    start = time.monotonic()
    with pytest.raises(LaunchError) as failed:
        launch(_rank_zero_leaves_its_peer_in_a_collective, 2, timeout_s=200, grace_s=5)
    # (gloo says "Connection closed by peer" or "Read error ... reset", as the kernel tells it)
    assert list(failed.value.failures) == [1] and "gloo" in failed.value.failures[1], failed.value.failures
    assert time.monotonic() - start < 120
