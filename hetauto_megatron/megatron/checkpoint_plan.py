"""Which plan a checkpoint was saved under, and refusing to resume it under another (pure but for the file).

Under --hetauto a checkpoint is written per (TP rank, mesh stage): its file names count mesh stages over the whole
plan (rewrite.checkpoint_stage), its keys are each stage's local layers, and each rank's consumed-samples counter is
its mesh's share of the batch. A re-planned layout (another split, another stage for a replica group, another
share of the batch) therefore loads other layers into a stage, or resumes the data elsewhere, with no error from
Megatron, whose own check compares only TP and pipeline sizes. So every save also writes, into the checkpoint,
the plan's layout (`resume_layout`: what the files and the resumed counters depend on; not the clusters, the
devices or the links, so the same layout resumes on other hardware), and a --load of a checkpoint saved under
another layout is refused, on every rank, naming what differs (--finetune: only what the weights depend on).
"""
from __future__ import annotations

import json
import os

from ..errors import InputError
from ..plan.plan import Plan

SIDECAR = "hetauto-plan.json"
TRACKER = "latest_checkpointed_iteration.txt"    # Megatron-LM's: the iteration a --load reads by default


# The model's fields that shape its weights (not its name, nor the sequence, which no weight depends on unless the
# positions are a learned table: then max_position_embeddings says its rows).
_WEIGHT_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
                  "gated_mlp", "tie_embeddings", "position_embedding", "output_layer")


def resume_layout(plan: Plan) -> dict:
    """What a checkpoint depends on. "weights": what each file holds (the model's weight shapes and padded table,
    per mesh its TP, stage layers, pipeline and whether it sits alongside). "data": what a resume continues (the
    batch and each pipeline's share, each mesh's optimizer sharding); --finetune starts those afresh. Not DP nor the
    micro-batch: DP rank 0 writes a file whatever DP is, and each rank counts its mesh's share of the samples."""
    m = plan.model.to_dict()
    model = {k: m.get(k) for k in _WEIGHT_FIELDS}
    if "linear_biases" in m:    # written only where it is not the MLP kind's rule: records from before stay equal
        model["linear_biases"] = m["linear_biases"]
    if plan.model.position_embedding == "learned":
        model["max_position_embeddings"] = plan.model.max_position_embeddings
    return {"weights": {"model": model, "padded_vocab_size": plan.padded_vocab_size,
                        "meshes": [{"tp": x.tp, "stage_layers": list(x.stage_layers), "pipeline": x.pipeline,
                                    "alongside": x.alongside} for x in plan.meshes]},
            "data": {"global_batch_size": plan.global_batch_size, "pipeline_samples": list(plan.samples_per_pipeline),
                     "distributed_optimizer": [x.settings.distributed_optimizer for x in plan.meshes]}}


def _differences(saved: dict, now: dict, prefix: str = "") -> list[str]:
    """'key: old -> new' for each leaf that differs (lists of meshes item by item)."""
    out = []
    for key, value in now.items():
        old = saved.get(key) if isinstance(saved, dict) else None
        where = f"{prefix}{key}"
        if isinstance(value, dict):
            out += _differences(old if isinstance(old, dict) else {}, value, where + ".")
        elif key == "meshes" and isinstance(old, list) and len(old) == len(value):
            for i, (a, b) in enumerate(zip(old, value)):
                out += _differences(a if isinstance(a, dict) else {}, b, f"{where}[{i}].")
        elif old != value:
            out.append(f"{where} {old!r} -> {value!r}")
    return out


def record_path(load_dir: str | None, iteration: int | None) -> str | None:
    """Where the record of the checkpoint of `iteration` under `load_dir` lies (Megatron's iter_NNNNNNN folder)."""
    if not load_dir or iteration is None:
        return None
    return os.path.join(load_dir, f"iter_{iteration:07d}", SIDECAR)


def tracker_text(load_dir: str | None) -> str | None:
    """What Megatron's tracker file under `load_dir` says (an iteration, or 'release'), None where there is none."""
    try:
        with open(os.path.join(load_dir, TRACKER)) as f:
            return f.read().strip()
    except (OSError, TypeError, UnicodeDecodeError):
        return None


def loaded_iteration(load_dir: str | None, ckpt_step: int | None) -> int | None:
    """The iteration a --load reads: --ckpt-step, else the one Megatron's tracker file names (None: no tracker, or a
    'release' checkpoint, which hetauto never writes)."""
    if ckpt_step is not None:
        return int(ckpt_step)
    text = tracker_text(load_dir)
    return int(text) if text is not None and text.isdecimal() else None


def loaded_from(args) -> tuple[str, str] | None:
    """(directory, flag) of the checkpoint a launch's Megatron arguments load, as Megatron-LM chooses it
    (checkpointing.load_checkpoint): --load's; where --load holds no checkpoint (no tracker) and the launch gives
    --pretrained-checkpoint, that one, which Megatron then loads as --finetune; None without either."""
    load, pretrained = getattr(args, "load", None), getattr(args, "pretrained_checkpoint", None)
    if pretrained and not (load and os.path.isfile(os.path.join(load, TRACKER))):
        return pretrained, "--pretrained-checkpoint"
    return (load, "--load") if load else None


def check_load(plan: Plan, args, *, file: str | None = None) -> None:
    """The checkpoint a launch's Megatron arguments load (loaded_from), at --ckpt-step or its tracker's iteration,
    checked against the plan (check_resume); a pretrained one as --finetune."""
    found = loaded_from(args)
    if found is None:
        return
    directory, flag = found
    finetune = flag == "--pretrained-checkpoint" or bool(getattr(args, "finetune", False))
    check_resume(plan, record_path(directory, loaded_iteration(directory, getattr(args, "ckpt_step", None))),
                 finetune=finetune, load_dir=directory, file=file, flag=flag)


def check_resume(plan: Plan, path: str | None, *, finetune: bool = False, load_dir: str | None = None,
                 file: str | None = None, flag: str = "--load") -> None:
    """Refuse to load a checkpoint (its record at `path`) saved under another plan layout: InputError naming the
    `flag` it is loaded from and what differs (with `finetune`, only what the weights depend on). A checkpoint
    without a record (saved without --hetauto, or by an older hetauto) is Megatron's to check."""
    if not path or not os.path.isfile(path):
        return
    try:
        with open(path) as f:
            record = json.load(f)
        saved, now = record["layout"], resume_layout(plan)
        differ = _differences(saved["weights"], now["weights"], "")
        if not finetune:
            differ += _differences(saved["data"], now["data"], "")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"cannot read which plan the checkpoint was saved under ({type(exc).__name__}: {exc})",
                         file=path, field=flag,
                         fix="restore the file from the save, or delete it to leave the check to Megatron") from None
    if differ:
        raise InputError(f"the checkpoint in {load_dir or os.path.dirname(path)} was saved under another plan layout ("
                         + "; ".join(differ[:6]) + (f"; {len(differ) - 6} more" if len(differ) > 6 else "")
                         + "): its files hold each mesh stage's layers"
                         + ("" if finetune else ", and each mesh counts its share of the batch")
                         + ", so loading it under this plan would put other weights into stages"
                         + ("" if finetune else " or resume the data elsewhere"), file=file, field=flag,
                         fix=f"resume with the plan it was saved under ({record.get('plan_file') or 'its plan file'} "
                             f"at iteration {record.get('iteration', '?')})"
                             + ("" if finetune else ", or --finetune if only the batch changed")
                             + f", or start this plan without {flag}")


def write_record(plan: Plan, save_dir: str, plan_file: str | None, iteration: int) -> None:
    """Write into the checkpoint just saved (its iter_NNNNNNN folder) the layout it was saved under (each cluster's
    first rank calls it after each save): each iteration's checkpoint says its own plan, also when a folder holds
    several plans' saves."""
    path = record_path(save_dir, iteration)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = {"layout": resume_layout(plan), "plan_file": os.path.abspath(plan_file) if plan_file else None,
              "iteration": iteration}
    _write_at_once(path, json.dumps(record, indent=1))


def write_tracker(save_dir: str, iteration: int) -> None:
    """Megatron-LM's tracker file (latest_checkpointed_iteration.txt, which a --load without --ckpt-step reads),
    as global rank 0 writes it after a save, written at once (a file system shared with rank 0 gets the same text).
    For the clusters whose file system rank 0 does not write: without it their ranks found no checkpoint to load
    while rank 0's cluster loaded one (and met in a collective the others never entered)."""
    _write_at_once(os.path.join(save_dir, TRACKER), str(iteration))


def _write_at_once(path: str, text: str) -> None:
    """`text` into `path`, replaced in one step, through a temporary file of this process's own: each cluster's
    first rank writes these files, on a file system shared with rank 0 at the same moment."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
