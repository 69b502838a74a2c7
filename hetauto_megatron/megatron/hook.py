"""The `--hetauto` hook: what a Megatron-LM entry script calls to run as one share of a heterogeneous plan.

An entry script changes in three places (patches/pretrain_gpt.patch does this to pretrain_gpt.py):

    args = hook.parse_and_validate_args(extra_args_provider=..., args_defaults=...)   # was Megatron's
    pretrain(..., **hook.pretrain_kwargs(args))                                         # was pretrain(...)
    hook.exit_after_training()                                                          # new (step 6)

Without --hetauto they are transparent (Megatron's own parsing; no extra pretrain arguments), except that a
process with no accelerator at all gets the CPU redirections so the loop can be dry-run on CPU (gloo, whose
process groups are destroyed at a clean exit as in step 6).

With --hetauto, per rank:
1. the megatron-core version is checked (the seams used here exist in 0.19.x only);
2. after Megatron parsed the command line and BEFORE it validates it, the rank's arguments are rewritten
   from the plan (rewrite.py: its mesh's TP, DP, micro-batch and recompute, the plan's pipeline depth,
   layout and global batch; model-shape arguments checked against the plan); once Megatron validated them,
   Megatron-Core's TransformerConfig is built from them as pretrain() will, so that its refusal comes now
   (config_check.py);
3. `pretrain_kwargs` joins the global torch.distributed world of the launch contract, builds the plan's
   process groups with the runtime instead of `initialize_model_parallel`, fills Megatron's parallel_state
   with this rank's own mesh groups (DDP, the optimizer and the data loader still read those globals; one
   process belongs to exactly one mesh, so the globals are unambiguous), and returns the plan's
   `p2p_communicator` and `pg_collection` with `skip_model_parallel_init=True`;
4. once Megatron has built model and optimizer, the runtime's gradient rules are installed (training_seams.py: every parameter
   several mesh stages hold, the tied embedding table's two ends included, starts from its first holder's
   values (replica_weights.ReplicaWeights) and has its gradient summed across holders in finalize_model_grads
   (replica_sync.ReplicaSync, as in the dry run); a global gradient norm that counts each parameter once), and
   each run of the schedule is bracketed by the communicator's begin_step / end_step (overlapped boundaries).
5. under a plan of several pipelines or meshes side by side (format version 3), each rank runs its own
   pipeline's Megatron (every layer then has several holders, step 4); plan_data.py gives each replica its
   samples of the global batch and logs the whole batch's loss.
6. at a clean exit the process groups are destroyed while the interpreter is alive (runtime/clean_exit.py),
   and once pretrain() returned the process ends without interpreter finalisation
   (`script_guard.exit_after_training`, the patched script's last line); so do Megatron's early exits
   (`ending_cleanly` wraps its train(); under `main_guard` once the script's main has unwound).
7. a rank that went away under this one (a pipeline transfer's PeerError, gloo's error in one of Megatron's
   collectives) is one paragraph naming it, exit 4 (`main_guard`, `guard_script_errors`; runtime/liveness.py).
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Callable, Optional

from ..errors import InputError, first_line
from ..plan.plan import Plan, load_plan
from ..runtime.clean_exit import take_charge_of_exit
from ..runtime.device import has_accelerator
from . import checkpoint_plan, launch_identity, rewrite, timeouts, training_inputs
from .args import hetauto_args_provider, unmark_parser_defaults
from .config_check import check_transformer_config
from .group_args import flight_recorder_env
from .mpu_globals import populate_parallel_state
# How an entry script ends on a user mistake or a lost rank (the scripts call these as hook.*)
from .script_guard import (assertion_text, ending_cleanly, exit_after_training, guard_script_errors,  # noqa: F401
                           main_guard)
from .training_seams import install_gradient_rules
from .versions import _check_pretrain_signature, check_megatron_version


@dataclasses.dataclass
class _State:
    """What the two hook calls share inside one process."""
    plan: Plan
    plan_file: str
    ident: launch_identity.LaunchIdentity
    placement: object             # runtime.ranks.RankCoords
    device_type: str
    changed: dict
    context: object = None        # runtime RankContext, once built
    communicator: object = None
    liveness: object = None       # runtime.liveness.Liveness: who went away when a collective fails
    timeout_s: float = timeouts.DEFAULT_S    # of every wait between ranks (timeouts.py)
    timeout_from: str = "HETAUTO_TIMEOUT_S"  # what set it: HETAUTO_TIMEOUT_S or --distributed-timeout-minutes N


_STATE: Optional[_State] = None


def current_plan_state() -> Optional[_State]:
    """This process's plan, placement and runtime context under --hetauto (None without it)."""
    return _STATE


def enable_cpu_mode() -> None:
    """Megatron-Core's CUDA redirections (runtime device layer) plus the training loop's (cpu.py)."""
    from ..runtime.device import enable_cpu_redirects
    from . import cpu

    enable_cpu_redirects()
    cpu.apply()


def _prepare_hetauto(args) -> _State:
    """Between Megatron's parsing and its validation: load the plan, place this rank, rewrite its arguments."""
    if not args.hetauto_plan:
        raise InputError("--hetauto needs the plan to run", field="--hetauto-plan",
                         fix="add --hetauto-plan plan.yaml (written by 'hetauto plan')")
    if getattr(args, "yaml_cfg", None):
        raise InputError("--yaml-cfg cannot be combined with --hetauto", field="--yaml-cfg",
                         fix="pass Megatron's arguments on the command line")
    plan = load_plan(args.hetauto_plan)
    ident = launch_identity.identity_from_env()
    placement = launch_identity.check_launch(plan, ident, args.hetauto_cluster, file=args.hetauto_plan)
    device_type = placement.device_type
    from ..spec.devices import get_device
    if get_device(device_type).vendor == "cpu":
        enable_cpu_mode()
    else:
        from ..runtime.device import check_local_device, set_fp32_arithmetic
        check_local_device(device_type, rank=ident.rank, file=args.hetauto_plan)
        set_fp32_arithmetic(plan, placement.cluster, device_type)
    timeout_s, timeout_from = timeouts.job_timeout_s(args)
    changed = rewrite.rewrite_args(args, plan, placement, file=args.hetauto_plan)
    checkpoint_plan.check_load(plan, args, file=args.hetauto_plan)
    training_inputs.check_tokenizer_when_built(plan, args.hetauto_plan)
    training_inputs.check_data_when_built(plan, placement.rank)
    args.local_rank = ident.local_rank
    if ident.rank == 0:
        print(f"[hetauto] every wait between ranks times out after {timeout_s:g} s ({timeout_from})",
              flush=True)
    return _State(plan, args.hetauto_plan, ident, placement, device_type, changed, timeout_s=timeout_s,
                  timeout_from=timeout_from)


def parse_and_validate_args(extra_args_provider: Optional[Callable] = None, ignore_unknown_args: bool = False,
                            args_defaults: Optional[dict] = None):
    """Megatron's `parse_and_validate_args` with the --hetauto flags added and, under --hetauto, this rank's
    arguments rewritten from the plan before Megatron validates them."""
    global _STATE
    import megatron.training.arguments as margs

    original_validate = margs.validate_args
    state_box = {}

    def validate_args(args, defaults={}):
        if getattr(args, "hetauto", False):
            check_megatron_version()
            _check_pretrain_signature()
            state = _prepare_hetauto(args)
            state_box["state"] = state
        elif not has_accelerator():
            enable_cpu_mode()
            if args.distributed_backend == "nccl":
                args.distributed_backend = "gloo"  # the only torch.distributed backend for CPU tensors
            _take_charge_of_exit(timeouts.env_timeout_s())     # gloo's groups, as under --hetauto
        unmark_parser_defaults(args)      # read above; Megatron's checkpoints keep the arguments (args.py)
        try:
            result = original_validate(args, defaults)
        except (AssertionError, ValueError, RuntimeError) as exc:
            # Megatron-LM checks the command line with assertions (two warm-up flags at once, --min-lr above
            # --lr, ...) and a few ValueErrors and RuntimeErrors (a flag that needs a package this machine lacks,
            # --non-persistent-ckpt-type local without nvidia_resiliency_ext): under --hetauto a user mistake is one
            # paragraph, also Megatron's own finding; without --hetauto the script reports it as before
            if "state" not in state_box or not (isinstance(exc, AssertionError) or _raised_by_megatrons_check(exc)):
                raise
            text = assertion_text(exc) if isinstance(exc, AssertionError) else first_line(exc)
            raise InputError(f"Megatron-LM's own check of the arguments (validate_args) refused this launch: "
                             f"{text}", fix="correct the flags it names on this launch's command line") from None
        except SystemExit as exc:
            # a few of its checks print on global rank 0 and call exit(): exit code 0 on every rank, untrained
            if "state" not in state_box or exc.code not in (None, 0):
                raise
            raise _validation_exit(args) from None
        if "state" in state_box:
            state = state_box["state"]
            # Megatron-Core's TransformerConfig refuses combinations validate_args lets through: refused here, one
            # paragraph before any rank waits for another, not in pretrain() after the join (config_check.py)
            check_transformer_config(args, state.plan, sys.argv[1:], file=state.plan_file)
            # validate_args derived this mesh's data_parallel_size from the mesh-sized world; from now on
            # Megatron sees the real job (pretrain also re-reads both from torch.distributed).
            args.world_size = state.plan.world_size
        return result

    original_parse = margs.parse_args

    def parse_args(*a, **kw):
        args = original_parse(*a, **kw)
        if getattr(args, "hetauto", False) and (args.use_checkpoint_args or
                                                 (args_defaults or {}).get("use_checkpoint_args", False)):
            raise _checkpoint_args_refused()     # before Megatron reads the checkpoint (parse_and_validate_args)
        return args

    margs.validate_args, margs.parse_args = validate_args, parse_args
    try:
        args = margs.parse_and_validate_args(extra_args_provider=hetauto_args_provider(extra_args_provider),
                                             ignore_unknown_args=ignore_unknown_args,
                                             args_defaults=dict(args_defaults or {}))
    finally:
        margs.validate_args, margs.parse_args = original_validate, original_parse
    _STATE = state_box.get("state")
    if _STATE is not None:
        _log_rewrite(_STATE)
        if _STATE.ident.rank == 0:
            from .unpriced import unpriced_world_collectives
            note = unpriced_world_collectives(args, _STATE.plan)
            if note:
                print(note, flush=True)
    return args


def _raised_by_megatrons_check(exc: BaseException) -> bool:
    """The error was raised by Megatron-LM's argument checks themselves (megatron/training/arguments.py), not by a
    library they called (a device query that failed is not a mistake on the command line)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].filename.replace(os.sep, "/").endswith("megatron/training/arguments.py")


def _checkpoint_args_refused() -> InputError:
    """--use-checkpoint-args under --hetauto: Megatron-LM reads the model's arguments from global rank 0's shard of
    the checkpoint on every rank while it parses, which the other clusters' machines need not have (measured: a
    FileNotFoundError or "unknown checkpoint format" traceback there); under --hetauto the model is the plan's, and
    a --load is checked against the plan it was saved under (checkpoint_plan.py)."""
    return InputError("--use-checkpoint-args reads the model's arguments from global rank 0's shard of the checkpoint "
                      "on every rank of every cluster, while Megatron-LM parses them; under --hetauto the model's "
                      "arguments are the plan's, and a --load is checked against the plan it was saved under",
                      field="--use-checkpoint-args", fix="drop --use-checkpoint-args (keep --load)")


def _validation_exit(args) -> InputError:
    """The paragraph for a launch Megatron-LM's validate_args ended with exit() (measured: --checkpoint-activations,
    a flag of older Megatron-LM scripts, printed "no longer valid" on global rank 0 only and every rank exited 0)."""
    if getattr(args, "checkpoint_activations", False):
        return InputError("--checkpoint-activations is no longer a Megatron-LM flag (it ended every rank with exit "
                          "code 0, untrained)", field="--checkpoint-activations",
                          fix="drop it: under --hetauto each mesh's recomputation is the plan's (its `recompute` "
                              "field, given to Megatron as --recompute-granularity and --recompute-method)")
    return InputError("Megatron-LM's own check of the arguments (validate_args) ended this launch with exit code 0, "
                      "untrained; it says why on global rank 0", fix="correct the flag global rank 0's log names")


def _log_rewrite(state: _State) -> None:
    p = state.placement
    if state.ident.rank in (0, state.plan.world_size - 1) or p.tp_rank == p.dp_rank == 0:
        changes = ", ".join(f"{k}={new!r}" for k, (_, new) in sorted(state.changed.items())
                            if k not in ("rank", "world_size"))
        meshes = state.plan.meshes
        boundary = ""     # the schedule the communicator runs at this mesh's cross-cluster boundary, if any
        after = meshes[p.mesh_index + 1] if p.mesh_index + 1 < len(meshes) else None
        if (after is not None and after.pipeline == p.pipeline and not after.alongside
                and after.cluster != p.cluster and state.plan.positions(p.pipeline)[p.position] == [p.mesh_index]):
            m = meshes[p.mesh_index]
            boundary = (f"; boundary to mesh {p.mesh_index + 1}: {m.boundary_schedule}"
                        + (f", depth {m.boundary_depth}" if m.boundary_schedule == "overlapped" else ""))
        where = f"pipeline {p.pipeline}, " if state.plan.num_pipelines > 1 else ""
        print(f"[hetauto] rank {p.rank}: {where}cluster {p.cluster} ({state.device_type}), mesh {p.mesh_index}, "
              f"stage {p.stage}, tp rank {p.tp_rank}, dp rank {p.dp_rank}{boundary}; arguments from the plan: "
              f"{changes}", flush=True)


# ---- process groups (megatron/mpu_globals.py fills parallel_state from them) ----------------------------

def _join_world(state: _State, args) -> None:
    """Join the one torch.distributed world that spans every cluster (launch contract): global rank =
    HETAUTO_RANK_OFFSET + RANK, rendezvous at HETAUTO_MASTER_ADDR/PORT when the clusters launch separately."""
    import torch.distributed as dist

    from ..runtime.rendezvous import init_distributed

    if dist.is_initialized():
        if dist.get_world_size() != state.plan.world_size or dist.get_rank() != state.ident.rank:
            raise InputError(f"torch.distributed is already initialised as rank {dist.get_rank()} of "
                             f"{dist.get_world_size()}, but the plan places this process as rank "
                             f"{state.ident.rank} of {state.plan.world_size}", file=state.plan_file, field="meshes",
                             fix="let --hetauto initialise torch.distributed (do not call init_process_group first)")
        return
    # Megatron-LM's NCCL flight recorder options, applied as its _initialize_distributed would (group_args.py)
    recorder = flight_recorder_env(args)
    os.environ.update(recorder)
    if recorder and state.ident.rank == 0:
        print("[hetauto] NCCL flight recorder: " + ", ".join(f"{k}={v}" for k, v in recorder.items()), flush=True)
    launch_identity.check_world_rendezvous(state.ident)
    store = None
    if os.environ.get("HETAUTO_MASTER_ADDR"):
        from . import world_store
        os.environ["MASTER_ADDR"] = os.environ["HETAUTO_MASTER_ADDR"]
        os.environ["MASTER_PORT"] = world_store.master_port()
        # torchrun tells its workers that its agent hosts the rendezvous store, so every worker would only
        # connect as a client. The global store is not any torchrun's: global rank 0 hosts it, and a cluster
        # whose launch is refused tells the others through it (world_store.py)
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        from ..runtime.ranks import describe_rank
        store = world_store.join(state.ident.rank, state.plan.world_size, os.environ["MASTER_ADDR"],
                                 int(os.environ["MASTER_PORT"]), state.timeout_s, file=state.plan_file,
                                 describe=lambda r: describe_rank(state.plan, r),
                                 plan=world_store.plan_digest(state.plan), timeout_from=state.timeout_from)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(state.ident.rank), str(state.plan.world_size)
    init_distributed(state.plan, state.ident.rank, state.plan.world_size, timeout_s=state.timeout_s,
                     dry_run=state.device_type == "cpu", file=state.plan_file, store=store,
                     timeout_from=state.timeout_from)


def pretrain_kwargs(args) -> dict:
    """The keyword arguments to add to `megatron.training.pretrain(...)`: {} without --hetauto; with it the
    plan's `p2p_communicator` and `pg_collection` and `skip_model_parallel_init=True`."""
    if not getattr(args, "hetauto", False):
        return {}
    state = _STATE
    if state is None:
        raise RuntimeError("hetauto_megatron.megatron.hook.pretrain_kwargs() needs the arguments parsed by "
                           "hook.parse_and_validate_args()")
    if state.context is None:
        from megatron.training.arguments import core_transformer_config_from_args

        from ..runtime import groups
        from ..runtime.communicator import HeteroP2PCommunicator

        # from the join on, this process holds the rendezvous store and gloo's groups: a refusal below (a rank
        # started twice, another plan or job) ends as a finished run does (exit_after_training), not through
        # interpreter finalisation, where a gloo or store thread aborted the rank after its paragraph (SIGABRT,
        # pytorch#190489) and torchrun reported a crash where the paragraph said exit 2
        _take_charge_of_exit(state.timeout_s)
        _join_world(state, args)
        # every cluster's launch runs the same job (iterations, intervals, optimizer): a difference would leave one
        # side waiting for the other until the timeout, or train another model (job_agreement.py)
        from .job_agreement import check_same_job
        check_same_job(args, state.plan, state.ident.rank, state.plan.world_size, file=state.plan_file,
                       timeout_s=state.timeout_s)
        ctx = groups.build_groups(state.plan, state.ident.rank, state.plan.world_size, timeout_s=state.timeout_s,
                                  dry_run=state.device_type == "cpu", host_dp_copies=True)
        from ..runtime.liveness import Liveness
        # every rank's listener address, learnt now while every rank is there (runtime/liveness.py)
        state.liveness = Liveness.start(ctx)
        populate_parallel_state(ctx.pg, ctx.dp_gloo)
        groups.set_megatron_globals(ctx)
        state.context = ctx
        state.communicator = HeteroP2PCommunicator(ctx, core_transformer_config_from_args(args),
                                                   timeout_s=state.timeout_s)
        install_gradient_rules(state)
    return {"p2p_communicator": state.communicator, "pg_collection": state.context.pg,
            "skip_model_parallel_init": True}


def _take_charge_of_exit(timeout_s: float) -> None:
    """This process's groups are the hook's (--hetauto) or gloo's on CPU: destroy them at a clean exit
    (runtime/clean_exit.py `destroy_groups_at_exit`), and end the process right after training
    (`script_guard.exit_after_training`), also after Megatron's early exits (`ending_cleanly`)."""
    take_charge_of_exit(timeout_s)
    # pretrain() calls train() by its module's name; parsing Megatron's arguments imported that module
    training = sys.modules.get("megatron.training.training")
    if training is not None and not getattr(training.train, "_hetauto_ends_cleanly", False):
        training.train = ending_cleanly(training.train)
