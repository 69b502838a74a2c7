"""Arguments and loading shared by the planner commands (plan, simulate)."""
from __future__ import annotations

import dataclasses
import sys


def add_model_inventory_args(parser, *, stored_in_plan: bool = False) -> None:
    """--model, --inventory and the options every planner command shares. `stored_in_plan`: both may be left
    out beside --plan, whose file carries them (load_inputs)."""
    from ..spec.whatif import keys_line
    stored = "; default with --plan: the one stored in the plan" if stored_in_plan else ""
    parser.add_argument("--model", required=not stored_in_plan, metavar="M",
                        help="a preset (llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b, mistral-7b, "
                             "gpt3-175b, tiny), a model YAML (docs/inputs.md) or a Hugging Face config.json" + stored)
    parser.add_argument("--inventory", required=not stored_in_plan, metavar="I",
                        help="device inventory YAML (docs/inputs.md)" + stored)
    parser.add_argument("--seq-length", type=int, metavar="N", help="override the model's sequence length")
    parser.add_argument("--cost-model", metavar="DIR",
                        help="a learned cost model from 'hetauto fit' (default: the analytic model); device types "
                             "it has no data for fall back to the analytic model")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="what-if: override the inventory without editing it (repeatable): " + keys_line()
                             + "; units in docs/explain.md; e.g. "
                             "--set link.h800-ascend.bandwidth_gbps=100 --set cluster.ascend.nodes=8")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def add_precision_arg(parser, default: str | None) -> None:
    from ..spec.devices import PRECISIONS
    parser.add_argument("--precision", choices=PRECISIONS, default=default,
                        help="training precision of the job: bf16 (default), fp16, fp8 (Transformer Engine, on "
                             "devices that have it) or fp32 (its GEMMs on the TF32 tensor cores where the device "
                             "has them, as Transformer Engine runs them, unless the inventory's cluster says tf32: "
                             "false); sets each device's peak and every tensor's element size, is stored in the plan "
                             "and emitted as Megatron's flags (cpu dry runs: fp32)"
                             + ("" if default else "; default: the plan's, else bf16"))


def add_memory_job_arg(parser) -> None:
    parser.add_argument("--memory-job", choices=("sailor-deepspeed", "none"), default=None,
                        help="also require every stage to fit as another framework's job holds memory: "
                             "sailor-deepspeed = Sailor's Megatron-DeepSpeed fork as its simulator counts it (fp32, "
                             "Adam state unsharded, no sequence parallelism, unfused attention, DeepSpeed's 8 bytes "
                             "per parameter more and its pipeline engine's buffers); docs/peers.md. A plan records "
                             "it, and simulate and plan --from apply it; none: not the plan's")


def inventory_of(path: str | None, plan, plan_path: str | None):
    """The inventory of --inventory `path`, else the one the plan stores (InputError naming the plan without one)."""
    from ..errors import InputError
    from ..spec.inventory import inventory_from_dict, load_inventory
    if path is not None:
        return load_inventory(path)
    if plan is not None and plan.inventory:
        from ..plan.simulate import check_plan_clusters, check_plan_links
        try:
            inventory = dataclasses.replace(inventory_from_dict(plan.inventory, file=plan_path), stored_in_plan=True)
        except InputError as exc:
            raise exc.within(prefix="inventory") from None
        try:    # a mesh's cluster the inventory lacks first: the plan's field, not a link to add to the inventory
            check_plan_clusters(plan, inventory)
        except InputError as exc:
            raise exc.within(file=plan_path) from None
        try:
            check_plan_links(plan, inventory)     # up front, and named as the stored inventory's field
        except InputError as exc:
            raise exc.within(prefix="inventory") from None
        return inventory
    raise InputError("carries no inventory to simulate it on", file=plan_path, field="inventory",
                     fix="pass --inventory INV (plans written by 'hetauto plan -o' carry theirs)")


def load_inputs(args, plan=None, plan_path: str | None = None, model_read=None):
    """(model, inventory, cost model) from the command's options; `plan` (read from `plan_path`): the model and
    inventory stored in it stand in for a --model or --inventory left out. `model_read`: --model where the command
    has read it already (spec/model.py read_model), not read again."""
    from ..cost.learned import load_cost_model
    from ..errors import InputError
    from ..spec.model import model_at, read_model, with_seq_length
    from ..spec.whatif import apply_overrides
    if args.seq_length is not None and args.seq_length < 1:
        raise InputError(f"must be at least 1, got {args.seq_length}", field="--seq-length",
                         fix="give the training sequence length in tokens, e.g. --seq-length 4096")
    try:
        if args.model is None:
            model = plan.model if args.seq_length is None else with_seq_length(
                plan.model, args.seq_length, f"{plan_path or 'the plan'}'s model",
                note=lambda line: print(f"note: {line}", file=sys.stderr))
        else:
            model = model_at(model_read or read_model(args.model), seq_length=args.seq_length,
                             note=lambda line: print(f"note: {line}", file=sys.stderr))
    except InputError as exc:
        if args.seq_length is None or exc.field != "seq_length":
            raise
        # the flag's value is at fault, not the model file's
        raise InputError(exc.reason, field="--seq-length",
                         fix="give the training sequence length in tokens, e.g. --seq-length 4096") from None
    inventory = apply_overrides(inventory_of(args.inventory, plan, plan_path), getattr(args, "set", None))
    cost_model = load_cost_model(args.cost_model)
    if getattr(args, "memory_job", None) not in (None, "none"):
        from ..plan.memory_fit import MEMORY_JOBS
        cost_model.memory_job = MEMORY_JOBS[args.memory_job]()     # read by every stage profile (plan/costing.py)
    if hasattr(cost_model, "describe"):
        # Which model prices each device type, and why: a learned model never answers silently for a type
        # (or a precision) it has no measurements of. --json carries the same under "cost_model_why".
        # at the precision priced (--precision, else the plan's: an fp32 plan file was described at bf16, said to
        # be analytic where its figures were the learned model's): the learned model covers a type per element size
        precision = getattr(args, "precision", None) or (plan.precision if plan is not None else None)
        priced = _able(inventory, precision) if precision else inventory
        if priced is not None:
            for line in cost_model.describe(priced.clusters):
                print(f"cost model: {line}", file=sys.stderr)
            apply_memory_job(cost_model, priced)
    elif getattr(args, "precision", None) == "fp32" and (able := _able(inventory, "fp32")) is not None:
        measured_layers_hint(able)
    return model, inventory, cost_model


def _able(inventory, precision: str):
    """The inventory at `precision`, for the notes above only: without the clusters whose device lacks it (which
    `--exclude-clusters` may still take out, or the command refuses later, naming them); None where no cluster
    can train in it: the command refuses it later, naming where the precision came from (--precision, or a plan
    file's `precision`, which plan --from keeps)."""
    unable = inventory.unable_at(precision)
    if len(unable) == len(inventory.clusters):
        return None
    return inventory.without(unable).with_precision(precision)


def measured_layers_hint(priced) -> None:
    """Priced by the analytic model (no --cost-model): say so where measured layer times of an inventory's device
    type, in the plan's arithmetic, ship with hetauto (Sailor's fp32 runs: hetauto_megatron/data/sailor)."""
    from ..cost import features as F
    from ..cost.learned.sailor import SAILOR_DATA, load_sailor, sailor_device_infos
    infos = sailor_device_infos(load_sailor(SAILOR_DATA))
    names = sorted({c.device.name for c in priced.clusters if c.device.name in infos
                    and infos[c.device.name].arithmetic == F.device_arithmetic(c.device)})
    if names:
        print(f"cost model: analytic (datasheets) for every device type; measured fp32 layer times of "
              f"{', '.join(names)} ship with hetauto: 'hetauto fit --sailor -o MODEL', then '--cost-model MODEL', "
              "prices them from those (docs/cost-model-learned.md)", file=sys.stderr)


def without_unused_unable(inventory, precision: str, used, command: str | None):
    """The inventory without the clusters a plan or layout does not use (`used`: cluster names) whose device cannot
    train at `precision` (said on stderr, unless `command` is None: the caller said it already): `hetauto plan`
    left them out of its search (--exclude-clusters), so pricing the plan, or searching its alternatives, on the
    same inventory leaves them out too; a cluster it uses is refused as before."""
    used = set(used)
    unable = [n for n in inventory.unable_at(precision) if n not in used]
    if not unable or len(unable) == len(inventory.clusters):
        return inventory
    if command:
        print(f"{command}: left out of the inventory: {', '.join(unable)} (not used here, and cannot train in "
              f"{precision})", file=sys.stderr)
    return inventory.without(unable)


def at_plan_precision(inventory, plan, plan_file: str | None, fix: str | None = None):
    """The inventory priced at the plan's precision; where a device of it cannot train in that precision, the
    error names the plan file's `precision` (where the value came from), not a flag the user did not give.
    `fix`: the command's own (default: re-plan, or price it on another inventory)."""
    from ..errors import InputError
    try:
        return inventory.with_precision(plan.precision)
    except InputError as exc:
        raise InputError(f"the plan trains in {plan.precision}, but {exc.reason}", file=plan_file, field="precision",
                         fix=fix or f"re-plan for this inventory (hetauto plan --precision with one every cluster "
                                    f"has), or simulate it on an inventory whose clusters train in {plan.precision}"
                         ) from None


def recorded_memory_job(plan, plan_file: str | None) -> str | None:
    """The --memory-job a plan was made with (its estimate.search records it), which every command that prices the
    plan applies too, so that they all report the memory the plan was fitted to."""
    from ..errors import InputError
    from ..plan.memory_fit import MEMORY_JOBS
    search = (plan.estimate or {}).get("search")
    name = search.get("memory_job") if isinstance(search, dict) else None
    if name is not None and (not isinstance(name, str) or name not in MEMORY_JOBS):
        raise InputError(f"is {name!r}, not a memory job this hetauto knows", file=plan_file,
                         field="estimate.search.memory_job",
                         fix=f"write one of: {', '.join(MEMORY_JOBS)}, or delete the key (docs/plan-format.md)")
    return name


def warn_if_priced_otherwise(cost_model, plan, plan_file: str | None, command: str) -> None:
    """Say on stderr where a plan that a learned model priced (its estimate.cost_model) is now priced by the
    analytic one (no --cost-model given): its figures would differ from the plan's without a word, and explain's
    bottleneck and runners-up would be another model's."""
    recorded = (plan.estimate or {}).get("cost_model")
    if hasattr(cost_model, "coverage") or not isinstance(recorded, dict):
        return      # (a learned model given says itself what it covers: LearnedCostModel.describe)
    learned = sorted(str(d) for d, src in recorded.items() if src == "learned")
    if learned:
        print(f"hetauto {command}: warning: {plan_file} was priced with a learned cost model for "
              f"{', '.join(learned)} (its estimate.cost_model); without --cost-model the analytic model prices it "
              "here: pass --cost-model with the directory it was planned with to compare like with like",
              file=sys.stderr)


def use_recorded_memory_job(cost_model, plan, plan_file: str | None, given: str | None = None) -> None:
    """Set the plan's recorded memory job on `cost_model` (unless --memory-job `given` already set one)."""
    from ..plan.memory_fit import MEMORY_JOBS
    name = recorded_memory_job(plan, plan_file)
    if name and not given:
        cost_model.memory_job = MEMORY_JOBS[name]()


def apply_memory_job(cost_model, inventory) -> None:
    """plan/memory_fit.py resolve_memory_job on the inventory at the plan's precision, saying so on stderr."""
    from ..plan.memory_fit import resolve_memory_job
    names = resolve_memory_job(cost_model, inventory)
    if names:
        print(f"memory: {', '.join(names)} priced from Sailor's fp32 measurements: every stage must also fit as "
              "Sailor's Megatron-DeepSpeed job holds memory (docs/peers.md)", file=sys.stderr)


def plan_error(exc, plan_file: str, sets: list[str] | None):
    """The InputError of pricing a plan file, naming that file: the plan fitted its inventory, so a mesh that no
    longer fits one that --set changed says the override did it (simulate, explain and compare alike)."""
    from ..errors import InputError
    if exc.file is not None:
        return exc
    if sets and exc.field and exc.field.startswith("meshes"):
        return InputError(f"{exc.reason} (in the inventory as --set {' '.join(sets)} changed it)", file=plan_file,
                          field=exc.field, fix=f"{exc.fix.rstrip('.')}; or change --set" if exc.fix else "change --set")
    return exc.within(file=plan_file)


def naming_inventory(reason: str, source: str | None, plan_file: str | None = None) -> str:
    """A plan-against-inventory reason that names the inventory file too (the paragraph names the plan file, whose
    field it is), unless it already does or the inventory is the one the plan file carries."""
    if not source or source in reason or source == plan_file:
        return reason
    return f"{reason} (inventory {source})"


def check_budget_s(budget_s: float | None, what: str, example: int) -> None:
    """--budget-s (plan's search, explain's re-plans): positive seconds; NaN too is refused, as it would never stop
    a search."""
    from ..errors import InputError
    if budget_s is not None and not budget_s > 0:
        raise InputError(f"must be positive, got {budget_s}", field="--budget-s",
                         fix=f"give {what} in seconds, e.g. --budget-s {example}")


def check_output_file(path: str | None, flag: str, example: str = "plan.yaml") -> None:
    """Refuse an output file that cannot be written before any work is done (a directory, a missing folder);
    `example`: the file name the fix suggests."""
    import os
    import tempfile

    from ..errors import InputError
    if path is None:
        return
    if not path.strip():     # an empty -o '' wrote nothing without a word
        raise InputError("is an empty file name", field=flag, fix=f"give a file name, e.g. {flag} {example}")
    if os.path.isdir(path):
        raise InputError(f"{path!r} is a directory", field=flag, fix=f"give a file name, e.g. {flag} {example}")
    folder = os.path.dirname(path) or "."
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise InputError(f"{folder!r} in {path!r} is a file, not a folder", field=flag,
                         fix=f"name a file in an existing folder, e.g. {flag} {example}")
    if not os.path.isdir(folder):
        raise InputError(f"the folder {folder!r} of {path!r} does not exist", field=flag,
                         fix="create the folder first, or write the file elsewhere")
    if not os.access(folder, os.W_OK):
        raise InputError(f"the folder {folder!r} is not writable", field=flag, fix="write the file elsewhere")
    if os.path.exists(path):    # written in place (a file, /dev/fd/1, a process substitution): nothing is created
        return
    try:    # a file made there too: root passes os.access on /sys or a read-only mount, where the write failed
        with tempfile.TemporaryFile(dir=folder):    # only after the work was done
            pass
    except OSError as exc:
        raise InputError(f"cannot write {path!r}: its folder {folder!r} takes no new file ({exc.strerror or exc})",
                         field=flag, fix="write the file elsewhere") from None


def check_output_dir(path: str, flag: str) -> None:
    """Refuse an output directory that cannot be created before any work is done: a file of that name, or a
    parent that is not a directory (the directory itself is created when the results are written)."""
    import os
    import tempfile

    from ..errors import InputError
    if os.path.isdir(path):
        try:    # a directory no file can be made in (/sys, a read-only mount) failed only after the work was done
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as exc:
            raise InputError(f"{path!r} cannot be written: {exc.strerror or exc}", field=flag,
                             fix="choose a directory you can write (it is created if needed)") from None
        return
    if os.path.exists(path):
        raise InputError(f"{path!r} exists and is not a directory", field=flag,
                         fix="name a directory (it is created if needed)")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise InputError(f"{path!r} cannot be created: {parent!r} is a file", field=flag,
                         fix="name a directory under a folder")

TIMELINE_SUFFIXES = (".json", ".png", ".svg", ".pdf")


def check_timeline_paths(paths: list[str] | None, flag: str = "--timeline") -> None:
    from ..errors import InputError
    for path in paths or []:
        if not path.lower().endswith(TIMELINE_SUFFIXES):
            raise InputError(f"{path!r}: the file name must end in .json (a Chrome/Perfetto trace) or .png (a "
                             "picture; .svg and .pdf work too)", field=flag, fix="e.g. --timeline plan.json or "
                             "--timeline plan.png")
        # where it cannot be written, said now: not after a search (and its plan file) has run
        check_output_file(path, flag, example="plan.png")


def write_timelines(paths: list[str] | None, timelines: list) -> list[str]:
    """Write `timelines` (plan/timeline.py) to every path: a trace for .json, a picture otherwise."""
    from ..emit.picture import write_timeline
    from ..errors import InputError
    for path in paths or []:
        if not path.lower().endswith(".json"):
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise InputError("drawing a timeline needs matplotlib, which is not installed", field="--timeline",
                                 fix="pip install matplotlib (it is in requirements.txt), or write a .json "
                                     "trace instead") from None
        try:
            write_timeline(timelines, path)
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror}", field="--timeline",
                             fix="check that the directory exists and is writable") from None
    return list(paths or [])


def as_priced_on(plan, inventory, who: str):
    """The plan with the inventory it is priced on, so that the summary's TF32 words (an fp32 plan's NVIDIA
    clusters, emit/summary.py) say what the figures assume; where the plan's own inventory, which its launch
    scripts follow (NVIDIA_TF32_OVERRIDE), says otherwise, a note on stderr says so (`who`: the command)."""
    import dataclasses

    if plan.precision != "fp32":
        return plan
    from ..emit.vendor_env import fp32_tf32
    priced = dataclasses.replace(plan, inventory=inventory.to_dict())
    have = {c.name for c in inventory.clusters}     # a cluster the inventory lacks is refused later, named there
    differ = sorted({m.cluster for m in plan.meshes
                     if m.cluster in have and fp32_tf32(plan, m.cluster) != fp32_tf32(priced, m.cluster)})
    for c in differ:
        print(f"{who}: cluster {c} is priced {'with' if fp32_tf32(priced, c) else 'without'} TF32 GEMMs, as "
              f"--inventory says, but the plan's launch scripts run it {'with' if fp32_tf32(plan, c) else 'without'} "
              + ("(the plan's own inventory, its 'tf32')" if plan.inventory else
                 f"(a version {plan.version} plan without an inventory: fp32 without TF32 then)" if plan.version < 4
                 else "(the device type's default: the plan carries no inventory)")
              + "; re-plan with this inventory to launch what is priced",
              file=sys.stderr)
    return priced


# The --json outputs of the commands a script reads: each object says what it is and which version of its keys it
# follows, so a consumer can refuse (or adapt to) another. Bump a kind's version when a key is renamed or removed.
JSON_SCHEMAS = {"plan": 1, "simulate": 1, "explain": 1, "compare": 1, "emit-summary": 1}


def json_document(kind: str, body: dict) -> dict:
    """`body` with `schema` ('hetauto.KIND/N') and `hetauto_version` first (a key of `body` of the same name wins
    nothing: these two are the document's)."""
    from .. import tool_version
    return {"schema": f"hetauto.{kind}/{JSON_SCHEMAS[kind]}", "hetauto_version": tool_version(),
            **{k: v for k, v in body.items() if k not in ("schema", "hetauto_version")}}
