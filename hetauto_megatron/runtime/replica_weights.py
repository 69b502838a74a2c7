"""Every holder of a parameter starts from its first holder's values: the holders' exchange run once on weights.

Apart from replica_sync.py, which sums gradients every step, because this runs once before training and only
where a runtime builds each stage with its own seeds (Megatron-LM's --hetauto hook, megatron/training_seams.py).
"""
from __future__ import annotations

from .replica_records import unwrap_chunk
from .replica_sync import ReplicaSync
from .shard_regions import table_shape


class ReplicaWeights(ReplicaSync):
    """Every holder's parameters set to their first holder's values, once, before training: the scatter phase and
    the copies inside each mesh stage (`scatter_back`, `fill_copies`) run on parameter values instead of
    gradients. A runtime that builds each stage with its own seeds needs it: Megatron-LM seeds each stage by its
    pipeline rank, so two pipelines with different stage splits (or meshes of different TP side by side at a
    stage) would start from different weights (the dry run needs none of it: it draws every copy by global name).
    The tied output layers are holders of the embedding table, so they get the first stage's embeddings too.
    Collective over `ctx.replica_group` (construction and `copy`); `counter` receives the bytes sent."""

    PAIRWISE = False    # the scatter phase alone, for two holders as for more
    ROTATE = False      # of the first holder's weights

    def __init__(self, ctx, model_chunks, *, counter: dict | None = None):
        # the modules inside DDP: every rank's interval is its whole local tensor (no distributed-optimizer shard)
        super().__init__(ctx, [unwrap_chunk(c) for c in model_chunks], weight=1.0, counter=counter)

    def _tables(self, model_chunks) -> dict:
        """name -> this rank's parameter values as its 2-D table (a view of the parameter)."""
        return {gname: param.data.view(table_shape(param.shape)) for gname, param in self._shared(model_chunks)}

    def copy(self, model_chunks) -> None:
        tables = self._tables(model_chunks)
        self.scatter_back(tables, "receive the first holder's weights of a parameter")
        self.fill_copies(tables)
