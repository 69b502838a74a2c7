"""The plan file: a Plan written as YAML or JSON, and read back, whichever readable version it has.

Plans are data: what `hetauto plan` writes is what emit, simulate, dryrun and the `--hetauto` hook read. The file
carries a schema version (docs/plan-format.md): this hetauto writes PLAN_VERSION and reads every version in
READABLE_VERSIONS, an older file meaning what it meant when it was written.
"""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import yaml

from ..errors import InputError
from ..spec._fields import get, reject_unknown, require_mapping
from ..spec.inventory import check_cluster_name, inventory_from_dict
from ..spec.files import is_json_name, load_yaml_file
from ..spec.model import model_from_dict
from .mesh import Mesh
from .engines import DEFAULT_ENGINE
from .precision import DEFAULT_PRECISION

if TYPE_CHECKING:
    from .plan import Plan

PLAN_VERSION = 4
# Version 1 has no per-mesh `settings` (the defaults apply) and no `precision` (bf16, what it was made for).
# Version 3 adds several pipelines (`pipelines`, `meshes[*].pipeline`) and mixed replicas (`meshes[*].alongside`).
# Version 4: an inventory cluster of a device with TF32 tensor cores runs fp32 GEMMs on them unless it says
# `tf32: false` (before: only where it said `tf32: true`); older files are read with their clusters' missing
# `tf32` as false, what they were priced with (_inventory_as_written).
READABLE_VERSIONS = (1, 2, 3, 4)


# ---- writing ----------------------------------------------------------------------------------------------
def plan_to_dict(plan: Plan) -> dict:
    """The plan as the file's mapping, at PLAN_VERSION: every mesh's settings in full and every boundary between
    clusters spelled out, so the file says what runs. A plan read from a version 1-3 file without an inventory is
    written as version 3 (which has every key this writes): its fp32 GEMMs ran without TF32, which version 4 would
    turn on for the device types that have it (emit/vendor_env.py fp32_tf32) with nothing in the file to say so."""
    version = PLAN_VERSION if plan.inventory is not None or plan.version >= 4 else 3
    d = {"version": version, "model": plan.model.to_dict(), "global_batch_size": plan.global_batch_size,
         "precision": plan.precision}
    if plan.engine != DEFAULT_ENGINE:       # optional: absent means megatron (files without it read as before)
        d["engine"] = plan.engine
    if plan.num_pipelines > 1:
        d["pipelines"] = [{"samples": n} for n in plan.samples_per_pipeline]
    d["meshes"] = [mesh.to_dict() for mesh in plan.meshes]
    for i, (mesh, out) in enumerate(zip(plan.meshes, d["meshes"])):
        if plan.num_pipelines > 1:
            out["pipeline"] = mesh.pipeline
        if mesh.alongside:
            out["alongside"] = True
        nxt = plan.meshes[i + 1] if i + 1 < len(plan.meshes) else None
        # Written in full where a boundary crosses clusters between single meshes: it says what runs.
        if (nxt is not None and nxt.pipeline == mesh.pipeline and not nxt.alongside and nxt.cluster != mesh.cluster
                and not mesh.alongside and not (i + 2 < len(plan.meshes) and plan.meshes[i + 2].alongside
                                                and plan.meshes[i + 2].pipeline == mesh.pipeline)) \
                or mesh.boundary_schedule != "blocking":
            out["boundary"] = {"schedule": mesh.boundary_schedule, "depth": mesh.boundary_depth}
    if plan.inventory is not None:
        d["inventory"] = plan.inventory
    if plan.estimate is not None:
        d["estimate"] = plan.estimate
    return d


def layout_digest(plan: Plan, *, inventory_as_parsed: bool = False) -> str:
    """A fingerprint of everything a plan's estimate depends on (the file's mapping without its estimate): the
    planner records it in the estimate, so a file edited afterwards (other layers, TP, inventory) is known not to
    be the layout its figures describe. `inventory_as_parsed`: the stored inventory as read, so that one written
    another way (80 and 80.0) is the same (what the ranks of one job compare; the recorded digests keep the file's)."""
    import hashlib
    body = {k: v for k, v in plan_to_dict(plan).items() if k != "estimate"}
    if inventory_as_parsed and body.get("inventory"):
        body["inventory"] = inventory_from_dict(body["inventory"]).to_dict()
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def check_readable_version(version: int, file: str | None = None) -> None:
    """InputError unless this hetauto reads plans of `version` (a newer one: the release that wrote it does)."""
    if version not in READABLE_VERSIONS:
        raise InputError(f"plan version {version} is not supported (this hetauto reads versions "
                         f"{', '.join(map(str, READABLE_VERSIONS))})", file=file, field="version",
                         fix="a newer hetauto-megatron wrote it: read it with that release (or a later one), or "
                             "re-create the plan with this one's 'hetauto plan'" if version > PLAN_VERSION else
                             f"re-create the plan with 'hetauto plan', or set version: {PLAN_VERSION} if the file "
                             "follows docs/plan-format.md")


def estimate_is_stale(plan: Plan) -> bool:
    """Whether the plan's estimate was recorded for another layout (a file without the fingerprint: unknown, no)."""
    est = plan.estimate if isinstance(plan.estimate, dict) else {}
    return isinstance(est.get("layout_digest"), str) and est["layout_digest"] != layout_digest(plan)


def estimate_is_garbled(plan: Plan) -> bool:
    """Whether the plan's estimate holds a figure no prediction gives (a hand edit: NaN, an infinity, or an
    iteration time that is not positive): the summary then shows the layout only, as for a stale estimate."""
    import math
    est = plan.estimate if isinstance(plan.estimate, dict) else {}

    def bad(x) -> bool:
        if isinstance(x, dict):
            return any(bad(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return any(bad(v) for v in x)
        return isinstance(x, float) and not math.isfinite(x)
    time = est.get("iteration_time_s")
    return bad(est) or (isinstance(time, (int, float)) and not isinstance(time, bool) and time <= 0)


def plan_to_yaml(plan: Plan) -> str:
    return "# hetauto plan: pipeline order, one mesh per cluster share (docs/plan-format.md)\n" + \
        yaml.safe_dump(plan_to_dict(plan), sort_keys=False, default_flow_style=None, width=120)


def save_plan(plan: Plan, path: str) -> None:
    """Write the plan: JSON for a .json name (any case, as the readers decide it), YAML otherwise."""
    text = json.dumps(plan_to_dict(plan), indent=2) + "\n" if is_json_name(path) else plan_to_yaml(plan)
    with open(path, "w") as fh:
        fh.write(text)


# ---- reading ----------------------------------------------------------------------------------------------
_MESH_KEYS = {"cluster", "device_type", "tp", "dp", "micro_batch_size", "recompute", "stage_layers", "settings",
              "boundary", "pipeline", "alongside"}


def _layer_counts(values: list, prefix: str, file: str | None) -> list[int]:
    # Checked here, not by int(): 2.5 layers must not silently become 2, nor `true` become 1.
    for j, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(f"must be a whole number of layers, got {v!r}", file=file,
                             field=f"{prefix}stage_layers[{j}]", fix="write integer layer counts, e.g. [10, 10]")
    return values


def plan_from_dict(data: dict, *, file: str | None = None) -> Plan:
    """The plan a file's mapping describes (any readable version), every field checked with messages that
    name the file, the field and the fix."""
    from .plan import Plan      # here, not at the top: plan.py imports this module (the version, the reader)
    data = require_mapping(data, "a plan", file)
    reject_unknown(data, {"version", "model", "global_batch_size", "precision", "engine", "pipelines", "meshes",
                          "inventory", "estimate"}, file=file)
    # written but of another type ("3", 3.0): the file's own version, unquoted, not this hetauto's (whose rules
    # would change what an older file prices, e.g. TF32 from version 4)
    version = get(data, "version", int, file=file,
                  fix="write the version the file was written in as a whole number, unquoted (e.g. version: 3)"
                      if "version" in data else f"add 'version: {PLAN_VERSION}' at the top")
    check_readable_version(version, file)   # first: a newer file's other keys and values are no mistake in it
    raw_meshes = data.get("meshes") if isinstance(data.get("meshes"), list) else []
    v2_keys = (["precision"] if "precision" in data else []) + sorted(
        {f"meshes[*].{k}" for m in raw_meshes if isinstance(m, dict) for k in ("settings", "boundary") if k in m})
    v3_keys = [k for k in ("engine", "pipelines") if k in data] + sorted(
        {f"meshes[*].{k}" for m in raw_meshes if isinstance(m, dict) for k in ("pipeline", "alongside") if k in m})
    # A key newer than the file's version, also at its default: read by the older version's rules it would change
    # what was priced (version 1 had neither precision nor settings: bf16, the default settings), and a file that
    # says that version and writes it was not written by that hetauto
    for since, keys in ((2, v2_keys), (3, v3_keys)):
        if 1 <= version < since and keys:
            raise InputError(f"is {version}, but the plan uses version-{since} keys ({', '.join(keys)})", file=file,
                             field="version", fix=f"write version: {since} (or drop those keys)")
    model = model_from_dict(require_mapping(get(data, "model", dict, file=file), "model", file), file=file,
                            prefix="model.")
    gbs = get(data, "global_batch_size", int, file=file)
    # their values are checked once, by Plan (every plan is built through it); its errors are named with the file
    precision = get(data, "precision", str, default=DEFAULT_PRECISION, file=file)
    engine = get(data, "engine", str, default=DEFAULT_ENGINE, file=file)
    pipeline_samples = []
    for p, raw in enumerate(get(data, "pipelines", list, default=[], file=file)):
        raw = require_mapping(raw, f"pipelines[{p}]", file)
        reject_unknown(raw, {"samples"}, file=file, prefix=f"pipelines[{p}].")
        pipeline_samples.append(get(raw, "samples", int, file=file, prefix=f"pipelines[{p}].",
                                    fix="write {samples: N}: the samples this pipeline trains per iteration"))
    meshes = []
    for i, raw in enumerate(get(data, "meshes", list, file=file)):
        p = f"meshes[{i}]."
        raw = require_mapping(raw, f"meshes[{i}]", file)
        reject_unknown(raw, _MESH_KEYS, file=file, prefix=p)
        # An empty `tp:` is YAML's null: read as the default it would give TP 1 silently (and a confusing
        # sequence-parallel message); a mesh's value is written or left out
        blank = next((k for k in ("tp", "dp", "recompute", "pipeline", "alongside") if k in raw and raw[k] is None),
                     None)
        if blank:
            raise InputError("has no value (an empty YAML value is null)", file=file, field=p + blank,
                             fix=f"write the mesh's {blank}, or leave the key out for its default (docs/plan-format.md)")
        # (null alone is "no block": false, [] or 0 are not mappings and are refused, as a string is)
        boundary = require_mapping({} if raw.get("boundary") is None else raw["boundary"], f"meshes[{i}].boundary",
                                   file)
        reject_unknown(boundary, {"schedule", "depth"}, file=file, prefix=f"{p}boundary.")
        try:
            meshes.append(Mesh(
                # checked as an inventory's: it names the emitted NAME.sh and is a word in its shell script
                cluster=check_cluster_name(str(get(raw, "cluster", (str, int), file=file, prefix=p)), file=file,
                                           field=p + "cluster"),
                device_type=get(raw, "device_type", str, file=file, prefix=p),
                tp=get(raw, "tp", int, default=1, file=file, prefix=p),
                dp=get(raw, "dp", int, default=1, file=file, prefix=p),
                micro_batch_size=get(raw, "micro_batch_size", int, file=file, prefix=p),
                recompute=get(raw, "recompute", str, default="none", file=file, prefix=p),
                stage_layers=tuple(_layer_counts(get(raw, "stage_layers", list, file=file, prefix=p), p, file)),
                setting_overrides=_settings_as_written(raw, engine, precision, f"meshes[{i}].settings",
                                                       file),
                boundary_schedule=get(boundary, "schedule", str, default="blocking", file=file, prefix=f"{p}boundary."),
                boundary_depth=get(boundary, "depth", int, default=0, file=file, prefix=f"{p}boundary."),
                pipeline=get(raw, "pipeline", int, default=0, file=file, prefix=p),
                alongside=get(raw, "alongside", bool, default=False, file=file, prefix=p),
            ))
        except InputError as exc:
            raise exc.within(file=file, prefix=f"meshes[{i}]") if exc.file is None else exc from None
        except (TypeError, ValueError) as exc:
            raise InputError(f"has a malformed value ({exc})", file=file, field=f"meshes[{i}]",
                             fix="compare it with docs/plan-format.md") from None
    if data.get("estimate") is not None:     # informational, but every reader takes it for a mapping
        require_mapping(data["estimate"], "the plan's estimate", file)
    if data.get("inventory") is not None and version < 4:
        data = {**data, "inventory": _inventory_as_written(data["inventory"])}
    if data.get("inventory") is not None:
        # the stored inventory is what emit reads node sizes and memory from: a broken one is named here, not as a
        # plan that "does not list" its own clusters
        try:
            inventory_from_dict(data["inventory"], file=file)
        except InputError as exc:
            raise exc.within(file=file, prefix="inventory") from None
    try:
        plan = Plan(model=model, global_batch_size=gbs, meshes=tuple(meshes),
                    inventory=data.get("inventory"), estimate=data.get("estimate"), version=version,
                    precision=precision, pipeline_samples=tuple(pipeline_samples), engine=engine)
    except InputError as exc:
        raise exc.within(file=file) from None
    _check_engine_runs_it(plan, file)
    return plan


def _settings_as_written(raw: dict, engine: str, precision: str, field: str, file: str | None) -> dict:
    """A mesh's settings overrides; under an engine that does not run every setting (DeepSpeed's), a setting the
    file leaves out is what that engine runs at the mesh's precision (Plan.settings_as_run), not Megatron's default
    (which it would refuse as asking for more)."""
    from ..spec.devices import get_device
    from .engines import ENGINES, as_run_by
    from .settings import default_settings
    written = dict(require_mapping({} if raw.get("settings") is None else raw["settings"], field, file))
    tp = raw.get("tp", 1)
    if engine not in ENGINES or not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        return written          # (Plan and Mesh name these)
    base = default_settings(tp).to_dict()
    try:        # the precision the mesh trains in (Plan.mesh_precision: CPU processes train in fp32)
        precision = get_device(str(raw.get("device_type"))).at_precision(precision).precision
    except InputError:
        precision = ""      # (Plan and Mesh name an unknown device or precision)
    runs = as_run_by(default_settings(tp), engine, precision).to_dict()
    if (written.get("grad_reduce_dtype") == "fp32" and runs["grad_reduce_dtype"] == "param"
            and written.get("distributed_optimizer", base["distributed_optimizer"]) is True):
        # DeepSpeed's fp16 with ZeRO-1 reduces in fp16 (engines.py as_run_by); a plan written before that was
        # priced says fp32, which this version would refuse as a setting the engine does not run: read as it runs
        print(f"hetauto: note: {file or 'the plan'}: {field}.grad_reduce_dtype fp32 is read as param: engine "
              f"{engine} reduces fp16 gradients in fp16 under ZeRO-1 (a plan written before hetauto priced that "
              "says fp32); re-plan or write param to drop this note", file=sys.stderr)
        written["grad_reduce_dtype"] = "param"
    return {**{k: v for k, v in runs.items() if base[k] != v}, **written}


def _check_engine_runs_it(plan: Plan, file: str | None) -> None:
    """A file that records an engine of one uniform pipeline (DeepSpeed's) describes a job that engine runs:
    `hetauto plan --engine deepspeed` plans nothing else, and a hand-written or edited file that asks for more would
    be priced and emitted as if it ran. (`hetauto simulate --engine deepspeed` of another engine's plan still prices
    how that engine would run it, and says it cannot; emit/deepspeed.py lists the gaps.)"""
    from ..spec.devices import get_device
    from .engines import DEFAULT_ENGINE, ENGINES
    from .shapes import uniform_topology_gaps
    engine = ENGINES[plan.engine]
    other = (f"drop 'engine' (hetauto's runtime and Megatron-LM run it as written) or re-plan with --engine "
             f"{plan.engine}")
    if plan.precision == "fp8" and not engine.fp8:
        raise InputError(f"is fp8: engine {plan.engine} (the file's 'engine') has no fp8 setting", file=file,
                         field="precision", fix=f"write bf16, fp16 or fp32, or {other}")
    if plan.engine == DEFAULT_ENGINE:   # it runs every setting as written (and a mesh's precision is checked
        return                          # where it is used: fp8 on a device without it is refused by name there)
    for k, m in enumerate(plan.meshes):
        # a setting the engine does not run (a hand edit, or a settings block left out: Megatron's defaults) would
        # be priced and emitted as if it ran
        try:
            runs = plan.settings_as_run(k).to_dict()
        except InputError as exc:       # (a mesh's device lacking the plan's precision: said of this file)
            raise exc.within(file=file) from None
        asked = m.settings.to_dict()
        key = next((key for key in runs if asked[key] != runs[key]), None)
        if key is not None:
            have, run = (yaml.safe_dump(v).split("\n")[0] for v in (asked[key], runs[key]))   # (as YAML writes it)
            raise InputError(f"is {have}: engine {plan.engine} (the file's 'engine') runs {run}", file=file,
                             field=f"meshes[{k}].settings.{key}", fix=f"write {run} (what it runs), or {other}")
    if not engine.simple_only:
        return
    meshes = plan.meshes
    why = f"engine {plan.engine} (the file's 'engine') runs one uniform pipeline"
    for gap in uniform_topology_gaps(meshes, [get_device(m.device_type).vendor for m in meshes]):
        if gap in ("tp", "dp", "micro_batch_size"):
            k = next(k for k, m in enumerate(meshes) if getattr(m, gap) != getattr(meshes[0], gap))
            raise InputError(f"is {getattr(meshes[k], gap)} where meshes[0] has {getattr(meshes[0], gap)}: {why}, "
                             "one " + {"tp": "TP", "dp": "DP", "micro_batch_size": "micro-batch"}[gap] + " size for every mesh", file=file, field=f"meshes[{k}].{gap}",
                             fix=f"give every mesh the same {gap}, or {other}")
        if gap == "vendor":
            vendors = {get_device(m.device_type).vendor: k for k, m in enumerate(meshes)}
            raise InputError(f"mixes vendors ({', '.join(sorted(vendors))}): {why} on one collective library",
                             file=file, field=f"meshes[{max(vendors.values())}].device_type", fix=other)
        if gap == "selective" and not engine.selective_recompute:
            k = next(k for k, m in enumerate(meshes) if m.recompute == "selective")
            raise InputError(f"is selective: {why} and checkpoints whole layers only", file=file,
                             field=f"meshes[{k}].recompute", fix=f"write full (what it would run) or none, or {other}")
    if engine.blocking_boundaries:
        k = next((k for k, m in enumerate(meshes) if m.boundary_schedule != "blocking"), None)
        if k is not None:
            raise InputError(f"is {meshes[k].boundary_schedule}: {why} and blocks on every transfer", file=file,
                             field=f"meshes[{k}].boundary.schedule", fix=f"drop the boundary block, or {other}")


def _inventory_as_written(inventory):
    """A version 1-3 plan's stored inventory with the meaning it had then: a cluster without `tf32` ran its fp32
    GEMMs without TF32 (version 4 makes TF32 the default of devices that have it)."""
    from ..spec.devices import canonical_device_name, CATALOG
    if not isinstance(inventory, dict) or not isinstance(inventory.get("clusters"), list):
        return inventory        # malformed: inventory_from_dict names it
    clusters = []
    for c in inventory["clusters"]:
        name = canonical_device_name(c.get("device", "")) if isinstance(c, dict) else None
        if name is not None and "tf32" not in c and CATALOG[name].has_tf32:
            c = {**c, "tf32": False}
        clusters.append(c)
    return {**inventory, "clusters": clusters}


def load_plan(path: str) -> Plan:
    """The plan in a YAML or JSON file."""
    return plan_from_dict(load_yaml_file(path, "plan"), file=path)
