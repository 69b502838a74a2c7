"""The dry run's model configuration against the one Megatron-LM builds for the launch the plan emits.

The dry run (runtime/model.py transformer_config, run by runtime/train.py) stands in for the launch scripts: it must
build what Megatron-LM's own `core_transformer_config_from_args` builds from the emitted arguments after the
--hetauto rewrite, for every field that changes what a rank holds or computes. The local layer spec and the fused
kernels are the dry run's on CPU (the CPU flags Megatron-LM gets too: docs/megatron-integration.md)."""
import dataclasses
import sys
import types

import pytest

from hetauto_megatron.megatron import launch_identity, rewrite
from hetauto_megatron.megatron.args import hetauto_args_provider
from hetauto_megatron.megatron.demo import CPU_FLAGS
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.spec.model import PRESETS

# what a rank holds or computes (TransformerConfig / ModelParallelConfig fields)
FIELDS = ("deallocate_pipeline_outputs", "sequence_parallel", "tensor_model_parallel_size",
          "pipeline_model_parallel_size", "recompute_granularity", "recompute_method", "recompute_num_layers",
          "recompute_modules", "hidden_dropout", "attention_dropout", "params_dtype", "pipeline_dtype", "bf16", "fp16",
          "gated_linear_unit", "normalization", "add_bias_linear", "num_query_groups", "ffn_hidden_size",
          "attention_softmax_in_fp32", "num_layers")

PLAN = {"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "meshes": [
    {"cluster": "a", "device_type": "cpu", "tp": 2, "dp": 1, "micro_batch_size": 2, "recompute": "selective",
     "stage_layers": [3, 2], "settings": {"hidden_dropout": 0.1}},
    {"cluster": "b", "device_type": "cpu", "tp": 1, "dp": 2, "micro_batch_size": 1, "recompute": "full",
     "stage_layers": [3]}]}


@pytest.mark.parametrize("mesh_index", [0, 1])
def test_the_dry_runs_config_is_megatron_lms_for_the_emitted_launch(monkeypatch, mesh_index):
    import megatron.training.arguments as margs

    from hetauto_megatron.emit.megatron import megatron_args
    from hetauto_megatron.megatron import cpu
    from hetauto_megatron.runtime.layout import PipelineLayout
    from hetauto_megatron.runtime.model import transformer_config

    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    cpu.apply()
    plan = plan_from_dict(PLAN)
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *megatron_args(plan, mesh_index, "plan.yaml"), *CPU_FLAGS,
                                      "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--mock-data",
                                      "--train-iters", "1", "--lr", "1e-3"])
    args = margs.parse_args(hetauto_args_provider())
    rank = plan.rank_offset(mesh_index)
    rewrite.rewrite_args(args, plan, launch_identity.check_launch(
        plan, launch_identity.LaunchIdentity(rank, plan.world_size, None), None))
    margs.validate_args(args, {})
    launch = margs.core_transformer_config_from_args(args)
    ctx = types.SimpleNamespace(mesh=plan.meshes[mesh_index], precision=plan.mesh_precision(mesh_index),
                                layout=PipelineLayout(plan, 0))
    dry = transformer_config(plan, ctx, plan.model)
    assert {f: getattr(dry, f) for f in FIELDS} == {f: getattr(launch, f) for f in FIELDS}
