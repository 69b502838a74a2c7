"""Megatron-LM's options for the world, the process groups and the pipeline sends it builds itself, under --hetauto
(pure, no torch).

Without --hetauto, Megatron-LM starts torch.distributed and builds its process groups in
training/initialize.py `_initialize_distributed` (then core/parallel_state.py `initialize_model_parallel`), and
the distributed optimizer's extra all-gather groups in training/training.py `get_model`. Under --hetauto the world
and every group are the plan's, built by the hook (hook.py `_join_world`, runtime/groups.py `build_groups`): the
world is already started when `_initialize_distributed` runs, which then skips everything but reading the rank, and
`get_model` receives the plan's groups (`pg_collection`), which skips the all-gather groups. The pipeline's sends
are the plan's communicator's (runtime/communicator.py), which replaces Megatron-Core's
`P2PCommunicator._communicate`. What that code would have made of the options below did not happen, without a
word (measured on the tiny 2-cluster CPU plan: the run trained the same losses with each option as without it).

- The NCCL flight recorder's options (`--flight-recorder-*`) only set environment variables before the world starts
  (TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT, ...): the hook sets the same ones, the same way, before
  it starts the world (`flight_recorder_env`), so an accelerator cluster's NCCL groups record and dump as asked.
- The others change how the groups are built or ordered; under --hetauto the plan decides both, so each is refused
  by name (`check_group_args`, exit 2) rather than dropped.
"""
from __future__ import annotations

import os
from typing import NamedTuple

from ..errors import InputError


class GroupOption(NamedTuple):
    dest: str            # Megatron's argument (argparse dest)
    flag: str
    default: object      # Megatron's default: any other value asks for what the hook does not build
    what: str


GROUP_OPTIONS = (
    GroupOption("use_tp_pp_dp_mapping", "--use-tp-pp-dp-mapping", False,
                "another order of the ranks, tp-cp-ep-pp-dp: under --hetauto the plan places every rank"),
    GroupOption("use_sharp", "--use-sharp", False, "SHARP's in-network reductions on the data-parallel groups"),
    GroupOption("sharp_enabled_group", "--sharp-enabled-group", None, "the group SHARP's reductions run on"),
    GroupOption("nccl_communicator_config_path", "--nccl-communicator-config-path", None,
                "NCCL settings per communicator (its thread groups and CTAs)"),
    GroupOption("high_priority_stream_groups", "--high-priority-stream-groups", [],
                "high-priority streams for the named communicators"),
    GroupOption("pipeline_model_parallel_comm_backend", "--pipeline-model-parallel-comm-backend", None,
                "another backend for the pipeline's sends: under --hetauto they are the plan's communicator's"),
    GroupOption("use_ring_exchange_p2p", "--use-ring-exchange-p2p", False,
                "a custom ring-exchange kernel for the pipeline's sends: under --hetauto they are the plan's "
                "communicator's"),
    GroupOption("create_all_gather_group", "--create-all-gather-group", False,
                "a second data-parallel group for the distributed optimizer's all-gathers"),
    GroupOption("fake_process_group", "--fake-process-group", False,
                "a fake world without communication (for a one-device memory profile): under --hetauto the "
                "world is the plan's, every rank of it"),
)


def check_group_args(args, *, file: str | None = None) -> None:
    """InputError naming every option of GROUP_OPTIONS given a value other than Megatron's default."""
    given = [g for g in GROUP_OPTIONS if getattr(args, g.dest, g.default) != g.default]
    if given:
        raise InputError("the Megatron arguments set how Megatron-LM builds its own process groups or sends "
                         "between pipeline stages; under --hetauto the world, its groups and the sends are the "
                         "plan's, built by hetauto, and these options would be dropped without a word: " + "; ".join(
                             f"{g.flag} {getattr(args, g.dest)!r} ({g.what})" for g in given),
                         file=file, field=given[0].flag,
                         fix="drop " + ", ".join(g.flag for g in given) + " (the plan places the ranks and "
                             "hetauto builds their groups: docs/megatron-integration.md)")


# Megatron-LM's flight recorder options -> the environment variables its _initialize_distributed sets from them
FLIGHT_RECORDER_ENV = (
    ("TORCH_NCCL_TRACE_BUFFER_SIZE", "flight_recorder_trace_buffer_size", str),
    ("TORCH_NCCL_DUMP_ON_TIMEOUT", "flight_recorder_dump_on_timeout", lambda v: str(int(v))),
    ("TORCH_INCLUDE_STACK_TRACE", "flight_recorder_include_stack_trace", lambda v: str(int(v))),
    ("TORCH_INCLUDE_ONLY_ACTIVE", "flight_recorder_include_only_active", lambda v: str(int(v))),
    ("TORCH_NCCL_EXTRA_DUMP_ON_EXEC", "flight_recorder_extra_dump_on_exec", lambda v: str(int(v))),
)


def flight_recorder_env(args, environ=None) -> dict:
    """The environment variables Megatron-LM's `_initialize_distributed` (0.19) sets for the NCCL flight recorder
    before it starts the world, which the hook sets before it starts the plan's: where --flight-recorder-dump-path
    is given, or TORCH_FR_DUMP_TEMP_FILE or TORCH_NCCL_DEBUG_INFO_TEMP_FILE is set, both dump variables (a
    directory gets the per-rank prefix `<dir>/_dump_`) and the options' variables, a variable already in the
    environment kept (Megatron's precedence). {} otherwise. Only the variables not yet set are returned."""
    environ = os.environ if environ is None else environ
    path = (getattr(args, "flight_recorder_dump_path", None) or environ.get("TORCH_FR_DUMP_TEMP_FILE")
            or environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE"))
    if path is None:
        return {}
    prefix = os.path.join(path, "_dump_") if os.path.isdir(path) else path
    wanted = {"TORCH_FR_DUMP_TEMP_FILE": prefix, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix}
    for name, dest, text in FLIGHT_RECORDER_ENV:
        if hasattr(args, dest):
            wanted[name] = text(getattr(args, dest))
    return {name: value for name, value in wanted.items() if name not in environ}
