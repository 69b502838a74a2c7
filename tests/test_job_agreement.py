"""Every cluster's launch must run the same job (megatron/job_agreement.py): two real processes joined through the
world store, the second launched with another --train-iters (and --lr, --seed and data blend), as a cluster whose
job arguments were typed differently. Before: nothing compared them; the clusters trained together until the shorter one finished, then each
side waited HETAUTO_TIMEOUT_S in a pipeline receive or Megatron's closing barrier and stopped with exit 1 and a gloo
traceback. Now every rank stops at once with one paragraph naming the flags and each cluster's value (exit 2)."""
import re

import pytest

from test_world_store import _joined_ranks  # one process per rank, joined through the world store

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

# two one-rank clusters, one stage each
PLAN_YAML = """\
version: 1
model: {name: tiny, num_layers: 4, hidden_size: 64, num_attention_heads: 4, ffn_hidden_size: 256, vocab_size: 128,
  seq_length: 32, num_query_groups: 2, gated_mlp: true, tie_embeddings: false, position_embedding: rope,
  max_position_embeddings: 32}
global_batch_size: 4
meshes:
- {cluster: cluster-a, device_type: cpu, tp: 1, dp: 1, micro_batch_size: 1, recompute: none, stage_layers: [2]}
- {cluster: cluster-b, device_type: cpu, tp: 1, dp: 1, micro_batch_size: 1, recompute: none, stage_layers: [2]}
"""


def _ranks(tmp_path, values: list, timeout: float = 60, env=None, more: list | None = None) -> list:
    """One rank per entry of `values`, (--train-iters, --lr, --seed, --data-path[, seconds it waits for the others:
    600 where left out]), each checking the plan and the job as the hook does once the world is joined; `more`: for
    each rank, other Megatron arguments (name: value)."""
    plan_file = str(tmp_path / "plan.yaml")
    with open(plan_file, "w") as fh:
        fh.write(PLAN_YAML)
    tails = ["\n".join([
        "",
        "import argparse, sys",
        "from hetauto_megatron.megatron.job_agreement import check_same_job",
        "from hetauto_megatron.runtime.rendezvous import check_same_plan",
        f"plan = load_plan({plan_file!r})",
        f"args = argparse.Namespace(train_iters={iters}, eval_interval=1000, eval_iters=0, lr={lr}, "
        f"clip_grad=1.0, save_interval=None, seed={seed}, mock_data=False, split='99,1,0', data_path={blend!r}, "
        f"**{(more or [{}] * len(values))[rank]!r})",
        # as the hook runs them: the plan (and the code) when the world is joined, then the job
        "check_same_plan(plan, dist.get_rank(), dist.get_world_size(), file='plan.yaml')",
        f"check_same_job(args, plan, dist.get_rank(), dist.get_world_size(), file='plan.yaml', timeout_s={wait})",
        "print('agreed', file=sys.stderr, flush=True)",
        "dist.barrier()"]) for rank, (iters, lr, seed, blend, wait) in
        enumerate(v + (600.0,) * (5 - len(v)) for v in values)]
    return _joined_ranks(tails, env=env, timeout=timeout, plan_file=plan_file)


def test_clusters_launched_with_other_job_arguments_stop_at_once_naming_them(tmp_path):
    # cluster-b typed --train-iters 6 --lr 3e-4 --seed 7 and another blend's weights, and waits an hour for the others
    # (--distributed-timeout-minutes 60, or HETAUTO_TIMEOUT_S=3600: the hook gives each rank's seconds)
    values = [(4, 1e-3, 1234, ["30", "/data/a", "70", "/data/b"]),
              (6, 3e-4, 7, ["50", "/mnt/a", "50", "/mnt/b"], 3600.0)]
    for rank, (code, out, seconds) in enumerate(_ranks(tmp_path, values)):
        assert code == 2 and seconds < 45 and "Traceback" not in out, (rank, out)
        assert "different job arguments" in out, out
        assert "--train-iters: 4 on rank 0 (cluster cluster-a, stage 0), 6 on rank 1 (cluster cluster-b, stage 1)" \
            in out, out
        assert "--lr: 0.001 on rank 0" in out and "0.0003 on rank 1" in out, out
        assert "--seed: 1234 on rank 0" in out and "7 on rank 1" in out, out
        assert "--data-path: 2 prefixes weighted [30.0, 70.0] on rank 0" in out and "[50.0, 50.0] on rank 1" in out
        assert ("--distributed-timeout-minutes: 600 s on rank 0 (cluster cluster-a, stage 0), 3600 s on rank 1 "
                "(cluster cluster-b, stage 1)") in out, out


def test_a_cluster_running_other_hetauto_code_stops_every_rank_naming_it(tmp_path):
    """Cluster-b's machines run a copy of hetauto-megatron with one file edited (the same version number), as a
    cluster whose install was not updated with the others': here the edit renames a key of the world store's
    rendezvous, as a release that changed its protocol would. Before: the world's join compared the code
    (runtime/rendezvous.py check_same_plan), but a rendezvous that differs never got there: each side waited for
    the other to check in until the timeout (60 s here), then stopped with a timeout that named no code. Now each
    rank compares its code with the host's before anything else of the rendezvous (megatron/world_store.py): cluster-b's
    rank stops at once with one paragraph naming the code each cluster runs, and its refusal stops rank 0."""
    import os
    import shutil

    import hetauto_megatron

    copy = tmp_path / "other-install"
    shutil.copytree(os.path.dirname(hetauto_megatron.__file__), copy / "hetauto_megatron",
                    ignore=shutil.ignore_patterns("__pycache__"))
    store_py = copy / "hetauto_megatron" / "megatron" / "world_store.py"
    text = store_py.read_text()
    assert '\nJOINED = "hetauto/joined"' in text
    store_py.write_text(text.replace('\nJOINED = "hetauto/joined"', '\nJOINED = "hetauto/checked-in"'))
    values = [(4, 1e-3, 1234, ["/data/a"]), (6, 1e-3, 1234, ["/data/a"])]
    other = {"PYTHONPATH": str(copy), "PYTHONSAFEPATH": "1"}     # the copy, not this checkout (the current folder)
    ours = hetauto_megatron.code_digest()[:12]
    for rank, (code, out, seconds) in enumerate(_ranks(tmp_path, values, env=[{}, other])):
        assert code == 2 and seconds < 45 and "Traceback" not in out, (rank, seconds, out)
        assert "field 'hetauto-megatron'" in out and "--train-iters" not in out, out
        # the paragraph is cluster-b's rank's; rank 0 stops on its refusal (its launch's HETAUTO_CLUSTER here: cluster-1)
        found = re.search(r"the clusters run different hetauto-megatron code, which every rank must share \(this "
                          r"process is rank 1\): code (\w+) on rank 0 \(cluster cluster-a, stage 0\), (\w+) "
                          r"on rank 1 \(cluster cluster-b, stage 1\)\.", out)
        assert found and found.group(1) == ours != found.group(2), out
        assert "hetauto --version" in out, out
        assert rank == 1 or "cluster cluster-1 refused the job" in out, out


def test_without_the_world_store_the_worlds_join_compares_the_code(tmp_path):
    """A world made without the world store (one torchrun over several clusters' nodes, HETAUTO_MASTER_ADDR unset)
    has no rendezvous of ours to compare the code at: the world's join (check_same_plan) compares it, in the same
    words, and each rank stops with them. Cluster-b's copy differs by a comment only."""
    import os
    import shutil
    import subprocess
    import sys

    import hetauto_megatron

    from hetauto_megatron.runtime.launcher import free_port

    copy = tmp_path / "other-install"
    shutil.copytree(os.path.dirname(hetauto_megatron.__file__), copy / "hetauto_megatron",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "hetauto_megatron" / "runtime" / "communicator.py", "a") as fh:
        fh.write("\n# an edit made on cluster-b's machines only\n")
    plan_file = str(tmp_path / "plan.yaml")
    with open(plan_file, "w") as fh:
        fh.write(PLAN_YAML)
    port = free_port()
    # each rank ends as under the patched script with --hetauto: the hook in charge of its exit before the world
    # joins (hook.pretrain_kwargs), main_guard turning the refusal into its paragraph and exit 2
    code = ("import datetime, torch.distributed as dist\n"
            "from hetauto_megatron.megatron import hook\n"
            "from hetauto_megatron.megatron.script_guard import main_guard\n"
            "from hetauto_megatron.plan.plan import load_plan\n"
            "from hetauto_megatron.runtime.rendezvous import check_same_plan\n"
            "def main():\n"
            f"    dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{port}', rank={{rank}}, world_size=2, "
            "timeout=datetime.timedelta(seconds=60))\n"
            f"    check_same_plan(load_plan({plan_file!r}), {{rank}}, 2, file='plan.yaml')\n"
            "hook._take_charge_of_exit(60.0)\n"
            "main_guard(main)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETAUTO_")}
    procs = [subprocess.Popen([sys.executable, "-c", code.format(rank=r)], stderr=subprocess.PIPE, text=True,
                              env=dict(env, **extra)) for r, extra in
             enumerate([{}, {"PYTHONPATH": str(copy), "PYTHONSAFEPATH": "1"}])]
    ours = hetauto_megatron.code_digest()[:12]
    try:
        for rank, p in enumerate(procs):
            _, out = p.communicate(timeout=60)
            assert p.returncode == 2 and "Traceback" not in out, (rank, out)
            found = re.search(rf"the clusters run different hetauto-megatron code, which every rank must share \(this "
                              rf"process is rank {rank}\): code (\w+) on rank 0 \(cluster cluster-a, stage 0\), "
                              r"(\w+) on rank 1 \(cluster cluster-b, stage 1\)\.", out)
            assert found and found.group(1) == ours != found.group(2), out
    finally:
        for p in procs:
            p.kill()


def test_a_cluster_running_another_megatron_core_stops_every_rank_naming_it(tmp_path):
    """Cluster-b's machines run a copy of Megatron-Core whose release says 0.19.1 (a cluster installed with another
    patch release, which the hook's own version check lets through). Before: nothing compared them. Now every rank
    stops at once with one paragraph naming each cluster's release, before the job arguments (they differ too)."""
    import os
    import shutil

    import megatron.core
    from megatron.core.package_info import __version__

    copy = tmp_path / "other-megatron"
    shutil.copytree(os.path.dirname(os.path.dirname(megatron.core.__file__)), copy / "megatron",
                    ignore=shutil.ignore_patterns("__pycache__"))
    info = copy / "megatron" / "core" / "package_info.py"
    text = info.read_text()
    assert "\nPATCH = 2\n" in text and __version__ == "0.19.2"
    info.write_text(text.replace("\nPATCH = 2\n", "\nPATCH = 1\n"))
    values = [(4, 1e-3, 1234, ["/data/a"]), (6, 1e-3, 1234, ["/data/a"])]
    other = {"PYTHONPATH": str(copy), "PYTHONSAFEPATH": "1"}
    for rank, (code, out, seconds) in enumerate(_ranks(tmp_path, values, env=[{}, other])):
        assert code == 2 and seconds < 45 and "Traceback" not in out, (rank, out)
        assert (f"the clusters run different software, which every rank must share (this process is rank {rank}): "
                "megatron-core: 0.19.2 on rank 0 (cluster cluster-a, stage 0), 0.19.1 on rank 1 (cluster cluster-b, "
                "stage 1)") in out, out
        assert "--train-iters" not in out and "pip show megatron-core" in out, out


def test_flags_that_add_collectives_over_the_world_on_one_cluster_only_stop_at_once_naming_them(tmp_path):
    """Flags that add a collective over the world to iterations, typed on cluster-b only: before, the clusters agreed
    and trained until the collective, then waited HETAUTO_TIMEOUT_S and stopped with exit 4 naming the collective,
    not the flag (--log-params-norm, --exit-signal-handler), or one cluster trained to the end while the other
    stopped in a timer's barrier (--log-interval). Now every rank stops at once naming each flag (exit 2)."""
    values = [(4, 1e-3, 1234, ["/data/a"])] * 2
    more = [dict(log_interval=100, log_params_norm=False, exit_signal_handler=False, rerun_mode="validate_results"),
            dict(log_interval=2, log_params_norm=True, exit_signal_handler=True, rerun_mode="disabled")]
    for rank, (code, out, seconds) in enumerate(_ranks(tmp_path, values, more=more)):
        assert code == 2 and seconds < 45 and "Traceback" not in out, (rank, out)
        assert "field '--log-interval'" in out and "--log-interval: 100 on rank 0 (cluster cluster-a, stage 0), 2 on " \
            "rank 1 (cluster cluster-b, stage 1)" in out, out
        for flag in ("--log-params-norm: False on rank 0", "--exit-signal-handler: False on rank 0",
                     "--rerun-mode: 'validate_results' on rank 0"):
            assert flag in out, out


def test_the_collective_flags_compared_are_megatrons_and_include_every_unpriced_one():
    """Every name compared is one of Megatron-LM's arguments (a misspelt one would be left out without a word:
    job_values reads the names the namespace has), and every flag the launch notes as adding a collective over
    the world to each iteration (unpriced.PER_ITERATION_WORLD) is compared."""
    import argparse

    from megatron.training.arguments import add_megatron_arguments

    from hetauto_megatron.megatron.job_agreement import COLLECTIVE_ARGS, JOB_ARGS
    from hetauto_megatron.megatron.unpriced import PER_ITERATION_WORLD
    dests = {action.dest for action in add_megatron_arguments(argparse.ArgumentParser())._actions}
    assert set(COLLECTIVE_ARGS) <= dests, set(COLLECTIVE_ARGS) - dests
    assert {dest for dest, *_ in PER_ITERATION_WORLD} <= set(JOB_ARGS)


def test_the_same_job_arguments_pass(tmp_path):
    # each machine's own paths to the same blend
    same = [(4, 1e-3, 1234, ["30", f"/{root}/a", "70", f"/{root}/b"]) for root in ("data", "mnt")]
    # (18 s on a loaded machine: a wait of 120 s leaves room for a CI runner twice as slow; nothing here waits out
    # a timeout, the ranks agree)
    for rank, (code, out, _) in enumerate(_ranks(tmp_path, same, timeout=120)):
        assert code == 0 and "agreed" in out, (rank, out)


def test_the_blend_compared_is_megatrons_reading_of_data_path():
    """The number of prefixes and their weights job_agreement compares are what Megatron-Core's own
    get_blend_from_list reads from the same --data-path."""
    from megatron.core.datasets.utils import get_blend_from_list

    from hetauto_megatron.megatron.job_agreement import blend_of
    for data_path in (["a"], ["a", "b"], ["0.3", "a", "0.7", "b"], ["1", "a"], ["a", "b", "c"], ["30", "a", "b", "c"],
                      ["1e-1", "/x/a", "9e-1", "/x/b"]):
        prefixes, weights = get_blend_from_list(list(data_path))
        assert blend_of(data_path) == (len(prefixes), weights), data_path


def test_the_checkpoint_compared_is_the_one_megatron_loads(tmp_path):
    """A cluster whose --load holds no checkpoint (its copy left out) beside one that resumes started from random
    weights at iteration 0 while the other resumed: different iterations, as with another --train-iters. What each
    rank resumes from is compared (not the paths), chosen as Megatron-LM chooses it: --load's checkpoint where its
    tracker is (checkpoint_exists, read_metadata), its --ckpt-step without one, else --pretrained-checkpoint's."""
    from types import SimpleNamespace

    from megatron.training.checkpointing import checkpoint_exists, read_metadata

    from hetauto_megatron.megatron.checkpoint_plan import TRACKER
    from hetauto_megatron.megatron.job_agreement import differences, job_values, loaded_checkpoint
    import yaml

    from hetauto_megatron.plan.plan import plan_from_dict
    a, b, pretrained = (tmp_path / name for name in ("a", "b", "pretrained"))
    for directory, iteration in ((a, "3"), (pretrained, "5")):
        directory.mkdir()
        (directory / TRACKER).write_text(iteration + "\n")
    b.mkdir()

    def launch(**given):
        return SimpleNamespace(**{"load": None, "ckpt_step": None, "pretrained_checkpoint": None, **given})

    assert checkpoint_exists(str(a)) and read_metadata(str(a / TRACKER)) == (3, False)
    assert not checkpoint_exists(str(b))
    assert loaded_checkpoint(launch(load=str(a))) == "iteration 3 of --load"
    assert loaded_checkpoint(launch(load=str(b))) == loaded_checkpoint(launch()) == "no checkpoint"
    assert loaded_checkpoint(launch(load=str(b), ckpt_step=2)) == "iteration 2 of --load"
    assert loaded_checkpoint(launch(load=str(b), pretrained_checkpoint=str(pretrained))) == \
        "iteration 5 of --pretrained-checkpoint"
    assert loaded_checkpoint(launch(load=str(a), pretrained_checkpoint=str(pretrained))) == "iteration 3 of --load"
    plan = plan_from_dict(yaml.safe_load(PLAN_YAML))
    assert differences(plan, [job_values(launch(load=str(a))), job_values(launch(load=str(b)))]) == [
        "--load: iteration 3 of --load on rank 0 (cluster cluster-a, stage 0), no checkpoint on rank 1 "
        "(cluster cluster-b, stage 1)"]
    assert differences(plan, [job_values(launch(load=str(a))), job_values(launch(load=str(a / "..") + "/a"))]) == []
