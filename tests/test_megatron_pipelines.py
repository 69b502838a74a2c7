"""NVIDIA's pretrain_gpt.py (core_v0.19.0, patched) with --hetauto on plans of format version 3 (pipelines joined
by data parallelism, meshes side by side at a stage), launched by the scripts `hetauto emit megatron` writes, run as
they are (one torchrun per node, the launch's rank offset and the job's world size), against Megatron's own
homogeneous single-pipeline run of the same global batch.

The plan (tiny model, tied embeddings, the plan's production settings: sequence parallelism, distributed
optimizer, both overlaps; 8 ranks, 14 samples per iteration): pipeline 0 on cluster-c, TP 1 over two stages of
2 | 6 layers, 3 micro-batches of 2 samples; pipeline 1, 8 samples in 2 steps of 4: stage 0 held by mesh A
(cluster-a, TP 1 x DP 2, 1 sample each) and, alongside, mesh B (cluster-b, TP 2 with sequence parallelism, 2
samples), stage 1 by mesh C (cluster-b, TP 1 x DP 2, 2 samples each). Megatron's homogeneous reference: pipeline
0's stages (2 | 6) at TP 1, the whole batch as one micro-batch (2 ranks), the same samples of the same mock dataset.

Measured without each piece, on the former plan of two single-mesh pipelines (pipeline 0 = TP 2 over 4 | 4; max
|loss difference| over 4 iterations, against 0 with all of them): every pipeline from its own seeds instead of
pipeline 0's weights 3.6e-1; Megatron's own sampler (each pipeline from sample 0) 6.5e-2; the last pipeline's loss
logged instead of the whole batch's 1.5e-2; (pipeline 0 = TP 1 over 2 | 6) the last pipeline's validation loss
2.7e-2. The run also evaluates (every 2 iterations, and the validation and test sets at the end): measured within
1e-6 (one unit of the last printed digit) of Megatron's.
"""
import os
import re

import pytest
import yaml
from test_megatron_patch import nvidia_script  # noqa: F401  (fixture: NVIDIA's pretrain_gpt.py, patched)
from test_megatron_pretrain import NVIDIA_ITERS, job_flags, run_against_megatron

from hetauto_megatron.emit.megatron import emit_megatron
from hetauto_megatron.megatron import demo
from hetauto_megatron.plan.plan import load_plan

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2pipelines-cpu.yaml")


def two_pipeline_plan(tmp_path) -> str:
    """The example plan's two meshes, at DP 1 (6 ranks instead of 8 on a small machine) and in the other order:
    pipeline 0 (whose weights every pipeline starts from) TP 1 over 2 | 6 layers, 8 samples; pipeline 1 TP 2
    over 4 | 4 layers, 6 samples, so the start-up copy of the weights reaches TP shards and TP-duplicated norms."""
    raw = yaml.safe_load(open(PLAN))
    a, b = raw["meshes"]
    b = dict(b, dp=1)
    b.pop("pipeline")
    raw["meshes"] = [b, dict(a, pipeline=1)]
    raw["pipelines"] = [{"samples": 8}, {"samples": 6}]
    path = tmp_path / "two-pipelines.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


VALIDATION = re.compile(r"validation loss at (.*?) \| lm loss value: ([0-9.E+-]+) \|")


def validation_losses(text):
    """Megatron's logged validation (and test-set) losses: [(where, value)]."""
    return [(where, float(v)) for where, v in VALIDATION.findall(text)]


def pipelines_and_alongside_plan(tmp_path) -> str:
    """The module docstring's plan: pipeline 0 (whose weights every pipeline starts from) a single mesh; pipeline 1
    with meshes side by side at its first stage, one of them at TP 2, so the start-up copy of the weights reaches
    TP shards and TP-duplicated norms, and the activations are re-sliced from two meshes onto a third."""
    raw = yaml.safe_load(open(PLAN))
    cpu = {"device_type": "cpu"}
    raw["global_batch_size"] = 14
    raw["model"]["rotary_base"] = 500000       # LLaMA-3's: emitted, checked by --hetauto, given to the reference
    raw["pipelines"] = [{"samples": 6}, {"samples": 8}]
    raw["meshes"] = [
        dict(cpu, cluster="cluster-c", tp=1, dp=1, micro_batch_size=2, stage_layers=[2, 6]),
        dict(cpu, cluster="cluster-a", tp=1, dp=2, micro_batch_size=1, stage_layers=[4], pipeline=1),
        dict(cpu, cluster="cluster-b", tp=2, dp=1, micro_batch_size=2, stage_layers=[4], pipeline=1, alongside=True),
        dict(cpu, cluster="cluster-b", tp=1, dp=2, micro_batch_size=2, stage_layers=[4], pipeline=1)]
    path = tmp_path / "pipelines-and-alongside.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def write_corpus(prefix: str, vocab_size: int, documents: int = 300, seed: int = 0) -> str:
    """A tokenized corpus as Megatron-LM's tools/preprocess_data.py writes one (PREFIX.bin and PREFIX.idx, by
    Megatron-Core's own IndexedDatasetBuilder): `documents` documents of 16-160 random tokens."""
    import numpy
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = numpy.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.int32)
    for _ in range(documents):
        tokens = rng.integers(1, vocab_size, size=int(rng.integers(16, 161)), dtype=numpy.int32)
        builder.add_document(torch.from_numpy(tokens), [len(tokens)])
    builder.finalize(prefix + ".idx")
    return prefix


def test_pipelines_and_meshes_side_by_side_match_megatrons_single_pipeline_run(nvidia_script, tmp_path):
    """On a blend of two tokenized corpora (not mock data), each cluster's launch in a directory of its own with a
    relative
    --data-cache-path: as on machines of their own, which share no file system. Megatron-Core's rank 0 writes the
    dataset indices to its cache and every other rank that reads data loads them from the same path, so the data
    ranks of cluster-a and cluster-b found none (a FileNotFoundError traceback); under --hetauto each cluster builds
    its own (data_cache.py), the same indices: the same losses as Megatron's run."""
    plan_file = pipelines_and_alongside_plan(tmp_path)
    plan = load_plan(plan_file)
    assert plan.num_pipelines == 2 and plan.world_size == 8 and plan.model.tie_embeddings
    books, web = (write_corpus(str(tmp_path / name), plan.model.vocab_size, seed=seed)
                  for seed, name in enumerate(("books_text_document", "web_text_document")))
    launches, logs, het, ref = run_against_megatron(nvidia_script, tmp_path, plan_file,
                                                    [("cluster-c", 0, 0, 2), ("cluster-a", 1, 2, 2),
                                                     ("cluster-b", 1, 4, 4)], "cluster-b",
                                                    extra=["--eval-iters", "1", "--eval-interval", "2",
                                                           "--log-params-norm", "--clip-grad", "0.5"],
                                                    data=["--data-path", "0.3", books, "0.7", web, "--split",
                                                          "80,10,10", "--data-cache-path", "index-cache"])
    for name in ("cluster-c", "cluster-a", "cluster-b", "reference"):   # each wrote its own indices, of the blend too
        cached = os.listdir(tmp_path / name / "index-cache")
        assert any(f.endswith("GPTDataset-train-shuffle_index.npy") for f in cached), (name, cached)
        assert any(f.endswith("BlendedDataset-train-dataset_index.npy") for f in cached), (name, cached)
    assert "[hetauto] rank 2 builds the dataset indices of cluster cluster-a" in logs["cluster-a.node0"]
    # cluster-b's launch gives node 0 mesh B's arguments and node 1 mesh C's
    assert "[hetauto] rank 4: pipeline 1, cluster cluster-b (cpu), mesh 2, stage 0" in logs["cluster-b.node0"]
    assert "[hetauto] rank 7: pipeline 1, cluster cluster-b (cpu), mesh 3, stage 1" in logs["cluster-b.node1"]
    # each rank's Megatron ran its own pipeline: depth, layout and its mesh's share of the batch; Megatron derives
    # the micro-batches as batch / (dp x mbs): 3 on pipeline 0, 2 on every mesh of pipeline 1 (A 4 / (2 x 1),
    # B 4 / (1 x 2), C 8 / (2 x 2))
    for la, layout, batch in zip(launches, ("Et*2|t*6L", "Et*4|t*4L", "Et*4|t*4L"), (6, 4, 4)):
        args = la["megatron_args"][str(la["meshes"][0])]
        assert args[args.index("--pipeline-model-parallel-layout") + 1] == layout
        assert f"global_batch_size={batch}" in logs[f"{la['name']}.node0"], logs[f"{la['name']}.node0"][-3000:]
    assert "global_batch_size=8" in logs["cluster-b.node1"]
    for name in ("cluster-c.node0", "reference"):     # Megatron's argument printout (global rank 0)
        assert re.search(r"^\s*rotary_base \.+ 500000$", logs[name], re.M), logs[name][-3000:]
    # evaluation reads a global batch of the validation / test set as training does, and logs the whole batch's
    het_val, ref_val = validation_losses(logs["cluster-b"]), validation_losses(logs["reference"])
    assert [w for w, _ in het_val] == [w for w, _ in ref_val] and len(ref_val) >= 3, (het_val, ref_val)
    diff = max(abs(a - b) for a, b in zip(het + [v for _, v in het_val], ref + [v for _, v in ref_val]))
    print(f"two pipelines: {het} {het_val}\nMegatron, one pipeline: {ref} {ref_val}\nmax |difference| {diff:.1e}")
    assert diff <= 1e-5, (het, ref, het_val, ref_val)
    # the global gradient norm counts every parameter once over both pipelines (Megatron prints 3 decimals); it is
    # above the clip of 0.5 the runs are given (on this blend it is 0.8-1.4, about Megatron's default of 1.0), so
    # clipping binds at every iteration and the equal losses depend on it
    het_norms, ref_norms = (re.findall(r"grad norm: ([0-9.]+) \|", logs[k]) for k in ("cluster-b", "reference"))
    assert het_norms == ref_norms and len(ref_norms) == NVIDIA_ITERS and min(map(float, ref_norms)) > 0.5, \
        (het_norms, ref_norms)
    # so does the parameter norm Megatron-LM logs with --log-params-norm (its own reduction spans the model-parallel
    # group, under --hetauto the world: it counted both pipelines and every DP replica); the two runs compute it
    # in other orders, to the printed 3 decimals
    het_params, ref_params = ([float(x) for x in re.findall(r"params norm: ([0-9.]+) \|", logs[k])]
                              for k in ("cluster-b", "reference"))
    assert len(het_params) == len(ref_params) == NVIDIA_ITERS and ref_params[0] > 1.0, (het_params, ref_params)
    assert all(abs(a - b) <= 2e-3 for a, b in zip(het_params, ref_params)), (het_params, ref_params)


# flag, value, words of the one-paragraph error
MISMATCHES = [
    ("--global-batch-size", "16", ["--global-batch-size 16", "global_batch_size", "8 + 6"]),
    # the plan's table is 128 x lcm(TP 1, 2) rows; divisor 1 would build the unpadded vocabulary
    ("--make-vocab-size-divisible-by", "1", ["--make-vocab-size-divisible-by 1", "rows", "drop the flag"]),
    # another layout than the plan's (it was replaced by the plan's without a word)
    ("--tensor-model-parallel-size", "8", ["--tensor-model-parallel-size 8 (plan: ", "another parallel layout"]),
    # a typed 1 where the plan has 2 stages (it was taken for Megatron's default of 1, and passed)
    ("--pipeline-model-parallel-size", "1", ["--pipeline-model-parallel-size 1 (plan: 2", "another parallel layout"]),
]


def test_a_launch_that_does_not_match_the_plan_exits_2(nvidia_script, tmp_path):
    """Each mismatch on rank 0 of cluster-b's launch, as the launch script's torchrun starts it (the script's own
    code in a child forked from this process: helpers.run_script_forked)."""
    from helpers import run_script_forked

    plan_file = two_pipeline_plan(tmp_path)
    plan = load_plan(plan_file)
    base = (emit_megatron(plan, plan_path=plan_file, devices_per_node=2)[0]["megatron_args"]["0"] +
            job_flags(plan, 1))
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", HETAUTO_WORLD_SIZE="6",
               HETAUTO_RANK_OFFSET="0", HETAUTO_CLUSTER="cluster-b", CUDA_DEVICE_MAX_CONNECTIONS="1")

    def run(case):
        flag, value, _ = case
        argv = list(base)
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
        return run_script_forked(nvidia_script, argv, env, os.path.dirname(nvidia_script))
    procs = [run(case) for case in MISMATCHES]
    for (flag, _, words), proc in zip(MISMATCHES, procs):
        assert proc.returncode == 2, (flag, proc.stderr[-3000:], proc.stdout[-3000:])
        errors = [line for line in proc.stderr.splitlines() if line.startswith("hetauto: error:")]
        assert len(errors) == 1 and "Traceback" not in proc.stderr, (flag, proc.stderr[-3000:])
        assert all(w in errors[0] for w in words), errors[0]


# ---- the pure parts: launches, per-rank arguments, samples (no processes) ------------------------------------

def alongside_plan():
    """Pipeline 0: a position of mesh a (TP 1, dp 2 x mbs 1) with mesh b alongside (TP 2, dp 1 x mbs 2), 4
    samples per step, then mesh c; pipeline 1: mesh d, 2 stages, also on cluster c. 8 + 4 samples."""
    from helpers import mesh

    from hetauto_megatron.plan.plan import plan_from_dict

    return plan_from_dict({
        "version": 3, "model": {"preset": "tiny"}, "global_batch_size": 12,
        "pipelines": [{"samples": 8}, {"samples": 4}],
        "meshes": [mesh("a", 1, 2, 1, [4]), dict(mesh("b", 2, 1, 2, [4]), alongside=True), mesh("c", 1, 2, 2, [4]),
                   dict(mesh("c", 1, 1, 2, [3, 5]), pipeline=1)]})


def test_emit_gives_each_pipeline_its_launches_depth_and_layout():
    plan = alongside_plan()
    # (2-device nodes: mesh 1 runs TP 2, whose group must sit inside a node; emit refuses 1-device nodes for it)
    launches = emit_megatron(plan, plan_path="p.yaml", devices_per_node=2)
    # cluster c runs meshes of both pipelines: one launch each, never one torchrun across two pipelines
    assert [(la["name"], la["pipeline"], la["meshes"], la["rank_offset"]) for la in launches] == \
        [("a", 0, [0], 0), ("b", 0, [1], 2), ("c.mesh2", 0, [2], 4), ("c.mesh3", 1, [3], 6)]
    assert {la["env"]["HETAUTO_WORLD_SIZE"] for la in launches} == {"8"}

    def arg(argv, flag):
        return argv[argv.index(flag) + 1] if flag in argv else None
    for la, pp, layout in zip(launches, ("2", "2", "2", "2"), ("Et*4|t*4L",) * 3 + ("Et*3|t*5L",)):
        argv = la["megatron_args"][str(la["meshes"][0])]
        assert (arg(argv, "--pipeline-model-parallel-size"), arg(argv, "--pipeline-model-parallel-layout")) == \
            (pp, layout)
        assert arg(argv, "--global-batch-size") == "12"        # the job's; the hook gives each mesh its share
    assert "# pipeline 1 of 2: 4 of the 12 samples of each global batch, 2 stage(s)" in launches[3]["script"]
    assert "# mesh 1 (alongside the mesh before it): pipeline stages 0-0" in launches[1]["script"]


def test_emit_cli_prints_and_writes_a_plan_of_two_pipelines(tmp_path, capsys):
    import json

    from hetauto_megatron.cli import main as cli

    assert cli(["emit", "megatron", "--plan", PLAN, "--devices-per-node", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == 8 and "pipeline_parallel_size" not in out
    assert out["pipelines"] == [{"samples": 6, "pipeline_parallel_size": 2}, {"samples": 8, "pipeline_parallel_size": 2}]
    assert cli(["emit", "megatron", "--plan", PLAN, "--devices-per-node", "2"]) == 0
    assert "# ===== cluster cluster-b (cluster-b.sh): pipeline 1, ranks 4-7, 2 x 2 =====" in capsys.readouterr().out
    assert cli(["emit", "megatron", "--plan", PLAN, "--devices-per-node", "2", "-o", str(tmp_path / "launch")]) == 0
    assert sorted(p.name for p in (tmp_path / "launch").iterdir() if p.suffix == ".sh") == ["cluster-a.sh",
                                                                                           "cluster-b.sh"]


def test_each_rank_gets_its_pipelines_depth_layout_and_its_meshs_share_of_the_batch():
    from hetauto_megatron.megatron import rewrite
    from hetauto_megatron.runtime.ranks import rank_coords

    plan = alongside_plan()
    seen = {}
    for rank in range(plan.world_size):
        c = rank_coords(plan, rank)
        o = rewrite.layout_overrides(plan, c)
        seen[c.mesh_index] = (o["pipeline_model_parallel_size"], o["pipeline_model_parallel_layout"],
                              o["global_batch_size"], o["micro_batch_size"],
                              rewrite.validation_world_size(plan, c))
    # pipeline 0: 2 micro-batch steps of 4 samples; mesh a trains 2 x 2 x 1, b 2 x 1 x 2, c 2 x 2 x 2;
    # Megatron derives micro-batches = batch / (dp x mbs) = 2 on every rank of pipeline 0, 2 on pipeline 1
    assert seen == {0: (2, "Et*4|t*4L", 4, 1, 4), 1: (2, "Et*4|t*4L", 4, 2, 4), 2: (2, "Et*4|t*4L", 8, 2, 4),
                    3: (2, "Et*3|t*5L", 4, 2, 2)}


def test_every_sample_of_the_global_batch_is_trained_once_per_iteration():
    from hetauto_megatron.megatron.plan_data import PlanSampler, micro_batch_indices
    from hetauto_megatron.runtime.ranks import rank_coords

    plan = alongside_plan()
    for iteration in range(3):
        seen = []
        for rank in range(plan.world_size):
            c = rank_coords(plan, rank)
            if c.tp_rank == 0 and c.stage_in_mesh == 0 and c.stage == 0:    # the ranks that read data first
                seen += [i for mb in micro_batch_indices(plan, c.mesh_index, c.dp_rank, iteration) for i in mb]
        assert sorted(seen) == list(range(iteration * 12, (iteration + 1) * 12))
    # pipeline 0's step holds samples 0-3 (mesh a: replicas 0 | 1; mesh b: 2-3), its second step 4-7; pipeline 1
    # trains 8-11; and a sampler resumed after one iteration (Megatron's consumed samples: the mesh's 4) goes on
    assert micro_batch_indices(plan, 0, 1, 0) == [[1], [5]]
    assert micro_batch_indices(plan, 1, 0, 0) == [[2, 3], [6, 7]]
    assert micro_batch_indices(plan, 3, 0, 1) == [[20, 21], [22, 23]]
    assert list(PlanSampler(36, 4, plan, 1, 0)) == [[14, 15], [18, 19], [26, 27], [30, 31]]


def test_sample_counted_schedules_and_shared_checkpoint_formats_are_refused_naming_the_flag():
    from types import SimpleNamespace

    import pytest

    from hetauto_megatron.errors import InputError
    from hetauto_megatron.megatron import rewrite

    plan = alongside_plan()
    for extra, flag in (({"train_samples": 1200}, "--train-samples"), ({"lr_warmup_samples": 10},
                        "--lr-warmup-samples"), ({"save": "/ckpt"}, "--ckpt-format"),
                        ({"global_batch_size": 16}, "global_batch_size"),
                        ({"calculate_per_token_loss": True}, "--calculate-per-token-loss"),
                        ({"eval_micro_batch_size": 1}, "--eval-micro-batch-size")):
        args = SimpleNamespace(**{"global_batch_size": None, **extra})
        with pytest.raises(InputError) as exc:
            rewrite.check_job_args(args, plan, file="p.yaml")
        assert exc.value.field == flag and exc.value.file == "p.yaml"
    rewrite.check_job_args(SimpleNamespace(global_batch_size=12, train_samples=None, save="/ckpt",
                                           ckpt_format="torch"), plan)


def test_every_mesh_stage_checkpoints_under_its_own_name():
    from hetauto_megatron.megatron.rewrite import checkpoint_stage
    from hetauto_megatron.runtime.ranks import rank_coords

    plan = alongside_plan()
    # mesh a (stage 0), b alongside it (stage 0), c (stage 1), then pipeline 1's mesh d (its stages 0 and 1)
    names = {(checkpoint_stage(plan, c), c.tp_rank) for c in map(lambda r: rank_coords(plan, r), range(8))
             if c.dp_rank == 0}
    assert sorted(names) == [(0, 0), (1, 0), (1, 1), (2, 0), (3, 0), (4, 0)]


def _rank_in_its_clusters_directory(rank, world_size, root, plan_file, argv, log_dir):
    """demo's forked rank, run in root/<its cluster>: a relative --save / --load is then its cluster's own, as on
    clusters that share no file system."""
    from hetauto_megatron.runtime.ranks import rank_coords

    where = os.path.join(root, rank_coords(load_plan(plan_file), rank).cluster)
    os.makedirs(where, exist_ok=True)
    os.chdir(where)
    return demo._rank_main(rank, world_size, demo.ENTRY_SCRIPT, argv, log_dir)


def test_two_pipelines_checkpoint_per_mesh_stage_and_resume_gives_the_uninterrupted_loss(tmp_path):
    """--ckpt-format torch under two pipelines (each with its stage 0): 3 iterations saving at the 2nd, then a run
    resumed from that checkpoint trains the 3rd: Megatron logs the uninterrupted run's loss. The plain optimizer,
    as in test_megatron_pretrain's checkpoint test (Megatron-Core 0.19 does not resume its distributed optimizer
    from the `torch` format on CPU). Our entry script on forked processes (cheaper than torchrun), each cluster's
    ranks in a directory of their own with a relative --save: as clusters that share no file system. Megatron's
    tracker file (which a --load without --ckpt-step reads) was rank 0's alone, so cluster-a's ranks started from
    random while cluster-b's loaded the checkpoint; each cluster's first rank now writes it, and the plan record."""
    import dataclasses

    import megatron.training.training  # noqa: F401  (imported once, before the fork: demo.run_entry does so too)

    from hetauto_megatron.runtime.launcher import launch

    plan = load_plan(two_pipeline_plan(tmp_path))
    plan = dataclasses.replace(plan, meshes=tuple(dataclasses.replace(
        m, setting_overrides={"distributed_optimizer": False, "overlap_param_gather": False}) for m in plan.meshes))
    plan_file = str(tmp_path / "plain.yaml")
    plan.save(plan_file)
    argv = demo.hetauto_argv(plan_file, plan, iters=3, seed=1234) + ["--ckpt-format", "torch"]
    argv[argv.index("--global-batch-size") + 1] = str(plan.global_batch_size)
    logs, steps = {}, {}
    for name, extra in (("whole", ["--save", "ckpt", "--save-interval", "2"]),
                        ("resumed", ["--load", "ckpt", "--ckpt-step", "2"]),
                        ("latest", ["--load", "ckpt"])):     # the tracker's iteration: 3, nothing left to train
        (tmp_path / name).mkdir()
        ranks = launch(_rank_in_its_clusters_directory, plan.world_size, timeout_s=300,
                       args=(str(tmp_path), plan_file, argv + extra, str(tmp_path / name)),
                       env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
        steps[name] = [r["losses"] for r in ranks]
        logs[name] = (tmp_path / name / f"rank{plan.world_size - 1}.log").read_text()
    assert steps["latest"] == [[]] * plan.world_size, steps["latest"]
    # pipeline 0 (TP 1, cluster-b): mesh stages 0, 1; pipeline 1 (TP 2, cluster-a): 2, 3 - no file shared between
    # the pipelines; each cluster holds its own shards, the plan record and the tracker
    for cluster, files in (("cluster-b", ["mp_rank_00_000", "mp_rank_00_001"]),
                           ("cluster-a", ["mp_rank_00_002", "mp_rank_00_003", "mp_rank_01_002", "mp_rank_01_003"])):
        saved = tmp_path / cluster / "ckpt"
        assert sorted(p.name for p in (saved / "iter_0000002").iterdir()) == sorted(files + ["hetauto-plan.json"])
        assert (saved / "latest_checkpointed_iteration.txt").read_text().strip() == "3", cluster
    ckpt = tmp_path / "cluster-a" / "ckpt"
    whole = dict(re.findall(r"iteration\s+(\d+)/\s*\d+ .*\| lm loss: ([0-9.E+-]+) \|", logs["whole"]))
    resumed = dict(re.findall(r"iteration\s+(\d+)/\s*\d+ .*\| lm loss: ([0-9.E+-]+) \|", logs["resumed"]))
    assert sorted(whole) == ["1", "2", "3"] and sorted(resumed) == ["3"], (whole, resumed)
    print(f"uninterrupted {whole['3']}, resumed {resumed['3']}")
    # the demo's per-step record is the whole batch's loss too (the --hetauto demo takes these plans); Megatron's
    # log line averages since the previous line in the first iterations, a complete interval is the step's loss
    assert len(steps["whole"][-1]) == 3 and abs(steps["whole"][-1][-1] - float(whole["3"])) <= 1e-6
    assert abs(steps["whole"][-1][0] - float(whole["1"])) <= 1e-6 and steps["resumed"][-1] == steps["whole"][-1][2:]
    assert abs(float(whole["3"]) - float(resumed["3"])) <= 1e-6
    # the save recorded the plan layout beside the checkpoint; resuming under a re-planned one (here: the pipelines'
    # shares of the batch split otherwise, which Megatron resumes silently at another data position) is refused
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.megatron.checkpoint_plan import check_resume, loaded_iteration, record_path
    # each saved iteration holds its record: the resumed one (--ckpt-step 2) and the last (the tracker's, 3)
    assert record_path(str(ckpt), loaded_iteration(str(ckpt), None)).endswith("iter_0000003/hetauto-plan.json")
    record = record_path(str(ckpt), loaded_iteration(str(ckpt), 2))
    assert os.path.isfile(record)
    check_resume(plan, record, file=plan_file)
    # the same layout with another micro-batch (no file nor counter depends on it) resumes
    check_resume(dataclasses.replace(plan, meshes=(dataclasses.replace(plan.meshes[0], micro_batch_size=1),
                                                   *plan.meshes[1:])), record)
    samples = plan.samples_per_pipeline
    resplit = dataclasses.replace(plan, pipeline_samples=(samples[0] // 2, samples[1] + samples[0] // 2))
    with pytest.raises(InputError) as exc:
        check_resume(resplit, record, file="replanned.yaml")
    assert exc.value.field == "--load" and "pipeline_samples" in str(exc.value) and plan_file in str(exc.value)
    check_resume(resplit, record, finetune=True)      # --finetune takes the weights only: their layout is the same
    moved = dataclasses.replace(plan, meshes=(dataclasses.replace(plan.meshes[0], stage_layers=(5, 3)),
                                              *plan.meshes[1:]))
    with pytest.raises(InputError, match="stage_layers"):
        check_resume(moved, record, finetune=True)
    # --pretrained-checkpoint: where --load holds no checkpoint, Megatron-LM loads that one as --finetune
    # (load_checkpoint, on its own checkpoint_exists); it was not checked against the plan
    from types import SimpleNamespace

    from megatron.training.checkpointing import checkpoint_exists

    from hetauto_megatron.megatron.checkpoint_plan import check_load
    empty = tmp_path / "no-checkpoint-yet"
    assert not checkpoint_exists(str(empty)) and checkpoint_exists(str(ckpt))
    for load in (None, str(empty)):
        given = SimpleNamespace(load=load, pretrained_checkpoint=str(ckpt), ckpt_step=2, finetune=False)
        check_load(resplit, given)                     # loaded as --finetune: the weights' layout is the same
        with pytest.raises(InputError, match="stage_layers") as exc:
            check_load(moved, given)
        assert exc.value.field == "--pretrained-checkpoint" and "without --pretrained-checkpoint" in exc.value.fix
    with pytest.raises(InputError) as exc:                  # --load holds one: Megatron loads it, not the other
        check_load(resplit, SimpleNamespace(load=str(ckpt), pretrained_checkpoint=str(empty), ckpt_step=2,
                                            finetune=False))
    assert exc.value.field == "--load"
