"""Which plan a checkpoint was saved under, and refusing to resume it under another (pure but for the file).

Under --hetauto a checkpoint is written per (TP rank, mesh stage): its file names count mesh stages over the whole
plan (rewrite.checkpoint_stage), its keys are each stage's local layers, and each rank's consumed-samples counter is
its mesh's share of the batch. A re-planned layout (another split, another stage for a replica group, another
share of the batch) therefore loads other layers into a stage, or resumes the data elsewhere, with no error from
Megatron, whose own check compares only TP and pipeline sizes. So every save also writes, beside the checkpoint,
the plan's layout (`resume_layout`: what the files depend on; not the clusters, the devices or the links, so the
same layout resumes on other hardware), and a --load of a checkpoint saved under another layout is refused, on
every rank, naming what differs.
"""
from __future__ import annotations

import json
import os

from ..errors import InputError
from ..plan.plan import Plan

SIDECAR = "hetauto-plan.json"


def resume_layout(plan: Plan) -> dict:
    """What a checkpoint's files and counters depend on: the model (its padded table), the batch and each
    pipeline's share, and per mesh its TP, DP, micro-batch, stage layers, pipeline, whether it sits alongside and
    whether its optimizer state is sharded."""
    return {"model": plan.model.to_dict(), "padded_vocab_size": plan.padded_vocab_size,
            "global_batch_size": plan.global_batch_size, "pipeline_samples": list(plan.samples_per_pipeline),
            "meshes": [{"tp": m.tp, "dp": m.dp, "micro_batch_size": m.micro_batch_size,
                        "stage_layers": list(m.stage_layers), "pipeline": m.pipeline, "alongside": m.alongside,
                        "distributed_optimizer": m.settings.distributed_optimizer} for m in plan.meshes]}


def _differences(saved: dict, now: dict) -> list[str]:
    out = []
    for key in ("model", "padded_vocab_size", "global_batch_size", "pipeline_samples"):
        if saved.get(key) != now[key]:
            out.append(f"{key} {saved.get(key)!r} -> {now[key]!r}" if key != "model" else "the model")
    meshes = saved.get("meshes") or []
    if len(meshes) != len(now["meshes"]):
        out.append(f"{len(meshes)} meshes -> {len(now['meshes'])}")
    else:
        for i, (a, b) in enumerate(zip(meshes, now["meshes"])):
            changed = [f"{k} {a.get(k)!r} -> {b[k]!r}" for k in b if a.get(k) != b[k]]
            if changed:
                out.append(f"meshes[{i}]: " + ", ".join(changed))
    return out


def check_resume(plan: Plan, load_dir: str | None, *, file: str | None = None) -> None:
    """Refuse to load a checkpoint that was saved under another plan layout (InputError naming --load and what
    differs). A checkpoint without the record (saved without --hetauto, or by an older hetauto) is Megatron's to
    check."""
    path = os.path.join(load_dir, SIDECAR) if load_dir else None
    if not path or not os.path.isfile(path):
        return
    try:
        with open(path) as f:
            record = json.load(f)
        saved = record["layout"]
        if not isinstance(saved, dict):
            raise TypeError("its 'layout' is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"cannot read which plan the checkpoint was saved under ({exc})", file=path, field="--load",
                         fix="restore the file from the save, or delete it to leave the check to Megatron") from None
    differ = _differences(saved, resume_layout(plan))
    if differ:
        raise InputError(f"the checkpoint in {load_dir} was saved under another plan layout ("
                         + "; ".join(differ[:6]) + (f"; {len(differ) - 6} more" if len(differ) > 6 else "")
                         + "): its files hold each mesh stage's layers and each mesh's share of the batch, so "
                           "loading it under this plan would put other layers into stages, or resume the data "
                           "elsewhere", file=file, field="--load",
                         fix=f"resume with the plan it was saved under ({record.get('plan_file') or 'its plan file'} "
                             f"at iteration {record.get('iteration', '?')}), or start this plan without --load")


def write_record(plan: Plan, save_dir: str, plan_file: str | None, iteration: int) -> None:
    """Write, beside the checkpoint just saved, the layout it was saved under (rank 0 calls it after each save)."""
    record = {"layout": resume_layout(plan), "plan_file": plan_file, "iteration": iteration}
    tmp = os.path.join(save_dir, SIDECAR + ".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, os.path.join(save_dir, SIDECAR))
