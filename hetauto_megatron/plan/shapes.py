"""The plan shapes of format version 3: several pipelines joined by data parallelism, and stages whose data-parallel
replicas are spread over several meshes ("alongside" meshes, e.g. A100s at TP 1 next to V100s at TP 4).

Pure functions over a plan's flat mesh list (Plan's methods delegate here, and Plan's validation of these shapes
lives here too), so that plan.py stays the file format.

Vocabulary (docs/plan-format.md, version 3):
- a **pipeline** is a contiguous run of meshes with the same `pipeline` index; it holds the whole model and
  trains its own share (`pipelines[p].samples`) of every global batch;
- a **position** is a mesh plus the `alongside: true` meshes that directly follow it: they hold the same stages
  (equal `stage_layers`) and are more data-parallel replicas of them. Stage s of a pipeline is the s-th stage of
  its positions, in order;
- a position's **step** is the samples one micro-batch step moves through it: sum of dp * micro_batch_size over
  its meshes, equal for all positions of a pipeline.
"""
from __future__ import annotations

from ..errors import InputError


def pipeline_ranges(meshes) -> list[range]:
    """Mesh indices of each pipeline (meshes are contiguous per pipeline; checked by `check_shapes`)."""
    out, start = [], 0
    for i in range(1, len(meshes) + 1):
        if i == len(meshes) or meshes[i].pipeline != meshes[start].pipeline:
            out.append(range(start, i))
            start = i
    return out


def positions_of(meshes, indices) -> list[list[int]]:
    """Group a pipeline's mesh indices into positions: a mesh plus the alongside meshes right after it."""
    out: list[list[int]] = []
    for i in indices:
        if meshes[i].alongside and out:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def position_step(meshes, position) -> int:
    return sum(meshes[i].samples_per_step for i in position)


def is_simple(meshes) -> bool:
    return all(m.pipeline == 0 and not m.alongside for m in meshes)


# What one uniform ProcessTopology (DeepSpeed's pipeline engine: one TP and one DP size, one backend) cannot run.
UNIFORM_GAPS = ("tp", "dp", "micro_batch_size", "vendor", "selective")


def uniform_topology_gaps(meshes, vendors) -> list[str]:
    """Which of UNIFORM_GAPS a list of meshes (Mesh or MeshChoice: tp, dp, micro_batch_size, recompute) has, with
    `vendors` the device vendor of each: different TP, DP or micro-batch per mesh, more than one vendor, selective
    recomputation (whole layers only). emit/deepspeed.py words them; `hetauto plan --engine deepspeed` plans none."""
    out = [k for k in ("tp", "dp", "micro_batch_size") if len({getattr(m, k) for m in meshes}) > 1]
    if len(set(vendors)) > 1:
        out.append("vendor")
    if any(m.recompute == "selective" for m in meshes):
        out.append("selective")
    return out


def describe_shape(meshes) -> tuple[str, str]:
    """(what makes the plan not simple, in words; the field that says so), e.g. ('2 pipelines', 'pipelines')."""
    ranges = pipeline_ranges(meshes)
    parts, field = [], "meshes"
    if len(ranges) > 1:
        spans = ", ".join(f"meshes {r.start}-{r.stop - 1}" if len(r) > 1 else f"mesh {r.start}" for r in ranges)
        parts.append(f"{len(ranges)} pipelines ({spans})")
        field = "pipelines"
    along = [i for i, m in enumerate(meshes) if m.alongside]
    if along:
        parts.append("mixed replicas inside a stage (`alongside: true` on " +
                     ", ".join(f"meshes[{i}]" for i in along) + ")")
        if field == "meshes":
            field = f"meshes[{along[0]}].alongside"
    return " and ".join(parts) or "one pipeline without alongside meshes", field


def require_simple(plan, what: str, file: str | None = None) -> None:
    """Exit 2 (InputError) when a command that handles only one pipeline of single-mesh positions gets a plan of
    the version-3 shapes (today `emit deepspeed`: DeepSpeed's engine runs one uniform pipeline). One helper for
    every such guard, so each is removed in one place once the command supports them."""
    if plan.is_simple:
        return
    shape, field = describe_shape(plan.meshes)
    supports = "one pipeline whose stages each run on one mesh (no `pipelines` list, no `alongside: true`)"
    raise InputError(f"{what} supports plans of {supports}, but this plan has {shape}", file=file, field=field,
                     fix="use a plan of that shape for this command (the version-3 section of docs/plan-format.md "
                         "lists which commands take which shapes)")


def not_simple_error(meshes, what: str) -> InputError:
    """The error a single-pipeline-only property raises on a plan that is not simple."""
    shape, field = describe_shape(meshes)
    return InputError(f"{what} describes a single pipeline of single-mesh stages, but this plan has {shape}",
                      field=field, fix="run a command that supports these shapes, or read one pipeline at a time "
                                       "(Plan.pipeline(p)); docs/plan-format.md lists which commands take which shapes")


def check_shapes(plan) -> None:
    """Validate pipelines and positions (InputError naming the field and the fix). Called by Plan.__post_init__
    after the per-mesh checks; the messages for a simple plan are the version-2 ones."""
    meshes = plan.meshes
    for i, mesh in enumerate(meshes):
        prev = meshes[i - 1].pipeline if i else 0
        if mesh.pipeline not in (prev, prev + 1) or (i == 0 and mesh.pipeline != 0):
            want = "0" if i == 0 else f"{prev} (same pipeline) or {prev + 1} (the next)"
            raise InputError(f"is {mesh.pipeline}: pipelines are numbered 0, 1, 2, ... and each pipeline's meshes "
                             "are listed together, in order", field=f"meshes[{i}].pipeline",
                             fix=f"write pipeline: {want}, moving the meshes so each pipeline's are contiguous")
    ranges = pipeline_ranges(meshes)
    simple = is_simple(meshes)
    samples = plan.pipeline_samples or (plan.global_batch_size,)
    if not plan.pipeline_samples and len(ranges) > 1:
        raise InputError(f"is missing: the meshes name {len(ranges)} pipelines (their `pipeline` keys), and each "
                         "trains its own share of the batch", field="pipelines",
                         fix="add `pipelines:` with one `{samples: N}` entry per pipeline, in pipeline order, "
                             "summing to global_batch_size")
    if len(samples) != len(ranges):
        raise InputError(f"lists {len(samples)} pipeline(s) but the meshes name {len(ranges)} "
                         "(their `pipeline` keys)", field="pipelines",
                         fix=f"give one `{{samples: N}}` entry per pipeline ({len(ranges)}), in pipeline order")
    if sum(samples) != plan.global_batch_size:
        raise InputError(f"samples add up to {sum(samples)} ({' + '.join(map(str, samples))}) but "
                         f"global_batch_size is {plan.global_batch_size}", field="pipelines",
                         fix="make the pipelines' samples sum to global_batch_size (hetauto_megatron.plan.batch_split "
                             "splits a batch by speed)")
    for p, idx in enumerate(ranges):
        _check_pipeline(plan, p, idx, samples[p], simple)
    for i, mesh in enumerate(meshes):
        _check_boundary(meshes, i, ranges[mesh.pipeline])


def _check_pipeline(plan, p: int, idx: range, samples: int, simple: bool) -> None:
    meshes, m = plan.meshes, plan.model
    if meshes[idx.start].alongside:
        raise InputError("is the first mesh of its pipeline, so there is no mesh for it to stand alongside",
                         field=f"meshes[{idx.start}].alongside",
                         fix="remove `alongside: true` (the first mesh of a pipeline starts a stage of its own)")
    positions = positions_of(meshes, idx)
    for k, pos in enumerate(positions):
        for i in pos[1:]:
            if meshes[i].stage_layers != meshes[pos[0]].stage_layers:
                # the one whose layers leave the pipeline short of the model's is named (told to copy the other's,
                # the fix made the pipeline's total wrong, the next refusal)
                rest = sum(sum(meshes[q[0]].stage_layers) for j, q in enumerate(positions) if j != k)
                whole = {x: rest + sum(meshes[x].stage_layers) == m.num_layers for x in (i, pos[0])}
                wrong, right = (pos[0], i) if whole[i] and not whole[pos[0]] else (i, pos[0])
                raise InputError(f"is {list(meshes[wrong].stage_layers)} but meshes[{right}], side by side with it, "
                                 f"has {list(meshes[right].stage_layers)}: meshes side by side hold the same stages",
                                 field=f"meshes[{wrong}].stage_layers",
                                 fix=f"write stage_layers: {list(meshes[right].stage_layers)}" + (
                                     ", or remove `alongside: true` to make it the next stage(s) of the pipeline"
                                     if meshes[wrong].alongside else ""))
    steps = [position_step(meshes, pos) for pos in positions]
    where = "" if simple else f" of pipeline {p}"
    if len(set(steps)) != 1:
        if simple:   # the version-2 message
            detail = ", ".join(f"{x.cluster}: {x.dp}x{x.micro_batch_size}" for x in meshes)
            target = max(steps)
            hint = ", ".join(f"meshes[{i}].micro_batch_size: {target // x.dp}" for i, x in enumerate(meshes)
                             if x.samples_per_step != target and target % x.dp == 0)
            raise InputError(f"dp * micro_batch_size must be equal in every mesh so all run the same micro-batches; "
                             f"got {detail}", field="meshes",
                             fix="make dp x micro_batch_size equal in every mesh" + (
                                 f", e.g. {hint}" if hint else f": no micro-batch size reaches {target} samples on "
                                 "every mesh's dp, so change a dp too (or re-plan)"))
        detail = "; ".join(" + ".join(f"meshes[{i}] {meshes[i].dp}x{meshes[i].micro_batch_size}" for i in pos)
                           + f" = {s}" for pos, s in zip(positions, steps))
        odd = next(pos for pos, s in zip(positions, steps) if s != steps[0])
        raise InputError(f"every stage{where} must move the same samples per micro-batch step (the sum of dp * "
                         f"micro_batch_size over the meshes side by side); got {detail}",
                         field=f"meshes[{odd[0]}].micro_batch_size",
                         fix=f"change dp or micro_batch_size of meshes[{odd[0]}]" + (" and its alongside meshes"
                                                                                      if len(odd) > 1 else "")
                             + f" (or of the others) so every stage moves {steps[0]} samples per step")
    step = steps[0]
    if samples < 1 or samples % step:
        if simple and len(plan.pipeline_samples) <= 1:
            raise InputError(f"global_batch_size {plan.global_batch_size} is not a positive multiple of dp * "
                             f"micro_batch_size = {step}", field="global_batch_size", fix=f"use a multiple of {step}")
        # say where the step comes from: a mesh's dp or micro_batch_size may be what is wrong, not the samples
        source = " + ".join(f"meshes[{i}] dp {meshes[i].dp} x micro_batch_size {meshes[i].micro_batch_size}"
                            for i in positions[0])
        listed = bool(plan.pipeline_samples)    # else one pipeline trains the global batch (no `pipelines:`)
        raise InputError(f"is {samples}, not a positive multiple of the pipeline's {step} samples per micro-batch "
                         f"step ({source} in its first stage)",
                         field=f"pipelines[{p}].samples" if listed else "global_batch_size",
                         fix=f"use a multiple of {step}" + (" (and keep the pipelines' sum at global_batch_size)"
                                                            if listed else "")
                             + ", or correct those meshes' dp or micro_batch_size")
    layers = [n for pos in positions for n in meshes[pos[0]].stage_layers]
    if sum(layers) != m.num_layers:
        raise InputError(f"stage_layers{where} add up to {sum(layers)} layers but the model has {m.num_layers}",
                         field="meshes[*].stage_layers" if simple else f"meshes[{idx.start}].stage_layers", fix=f"make the layer counts{where} sum to {m.num_layers}"
                                                             + ("" if simple else " (every pipeline holds the whole "
                                                                                  "model)"))
    for s, n in enumerate(layers):
        if n == 0 and 0 < s < len(layers) - 1:
            mi, si = _stage_owner(meshes, positions, s)
            raise InputError(f"pipeline stage {s}{where} holds no layers; only the first (embedding) or the last "
                             "(output head) stage may be empty", field=f"meshes[{mi}].stage_layers[{si}]",
                             fix="move a layer into it or remove the stage")


def _stage_owner(meshes, positions, stage: int) -> tuple[int, int]:
    for pos in positions:
        n = meshes[pos[0]].num_stages
        if stage < n:
            return pos[0], stage
        stage -= n
    raise IndexError(stage)


def boundary_depth(before, after) -> int | None:
    """The warm-up depth of the pipeline boundary from one position to the next (`before`, `after`: the meshes of
    each), None where it blocks. The one rule the planner's pricing (plan/simulate.py, plan/multi_simulate.py) and
    the runtime's schedule (plan/layout.py) read: only a boundary between two single meshes on different clusters
    may overlap, and the mesh before it says whether it does (`boundary_schedule`) and how deep (`boundary_depth`).
    A plan asking for more is refused on load (`_check_boundary`, below); a search's candidate is not, hence the
    checks here."""
    if len(before) != 1 or len(after) != 1:
        return None
    a, b = before[0], after[0]
    if a.boundary_schedule != "overlapped" or a.cluster == b.cluster:
        return None
    return a.boundary_depth


def _check_boundary(meshes, i: int, idx: range) -> None:
    mesh = meshes[i]
    if mesh.boundary_schedule != "overlapped":
        return
    reason = "only a pipeline boundary into another cluster can be overlapped; this mesh is "
    if i == idx.stop - 1:
        raise InputError(reason + "the last" + ("" if len(idx) == len(meshes) else " of its pipeline"),
                         field=f"meshes[{i}].boundary.schedule", fix="write schedule: blocking")
    if mesh.alongside or meshes[i + 1].alongside or (i + 2 < idx.stop and meshes[i + 2].alongside):
        raise InputError("an overlapped boundary needs one mesh on each side, but a stage here is held by "
                         "meshes side by side (alongside)", field=f"meshes[{i}].boundary.schedule",
                         fix="write schedule: blocking for a boundary next to alongside meshes")
    if meshes[i + 1].cluster == mesh.cluster:
        raise InputError(reason + "followed by the same cluster", field=f"meshes[{i}].boundary.schedule",
                         fix="write schedule: blocking")


# ---- derived quantities (valid plans) ------------------------------------------------------------------------
def locate(meshes, mesh_index: int) -> tuple[int, int, int]:
    """(pipeline, position index inside it, pipeline stage of the mesh's first stage) of a mesh."""
    p = meshes[mesh_index].pipeline
    idx = pipeline_ranges(meshes)[p]
    stage = 0
    for k, pos in enumerate(positions_of(meshes, idx)):
        if mesh_index in pos:
            return p, k, stage
        stage += meshes[pos[0]].num_stages
    raise AssertionError("unreachable")


def sample_range(meshes, mesh_index: int, dp_rank: int) -> tuple[int, int]:
    """[start, stop) of one DP replica's samples inside one micro-batch step of its pipeline: mesh after mesh
    inside the position, replica after replica inside the mesh."""
    mesh = meshes[mesh_index]
    if not 0 <= dp_rank < mesh.dp:
        raise IndexError(f"dp_rank {dp_rank} outside mesh {mesh_index}'s {mesh.dp} replicas")
    idx = pipeline_ranges(meshes)[mesh.pipeline]
    pos = next(pos for pos in positions_of(meshes, idx) if mesh_index in pos)
    start = sum(meshes[j].samples_per_step for j in pos[:pos.index(mesh_index)]) + dp_rank * mesh.micro_batch_size
    return start, start + mesh.micro_batch_size


def layer_holders(meshes, layer: int, num_layers: int) -> list[tuple[int, int]]:
    """(mesh index, stage inside that mesh) of every mesh stage holding transformer layer `layer`, over all
    pipelines and alongside meshes, in mesh order."""
    if not 0 <= layer < num_layers:
        raise IndexError(f"layer {layer} outside the model's {num_layers} layers")
    out = []
    for idx in pipeline_ranges(meshes):
        first = 0
        for pos in positions_of(meshes, idx):
            for s, n in enumerate(meshes[pos[0]].stage_layers):
                if first <= layer < first + n:
                    out.extend((i, s) for i in pos)
                first += n
    return out


def end_holders(meshes, last: bool) -> list[tuple[int, int]]:
    """Every mesh stage holding the embedding (first stage of each pipeline) or, with last=True, the output head
    (last stage of each pipeline)."""
    out = []
    for idx in pipeline_ranges(meshes):
        pos = positions_of(meshes, idx)[-1 if last else 0]
        out.extend((i, meshes[i].num_stages - 1 if last else 0) for i in pos)
    return out
