"""The memory model's weights, gradient buffer and optimizer state against Megatron-Core's own allocations.

One pipeline stage (the whole model: embedding, 2 layers, output head) is built as the dry run builds it
(runtime/model.py: Megatron-Core's GPTModel with the local layer spec) on 2 CPU processes forming one DP group,
wrapped in Megatron-Core's DistributedDataParallel and optimizer with the mesh's runtime settings
(runtime/train.py: ddp_settings), once per case: fp32 (what CPU dry runs train in) and bf16 mixed precision,
with and without the distributed optimizer, gradients reduced in fp32 or in bf16, and a GPT-family model of odd
widths (linear biases, LayerNorm with shifts, learned positions, tied table: 48-element vectors). One optimizer step
materialises Adam's moments. The bytes are read from the real tensors (runtime/memory_meter.py, as the dry run
reads them) when the step returns and again after zero_grad, where the next step's forward starts (Megatron-LM's
train_step zeroes the gradient buffer and the optimizer's gradients before its forward):
    weights    the DP buffer's param_data (distributed optimizer), else the parameters themselves
    gradients  the DP buffer's grad_data (every parameter's main_grad)
    optimizer  every tensor the optimizer holds that is not a view of those buffers or of the parameters:
               fp32 master shards, Adam's exp_avg / exp_avg_sq and, at the step only, the fp32 copies of bf16
               gradients it steps on (with a bf16 gradient buffer)
and compared with cost/memory.stage_memory_bytes for the same stage (padded vocabulary, DP 2): exact to the byte,
the weights and the gradient buffer on each rank and the optimizer's shard on the busier one. With the distributed
optimizer Megatron starts every parameter on a 64-element boundary and pads every bucket's end to a multiple of
lcm(DP, 128) (cost/ddp_buffer.py); before that padding was priced the odd-width model held 0.30 % more weights and
gradients than predicted and its busier rank 0.21 % more optimizer state (its ranks' shards differ by 0.4 %); the
width-128 model, whose tensors are multiples of 64 and whose buffer ends on a multiple of 128, was exact already.
`test_the_buffer_layout_is_megatrons` checks the layout itself against Megatron-Core's layout code where a real
stage is too large to build: buckets cut mid-layer, a tied table of several stages in a bucket of its own.
"""
import itertools

import pytest

from hetauto_megatron.cost.memory import stage_memory_bytes, stage_params
from hetauto_megatron.plan.plan import Mesh, Plan
from hetauto_megatron.runtime.launcher import launch
from hetauto_megatron.spec.model import ModelSpec

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)

MODEL = ModelSpec(name="pin", num_layers=2, hidden_size=128, num_attention_heads=4, num_query_groups=2,
                  ffn_hidden_size=512, vocab_size=1000, seq_length=16)
GPT_ODD = ModelSpec(name="gpt-odd", num_layers=2, hidden_size=48, num_attention_heads=4, num_query_groups=4,
                    ffn_hidden_size=192, vocab_size=1000, seq_length=16, gated_mlp=False, tie_embeddings=True,
                    position_embedding="learned")
CASES = [  # (model, precision, setting overrides)
    (MODEL, "fp32", {}),
    (MODEL, "bf16", {}),
    (MODEL, "bf16", {"grad_reduce_dtype": "param"}),
    (MODEL, "bf16", {"distributed_optimizer": False, "overlap_param_gather": False}),
    (GPT_ODD, "fp32", {}),
    (GPT_ODD, "bf16", {"grad_reduce_dtype": "param"}),
]


def _plan(model, overrides) -> Plan:
    return Plan(model, 2, (Mesh("c", "cpu", 1, 2, 1, "none", (2,), overrides),))


def _measure(rank, world_size):
    """Per case: bytes of weights, gradient buffer and optimizer state this rank holds."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from hetauto_megatron.runtime.groups import build_groups, set_megatron_globals
    from hetauto_megatron.runtime.memory_meter import state_storages
    from hetauto_megatron.runtime.model import build_model, transformer_config
    from hetauto_megatron.runtime.rendezvous import init_distributed
    from hetauto_megatron.runtime.train import ddp_settings

    plan0 = _plan(MODEL, {})
    init_distributed(plan0, rank, world_size, timeout_s=60, dry_run=True)
    out = []
    for spec, precision, overrides in CASES:
        plan = _plan(spec, overrides)
        ctx = build_groups(plan, rank, world_size, timeout_s=60, dry_run=True)
        set_megatron_globals(ctx)
        config = transformer_config(plan, ctx, spec)
        bf16 = precision == "bf16"
        if bf16:
            config.params_dtype = config.pipeline_dtype = torch.bfloat16
            config.bf16 = True
        model = build_model(ctx, spec, config, seed=1)
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
        at_step = state_storages(model, ddp, opt)     # what the dry run's memory meter reads from the tensors
        ddp.zero_grad_buffer()                        # what train_step runs before the next step's forward
        opt.zero_grad()
        held = state_storages(model, ddp, opt)
        out.append({k: held[k] for k in ("weights", "gradients", "optimizer")}
                   | {"at_step": {k: at_step[k] for k in ("weights", "gradients", "optimizer")}})
    layouts = [_megatron_layout(sizes, *case[4:]) for case, sizes in _layout_cases()] if rank == 0 else []
    return {"state": out, "layouts": layouts}


@pytest.fixture(scope="module")
def measured():
    return launch(_measure, 2, timeout_s=240)


def test_weights_gradients_and_optimizer_state_match_megatron(measured):
    for i, (spec, precision, overrides) in enumerate(CASES):
        plan = _plan(spec, overrides)
        settings = plan.meshes[0].settings
        model = spec.replace(vocab_size=plan.padded_vocab_size)      # what runs: 1000 -> 1024
        want = stage_memory_bytes(model, layers=2, tp=1, dp=2, micro_batch_size=1, recompute="none", in_flight=1,
                                  first=True, last=True, settings=settings, vendor="cpu",
                                  dtype_bytes=4 if precision == "fp32" else 2)
        case = (spec.name, precision, overrides)
        for rank, got in enumerate(measured):
            for part in ("weights", "gradients"):
                assert got["state"][i][part] == want[part], (case, rank, part, got["state"][i][part], want[part])
        # the ranks' pieces of the buffer hold different amounts of its padding: the busier one is priced
        held = [got["state"][i]["optimizer"] for got in measured]
        assert max(held) == want["optimizer"], (case, held, want["optimizer"])
    # the distributed optimizer shards the state over the 2 DP ranks: bf16 keeps 12 bytes per parameter / 2
    assert measured[0]["state"][1]["optimizer"] < 0.55 * measured[0]["state"][3]["optimizer"]


def test_the_steps_fp32_gradient_copies_are_the_steps_set_not_held_with_the_activations(measured):
    """With a bf16 gradient buffer Megatron-Core's optimizer steps on fp32 copies of the gradients (4 bytes per
    element of its shard), which zero_grad frees before the next forward: the model prices them in the state at the
    step (`state_at_step`, a candidate for the peak of its own, once the activations are gone), not in the state
    held beside the activations. Priced as held before: LLaMA-2-7B's 8-layer middle stage with 4 micro-batches in
    flight at 49.2 GiB where it holds 43.2."""
    copies = 0
    for i, (spec, precision, overrides) in enumerate(CASES):
        plan = _plan(spec, overrides)
        model = spec.replace(vocab_size=plan.padded_vocab_size)
        want = stage_memory_bytes(model, layers=2, tp=1, dp=2, micro_batch_size=1, recompute="none", in_flight=1,
                                  first=True, last=True, settings=plan.meshes[0].settings, vendor="cpu",
                                  dtype_bytes=4 if precision == "fp32" else 2)
        case = (spec.name, precision, overrides)
        # the busier rank's, as priced (its optimizer shard holds more of the buffer's padding)
        busiest = max(measured, key=lambda got: got["state"][i]["optimizer"])["state"][i]
        step_set = sum(busiest["at_step"].values())
        assert step_set == want["state_at_step"], (case, busiest, want["state_at_step"])
        extra = busiest["at_step"]["optimizer"] - busiest["optimizer"]     # what the step holds and zero_grad frees
        copies += extra > 0
        assert want["weights_grads_optimizer"] == sum(busiest[k] for k in ("weights", "gradients", "optimizer"))
        assert want["state_at_step"] - want["weights_grads_optimizer"] == extra, (case, extra)
        # the peak: state + activations, or the step's set when it holds more (no gradient reduction here)
        assert want["total"] - want["reserved"] == pytest.approx(
            max(want["weights_grads_optimizer"] + want["activations"], step_set), rel=1e-12), case
    assert copies == 2        # the two cases with a bf16 gradient buffer and the distributed optimizer


def _layout_cases():
    """((model, TP, first, last, DP, bucket size), its parameters in named_parameters order) of the stages
    test_the_buffer_layout_is_megatrons checks: 3 layers of 3 models, TP 1 and 2, each position in the pipeline."""
    from hetauto_megatron.cost.ddp_buffer import stage_tensors

    for h, gated, tie in ((48, False, True), (32, True, False), (64, True, True)):
        model = ModelSpec(name="x", num_layers=4, hidden_size=h, num_attention_heads=4, num_query_groups=2,
                          ffn_hidden_size=4 * h, vocab_size=256, seq_length=16, gated_mlp=gated, tie_embeddings=tie,
                          position_embedding="rope" if gated else "learned")
        for tp, (first, last), dp, bucket in itertools.product(
                (1, 2), ((True, True), (True, False), (False, True), (False, False)), (1, 3, 8), (None, 2000)):
            pre, layer, post = stage_tensors(model, tp, first, last)
            yield (model, tp, first, last, dp, bucket), pre + layer * 3 + post


def _megatron_layout(sizes, dp: int, bucket_size):
    """(padded elements, buckets, the busiest DP rank's parameter elements) of Megatron-Core's own layout of
    parameters of `sizes` ((elements, tied table of several stages), in named_parameters order): the distributed
    optimizer's layout and the ranges its shards take (_build_model_gbuf_param_range_map)."""
    import types

    import torch
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer, Range

    params = []
    for n, shared in sizes:
        p = torch.nn.Parameter(torch.empty(n, device="meta"))
        if shared:
            p.shared_embedding = True        # what LanguageModule sets on such a table
        params.append(p)
    layout = DistributedOptimizer._compute_per_buffer_param_layout(
        params, bucket_size, dp, types.SimpleNamespace(pad_buckets_for_high_nccl_busbw=False))
    owned = [0] * dp
    for b, (start, end) in enumerate(layout.bucket_indices):
        piece = (end - start) // dp
        in_bucket = {p: v for p, v in layout.param_index_map.items() if v[2] == b}
        for r in range(dp):
            ranges = DistributedOptimizer._build_model_gbuf_param_range_map(
                in_bucket, Range(start + r * piece, start + (r + 1) * piece), start)
            owned[r] += sum(v["param"].size for v in ranges.values())
    return layout.bucket_indices[-1][1], len(layout.bucket_indices), max(owned)


def test_the_buffer_layout_is_megatrons(measured):
    """cost/ddp_buffer.py's layout of stages against Megatron-Core's layout code over parameters of the same sizes
    (run on the ranks above), where real stages would be too large to build: buckets of 2,000 elements (cut
    mid-layer, as 40M cuts a real first stage), a tied table of several stages (the first stage's, the last
    stage's copy: a bucket of its own), odd widths (32- and 48-element vectors), DP 1, 3 and 8. Padded size,
    bucket count and the busiest DP rank's shard must be equal."""
    from hetauto_megatron.cost.ddp_buffer import _busiest_shard, buffer_layout, padded_buffer, stage_tensors

    cases = list(_layout_cases())
    assert len(cases) == len(measured[0]["layouts"]) == 144
    for (case, _), want in zip(cases, measured[0]["layouts"]):
        model, tp, first, last, dp, bucket = case
        pre, layer, post = stage_tensors(model, tp, first, last)
        buckets, spans = buffer_layout(((post[::-1], 1), (layer[::-1], 3), (pre[::-1], 1)), dp, bucket)
        assert (buckets[-1][2], len(buckets), _busiest_shard(buckets, spans, dp)) == tuple(want), (case, want)
        # what the memory model reads (stepping over whole layers, or continuing the layout of fewer layers)
        priced = padded_buffer(model, tp, dp, 3, first, last, bucket)
        assert (priced.param_data, priced.optimizer) == (want[0], want[2]), (case, priced, want)
        assert priced.params == stage_params(model, tp, 3, first, last), case     # the parameters priced elsewhere
