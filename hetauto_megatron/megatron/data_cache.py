"""Megatron-LM's dataset index cache on every cluster of the job.

Megatron-Core draws each dataset's document, sample and shuffle indices once and keeps them in a cache directory
(--data-cache-path, else a directory under each prefix's path: PREFIX/cache/GPTDataset_indices): global rank 0 builds them and writes the
files while the other ranks wait, then every rank that reads data loads them from the same path
(core/datasets/blended_megatron_dataset_builder.py build_generic_dataset, gpt_dataset.py
_build_document_sample_shuffle_indices, blended_dataset.py). That assumes one file system for the whole job. Clusters
in other sites rarely share one: a rank that reads data on another cluster finds no cache at that path and stops
with a FileNotFoundError once the model is built.

Under --hetauto, before Megatron's own build, the first rank that reads data on each cluster but rank 0's builds
the datasets once on its own, as Megatron does in a process without torch.distributed: it writes the cache on its
cluster's file system where it is missing and only loads it where it is there. One cluster at a time, so that
clusters which do share a file system never write the same files at once. Megatron's own build then finds the
cache on every cluster. The indices are a function of the data, the seed and the sample counts only, so each
cluster's copy is rank 0's (tests/test_megatron_pipelines.py trains on real data this way and matches Megatron's
own run). Inside a cluster Megatron's assumption stays: the machines of one cluster share the cache directory.
"""
from __future__ import annotations

import contextlib

from ..plan.plan import Plan
from ..runtime.ranks import rank_coords


def cache_builders(plan: Plan) -> list[tuple[str, int]]:
    """(cluster, rank) for each cluster but global rank 0's, in the plan's order, whose ranks read data: its lowest
    such rank. A rank reads data where pretrain_gpt.py's is_dataset_built_on_rank says so: tensor-parallel rank 0 of
    its pipeline's first or last stage."""
    first_cluster = rank_coords(plan, 0).cluster
    builders: dict[str, int] = {}
    for rank in range(plan.world_size):
        c = rank_coords(plan, rank)
        reads = c.tp_rank == 0 and c.stage in (0, plan.pipeline_stages(c.pipeline) - 1)
        if reads and c.cluster != first_cluster and c.cluster not in builders:
            builders[c.cluster] = rank
    return list(builders.items())


@contextlib.contextmanager
def _alone():
    """Megatron-Core's dataset code as in a process without torch.distributed: it builds every split itself and
    writes the cache where it is missing (gpt_dataset.py: `not torch.distributed.is_initialized() or rank 0`)."""
    import torch.distributed as dist
    saved = dist.is_initialized
    dist.is_initialized = lambda: False
    try:
        yield
    finally:
        dist.is_initialized = saved


def build_cache_on_each_cluster(build, build_args: tuple, build_kwargs: dict, args, plan: Plan, rank: int) -> None:
    """Megatron's `build` (build_train_valid_test_datasets) once on each cluster's cache builder, a cluster at a
    time, every rank waiting at the world's barrier after each (module docstring). Nothing to do for mock data (no
    files), a plan on one cluster, or --dataloader-fast-cache-load (the user vouches the cache is everywhere)."""
    if getattr(args, "mock_data", False) or getattr(args, "dataloader_fast_cache_load", False):
        return
    import torch.distributed as dist
    for cluster, builder in cache_builders(plan):
        if rank == builder:
            print(f"[hetauto] rank {rank} builds the dataset indices of cluster {cluster} (its cache, where its file "
                  "system lacks it)", flush=True)
            with _alone():
                build(*build_args, **build_kwargs)
        dist.barrier()
