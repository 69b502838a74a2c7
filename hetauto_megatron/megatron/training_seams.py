"""Megatron-LM's training loop under --hetauto, once the plan's groups exist: what the hook wraps in
`megatron.training.training` (each wrapper marked `_hetauto`, so a second install is a no-op).

- `install_gradient_rules`: every holder of a shared parameter starts from its first holder's weights, the
  runtime's finalize-grads function and the once-per-parameter gradient norm (runtime/gradients.py,
  runtime/replica_sync.py), and the two below; under a plan of several pipelines or meshes side by side, each
  replica's share of the batch (plan_data.py); the parameter norm Megatron-LM logs with --log-params-norm
  counted as the gradient norm counts it (gradients.params_norm_once);
- `install_step_bounds`: each schedule run bracketed by the communicator's begin_step / end_step;
- `install_checkpoint_record`: the plan layout a checkpoint was saved under, written beside it;
- `install_checkpoint_load_check`: a rank that cannot load a checkpoint stops with one paragraph, not exit code 0;
- `install_job_statistics`: the step's statistics, which every rank already holds for the whole job, not reduced
  again over the world each iteration.

`state` is the hook's per-process record (hook._State: the plan, its file, the built context and communicator).
"""
from __future__ import annotations

import functools

from . import checkpoint_plan


def install_gradient_rules(state) -> None:
    """Once Megatron has built the model, before the optimizer copies its parameters: every holder of a shared
    parameter gets its first holder's values, so the tied output layer gets the first stage's embeddings
    (Megatron's own copy needs an embedding group, which a plan spanning TP sizes has not). After model and
    optimizer: the runtime's finalize-grads function on the model config (training.train keeps a finalize
    function that is already set) and the once-per-parameter global norm."""
    import megatron.training.training as training
    from megatron.core.utils import get_model_config

    from ..runtime import gradients

    original = training.setup_model_and_optimizer
    if getattr(original, "_hetauto", False):
        return
    original_get_optimizer = training.get_megatron_optimizer

    # Both of Megatron-LM's model paths (model_provider and the config builder NVIDIA's pretrain_gpt.py takes)
    # hand the built model to get_megatron_optimizer, which copies the parameters into the optimizer.
    ctx, counter = state.context, state.communicator.bytes_sent

    @functools.wraps(original_get_optimizer)
    def get_megatron_optimizer(config, model_chunks, *a, **kw):
        if ctx.replica_group is not None:
            # several mesh stages hold a parameter (the tied output layer, other pipelines, meshes side by side):
            # every holder starts from its first holder's weights (replica_weights.ReplicaWeights)
            from ..runtime.replica_weights import ReplicaWeights
            ReplicaWeights(ctx, model_chunks, counter=counter).copy(model_chunks)
        return original_get_optimizer(config, model_chunks, *a, **kw)

    training.get_megatron_optimizer = get_megatron_optimizer

    @functools.wraps(original)
    def setup_model_and_optimizer(*a, **kw):
        model, optimizer, scheduler = original(*a, **kw)
        replicas = None
        if ctx.replica_group is not None:
            # as the dry run (runtime/train.py): after each mesh's DP reduction, in finalize_model_grads, every
            # shared parameter's gradient (the tied table's too) is summed across its holders weighted by their
            # share of the batch
            from ..runtime.replica_sync import ReplicaSync
            replicas = ReplicaSync(ctx, model, counter=counter)
        get_model_config(model[0]).finalize_model_grads_func = gradients.make_finalize_model_grads(
            ctx, replicas)
        if optimizer is not None:
            gradients.count_grad_norm_once(optimizer, ctx, replicas)
            # --log-params-norm: each parameter once over every mesh, as the gradient norm counts them
            training.calc_params_l2_norm = lambda model, *a, **kw: gradients.params_norm_once(optimizer, ctx)
        return model, optimizer, scheduler

    setup_model_and_optimizer._hetauto = True
    training.setup_model_and_optimizer = setup_model_and_optimizer
    install_step_bounds(state)
    install_checkpoint_record(state)
    install_checkpoint_load_check()
    install_job_statistics(state)
    if not state.plan.is_simple:
        from .plan_data import install_plan_batches
        install_plan_batches(state)


def install_checkpoint_record(state) -> None:
    """After each checkpoint Megatron-LM's loop saves, the first rank of each cluster writes the plan layout it was
    saved under beside it (megatron/checkpoint_plan.py), which a later --load checks, and, on the clusters but
    global rank 0's, Megatron's tracker file, which only rank 0 writes: clusters in other sites rarely share a file
    system, and each cluster's ranks read their own shards, the record and the tracker from theirs."""
    import megatron.training.training as training
    import torch.distributed as dist
    from megatron.training import get_args

    from ..runtime.ranks import cluster_first_ranks

    original = training.save_checkpoint
    if getattr(original, "_hetauto", False):
        return
    writers = set(cluster_first_ranks(state.plan).values())

    @functools.wraps(original)
    def save_checkpoint(iteration, *a, **kw):
        out = original(iteration, *a, **kw)
        args = get_args()
        rank = dist.get_rank()
        if args.save and rank in writers:
            checkpoint_plan.write_record(state.plan, args.save, state.plan_file, iteration)
            if rank != 0 and not getattr(args, "async_save", False):   # an async save's tracker comes at its end
                checkpoint_plan.write_tracker(args.save, iteration)
        return out

    save_checkpoint._hetauto = True
    training.save_checkpoint = save_checkpoint


def install_checkpoint_load_check() -> None:
    """Megatron-LM loads a checkpoint in checkpointing.load_checkpoint, each rank its own shard of a `torch` one;
    where it cannot (the shard not on this machine or unreadable, a tracker that holds no iteration, an rng state
    that a checkpoint saved with --no-save-rng lacks, ...) it prints why, on this rank or on global rank 0 only, and
    calls sys.exit(): exit code 0 on that rank. Measured on the 2-cluster tiny plan with cluster-b's shard missing
    (machines that share no file system, a copy left out): cluster-b's ranks ended "successfully" while the others
    stopped in their next collective with gloo's "Connection closed by peer". Now that rank stops with one
    paragraph naming the flag it loads from (exit 2), which the other clusters learn from (world_store.py).
    --exit-on-missing-checkpoint's exit, which the launch asked for, stays."""
    import megatron.training.training as training

    original = training.load_checkpoint
    if getattr(original, "_hetauto", False):
        return

    @functools.wraps(original)
    def load_checkpoint(*a, **kw):
        try:
            return original(*a, **kw)
        except SystemExit as exc:
            from megatron.training import get_args
            args, found = get_args(), None
            if exc.code in (None, 0):
                found = checkpoint_plan.loaded_from(args)
            # Megatron's exit where the launch asked for it: no tracker, no --ckpt-step (_load_base_checkpoint)
            asked = found is not None and getattr(args, "exit_on_missing_checkpoint", False) and \
                not getattr(args, "ckpt_step", None) and checkpoint_plan.tracker_text(found[0]) is None
            if found is None or asked:
                raise
            raise _load_failure(found, args) from None

    load_checkpoint._hetauto = True
    training.load_checkpoint = load_checkpoint


def _load_failure(found: tuple[str, str], args):
    """The paragraph for a rank Megatron-LM's load_checkpoint ended, loading from `found` (checkpoint_plan.loaded_from:
    directory, flag)."""
    import os
    import socket

    import megatron.training.checkpointing as checkpointing

    from ..errors import InputError

    directory, flag = found
    where = f"on this machine ({socket.gethostname()})"
    text, step = checkpoint_plan.tracker_text(directory), getattr(args, "ckpt_step", None)
    if text is not None and text != "release" and not text.isdecimal() and not step:   # what int() reads ("²" is a digit it refuses)
        tracker = os.path.join(directory, checkpoint_plan.TRACKER)
        return InputError(f"{flag} {directory}: Megatron-LM's tracker {tracker} {where} holds {text[:40]!r}, not an "
                          "iteration, and Megatron-LM would have ended this rank with exit code 0", field=flag,
                          fix="write the checkpoint's iteration number (or release) in it, or give --ckpt-step N")
    iteration = checkpointing.get_loaded_iteration()
    shard = (checkpointing.get_checkpoint_name(directory, iteration, not step and text == "release",
                                               return_base_dir=False)
             if getattr(args, "ckpt_format", None) == "torch" and isinstance(iteration, int) and iteration >= 0
             else None)
    if shard and not os.path.exists(shard):
        what, fix = (f"this rank's shard of iteration {iteration}, {shard}, is not {where}",
                     "give each machine the checkpoint's iteration directory with the mp_rank_* shards of its ranks "
                     f"(each cluster's ranks save theirs where they run), or start without {flag}")
    else:
        what, fix = (f"Megatron-LM could not load this rank's checkpoint from it {where} (it printed why in this "
                     "rank's log, or in global rank 0's: e.g. \"Unable to load rng state\" for a checkpoint saved "
                     "with --no-save-rng)", "do as that log says (e.g. add --no-load-rng), or start without " + flag)
    return InputError(f"{flag} {directory}: {what}; Megatron-LM would have ended this rank with exit code 0",
                      field=flag, fix=fix)


def install_step_bounds(state) -> None:
    """Every schedule run of Megatron-LM's loop (training and evaluation) is bracketed by the communicator's
    begin_step / end_step, so overlapped cross-cluster boundaries post their receives ahead and complete their
    sends within the step (runtime/cross_link.py)."""
    import megatron.training.training as training

    original = training.get_forward_backward_func
    if getattr(original, "_hetauto", False):
        return
    comm = state.communicator

    @functools.wraps(original)
    def get_forward_backward_func(*a, **kw):
        run = original(*a, **kw)

        @functools.wraps(run)
        def bounded(*args, **kwargs):
            comm.begin_step(kwargs["num_microbatches"])
            out = run(*args, **kwargs)
            comm.end_step()
            return out
        return bounded

    get_forward_backward_func._hetauto = True
    training.get_forward_backward_func = get_forward_backward_func


def install_job_statistics(state) -> None:
    """Megatron-LM's loop reduces the step's statistics over the model-parallel group every iteration (train_step:
    whether the update succeeded, min, and the gradient norm, max, and the count of zero gradients when logged;
    training_log: the learning rate, max), as in Megatron a rank may hold only its part of them. Under --hetauto
    that group is the world's gloo group (runtime/groups.py `pg.mp`) and every rank holds the job's values
    already: the norm, and any inf or NaN that fails the update, come from one reduction over the world
    (runtime/gradients.py count_grad_norm_once, a contribution from every rank), the learning rate from the same
    schedule on every rank. Each of those reductions walked the world's ring again for nothing, three an
    iteration through every cluster's link (0.47 s each as priced in a world of all 16,384 devices of
    examples/gpt3), where the plan prices the norm's one (plan/tail_costs.py grad_norm_time). On that group they
    return the rank's own value, as Megatron's reduction would have rounded it (an fp32 or int32 tensor); on any
    other group Megatron's reduction runs."""
    import megatron.training.training as training

    import torch

    world = state.context.pg.mp
    # each reduction's result from the rank's own value: a bool as the int32 min gives it, a float as its fp32 max
    held = {"logical_and_across_model_parallel_group": lambda value: value is True,
            "reduce_max_stat_across_model_parallel_group":
                lambda value: None if value is None else torch.tensor([value], dtype=torch.float32).item()}
    for name, own in held.items():
        original = getattr(training, name)
        if not getattr(original, "_hetauto", False):
            setattr(training, name, _held_by_every_rank(original, own, world))


def _held_by_every_rank(reduce, own, world):
    """`reduce` (one of Megatron's model-parallel statistics reductions), giving `own(value)` without a collective
    when the group is `world`, whose ranks hold the same value (install_job_statistics)."""
    from megatron.core import parallel_state

    @functools.wraps(reduce)
    def local(value, group=None):
        if (group if group is not None else parallel_state.get_model_parallel_group()) is not world:
            return reduce(value, group=group)
        return own(value)

    local._hetauto = True
    return local
