"""Every cluster's launch runs the same job: the Megatron arguments that are not in the plan but that every rank must
share, checked once after the world is joined (collective over the default group, gloo, the world's timeout).

The plan fixes the layout (runtime/rendezvous.py check_same_plan), but each cluster types its own job arguments after
the launch script's name. These must agree on every rank:
- the schedule of collectives: iterations, evaluation and checkpoint intervals, exits. A cluster launched with
  `--train-iters 6` beside one with 4 trained 4 iterations together, then each side waited the whole
  HETAUTO_TIMEOUT_S (600 s by default) for the other, in a pipeline receive on one side and Megatron's closing
  barrier on the other, and both stopped with exit 1 and a transport traceback ("that process is gone or stuck");
  an evaluation every 2 iterations on one cluster only did the same at iteration 2;
- the collectives over the world Megatron-LM adds to iterations (COLLECTIVE_ARGS): a flag given on one cluster only
  leaves the others out of that collective, and each side waits for the other until the timeout (--log-params-norm
  or --exit-signal-handler on one cluster: exit 4 after HETAUTO_TIMEOUT_S, naming a collective, not the flag;
  --log-interval 1 beside 2: one cluster trained to the end, the other stopped in a timer's barrier);
- the optimizer's numbers: each stage would step its layers with another learning rate, clipping or decay, a model
  the job never meant to train, without any error;
- the samples drawn: a pipeline's first stage reads the tokens and its last stage the labels of the same samples,
  and each pipeline its share of one sequence of samples, each rank drawing it from the launch's data arguments.
  A --seed, --split or blend typed otherwise on one cluster (or mock data beside real data) trained on tokens and
  labels of different samples, without any error. The prefixes' paths may differ (each machine's own), not their
  number nor their weights;
- the checkpoint resumed from: a cluster whose --load holds no checkpoint (its copy left out) beside one that
  resumes at iteration N started from random weights at iteration 0, and the two ran different iterations, as with
  another --train-iters; so do --finetune, --no-load-optim and --no-load-rng;
- how long a rank waits for the others (timeouts.py: --distributed-timeout-minutes, else HETAUTO_TIMEOUT_S): each
  rank bounds its own waits, so a cluster given 60 minutes for a long index build or checkpoint load beside one left
  at 10 stopped at 10, in a collective the slow cluster had not reached yet.
A difference stops every rank with the same paragraph (exit 2) naming each flag and what each cluster gave.

So does another Megatron-Core, compared first: each cluster's machines have their own install, and a cluster left on
another Megatron-Core (another model initialisation, schedule or optimizer) beside the others' would train another
model or hang, with nothing to say why. (hetauto-megatron's own code is compared earlier: as each rank reaches the
world store's rendezvous, megatron/world_store.py, and with the plan, runtime/rendezvous.py check_same_plan.)
"""
from __future__ import annotations

from ..errors import InputError
from ..runtime.ranks import describe_rank
from .checkpoint_plan import loaded_from, tracker_text

# Megatron argument names (args.<name>), spelled as flags in the message
SCHEDULE_ARGS = ("train_iters", "train_samples", "skip_train", "eval_interval", "eval_iters", "save_interval",
                 "exit_interval", "exit_duration_in_mins", "ckpt_step")
OPTIMIZER_ARGS = ("optimizer", "lr", "min_lr", "lr_decay_style", "lr_decay_iters", "lr_decay_samples",
                  "lr_warmup_iters", "lr_warmup_samples", "lr_warmup_fraction", "weight_decay", "clip_grad",
                  "adam_beta1", "adam_beta2", "adam_eps", "sgd_momentum")
DATA_ARGS = ("seed", "mock_data", "split", "data_path", "dataloader_type", "reset_position_ids", "reset_attention_mask",
             "eod_mask_loss")
# "load": the checkpoint the rank resumes from (loaded_checkpoint), derived from --load, its tracker and
# --pretrained-checkpoint
CHECKPOINT_ARGS = ("load", "finetune", "no_load_optim", "no_load_rng")
# "distributed_timeout_minutes": the seconds every wait between ranks takes at most (timeouts.job_timeout_s: the flag,
# else HETAUTO_TIMEOUT_S), given by the hook
# What adds a collective over the world to iterations, besides the iteration's own (Megatron-LM 0.19's training.py):
# each logging iteration's barrier (the interval timer), with --timing-log-level 1 or more the timers' all-gather, and
# another with --log-timers-to-tensorboard; unpriced.PER_ITERATION_WORLD's (the exit's time limit is a schedule
# argument above; the zero count's all-reduce over the gradient-statistics group, the world under --hetauto,
# runtime/gradients.py); the result check's all-reduce (--rerun-mode disabled has none); the straggler detector's
# report; the energy monitor's all-reduce over the world (core/energy_monitor.py lap, each logging iteration where
# NVML is installed, as on NVIDIA's machines, and get_total at the end: not every iteration, so not in
# PER_ITERATION_WORLD, like the interval timer's barrier); the barriers of the DP weight-hash check, the GPU sniff
# test and the autoresume check
COLLECTIVE_ARGS = ("log_interval", "timing_log_level", "log_timers_to_tensorboard", "log_params_norm",
                   "exit_signal_handler", "rerun_mode", "log_num_zeros_in_grad", "log_straggler", "log_energy",
                   "check_weight_hash_across_dp_replicas_interval", "gpu_sniff_test_interval", "adlr_autoresume",
                   "adlr_autoresume_interval")
JOB_ARGS = (SCHEDULE_ARGS + COLLECTIVE_ARGS + OPTIMIZER_ARGS + DATA_ARGS + CHECKPOINT_ARGS +
            ("distributed_timeout_minutes",))


def job_values(args, timeout_s: float | None = None) -> dict:
    """This rank's job arguments, as comparable text (absent ones left out); of --data-path, the blend's number of
    prefixes and their weights; `timeout_s`, this rank's wait for the others (timeouts.py), as seconds."""
    values = {name: repr(getattr(args, name)) for name in JOB_ARGS if hasattr(args, name)}
    if getattr(args, "data_path", None):
        values["data_path"] = _blend(args.data_path)
    values["load"] = loaded_checkpoint(args)
    values.pop("distributed_timeout_minutes", None)
    if timeout_s is not None:
        values["distributed_timeout_minutes"] = f"{timeout_s:g} s"
    return values


def loaded_checkpoint(args) -> str:
    """What the rank resumes from, as Megatron-LM decides it (checkpoint_plan.loaded_from, then its
    _load_base_checkpoint: --ckpt-step, else the tracker's iteration; no tracker and no --ckpt-step: nothing). Not
    the paths, each machine's own."""
    found = loaded_from(args)
    if found is None:
        return "no checkpoint"
    directory, flag = found
    step = getattr(args, "ckpt_step", None)
    if step:
        return f"iteration {step} of {flag}"
    text = tracker_text(directory)
    if text is None:
        return "no checkpoint"
    return f"iteration {text} of {flag}" if text.isdecimal() else f"{text!r} of {flag}"


def blend_of(data_path: list) -> tuple[int, list[float] | None]:
    """(number of prefixes, their weights or None) as Megatron-Core reads --data-path (core/datasets/utils.py
    get_blend_from_list: a weight before each prefix where the count is even and every other item is a number,
    else prefixes only). Read here without importing Megatron-Core, which a rank may not have loaded yet."""
    items = list(data_path)
    if len(items) % 2 == 0:
        try:
            return len(items) // 2, [float(w) for w in items[0::2]]
        except ValueError:
            pass
    return len(items), None


def _blend(data_path: list) -> str:
    """'2 prefixes weighted [0.3, 0.7]' (blend_of)."""
    count, weights = blend_of(data_path)
    return f"{count} prefix{'es' if count > 1 else ''}" + (f" weighted {weights}" if weights else "")


def software_values() -> dict:
    """What this rank runs that every rank must share besides hetauto-megatron's code (compared with the plan,
    runtime/rendezvous.py check_same_plan): Megatron-Core's version."""
    from .versions import megatron_core_version
    return {"megatron-core": megatron_core_version()}


SOFTWARE = ("megatron-core",)


def differences(plan, every: list, names=JOB_ARGS, label=lambda name: f"--{name.replace('_', '-')}") -> list[str]:
    """'--train-iters: 4 on rank 0 (cluster a, stage 0), 6 on rank 1 (cluster b, stage 1)' for each of `names`
    (Megatron arguments by default, spelled as flags by `label`) where some rank differs from rank 0 (the first
    such rank is named)."""
    out = []
    for name in names:
        first = every[0].get(name)
        other = next((r for r, values in enumerate(every) if values.get(name) != first), None)
        if other is not None:
            out.append(f"{label(name)}: {first} on {describe_rank(plan, 0)}, "
                       f"{every[other].get(name)} on {describe_rank(plan, other)}")
    return out


def check_same_job(args, plan, rank: int, world_size: int, *, file: str | None = None,
                   timeout_s: float | None = None) -> None:
    """InputError (exit 2, the same paragraph on every rank) when the ranks' job arguments differ (with `timeout_s`,
    this rank's wait for the others, too)."""
    import torch.distributed as dist

    every = [None] * world_size
    dist.all_gather_object(every, {"job": job_values(args, timeout_s), "software": software_values()})
    software = differences(plan, [e["software"] for e in every], SOFTWARE, label=str)
    if software:
        raise InputError(f"the clusters run different software, which every rank must share (this process is rank "
                         f"{rank}): {'; '.join(software)}", file=file, field=software[0].split(":")[0],
                         fix="install the same megatron-core on every cluster's machines ('pip show megatron-core' "
                             "prints its version)")
    found = differences(plan, [e["job"] for e in every])
    if found:
        shown = "; ".join(found[:6]) + (f"; and {len(found) - 6} more" if len(found) > 6 else "")
        raise InputError(f"the clusters' launches were given different job arguments, which every rank must share "
                         f"(this process is rank {rank}): {shown}", file=file, field=found[0].split(":")[0],
                         fix="give every cluster's launch the same job arguments after the script's name (the "
                             "iterations, evaluation, checkpoint and exit intervals, the logging and checks that span "
                             "every rank (--log-interval, --log-params-norm, ...), the optimizer's settings, the "
                             "data's seed, split and blend, the checkpoint to resume from, the wait for the others: "
                             "--distributed-timeout-minutes, else HETAUTO_TIMEOUT_S in the launch's environment)")
