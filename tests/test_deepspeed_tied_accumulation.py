"""An fp16 plan with the distributed optimizer and embeddings tied across two stages, emitted for DeepSpeed, keeps
the table's two copies equal: the pipeline engine's ReduceTiedGrads sums `weight.grad` (pipe/engine.py:281-285),
and DeepSpeedZeroOptimizer, which ZeRO-1 builds for fp16, moves each gradient into a `grad_accum` attribute and sets
`.grad` to None whenever the accumulation type differs from the weights' (zero/stage_1_and_2.py:397-404, :1234-1240),
so with fp32 accumulation (what the configs wrote before) the sum never ran and the copies drifted apart (2e-2
after one step here). The configs now accumulate and reduce fp16 in fp16 (engines.py, `as_run_by`).

DeepSpeed refuses fp16 on CPU, so each emitted config runs as its CPU twin on the same code path: bf16 for fp16, and
an accumulation type that differs from the weights' exactly where the fp16 config's does (fp16 for fp32; bf16 with
fp32 accumulation would build the BF16 optimizer instead). The run checks that DeepSpeed built the ZeRO optimizer and
that its `use_grad_accum_attribute` is what DeepSpeed's rule gives for the fp16 config as emitted.
"""
import copy

import pytest
from helpers import mesh

from hetauto_megatron.emit.deepspeed import emit_deepspeed, unsupported_features
from hetauto_megatron.plan.plan import plan_from_dict

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

MODEL = {"preset": "tiny", "tie_embeddings": True, "position_embedding": "learned", "gated_mlp": False,
         "vocab_size": 256}
PLAN = {"version": 2, "model": MODEL, "global_batch_size": 4, "precision": "fp16",
        "meshes": [mesh("a", 1, 1, 1, [4], device="a100"), mesh("b", 1, 1, 1, [4], device="a100")]}
_TWIN = {"fp16": "bf16", "fp32": "fp16"}     # fp16 config -> CPU twin, the weights' type and the accumulation's


def cpu_twin(cfg: dict) -> dict:
    """The emitted fp16 config as DeepSpeed runs it on CPU through the same optimizer (module docstring)."""
    assert cfg["fp16"]["enabled"] and cfg["zero_optimization"]["stage"] == 1, cfg
    twin = copy.deepcopy(cfg)
    twin["fp16"] = {"enabled": False}
    twin["bf16"] = {"enabled": True}
    twin["data_types"] = {"grad_accum_dtype": _TWIN[cfg["data_types"]["grad_accum_dtype"]]}
    twin["communication_data_type"] = {"fp16": "bf16"}.get(cfg["communication_data_type"],
                                                           cfg["communication_data_type"])
    return twin


def _rank(rank, world_size, model, configs):
    import torch
    import torch.distributed as dist

    from hetauto_megatron.runtime import deepspeed_pipeline as dsp

    deepspeed = dsp.import_deepspeed()
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = dsp.config_for_rank(configs, rank)
    engine = dsp.initialize(model, cpu_twin(cfg), lr=1e-2)

    def batches():
        i = 0
        while True:
            yield dsp.synthetic_batch(model, [i])
            i += 1
    it = batches()
    before = [p for n, p in engine.module.named_parameters() if "word" in n][0].detach().float().clone()
    engine.train_batch(data_iter=it)
    table = [p for n, p in engine.module.named_parameters() if "word" in n][0].detach().float()
    copies = [torch.zeros_like(table) for _ in range(world_size)]
    dist.all_gather(copies, table)
    out = {"optimizer": type(engine.optimizer).__name__,
           "grad_accum_attribute": bool(getattr(engine.optimizer, "use_grad_accum_attribute", False)),
           "difference": (copies[0] - copies[1]).abs().max().item(),
           "moved": (table - before).abs().max().item()}
    dist.destroy_process_group()
    return out


def test_fp16_zero1_tied_copies_stay_equal_as_emitted():
    from hetauto_megatron.runtime.deepspeed_pipeline import import_deepspeed
    from hetauto_megatron.runtime.launcher import free_port, launch

    plan = plan_from_dict(PLAN)
    configs = [r["config"] for r in emit_deepspeed(plan)]
    # DeepSpeed's own rule (stage_1_and_2.py:397-404) for the fp16 config as emitted
    emitted_separate = [c["data_types"]["grad_accum_dtype"] != "fp16" for c in configs]
    import_deepspeed()
    results = launch(_rank, plan.world_size, args=(plan.model, configs), timeout_s=300,
                     env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    for r, separate in zip(results, emitted_separate):
        assert r["optimizer"] == "DeepSpeedZeroOptimizer", r
        assert r["grad_accum_attribute"] == separate, r
        assert r["moved"] > 1e-4, r          # the step updated the table
        assert r["difference"] == 0.0, r     # and both stages' copies alike
    # the plan asked for fp32 reduction: the gap is said
    assert any("tied-weight reduction" in line for line in unsupported_features(plan))
