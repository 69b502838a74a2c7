"""`hetauto emit megatron|deepspeed|summary`: turn a plan file into what a job needs to run."""
from __future__ import annotations

import dataclasses
import os
import sys

from ..errors import InputError
from ..outputs import json_text, make_output_dir, refuse_overwriting_inputs, write_text_file
from ..spec._fields import shorten

DESCRIPTION = """\
Turn a plan (from 'hetauto plan', or written by hand: docs/plan-format.md) into launch material.

targets:
  megatron   per cluster, the exact launch: a bash script that runs torchrun on one node of that cluster
             with the HETAUTO_* environment (docs/launch.md), the vendor stack's variables and the
             Megatron-LM arguments (TP, whole-pipeline PP, --pipeline-model-parallel-layout for the
             uneven split, model shape, micro/global batch, recompute, bf16, distributed optimizer,
             --hetauto --hetauto-plan). Printed, or one <cluster>.sh per cluster with -o DIR
             (<cluster>.mesh<i>.sh per launch where a cluster holds several: each on nodes of its own).
  deepspeed  per mesh, a ds_config JSON checked by DeepSpeed's own parser for that mesh's data-parallel
             size, plus the plain list of plan features DeepSpeed cannot express but runs without
             (docs/deepspeed.md). Printed, or ds_config.<cluster>.json files and deepspeed-unsupported.txt with
             -o DIR. A plan whose meshes differ in DP is no DeepSpeed job (its engine has one DP size for every
             stage): exit 2, nothing written.
  summary    the per-stage table (cluster, device, devices, TP/DP, layers, and the plan's estimate of time,
             memory and utilisation when the plan carries one). Printed, or summary.txt with -o DIR.

An invalid plan exits 2 with a message naming the file, the field and the fix, for every target: among others a
plan that uses more devices of a cluster than the inventory it carries has (a hand-edited one)."""

EPILOG = """\
examples:
  hetauto emit summary  --plan examples/llama/plans/llama2-70b-736.yaml
  hetauto emit megatron --plan examples/llama/plans/llama2-70b-736.yaml --cluster ascend
  hetauto emit megatron --plan plan.yaml -o launch/      # then on each node of cluster X:
      NODE_RANK=0 CLUSTER_MASTER_ADDR=x-node0 HETAUTO_MASTER_ADDR=first-node0 launch/X.sh --data-path ...
  hetauto emit deepspeed --plan plan.yaml -o ds/ --json

exit codes: 0 ok, 2 invalid plan or options, or a DeepSpeed emit of meshes of different DP (the message names
file, field and fix)."""

TARGETS = ("megatron", "deepspeed", "summary")


def add_arguments(parser) -> None:
    parser.add_argument("target", choices=TARGETS, help="what to emit (see above)")
    parser.add_argument("--plan", required=True, metavar="PLAN", help="plan file (YAML or JSON)")
    parser.add_argument("--cluster", metavar="NAME",
                        help="only this cluster's launch / configs (default: every cluster)")
    parser.add_argument("-o", "--output", metavar="DIR", help="write files into DIR instead of printing them")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of text")
    parser.add_argument("--script", default=None, metavar="PATH",
                        help="megatron: training script torchrun starts (default pretrain_gpt.py; the launch also "
                             "honours $MEGATRON_SCRIPT)")
    parser.add_argument("--plan-path", default=None, metavar="PATH",
                        help="megatron: plan path as the nodes see it, for --hetauto-plan (default: --plan made "
                             "absolute; the launch also honours $HETAUTO_PLAN)")
    parser.add_argument("--devices-per-node", default=None, metavar="N",
                        help="megatron: processes per node when the plan carries no inventory (default 8); a "
                             "plan's inventory gives each cluster's, and a different N is refused")


def write_files(files: list[tuple], out_dir: str, field: str, keep=()) -> list[str]:
    """Write emitted files ((name, text, mode) each) into `out_dir`, refusing them all before the first is written
    where one would go over a file of `keep` ((option, path) pairs: the command's inputs and the plan it wrote),
    e.g. `plan -o out/summary.txt --emit out`: a refusal half way left some of the files written."""
    paths = [os.path.join(out_dir, name) for name, _, _ in files]
    refuse_overwriting_inputs([(field, path) for path in paths], keep)
    return [write_text_file(path, text, field=field, mode=mode) for path, (_, text, mode) in zip(paths, files)]


# The files of each target (name, text, mode), shared with 'hetauto plan --emit', which names them all before it
# writes anything; the writers below return the paths they wrote.
def megatron_files(launches: list[dict]) -> list[tuple]:
    return [(f"{la['name']}.sh", la["script"], 0o755) for la in launches]


def deepspeed_files(configs: list[dict], unsupported: list[str]) -> list[tuple]:
    text = ("Plan features DeepSpeed cannot express:\n" + "".join(f"- {u}\n" for u in unsupported)
            if unsupported else "none\n")
    return [(f"ds_config.{c['name']}.json", json_text(c["config"], indent=2) + "\n", 0o644) for c in configs] + [
        ("deepspeed-unsupported.txt", text, 0o644)]


def summary_files(text: str) -> list[tuple]:
    return [("summary.txt", text + "\n", 0o644)]


def write_megatron(launches: list[dict], out_dir: str, field: str = "-o", keep=()) -> list[str]:
    return write_files(megatron_files(launches), out_dir, field, keep)


def write_deepspeed(configs: list[dict], unsupported: list[str], out_dir: str, field: str = "-o",
                    keep=()) -> list[str]:
    return write_files(deepspeed_files(configs, unsupported), out_dir, field, keep)


def write_summary(text: str, out_dir: str, field: str = "-o", keep=()) -> list[str]:
    return write_files(summary_files(text), out_dir, field, keep)


def warn_stale(out_dir: str, written: list[str], command: str = "hetauto emit", plans=()) -> list[str]:
    """Launch scripts and DeepSpeed configs in `out_dir` that an earlier emit wrote and this one did not (a plan
    with other clusters or meshes): named on stderr, since launching one starts ranks the plan does not have.
    Only files of the kinds this emit wrote, and scripts only where their header says hetauto wrote them.
    `plans`: names of this plan's other files that this emit left out (--cluster), which are not stale."""
    mine = {os.path.basename(p) for p in written} | set(plans)
    kinds = {name.endswith(".sh") for name in mine if name.endswith(".sh") or name.startswith("ds_config.")}
    stale = []
    for name in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, name)
        if name in mine or not os.path.isfile(path):
            continue
        if True in kinds and name.endswith(".sh"):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    head = f.read(200)
            except OSError:
                continue
            if "\n# hetauto launch for " in head:
                stale.append(name)
        elif False in kinds and name.startswith("ds_config.") and name.endswith(".json"):
            stale.append(name)
    if stale:
        print(f"{command}: {out_dir} still holds {', '.join(stale)} from an earlier emit, not part of this plan: "
              "remove them (launching them would start ranks this plan does not have)", file=sys.stderr)
    return stale


def over_memory(plan, engine: str) -> list[str]:
    """'stage i needs X GiB of Y' for each stage of `plan` that exceeds its device as `engine` runs it, priced on the
    inventory the plan carries ([] without one); an fp8 plan under DeepSpeed at the bf16 its configs say."""
    if not plan.inventory:
        return []
    from ..emit.summary import distinct_gib
    from ..plan.simulate import simulate
    from ..spec.inventory import inventory_from_dict
    if engine != plan.engine:
        plan = plan.for_engine(engine)
    if engine == "deepspeed" and plan.precision == "fp8":   # DeepSpeed's configs have no fp8 setting: they say bf16
        plan = dataclasses.replace(plan, precision="bf16")
    est = simulate(plan, inventory_from_dict(plan.inventory), engine=engine)
    return [f"stage {i} needs {distinct_gib(st['memory_gib'], st['memory_cap_gib'])} GiB of {st['memory_cap_gib']:g}"
            for i, st in enumerate(est.stages) if st["memory_gib"] > st["memory_cap_gib"]]


def as_planned_notes(plan, path: str, engine: str) -> list[str]:
    """A plan for `engine` that does not fit its devices as priced (a hand edit: the search plans only what fits)
    launches into an out-of-memory error on the cluster: said before its files are written."""
    if plan.engine != engine:
        return []
    over = over_memory(plan, engine)
    return [f"as planned, {'; '.join(over)}: {path} does not fit its devices ('hetauto simulate --plan {path}' "
            "shows each stage), so its launches would stop out of memory; 'hetauto plan' plans a job that fits"] \
        if over else []


def deepspeed_notes(plan, path: str) -> list[str]:
    """What a user of the DeepSpeed configs must know beyond the features DeepSpeed cannot express: a plan made for
    Megatron's engine that does not fit as DeepSpeed's engine runs it (no overlaps or sequence parallelism, full
    recomputation for selective: Plan.for_engine), on the inventory the plan carries; and what the package's own
    PipelineModule helper (runtime/deepspeed_pipeline.py) does not build (TP, dropout), which it refuses."""
    notes = as_planned_notes(plan, path, "deepspeed")
    if plan.engine != "deepspeed" and plan.is_simple:
        over = over_memory(plan, "deepspeed")
        if over:
            bf16 = " --precision bf16" if plan.precision == "fp8" else ""
            notes.append(f"as DeepSpeed's pipeline engine runs {path} (its estimate prices Megatron's 1F1B), "
                         f"{'; '.join(over)}: it does not fit ('hetauto simulate --plan {path} --engine deepspeed"
                         f"{bf16}'); 'hetauto plan --engine deepspeed' plans a job that fits as DeepSpeed runs it")
    if any(m.tp > 1 for m in plan.meshes):
        notes.append("TP > 1: the package's PipelineModule helper (hetauto_megatron.runtime.deepspeed_pipeline) "
                     "builds layers that are not tensor-parallel and refuses these configs; run them with "
                     "Megatron's layers and their mpu (docs/deepspeed.md)")
    if any(m.settings.hidden_dropout or m.settings.attention_dropout for m in plan.meshes):
        notes.append("dropout: the package's PipelineModule helper applies none and refuses these configs; run them "
                     "with layers that apply the configs' dropouts (docs/deepspeed.md)")
    return notes


def run(args) -> int:
    from ..plan.plan import load_plan
    from ..emit.launches import check_plan_inventory, only_cluster
    plan = load_plan(args.plan)
    check_plan_inventory(plan, args.plan)      # every target: what a hand-edited plan asks of its inventory
    for flag, value in (("--script", args.script), ("--plan-path", args.plan_path),
                        ("--devices-per-node", args.devices_per_node)):
        if value is None:
            continue
        if args.target != "megatron":      # it would be taken and do nothing
            raise InputError(f"is for 'hetauto emit megatron' (launch scripts); {args.target} does not read it",
                             field=flag, fix=f"drop {flag}, or emit megatron")
        if flag != "--devices-per-node" and not value.strip():    # '' fell back to the default without a word
            raise InputError("is empty", field=flag, fix=f"give a path, or drop {flag} for the default")
    if args.devices_per_node is not None:      # parsed here: argparse's own message has no field, fix or full stop
        try:
            args.devices_per_node = int(args.devices_per_node)
        except ValueError:
            raise InputError(f"must be a whole number, got {shorten(args.devices_per_node, 40)!r}",
                             field="--devices-per-node", fix="give the processes per node, e.g. --devices-per-node 8") \
                from None
        if args.devices_per_node < 1:
            raise InputError(f"must be at least 1, got {args.devices_per_node}", field="--devices-per-node",
                             fix="give --devices-per-node 1 or more")
    out_dir = args.output or None
    if out_dir and os.path.exists(out_dir):
        make_output_dir(out_dir, "-o")      # a file there is refused before any work; created once there is output
    written: list[str] = []
    others: list[str] = []      # the plan's files, of the other clusters too where --cluster keeps one
    if args.target == "megatron":
        from ..emit.megatron import DEFAULT_SCRIPT, emit_megatron
        if plan.engine != "megatron":      # the plan was made (and is priced) for another engine
            print(f"hetauto emit: {args.plan} was planned for {plan.engine}'s pipeline engine (its estimate prices "
                  f"that engine); these Megatron-LM scripts run Megatron's 1F1B ('hetauto simulate --engine megatron' "
                  "prices it)", file=sys.stderr)
        every = emit_megatron(plan, plan_path=args.plan_path or os.path.abspath(args.plan),
                              script=args.script or DEFAULT_SCRIPT, devices_per_node=args.devices_per_node,
                              file=args.plan)
        for note in as_planned_notes(plan, args.plan, "megatron"):
            print(f"hetauto emit: {note}", file=sys.stderr)
        launches = only_cluster(every, args.cluster)
        if out_dir:
            make_output_dir(out_dir, "-o")
            written += write_megatron(launches, out_dir, keep=[("--plan", args.plan)])
            others = [name for name, _, _ in megatron_files(every)]
        if args.json:
            from ..plan.layout import PipelineLayout
            pipes = [{"samples": plan.samples_per_pipeline[p],
                      "pipeline_parallel_size": PipelineLayout(plan, p).num_stages} for p in range(plan.num_pipelines)]
            # "pipeline_parallel_size": the one pipeline's depth (plans of one pipeline); "pipelines": each one's
            depth = {"pipeline_parallel_size": pipes[0]["pipeline_parallel_size"]} if len(pipes) == 1 else {}
            print(json_text({"world_size": plan.world_size, **depth, "pipelines": pipes,
                              "launches": launches, "written": written}, indent=2))
        elif not out_dir:
            for la in launches:
                pipe = f"pipeline {la['pipeline']}, " if plan.num_pipelines > 1 else ""
                print(f"# ===== cluster {la['cluster']} ({la['name']}.sh): {pipe}ranks {la['rank_offset']}-"
                      f"{la['rank_offset'] + la['num_devices'] - 1}, {la['nnodes']} x {la['nproc_per_node']} =====")
                print(la["script"])
    elif args.target == "deepspeed":
        from ..emit.deepspeed import emit_deepspeed, unsupported_features
        every = emit_deepspeed(plan, file=args.plan)
        configs = only_cluster(every, args.cluster)
        unsupported = unsupported_features(plan)
        for note in deepspeed_notes(plan, args.plan):
            print(f"hetauto emit: {note}", file=sys.stderr)
        if out_dir:
            make_output_dir(out_dir, "-o")
            written += write_deepspeed(configs, unsupported, out_dir, keep=[("--plan", args.plan)])
            others = [name for name, _, _ in deepspeed_files(every, [])]
        if args.json:
            print(json_text({"configs": configs, "unsupported": unsupported, "written": written}, indent=2))
        elif not out_dir:
            for c in configs:
                print(f"# ds_config for {c['name']} (mesh {c['mesh']}, data-parallel size {c['data_parallel_size']}; "
                      "accepted by DeepSpeed's parser)")
                print(json_text(c["config"], indent=2))
            print("# plan features DeepSpeed cannot express:" if unsupported else
                  "# DeepSpeed can express every feature of this plan")
            for u in unsupported:
                print(f"# - {u}")
    else:
        from ..emit.summary import format_summary
        if args.cluster is not None:      # it was checked and then shown every cluster anyway
            raise InputError("is for 'hetauto emit megatron' and 'emit deepspeed' (one cluster's files); the "
                             "summary is the whole plan's", field="--cluster", fix="drop --cluster for the summary")
        from ..plan.plan_file import estimate_is_garbled, estimate_is_stale
        estimate = plan.estimate
        if estimate_is_stale(plan):      # figures of another layout would be shown as this one's
            print(f"hetauto emit: {args.plan} was changed after 'hetauto plan' wrote its estimate: the summary shows "
                  f"the layout only; 'hetauto compare {args.plan}' prices the layout as it is now (or re-plan)",
                  file=sys.stderr)
            estimate = None
        elif estimate_is_garbled(plan):      # NaN, infinite or negative figures printed as the plan's
            print(f"hetauto emit: {args.plan}'s estimate holds figures no prediction gives (not finite, or a time "
                  f"that is not positive): the summary shows the layout only; 'hetauto compare {args.plan}' prices "
                  "it afresh", file=sys.stderr)
            estimate = None
        elif isinstance(estimate, dict) and not isinstance(estimate.get("layout_digest"), str):
            # an older hetauto's estimate (no fingerprint): shown as recorded, but said, since the cost model moved
            print(f"hetauto emit: {args.plan}'s estimate was written by an older hetauto (it carries no layout "
                  f"fingerprint): the summary shows its figures as recorded; 'hetauto compare {args.plan}' prices "
                  "the layout with this one", file=sys.stderr)
        text = format_summary(plan, estimate, file=args.plan)
        if out_dir:
            make_output_dir(out_dir, "-o")
            written += write_summary(text, out_dir, keep=[("--plan", args.plan)])
        if args.json:
            shape = ({"pipeline_parallel_size": plan.pipeline_parallel_size} if plan.is_simple else
                     {"pipelines": [{"samples": plan.samples_per_pipeline[p],
                                     "pipeline_parallel_size": plan.pipeline_stages(p)}
                                    for p in range(plan.num_pipelines)]})
            from ._common import json_document
            print(json_text(json_document("emit-summary", {"summary": text, "world_size": plan.world_size, **shape,
                                                            "estimate": estimate, "written": written}), indent=2))
        elif not out_dir:
            print(text)
    if out_dir:
        warn_stale(out_dir, written, plans=others)
    if not args.json:
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
    return 0
