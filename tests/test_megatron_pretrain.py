"""The whole Megatron-LM training loop (megatron.training.pretrain) with --hetauto on CPU processes.

The --hetauto run of the 2-cluster tiny plan (cluster-a: TP 2 x 2 stages, cluster-b: TP 1 x DP 2) must give
the losses of Megatron's own homogeneous layout with the same pipeline stages (TP 1, DP 1, no hetauto):
Megatron seeds each stage by its pipeline rank and --use-cpu-initialization draws full weights before TP
slicing, so the two runs start from the same weights and see the same samples.
"""
import os
import re
import subprocess
import sys

import pytest
from helpers import wait_all
from test_megatron_patch import nvidia_script  # noqa: F401  (fixture: NVIDIA's pretrain_gpt.py, patched)
from test_torchrun_port import HETAUTO_TORCHRUN

from hetauto_megatron.emit.megatron import emit_megatron
from hetauto_megatron.megatron import demo
from hetauto_megatron.plan.plan import load_plan

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The 2-cluster tiny plan as written (blocking cross-cluster boundary; the overlapped one runs in the test of
    NVIDIA's pretrain_gpt.py), its logs in a folder given (`hetauto demo` gives its --out)."""
    lines = []
    logs = str(tmp_path_factory.mktemp("megatron-logs"))
    return demo.run_tiny(PLAN, iters=3, out=lines.append, log_dir=logs), lines


def test_the_demos_megatron_logs_go_where_asked(tiny_run):
    """`hetauto demo` says everything it writes goes to --out; its Megatron logs went to a new folder under /tmp."""
    result, lines = tiny_run
    plan = load_plan(PLAN)
    for run, ranks in (("hetauto", plan.world_size), ("reference", 1)):
        written = os.listdir(os.path.join(result["log_dir"], run))
        assert len(written) >= ranks and all(f.endswith(".log") for f in written), written
    assert f"Megatron logs: {result['log_dir']}" in lines


def test_hetauto_pretrain_matches_megatron_homogeneous_layout(tiny_run):
    result, lines = tiny_run
    het, ref = result["hetauto"], result["reference"]
    assert len(het) == 3 and len(ref) == 3, result
    assert result["max_abs_diff"] <= 1e-5, result
    assert het[0] != het[-1], "the model did not train"
    # activations really crossed between the two clusters through hetauto's communicator
    assert result["bytes"].get("inter_cluster", 0) > 0, result["bytes"]
    assert any("max |loss difference|" in line for line in lines)


def test_checkpoint_per_mesh_shards_and_resume_gives_the_uninterrupted_losses(tmp_path):
    """--ckpt-format torch under --hetauto with TP 2 and TP 1 meshes: each (TP rank, stage) saves its own shard;
    3 iterations saving at the 2nd, then a run resumed from that checkpoint trains the 3rd: its loss is the
    uninterrupted run's; a rank whose shard is missing stops with one paragraph.

    The plan's meshes run without the distributed optimizer here: Megatron-Core 0.19 cannot load its
    distributed-optimizer state from the `torch` format when the optimizer is torch's Adam on fp32 parameters
    (what a CPU process without Apex or Transformer Engine runs): the main parameters are views of the model's
    and Adam's per-parameter `step` is not in the file (docs/megatron-integration.md, Checkpoints)."""
    import dataclasses

    plan = load_plan(PLAN)
    plan = dataclasses.replace(plan, meshes=tuple(dataclasses.replace(
        m, setting_overrides={"distributed_optimizer": False, "overlap_param_gather": False}) for m in plan.meshes))
    PLAN_NO_DO = str(tmp_path / "plan.yaml")
    plan.save(PLAN_NO_DO)
    ckpt = tmp_path / "ckpt"
    argv = demo.hetauto_argv(PLAN_NO_DO, plan, iters=3, seed=1234) + ["--ckpt-format", "torch"]
    whole = demo.last_rank_losses(demo.run_entry(argv + ["--save", str(ckpt), "--save-interval", "2"],
                                                 plan.world_size, log_dir=str(tmp_path)))
    shards = sorted(p.name for p in (ckpt / "iter_0000002").iterdir() if p.name != "hetauto-plan.json")
    # cluster-a: TP 2 x stages 0, 1; cluster-b: TP 1 x stage 2 (its DP replica 1 does not write)
    assert shards == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_00_002", "mp_rank_01_000", "mp_rank_01_001"]
    resumed = demo.last_rank_losses(demo.run_entry(argv + ["--load", str(ckpt), "--ckpt-step", "2"],
                                                   plan.world_size, log_dir=str(tmp_path)))
    assert len(whole) == 3 and len(set(whole)) == 3 and len(resumed) == 1
    assert abs(resumed[0] - whole[2]) <= 1e-6, (whole, resumed)
    # cluster-b's shard not on its machine (a copy left out): Megatron printed "could not load the checkpoint" and
    # ended those ranks with sys.exit(), exit code 0, the others stopping in their next collective; now one
    # paragraph on those ranks, naming the shard and --load
    import shutil

    from hetauto_megatron.errors import InputError
    shutil.rmtree(ckpt / "iter_0000002" / "mp_rank_00_002")
    with pytest.raises(InputError) as exc:
        demo.run_entry(argv + ["--load", str(ckpt), "--ckpt-step", "2"], plan.world_size, log_dir=str(tmp_path))
    assert exc.value.field == "--load" and "iter_0000002/mp_rank_00_002/model_optim_rng.pt, is not on this machine" \
        in exc.value.message, exc.value.message


# ---- NVIDIA's pretrain_gpt.py under torchrun, at the production settings -----------------------------------------

# the plan's default settings (plan/settings.py) in Megatron's spelling, as the launch scripts emit them; given to
# Megatron's own reference run
PRODUCTION_FLAGS = ["--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce",
                    "--overlap-param-gather"]
NVIDIA_ITERS = 4
LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ .*\| lm loss: ([0-9.E+-]+) \|")


def _torchrun(script, argv, nproc, port, log, env=None, cwd=None):
    cmd = [TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
           "--master-port", str(port), script, *argv]
    fh = open(log, "w")
    return subprocess.Popen(cmd, env=dict(os.environ, PYTHONWARNINGS="ignore", CUDA_DEVICE_MAX_CONNECTIONS="1",
                                          **(env or {})),
                            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=cwd or os.path.dirname(script))


def _logged_losses(text):
    found = sorted((int(i), float(v)) for i, v in LOSS.findall(text))
    assert [i for i, _ in found] == list(range(1, NVIDIA_ITERS + 1)), text[-3000:]
    return [v for _, v in found]


def job_flags(plan, iters):
    """The job's own arguments after the emitted ones: mock data, the vocabulary, a comparable CPU run's flags (a CPU
    mesh's layers come with its launch script)."""
    return (["--vocab-size", str(plan.model.vocab_size)] +
            demo.training_flags(iters, 1234) + demo.CPU_RUN_FLAGS)


def run_against_megatron(script, tmp_path, plan_file, launch_facts, last_log, extra=(), data=None):
    """Run the launch scripts `hetauto emit megatron` writes for the plan (2 devices per node) as they are, one
    bash per node (their default launcher, hetauto-torchrun, inside: its rendezvous per launch, NVIDIA's script as
    MEGATRON_SCRIPT; no node of the job that succeeded may log torch's "Error waiting on exit barrier", which
    torchrun's node 0 caused now and then by leaving before the others were through: pytorch/pytorch#69520), then
    Megatron's own single-pipeline run (demo.reference_argv: without --hetauto the patched script is Megatron's
    own, on CPU with the flags of docs/megatron-integration.md, demo.CPU_FLAGS, and must train). `data`: a real
    dataset's flags in place of --mock-data, every launch and Megatron's run in a directory of its own (as on
    machines of their own: a relative path in `data` is then each one's own). Returns (launches, logs by
    "<launch>.node<n>", by launch name (its last node) and "reference", the --hetauto losses, Megatron's)."""
    from hetauto_megatron.runtime.launcher import free_port

    plan = load_plan(plan_file)
    launches = emit_megatron(plan, plan_path=plan_file, devices_per_node=2)
    assert [(la["cluster"], la["pipeline"], la["rank_offset"], la["num_devices"]) for la in launches] == launch_facts
    base = dict(os.environ, TORCHRUN=HETAUTO_TORCHRUN, MEGATRON_SCRIPT=script, HETAUTO_MASTER_ADDR="127.0.0.1",
                HETAUTO_MASTER_PORT=str(free_port()), HETAUTO_TIMEOUT_S="120", CLUSTER_MASTER_ADDR="127.0.0.1",
                PYTHONWARNINGS="ignore")
    def with_data(argv):
        return [f for a in argv for f in (data if data and a == "--mock-data" else [a])]

    def cwd(name):
        if not data:
            return os.path.dirname(script)
        os.makedirs(tmp_path / name, exist_ok=True)
        return str(tmp_path / name)

    procs, logs = [], {}
    for la in launches:
        path = tmp_path / f"{la['name']}.sh"
        path.write_text(la["script"])
        port = free_port()
        for node in range(la["nnodes"]):
            log = tmp_path / f"{la['name']}.node{node}.log"
            env = dict(base, NODE_RANK=str(node), CLUSTER_MASTER_PORT=str(port))
            with open(log, "w") as fh:
                procs.append(subprocess.Popen(["bash", str(path), *with_data(job_flags(plan, NVIDIA_ITERS)), *extra],
                                              env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                              cwd=cwd(la["name"])))
            logs[f"{la['name']}.node{node}"] = logs[la["name"]] = log
    codes = wait_all(procs, timeout=400)
    logs = {name: log.read_text() for name, log in logs.items()}
    assert codes == [0] * len(procs), {k: v[-3000:] for k, v in logs.items()}
    for name, text in logs.items():
        assert "Error waiting on exit barrier" not in text and "Traceback" not in text, (name, text[-3000:])
    het = _logged_losses(logs[last_log])     # Megatron logs on the last rank

    ref_argv, stages = demo.reference_argv(plan, iters=NVIDIA_ITERS, seed=1234)
    ref_log = tmp_path / "megatron.log"
    codes = wait_all([_torchrun(script, with_data(ref_argv + PRODUCTION_FLAGS + list(extra)), stages, free_port(),
                                ref_log, cwd=cwd("reference"))], timeout=300)
    assert codes == [0], ref_log.read_text()[-3000:]
    logs["reference"] = ref_log.read_text()
    ref = _logged_losses(logs["reference"])
    assert len(set(ref)) == NVIDIA_ITERS, f"the model did not train: {ref}"
    return launches, logs, het, ref


def test_the_examples_hand_launch_trains(tmp_path):
    """The torchrun command examples/llama/README.md gives for launching our entry script by hand, run as written
    (its flags read from the README): it trains. It lacked --position-embedding-type rope, so Megatron built learned
    positions the plan never priced; the --hetauto rewrite now refuses that, so a stale example fails here."""
    from hetauto_megatron.runtime.launcher import free_port

    text = open(os.path.join(ROOT, "examples", "llama", "README.md")).read()
    block = re.search(r"^ *torchrun (--nproc-per-node \d+ pretrain_llama_hetauto\.py.*?--hetauto-plan \S+)$", text,
                      re.M | re.S)
    assert block, "the README's hand launch is gone"
    argv = block.group(1).replace("\\\n", " ").split()
    log = tmp_path / "hand.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([TORCHRUN, "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *argv],
                                cwd=os.path.join(ROOT, "examples", "llama"), stdout=fh, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONWARNINGS="ignore", CUDA_DEVICE_MAX_CONNECTIONS="1"),
                                start_new_session=True)
    codes = wait_all([proc], timeout=300)
    out = log.read_text()
    assert codes == [0], out[-3000:]
    assert len(re.findall(r"\| lm loss: [0-9.E+-]+ \|", out)) == 3, out[-3000:]


@pytest.mark.parametrize("refused", ["cluster-b", "cluster-a"])
def test_a_cluster_whose_launch_is_refused_stops_the_others_at_once(tmp_path, refused):
    """A 2-cluster plan's emitted scripts (two one-rank clusters: test_job_agreement's plan), one per node, the
    refused cluster's launch given a global batch other than the plan's: its workers stop with exit 2 (hook's check), and the other cluster's, waiting at the world's
    rendezvous, stop at once too (exit 2, naming the refused rank's cluster and paragraph), well before
    HETAUTO_TIMEOUT_S (before: they waited all of it, then stopped with a timeout that did not say why). Refusing
    cluster-a refuses global rank 0, which hosts the store the others learn it from. The scripts run with their
    default launcher (hetauto-torchrun, found on PATH where hetauto is installed): the refused cluster's script
    ends with its workers' exit 2 too, without torchrun's ChildFailedError traceback (before: exit 1 and that
    traceback after the paragraph)."""
    import subprocess
    import time

    from hetauto_megatron.runtime.launcher import free_port

    from test_job_agreement import PLAN_YAML

    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN_YAML)
    plan = load_plan(str(plan_file))
    launches = emit_megatron(plan, plan_path=str(plan_file), devices_per_node=2)
    env = {k: v for k, v in os.environ.items() if k != "TORCHRUN"}
    env.update(PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
               HETAUTO_MASTER_ADDR="127.0.0.1", HETAUTO_MASTER_PORT=str(free_port()), HETAUTO_TIMEOUT_S="400", CLUSTER_MASTER_ADDR="127.0.0.1", PYTHONWARNINGS="ignore",
               MEGATRON_SCRIPT=os.path.join(ROOT, "examples", "llama", "pretrain_llama_hetauto.py"))
    procs, logs = [], {}
    start = time.monotonic()
    for la in launches:
        script = tmp_path / f"{la['name']}.sh"
        script.write_text(la["script"])
        port, argv = free_port(), job_flags(plan, 2)
        if la["cluster"] == refused:
            argv += ["--global-batch-size", str(plan.global_batch_size * 2)]
        for node in range(la["nnodes"]):
            log = logs[f"{la['cluster']}.node{node}"] = tmp_path / f"{la['name']}.node{node}.log"
            with open(log, "w") as fh:
                procs.append(subprocess.Popen(["bash", str(script), *argv], stdout=fh, stderr=subprocess.STDOUT,
                                              env=dict(env, NODE_RANK=str(node), CLUSTER_MASTER_PORT=str(port)),
                                              start_new_session=True, cwd=str(tmp_path)))
    codes = wait_all(procs, timeout=200)
    took = time.monotonic() - start
    text = {name: path.read_text() for name, path in logs.items()}
    assert codes == [2] * len(procs), {k: v[-1500:] for k, v in text.items()}
    assert took < 150, took
    for name, out in text.items():
        if name.startswith(refused):
            assert "--global-batch-size" in out and "hetauto-torchrun: worker rank(s)" in out, out[-2000:]
            assert "Traceback" not in out and "ChildFailedError" not in out, out[-2000:]
        else:
            assert "another cluster's launch was refused" in out and f"(cluster {refused})" in out, out[-2000:]
            assert "Traceback" not in out, out[-2000:]


# (the ranks of one torchrun share a log, and Megatron's print writes the line and its end apart: no anchors)
BUILT = re.compile(r"number of parameters on \(tensor, gtp_remat, pipeline\) model parallel rank "
                   r"\((\d+), \d+, (\d+)\): (\d+)")
GPT_FAMILY = {"swiglu": "False", "normalization": "LayerNorm", "add_bias_linear": "True",
              "position_embedding_type": "learned_absolute", "untie_embeddings_and_output_weights": "False"}


def test_nvidia_pretrain_gpt_runs_a_gpt_family_plan_at_production_settings_as_megatron_builds_it(nvidia_script,  # noqa: F811
                                                                                                tmp_path):
    """NVIDIA's own pretrain_gpt.py (core_v0.19.0, patched) with --hetauto, started by the scripts `hetauto emit
    megatron` writes for 2-device nodes, run as they are (one torchrun per node: cluster-a's two nodes share a
    rendezvous, cluster-b's node has its own; the scripts' HETAUTO_* variables join them into one world of 6), on
    the 2-cluster plan (cluster-a: TP 2 x 2 stages recomputing full, cluster-b: TP 1 x DP 2 recomputing none), at
    the production settings the scripts emit (sequence parallelism, the distributed optimizer, the overlapped
    gradient reduce-scatter and parameter all-gather), the cross-cluster boundary overlapped (depth 1: asynchronous
    transfers, receives posted ahead, one more warm-up micro-batch on cluster-a), for the examples/gpt3 and peer
    (OPT, GPT-Neo) family: gated_mlp: false (GeLU, LayerNorm, linear biases), learned positions, tied embeddings
    (NVIDIA's GPT default). Then Megatron's own homogeneous layout with the same stages and flags (TP 1, PP 3, no
    --hetauto). Megatron's logged losses must agree to 1e-5 over 4 iterations (measured: equal to all 7 printed
    digits: 5.574901, 5.505037, 5.311711, 5.170052). Measured without the runtime's rules: the untied plan with the plain
    optimizer's gradient rules drifted by 0, 0, 3e-6, 3.0e-5; the tied plan without the initial copy of the
    embeddings to the last stage started from a zero output layer.

    The emitted architecture flags and the reference's come from one table (emit/megatron.py architecture_args),
    so the losses alone would agree on a wrong flag. What can fail besides: the parameters Megatron reports building
    on each (TP rank, stage), in both runs, must be what the planner prices its memory from (cost/memory.py
    stage_params, from the model spec, which GPT-2's published count checks): --disable-bias-linear, --swiglu,
    RMSNorm, rotary positions or an untied output layer each change them; Megatron's argument printout must show
    the production settings, the GPT family's settings and each mesh's recomputation; each torchrun worker must
    have found its global place from its cluster-relative RANK and the script's offset; and the NCCL flight
    recorder's variables the hook sets for --flight-recorder-dump-path must be those Megatron's own run printed."""
    import yaml

    from hetauto_megatron.cost.memory import stage_params

    raw = yaml.safe_load(open(PLAN))
    raw["version"] = 2
    raw["model"].update(name="tiny-gpt", gated_mlp=False, tie_embeddings=True, position_embedding="learned",
                        num_query_groups=raw["model"]["num_attention_heads"])
    raw["meshes"][0]["recompute"] = "full"
    raw["meshes"][0]["boundary"] = {"schedule": "overlapped", "depth": 1}
    plan_file = tmp_path / "gpt-plan.yaml"
    plan_file.write_text(yaml.safe_dump(raw))
    launches, logs, het_losses, ref_losses = run_against_megatron(
        nvidia_script, tmp_path, str(plan_file), [("cluster-a", 0, 0, 4), ("cluster-b", 0, 4, 2)], "cluster-b",
        extra=("--flight-recorder-dump-path", str(tmp_path / "nccl-trace")))
    print(f"--hetauto: {het_losses}\nMegatron's layout: {ref_losses}")
    # the NCCL flight recorder's environment (megatron/group_args.py): what Megatron's own run printed setting it
    ours = dict(kv.split("=", 1) for kv in re.search(r"\[hetauto\] NCCL flight recorder: (.*)",
                                                     logs["cluster-a.node0"]).group(1).split(", "))
    megatrons = dict(re.findall(r"^\s+(TORCH_\w+)=(.*)$", logs["reference"], re.M))
    assert ours["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "nccl-trace"), ours
    assert {k: megatrons.get(k) for k in ours} == ours, (ours, megatrons)
    assert max(abs(a - b) for a, b in zip(het_losses, ref_losses)) <= 1e-5, (het_losses, ref_losses)
    assert [la["nnodes"] for la in launches] == [2, 1]
    assert "[hetauto] rank 2: cluster cluster-a (cpu), mesh 0, stage 1" in logs["cluster-a.node1"]
    assert "stage 1, tp rank 0, dp rank 0; boundary to mesh 1: overlapped, depth 1;" in logs["cluster-a.node1"]
    assert "[hetauto] rank 5: cluster cluster-b (cpu), mesh 1, stage 2, tp rank 0, dp rank 1" in logs["cluster-b"]
    # Megatron's own argument printout (global rank 0, a TP 2 rank): what it really ran with
    for arg in ("sequence_parallel", "use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather"):
        assert re.search(rf"^\s*{arg} \.+ True$", logs["cluster-a.node0"], re.M), (arg, logs["cluster-a.node0"][-3000:])

    plan = load_plan(str(plan_file))
    model = plan.model.with_padded_vocab(plan.padded_vocab_size)
    stages = [(m.tp, layers) for m in plan.meshes for layers in m.stage_layers]
    for run, tps in (("hetauto", [tp for tp, _ in stages]), ("reference", [1] * len(stages))):
        priced = {(t, s): stage_params(model, tps[s], layers, s == 0, s == len(stages) - 1)
                  for s, (_, layers) in enumerate(stages) for t in range(tps[s])}
        texts = [logs["reference"]] if run == "reference" else [logs[k] for k in logs if ".node" in k]
        built = {(int(t), int(s)): int(n) for text in texts for t, s, n in BUILT.findall(text)}
        assert built == priced, (run, built, priced)
    for name, recompute in (("cluster-a.node0", "full"), ("cluster-b", "None"), ("reference", "None")):
        for arg, value in {**GPT_FAMILY, "recompute_granularity": recompute}.items():
            assert re.search(rf"^\s*{arg} \.+ {value}$", logs[name], re.M), (name, arg, logs[name][-3000:])


def test_num_zeros_in_grad_counts_each_parameter_once(tmp_path):
    """--log-num-zeros-in-grad logs the zeros in the model's gradients. Megatron's count_zeros sums over its
    gradient-statistics group, under --hetauto the world, every rank's parameters: a plan of two pipelines counted
    each parameter twice (212,608 zeros where Megatron's own homogeneous run of the same model, each parameter
    once, counts 106,304). An untied vocabulary of 2,048 rows, most unseen in a step, so the count is not 0."""
    import yaml

    data = yaml.safe_load(open(os.path.join(ROOT, "examples", "llama", "plans", "tiny-2pipelines-cpu.yaml")))
    data["model"].update(vocab_size=2048, tie_embeddings=False)
    path = str(tmp_path / "plan.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(data, f)
    plan = load_plan(path)
    assert not plan.is_simple
    het = demo.run_entry(demo.hetauto_argv(path, plan, iters=2, seed=1234) + ["--log-num-zeros-in-grad"],
                         plan.world_size)
    argv, world = demo.reference_argv(plan, iters=2, seed=1234)
    ref = demo.run_entry(argv + ["--log-num-zeros-in-grad"], world)
    assert ref[-1]["num_zeros"] and all(z > 0 for z in ref[-1]["num_zeros"]), ref[-1]
    for r in het:
        assert r["num_zeros"] == ref[-1]["num_zeros"], (r["num_zeros"], ref[-1]["num_zeros"])
