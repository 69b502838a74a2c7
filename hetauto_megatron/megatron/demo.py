"""Run the tiny `--hetauto` Megatron-LM training end to end on local CPU processes and print its losses.

    python -m hetauto_megatron.megatron.demo [--plan examples/llama/plans/tiny-2clusters-cpu.yaml] [--iters 3]

Runs examples/llama/pretrain_llama_hetauto.py through `megatron.training.pretrain` twice:
1. with `--hetauto --hetauto-plan PLAN`: one process per device of the plan (its meshes, TP/DP degrees,
   layer split and inter-cluster transfers; the default plan's stages are uneven, 3 | 2 | 3 layers), and
2. without --hetauto, as Megatron's own homogeneous layout with the same pipeline stages (TP 1, DP 1,
   PP = the plan's stages, the same --pipeline-model-parallel-layout): Megatron seeds each stage by its
   pipeline rank and --use-cpu-initialization draws full weights before TP slicing, so both start from the
   same weights and must produce the same losses;
and prints both loss curves and the largest difference. Processes are forked after one import (much cheaper
than torchrun on a small machine); Megatron's own log of each run goes to a file unless --verbose.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

from ..emit.megatron import model_args, pipeline_args
from ..errors import InputError
from ..plan.layout import PipelineLayout
from ..plan.megatron_flags import layer_args
from ..plan.plan import Plan, load_plan
from ..runtime.launcher import LaunchError

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRY_SCRIPT = os.path.join(_ROOT, "examples", "llama", "pretrain_llama_hetauto.py")
DEFAULT_PLAN = os.path.join(_ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")

# Megatron-LM flags for a CPU run that is comparable across layouts (docs/megatron-integration.md): no dropout,
# weights drawn in full on the CPU (so every layout starts from the same numbers), no data-loader workers ...
CPU_RUN_FLAGS = [
    "--attention-dropout", "0", "--hidden-dropout", "0", "--use-cpu-initialization",
    "--num-workers", "0", "--no-create-attention-mask-in-dataloader",
]
# ... and, for Megatron's own run (no --hetauto), the local (non-Transformer-Engine) layer spec without fused kernels
# and fp32, which a CPU mesh's launch script carries and the --hetauto hook sets on CPU ranks that lack them
# (plan/megatron_flags.py CPU_LAYER_ARGS). `--transformer-impl local` alone selects the local spec; NVIDIA's
# pretrain_gpt.py fails on `--spec local` (and Megatron accepts `--attention-backend local` only together with it).
CPU_FLAGS = [*layer_args("cpu"), *CPU_RUN_FLAGS]


def model_flags(plan: Plan) -> list[str]:
    """Megatron's model arguments for the plan's model: the launch scripts' own, plus the vocabulary that the
    mock data and NullTokenizer need (the --hetauto run pads it as the plan did: Plan.padded_vocab_size)."""
    return model_args(plan) + ["--vocab-size", str(plan.model.vocab_size)]


def reference_vocab_flags(plan: Plan) -> list[str]:
    """The padding that makes Megatron's TP 1 reference build the plan's padded vocabulary, the table every mesh
    of the --hetauto run builds (Megatron pads to a multiple of the divisor x TP)."""
    return ["--make-vocab-size-divisible-by", str(plan.padded_vocab_size)]


def training_flags(iters: int, seed: int) -> list[str]:
    return ["--tokenizer-type", "NullTokenizer", "--mock-data", "--train-iters", str(iters), "--lr", "1e-3",
            "--min-lr", "1e-3", "--lr-decay-style", "constant", "--log-interval", "1", "--eval-iters", "0",
            "--eval-interval", str(max(1000, iters + 1)), "--seed", str(seed), "--distributed-backend", "gloo"]


def hetauto_argv(plan_path: str, plan: Plan, *, iters: int, seed: int) -> list[str]:
    """The command line of the --hetauto run (TP, DP, micro-batch, layout come from the plan: a layout flag
    typed must be the plan's, rewrite.check_layout_args, so none is; so do a CPU rank's layers)."""
    return (model_flags(plan) + training_flags(iters, seed) + CPU_RUN_FLAGS +
            ["--global-batch-size", str(plan.global_batch_size), "--hetauto", "--hetauto-plan", plan_path])


def reference_argv(plan: Plan, *, iters: int, seed: int) -> tuple[list[str], int]:
    """Megatron's homogeneous layout with the plan's pipeline stages: TP 1, DP 1, one process per stage. With
    several pipelines (or meshes side by side): pipeline 0's stages, whose weights every pipeline starts from
    (the first holder's, replica_weights.ReplicaWeights), training the whole global batch as one micro-batch."""
    step = plan.samples_per_step if plan.is_simple else plan.global_batch_size
    argv = (model_flags(plan) + reference_vocab_flags(plan) + training_flags(iters, seed) + CPU_FLAGS +
            pipeline_args(plan, 0) +
            ["--micro-batch-size", str(step), "--global-batch-size", str(plan.global_batch_size)])
    return argv, PipelineLayout(plan, 0).num_stages


def _rank_main(rank: int, world_size: int, script: str, argv: list, log_dir: str | None) -> dict:
    """One forked rank: run the entry script's main() with `argv`, recording each iteration's reduced loss."""
    import runpy

    if log_dir:
        fd = os.open(os.path.join(log_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        # Python-level streams too: a caller may have replaced sys.stdout (pytest's capture does)
        sys.stdout = sys.stderr = open(fd, "w", buffering=1)
    import megatron.training.training as training

    losses, grad_norms, zeros = [], [], []
    original_train = training.train

    def train(*args, **kwargs):
        # wrap train_step as the loop will call it: after the --hetauto hook's own wrapping (which, for a plan of
        # several pipelines, turns each pipeline's loss into the whole batch's)
        inner = training.train_step

        def train_step(*a, **kw):
            out = inner(*a, **kw)
            loss_dict, grad_norm = out[0], out[5]
            if loss_dict and "lm loss" in loss_dict:
                losses.append(float(loss_dict["lm loss"]))
            if grad_norm is not None:
                grad_norms.append(float(grad_norm))
            if out[6] is not None:      # --log-num-zeros-in-grad
                zeros.append(float(out[6]))
            return out

        training.train_step = train_step
        try:
            return original_train(*args, **kwargs)
        finally:
            training.train_step = inner

    training.train = train
    sys.argv = [script] + list(argv)
    entry = runpy.run_path(script, run_name="hetauto_entry")
    entry["main"]()
    from . import hook

    state = hook.current_plan_state()
    comm = getattr(state, "communicator", None) if state else None
    return {"losses": losses, "grad_norms": grad_norms, "num_zeros": zeros,
            "bytes": dict(getattr(comm, "bytes_sent", {}) or {})}


def run_entry(argv: list[str], world_size: int, *, script: str = ENTRY_SCRIPT, timeout_s: float = 300.0,
              log_dir: str | None = None) -> list[dict]:
    """Run the entry script on `world_size` forked CPU processes; each rank's losses, grad norms, bytes."""
    import megatron.training.training  # noqa: F401  (imported once, before the fork)

    from ..runtime.launcher import launch

    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return launch(_rank_main, world_size, args=(script, list(argv), log_dir), timeout_s=timeout_s, env=env)


def last_rank_losses(results: list[dict]) -> list[float]:
    return results[-1]["losses"]


def run_tiny(plan_path: str = DEFAULT_PLAN, *, iters: int = 3, seed: int = 1234, reference: bool = True,
             verbose: bool = False, timeout_s: float = 300.0, out=print, log_dir: str | None = None) -> dict:
    """The demo: the --hetauto run of `plan_path` (CPU meshes only) and, with reference=True, Megatron's
    homogeneous run with the same stages; Megatron's logs in `log_dir` (a new temporary folder where None; none
    with `verbose`). Returns {"hetauto": [...], "reference": [...], "max_abs_diff": x, "bytes": {...},
    "log_dir": path}."""
    if iters < 1:   # checked before any process starts (Megatron would refuse it in every rank)
        raise InputError(f"must be at least 1, got {iters}", field="--iters",
                         fix="give the training iterations of each run, e.g. --iters 3")
    plan = load_plan(plan_path)
    non_cpu = sorted({m.device_type for m in plan.meshes if m.device_type != "cpu"})
    if non_cpu:
        raise InputError(f"this local demo runs CPU meshes only; the plan uses {', '.join(non_cpu)}", file=plan_path,
                         field="meshes[*].device_type",
                         fix="use a CPU plan such as examples/llama/plans/tiny-2clusters-cpu.yaml, or 'hetauto "
                             "dryrun --plan PLAN --tiny' to dry-run any plan's layout on CPU")
    if verbose:
        log_dir = None
    elif log_dir is None:
        log_dir = tempfile.mkdtemp(prefix="hetauto-megatron-")
    het_logs = os.path.join(log_dir, "hetauto") if log_dir else None
    if het_logs:
        os.makedirs(het_logs, exist_ok=True)
    het = run_entry(hetauto_argv(plan_path, plan, iters=iters, seed=seed), plan.world_size, timeout_s=timeout_s,
                    log_dir=het_logs)
    result = {"hetauto": last_rank_losses(het), "bytes": {}, "log_dir": log_dir}
    for r in het:
        for k, v in r["bytes"].items():
            result["bytes"][k] = result["bytes"].get(k, 0) + v
    out(f"--hetauto run ({plan.world_size} CPU processes, {len(plan.meshes)} meshes): "
        + ", ".join(f"{x:.6f}" for x in result["hetauto"]))
    if reference:
        ref_logs = os.path.join(log_dir, "reference") if log_dir else None
        if ref_logs:
            os.makedirs(ref_logs, exist_ok=True)
        argv, world = reference_argv(plan, iters=iters, seed=seed)
        ref = run_entry(argv, world, timeout_s=timeout_s, log_dir=ref_logs)
        result["reference"] = last_rank_losses(ref)
        diffs = [abs(a - b) for a, b in zip(result["hetauto"], result["reference"])]
        # NaN where a loss is not finite (max() let a NaN after the first pass as agreement)
        result["max_abs_diff"] = max(diffs) if diffs and all(map(math.isfinite, diffs)) else float("nan")
        out(f"reference (Megatron TP1 x PP{world}, {'same' if plan.is_simple else 'pipeline 0' + chr(39) + 's'} stages):  "
            + ", ".join(f"{x:.6f}" for x in result["reference"]))
        out(f"max |loss difference| = {result['max_abs_diff']:.2e}")
    if log_dir:
        out(f"Megatron logs: {log_dir}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetauto_megatron.megatron.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", default=DEFAULT_PLAN, help="a plan whose meshes are all device_type cpu (default: "
                                                             "examples/llama/plans/tiny-2clusters-cpu.yaml)")
    parser.add_argument("--iters", type=int, default=3, help="training iterations of each run (default 3)")
    parser.add_argument("--seed", type=int, default=1234, help="Megatron's --seed for both runs (default 1234)")
    parser.add_argument("--no-reference", action="store_true", help="skip Megatron's homogeneous run")
    parser.add_argument("--verbose", action="store_true", help="show Megatron's own log instead of a log file")
    parser.add_argument("--log-dir", metavar="DIR", help="where Megatron's logs go (default: a new temporary folder)")
    args = parser.parse_args(argv)
    try:
        result = run_tiny(args.plan, iters=args.iters, seed=args.seed, reference=not args.no_reference,
                          verbose=args.verbose, log_dir=args.log_dir)
    except InputError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except LaunchError as exc:      # a rank failed: its log says why, no traceback of this process adds to it
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if "max_abs_diff" in result and not result["max_abs_diff"] <= 1e-5:
        print("the --hetauto losses differ from the reference by more than 1e-5", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
