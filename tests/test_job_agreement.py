"""Every cluster's launch must run the same job (megatron/job_agreement.py): two real processes joined through the
world store, the second launched with another --train-iters (and --lr), as a cluster whose job arguments were typed
differently. Before: nothing compared them; the clusters trained together until the shorter one finished, then each
side waited HETAUTO_TIMEOUT_S in a pipeline receive or Megatron's closing barrier and stopped with exit 1 and a gloo
traceback. Now every rank stops at once with one paragraph naming the flags and each cluster's value (exit 2)."""
from test_world_store import _joined_ranks  # one process per rank, joined through the world store

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
    tails = ["\n".join([
        "",
        "import argparse, sys",
        "from hetauto_megatron.megatron.job_agreement import check_same_job",
        "from hetauto_megatron.plan.plan import load_plan",
        f"plan = load_plan({plan_file!r})",
        f"args = argparse.Namespace(train_iters={iters}, eval_interval=1000, eval_iters=0, lr={lr}, "
        "clip_grad=1.0, save_interval=None)",
        "try:",
        "    check_same_job(args, plan, dist.get_rank(), dist.get_world_size(), file='plan.yaml')",
        "except InputError as exc:",
        "    _exit_for_user(exc)",
        "print('agreed', file=sys.stderr, flush=True)",
        # both ranks leave together: rank 0 hosts the store, and a rank whose store went first aborts at exit
        "dist.barrier()",
        "dist.destroy_process_group()"]) for iters, lr in values]
    return _joined_ranks(tails, timeout=timeout)


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
