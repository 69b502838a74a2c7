"""Dry run of a plan on local CPU processes, optionally against the single-process reference."""
from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time

from ..errors import InputError


def prepare_plan(plan, *, tiny: bool, distributed_optimizer: bool = True):
    """The plan the dry run executes: the same layout, the model shrunk when `tiny`; with
    `distributed_optimizer=False` every mesh runs the plain optimizer (and so no parameter all-gather to
    overlap), to compare with the production settings."""
    from .model import shrink_model

    if not distributed_optimizer:
        off = {"distributed_optimizer": False, "overlap_param_gather": False}
        plan = dataclasses.replace(plan, meshes=tuple(
            dataclasses.replace(m, setting_overrides={**dict(m.setting_overrides), **off}) for m in plan.meshes))
    if tiny:
        plan = dataclasses.replace(plan, model=shrink_model(plan.model, plan))
    return plan


def emulation_scale(plan, run_plan, inventory) -> float:
    """The factor on the inventory's link times that keeps, on this machine's CPU processes, the plan's ratio of
    link time to compute: the simulator's slowest-stage compute per micro-batch of the run (CPU devices, the
    model that runs, its ranks taking turns on this machine's cores as `validate-cost-model --dryrun` stretches
    them: cost/shared_cores.py) over that of the plan on its own inventory (for a plan made for CPU devices, the
    turns alone: 3 for 6 ranks on 2 cores). Without the turns the links ran that many times too fast next to the
    compute. `inventory`: the plan's as priced (the dry run's, read once)."""
    from ..cost.analytic import AnalyticCostModel
    from ..cost.shared_cores import SharedCoresCostModel, core_sharing_factor, usable_cores
    from ..plan.simulate import simulate
    from ..spec.inventory import inventory_from_dict

    def slowest(p, inv, cost_model=None) -> float:
        return max(s["forward_s"] + s["backward_s"] for s in simulate(p, inv, cost_model).stages)

    cpu = dict(plan.inventory)
    cpu["clusters"] = [{k: v for k, v in c.items() if k not in ("memory_gib", "peak_tflops", "hbm_gbps", "tf32")}
                       | {"device": "cpu"} for c in plan.inventory["clusters"]]
    # in fp32, as CPU processes train whatever the plan says (Plan.mesh_precision): a cpu device has no fp8
    cpu_plan = dataclasses.replace(run_plan, meshes=tuple(dataclasses.replace(m, device_type="cpu")
                                                          for m in run_plan.meshes), inventory=cpu, precision="fp32")
    turns = SharedCoresCostModel(AnalyticCostModel(), core_sharing_factor(run_plan.world_size, usable_cores()))
    return slowest(cpu_plan, inventory_from_dict(cpu), turns) / slowest(plan, inventory)


def run_dryrun(plan, *, steps: int, seed: int, tiny: bool, reference: bool, timeout_s: float = 120.0,
               distributed_optimizer: bool = True, emulate_links: float | None = None,
               timeout_flag: str | None = None) -> dict:
    """Train `steps` steps of `plan` on CPU (one forked process per device) and report. `timeout_flag`: the
    option that set `timeout_s` (a rendezvous that times out names it).

    Returns {"model", "padded_vocab_size", "steps": [{"loss", "grad_norm"}], "step_times_s", "iteration_s",
    "bytes": {"intra_cluster", "inter_cluster", "between": {"A->B": bytes}}, "settings", "cores", "seconds", "shared_digests"} plus "reference",
    "max_abs_diff" and "parity" (`parity`) when
    `reference`, or {"error": text} when a rank failed. "step_times_s" is each step's wall time on the slowest
    rank; "iteration_s" their median over the steps after the first (the first pays for allocation and
    warm-up), or the first step's time when there is only one. "model" is the shape the ranks ran (the shrunk
    one under `tiny`), "cores" the CPU cores the ranks shared: what a prediction of the measured time must use
    (`hetauto validate-cost-model --dryrun`). "settings" lists per mesh {"cluster", "tp", "dp", and the runtime
    settings (plan/settings.py keys) as Megatron built them on that mesh's ranks}. "ops" has every rank's
    per-operation stamps of every step (runtime/op_timing.py), for measured timelines. "exposed_s" has, per
    rank, the seconds of each step it waited on cross-cluster transfers (not on its peers' compute; with
    `emulate_links`, the holds of the holders' exchange included).
    "shared_digests": per parameter that several mesh stages hold, per holder, the digest of its copy after the
    last step (`shared_digests`).
    `emulate_links`: cross-cluster transfers run at the plan inventory's link bandwidth and latency with their
    time multiplied by this scale (runtime/cross_link.py).
    Raises InputError for a plan the launch rejects, and (with `timeout_flag`) for ranks that stopped on waits
    past `timeout_s` (`waits_timed_out`): one paragraph naming the flag whichever wait ran out first.
    """
    t0 = time.perf_counter()
    run_plan = prepare_plan(plan, tiny=tiny, distributed_optimizer=distributed_optimizer)
    check_host_memory(run_plan, tiny=tiny)
    preload_megatron()
    from ..cost.shared_cores import usable_cores
    from .launcher import LaunchError, launch
    from .train import reference_plan, train_rank

    launch_timeout = timeout_s * 4 + 60 * steps
    try:
        results = launch(train_rank, run_plan.world_size, args=(run_plan, steps, seed, timeout_s, True, None,
                                                                emulate_links, timeout_flag),
                         timeout_s=launch_timeout, grace_s=timeout_s + 10, drop_lines=NATIVE_LOG_LINE)
        ref = None
        if reference:
            # the reference builds the plan's padded vocabulary, not the one its single TP-1 mesh would pad to
            ref = launch(train_rank, 1, args=(reference_plan(run_plan), steps, seed, timeout_s, True,
                                              run_plan.padded_vocab_size, None, timeout_flag),
                         timeout_s=launch_timeout, drop_lines=NATIVE_LOG_LINE)[0]
    except InputError as exc:
        if timeout_flag and exc.field == timeout_flag:      # the ranks could not connect in time
            raise wait_timeout_error(timeout_s, timeout_flag, emulate_links) from None
        raise
    except LaunchError as exc:
        if timeout_flag and waits_timed_out(exc.failures):
            raise wait_timeout_error(timeout_s, timeout_flag, emulate_links, first_timeout(exc.failures)) from None
        return {"error": str(exc)}
    first = results[0]
    report = {
        "model": run_plan.model.to_dict(),
        "padded_vocab_size": run_plan.padded_vocab_size,
        "steps": [{"loss": l, "grad_norm": g} for l, g in zip(first["losses"], first["grad_norms"])],
        "bytes": {**{k: sum(r["bytes"].get(k, 0) for r in results) for k in ("intra_cluster", "inter_cluster")},
                  # per direction of each link between clusters: "A->B"
                  "between": {k[len("between "):]: sum(r["bytes"].get(k, 0) for r in results)
                              for k in sorted({k for r in results for k in r["bytes"] if k.startswith("between ")})}},
        "settings": mesh_settings(run_plan, results),
        "cores": usable_cores(),
    }
    step_times = [max(ts) for ts in zip(*(r["step_times"] for r in results))]
    report["step_times_s"] = step_times
    report["memory"] = memory_report(run_plan, results)
    report["ops"] = [r["ops"] for r in results]     # per rank, per step: op_timing.OpClock.steps
    report["exposed_s"] = [r["exposed_s"] for r in results]
    report["iteration_s"] = statistics.median(step_times[1:] or step_times)
    report["shared_digests"] = shared_digests(results)
    if ref is not None:
        report["reference"] = [{"loss": l, "grad_norm": g} for l, g in zip(ref["losses"], ref["grad_norms"])]
        report["max_abs_diff"] = max_abs_diff(report["steps"], report["reference"])
        report["parity"] = parity(report["steps"], report["reference"])
    report["seconds"] = time.perf_counter() - t0
    return report


# gloo's own log lines (its file and line in brackets: "[.../gloo/transport/tcp/debug_logger.cc:9] ERROR failed to
# connect, willRetry=1, ..."), and torch's c10d ones where a user's TORCH_CPP_LOG_LEVEL lets them through: each
# rank writes them to stderr before its failure comes back as one paragraph
NATIVE_LOG_LINE = re.compile(rb"^(\[rank\d+\]:)?\[[^\]\n]*(gloo|c10d|ProcessGroup|TCPStore)[^\]\n]*\]")
# a failure that a peer giving up on its wait causes in the ranks still waiting on it
# (not a rank still running well after the others gave up, which the launch kills: that one is stuck, and a larger
# timeout would only wait longer for it)
_KNOCK_ON = ("connection closed by peer", "connection reset by peer", "broken pipe", "went away first")


def waits_timed_out(failures: dict[int, str]) -> bool:
    """Whether a failed launch's ranks (rank -> reason) stopped on waits past their timeout and nothing else: a
    rank's wait timed out, and every other failure is a timeout too or what one causes in its peers. With a short
    timeout which wait runs out first (connecting, building a group, a transfer, a collective) varies from run to
    run; a rank that died or failed otherwise keeps the launch's own report."""
    return (any(_timed_out(t) for t in failures.values())
            and all(_timed_out(t) or any(w in t.lower() for w in _KNOCK_ON) for t in failures.values()))


def _timed_out(text: str) -> bool:
    text = text.lower().replace("launch timeout", "")      # (the whole launch's deadline: a hang)
    return "timed out" in text or "timeout" in text


def first_timeout(failures: dict[int, str]) -> str | None:
    """'rank R: its report' of the lowest rank whose wait timed out (its first line, shortened): where this run's
    wait ran out, which the one paragraph keeps."""
    rank = min((r for r, t in failures.items() if _timed_out(t)), default=None)
    if rank is None:
        return None
    line = failures[rank].strip().splitlines()[0] if failures[rank].strip() else ""
    return f"rank {rank}: {line[:240] + ('...' if len(line) > 240 else '')}"


def wait_timeout_error(timeout_s: float, flag: str, emulate_links: float | None,
                       first: str | None = None) -> InputError:
    """The one paragraph of a dry run whose waits ran past `flag`, whichever wait ran out first (`first`: where it
    did this time, when known)."""
    return InputError(
        f"a wait between the ranks ran past {flag} {timeout_s:g} s (every wait counts: the ranks connecting, "
        "building their groups, each step's transfers and collectives; which one runs out first varies from run "
        "to run" + (f"; this time {first}" if first else "") + ")", field=flag,
        fix=f"give a larger {flag} (default 120; on a slow or busy machine the ranks take seconds to connect)"
        + (f"; with --emulate-links {emulate_links:g} a rank also waits on peers that wait on the slowed links, so "
           "a smaller scale helps too" if emulate_links and emulate_links > 1 else ""))


# How close the plan's run must be to the one-process reference (--reference). Losses: fp32 sums of the same
# terms in another order, 1e-5 absolute. Grad norms, relative: Megatron's optimizer computes the norm in fp32
# (torch.norm of each tensor, then of those norms), and the reference takes each whole tensor where the plan's
# ranks take their shards: on the 2-layer-wide cpu-small model at TP 2 the gradients agreed to 7e-9 (their
# squares summed in float64) while the two norms the optimizers reported differed by 1.1e-5 relative, each 1e-5
# to 3e-5 from the exact one: 1e-4 leaves that rounding room (a weight matrix counted twice or left out moves the
# norm by 1e-2 and more there; the tests hold the --tiny runs, whose tensors are small, to 1e-5 absolute).
LOSS_TOLERANCE = 1e-5
GRAD_NORM_TOLERANCE = 1e-4


def max_abs_diff(steps: list[dict], reference: list[dict]) -> float | None:
    """The largest absolute difference of a step's loss or grad norm from the reference's; None (JSON's null: it
    has no NaN) where a figure is not finite, which max() let pass as agreement after the first step."""
    diffs = [abs(a[k] - b[k]) for a, b in zip(steps, reference) for k in ("loss", "grad_norm")]
    return max(diffs) if diffs and all(map(math.isfinite, diffs)) else None


def parity(steps: list[dict], reference: list[dict]) -> dict:
    """{"loss_max_abs_diff", "grad_norm_max_rel_diff", "finite", "ok"} of the plan's steps against the
    reference's. A grad norm below 0.1 (LOSS_TOLERANCE / GRAD_NORM_TOLERANCE) may also match within LOSS_TOLERANCE
    absolute, where 1e-4 of it is below the losses' rounding; a figure that is not finite fails ("finite": false;
    max() let a NaN after the first step pass), and a difference that is not a number is reported as null."""
    pairs = list(zip(steps, reference))
    finite = all(math.isfinite(x[k]) for a, b in pairs for x in (a, b) for k in ("loss", "grad_norm"))
    small = LOSS_TOLERANCE / GRAD_NORM_TOLERANCE
    loss = max(abs(a["loss"] - b["loss"]) for a, b in pairs)
    rel = [abs(a["grad_norm"] - b["grad_norm"]) / abs(b["grad_norm"]) if b["grad_norm"] else math.inf
           for a, b in pairs]
    norms_ok = all(r <= GRAD_NORM_TOLERANCE or (abs(b["grad_norm"]) <= small
                                                and abs(a["grad_norm"] - b["grad_norm"]) <= LOSS_TOLERANCE)
                   for r, (a, b) in zip(rel, pairs))
    worst = max(rel)
    number = lambda x: x if finite and math.isfinite(x) else None      # noqa: E731  (JSON has no NaN)
    return {"loss_max_abs_diff": number(loss), "grad_norm_max_rel_diff": number(worst), "finite": finite,
            "ok": finite and loss <= LOSS_TOLERANCE and norms_ok}


def available_host_bytes() -> int | None:
    """Memory this machine can still give its processes (Linux's MemAvailable), or None where it is not known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_host_memory(run_plan, *, tiny: bool) -> None:
    """Refuse, before any process starts, a dry run the memory model says this machine cannot hold: every rank
    is a process here, so the run needs the sum of the ranks' predicted memory (weights, gradients, optimizer
    state, activations and the logits' workspace, in fp32, or what the gradient reduction or the optimizer's step
    hold beyond them once the activations are gone): a lower bound, without each process's own torch and
    Megatron or a container's limit below the host's MemAvailable. Without it the kernel kills the ranks one by
    one and the run fails minutes later with nothing to say why."""
    have = available_host_bytes()
    if have is None:
        return
    predicted = predicted_stage_memory(run_plan)
    need = 0
    for i, mesh in enumerate(run_plan.meshes):
        for local in range(mesh.num_devices):
            want = predicted[(i, local // (mesh.tp * mesh.dp))]
            need += sum(want[k] for k in MEMORY_PARTS) + want["activation_workspace"] + want["after_backward"]
    if need <= have:
        return
    fix = ("dry-run a plan with fewer devices or a shorter sequence, or on a machine with more memory" if tiny else
           "add --tiny (it keeps the layer counts and the whole parallel layout and shrinks hidden size, heads, "
           "vocabulary and sequence), or dry-run on a machine with more memory")
    raise InputError(f"this dry run needs about {need / 2**30:.1f} GiB of host memory ({run_plan.world_size} "
                     f"processes, one per device, each holding its stage's weights, gradients, optimizer state and "
                     f"activations in fp32, as the memory model predicts) and this machine has "
                     f"{have / 2**30:.1f} GiB available", field="--plan", fix=fix)


MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations")
CPU_DTYPE_BYTES = 4      # the dry run trains in fp32 (runtime/model.py)


def predicted_stage_memory(plan) -> dict:
    """cost/memory.py's prediction for every mesh stage of the plan as the dry run runs it, keyed by (mesh index,
    stage inside the mesh): the model that runs (the shrunk one under --tiny) with the plan's padded vocabulary,
    fp32, the mesh's TP, DP, micro-batch size and runtime settings, and the micro-batches its pipeline stage
    holds under 1F1B (its warm-up plus the one it runs, grown by overlapped boundaries' depths; overlapped
    boundaries add their buffers: `PipelineLayout.memory_terms`, as the planner prices them, with the pieces received
    blocks land in and the sends in flight on CPU, plan/staged_pieces.py). Meshes side by
    side at a stage each get their own prediction."""
    from ..cost.activations import DRY_RUN_IMPL
    from ..cost.memory import stage_memory_bytes
    from .layout import PipelineLayout

    model = plan.model.with_padded_vocab(plan.padded_vocab_size)
    out = {}
    for pipe in range(plan.num_pipelines):
        layout = PipelineLayout(plan, pipe)
        p = layout.num_stages
        in_flight, buffers = layout.memory_terms_on(lambda mesh: True)     # every rank here runs on CPU
        for s in range(p):
            for i, sim in layout.stages[s]:
                mesh = plan.meshes[i]
                b = stage_memory_bytes(model, layers=layout.stage_layers[s], tp=mesh.tp, dp=mesh.dp,
                                       micro_batch_size=mesh.micro_batch_size, recompute=mesh.recompute,
                                       in_flight=in_flight[s], first=s == 0, last=s == p - 1,
                                       settings=mesh.settings, vendor="cpu", dtype_bytes=CPU_DTYPE_BYTES,
                                       boundary_buffers=buffers[s], impl=DRY_RUN_IMPL)
                # transients, not saved tensors: what the loss holds beyond its softmax at its peaks (cost/memory.py
                # cross_entropy_bytes), an engine's pipe workspace
                transient = b["activations"] - b["activations_saved"]
                # what the gradient reduction and the optimizer's step hold above the state and activations
                # (cost/memory.py): part of the peak, but not of any part the run measures
                after = b["gradient_reduction"] + b["optimizer_step"]
                out[(i, sim)] = ({k: b[k] for k in MEMORY_PARTS} |
                                 {"activations": b["activations_saved"], "activation_workspace": transient,
                                  "after_backward": after,
                                  "in_flight": in_flight[s], "stage": s})
    return out


def memory_report(plan, results) -> list[dict]:
    """Per rank: its stage, predicted and measured bytes of weights, gradients, optimizer state and activations
    (and their sum, "total", without the per-process reserve the model adds on devices), plus the allocator's
    peak during the step (runtime/memory_meter.py). With several pipelines also "pipeline" ("stage" is inside it)."""
    predicted = predicted_stage_memory(plan)
    out = []
    for i, mesh in enumerate(plan.meshes):
        for local in range(mesh.num_devices):
            rank = plan.rank_offset(i) + local
            want = predicted[(i, local // (mesh.tp * mesh.dp))]
            got = results[rank]["memory"]
            measured = {k: int(got[k]) for k in MEMORY_PARTS}
            pred = {k: round(want[k]) for k in MEMORY_PARTS}
            entry = {"rank": rank, "stage": want["stage"], "mesh": i, "tp": mesh.tp, "dp": mesh.dp,
                     "recompute": mesh.recompute, "in_flight": want["in_flight"],
                     "predicted": pred | {"total": sum(pred.values())},
                     "measured": measured | {"total": sum(measured.values()),
                                             "allocator_peak": int(got["allocator_peak"])}}
            if plan.num_pipelines > 1:
                entry["pipeline"] = mesh.pipeline      # "stage" is the stage inside that pipeline
            out.append(entry)
    return out


def shared_digests(results) -> dict:
    """{parameter: {"mesh M stage S": sha256 of its whole table's bytes}} from the ranks' "shared" values (each
    source rank's part, put together): equal digests mean the holders' copies are bitwise equal. A copy with
    elements no rank supplied reads "incomplete"."""
    import hashlib

    import torch

    wholes = {}
    for r in results:
        for row in r["shared"]:
            key = (row["name"], f"mesh {row['holder'][0]} stage {row['holder'][1]}")
            dtype = getattr(torch, row["dtype"])
            whole = wholes.setdefault(key, torch.full(tuple(row["whole"]), float("nan"), dtype=dtype))
            local = torch.full(tuple(row["local"]), float("nan"), dtype=dtype)
            local.view(-1)[row["lo"]:row["hi"]] = torch.tensor(row["values"], dtype=dtype)
            for lr, wr, nr, lc, wc, nc in row["segments"]:
                block, into = local[lr:lr + nr, lc:lc + nc], whole[wr:wr + nr, wc:wc + nc]
                into.copy_(torch.where(torch.isnan(block), into, block))
    out = {}
    for (name, holder), whole in sorted(wholes.items()):
        done = not torch.isnan(whole).any()
        out.setdefault(name, {})[holder] = hashlib.sha256(whole.numpy().tobytes()).hexdigest() if done \
            else "incomplete"
    return out


def mesh_settings(plan, results) -> list[dict]:
    """Per mesh, the settings its ranks ran with (they are the same on every rank of a mesh: asserted)."""
    out = []
    for i, m in enumerate(plan.meshes):
        start = plan.rank_offset(i)
        ran = [results[r]["settings"] for r in range(start, start + m.num_devices)]
        if any(s != ran[0] for s in ran):
            raise AssertionError(f"mesh {i} ({m.cluster}): its ranks ran with different settings: {ran}")
        out.append({"cluster": m.cluster, "tp": m.tp, "dp": m.dp, **ran[0]})
    return out


def preload_megatron() -> None:
    """Import torch and Megatron-Core in the parent so the forked ranks start without paying for it."""
    import logging
    import warnings

    # A dry run prints its own report; library notices (no CUDA, no Apex, deprecations) would drown it.
    warnings.filterwarnings("ignore")
    for name in ("megatron", "torch.utils.cpp_extension"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import torch  # noqa: F401
    import megatron.core.distributed  # noqa: F401
    import megatron.core.models.gpt  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.pipeline_parallel  # noqa: F401

    from . import communicator, train  # noqa: F401
