"""Helpers shared by the tests: run the real `hetauto` process, build small plan dictionaries, draw random
pipelines."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_inventory(a: int = 4, b: int = 2) -> str:
    """The example plans' two CPU "clusters" (cluster-a of `a` processes, cluster-b of `b`), as inventory YAML."""
    return f"""\
clusters:
  - {{name: cluster-a, device: cpu, nodes: 1, devices_per_node: {a}}}
  - {{name: cluster-b, device: cpu, nodes: 1, devices_per_node: {b}}}
links:
  - {{between: [cluster-a, cluster-b], bandwidth_gbps: 10, latency_ms: 0.1}}
"""


# The two CPU clusters the tiny example plan (examples/llama/plans/tiny-2clusters-cpu.yaml) is written for.
CPU_INVENTORY = cpu_inventory()


def planned_cross_cluster_bytes(report: dict, plan_file: str, inventory_yaml: str) -> float:
    """The planner's bytes between clusters per iteration (plan/explain.py cross_cluster_bytes, what `hetauto
    compare` shows) for the model a `dryrun --json` report ran."""
    import yaml

    from hetauto_megatron.commands._dryrun_comparison import measured_plan
    from hetauto_megatron.plan.explain import cross_cluster_bytes
    from hetauto_megatron.plan.plan import load_plan
    from hetauto_megatron.spec.inventory import inventory_from_dict
    ran = measured_plan(report, load_plan(os.path.join(ROOT, plan_file)), report_file=plan_file, tiny=None)
    inventory = inventory_from_dict(yaml.safe_load(inventory_yaml))
    return cross_cluster_bytes(ran, inventory.with_precision(ran.precision))


def megatron_options():
    """Megatron-LM's own argument parser and every flag it has, for checking the flags a note or launch names."""
    import argparse

    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    return parser, {flag for action in parser._actions for flag in action.option_strings}


def run_hetauto(*argv: str, cwd: str = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    """`hetauto ARGV...` as a user starts it (a fresh interpreter), from the repository root by default."""
    return subprocess.run([sys.executable, "-m", "hetauto_megatron.cli", *argv], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def hetauto_here(*argv: str) -> subprocess.CompletedProcess:
    """`hetauto ARGV...` as run_hetauto gives it (exit code, stdout, stderr, from the repository root), run in this
    process: a fresh interpreter imports torch and Megatron-Core again, about 5 s of a dry run's 8 on 2 cores (its
    ranks are forked from the command's process either way). For the tests whose point is what the command does,
    not that it starts; test_runtime_overlap.py's emulated-link runs and the CLI's error paths keep run_hetauto."""
    import contextlib
    import io

    from hetauto_megatron import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(list(argv))
        except SystemExit as exc:          # argparse's refusals, as the interpreter would end with them
            rc = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(["hetauto", *argv], rc, out.getvalue(), err.getvalue())


def run_script_forked(script: str, argv: list, env: dict, cwd: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGV...` with environment `env` in `cwd`, run in a child forked from this process (the
    script's own code runs as its __main__, with sys.argv and sys.path[0] as the interpreter sets them; what it
    imports and this process has already imported is not imported again: Megatron-LM's training loop costs
    about 10 s of CPU per interpreter). For a script that answers its arguments and exits; exit code and
    output as a subprocess gives them, a traceback for an exception that escapes it (the interpreter's)."""
    import atexit
    import runpy
    import signal
    import tempfile
    import time

    import megatron.training.training  # noqa: F401  (imported once, before the fork)

    out, err = tempfile.TemporaryFile(mode="w+b"), tempfile.TemporaryFile(mode="w+b")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:    # the child
        code = 1
        try:
            atexit._clear()     # the parent's exit handlers are not the script's (an interpreter starts with none)
            os.setsid()
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            sys.argv = [script, *map(str, argv)]
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            # as the launcher's forked ranks (runtime/launcher.py): OpenMP's thread team is not fork-safe, and a
            # child of a process whose torch ops had started it (test_measure_cli_inputs' in-process `hetauto
            # profile` runs, earlier on the same worker) hung in its first parallel op until the 300 s timeout
            if "torch" in sys.modules:
                sys.modules["torch"].set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
            try:
                runpy.run_path(script, run_name="__main__")
                code = 0
            except SystemExit:
                raise
            except BaseException:
                sys.excepthook(*sys.exc_info())     # as the interpreter ends on an uncaught exception: exit 1
        except SystemExit as exc:   # sys.exit(), also raised inside an excepthook: the exit code
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    code = _reaped(pid, time.monotonic() + timeout)
    if code is None:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise subprocess.TimeoutExpired([script, *argv], timeout)
    out.seek(0)
    err.seek(0)
    return subprocess.CompletedProcess([script, *argv], code, out.read().decode(errors="replace"),
                                       err.read().decode(errors="replace"))


def _reaped(pid: int, deadline: float) -> int | None:
    """The exit code of forked child `pid` once it ends, or None if it still runs at `deadline` (time.monotonic)."""
    import time
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    return None


def run_cli(argv, capsys) -> tuple[int, str, str]:
    """`hetauto ARGV` in this process: (exit code, stdout, stderr) as pytest's `capsys` captured them."""
    from hetauto_megatron import cli
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


# a job's flags for Megatron-LM's parser (what a user appends to an emitted launch script; an emitted script of cpu
# processes carries their unfused layers itself, and an accelerator mesh's runs Megatron's fused defaults)
JOB_FLAGS = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--mock-data", "--train-iters", "1",
             "--lr", "1e-3"]


def transformer_config(margs, args):
    """Megatron's core_transformer_config_from_args for parsed (and validated) arguments, on a machine that may lack
    Transformer Engine: its TransformerConfig refuses the fused rotary embedding (Megatron-LM's default on an
    accelerator mesh) without it, so a copy of the arguments with that one fusion off is what builds the config."""
    import copy
    args = copy.copy(args)
    args.apply_rope_fusion = False
    return margs.core_transformer_config_from_args(args)


def parse_emitted(monkeypatch, plan, extra, mesh_index: int = 0):
    """(Megatron-LM's arguments module, its parse) of what `hetauto emit megatron` writes for the plan's mesh
    `mesh_index`, JOB_FLAGS and `extra`."""
    import sys

    import megatron.training.arguments as margs

    from hetauto_megatron.emit.megatron import megatron_args
    from hetauto_megatron.megatron import cpu
    from hetauto_megatron.megatron.args import hetauto_args_provider

    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    cpu.apply()
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *megatron_args(plan, mesh_index, "plan.yaml"), *JOB_FLAGS,
                                      *extra])
    return margs, margs.parse_args(hetauto_args_provider())


def rank0_placement(plan):
    """Global rank 0's placement in `plan` (launch_identity.check_launch)."""
    from hetauto_megatron.megatron import launch_identity
    return launch_identity.check_launch(plan, launch_identity.LaunchIdentity(0, plan.world_size, None), None)


def mesh(cluster, tp, dp, mbs, layers, recompute="none", device="cpu") -> dict:
    """One mesh of a plan file."""
    return {"cluster": cluster, "device_type": device, "tp": tp, "dp": dp, "micro_batch_size": mbs,
            "recompute": recompute, "stage_layers": layers}


# NVIDIA's Megatron-LM entry script and the two files it imports (what hetauto's patch is written for).
NVIDIA_ENTRY_FILES = ("pretrain_gpt.py", "model_provider.py", "gpt_builders.py")


def nvidia_megatron_lm() -> str | None:
    """A directory holding NVIDIA's pretrain_gpt.py of Megatron-LM core_v0.19.0 and the files it imports:
    $HETAUTO_MEGATRON_LM (a checkout of branch core_r0.19.0), else the copy scripts/setup.sh downloads into
    the cache; None when neither exists (the tests that run it are then skipped)."""
    cache = os.environ.get("HETAUTO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hetauto")
    for where in (os.environ.get("HETAUTO_MEGATRON_LM"), os.path.join(cache, "megatron-lm-core_v0.19.0")):
        if where and all(os.path.isfile(os.path.join(where, f)) for f in NVIDIA_ENTRY_FILES):
            return where
    return None


def small_inventory(clusters, links):
    """An Inventory from (name, device, nodes, devices per node) clusters and (a, b, Gbit/s, ms) links; every
    cluster's nodes joined at 200 Gbit/s, 10 us."""
    from hetauto_megatron.spec.inventory import inventory_from_dict
    return inventory_from_dict({
        "clusters": [{"name": n, "device": d, "nodes": nodes, "devices_per_node": dpn,
                      "inter_node": {"bandwidth_gbps": 200, "latency_us": 10}} for n, d, nodes, dpn in clusters],
        "links": [{"between": [a, b], "bandwidth_gbps": bw, "latency_ms": lat} for a, b, bw, lat in links]})


def twins_and_l40s() -> dict:
    """Inventory data: two A100 clusters of 16 on a 400 Gbit/s link and 8 L40S linked to both at 100 Gbit/s. With
    an 8-layer model of LLaMA-2-7B's width and a global batch of 512 the planner makes two pipelines of it."""
    node = {"nodes": 2, "devices_per_node": 8, "inter_node": {"bandwidth_gbps": 200, "latency_us": 10}}
    return {"clusters": [{"name": "a", "device": "a100-80gb", **node}, {"name": "b", "device": "a100-80gb", **node},
                         {"name": "c", "device": "l40s", **node, "nodes": 1}],
            "links": [{"between": ["a", "b"], "bandwidth_gbps": 400, "latency_ms": 1},
                      {"between": ["a", "c"], "bandwidth_gbps": 100, "latency_ms": 1},
                      {"between": ["b", "c"], "bandwidth_gbps": 100, "latency_ms": 1}]}


# The device types random test instances draw from: three vendors, 32 to 192 GiB per device.
RANDOM_DEVICES = ["a100-40gb", "a100-80gb", "h100-sxm", "l40s", "mi300x", "ascend-910b", "v100", "h20"]


def random_instance(rng, clusters=(2, 3), nodes=(1, 2), devices_per_node=8, bandwidths=(10, 25, 100),
                    models=("llama2-7b", "llama2-13b"), batches=(64, 128)):
    """(inventory, model, global batch) drawn from `rng`: clusters named a, b, c, each of one RANDOM_DEVICES type,
    every two linked at one of `bandwidths` Gbit/s and 1 or 3 ms, a preset of `models`, a batch of `batches`.
    Each argument is the sequence a value is drawn from; a plain number is used as it is and draws nothing, so a
    test's instances stay those its figures were measured on."""
    from hetauto_megatron.spec.model import PRESETS

    def draw(values):
        return rng.choice(values) if isinstance(values, (list, tuple)) else values

    names = "abc"[:draw(clusters)]
    inv = small_inventory([(n, rng.choice(RANDOM_DEVICES), draw(nodes), draw(devices_per_node)) for n in names],
                          [(a, b, rng.choice(bandwidths), rng.choice([1, 3])) for i, a in enumerate(names)
                           for b in names[i + 1:]])
    model = PRESETS[draw(models)]
    return inv, model, draw(batches)


def record_calls(module, names, entry) -> None:
    """Wrap the functions `names` of `module` (torch.distributed, before DeepSpeed's backend binds them) so that each
    call first gives `entry(name, args, kwargs)` to the test's log, then runs unchanged."""
    for name in names:
        original = getattr(module, name)

        def call(*args, _original=original, _name=name, **kwargs):
            entry(_name, args, kwargs)
            return _original(*args, **kwargs)

        setattr(module, name, call)


def record_instructions(engine, where: list) -> None:
    """Replace a DeepSpeed PipelineEngine's instruction table by one whose entries set `where[0]` to their
    instruction's name while they run ("between" after), so that what a test records is tagged with it."""
    def wrap(fn, name):
        def run(self, *args, **kwargs):
            where[0] = name
            try:
                return fn(self, *args, **kwargs)
            finally:
                where[0] = "between"
        return run
    engine._INSTRUCTION_MAP = {k: wrap(v, k.__name__) for k, v in type(engine)._INSTRUCTION_MAP.items()}


def leaves_within_bounds(sp, value, limit: int, rng=None) -> int:
    """Branch and bound is exact only if every node's bound is at most the value of every leaf under it: asserts
    that for the first `limit` leaves of the search space `sp` (`value(leaf) -> (objective, _)`), or with `rng` for
    `limit` random root-to-leaf paths (the first leaves differ mostly in the last mesh's decisions), and returns how
    many of them were feasible."""
    import math

    from hetauto_megatron.plan import space as space_mod

    def random_leaves():
        for _ in range(limit):
            path = ()
            while sp.actions(path):
                path += (rng.choice(sp.actions(path)),)
            if sp.decode(path)[1]:
                yield path
    feasible = 0
    for leaf in (space_mod.leaves(sp, limit=limit) if rng is None else random_leaves()):
        v, _ = value(leaf)
        if math.isfinite(v):
            feasible += 1
            assert all(sp.bound(leaf[:k]) <= v * (1 + 1e-9) for k in range(len(leaf) + 1)), leaf
    return feasible


def descendants(pids) -> list[int]:
    """Every live process below `pids` (children, their children, ...), read from /proc by parent pid. Taken in one
    pass before anything is killed: a process whose parent dies is reparented to init (or a subreaper), and then
    nothing leads from the launch to it any more."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue            # gone meanwhile
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(pids)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def kill_launches(procs) -> None:
    """SIGKILL the subprocesses `procs` (Popen) that still run, every process below them and the process groups of
    all of them, then reap `procs`. torch's elastic agent (torchrun, hetauto-torchrun) starts each worker in a
    session of its own, so killing the launch's process group (bash and the agent) left the workers training or
    waiting up to their HETAUTO_TIMEOUT_S beside the rest of the suite."""
    import signal
    running = [p.pid for p in procs if p.returncode is None]   # not reaped: the pid is still the launch's
    below = descendants(running)                # all of them before any dies (its children would go to init)
    ours = os.getpgrp()
    for pid in running + below:                 # the launches first: an agent killed starts no more workers
        try:
            group = os.getpgid(pid)
            if group != ours:                   # (a process started without a session of its own: not pytest's)
                os.killpg(group, signal.SIGKILL)    # any member the walk above did not reach
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for p in procs:
        p.wait()


def wait_all(procs, timeout: float) -> list[int]:
    """Exit codes of subprocesses started with start_new_session=True; whatever still runs after `timeout`
    seconds (or when waiting fails) is killed with every process it started and their process groups
    (kill_launches), so no launch, and no worker of one, outlives its test."""
    import time
    deadline, codes = time.monotonic() + timeout, []
    try:
        for p in procs:
            codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
        return codes
    finally:
        if len(codes) < len(procs):
            kill_launches(procs)


def random_pipeline(rng, min_stages: int = 1, micro_batches=(32, 64, 128)):
    """A random pipeline for the closed forms of 1F1B (plan/pipeline.py, plan/pipeline_fill.py) against the event
    simulation: (stages, micro-batches, forward and backward per stage, link and latency per boundary, blocking,
    depth); 1-10 stages, backward about twice the forward, links of any speed up to a slow stage's time."""
    p, m = rng.randint(min_stages, 10), rng.choice(micro_batches)
    f = [rng.uniform(0.5, 2) for _ in range(p)]
    b = [x * rng.uniform(1.9, 2.1) for x in f]
    link = [rng.uniform(0, 1.0) for _ in range(p - 1)]
    lat = [x * rng.uniform(0, 1) for x in link]
    blk = [rng.random() < 0.5 for _ in range(p - 1)]
    depth = [0 if x else rng.randint(0, 3) for x in blk]
    return p, m, f, b, link, lat, blk, depth


def shared_uplinks_draw(rng, p, occ, whole=True):
    """Stages in random clusters along the pipeline (a new one at a boundary with probability 0.7); every
    cluster's uplink taking each transfer across it for a random whole number of seconds, from one to the link
    occupancy `occ` (a whole number > 0; whole=False: any fraction of it), never more: a link is capped by the
    uplinks of its clusters (Inventory.link). The clusters in the middle carry two boundaries on theirs."""
    c = [0]
    for _ in range(1, p):
        c.append(c[-1] + (rng.random() < 0.7))
    out = []
    for l in range(p - 1):
        if c[l] == c[l + 1] or occ[l] == 0:
            out.append(None)
            continue
        sec = rng.choice([occ[l], max(occ[l] // 2, 1), rng.randint(1, occ[l])]) if whole else \
            occ[l] * rng.choice([1.0, 0.5, 0.8, rng.random()])
        out.append(((((c[l], "out"), sec), ((c[l + 1], "in"), sec)), (((c[l + 1], "out"), sec), ((c[l], "in"), sec))))
    return tuple(out) if any(out) else None


def side_by_side(fn, jobs, timeout: float = 600) -> list:
    """[fn(job) for job in jobs], computed in processes forked from this one, as many at once as this machine has
    cores (each takes every k-th job, in order, so jobs that share a cache still share it). For tests that check a
    pure, single-threaded computation (the planner's searches, their brute-force references) on several independent
    instances: a test's core is otherwise the only one it uses, and when the other pytest worker (pytest.ini) waits
    or runs one process, the second core is idle; when both are busy the system shares them. The results come back pickled;
    an exception in a job (a failed assert) is raised here with the job's own traceback, and a job still running
    after `timeout` seconds fails the test. Forked children see this process's state (monkeypatches, fixtures), so
    `fn` may be a closure; nothing they change comes back but the results."""
    import pickle
    import signal
    import tempfile
    import time
    import traceback

    jobs = list(jobs)
    k = max(1, min(len(jobs), len(os.sched_getaffinity(0))))
    if k == 1:
        return [fn(job) for job in jobs]
    children = []
    for i in range(k):
        out = tempfile.TemporaryFile()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:    # the child: its share of the jobs, then a plain exit (no pytest teardown, no atexit)
            code = 0
            try:
                try:
                    result = ("ok", [fn(job) for job in jobs[i::k]])
                except BaseException as exc:    # noqa: BLE001  (carried to the parent, which raises it)
                    code = 1
                    result = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
                pickle.dump(result, out)
                out.flush()
            finally:
                os._exit(code)
        children.append((pid, out))
    deadline, results, errors = time.monotonic() + timeout, [None] * len(jobs), []
    for i, (pid, out) in enumerate(children):
        if _reaped(pid, deadline) is None:
            for other, _ in children:
                try:
                    os.kill(other, signal.SIGKILL)
                    os.waitpid(other, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
            raise AssertionError(f"side_by_side: jobs still running after {timeout:.0f} s")
        out.seek(0)
        try:
            result = pickle.load(out)
        except EOFError:
            result = ("error", "the job's process ended without a result", "")
        if result[0] == "ok":
            results[i::k] = result[1]
        else:
            errors.append(result)
    if errors:
        raise AssertionError(f"{errors[0][1]}\n--- in the forked job:\n{errors[0][2]}")
    return results


# The opening of a script that runs Megatron-Core's modules in one gloo rank on the CPU (their TP group needs a
# world): the CUDA-to-CPU redirections, then a world of one and Megatron's parallel state and RNG.
ONE_RANK_PROBE = r"""
import json, tempfile
from hetauto_megatron.runtime.device import enable_cpu_redirects
enable_cpu_redirects()
import torch, torch.distributed as dist, torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
parallel_state.initialize_model_parallel(1, 1)
tensor_parallel.model_parallel_cuda_manual_seed(1)
"""


def run_one_rank_probe(tmp_dir, body: str):
    """Run ONE_RANK_PROBE + `body` in a child process (its world and Megatron's state stay there); the JSON its
    last line of stdout prints."""
    import json
    probe = tmp_dir / "probe.py"
    probe.write_text(ONE_RANK_PROBE + body)
    done = run_script_forked(str(probe), [], dict(os.environ), os.getcwd(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
