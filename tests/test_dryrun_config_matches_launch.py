"""The dry run's model configuration against the one Megatron-LM builds for the launch the plan emits.

The dry run (runtime/model.py transformer_config, run by runtime/train.py) stands in for the launch scripts: it must
build what Megatron-LM's own `core_transformer_config_from_args` builds from the emitted arguments after the
--hetauto rewrite, for every field that changes what a rank holds or computes. The local layer spec and the fused
kernels are the dry run's on CPU: a CPU mesh's launch script carries them (plan/megatron_flags.py CPU_LAYER_ARGS),
and the --hetauto hook sets them on a CPU rank whose command line lacks them. Before, neither did: the launch as
emitted stopped in Megatron's TransformerConfig ("apply_rope_fusion is not available. Please install TE >= 1.4.")
unless the user added docs/megatron-integration.md's CPU flags."""
import dataclasses
import sys
import types

import pytest

from hetauto_megatron.megatron import launch_identity, rewrite
from hetauto_megatron.megatron.args import hetauto_args_provider
from hetauto_megatron.plan.megatron_flags import layer_args
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.spec.model import PRESETS

# what a rank holds or computes (TransformerConfig / ModelParallelConfig fields)
FIELDS = ("deallocate_pipeline_outputs", "sequence_parallel", "tensor_model_parallel_size",
          "pipeline_model_parallel_size", "recompute_granularity", "recompute_method", "recompute_num_layers",
          "recompute_modules", "hidden_dropout", "attention_dropout", "params_dtype", "pipeline_dtype", "bf16", "fp16",
          "gated_linear_unit", "normalization", "add_bias_linear", "num_query_groups", "ffn_hidden_size",
          "attention_softmax_in_fp32", "num_layers",
          # the fused kernels, none of which runs on a CPU
          "gradient_accumulation_fusion", "bias_activation_fusion", "bias_dropout_fusion", "masked_softmax_fusion",
          "apply_rope_fusion", "persist_layer_norm")

# what DDP does with the gradients (DistributedDataParallelConfig fields)
DDP_FIELDS = ("use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather", "grad_reduce_in_fp32",
              "check_for_nan_in_grad", "check_for_large_grads", "bucket_size", "average_in_collective",
              "num_distributed_optimizer_instances", "align_param_gather")

PLAN = {"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "meshes": [
    {"cluster": "a", "device_type": "cpu", "tp": 2, "dp": 1, "micro_batch_size": 2, "recompute": "selective",
     "stage_layers": [3, 2], "settings": {"hidden_dropout": 0.1}},
    {"cluster": "b", "device_type": "cpu", "tp": 1, "dp": 2, "micro_batch_size": 1, "recompute": "full",
     "stage_layers": [3]}]}


@pytest.mark.parametrize("launch", ["as emitted", "without the layer flags"])
@pytest.mark.parametrize("mesh_index", [0, 1])
def test_the_dry_runs_config_is_megatron_lms_for_the_emitted_launch(monkeypatch, mesh_index, launch):
    import megatron.training.arguments as margs

    from hetauto_megatron.emit.megatron import megatron_args
    from hetauto_megatron.megatron import cpu
    from hetauto_megatron.runtime.layout import PipelineLayout
    from hetauto_megatron.runtime.model import transformer_config

    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    cpu.apply()
    plan = plan_from_dict(PLAN)
    argv = megatron_args(plan, mesh_index, "plan.yaml")
    layer = layer_args("cpu")
    assert argv[argv.index(layer[0]):][:len(layer)] == layer           # the script carries them, together
    if launch == "without the layer flags":                            # a hand-written launch: the hook sets them
        argv = [t for t in argv if t not in layer]
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *argv, "--tokenizer-type", "NullTokenizer", "--vocab-size",
                                      "128", "--mock-data", "--train-iters", "1", "--lr", "1e-3"])
    args = margs.parse_args(hetauto_args_provider())
    rank = plan.rank_offset(mesh_index)
    rewrite.rewrite_args(args, plan, launch_identity.check_launch(
        plan, launch_identity.LaunchIdentity(rank, plan.world_size, None), None))
    margs.validate_args(args, {})
    config = margs.core_transformer_config_from_args(args)
    ctx = types.SimpleNamespace(mesh=plan.meshes[mesh_index], precision=plan.mesh_precision(mesh_index),
                                layout=PipelineLayout(plan, 0))
    dry = transformer_config(plan, ctx, plan.model)
    assert {f: getattr(dry, f) for f in FIELDS} == {f: getattr(config, f) for f in FIELDS}
    assert args.transformer_impl == "local"       # Megatron's local layer spec, which the dry run builds
    # and the DDP wrapper's configuration (buckets, overlaps, the gradients' dtype and their check before each
    # reduction: the dry run left check_for_nan_in_grad off while every launch ran it)
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.training.training import get_megatron_ddp_config

    from hetauto_megatron.runtime.train import ddp_settings
    ddp = dataclasses.asdict(DistributedDataParallelConfig(**ddp_settings(ctx.mesh.settings, ctx.precision)))
    launch_ddp = dataclasses.asdict(get_megatron_ddp_config(args))
    fields = [f for f in DDP_FIELDS if f != "grad_reduce_in_fp32" or ctx.precision != "fp32"]  # (fp32 either way)
    assert {f: ddp[f] for f in fields} == {f: launch_ddp[f] for f in fields}
