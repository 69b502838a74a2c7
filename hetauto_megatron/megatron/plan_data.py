"""Megatron-LM's training data and logged loss under a plan of several pipelines (or meshes side by side).

Megatron-LM runs one pipeline per process: under --hetauto each rank's --global-batch-size is the samples its
mesh trains per iteration (rewrite.mesh_batch_size), so Megatron's own sampler would start every pipeline at
sample 0 and its logged loss would be the last pipeline's alone. Here, as in the dry run (runtime/train.py):

- iteration i trains the global batch [i x B, (i + 1) x B) of the dataset (B = the plan's global batch), pipeline
  p the samples after those of pipelines < p, its micro-batch m the m-th step of those, and a replica the samples
  `Plan.sample_range` gives it inside each step. So the job trains exactly the samples a single pipeline of the
  same global batch trains, and every sample once (`PlanSampler` replaces Megatron's sampler, for training and
  for evaluation: an evaluation iteration reads a global batch of the validation or test set the same way);
- the datasets are sized for the plan's global batch, not a mesh's share;
- the losses Megatron logs (training and validation) are the whole batch's: each mesh at a pipeline's last stage
  contributes its mean loss (Megatron's reduction over its own DP group) weighted by its share of the global
  batch (RankContext.batch_share, the weight of its gradients in replica_sync.py), summed over all ranks.

Checkpoints (`--ckpt-format torch`): each mesh stage's DP rank 0 writes its own file, named by TP rank and the
mesh stage's index over the plan (rewrite.checkpoint_stage), since every pipeline has a stage 0. Every holder of
a parameter holds the same values after each step, so each resumes from its own file; the samples resume from
Megatron's consumed-samples count (the mesh's own, converted back to iterations by PlanSampler).

`micro_batch_indices` is pure; the rest is a thin layer over megatron.training.
"""
from __future__ import annotations

import functools
import inspect

from ..plan.layout import mesh_layout
from .rewrite import checkpoint_stage, mesh_batch_size


def micro_batch_indices(plan, mesh_index: int, dp_rank: int, iteration: int) -> list[list[int]]:
    """Dataset indices of one replica's micro-batches in one iteration (module doc), in schedule order."""
    mesh = plan.meshes[mesh_index]
    layout = mesh_layout(plan, mesh_index)
    start, stop = plan.sample_range(mesh_index, dp_rank)
    base = iteration * plan.global_batch_size + sum(plan.samples_per_pipeline[:mesh.pipeline])
    return [list(range(base + m * layout.step + start, base + m * layout.step + stop))
            for m in range(layout.num_micro_batches)]


class PlanSampler:
    """A batch sampler with the interface of Megatron's MegatronPretrainingSampler: yields this replica's
    micro-batches (lists of dataset indices), iteration after iteration, from Megatron's consumed samples on."""

    def __init__(self, total_samples: int, consumed_samples: int, plan, mesh_index: int, dp_rank: int):
        self.total_samples, self.plan, self.mesh_index, self.dp_rank = total_samples, plan, mesh_index, dp_rank
        # Megatron counts the mesh's own samples (its --global-batch-size per iteration)
        self.first_iteration = consumed_samples // mesh_batch_size(plan, mesh_index)

    def __len__(self) -> int:
        return self.total_samples

    def __iter__(self):
        iteration = self.first_iteration
        while True:
            batches = micro_batch_indices(self.plan, self.mesh_index, self.dp_rank, iteration)
            if batches[-1][-1] >= self.total_samples:
                return
            yield from batches
            iteration += 1


def install_plan_batches(state) -> None:
    """Replace Megatron-LM's training sampler, its training-set size and its logged loss (module doc)."""
    import megatron.training.training as training

    if getattr(training.build_pretraining_data_loader, "_hetauto", False):
        return
    plan, coords = state.plan, state.placement
    original_loader = training.build_pretraining_data_loader
    original_sizes = training.get_train_valid_test_num_samples
    original_step = training.train_step
    original_evaluate = training.evaluate

    @functools.wraps(original_sizes)
    def get_train_valid_test_num_samples():
        from megatron.training import get_args

        args = get_args()
        # Megatron sizes the datasets by its (the mesh's) batch: give it the job's while it counts
        mesh_batch = (args.global_batch_size, args.eval_global_batch_size)
        args.global_batch_size = args.eval_global_batch_size = plan.global_batch_size
        try:
            return original_sizes()
        finally:
            args.global_batch_size, args.eval_global_batch_size = mesh_batch

    @functools.wraps(original_loader)
    def build_pretraining_data_loader(dataset, consumed_samples):
        from megatron.core.datasets.utils import Split
        from megatron.training import get_args

        split = getattr(dataset, "index_split", getattr(dataset, "split", None))
        if dataset is None or split not in (Split.train, Split.valid, Split.test):
            return original_loader(dataset, consumed_samples)
        import torch

        sampler = PlanSampler(len(dataset), consumed_samples, plan, coords.mesh_index, coords.dp_rank)
        return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=get_args().num_workers,
                                           pin_memory=True, persistent_workers=get_args().num_workers > 0)

    @functools.wraps(original_step)
    def train_step(*args, **kwargs):
        out = original_step(*args, **kwargs)
        return (whole_batch_losses(state, out[0]),) + tuple(out[1:])

    @functools.wraps(original_evaluate)
    def evaluate(*args, **kwargs):
        losses, *rest = original_evaluate(*args, **kwargs)
        whole = whole_batch_losses(state, losses or {})     # collective: every rank, every evaluation
        return (whole if losses is not None else None, *rest)

    import megatron.training.checkpointing as checkpointing

    original_name = checkpointing.get_checkpoint_name
    signature = inspect.signature(original_name)
    stage = checkpoint_stage(plan, coords)

    @functools.wraps(original_name)
    def get_checkpoint_name(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if bound.arguments.get("pipeline_rank") is None:     # this rank's own file (Megatron fills in its ranks)
            bound.arguments["pipeline_rank"], bound.arguments["pipeline_parallel"] = stage, True
        return original_name(*bound.args, **bound.kwargs)

    checkpointing.get_checkpoint_name = get_checkpoint_name
    for fn in (get_train_valid_test_num_samples, build_pretraining_data_loader, train_step, evaluate):
        fn._hetauto = True
    training.get_train_valid_test_num_samples = get_train_valid_test_num_samples
    training.build_pretraining_data_loader = build_pretraining_data_loader
    training.train_step = train_step
    training.evaluate = evaluate


def whole_batch_losses(state, loss_dict: dict) -> dict:
    """The global batch's losses from every mesh at a pipeline's last stage (module doc); collective over all
    ranks. Returns `loss_dict` with its values replaced (empty on ranks Megatron gives none)."""
    import torch
    import torch.distributed as dist

    ctx, c = state.context, state.placement
    mine = {}
    if loss_dict and ctx.is_last_stage and c.tp_rank == 0 and c.dp_rank == 0:
        mine = {k: float(v) * ctx.batch_share for k, v in loss_dict.items()}
    every = [None] * dist.get_world_size(ctx.world_gloo)
    dist.all_gather_object(every, mine, group=ctx.world_gloo)
    total: dict = {}
    for part in every:
        for k, v in part.items():
            total[k] = total.get(k, 0.0) + v
    out = {}
    for k, v in loss_dict.items():
        out[k] = torch.tensor(total[k], dtype=v.dtype, device=v.device) if torch.is_tensor(v) else total[k]
    return out
