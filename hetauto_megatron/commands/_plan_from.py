"""`hetauto plan --from OLD`: what a re-plan keeps of the old plan's job and search where no flag is given."""
from __future__ import annotations

import sys


# The job a plan trains (argparse name -> flag; the flags' defaults), which --from keeps unless a flag is given.
JOB_FLAGS = {"global_batch_size": "--global-batch-size", "precision": "--precision", "seq_length": "--seq-length",
             "engine": "--engine", "boundary_schedule": "--boundary-schedule", "shapes": "--shapes",
             "memory_job": "--memory-job"}
JOB_DEFAULTS = {"global_batch_size": 512, "precision": "bf16", "engine": "megatron", "boundary_schedule": "overlapped",
                "shapes": "all"}


def keep_job_of(old, args) -> dict:
    """--from: a re-plan after an inventory change trains the same job on other devices, so each of the old plan's
    job settings whose flag was not given is taken from it (set on `args`) -> {argparse name: value taken}."""
    from ..plan.engines import ENGINES
    from ._common import recorded_memory_job
    search = _search_record(old, args.from_plan)
    job = {"global_batch_size": old.global_batch_size, "precision": old.precision,
           "seq_length": old.model.seq_length, "engine": old.engine}
    if memory_job := recorded_memory_job(old, args.from_plan):
        job["memory_job"] = memory_job
    if not ENGINES[args.engine or old.engine].simple_only:     # (DeepSpeed's engine runs one pipeline anyway)
        # the --shapes the old plan was searched with (its estimate.search records it): a plan of one pipeline of
        # single meshes searched with every shape re-plans with every shape, since the new inventory may make
        # another shape win; a plan without the record: the default, unless it has the other shapes anyway
        # (a DeepSpeed plan records "simple", which its engine forced, not a choice a Megatron re-plan keeps)
        recorded = None if ENGINES[old.engine].simple_only else (search.get("shapes") or {}).get("setting")
        job["shapes"] = recorded if recorded in ("all", "simple") and old.is_simple else "all"
    # (DeepSpeed's engine blocks at every boundary: an old plan of its searched none, a new one would run none)
    if old.engine == "megatron" and not ENGINES[args.engine or old.engine].blocking_boundaries:
        from ..plan.replan import searched_schedule
        schedule = searched_schedule(old, default=None)      # (None: the plan does not tell; the default runs)
        if schedule is not None:
            job["boundary_schedule"] = schedule
    kept = {}
    for name, value in job.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
            kept[name] = value
    from ..plan.settings import JOB_SETTING_KEYS
    kept.update(_kept_settings(old, args.from_plan,
                               given=[k for k in JOB_SETTING_KEYS if getattr(args, k, None) is not None]))
    return kept


def _kept_settings(old, file: str, given=()) -> dict:
    """The old plan's dropouts where every mesh has the same (they change what is trained, so the re-plan trains
    them too; the search never chooses them) -> {setting: value}. Says on stderr where its meshes differ (none
    kept: no one value is the job's), and which of its other settings the new plan leaves for the defaults: the
    search chooses none of them, and each would change the new meshes' time or memory."""
    from ..errors import InputError
    from ..plan.engines import as_run_by
    from ..plan.settings import JOB_SETTING_KEYS, default_settings, job_settings, shared_job_settings
    shared = shared_job_settings(old.meshes)
    kept = {} if shared is None else dict(shared)      # ({} where the old plan trains without dropout)
    unset = [k for k in JOB_SETTING_KEYS if k not in given]     # (a flag given decides its own: plan.py)
    if shared is None and unset:
        said = "; ".join(f"meshes[{i}] ({m.cluster}): "
                         + (", ".join(f"{k} {v}" for k, v in job_settings(m.settings.to_dict())) or "none")
                         for i, m in enumerate(old.meshes))
        print(f"hetauto plan: the dropouts of {file} not kept: its meshes differ ({said}), so the new plan runs "
              f"no {' and no '.join(unset)}; give the job's with "
              f"{' and '.join('--' + k.replace('_', '-') + ' P' for k in unset)}, or every mesh of it the same "
              "settings.hidden_dropout and attention_dropout to keep them", file=sys.stderr)
    others: dict = {}
    for i, m in enumerate(old.meshes):
        try:    # (against what its engine runs by default: DeepSpeed's no SP)
            runs = old.settings_as_run(i).to_dict()
            base = as_run_by(default_settings(m.tp), old.engine, old.mesh_precision(i)).to_dict()
        except InputError:      # a device of it that cannot train in its precision: the re-plan's decides
            runs, base = m.settings.to_dict(), default_settings(m.tp).to_dict()
        for k in runs:
            said = f"{k} {str(runs[k]).lower() if isinstance(runs[k], bool) else runs[k]}"
            if k not in JOB_SETTING_KEYS and runs[k] != base[k] and said not in others.setdefault(m.cluster, []):
                others[m.cluster].append(said)
    if any(others.values()):
        print(f"hetauto plan: settings of {file} not kept (the search does not choose them; the new plan runs "
              "their defaults): " + "; ".join(f"{c}: {', '.join(v)}" for c, v in others.items() if v),
              file=sys.stderr)
    return kept


def at_kept_precision(inventory, old, plan_file: str):
    """The inventory at the precision --from kept of the old plan (no --precision given): where a cluster cannot
    train in it, the refusal names the plan file's `precision`, not the flag, and how to re-plan in another."""
    from ..spec.devices import PRECISIONS
    from ._common import at_plan_precision
    common = [p for p in PRECISIONS if p != old.precision and not inventory.unable_at(p)]
    return at_plan_precision(inventory, old, plan_file, fix=(
        f"give --precision {' or '.join(common)} (--from keeps the plan's precision unless it is given), or "
        if common else "no precision suits every cluster: ") + "leave the clusters without it out (hetauto plan "
        "--exclude-clusters, or remove them from the inventory)")


def drop_seq_length_for_another_model(old, args, kept: dict, read) -> bool:
    """--from with a model other than the old plan's (same layers and hidden size, else refused): the sequence length
    belongs to the model, so the given model's own is planned (unless --seq-length is given), not the old plan's,
    which keep_job_of took before the model was read. Whether --model (`read`: read_model, read once; load_inputs
    builds the model planned from it too) is another model; if so, the kept sequence length is dropped here, before
    load_inputs builds the model, so that it is built once, at its own length: built at the old plan's, a model of
    fewer learned positions was told "--seq-length N is longer than the learned positions" (a flag never typed)."""
    import dataclasses
    from ..spec.model import model_at
    if "seq_length" not in kept:
        return False
    # built quietly (load_inputs prints its notes), at the old plan's sequence length: the same model then equals
    # the old plan's (its name aside: a copy of the model file elsewhere is the same model)
    model = model_at(read, seq_length=kept["seq_length"])
    if dataclasses.replace(model, name=old.model.name) == old.model or (model.num_layers, model.hidden_size) != (
            old.model.num_layers, old.model.hidden_size):
        return False        # (the same model keeps it; one of other layers is refused after load_inputs)
    from ..errors import InputError
    try:
        model_at(read)
    except InputError:
        return False        # a model of no sequence length of its own (a config.json without positions) keeps it
    del kept["seq_length"]
    args.seq_length = None
    return True


def say_own_seq_length(old, args, model) -> None:
    """What drop_seq_length_for_another_model did, once the model (read at its own length) is known to be planned."""
    import dataclasses
    # what differs, besides the lengths: a preset and a plan's model may share a name (tiny) and not a shape
    differ = [f"{f.name} {getattr(old.model, f.name)} there, {getattr(model, f.name)} here"
              for f in dataclasses.fields(model) if f.name not in ("name", "seq_length", "max_position_embeddings")
              and getattr(model, f.name) != getattr(old.model, f.name)]
    what = f"{old.model.name}" + (f": {'; '.join(differ[:3])}" if differ else "")
    print(f"hetauto plan: --seq-length not kept from {args.from_plan}: --model {args.model} is not the model it was "
          f"made for ({what}), so its own sequence length, {model.seq_length}, is planned (give "
          "--seq-length for another)", file=sys.stderr)


def _search_record(old, file: str) -> dict:
    """The old plan's estimate.search (how it was searched), {} where it has none; a hand-edited one of another
    kind is an InputError naming the field (the estimate is never read for decisions but by --from)."""
    from ..errors import InputError
    from ..plan.constraints import Constraints
    estimate = old.estimate if isinstance(old.estimate, dict) else {}
    try:
        Constraints.from_record(estimate.get("search"))     # the mapping and its constraints
    except InputError as exc:
        raise exc.within(file=file) from None
    search = estimate.get("search") or {}
    if not isinstance(search.get("shapes") or {}, dict):
        raise InputError("must be a mapping (setting: all or simple, as hetauto plan writes it)", file=file,
                         field="estimate.search.shapes",
                         fix="remove the plan's estimate.search block (hetauto plan writes it) or correct it")
    return search


def _check_kept(con, names: list, model, inventory, args) -> None:
    """The constraints kept from the old plan's record (`names`), checked alone as the search checks flags: one
    that cannot mean anything here names the record it came from, not a flag the user did not give."""
    from ..errors import InputError
    from ..plan.constraints import Constraints, check
    only = Constraints(objective=con.objective if "objective" in names else "throughput",
                       **{n: getattr(con, n) for n in names if n != "objective"})
    try:
        check(only, model, inventory, args.global_batch_size)
    except InputError as exc:
        flag = exc.field if exc.field and exc.field.startswith("--") else None
        unpriced = "price_per_device_hour" in (exc.field or "")     # the kept --objective cost needs every price
        if flag:
            fix = f"give {flag} on the command line to replace it, or correct the plan's estimate.search ({exc.fix})"
        elif unpriced:
            fix = f"{exc.fix}; or --objective throughput in place of the plan's --objective cost"
        else:       # (a field of the inventory, e.g. clusters[0].price_per_device_hour, is no flag to give)
            fix = exc.fix
        what = flag or ("--objective cost" if unpriced else "a constraint")
        raise InputError(f"{exc.reason} (kept from its estimate.search, as {what}: --from "
                         "re-plans under the constraints the plan was made under)", file=args.from_plan,
                         field="estimate.search", fix=fix) from None


def keep_search_of(old, args, con, inventory, kept: dict, model=None):
    """--from: the old plan's objective and constraints (its estimate.search) where no flag sets them; says on
    stderr what was kept of the job and of these (adding the latter to `kept`) -> the constraints to search under."""
    from ..errors import InputError
    from ..plan.constraints import Constraints, describe, keep_constraints
    try:
        recorded = Constraints.from_record((old.estimate or {}).get("search"))
    except InputError as exc:
        raise exc.within(file=args.from_plan) from None
    given = {name for name, flag in (("objective", args.objective), ("max_devices", args.max_devices),
                                     ("use_clusters", args.use_clusters), ("exclude_clusters", args.exclude_clusters),
                                     ("tp", args.tp), ("recompute", args.recompute), ("max_pp", args.max_pp),
                                     ("micro_batch_size", args.micro_batch_size),
                                     ("max_iteration_s", args.max_iteration_s)) if flag not in (None, [])}
    con, names, dropped = keep_constraints(recorded, con, given, inventory, args.global_batch_size)
    if model is not None and names:
        _check_kept(con, names, model, inventory, args)
    # (the dropouts have no flag: the plan's meshes' settings)
    shown = [f"{JOB_FLAGS[k]} {v}" if k in JOB_FLAGS else f"settings.{k} {v}" for k, v in kept.items()]
    for name in names:
        kept[name] = con.objective if name == "objective" else con.active[name]
        shown.append(f"--objective {con.objective}" if name == "objective" else describe(con, name))
    if shown:
        print(f"hetauto plan: the job and search of {args.from_plan} kept: " + ", ".join(shown)
              + " (a flag given on the command line wins)"
              + (f"; not kept: {', '.join(dropped)}" if dropped else ""), file=sys.stderr)
    return con
