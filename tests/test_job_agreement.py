"""Every cluster's launch must run the same job (megatron/job_agreement.py): two real processes joined through the
world store, the second launched with another --train-iters (and --lr), as a cluster whose job arguments were typed
differently. Before: nothing compared them; the clusters trained together until the shorter one finished, then each
side waited HETAUTO_TIMEOUT_S in a pipeline receive or Megatron's closing barrier and stopped with exit 1 and a gloo
traceback. Now every rank stops at once with one paragraph naming the flags and each cluster's value (exit 2)."""
import os
import subprocess
import sys
import time

from hetauto_megatron.runtime.launcher import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def _ranks(tmp_path, values: list, timeout: float = 60) -> list:
    plan_file = str(tmp_path / "plan.yaml")
    with open(plan_file, "w") as fh:
        fh.write(PLAN_YAML)
    port, world = free_port(), len(values)
    procs = []
    start = time.monotonic()
    for rank, (iters, lr) in enumerate(values):
        code = "\n".join([
            "import argparse, datetime",
            "import torch.distributed as dist",
            "from hetauto_megatron.errors import InputError",
            "from hetauto_megatron.megatron import world_store as w",
            "from hetauto_megatron.megatron.script_guard import exit_for_user as _exit_for_user",
            "from hetauto_megatron.megatron.job_agreement import check_same_job",
            "from hetauto_megatron.plan.plan import load_plan",
            f"plan = load_plan({plan_file!r})",
            f"store = w.join({rank}, {world}, '127.0.0.1', {port}, 60.0)",
            f"dist.init_process_group('gloo', rank={rank}, world_size={world}, store=store, "
            "timeout=datetime.timedelta(seconds=120))",
            f"args = argparse.Namespace(train_iters={iters}, eval_interval=1000, eval_iters=0, lr={lr}, "
            "clip_grad=1.0, save_interval=None)",
            "try:",
            "    check_same_job(args, plan, dist.get_rank(), dist.get_world_size(), file='plan.yaml')",
            "except InputError as exc:",
            "    _exit_for_user(exc)",
            "print('agreed', flush=True)",
            # both ranks leave together: rank 0 hosts the store, and a rank whose store went first aborts at exit
            "dist.barrier()",
            "dist.destroy_process_group()"])
        procs.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=dict(os.environ, HETAUTO_CLUSTER=["cluster-a", "cluster-b"][rank])))
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            out.append((p.returncode, o + e, time.monotonic() - start))
    finally:
        for p in procs:
            p.kill()
    return out


def test_clusters_launched_with_other_job_arguments_stop_at_once_naming_them(tmp_path):
    values = [(4, 1e-3), (6, 3e-4)]        # cluster-b typed --train-iters 6 --lr 3e-4
    for rank, (code, out, seconds) in enumerate(_ranks(tmp_path, values)):
        assert code == 2 and seconds < 45 and "Traceback" not in out, (rank, out)
        assert "different job arguments" in out, out
        assert "--train-iters: 4 on rank 0 (cluster cluster-a, stage 0), 6 on rank 1 (cluster cluster-b, stage 1)" \
            in out, out
        assert "--lr: 0.001 on rank 0" in out and "0.0003 on rank 1" in out, out


def test_the_same_job_arguments_pass(tmp_path):
    for rank, (code, out, _) in enumerate(_ranks(tmp_path, [(4, 1e-3)] * 2)):
        assert code == 0 and "agreed" in out, (rank, out)
