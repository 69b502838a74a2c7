"""The table of Megatron-LM features a plan does not price (megatron/unpriced.py refuses them under --hetauto):
each argument's dest, its flag, Megatron's default and what another value builds that the plan did not price.
Data, apart from the checks that read it."""
from __future__ import annotations

from typing import NamedTuple


class Unpriced(NamedTuple):
    dest: str            # Megatron's argument (argparse dest)
    flag: str
    default: object      # Megatron's default: any other value builds the feature
    what: str            # what it builds that the plan did not price
    allowed: tuple = ()  # other values that build nothing the plan's time and memory depend on


UNPRICED = (
    Unpriced("context_parallel_size", "--context-parallel-size", 1,
             "context parallelism: the plans use none (each mesh's TP, DP and pipeline stages are the plan's)"),
    Unpriced("num_experts", "--num-experts", None, "a mixture-of-experts model: the plan's model is dense"),
    Unpriced("mtp_num_layers", "--mtp-num-layers", None,
             "multi-token prediction: more layers and output heads than the plan's"),
    Unpriced("multi_latent_attention", "--multi-latent-attention", False,
             "multi-latent attention: other attention projections than the plan's"),
    Unpriced("expert_model_parallel_size", "--expert-model-parallel-size", 1,
             "expert parallelism: the plan's model is dense"),
    Unpriced("use_torch_fsdp2", "--use-torch-fsdp2", False,
             "PyTorch FSDP2, which shards the weights: the plan prices Megatron's distributed optimizer over each "
             "mesh's DP group"),
    Unpriced("use_megatron_fsdp", "--use-megatron-fsdp", False,
             "Megatron FSDP, which shards the weights: the plan prices Megatron's distributed optimizer over each "
             "mesh's DP group"),
    # generalized TP (validate_args: gtp_weight_remat_size = shards / TP): every weight sharded further and
    # all-gathered again in each forward and backward, and the GTP degree taken out of DP (data_parallel_size =
    # world / (TP x PP x CP x GTP)). The rewrite gives each rank its own mesh's TP, which a launch's value was not
    # written against (a value below it is Megatron's ValueError, "must be >= tensor_model_parallel_size"): any
    # value is refused, and without it Megatron shards each weight over the mesh's TP alone
    Unpriced("tensor_parallel_num_weight_shards", "--tensor-parallel-num-weight-shards", None,
             "weights sharded over more ranks than TP (generalized TP), re-gathered in each pass, with a smaller DP "
             "group: the plan shards each weight over its mesh's TP and prices that mesh's DP"),
    Unpriced("num_distributed_optimizer_instances", "--num-distributed-optimizer-instances", 1,
             "several distributed-optimizer instances: the plan shards the optimizer state over each mesh's whole "
             "DP group"),
    Unpriced("hybrid_layer_pattern", "--hybrid-layer-pattern", None,
             "a hybrid (Mamba) layer pattern: the plan's layers are transformer layers"),
    Unpriced("hybrid_override_pattern", "--hybrid-override-pattern", None,
             "a hybrid (Mamba) layer pattern (the older spelling): the plan's layers are transformer layers"),
    Unpriced("heterogeneous_layers_config_path", "--heterogeneous-layers-config-path", None,
             "layers of different shapes: the plan's layers are all alike"),
    Unpriced("heterogeneous_layers_config_encoded_json", "--heterogeneous-layers-config-encoded-json", None,
             "layers of different shapes: the plan's layers are all alike"),
    Unpriced("experimental_attention_variant", "--experimental-attention-variant", None,
             "another attention than the plan's causal self-attention"),
    Unpriced("window_size", "--window-size", None,
             "sliding-window attention: the plan prices full causal attention"),
    # Per-document attention (NVIDIA's pretrain_gpt.py get_batch: has_cu_seqlens = args.sft or
    # args.dataloader_inter_document_masking): the data loader cuts each sample at its documents' ends
    # (gpt_dataset.py cu_seqlens; --sft's SFTDataset packs sequences), attention runs on variable-length (THD)
    # documents, and every pipeline stage, not only the first and last, reads a batch each micro-batch and
    # gathers its lengths on the host (update_seqlen_stats_from_cu_seqlens)
    Unpriced("dataloader_inter_document_masking", "--dataloader-inter-document-masking", False,
             "attention cut at each document's end (variable-length THD attention from the data loader's "
             "cu_seqlens), with every pipeline stage reading a batch and syncing with the host each micro-batch: "
             "the plan prices full causal attention over each sample and data read by the first and last stages"),
    Unpriced("sft", "--sft", False,
             "Megatron's SFT training (SFTDataset's packed sequences, attention cut at each sequence's end, every "
             "pipeline stage reading a batch and syncing with the host each micro-batch): the plan prices "
             "pretraining's full causal attention over each sample"),
    # NVIDIA's gpt_builders.py builds the layers from --spec whatever --transformer-impl says (`if args.spec is
    # not None: import_module(args.spec)`): a spec of the launch's choosing (e.g. the local spec on an accelerator
    # mesh, whose --transformer-impl local is refused: unpriced.py check_attention_args). The plan prices the spec
    # Megatron picks from --transformer-impl, which the rewrite checks: Transformer Engine's on accelerator
    # meshes, the local one on CPU meshes (set there by the hook; no launch of hetauto's passes --spec)
    Unpriced("spec", "--spec", None,
             "layers built from the spec module named (NVIDIA's gpt_builders.py), not the ones the plan priced: "
             "Transformer Engine's layers on accelerator meshes, Megatron's local layers on meshes of CPU "
             "processes, which Megatron builds from --transformer-impl"),
    # Megatron-Core's SelfAttention widens its fused QKV projection by one more query-sized block, the gate, and
    # multiplies the attention output by its sigmoid (attention.py linear_qkv_out_dim, _apply_output_gate);
    # Megatron-LM counts the gate's GEMM in its own FLOPs (training.py num_floating_point_operations)
    Unpriced("attention_output_gate", "--attention-output-gate", False,
             "a gated attention output: a QKV projection wider by the query's width, and the gate's activations; "
             "the plan prices the model's Q, K and V projections alone"),
    # core_transformer_config_from_args: a gated MLP (fc1 twice as wide) with the quick-GeLU activation, a model
    # the plan's files cannot describe (ModelSpec: SwiGLU or a plain GeLU MLP), hence not the architecture table
    # (emit/megatron.py architecture_args). Beside --swiglu the config builder's assertion stops every rank; on a
    # plain MLP with biases Megatron's bias-GeLU fusion stays on, and mlp.py raises at the first forward ("Only
    # support fusion of gelu and swiglu")
    Unpriced("quick_geglu", "--quick-geglu", False,
             "a quick-GeGLU MLP (gated: the first MLP layer twice as wide, another activation): the plan prices its "
             "model's SwiGLU or plain GeLU MLP"),
    # core_transformer_config_from_args: squared ReLU as the MLP's activation; beside --swiglu its assertion stops
    # every rank with a traceback, and on a plain MLP it trains an activation the plan's model does not have
    Unpriced("squared_relu", "--squared-relu", False,
             "a squared-ReLU MLP: the plan prices its model's SwiGLU or plain GeLU MLP"),
    Unpriced("cpu_offloading_num_layers", "--cpu-offloading-num-layers", 0,
             "the activations of that many layers offloaded to the host (Transformer Engine's CPU offloading, on "
             "plans of one stage): the plan's memory keeps the activations on the device"),
    Unpriced("fine_grained_activation_offloading", "--fine-grained-activation-offloading", False,
             "activation offloading: the plan's memory keeps the activations on the device"),
    # Transformer Engine's precision-aware optimizer and its dtypes (Megatron's defaults: off and fp32). The plan
    # prices fp32 master weights and Adam moments (12 bytes per parameter / DP with the distributed optimizer) on
    # the device, and the gradient buffer and DP reduction in the mesh's grad_reduce_dtype; --main-grads-dtype bf16
    # makes Megatron's validate_args leave accumulate_allreduce_grads_in_fp32 off for bf16, so DDP reduces in bf16
    # where the plan (and the --hetauto rewrite's grad_reduce_in_bf16) says fp32.
    Unpriced("use_precision_aware_optimizer", "--use-precision-aware-optimizer", False,
             "Transformer Engine's precision-aware optimizer: the plan prices fp32 master weights and Adam moments "
             "and main gradients in the mesh's grad_reduce_dtype"),
    Unpriced("main_grads_dtype", "--main-grads-dtype", "fp32",
             "main gradients in another dtype: Megatron then reduces and accumulates bf16 gradients in bf16, where "
             "the plan's grad_reduce_dtype decides (settings.grad_reduce_dtype; fp32 by default)"),
    Unpriced("main_params_dtype", "--main-params-dtype", "fp32",
             "master weights in another dtype: the plan prices fp32 master weights"),
    Unpriced("exp_avg_dtype", "--exp-avg-dtype", "fp32", "Adam moments in another dtype: the plan prices fp32"),
    Unpriced("exp_avg_sq_dtype", "--exp-avg-sq-dtype", "fp32", "Adam moments in another dtype: the plan prices fp32"),
    Unpriced("optimizer_cpu_offload", "--optimizer-cpu-offload", False,
             "optimizer state offloaded to the host: the plan prices it on the device and its step there"),
    Unpriced("ddp_pad_buckets_for_high_nccl_busbw", "--ddp-pad-buckets-for-high-nccl-busbw", False,
             "every DP bucket of the distributed optimizer's buffer padded to a multiple of lcm(DP, 128, 65,536) "
             "elements (param_layout.py bucket_end_divisor): the plan prices the buffer padded to lcm(DP, 128) "
             "(cost/ddp_buffer.py)"),
    # The DP gradient buffer and its reduction as priced (cost/ddp_buffer.py, plan/tail_costs.py): main gradients
    # in the mesh's grad_reduce_dtype, reduced by NCCL's reduce-scatter (all-reduce without the distributed
    # optimizer). Megatron-Core's param_and_grad_buffer.py gives each parameter the patterns match an fp32
    # main_grad of its own beside its slot in the buffer (main_grad_copy_in_grad_buffer); where the mesh reduces
    # in fp32 (the plan's default) DistributedDataParallelConfig asserts "Only need to explicitly specify
    # param_name patterns ..." on every rank inside pretrain(), after the ranks joined
    Unpriced("ddp_param_name_patterns_for_fp32_local_accumulation",
             "--ddp-param-name-patterns-for-fp32-local-accumulation", [],
             "an fp32 copy of the main gradient of every parameter the patterns match, accumulated beside the "
             "gradient buffer: memory and passes the plan does not price; where the mesh reduces in fp32, "
             "Megatron-Core's DDP config asserts on every rank once the ranks joined"),
    # reduce_scatter_with_fp32_accumulation.py: an all-to-all of the bucket in the gradient dtype into a buffer of
    # the bucket's size, then a local fp32 sum of the DP shards, in place of NCCL's reduce-scatter; and DDP's
    # partition_buckets gives every bucket a group of its own (distributed_data_parallel.py)
    Unpriced("ddp_reduce_scatter_with_fp32_accumulation", "--ddp-reduce-scatter-with-fp32-accumulation", False,
             "the distributed optimizer's DP reduce-scatter replaced by an all-to-all into a buffer the size of "
             "the bucket and a local fp32 sum, and one bucket per bucket group: another collective, buffer and "
             "passes than the NCCL reduce-scatter the plan prices"),
    # Layers as the plan prices them: a 16-bit residual stream, and a full recomputation that keeps each layer's
    # whole input (split over TP only by sequence parallelism, which the plan's settings decide).
    Unpriced("fp32_residual_connection", "--fp32-residual-connection", False,
             "an fp32 residual stream: the embedding output and every layer's residual sums kept in fp32 "
             "(transformer_layer.py), and the pipeline transfers in fp32 (transformer_config.py pipeline_dtype): "
             "the plan prices activations and boundary bytes in the training precision"),
    Unpriced("distribute_saved_activations", "--distribute-saved-activations", False,
             "the full recomputation's saved layer inputs split over the TP ranks and all-gathered again before "
             "each recompute (tensor_parallel/random.py CheckpointFunction): the plan prices whole inputs kept and "
             "no gather (a mesh with sequence_parallel: true splits them, as priced)"),
    # The loss the plan prices (cost/analytic.py LOSS_BYTES, Engine.loss "vocab_parallel"): Megatron-Core's unfused
    # vocabulary-parallel cross entropy, whose passes over the fp32 logits are counted in its source. The fused one
    # (fusions/fused_cross_entropy.py under torch.compile, or Transformer Engine's kernel with
    # --cross-entropy-fusion-impl te) makes other passes and returns a bf16 gradient whatever the precision.
    Unpriced("cross_entropy_loss_fusion", "--cross-entropy-loss-fusion", False,
             "Megatron's fused cross entropy (compiled passes, or Transformer Engine's kernel with "
             "--cross-entropy-fusion-impl te): the plan prices the unfused vocabulary-parallel loss's passes over "
             "the fp32 logits (docs/cost-model.md)"),
    # fp8 plans train on 16-bit parameters (cost/model_state.py: dtype_bytes 2 for fp8): the distributed
    # optimizer's buffer holds them, and its parameter all-gather moves them, in 16 bits.
    Unpriced("fp8_param_gather", "--fp8-param-gather", False,
             "weights kept in fp8 (Transformer Engine's fp8 parameters) and all-gathered in fp8: the plan prices "
             "16-bit weights in the distributed optimizer's buffer and their gather in 16 bits"),
    # fp4 (Transformer Engine's NVFP4 recipe): a precision the plan has no rates or element sizes for (plan.precision
    # is bf16, fp16, fp8 or fp32)
    Unpriced("fp4", "--fp4-format", None,
             "fp4 GEMMs (Transformer Engine's NVFP4): the plan prices its own precision, bf16, fp16, fp8 or fp32"),
    Unpriced("fp4_param_gather", "--fp4-param-gather", False,
             "weights kept and all-gathered in fp4: the plan prices 16-bit weights in the distributed optimizer's "
             "buffer and their gather in 16 bits"),
    # Adam: the plan prices two fp32 moments per parameter (cost/model_state.py) and Adam's step traffic
    # (plan/tail_costs.py optimizer_time); SGD keeps one momentum buffer, Muon, Lion and SOAP other state.
    Unpriced("optimizer", "--optimizer", "adam",
             "another optimizer than Adam: the plan prices Adam's two fp32 moments per parameter and its step"),
    # TP collectives: the plan prices them exposed beside the GEMMs (cost/analytic.py; `tp_comm_overlap` prices only
    # published jobs that ran so, plan/calibration.py); Transformer Engine's userbuffers run them under the GEMMs
    # (initialize.py _initialize_tp_communicators, which initialize_megatron calls for this flag)
    Unpriced("tp_comm_overlap", "--tp-comm-overlap", False,
             "the TP collectives run under the GEMMs (Transformer Engine's userbuffers): the plan prices them "
             "exposed, as hetauto's runtime runs them"),
    # CUDA graphs: each captured layer (or the whole iteration, or the optimizer step) replays without launching
    # its kernels one by one, from static input and output buffers and a private memory pool; the plan prices
    # eager launches (cost/analytic.py kernel_latency_s per kernel) and no graph memory
    Unpriced("cuda_graph_impl", "--cuda-graph-impl", "none",
             "CUDA graphs, with their static buffers and memory pool: the plan prices eager kernel launches and no "
             "graph memory"),
    Unpriced("enable_cuda_graph", "--enable-cuda-graph", False,
             "CUDA graphs (the older spelling of --cuda-graph-impl local): the plan prices eager kernel launches "
             "and no graph memory"),
    Unpriced("external_cuda_graph", "--external-cuda-graph", False,
             "CUDA graphs (the older spelling of --cuda-graph-impl transformer_engine): the plan prices eager "
             "kernel launches and no graph memory"),
    Unpriced("optimizer_cuda_graph", "--optimizer-cuda-graph", False,
             "the optimizer step captured in a CUDA graph: the plan prices its eager step"),
    Unpriced("num_layers_per_virtual_pipeline_stage", "--num-layers-per-virtual-pipeline-stage", None,
             "the interleaved schedule: the plan runs and prices 1F1B"),
    Unpriced("num_virtual_stages_per_pipeline_rank", "--num-virtual-stages-per-pipeline-rank", None,
             "the interleaved schedule: the plan runs and prices 1F1B"),
    # NVIDIA's script wraps pretrain() for it (inprocess_restart.maybe_wrap_for_inprocess_restart): on a fault it
    # destroys the process groups and builds Megatron's own again, where --hetauto's are the plan's, built once
    Unpriced("inprocess_restart", "--inprocess-restart", False,
             "in-process restart, which tears down the process groups and builds Megatron's own: --hetauto's "
             "groups are the plan's (per-cluster meshes and the cross-cluster communicator), built once"),
    # Megatron-LM's result validation (plan/engines.py result_checks): the plan prices its default mode, whose check
    # is one scalar all-reduced over the world each iteration. "disabled" drops that scalar (a NaN or infinite loss
    # still stops the job): a few hop latencies the plan over-prices, as it does a blocking send's link time under
    # --no-align-grad-reduce; "report_stats" runs every step twice (core/rerun_state_machine.py
    # REPORT_DETERMINISM_STATS).
    # Megatron-LM's train_step calls torch.cuda.empty_cache() after each optimizer step (1), and after each
    # forward-backward too (2): the allocator hands its cached blocks back to the driver, and the next iteration
    # allocates every activation and gradient anew (cudaMalloc/cudaFree, each synchronising the device)
    Unpriced("empty_unused_memory_level", "--empty-unused-memory-level", 0,
             "the caching allocator emptied every iteration, so each one allocates its tensors from the driver "
             "again: device synchronisations and allocation time the plan does not price (its memory already "
             "counts the allocator's cache)"),
    # Megatron-Core's schedules (finish_embedding_wgrad_compute): on the last pipeline stage the output layer's
    # weight-gradient GEMMs of every micro-batch wait for the pipeline's flush
    Unpriced("defer_embedding_wgrad_compute", "--defer-embedding-wgrad-compute", False,
             "the last stage's output-layer weight-gradient GEMMs deferred to the end of the pipeline's flush, "
             "with their activations kept until then: the plan prices them in each micro-batch's backward"),
    # Norms on each layer's queries and keys (Megatron's q_layernorm / k_layernorm, built by gpt_builders.py): each
    # keeps its input for the backward, a query and a key tensor more per layer and micro-batch than the plan's
    # activations count (measured on Megatron-Core's own layer on CPU: +3.8 % of a layer's kept bytes with unfused
    # attention's scores, +7.8 % with 2 KV groups; more beside flash attention, which keeps no scores)
    Unpriced("qk_layernorm", "--qk-layernorm", False,
             "norms on the queries and keys, whose inputs each layer keeps for the backward: activations the plan "
             "does not count"),
    Unpriced("qk_l2_norm", "--qk-l2-norm", False,
             "L2 norms on the queries and keys, whose inputs each layer keeps for the backward: activations the "
             "plan does not count"),
    # Megatron-LM's apply_determinism_to_args (training/determinism.py): torch.use_deterministic_algorithms(True),
    # NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (Transformer Engine's attention takes its deterministic backward, or another
    # backend), CUBLAS_WORKSPACE_CONFIG, NCCL_ALGO=Ring, and the embedding's backward by indexing
    # (tensor_parallel/layers.py): kernels slower on an accelerator by amounts the CPU cannot time
    Unpriced("deterministic_mode", "--deterministic-mode", False,
             "deterministic kernels (torch's deterministic algorithms, Transformer Engine's deterministic attention "
             "backward, a fixed cuBLAS workspace, NCCL's ring): slower kernels whose times the plan does not price"),
    # Megatron-Core's enable_batch_invariant_mode (training/initialize.py; core/transformer/custom_layers/
    # batch_invariant_kernels.py): aten's mm, addmm, _log_softmax and mean.dim and Transformer Engine's GEMM and
    # RMSNorm replaced by Triton kernels for the whole process, at rates the plan's device catalog does not hold
    Unpriced("batch_invariant_mode", "--batch-invariant-mode", False,
             "batch-invariant kernels (Triton GEMMs, log-softmax and means in place of cuBLAS's and Transformer "
             "Engine's): GEMM rates the plan does not price"),
    # TransformerLayer._forward_mlp (core/transformer/transformer_layer.py): in training, unless the MLP is
    # recomputed, every layer's MLP runs on N slices of the sequence, then concatenates them: N times the MLP's
    # GEMM launches and TP collectives of 1/N the size, and a copy of its output, where the plan prices one pass
    Unpriced("mlp_chunks_for_training", "--mlp-chunks-for-training", 1,
             "every layer's MLP run on that many slices of the sequence (that many times its GEMM launches and TP "
             "collectives, and a concatenation): the plan prices one MLP pass"),
    # Megatron-LM's validate_args turns the distributed optimizer and overlap_param_gather off under it, after the
    # rewrite set both from the plan, and training.py get_model freezes every parameter: no weight gradients,
    # no DP reduction, no optimizer step, another memory and time than the plan's, its start-up log the plan's
    Unpriced("freeze_all_layers", "--freeze-all-layers", False,
             "every parameter frozen (no weight gradients, DP reduction or optimizer step) and Megatron's "
             "distributed optimizer and parameter-gather overlap turned off: the plan prices training them"),
    Unpriced("rerun_mode", "--rerun-mode", "validate_results",
             "every iteration's forward and backward passes run twice, to report their non-determinism: the plan "
             "prices one run", allowed=("disabled",)),
    # Megatron-Core's DDP passes over each bucket before reducing it, as the plan prices them (plan/tail_costs.py
    # grad_buffer_passes): a read for the NaN check, and at DP > 1 a read and a write scaling it by 1/DP
    Unpriced("ddp_average_in_collective", "--ddp-average-in-collective", False,
             "the DP reduction averaging in the collective instead of the 1/DP scaling pass over the gradients "
             "the plan prices (tail_costs.grad_buffer_passes)"),
    Unpriced("check_for_nan_in_loss_and_grad", "--no-check-for-nan-in-loss-and-grad", True,
             "no check of the gradients' norm before each DP reduction: the plan prices its pass over them"),
    Unpriced("check_for_large_grads", "--check-for-large-grads", False,
             "a second check of the gradients' norm before each DP reduction, beside the NaN check the plan "
             "prices"),
)
