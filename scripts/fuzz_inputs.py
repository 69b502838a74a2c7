"""Fuzz the command line with broken inputs: every field of the packaged example inventories, models and plans
and of the Hugging Face config.json files the tests read
(plus a plan `hetauto plan` writes, with settings, boundaries, estimate and inventory, and an inventory with every
optional key) is mutated - wrong type, negative, zero, NaN/inf, huge, missing, null, an unknown key, wrong nesting -
and so is each whole file (empty, binary garbage, a list, broken YAML, a path that does not exist, a directory);
`--set` gets bad keys and values. Each case runs the commands that read that input (plan, simulate,
emit megatron/deepspeed/summary, explain, compare, validate-cost-model, dryrun on a plan it refuses) in a child
process, and is flagged when

  - the exit code is not 0, 2 or 3 (a crash),
  - stderr holds a Python traceback,
  - it runs past the time limit (a hang),
  - exit 2 with a message that names neither the mutated field nor the file,
  - exit 0 on a NaN, infinity or negative figure (accepted nonsense).

Children are forked from this process after the planner is imported (the CLI's own entry point, `cli.main`,
runs in each; an exception escaping it prints its traceback and exits 1, as the `hetauto` script does), so a
case costs milliseconds, not an interpreter start; `--exec` runs the installed `hetauto` script instead.

    python scripts/fuzz_inputs.py                     # every mutation (minutes)
    python scripts/fuzz_inputs.py --sample 150 --no-deepspeed --jobs 2   # a deterministic sample (the test's)
    python scripts/fuzz_inputs.py --only plan --show 5
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

EX = os.path.join(ROOT, "examples")
CPU_INV = os.path.join(EX, "llama", "inventory-cpu-dryrun.yaml")
UNKNOWN_KEY = "zz_unknown_key"
NONFINITE = ("nan", "inf", "-inf")


@dataclass
class Case:
    kind: str                 # inventory | model | hf | plan | overheads | costmodel | set | args

    label: str                # what was mutated, e.g. "clusters[0].nodes=nan"
    argv: list[str]
    names: tuple = ()         # words of which one must appear in an exit-2 message (the field, or the file)
    mutation: str = ""        # wrong-type, negative, nan, ...
    base: list | None = None  # the same command on the unmutated input: its exit-2 message is not a finding


@dataclass
class Finding:
    case: Case
    problem: str
    rc: int
    seconds: float
    stderr: str = field(repr=False, default="")


# ---- mutations of parsed YAML --------------------------------------------------------------------------------
def _paths(node, prefix=()):
    """Every (path, value) of a parsed document, containers included, outermost first."""
    yield prefix, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        # the first and the last item: the others are alike (stages, meshes of the same shape)
        for i in sorted({0, len(node) - 1}) if node else ():
            yield from _paths(node[i], prefix + (i,))


def _label(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<top>"


def _set(doc, path, value, delete=False):
    doc = copy.deepcopy(doc)
    node = doc
    for p in path[:-1]:
        node = node[p]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


def _mutations(value) -> list[tuple[str, object]]:
    """(name, new value) for one node; 'missing' deletes it."""
    if isinstance(value, dict):
        return [("unknown-key", {**value, UNKNOWN_KEY: 1}), ("as-list", [value]), ("as-scalar", 7),
                ("empty", {}), ("missing", None)]
    if isinstance(value, list):
        return [("empty-list", []), ("as-mapping", {"a": value}), ("as-scalar", "x"), ("missing", None),
                ("nested", [value])]
    muts = [("wrong-type", "not-a-number" if not isinstance(value, str) else 12345),
            ("as-list", [value]), ("as-mapping", {"a": value}), ("null", "__null__"), ("missing", None)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        muts += [("negative", -abs(value) - 1), ("zero", 0), ("nan", float("nan")), ("inf", float("inf")),
                 ("-inf", float("-inf")), ("huge", 10 ** 30), ("fraction", 0.5)]
    if isinstance(value, bool):
        muts += [("int-for-bool", 2)]
    if isinstance(value, str):
        muts += [("empty-string", ""), ("unknown-word", "zz-nonsense")]
    return muts


def mutate(doc) -> list[tuple[str, str, tuple, object]]:
    """(label, mutation, path, mutated document) for every node of `doc`."""
    out = []
    for path, value in _paths(doc):
        if not path:
            continue
        for name, new in _mutations(value):
            if name == "missing":
                if isinstance(path[-1], int):
                    continue
                mutated = _set(doc, path, None, delete=True)
            else:
                mutated = _set(doc, path, None if new == "__null__" else new)
            out.append((f"{_label(path)}:{name}", name, path, mutated))
    return out


def _dump(doc) -> str:
    # YAML writes nan/inf as .nan/.inf, which safe_load reads back as floats: what a user could write
    return yaml.safe_dump(doc, sort_keys=False)


def _names(path) -> tuple:
    """The words of which one should appear in a message about `path`: one of its keys (the field or a field
    that holds it), or the unknown key a mutation added."""
    return tuple(p for p in path if isinstance(p, str)) + (UNKNOWN_KEY,)


# ---- the inputs and the commands that read them --------------------------------------------------------------
class Workspace:
    def __init__(self, tmp: str, deepspeed: bool = True):
        self.tmp = tmp
        self.n = 0
        from hetauto_megatron.cli import main
        # a plan as 'hetauto plan' writes it: version 3, settings, boundaries, inventory, estimate
        self.plan_written = os.path.join(tmp, "written-plan.yaml")
        _quiet(main, ["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8",
                      "-o", self.plan_written])
        # ... and one for DeepSpeed's pipeline engine (the plan file's `engine`)
        self.plan_deepspeed = os.path.join(tmp, "written-plan-deepspeed.yaml")
        _quiet(main, ["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8",
                      "--engine", "deepspeed", "-o", self.plan_deepspeed])
        # DeepSpeed's config parser (emit deepspeed) imports torch: once here, not in every child
        self.deepspeed = deepspeed
        if deepspeed:
            _quiet(main, ["emit", "deepspeed", "--plan", self.plan_written])
        self.full_inventory = os.path.join(tmp, "full-inventory.yaml")
        self.overheads_file = os.path.join(tmp, "overheads-cpu.json")
        with open(self.overheads_file, "w") as fh:
            json.dump({"device_type": "cpu", "context_gib": 0.4, "comm_gib": None, "workspace_gib": 0.0,
                       "fragmentation": 0.05}, fh)
        with open(self.full_inventory, "w") as fh:
            fh.write(_dump({
                "name": "every key", "description": "each optional key once",
                "clusters": [
                    {"name": "site-a", "device": "cpu", "nodes": 2, "devices_per_node": 2,
                     "intra_node": {"bandwidth_gbps": 80, "latency_us": 20},
                     "inter_node": {"bandwidth_gbps": 10, "latency_us": 50, "node_gbps": 15},
                     "memory_gib": 16, "peak_tflops": 0.5, "hbm_gbps": 20, "price_per_device_hour": 0.1,
                     "overheads": {"context_gib": 0.5, "comm_gib": 0.0, "workspace_gib": 0.0, "fragmentation": 0.1}},
                    {"name": "site-b", "device": "cpu", "nodes": 1, "devices_per_node": 2,
                     "overheads": "overheads-cpu.json"},
                    {"name": "gpu", "device": "a100", "nodes": 1, "devices_per_node": 8, "tf32": True}],
                "links": [{"between": ["site-a", "site-b"], "bandwidth_gbps": 10, "latency_ms": 0.1,
                           "flow_gbps": 3}]}))

    def write(self, text: str | bytes, suffix=".yaml") -> str:
        self.n += 1
        path = os.path.join(self.tmp, f"case{self.n}{suffix}")
        with open(path, "wb" if isinstance(text, bytes) else "w") as fh:
            fh.write(text)
        return path

    def inventories(self) -> list[str]:
        found = [os.path.join(d, f) for d, _, fs in os.walk(EX) for f in sorted(fs)
                 if f.startswith("inventory") and f.endswith(".yaml") and "16k" not in f]
        return sorted(found) + [self.full_inventory]

    def models(self) -> list[str]:
        return sorted(os.path.join(d, f) for d, _, fs in os.walk(EX) for f in fs
                      if os.path.basename(d) == "models" and f.endswith(".yaml"))

    def hf_configs(self) -> list[str]:
        """The Hugging Face config.json files the tests read (LLaMA-2, Mistral, Qwen2, GPT-2, Pythia, OPT)."""
        hf = os.path.join(ROOT, "tests", "data", "hf")
        return sorted(os.path.join(hf, f) for f in os.listdir(hf) if f.endswith(".json"))

    def plans(self) -> list[str]:
        return sorted(os.path.join(d, f) for d, _, fs in os.walk(EX) for f in fs
                      if os.path.basename(d) == "plans" and f.endswith(".yaml")
                      and "736" not in f) + [self.plan_written, self.plan_deepspeed]


def inventory_commands(inv: str) -> list[list[str]]:
    return [["plan", "--model", "tiny", "--inventory", inv, "--global-batch-size", "8", "--shapes", "simple"],
            ["simulate", "--model", "tiny", "--inventory", inv, "--tp", "1", "--pp", "2", "--dp", "1",
             "--micro-batch-size", "1", "--global-batch-size", "8"]]


def model_commands(model: str) -> list[list[str]]:
    return [["plan", "--model", model, "--inventory", CPU_INV, "--global-batch-size", "8", "--shapes", "simple"],
            ["simulate", "--model", model, "--inventory", CPU_INV, "--tp", "1", "--pp", "2", "--dp", "1",
             "--micro-batch-size", "1", "--global-batch-size", "8"]]


def plan_commands(plan: str, base: str) -> list[list[str]]:
    return [["simulate", "--model", "tiny", "--inventory", CPU_INV, "--plan", plan],
            ["simulate", "--model", "tiny", "--inventory", CPU_INV, "--plan", plan, "--engine", "deepspeed"],
            ["emit", "megatron", "--plan", plan], ["emit", "summary", "--plan", plan],
            ["emit", "deepspeed", "--plan", plan],
            ["explain", "--plan", plan, "--inventory", CPU_INV, "--no-search"],
            ["compare", plan, base, "--inventory", CPU_INV]]


def plan_commands_for(plan: str, base: str) -> list[list[str]]:
    """A plan the loader refuses stops every command at the same place: two of them and the dry run show it."""
    cmds = plan_commands(plan, base)
    return [cmds[0], cmds[3], ["dryrun", "--plan", plan]] if _refused(plan) else cmds


def _refused(plan: str) -> bool:
    """Whether the plan loader refuses `plan`: only then does `hetauto dryrun` stop before starting processes."""
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.plan.plan import load_plan
    try:
        load_plan(plan)
    except InputError:
        return True
    except Exception:        # a crash in the loader: the dry run must show it too
        return True
    return False


def file_level_cases(ws: Workspace, kind: str, commands) -> list[Case]:
    """Whole-file mistakes for an input read through `commands(path)`."""
    garbage = bytes(range(256)) * 4
    files = {"empty": "", "blank-lines": "\n\n# only a comment\n", "binary": garbage, "a-list": "- 1\n- 2\n",
             "a-scalar": "42\n", "broken-yaml": "clusters: [\n  - {name: a\n", "tabs": "a:\n\tb: 1\n",
             "duplicate-anchor": "a: *nowhere\n"}
    cases = []
    for name, text in files.items():
        path = ws.write(text)
        for argv in commands(path):
            cases.append(Case(kind, f"<file>:{name}", argv, (os.path.basename(path),), name))
    missing = os.path.join(ws.tmp, "does-not-exist.yaml")
    for argv in commands(missing):
        cases.append(Case(kind, "<file>:missing", argv, ("does-not-exist",), "missing-file"))
    for argv in commands(ws.tmp):
        cases.append(Case(kind, "<file>:directory", argv, (os.path.basename(ws.tmp),), "directory"))
    return cases


@dataclass
class Mutant:
    """One mutated document, written and turned into its cases (one per command) only when sampled: the full
    set is tens of thousands of files."""
    ws: "Workspace"
    kind: str
    source: str
    label: str
    mutation: str
    path: tuple
    doc: object
    commands: object
    suffix: str = ".yaml"        # ".json": a Hugging Face config.json, written as JSON (NaN and infinity too)

    def cases(self) -> list[Case]:
        text = json.dumps(self.doc, allow_nan=True) if self.suffix == ".json" else _dump(self.doc)
        dest = self.ws.write(text, self.suffix)   # beside the overheads file a relative `overheads:` names
        out = []
        for argv in self.commands(dest):
            # the unmutated input's message; not for the dry run, which would start processes on a valid plan
            base = [self.source if a == dest else a for a in argv] if argv[0] != "dryrun" else None
            out.append(Case(self.kind, f"{os.path.basename(self.source)}:{self.label}", argv, _names(self.path),
                            self.mutation, base))
        return out


def field_cases(ws: Workspace, kind: str, source: str, commands, *, keep=None) -> list[Mutant]:
    with open(source) as fh:
        doc = yaml.safe_load(fh)    # (JSON is YAML)
    suffix = ".json" if source.endswith(".json") else ".yaml"
    return [Mutant(ws, kind, source, label, mutation, path, mutated, commands, suffix)
            for label, mutation, path, mutated in mutate(doc) if not keep or keep(path)]


def expand(items: list) -> list[Case]:
    """Cases and mutants (sample() takes both) as the cases to run."""
    out = []
    for item in items:
        out += item.cases() if isinstance(item, Mutant) else [item]
    return out


def overheads_cases(ws: Workspace) -> list[Case]:
    """The file `hetauto profile --overheads` writes, mutated, read through an inventory's `overheads:`."""
    with open(ws.overheads_file) as fh:
        doc = json.load(fh)
    cases = []
    variants = [(label, mutation, _names(path), json.dumps(m, allow_nan=True)) for label, mutation, path, m
                in mutate(doc)]
    variants += [("<file>:empty", "empty", ("overheads",), ""), ("<file>:binary", "binary", ("overheads",),
                                                                  "\x00\x01\xff"),
                 ("<file>:a-list", "a-list", ("overheads",), "[1, 2]"),
                 ("<file>:measured-elsewhere", "other-device", ("overheads",), json.dumps({"device_type": "h100-sxm"}))]
    for label, mutation, names, text in variants:
        path = ws.write(text, ".json")
        inv = ws.write(_dump({"clusters": [{"name": "a", "device": "cpu", "nodes": 1, "devices_per_node": 2,
                                            "overheads": os.path.basename(path)}]}))
        for argv in inventory_commands(inv)[:1]:
            cases.append(Case("overheads", f"overheads:{label}", argv, names + ("overheads",), mutation))
    for target, mutation in ((os.path.join(ws.tmp, "nope.json"), "missing-file"), (ws.tmp, "directory"),
                             (12, "wrong-type"), ([], "as-list")):
        inv = ws.write(_dump({"clusters": [{"name": "a", "device": "cpu", "nodes": 1, "devices_per_node": 2,
                                            "overheads": target}]}))
        cases.append(Case("overheads", f"overheads:{mutation}", inventory_commands(inv)[0], ("overheads",), mutation))
    return cases


BAD_SETS = [
    "link.site-a-site-b.bandwidth_gbps=nan", "link.site-a-site-b.bandwidth_gbps=inf",
    "link.site-a-site-b.bandwidth_gbps=-5", "link.site-a-site-b.bandwidth_gbps=0",
    "link.site-a-site-b.bandwidth_gbps=abc", "link.site-a-site-b.flow_gbps=nan", "link.site-a-site-b.flow_gbps=1e6",
    "link.site-a-site-b.flow_gbps=0", "link.site-a-site-b.latency_ms=nan", "link.site-a-site-b.latency_ms=-1",
    "link.site-a-site-b.latency_ms=inf", "link.site-a-site-b.nodes=3", "link.site-a-site-c.bandwidth_gbps=3",
    "link.bandwidth_gbps=3", "link..=3", "cluster.site-a.nodes=0", "cluster.site-a.nodes=1.5",
    "cluster.site-a.nodes=nan", "cluster.site-a.nodes=99999999999999999999", "cluster.site-a.memory_gib=nan",
    "cluster.site-a.memory_gib=inf", "cluster.site-a.peak_tflops=-1", "cluster.site-a.hbm_gbps=1e400",
    "cluster.site-a.inter_node.node_gbps=nan", "cluster.site-a.inter_node.node_gbps=0",
    "cluster.site-a.intra_node.latency_us=nan", "cluster.site-a.intra_node.latency_us=-3",
    "cluster.site-a.inter_node.bandwidth_gbps=inf", "cluster.site-a.price_per_device_hour=1",
    "cluster.nowhere.nodes=2", "cluster.site-a=2", "cluster.site-a.overheads=3", "site-a.nodes=2", "=", "noequals",
    "cluster.site-a.nodes=", "link.site-a-site-b.bandwidth_gbps=1_0", "cluster.site-a.nodes= 2 ",
]


def set_cases(ws: Workspace) -> list[Case]:
    cases = []
    for item in BAD_SETS:
        for argv in (["plan", "--model", "tiny", "--inventory", CPU_INV, "--global-batch-size", "8", "--shapes",
                      "simple", "--set", item],
                     ["simulate", "--model", "tiny", "--inventory", CPU_INV, "--plan", ws.plan_written, "--set", item],
                     ["explain", "--plan", ws.plan_written, "--inventory", CPU_INV, "--no-search", "--set", item]):
            cases.append(Case("set", f"--set {item}", argv, ("--set",), "set"))
    return cases


def argument_cases(ws: Workspace) -> list[Case]:
    """Numbers on the command line that parse but make no sense."""
    plan = ws.plan_written
    base = ["plan", "--model", "tiny", "--inventory", CPU_INV, "--shapes", "simple"]
    sim = ["simulate", "--model", "tiny", "--inventory", CPU_INV]
    rows = [
        (base + ["--global-batch-size", "0"], "--global-batch-size"),
        (base + ["--global-batch-size", "-8"], "--global-batch-size"),
        (base + ["--global-batch-size", "8", "--seq-length", "0"], "--seq-length"),
        (base + ["--global-batch-size", "8", "--max-devices", "0"], "--max-devices"),
        (base + ["--global-batch-size", "8", "--tp", "site-a=0"], "--tp"),
        (base + ["--global-batch-size", "8", "--tp", "nowhere=2"], "--tp"),
        (base + ["--global-batch-size", "8", "--exclude-clusters", "nowhere"], "--exclude-clusters"),
        (base + ["--global-batch-size", "8", "--cost-model", os.path.join(ws.tmp, "no-model")], "--cost-model"),
        (base + ["--global-batch-size", "8", "--cost-model", ws.plan_written], "--cost-model"),
        (base + ["--global-batch-size", "8", "-o", os.path.join(ws.tmp, "no-dir", "x", "plan.yaml")], "plan.yaml"),
        (base + ["--global-batch-size", "8", "-o", ws.tmp], "-o"),
        (sim + ["--tp", "0", "--pp", "1", "--dp", "1", "--micro-batch-size", "1", "--global-batch-size", "8"], "--tp"),
        (sim + ["--tp", "1", "--pp", "-1", "--dp", "1", "--micro-batch-size", "1", "--global-batch-size", "8"], "--pp"),
        (sim + ["--tp", "1", "--pp", "1", "--dp", "1", "--micro-batch-size", "0", "--global-batch-size", "8"],
         "--micro-batch-size"),
        (sim + ["--tp", "1", "--pp", "1", "--dp", "3", "--micro-batch-size", "1", "--global-batch-size", "8"],
         "--global-batch-size"),
        (sim + ["--tp", "1", "--pp", "1", "--dp", "1", "--micro-batch-size", "1", "--global-batch-size", "8",
                "--cluster", "nowhere"], "--cluster"),
        (sim + ["--plan", plan, "--global-batch-size", "0"], "--global-batch-size"),
        (sim + ["--plan", plan, "--timeline", "x.txt"], "--timeline"),
        (sim + ["--plan", plan, "--timeline", os.path.join(ws.tmp, "no-dir", "t.json")], "--timeline"),
        (["emit", "megatron", "--plan", plan, "--cluster", "nowhere"], "--cluster"),
        (["emit", "megatron", "--plan", plan, "--devices-per-node", "0"], "--devices-per-node"),
        (["emit", "megatron", "--plan", plan, "-o", ws.plan_written], "-o"),
        (["explain", "--plan", plan, "--inventory", CPU_INV, "--runners-up", "-1"], "--runners-up"),
        (["compare", plan, "--inventory", CPU_INV, "--price", "site-a=-1"], "--price"),
        (["compare", plan, "--inventory", CPU_INV, "--price", "site-a=nan"], "--price"),
        (["compare", plan, "--inventory", CPU_INV, "--price", "nowhere=1"], "--price"),
        (["compare", plan, "--inventory", CPU_INV, "--price", "junk"], "--price"),
        (["dryrun", "--plan", plan, "--steps", "0"], "--steps"),
        (["dryrun", "--plan", plan, "--timeout", "nan"], "--timeout"),
        (["dryrun", "--plan", plan, "--timeout", "-1"], "--timeout"),
        (["dryrun", "--plan", plan, "--emulate-links", "nan", "--inventory", CPU_INV], "--emulate-links"),
        (["dryrun", "--plan", plan, "--emulate-links", "-2", "--inventory", CPU_INV], "--emulate-links"),
        (["validate-cost-model", "--published", ws.plan_written], "published"),
        (["validate-cost-model", "--published", os.path.join(ws.tmp, "none.yaml")], "none.yaml"),
        (["validate-cost-model", "--dryrun", ws.plan_written, plan, "--inventory", CPU_INV], "dryrun"),
        (["validate-cost-model", "--dryrun", os.path.join(ws.tmp, "none.json"), plan, "--inventory", CPU_INV],
         "none.json"),
        (["validate-cost-model", "--profile", ws.plan_written, "--cost-model", os.path.join(ws.tmp, "nothing")],
         "cost-model"),
        (["probe-link", "--connections", "-1"], "--connections"),
    ]
    return [Case("args", " ".join(a[1:]), a, (name,), "args") for a, name in rows]


def costmodel_cases(ws: Workspace, model_dir: str | None) -> list[Case]:
    """A fitted model's manifest.json mutated (tables garbled, old models without optimizer_step)."""
    if not model_dir or not os.path.isfile(os.path.join(model_dir, "manifest.json")):
        return []
    with open(os.path.join(model_dir, "manifest.json")) as fh:
        doc = json.load(fh)
    cases = []
    for label, mutation, path, mutated in mutate(doc):
        # the fit report and long feature lists are informational: mutate the structure's first levels only
        if len(path) > 3 or (path and path[0] in ("fit", "op_features", "layer_features")):
            continue
        d = os.path.join(ws.tmp, f"cm{len(cases)}")
        shutil.copytree(model_dir, d)
        with open(os.path.join(d, "manifest.json"), "w") as fh:
            json.dump(mutated, fh, allow_nan=True)
        argv = ["simulate", "--model", "tiny", "--inventory", CPU_INV, "--plan", ws.plan_written, "--cost-model", d]
        cases.append(Case("costmodel", f"manifest:{label}", argv, _names(path) + ("manifest",), mutation))
    return cases


def all_cases(ws: Workspace, model_dir: str | None = None, only: str | None = None, *, n: int | None = None,
              seed: int = 0) -> list[Case]:
    """Every case, or a deterministic sample of about n (mutated documents are sampled before being written)."""
    cases = expand(sample(_all_items(ws, model_dir, only), n, seed))
    return cases if ws.deepspeed else [c for c in cases if c.argv[:2] != ["emit", "deepspeed"]]


def _all_items(ws: Workspace, model_dir: str | None = None, only: str | None = None) -> list:
    cases: list = []
    want = (lambda k: only in (None, k))
    if want("inventory"):
        cases += file_level_cases(ws, "inventory", inventory_commands)
        for inv in ws.inventories():
            cases += field_cases(ws, "inventory", inv, inventory_commands)
    if want("overheads"):
        cases += overheads_cases(ws)
    if want("model"):
        cases += file_level_cases(ws, "model", model_commands)
        for m in ws.models():
            cases += field_cases(ws, "model", m, model_commands)
    if want("hf"):
        # only the keys the reader takes a number or a switch from: the others (dropouts, token ids, the notes'
        # keys) change no plan, so a NaN there is no accepted nonsense
        # (of aliases, the one present first: GPT-2's n_ctx stands beside the n_positions that is read)
        from hetauto_megatron.spec.hf_config import SOURCE_KEYS
        for m in ws.hf_configs():
            with open(m) as fh:
                cfg = json.load(fh)
            read = {next((k for k in keys if k in cfg), keys[0]) for keys in SOURCE_KEYS.values()} | {
                "model_type", "head_dim", "is_encoder_decoder", "tie_word_embeddings", "num_local_experts",
                "num_experts", "n_routed_experts", "moe_num_experts", "word_embed_proj_dim"}
            cases += field_cases(ws, "hf", m, model_commands,
                                 keep=lambda path, read=read: bool(path) and path[0] in read)
    if want("plan"):
        cases += file_level_cases(ws, "plan", lambda p: plan_commands(p, ws.plan_written))
        for p in ws.plans():
            # the stored inventory and estimate of the written plan are deep: mutate their first levels
            cases += field_cases(ws, "plan", p, lambda path: plan_commands_for(path, ws.plan_written),
                                 keep=lambda path: not (path and path[0] in ("inventory", "estimate") and len(path) > 3))
    if want("set"):
        cases += set_cases(ws)
    if want("args"):
        cases += argument_cases(ws)
    if want("costmodel"):
        cases += costmodel_cases(ws, model_dir)
    return cases


# ---- running a case -------------------------------------------------------------------------------------------
def _quiet(main, argv):
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        return main(argv)


def run_forked(argv: list[str], timeout: float, cwd: str) -> tuple[int, str, str, float]:
    """cli.main(argv) in a forked child, as the `hetauto` script runs it: (rc, stdout, stderr, seconds)."""
    out = tempfile.TemporaryFile(mode="w+b")
    err = tempfile.TemporaryFile(mode="w+b")
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:   # child
        rc = 1
        try:
            os.setsid()
            os.chdir(cwd)
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            from hetauto_megatron.cli import main
            rc = main(argv)
        except SystemExit as exc:   # argparse
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
            rc = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(rc if isinstance(rc, int) else 1)
    rc = None
    while time.monotonic() - t0 < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.005)
    if rc is None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        rc = -999
    seconds = time.monotonic() - t0
    out.seek(0)
    err.seek(0)
    return rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"), seconds


def run_exec(argv: list[str], timeout: float, cwd: str) -> tuple[int, str, str, float]:
    exe = os.path.join(os.path.dirname(sys.executable), "hetauto")
    t0 = time.monotonic()
    try:
        p = subprocess.run([exe] + argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        return p.returncode, p.stdout, p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as exc:
        return -999, exc.stdout or "", exc.stderr or "", time.monotonic() - t0


def _message(stderr: str, argv: list[str]) -> str:
    """An error message with the input's file name taken out, to compare a mutated input's with the original's."""
    text = stderr.strip()
    for a in argv:
        if os.sep in a:
            text = text.replace(a, "FILE")
    return text


def judge(case: Case, rc: int, stdout: str, stderr: str, seconds: float, base_message: str | None = None) -> str | None:
    if rc == -999:
        return "timeout"
    if "Traceback (most recent call last)" in stderr:
        return "traceback"
    if rc not in (0, 2, 3):
        return f"exit {rc}"
    if rc == 2 and case.names and _message(stderr, case.argv) != base_message:
        message = stderr.lower()
        if not any(str(n).lower() in message for n in case.names):
            return "message names no field"
    # the plan's estimate is informational (never read for decisions): a NaN there is printed as written
    # ... and a fitted model's intercepts (overhead_s) may be negative
    informational = "estimate" in case.names or (case.kind == "costmodel" and case.mutation == "negative")
    if rc == 0 and case.mutation in ("nan", "inf", "-inf", "negative") and case.kind != "args" and not informational:
        return f"accepted {case.mutation}"
    return None


def run_cases(cases: list[Case], timeout: float, runner, cwd: str, progress=False) -> list[Finding]:
    findings = []
    base_messages: dict = {}
    for i, case in enumerate(cases):
        rc, out, err, seconds = runner(case.argv, timeout, cwd)
        base_message = None
        if rc == 2 and case.base:
            key = tuple(case.base)
            if key not in base_messages:
                brc, _, berr, _ = runner(case.base, timeout, cwd)
                base_messages[key] = _message(berr, case.base) if brc == 2 else None
            base_message = base_messages[key]
        problem = judge(case, rc, out, err, seconds, base_message)
        if problem:
            findings.append(Finding(case, problem, rc, seconds, err))
        if progress and (i + 1) % 200 == 0:
            print(f"  {i + 1}/{len(cases)} cases, {len(findings)} findings", file=sys.stderr)
    return findings


def sample(items: list, n: int | None, seed: int) -> list:
    """A deterministic sample of cases and mutants that keeps every kind of mutation represented."""
    if not n or n >= len(items):
        return items
    rng = random.Random(seed)
    by_class: dict = {}
    for i, c in enumerate(items):
        by_class.setdefault(c.mutation, []).append(i)
    picked = {rng.choice(group) for _, group in sorted(by_class.items())}
    rest = [i for i in range(len(items)) if i not in picked]
    picked |= set(rng.sample(rest, max(0, min(len(rest), n - len(picked)))))
    return [items[i] for i in sorted(picked)]


def report(findings: list[Finding], show: int) -> str:
    lines = []
    groups: dict = {}
    for f in findings:
        key = (f.problem, f.case.argv[0] + (" " + f.case.argv[1] if f.case.argv[0] == "emit" else ""),
               f.case.label.split(":")[-1] if f.case.label.startswith("<") else f.case.mutation)
        groups.setdefault(key, []).append(f)
    for key, fs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"{len(fs):4d}  {key[0]:<24} {key[1]:<16} {key[2]}")
        for f in fs[:show]:
            tail = [ln for ln in f.stderr.strip().splitlines() if ln.strip()][-1:] or [""]
            lines.append(f"        {f.case.label}  (rc {f.rc}, {f.seconds:.1f} s): {tail[0][:220]}")
    return "\n".join(lines)


def _run_chunk(job) -> list[Finding]:
    cases, timeout, runner, cwd = job
    return run_cases(cases, timeout, runner, cwd)


def run_in_parallel(cases: list[Case], timeout: float, runner, cwd: str, jobs: int, chunk: int = 25) -> list[Finding]:
    """`run_cases` in `jobs` processes forked before any case runs, `chunk` cases at a time (each process forks
    its cases' children itself); the findings in the order of `cases`, progress on stderr as chunks finish."""
    if jobs <= 1 or len(cases) <= chunk:
        return run_cases(cases, timeout, runner, cwd, progress=True)
    import multiprocessing

    chunks = [cases[i:i + chunk] for i in range(0, len(cases), chunk)]
    findings, done = [], 0
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for part, cs in zip(pool.imap(_run_chunk, [(cs, timeout, runner, cwd) for cs in chunks]), chunks):
            findings += part
            if (done + len(cs)) // 200 > done // 200:
                print(f"  {done + len(cs)}/{len(cases)} cases, {len(findings)} findings", file=sys.stderr)
            done += len(cs)
    return findings


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=int, help="run a deterministic sample of this many cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds a case may take (default 30)")
    ap.add_argument("--only", choices=("inventory", "overheads", "model", "hf", "plan", "set", "args", "costmodel"))
    ap.add_argument("--cost-model", help="a fitted model directory whose manifest to mutate ('hetauto fit')")
    ap.add_argument("--exec", action="store_true", help="run the installed hetauto script (slower, exact)")
    ap.add_argument("--show", type=int, default=2, help="examples shown per class of finding")
    ap.add_argument("--jobs", type=int, default=1, help="cases run this many at a time (default 1)")
    ap.add_argument("--no-deepspeed", action="store_true",
                    help="skip 'emit deepspeed' (its config check imports DeepSpeed and torch in every child)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hetauto-fuzz-") as tmp:
        ws = Workspace(tmp, deepspeed=not args.no_deepspeed)
        cases = all_cases(ws, args.cost_model, args.only, n=args.sample, seed=args.seed)
        t0 = time.monotonic()
        findings = run_in_parallel(cases, args.timeout, run_exec if args.exec else run_forked, tmp, args.jobs)
        print(f"{len(cases)} cases in {time.monotonic() - t0:.1f} s: {len(findings)} findings")
        if findings:
            print(report(findings, args.show))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
