"""DeepSpeed's own pipeline engine runs an emitted config: `deepspeed.initialize` with the package's
PipelineModule on the plan's uneven partition (`hetauto.partition`), 4 CPU processes over gloo, ZeRO-1 over
DP 2 with overlap_comm (the plan's distributed optimizer and gradient-reduce overlap), gradient clipping.

Its losses must equal a single-process run of the same model written in plain torch (the same layers and
per-layer seeds, the whole global batch in one pass, torch's Adam and clip_grad_norm_), within 1e-5. Two
models cover the helper's layers: the LLaMA-style tiny preset (RoPE, SwiGLU, RMSNorm, GQA, separate output
layer) and a GPT-2-style variant (learned positions, GELU, LayerNorm, embeddings tied across the two stages).
"""
import json

import pytest
from helpers import mesh

from hetauto_megatron.emit.deepspeed import emit_deepspeed, stage_partition, unsupported_features
from hetauto_megatron.plan.plan import plan_from_dict

STEPS, LR, DATA_SEED = 3, 1e-2, 7
# One vendor (cpu), TP 1 and DP 2 and micro-batch 1 everywhere, 5 + 3 layers, full recomputation in the
# second cluster: DeepSpeed can express it (its gap: the uneven split, which is what hetauto.partition carries).
PLAN = {"version": 2, "model": {"preset": "tiny"}, "global_batch_size": 8,
        "meshes": [mesh("a", 1, 2, 1, [5]), mesh("b", 1, 2, 1, [3], "full")]}
MODELS = {"llama-style": {"preset": "tiny"},
          "gpt2-style-tied": {"preset": "tiny", "tie_embeddings": True, "position_embedding": "learned",
                              "gated_mlp": False}}


def _indices(step, micro, dp_rank, dp, mbs, gbs):
    """The samples of one micro-batch of one DP rank: together the step's global batch, each sample once."""
    start = step * gbs + (micro * dp + dp_rank) * mbs
    return list(range(start, start + mbs))


def _rank(rank, world_size, model, configs):
    import torch.distributed as dist

    from hetauto_megatron.runtime import deepspeed_pipeline as dsp

    deepspeed = dsp.import_deepspeed()
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = dsp.config_for_rank(configs, rank)
    engine = dsp.initialize(model, cfg, lr=LR)
    dp, mbs, gas = cfg["hetauto"]["data_parallel_size"], cfg["train_micro_batch_size_per_gpu"], \
        cfg["gradient_accumulation_steps"]
    dp_rank = engine.grid.get_data_parallel_rank()

    def batches():
        for step in range(STEPS):
            for micro in range(gas):
                yield dsp.synthetic_batch(model, _indices(step, micro, dp_rank, dp, mbs, cfg["train_batch_size"]),
                                          seed=DATA_SEED)

    it = batches()
    losses = [float(engine.train_batch(data_iter=it)) for _ in range(STEPS)]
    out = {"losses": losses, "parts": list(engine.module.parts), "stage": engine.stage_id,
           "local": [engine.module._local_start, engine.module._local_stop],
           "zero_stage": engine.zero_optimization_stage(), "overlap_comm": bool(engine.zero_overlap_comm()),
           "checkpoint_interval": engine.module.activation_checkpoint_interval,
           "engine": type(engine).__name__}
    dist.barrier()
    dist.destroy_process_group()
    return out


def _single_process_losses(model, gbs):
    import torch

    from hetauto_megatron.runtime.deepspeed_pipeline import lm_loss, reference_layers, synthetic_batch

    layers = reference_layers(model)
    params = list({id(p): p for layer in layers if isinstance(layer, torch.nn.Module)
                   for p in layer.parameters()}.values())
    opt = torch.optim.Adam(params, lr=LR)
    losses = []
    for step in range(STEPS):
        tokens, labels = synthetic_batch(model, range(step * gbs, (step + 1) * gbs), seed=DATA_SEED)
        x = tokens
        for layer in layers:
            x = layer(x)
        loss = lm_loss(x, labels)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.fixture(scope="module", params=sorted(MODELS))
def pipeline_run(request, tmp_path_factory):
    from hetauto_megatron.runtime.deepspeed_pipeline import import_deepspeed
    from hetauto_megatron.runtime.launcher import free_port, launch

    plan = plan_from_dict(dict(PLAN, model=MODELS[request.param]))
    out = tmp_path_factory.mktemp("ds")
    configs = []
    for r in emit_deepspeed(plan):      # validated by DeepSpeed's parser; each cluster reads its own file
        path = out / f"ds_config.{r['name']}.json"
        path.write_text(json.dumps(r["config"]))
        configs.append(json.loads(path.read_text()))
    import_deepspeed()                  # once, before the ranks are forked
    results = launch(_rank, plan.world_size, args=(plan.model, configs), timeout_s=300,
                     env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    return plan, configs, results


def test_plan_is_one_deepspeed_can_express():
    plan = plan_from_dict(PLAN)
    gaps = unsupported_features(plan)
    assert any("uneven layer split" in g for g in gaps)
    assert not any(w in g for g in gaps for w in ("tensor-parallel", "data-parallel", "micro-batch", "vendor"))


def test_deepspeed_pipeline_engine_matches_single_process(pipeline_run):
    plan, configs, results = pipeline_run
    partition = stage_partition(plan.stage_layers)
    assert partition == [0, 6, 10]                       # DeepSpeed's 'uniform' would give [0, 5, 10]
    for rank, r in enumerate(results):
        assert r["engine"] == "PipelineEngine"
        assert r["parts"] == partition, r
        assert r["local"] == partition[r["stage"]:r["stage"] + 2]
        # the plan's settings table reached the engine: distributed optimizer -> ZeRO-1, overlap -> overlap_comm
        m = plan.meshes[0 if rank < 2 else 1]
        settings = m.settings
        assert r["checkpoint_interval"] == (1 if m.recompute == "full" else 0)
        assert r["zero_stage"] == (1 if settings.distributed_optimizer else 0)
        assert r["overlap_comm"] == settings.overlap_grad_reduce
    reference = _single_process_losses(plan.model, plan.global_batch_size)
    for r in results:
        assert len(r["losses"]) == STEPS
        diff = max(abs(a - b) for a, b in zip(r["losses"], reference))
        assert diff <= 1e-5, (r["losses"], reference)
    assert abs(reference[-1] - reference[0]) > 1e-3, reference   # the updates moved the loss well past 1e-5
