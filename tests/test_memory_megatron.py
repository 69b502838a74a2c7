"""The memory model's weights, gradient buffer and optimizer state against Megatron-Core's own allocations.

One pipeline stage (the whole model: embedding, 2 layers, output head) is built as the dry run builds it
(runtime/model.py: Megatron-Core's GPTModel with the local layer spec) on 2 CPU processes forming one DP group,
wrapped in Megatron-Core's DistributedDataParallel and optimizer with the mesh's runtime settings
(runtime/train.py: ddp_settings), once per case: fp32 (what CPU dry runs train in) and bf16 mixed precision,
with and without the distributed optimizer, gradients reduced in fp32 or in bf16. One optimizer step
materialises Adam's moments. The bytes are then read from the real tensors (runtime/memory_meter.py, as the dry run
reads them):
    weights    the DP buffer's param_data (distributed optimizer), else the parameters themselves
    gradients  the DP buffer's grad_data (every parameter's main_grad)
    optimizer  every tensor the optimizer holds that is not a view of those buffers or of the parameters:
               fp32 master shards, Adam's exp_avg / exp_avg_sq, fp32 copies of bf16 gradients
and compared with cost/memory.stage_memory_bytes for the same stage (padded vocabulary, DP 2). Megatron pads
each parameter's start to 64 elements and each bucket's end to a DP-divisible size, which the model does not
price: the tolerance is 2 % (measured below 0.5 % here).
"""
import pytest

from hetauto_megatron.cost.memory import stage_memory_bytes
from hetauto_megatron.plan.plan import Mesh, Plan
from hetauto_megatron.runtime.launcher import launch
from hetauto_megatron.spec.model import ModelSpec

MODEL = ModelSpec(name="pin", num_layers=2, hidden_size=128, num_attention_heads=4, num_query_groups=2,
                  ffn_hidden_size=512, vocab_size=1000, seq_length=16)
CASES = [  # (precision, setting overrides)
    ("fp32", {}),
    ("bf16", {}),
    ("bf16", {"grad_reduce_dtype": "param"}),
    ("bf16", {"distributed_optimizer": False, "overlap_param_gather": False}),
]
TOLERANCE = 0.02


def _plan(overrides) -> Plan:
    return Plan(MODEL, 2, (Mesh("c", "cpu", 1, 2, 1, "none", (2,), overrides),))


def _measure(rank, world_size):
    """Per case: bytes of weights, gradient buffer and optimizer state this rank holds."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from hetauto_megatron.runtime.groups import build_groups, init_distributed, set_megatron_globals
    from hetauto_megatron.runtime.memory_meter import state_storages
    from hetauto_megatron.runtime.model import build_model, transformer_config
    from hetauto_megatron.runtime.train import ddp_settings

    plan0 = _plan({})
    init_distributed(plan0, rank, world_size, timeout_s=60, dry_run=True)
    out = []
    for precision, overrides in CASES:
        plan = _plan(overrides)
        ctx = build_groups(plan, rank, world_size, timeout_s=60, dry_run=True)
        set_megatron_globals(ctx)
        config = transformer_config(plan, ctx, MODEL)
        bf16 = precision == "bf16"
        if bf16:
            config.params_dtype = config.pipeline_dtype = torch.bfloat16
            config.bf16 = True
        model = build_model(ctx, MODEL, config, seed=1)
        settings = plan.meshes[0].settings
        ddp = DistributedDataParallel(config=config, module=model, pg_collection=ctx.pg,
                                      ddp_config=DistributedDataParallelConfig(**ddp_settings(settings)))
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, bf16=bf16,
                                                     params_dtype=config.params_dtype,
                                                     use_distributed_optimizer=settings.distributed_optimizer),
                                     [ddp], pg_collection=ctx.pg, use_gloo_process_groups=False)
        for buf in ddp.buffers:        # some gradient, so that Adam allocates its moments on the step
            buf.grad_data.fill_(1e-3)
        opt.step()
        held = state_storages(model, ddp, opt)     # what the dry run's memory meter reads from the tensors
        out.append({k: held[k] for k in ("weights", "gradients", "optimizer")})
    return out


@pytest.fixture(scope="module")
def measured():
    return launch(_measure, 2, timeout_s=240)


def test_weights_gradients_and_optimizer_state_match_megatron(measured):
    for i, (precision, overrides) in enumerate(CASES):
        plan = _plan(overrides)
        settings = plan.meshes[0].settings
        model = MODEL.replace(vocab_size=plan.padded_vocab_size)      # what runs: 1000 -> 1024
        want = stage_memory_bytes(model, layers=2, tp=1, dp=2, micro_batch_size=1, recompute="none", in_flight=1,
                                  first=True, last=True, settings=settings, vendor="cpu",
                                  dtype_bytes=4 if precision == "fp32" else 2)
        for rank, got in enumerate(measured):
            for part in ("weights", "gradients", "optimizer"):
                have = got[i][part]
                assert have == pytest.approx(want[part], rel=TOLERANCE), \
                    (precision, overrides, rank, part, have, want[part])
    # the distributed optimizer shards the state over the 2 DP ranks: bf16 keeps 12 bytes per parameter / 2
    assert measured[0][1]["optimizer"] < 0.55 * measured[0][3]["optimizer"]
