"""Megatron-LM flags that change a layer's activations, the optimizer state or the DP gradient buckets, against a
plan: Megatron's own parser, validate_args and config builders (core_transformer_config_from_args,
megatron/training/training.py get_megatron_optimizer_config, get_megatron_ddp_config, resolve_ddp_bucket_size) say
what each flag makes Megatron run; the --hetauto rewrite must refuse, by name and before Megatron validates
anything, every one that runs something the plan did not price, and let through what it priced."""
import pytest
from helpers import parse_emitted, rank0_placement, transformer_config

from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import rewrite
from hetauto_megatron.plan.plan import plan_from_dict
from hetauto_megatron.spec.model import PRESETS


def _plan(tp=1, dp=2, recompute="none", **settings):
    # bf16 on H800s, the plan's default settings unless given
    mesh = {"cluster": "a", "device_type": "h800", "tp": tp, "dp": dp, "micro_batch_size": 1,
            "recompute": recompute, "stage_layers": [8]}
    if settings:
        mesh["settings"] = settings
    return plan_from_dict({"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8,
                           "meshes": [mesh]})


def _refused(monkeypatch, plan, extra, flag):
    _, args = parse_emitted(monkeypatch, plan, extra)
    with pytest.raises(InputError) as exc:
        rewrite.rewrite_args(args, plan, rank0_placement(plan), file="plan.yaml")
    assert exc.value.exit_code == 2 and exc.value.field == flag and flag in str(exc.value)
    assert "the plan" in str(exc.value) and exc.value.fix
    return exc.value


def _accepted(monkeypatch, plan, extra):
    margs, args = parse_emitted(monkeypatch, plan, extra)
    rewrite.rewrite_args(args, plan, rank0_placement(plan))
    margs.validate_args(args, {})
    return args


def test_fp32_residual_connection_is_refused(monkeypatch):
    """Megatron keeps the residual stream in fp32 and sends the pipeline's activations in fp32
    (transformer_config.py: pipeline_dtype overridden to torch.float), where the plan priced bf16 activations and
    boundary bytes. Before: the rewrite let it through."""
    import torch

    plan = _plan()
    margs, args = parse_emitted(monkeypatch, plan, ["--fp32-residual-connection"])
    margs.validate_args(args, {})
    config = transformer_config(margs, args)
    assert config.fp32_residual_connection and config.pipeline_dtype == torch.float and args.bf16
    _refused(monkeypatch, plan, ["--fp32-residual-connection"], "--fp32-residual-connection")


def test_distribute_saved_activations_is_refused(monkeypatch):
    """On a mesh where Megatron accepts it (TP 2, full recomputation, sequence_parallel: false), its full
    recomputation keeps 1/TP of each checkpointed layer input and all-gathers it before the recompute, where the
    plan priced whole inputs and no gather. Before: the rewrite let it through."""
    plan = _plan(tp=2, dp=1, recompute="full", sequence_parallel=False)
    monkeypatch.setenv("WORLD_SIZE", "2")          # the mesh's two ranks, as torchrun tells Megatron's parser
    margs, args = parse_emitted(monkeypatch, plan, ["--distribute-saved-activations"])
    margs.validate_args(args, {})
    config = transformer_config(margs, args)
    assert config.distribute_saved_activations and config.recompute_granularity == "full"
    assert config.tensor_model_parallel_size == 2 and not config.sequence_parallel
    _refused(monkeypatch, plan, ["--distribute-saved-activations"], "--distribute-saved-activations")


@pytest.mark.parametrize("name", ["sgd", "lion"])
def test_another_optimizer_than_adam_is_refused(monkeypatch, name):
    """Megatron's optimizer config says which optimizer it builds: SGD keeps one momentum buffer, Lion one, where
    the plan priced Adam's two fp32 moments per parameter and Adam's step. Before: the rewrite let it through."""
    from megatron.training.training import get_megatron_optimizer_config

    plan = _plan()
    margs, args = parse_emitted(monkeypatch, plan, ["--optimizer", name])
    margs.validate_args(args, {})
    assert get_megatron_optimizer_config(args)[0].optimizer == name
    _refused(monkeypatch, plan, ["--optimizer", name], "--optimizer")
    args = _accepted(monkeypatch, plan, ["--optimizer", "adam"])        # Megatron's default typed out
    assert get_megatron_optimizer_config(args)[0].optimizer == "adam"


def test_ddp_buckets_other_than_priced_are_refused(monkeypatch):
    """Megatron-Core's DDP cuts the first pipeline rank's gradients into buckets of resolve_ddp_bucket_size's
    size; the plan priced max(40M, 1M x DP) parameters, the exposed last bucket's reduction. Another
    --ddp-bucket-size or any --ddp-num-buckets is refused (before: let through); the priced size typed out runs."""
    from megatron.training.training import get_megatron_ddp_config, resolve_ddp_bucket_size

    from hetauto_megatron.plan.tail_costs import ddp_bucket_params

    plan = _plan()
    priced = ddp_bucket_params(plan.meshes[0].dp)
    params = 10 ** 9

    def megatron_bucket(extra):       # what Megatron's DDP would use (the group is read only when no flag is given)
        margs, args = parse_emitted(monkeypatch, plan, extra)
        margs.validate_args(args, {})
        return resolve_ddp_bucket_size(get_megatron_ddp_config(args), None, args.overlap_grad_reduce, params)

    assert megatron_bucket(["--ddp-bucket-size", "10000000"]) == 10_000_000 != priced
    error = _refused(monkeypatch, plan, ["--ddp-bucket-size", "10000000"], "--ddp-bucket-size")
    assert str(priced) in error.fix
    assert megatron_bucket(["--ddp-num-buckets", "4"]) == params // 4
    _refused(monkeypatch, plan, ["--ddp-num-buckets", "4"], "--ddp-num-buckets")
    assert megatron_bucket(["--ddp-bucket-size", str(priced)]) == priced
    _accepted(monkeypatch, plan, ["--ddp-bucket-size", str(priced)])


def test_ddp_bucket_size_without_overlapped_reduction_changes_nothing_priced(monkeypatch):
    """Without overlap_grad_reduce Megatron makes one bucket whatever --ddp-bucket-size says
    (resolve_ddp_bucket_size returns None): the flag runs what the plan priced."""
    from megatron.training.training import get_megatron_ddp_config, resolve_ddp_bucket_size

    plan = _plan(overlap_grad_reduce=False)
    args = _accepted(monkeypatch, plan, ["--ddp-bucket-size", "10000000"])
    assert not args.overlap_grad_reduce
    assert resolve_ddp_bucket_size(get_megatron_ddp_config(args), None, args.overlap_grad_reduce, 10 ** 9) is None


def test_bucket_padding_the_plan_does_not_price_is_refused_at_any_dp(monkeypatch):
    """The distributed optimizer pads every bucket's end to Megatron-Core's bucket_end_divisor (param_layout.py):
    --ddp-pad-buckets-for-high-nccl-busbw makes it lcm(DP, 128, 65,536) where the plan prices lcm(DP, 128)
    (cost/ddp_buffer.py), and at DP 1, with nothing to reduce, it still pads each bucket's end, so another bucket
    size changes the buffer priced. Both are refused by name; the emitted launch of a DP-1 plan runs as it is."""
    from megatron.core.optimizer.param_layout import bucket_end_divisor

    from hetauto_megatron.cost.ddp_buffer import BUCKET_END_ALIGN

    assert bucket_end_divisor(2, False) == BUCKET_END_ALIGN < bucket_end_divisor(2, True)
    flag = "--ddp-pad-buckets-for-high-nccl-busbw"
    _refused(monkeypatch, _plan(), [flag], flag)
    one = _plan(dp=1)
    args = _accepted(monkeypatch, one, [])
    assert args.overlap_grad_reduce and args.use_distributed_optimizer and not args.ddp_pad_buckets_for_high_nccl_busbw
    _refused(monkeypatch, one, ["--ddp-bucket-size", "10000000"], "--ddp-bucket-size")
    _accepted(monkeypatch, _plan(dp=1, distributed_optimizer=False, overlap_param_gather=False),
              ["--ddp-bucket-size", "10000000"])


def test_no_align_grad_reduce_runs_what_the_plan_priced(monkeypatch):
    """Under the 1F1B schedule a pipeline rank after the first holds one gradient bucket, complete at the end of
    its last backward. Its reduction starts from the bucket's hook there (--no-align-grad-reduce) or, by
    Megatron's default, which the plan prices, once its last send_backward returned: the flag can only start it
    earlier, by at most a blocking send's link time, which the plan over-prices, so it is accepted."""
    plan = plan_from_dict({"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8, "meshes": [
        {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 2, "micro_batch_size": 1, "stage_layers": [4, 4]}]})
    args = _accepted(monkeypatch, plan, ["--no-align-grad-reduce"])
    assert args.align_grad_reduce is False and args.overlap_grad_reduce


def test_a_launchs_collectives_over_the_world_every_iteration_are_announced_with_their_price(monkeypatch):
    """--exit-duration-in-mins and --exit-signal-handler make Megatron-LM's loop reduce over the whole world every
    iteration (training.py checkpoint_and_decide_exit: a MAX all-reduce, an all-gather), which the plan's iteration
    time does not count: production launches pass them, so they are not refused, and the launch's rank 0 says what
    they add, priced as the plan's inventory prices the world's ring. Two clusters of 2 ranks, nodes 10 us apart
    and the link 2 ms: an all-reduce walks the ring twice, 2 x (2 x 10 us + 2 x 2 ms) = 8.04 ms; the all-gather
    once, 4.02 ms. Without either flag, nothing is said."""
    from helpers import small_inventory

    from hetauto_megatron.megatron.unpriced import unpriced_world_collectives
    inv = small_inventory([("a", "h800", 1, 2), ("b", "h800", 1, 2)], [("a", "b", 100, 2)])
    mesh = {"device_type": "h800", "tp": 1, "dp": 2, "micro_batch_size": 1, "recompute": "none", "stage_layers": [4]}
    plan = plan_from_dict({"version": 4, "model": PRESETS["tiny"].to_dict(), "global_batch_size": 8,
                           "meshes": [dict(mesh, cluster="a"), dict(mesh, cluster="b")], "inventory": inv.to_dict()})
    assert [c.inter_node.latency_s for c in inv.clusters] == pytest.approx([10e-6, 10e-6])
    _, args = parse_emitted(monkeypatch, plan, ["--exit-duration-in-mins", "230", "--exit-signal-handler"])
    rewrite.rewrite_args(args, plan, rank0_placement(plan))
    note = unpriced_world_collectives(args, plan)
    assert "--exit-duration-in-mins (all-reduces whether any rank's time is up over the 4 ranks: 8.04 ms)" in note
    assert "--exit-signal-handler (all-gathers whether each rank received the exit signal over the 4 ranks: 4.02 " \
           "ms)" in note and "12.1 ms an iteration that the plan's iteration time does not count" in note
    _, logged = parse_emitted(monkeypatch, plan, ["--log-params-norm"])
    assert "--log-params-norm (all-reduces the parameters' squared norm over the 4 ranks: 8.04 ms)" in \
        unpriced_world_collectives(logged, plan)
    # Megatron-Core's optimizer step counts the gradients' zeros and SUM-reduces the count over its
    # gradient-statistics group (core/optimizer/clip_grads.py count_zeros_fp32), the world under --hetauto. Before,
    # the clusters had to agree on the flag (job_agreement.py COLLECTIVE_ARGS) and the note did not name it.
    _, zeros = parse_emitted(monkeypatch, plan, ["--log-num-zeros-in-grad"])
    assert zeros.log_num_zeros_in_grad
    assert "--log-num-zeros-in-grad (all-reduces the gradients' count of zeros over the 4 ranks: 8.04 ms)" in \
        unpriced_world_collectives(zeros, plan)
    _, plain = parse_emitted(monkeypatch, plan, [])
    assert unpriced_world_collectives(plain, plan) is None


def test_deterministic_kernels_are_refused(monkeypatch):
    """Megatron-LM's validate_args turns --deterministic-mode into deterministic kernels for the whole process
    (training/determinism.py apply_determinism_to_args: torch.use_deterministic_algorithms, Transformer Engine's
    deterministic attention backward, a fixed cuBLAS workspace, NCCL's ring), slower on an accelerator by what no
    CPU measurement times: the plan prices the default kernels. Before: the rewrite let it through, unpriced."""
    import torch

    from megatron.training.determinism import ARG_VALUES_REQUIRED_FOR_DETERMINISM, DETERMINISM_ENV_VAR_DEFAULTS

    assert DETERMINISM_ENV_VAR_DEFAULTS["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "0" and \
        "cross_entropy_loss_fusion" in ARG_VALUES_REQUIRED_FOR_DETERMINISM
    error = _refused(monkeypatch, _plan(), ["--deterministic-mode"], "--deterministic-mode")
    assert "deterministic kernels" in str(error) and not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("flags,impl", [(["--cuda-graph-impl", "local"], "local"),
                                        (["--cuda-graph-impl", "transformer_engine"], "transformer_engine"),
                                        (["--enable-cuda-graph"], "local"),
                                        (["--external-cuda-graph"], "transformer_engine")])
def test_cuda_graphs_are_refused(monkeypatch, flags, impl):
    """Megatron's validate_args turns each spelling into a CUDA graph implementation, which its transformer config
    captures with: graphs replay kernels without their launches, from static buffers and a memory pool, where the
    plan priced eager launches and no graph memory. Before: the rewrite let them through (on CPU every rank then
    stopped with an AttributeError traceback)."""
    plan = _plan()
    margs, args = parse_emitted(monkeypatch, plan, flags)
    margs.validate_args(args, {})
    assert args.cuda_graph_impl == impl and transformer_config(margs, args).cuda_graph_impl == impl
    _refused(monkeypatch, plan, flags, flags[0])


def test_a_captured_optimizer_step_is_refused(monkeypatch):
    """Megatron's optimizer config captures the step in a CUDA graph (on CPU every rank stopped with torch's
    "capturable" assertion); the plan priced the eager step. Before: the rewrite let it through."""
    from megatron.training.training import get_megatron_optimizer_config

    plan = _plan()
    margs, args = parse_emitted(monkeypatch, plan, ["--optimizer-cuda-graph"])
    margs.validate_args(args, {})
    assert get_megatron_optimizer_config(args)[0].optimizer_cuda_graph
    _refused(monkeypatch, plan, ["--optimizer-cuda-graph"], "--optimizer-cuda-graph")


def test_tp_collectives_under_the_gemms_are_refused(monkeypatch):
    """On a TP 2 mesh with sequence parallelism (the production settings, where Megatron's validate_args accepts
    the flag) Megatron's transformer config runs the TP collectives under the GEMMs (Transformer Engine's
    userbuffers, which initialize_megatron sets up for the flag), where the plan priced them exposed. Before: the
    rewrite let it through."""
    plan = _plan(tp=2, dp=1)
    assert plan.meshes[0].settings.sequence_parallel
    monkeypatch.setenv("WORLD_SIZE", "2")
    margs, args = parse_emitted(monkeypatch, plan, ["--tp-comm-overlap"])
    margs.validate_args(args, {})
    assert transformer_config(margs, args).tp_comm_overlap and args.sequence_parallel
    _refused(monkeypatch, plan, ["--tp-comm-overlap"], "--tp-comm-overlap")


def test_activations_offloaded_to_the_host_are_refused(monkeypatch):
    """On a plan of one stage (the only pipeline Megatron offloads on) its transformer config offloads the
    activations of the layers named to the host, where the plan's memory keeps them on the device. Before: the
    rewrite let it through."""
    plan = _plan()
    margs, args = parse_emitted(monkeypatch, plan, ["--cpu-offloading-num-layers", "2"])
    margs.validate_args(args, {})
    config = transformer_config(margs, args)
    assert config.cpu_offloading and config.cpu_offloading_num_layers == 2
    _refused(monkeypatch, plan, ["--cpu-offloading-num-layers", "2"], "--cpu-offloading-num-layers")


def test_fp4_is_refused(monkeypatch):
    """Megatron trains in fp4 for --fp4-format (Transformer Engine's NVFP4 recipe, its validate_args says), a
    precision the plan has no rates or element sizes for. Before: the rewrite let it through (and without
    Transformer Engine Megatron's ValueError was a traceback on every rank)."""
    plan = _plan()
    margs, args = parse_emitted(monkeypatch, plan, ["--fp4-format", "e2m1"])
    with pytest.raises(ValueError, match="--fp4-format requires Transformer Engine .* NVFP4"):
        margs.validate_args(args, {})     # here, without Transformer Engine: a traceback under --hetauto before
    _refused(monkeypatch, plan, ["--fp4-format", "e2m1"], "--fp4-format")
    _refused(monkeypatch, plan, ["--fp4-param-gather"], "--fp4-param-gather")


def test_a_gated_attention_output_is_refused(monkeypatch):
    """Megatron-LM counts the gate in its own FLOPs (training.py num_floating_point_operations: the QKV projection
    wider by the query's width) and its transformer config builds it; the plan priced the model's Q, K and V
    projections alone. Before: the rewrite let it through."""
    from megatron.training.training import num_floating_point_operations

    plan = _plan()
    flops = {}
    for extra in ([], ["--attention-output-gate"]):
        margs, args = parse_emitted(monkeypatch, plan, extra)
        margs.validate_args(args, {})
        args.padded_vocab_size = 128            # (Megatron sets it where it builds the tokenizer)
        flops[bool(extra)] = num_floating_point_operations(args, 8)
    assert transformer_config(margs, args).attention_output_gate and flops[True] > flops[False]
    _refused(monkeypatch, plan, ["--attention-output-gate"], "--attention-output-gate")


def test_a_quick_geglu_mlp_is_refused(monkeypatch):
    """Beside the plan's --swiglu, Megatron's config builder stops every rank with an AssertionError; on a plain
    GeLU MLP with biases it builds a gated MLP (the first layer twice as wide) of quick-GeLU with the bias-GeLU
    fusion on, which Megatron's MLP refuses at the first forward. Both refused by name before."""
    import inspect

    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer.mlp import MLP

    plan = _plan()
    margs, args = parse_emitted(monkeypatch, plan, ["--quick-geglu"])
    margs.validate_args(args, {})
    with pytest.raises(AssertionError):
        transformer_config(margs, args)
    _refused(monkeypatch, plan, ["--quick-geglu"], "--quick-geglu")
    gelu = plan_from_dict({"version": 4, "global_batch_size": 8, "model": {
        "preset": "tiny", "position_embedding": "learned", "gated_mlp": False}, "meshes": [
        {"cluster": "a", "device_type": "h800", "tp": 1, "dp": 2, "micro_batch_size": 1, "stage_layers": [8]}]})
    margs, args = parse_emitted(monkeypatch, gelu, ["--quick-geglu"])
    margs.validate_args(args, {})
    config = transformer_config(margs, args)
    assert config.gated_linear_unit and config.activation_func is quick_gelu and config.bias_activation_fusion
    assert "Only support fusion of gelu and swiglu" in inspect.getsource(MLP.forward)
    _refused(monkeypatch, gelu, ["--quick-geglu"], "--quick-geglu")


def test_weights_sharded_beyond_tp_are_refused(monkeypatch):
    """Megatron's validate_args turns --tensor-parallel-num-weight-shards above TP into generalized TP and takes it
    out of DP: on the plan's TP 1, DP 2 mesh, 2 shards leave DP 1, where the plan priced DP 2. Before: the rewrite
    let it through."""
    plan = _plan()
    monkeypatch.setenv("WORLD_SIZE", "2")           # the mesh's two ranks, as torchrun tells Megatron's parser
    margs, args = parse_emitted(monkeypatch, plan, ["--tensor-parallel-num-weight-shards", "2"])
    margs.validate_args(args, {})
    assert (args.gtp_weight_remat_size, args.data_parallel_size) == (2, 1) and plan.meshes[0].dp == 2
    _refused(monkeypatch, plan, ["--tensor-parallel-num-weight-shards", "2"], "--tensor-parallel-num-weight-shards")
    assert _accepted(monkeypatch, plan, []).data_parallel_size == 2


def test_timers_that_barrier_the_world_or_drain_the_device_per_micro_batch_are_refused(monkeypatch):
    """Megatron-Core's timers: a timer of a level above the job's is a dummy; a timed one synchronizes the device at
    its start and stop, and barriers the world first when asked (the timers' barrier group is never set), as every
    level-1 timer of the iteration is asked by Megatron's default barrier_with_L1_time (training.py's optimizer
    timer among them). Level 2 times every micro-batch's forward compute. Level 1 is refused with those barriers
    and runs without them; level 2 is refused either way. Before: both were let through."""
    import inspect

    import torch
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.timers import Timers
    from megatron.training import training

    calls = []
    monkeypatch.setattr(torch.distributed, "barrier", lambda group=None: calls.append(("barrier", group)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(("synchronize",)))
    Timers(0, "minmax")("optimizer", log_level=1).start(barrier=True)
    assert calls == []
    timers = Timers(1, "minmax")
    timers("optimizer", log_level=1).start(barrier=True)
    timers("optimizer").stop()
    assert calls == [("barrier", None), ("synchronize",), ("synchronize",)]
    assert "timers('optimizer', log_level=1).start(barrier=args.barrier_with_L1_time)" in \
        inspect.getsource(training.train_step)
    assert "config.timers('forward-compute', log_level=2).start()" in inspect.getsource(schedules.forward_step)

    plan = _plan()
    margs, args = parse_emitted(monkeypatch, plan, ["--timing-log-level", "1"])
    margs.validate_args(args, {})
    assert args.timing_log_level == 1 and args.barrier_with_L1_time is True          # Megatron's default
    error = _refused(monkeypatch, plan, ["--timing-log-level", "1"], "--timing-log-level")
    assert "--no-barrier-with-level-1-timing" in error.fix
    args = _accepted(monkeypatch, plan, ["--timing-log-level", "1", "--no-barrier-with-level-1-timing"])
    assert args.timing_log_level == 1 and args.barrier_with_L1_time is False
    for extra in (["--timing-log-level", "2"], ["--timing-log-level", "2", "--no-barrier-with-level-1-timing"]):
        error = _refused(monkeypatch, plan, extra, "--timing-log-level")
        assert "forward and backward compute" in error.reason and "--timing-log-level 1" in error.fix
    _accepted(monkeypatch, plan, ["--timing-log-level", "0"])
