"""Megatron-LM's options for the world and the process groups it builds itself, against Megatron-LM's own code.
Under --hetauto the hook starts the world and builds the plan's groups, so Megatron's `_initialize_distributed`
skips its two branches that read such options (torch.distributed already started; `skip_model_parallel_init`) and
`get_model` its branch that builds the all-gather groups (the plan's `pg_collection` given), and the plan's
communicator replaces Megatron-Core's `P2PCommunicator._communicate`. Every option that code reads must be
refused by name, applied by the hook, or be one the rewrite sets or refuses already; and the flight recorder's
environment the hook sets must be the one Megatron's own code sets (run here)."""
import ast
import inspect
import os
import textwrap

import pytest
from helpers import megatron_options, parse_emitted, rank0_placement

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import group_args, rewrite
from hetauto_megatron.megatron.unpriced import UNPRICED
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.spec.model import PRESETS

# what the rewrite does with the other options those branches read (rewrite.py, timeouts.py, hook.py)
SET_BY_THE_HOOK = {
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",   # the plan's layout
    "distributed_timeout_minutes",        # the timeout of every wait between ranks (timeouts.py)
    "distributed_backend",                # the plan's backend per device type (runtime/device.py)
    "local_rank", "rank", "world_size",   # the launch's, checked against the plan (launch_identity.py)
    "use_gloo_process_groups",            # read again by Megatron's optimizer, which gets the hook's gloo copies
}
# meaningful only with a feature the rewrite refuses (unpriced.py): context or expert parallelism, multi-token
# prediction
WITH_A_REFUSED_FEATURE = {"hierarchical_context_parallel_sizes", "hybrid_context_parallel",
                          "expert_model_parallel_size", "expert_tensor_parallel_size", "mtp_standalone"}

# a value other than Megatron's default for each refused option, as typed
TYPED = {"--use-tp-pp-dp-mapping": [], "--use-sharp": [], "--sharp-enabled-group": ["dp"],
         "--nccl-communicator-config-path": ["nccl.yaml"], "--high-priority-stream-groups": ["dp"],
         "--pipeline-model-parallel-comm-backend": ["ucc"], "--create-all-gather-group": [],
         "--use-ring-exchange-p2p": [], "--fake-process-group": []}


def _read_args(nodes) -> set:
    return {n.attr for node in nodes for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "args"}


def _branches(function, test_text: str):
    """The statements of `function`'s if-statements whose test reads `test_text`: (body, orelse) of each."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return [(n.body, n.orelse) for n in ast.walk(tree) if isinstance(n, ast.If) and test_text in ast.unparse(n.test)]


def test_every_option_of_megatrons_own_group_building_is_refused_applied_or_set():
    """Read from Megatron-LM's source: the options its skipped branches read (a new one in a later Megatron-LM
    fails this test until it is placed)."""
    import megatron.training.initialize as initialize
    import megatron.training.training as training

    [(_, not_started)] = _branches(initialize._initialize_distributed, "torch.distributed.is_initialized()")
    [(model_parallel, _)] = _branches(initialize._initialize_distributed, "skip_model_parallel_init")
    [(without_groups, _)] = _branches(training.get_model, "pg_collection is None")
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    sends = ast.parse(textwrap.dedent(inspect.getsource(P2PCommunicator._communicate)))
    # the pipeline's sends (replaced by the plan's communicator): the config's fields that are launch options
    send_options = {n.attr for n in ast.walk(sends) if isinstance(n, ast.Attribute) and
                    "config" in (getattr(n.value, "attr", None), getattr(n.value, "id", None))}
    parser, flags = megatron_options()
    options = {a.dest for a in parser._actions}
    read = (_read_args(not_started + model_parallel + without_groups) | send_options) & options
    refused = {g.dest for g in group_args.GROUP_OPTIONS}
    applied = {dest for _, dest, _ in group_args.FLIGHT_RECORDER_ENV} | {"flight_recorder_dump_path"}
    unpriced = {u.dest for u in UNPRICED}
    assert {"create_all_gather_group", "use_sharp", "use_ring_exchange_p2p", "flight_recorder_dump_path"} <= read
    unplaced = read - refused - applied - unpriced - SET_BY_THE_HOOK - WITH_A_REFUSED_FEATURE
    assert not unplaced, f"Megatron-LM's skipped code reads options --hetauto neither runs nor refuses: {unplaced}"
    assert not refused - read, "a refused option Megatron-LM's skipped code does not read"
    refused_flags = {g.flag for g in group_args.GROUP_OPTIONS}
    assert refused_flags <= flags and set(TYPED) == refused_flags
    assert {"expert_model_parallel_size", "num_distributed_optimizer_instances", "use_tp_pp_dp_mapping"} <= read
    assert {"num_layers_per_virtual_pipeline_stage", "context_parallel_size", "expert_model_parallel_size",
            "num_distributed_optimizer_instances"} <= unpriced


def _plan():
    mesh = {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 2, "micro_batch_size": 1, "recompute": "none",
            "stage_layers": [8]}
    return plan_from_dict({"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8,
                           "meshes": [mesh]})


@pytest.mark.parametrize("flag", sorted(TYPED))
def test_an_option_of_megatrons_own_groups_is_refused_by_name(monkeypatch, flag):
    """Before: the rewrite let each through and the tiny 2-cluster run trained as without it."""
    plan = _plan()
    _, args = parse_emitted(monkeypatch, plan, [flag, *TYPED[flag]])
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, rank0_placement(plan), file="plan.yaml")
    assert exc.value.exit_code == 2 and exc.value.field == flag and f"drop {flag}" in exc.value.fix
    assert "process groups" in str(exc.value) and "plan.yaml" in str(exc.value)


def _megatrons_flight_recorder_env(rank, world_size, argv, preset):
    """Megatron-LM's own _initialize_distributed, without --hetauto, in a world of one gloo rank: the TORCH_
    variables it added to the environment."""
    import sys

    import megatron.training.arguments as margs
    import megatron.training.global_vars as global_vars
    import megatron.training.initialize as initialize
    import torch.distributed as dist

    for name in [n for n in os.environ if n.startswith("TORCH_")]:
        del os.environ[name]
    os.environ.update(preset)
    before = dict(os.environ)
    sys.argv = ["pretrain_gpt.py", *argv]
    args = margs.parse_args()
    args.rank, args.world_size, args.distributed_backend = 0, 1, "gloo"
    global_vars.set_args(args)
    initialize._initialize_distributed(None, None, None, skip_model_parallel_init=True)
    dist.destroy_process_group()
    return {k: v for k, v in os.environ.items() if k.startswith("TORCH_") and before.get(k) != v}


@pytest.mark.parametrize("as_directory", [True, False])
def test_the_flight_recorders_environment_is_megatrons(tmp_path, monkeypatch, as_directory):
    """The variables the hook sets before it starts the world, against those Megatron-LM's own code sets; one
    variable already set is kept, as Megatron keeps it."""
    from hetauto_megatron.runtime.launcher import free_port, launch

    path = tmp_path if as_directory else tmp_path / "trace"
    argv = ["--flight-recorder-dump-path", str(path), "--flight-recorder-trace-buffer-size", "123",
            "--flight-recorder-include-stack-trace", "--no-flight-recorder-dump-on-timeout"]
    preset = {"TORCH_INCLUDE_ONLY_ACTIVE": "0"}
    [megatrons] = launch(_megatrons_flight_recorder_env, 1, args=(argv, preset), timeout_s=120,
                         env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    plan = _plan()
    _, args = parse_emitted(monkeypatch, plan, argv)
    ours = group_args.flight_recorder_env(args, environ=preset)
    assert ours == megatrons and len(ours) == 6 and "TORCH_INCLUDE_ONLY_ACTIVE" not in ours
    assert ours["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "123" and ours["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    assert ours["TORCH_FR_DUMP_TEMP_FILE"] == (os.path.join(str(path), "_dump_") if as_directory else str(path))
    _, args = parse_emitted(monkeypatch, plan, [])
    assert group_args.flight_recorder_env(args, environ={}) == {}      # no dump path: nothing, as Megatron
