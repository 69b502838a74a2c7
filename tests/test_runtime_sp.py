"""Sequence parallelism and vocabulary padding in the dry run, on real Megatron-Core (CPU, gloo, forked ranks).

Sequence parallelism is on wherever the plan's settings say (plan/settings.py: every mesh with TP > 1 by
default), so the parity matrix (test_runtime_matrix.py) runs it: TP 2 -> 1 (SP on the sending side only),
TP 1 -> 2 (on the receiving side only), TP 2 -> 4 across clusters (both sides) then 4 -> 1 (SP to no SP), and
checks each mesh's `sequence_parallel` as Megatron built it. This file adds GPT-2's 50257-token vocabulary, which
every mesh pads to the plan's one size, with tied embeddings between a TP 2 mesh in one cluster and a TP 1 mesh
in the other, and the two pieces sequence parallelism needs on CPU: the norm, and gloo's tensor collectives.
"""
import pytest
from helpers import mesh
from test_runtime_matrix import CASES as MATRIX
from test_runtime_matrix import TINY, plan

from hetauto_megatron.runtime.dryrun import run_dryrun
from hetauto_megatron.runtime.train import CLIP_GRAD

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

GPT2_VOCAB = 50257


def test_the_matrix_runs_sequence_parallel_on_either_side_and_both():
    sp = {name: [m.settings.sequence_parallel for m in MATRIX[name].meshes]
          for name in ("tp2_to_tp1_uneven", "tp1_to_tp2", "three_meshes_tp2_4_1")}
    assert sp == {"tp2_to_tp1_uneven": [True, False], "tp1_to_tp2": [False, True],
                  "three_meshes_tp2_4_1": [True, True, False]}
    x, y = MATRIX["three_meshes_tp2_4_1"].meshes[:2]
    assert (x.tp, y.tp) == (2, 4) and x.cluster != y.cluster


def test_gpt2_vocabulary_padded_once_tied_across_tp2_and_tp1_clusters():
    from megatron.training.vocab_utils import calculate_padded_vocab_size

    model = {**TINY, "num_layers": 2, "vocab_size": GPT2_VOCAB, "tie_embeddings": True, "seq_length": 16,
             "max_position_embeddings": 16}
    p = plan([mesh("a", 2, 1, 2, [1]), mesh("b", 1, 2, 1, [1])], model=model)
    assert [m.settings.sequence_parallel for m in p.meshes] == [True, False]
    # Megatron alone pads 50257 to 50432 rows at TP 2 and 50304 at TP 1: two tables that cannot be summed row for
    # row. The plan pads once, to Megatron's TP 2 size, which TP 1's multiple also divides.
    megatron = {tp: calculate_padded_vocab_size(GPT2_VOCAB, 128, tp, logging_enabled=False) for tp in (1, 2)}
    assert megatron == {1: 50304, 2: 50432}
    assert p.padded_vocab_size == 50432

    r = run_dryrun(p, steps=3, seed=7, tiny=False, reference=True, timeout_s=90)
    assert "error" not in r, r.get("error")
    assert r["padded_vocab_size"] == 50432 and r["model"]["vocab_size"] == GPT2_VOCAB
    assert r["max_abs_diff"] <= 1e-5, r
    losses = [s["loss"] for s in r["steps"]]
    # clipping binds at every step here too (the reference norm exceeds the clip)
    assert len(set(losses)) == 3 and all(s["grad_norm"] > CLIP_GRAD for s in r["reference"]), r["reference"]
    assert [s["sequence_parallel"] for s in r["settings"]] == [True, False]


def test_norm_marks_its_parameters_for_sequence_parallelism():
    import torch
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_config import TransformerConfig

    from hetauto_megatron.runtime.norm import SequenceParallelTorchNorm

    def config(sp, norm):
        return TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, tensor_model_parallel_size=2,
                                 sequence_parallel=sp, normalization=norm, use_cpu_initialization=True,
                                 persist_layer_norm=False)

    # what Megatron's own local norm does with sequence parallelism (the reason this norm exists); Megatron's own
    # class, even when an earlier test of the session ran megatron/cpu.py, which makes it build ours
    from hetauto_megatron.runtime import norm as N
    patched = WrappedTorchNorm.__dict__["__new__"]
    if "wrapped" in N._ORIGINAL_NEW:
        WrappedTorchNorm.__new__ = staticmethod(N._ORIGINAL_NEW["wrapped"])
    try:
        with pytest.raises(AssertionError, match="sequence parallel not supported"):
            WrappedTorchNorm(config=config(True, "LayerNorm"), hidden_size=8)
    finally:
        WrappedTorchNorm.__new__ = patched
    for norm, cls in (("LayerNorm", torch.nn.LayerNorm), ("RMSNorm", torch.nn.RMSNorm)):
        built = SequenceParallelTorchNorm(config=config(True, norm), hidden_size=8, eps=1e-5)
        plain = WrappedTorchNorm(config=config(False, norm), hidden_size=8, eps=1e-5)
        assert type(built) is cls is type(plain) and built.eps == plain.eps == 1e-5
        assert [p.sequence_parallel for p in built.parameters()] == [True] * len(list(plain.parameters()))
        off = SequenceParallelTorchNorm(config=config(False, norm), hidden_size=8)
        assert not any(p.sequence_parallel for p in off.parameters())


def _gloo_tensor_collectives(rank, world_size):
    """Megatron's sequence-parallel collectives on gloo against the list-based ones, on the same data."""
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(rank)
    x = torch.randn(6, 3, 5, generator=g)
    out = torch.empty(6 * world_size, 3, 5)
    dist.all_gather_into_tensor(out, x)
    parts = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(parts, x)
    y = torch.randn(8 * world_size, 3, 5, generator=g)
    mine = torch.empty(8, 3, 5)
    dist.reduce_scatter_tensor(mine, y)
    summed = y.clone()
    dist.all_reduce(summed)
    dist.destroy_process_group()
    return {"gather": torch.equal(out, torch.cat(parts)), "scatter": torch.equal(mine, summed.chunk(world_size)[rank])}


def test_gloo_runs_megatrons_sequence_parallel_collectives_exactly():
    """The device layer redirects nothing here because torch 2.13's gloo implements all_gather_into_tensor and
    reduce_scatter_tensor; this pins that fact, bit for bit against all_gather + cat and all_reduce + own chunk."""
    from hetauto_megatron.runtime.launcher import launch

    assert launch(_with_gloo, 4, args=(_gloo_tensor_collectives,), timeout_s=120) == [
        {"gather": True, "scatter": True}] * 4


def _with_gloo(rank, world_size, fn):
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return fn(rank, world_size)


def test_a_sequence_tp_does_not_divide_is_refused_before_any_process_starts():
    """Megatron's scatter into the sequence-parallel region splits the sequence evenly or stops inside every rank:
    such a plan is refused where it is read (exit 2), before a dry run or a launch."""
    from hetauto_megatron.errors import InputError
    from hetauto_megatron.runtime.dryrun import prepare_plan

    model = {**TINY, "num_attention_heads": 8, "num_query_groups": 4, "seq_length": 30, "max_position_embeddings": 30}
    with pytest.raises(InputError, match="multiple of tp") as err:
        plan([mesh("a", 4, 1, 2, [4]), mesh("b", 1, 1, 2, [4])], model=model)
    assert err.value.field == "meshes[0].settings.sequence_parallel"
    # the mesh's override turns sequence parallelism off; --tiny rounds its sequence to a multiple of every TP
    off = plan([{**mesh("a", 4, 1, 2, [4]), "settings": {"sequence_parallel": False}}, mesh("b", 1, 1, 2, [4])],
               model=model)
    assert prepare_plan(off, tiny=False).model.seq_length == 30
    three = plan([mesh("a", 3, 1, 2, [4]), mesh("b", 1, 1, 2, [4])],
                 model={**TINY, "hidden_size": 96, "num_attention_heads": 6, "num_query_groups": 3,
                        "ffn_hidden_size": 192, "seq_length": 30, "max_position_embeddings": 30})
    assert prepare_plan(three, tiny=True).model.seq_length == 18
