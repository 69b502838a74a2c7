"""Weights, gradients and optimizer state per device as DeepSpeed's pipeline engine holds them.

Read in DeepSpeed 0.19.8's source (paths under `deepspeed/runtime/`) and measured on CPU by
tests/test_memory_deepspeed_state.py (every tensor the engine's module and optimizer reach, by unique storage, at
every instruction boundary of a training step and inside the optimizer's step). Which optimizer wraps the torch
Adam the runtime passes is decided by `engine.py:2294-2324` (`_do_optimizer_sanity_check`) from the precision,
the ZeRO stage and `data_types.grad_accum_dtype`, all three written by emit/deepspeed.py from the mesh's settings
(`settings.grad_accum_fp32`: fp32 accumulation of 16-bit gradients needs ZeRO in DeepSpeed):

  torch       fp32 without ZeRO: the torch optimizer itself. Weights 4, `.grad` 4, Adam's moments 8: Megatron's
              figure.
  bf16        16-bit without ZeRO, or with ZeRO-1 and fp32 accumulation: `BF16_Optimizer` (bf16_optimizer.py). It
              keeps the 16-bit weights in one flat buffer (`bf16_groups_flat`, :166-171), every parameter's 16-bit
              `.grad` (zeroed, not freed, between micro-batches: `clear_lp_grads`, :612-623, called by
              pipe/engine.py:840) and beside it a whole accumulation buffer in grad_accum_dtype
              (`fp32_groups_gradients_flat`, :191-192, added to after each backward, :523). The fp32 master weights
              (:182, :225) and so Adam's moments are one partition per DP rank, with ZeRO-0 too: the optimizer is
              built over the data-parallel group whatever the ZeRO stage (engine.py:2611-2626, `partition_count`
              :153). With a 16-bit accumulation buffer the step runs on an fp32 copy of the partition's gradient
              (`grad_partition.to(...)`, :417): 4/d more while Adam steps, set to None right after (:426-428).
  fp16        fp16 without ZeRO: `FP16_UnfusedOptimizer` (engine.py:2555-2606, for a torch optimizer: not one of
              DeepSpeed's fused ones), fp16/unfused_optimizer.py. Weights 2 and `.grad` 2 per parameter; fp32 master
              weights (:78) and so Adam's moments on every DP rank, unpartitioned; its step first copies every
              `.grad` to an fp32 `.grad` of its master (:216-222) and frees them once Adam has stepped
              (:232-236): 2 + 2 + 4 + 8 + 4 at the step.
  zero        fp32 or fp16 with ZeRO-1, or bf16 with ZeRO-1 and bf16 accumulation: `DeepSpeedZeroOptimizer`
              (zero/stage_1_and_2.py). Weights in a flat buffer (:509); each parameter's `.grad` while the
              micro-batches accumulate (fp16 with fp32 accumulation: each `.grad` is added into an fp32
              `grad_accum` attribute and freed, :396-404 and :2172-2177, so 4 per parameter, and the reduce bucket
              below is fp32 too, :1253-1254); the fp32 master partition is a clone even in fp32 training (:560-577: 4/d
              where Megatron's fp32 parameter is its own master); Adam's moments 8/d. Its step (:3013-3160), with
              the reduce bucket below released, holds another set at its largest on line :3119, between forming
              and dropping the flat gradient partition: the `.grad`s of the parameters outside the rank's partition
              are freed (:3103; `params_in_partition` holds every tensor with an element in the partition,
              `get_partition_info` :2579-2611), those of the partition are still held, as the epilogue's
              `averaged_gradients` (narrowed views of each `.grad`, or `grad_accum`, and a zero tensor for the
              padding on the last rank: `get_flat_partition`, :1047-1053 and :2859-2891): A/d (A the accumulation
              type's size) and, where a tensor straddles a partition's boundary, its whole `.grad` (less than
              one tensor per boundary: deepspeed_straddling_elements); `flatten` copies them into a flat
              partition (:3113-3117, A/d) which `.to` converts into the fp32 partition the step runs on
              (:3118, 4/d; the same tensor when A is 4); the flat copy is dropped (:3119), then the `.grad`s
              (:3126-3128) before the torch optimizer steps (:3139). E + (2A + C + 12)/d and the straddling
              `.grad`s (C = 4 for a 16-bit A, else 0): E + 20/d every time, 2 + 20/d in bf16 (the `.grad`s 2/d,
              the bf16 partition 2/d, its fp32 copy 4/d, master and moments 12/d), 4 + 20/d in fp32 (measured at
              DP 1 and 2 in bf16 and fp32, reading every line of that step: at DP 1 in bf16 the step's 2 + 20
              outweighs the 2 + 2 + 12 held through the micro-batches when the bucket is left out). Its gradient
              hooks (registered with contiguous_gradients, on by default: :713-715, zero/config.py:102) allocate a
              reduce bucket of `reduce_bucket_size` elements in the gradient's element type at a step's first backward
              (`setup_buckets`, :3256-3269, from the hooks :1354-1372) and hold it, beside the activations of the
              micro-batches still in flight, until the reduction after the last backward releases it (:924-927,
              :1061); the reduction allocates a second one (`reduce_gradients`, :963-968).

The BF16 and ZeRO optimizers flatten the stage's one parameter group (the runtime's torch Adam over all its
parameters) into a buffer padded with zeros to a multiple of 2 x DP elements (`nccl_start_alignment_factor` 2 x the
DP degree: bf16_optimizer.py:101-102 and :166-168, zero/stage_1_and_2.py:386-387, :441-446 and :505-517,
`align_dense_tensors` runtime/utils.py:994-1005; ZeRO's per-parameter alignment is off by default). What covers that
buffer covers its padding: the flat 16-bit weights, the BF16 optimizer's accumulation buffer, and over DP the fp32
master partition, Adam's moments, the step's fp32 gradient partition and the ZeRO step's flat partition and
`averaged_gradients` (`partition_size` is the padded buffer's over DP); the `.grad`s and `grad_accum` are per
parameter (deepspeed_padding_elements,
deepspeed_padding_bytes_per_element). Fewer than 2 x DP elements a stage, priced to the element as
cost/ddp_buffer.py prices Megatron-Core's padding.

Every optimizer's step runs after ReduceGrads, when the activations are gone: what it holds (the FP16 and BF16
optimizers' fp32 gradient copies, the ZeRO optimizer's set above; deepspeed_step_bytes_per_param) is a candidate
for the stage's peak of its own (cost/memory.py), not added to the set held with the activations
(deepspeed_state_bytes_per_param).

d is the mesh's DP degree. DeepSpeed refuses fp16 on CPU, so the fp16 rows are read in the source, not measured
here. The torch optimizer and FP16_UnfusedOptimizer step on every parameter and gather nothing; the BF16 and ZeRO
optimizers step on their partition and all-gather the updated 16-bit weights in the step (`update_lp_params`,
bf16_optimizer.py:593-601; stage_1_and_2.py's step): `deepspeed_shards_optimizer`, which the time model reads too
(plan/tail_costs.py).

The gradient reduction after a stage's last backward (the ReduceGrads instruction, pipe/engine.py:287-298) allocates
while it runs, when the activations are gone, above the state held through the micro-batches
(deepspeed_reduction_terms; measured by the same test at each collective the reduction issues):

  torch       `allreduce_gradients` (pipe/engine.py:294, engine.py:3073-3095) -> `buffered_allreduce_fallback` with
              elements_per_buffer = MEMORY_OPT_ALLREDUCE_SIZE, 5e8 (engine.py:151) -> `allreduce_no_retain`
              (:3828-3839): the `.grad`s are gathered into buckets, each flushed once it holds more than 5e8
              elements (so at most 5e8 + one tensor), and `allreduce_bucket` flattens each into a new tensor (:3796,
              a copy in the gradient's type, 4 bytes per element) that lives until its all-reduce and the copy back
              (`allreduce_and_copy`, :3823-3826) are done: one bucket at a time.
  fp16        the same over the fp16 `.grad`s: each bucket's flat copy (2 bytes per element) and, with fp32
              communication, its fp32 conversion (`tensor.to(...)`, engine.py:3800-3801: 4 more).
  bf16        `_bf16_reduce_grads` (pipe/engine.py:297-298) -> `buffered_allreduce_fallback` over the optimizer's
              `get_grads_for_reduction` (bf16_optimizer.py:541-544): one flat accumulation buffer per parameter
              group (:196), which flattening returns as it is (torch's flatten_dense_tensors of one tensor is a
              view), so nothing is copied unless the buffer's type is not communication_data_type: then
              `tensor.to(...)` (engine.py:3800-3801) copies the whole buffer (no 5e8 cap applies to one tensor):
              4 bytes per parameter for bf16 accumulation reduced in fp32 (ZeRO-0), nothing at ZeRO-1 with fp32
              accumulation. The step's fp32 gradient copy is not formed yet.
  zero        `reduce_gradients(pipeline_parallel=True)` (engine.py:3089-3092, zero/stage_1_and_2.py:958-978)
              appends a second reduce bucket of reduce_bucket_size elements (:963-968) to the one the hooks
              allocated; both are released by the epilogue (:1016-1061, `_release_ipg_buffers` :924-927). The
              `.grad`s copied into the first bucket drop their own storage (:1455-1461), so this is an upper bound
              by at most their bytes (measured: exact, or up to 0.2 % over where the reads catch the moved .grads).
"""
from __future__ import annotations

from ..spec.model import ModelSpec

FP32 = 4
ADAM_MOMENT_BYTES = 8
# nccl_start_alignment_factor (bf16_optimizer.py:101-102, zero/stage_1_and_2.py:386-387): the BF16 and ZeRO
# optimizers pad each parameter group's flat 16-bit buffer to a multiple of this x the DP degree
NCCL_START_ALIGNMENT = 2
# MEMORY_OPT_ALLREDUCE_SIZE (engine.py:151): the elements_per_buffer the pipeline engine's ZeRO-0 reduction passes
# (pipe/engine.py:294, :298)
ALLREDUCE_BUFFER_ELEMENTS = 500_000_000


def element_bytes(precision: str) -> int:
    """The element size of a mesh's weights: 4 in fp32, 2 in bf16 and fp16 (fp8 trains as bf16 here: DeepSpeed has
    no fp8 setting, emit/deepspeed.py)."""
    return FP32 if precision == "fp32" else 2


def deepspeed_optimizer(precision: str, settings) -> str:
    """Which of DeepSpeed's optimizers the engine builds for a mesh training in `precision`: "torch", "bf16",
    "fp16" or "zero" (module docstring; engine.py:2294-2324 on the config emit/deepspeed.py writes)."""
    if settings.distributed_optimizer:                  # ZeRO-1
        bf16 = precision not in ("fp32", "fp16")
        return "bf16" if bf16 and settings.grad_accum_fp32 else "zero"
    return {"fp32": "torch", "fp16": "fp16"}.get(precision, "bf16")


def deepspeed_shards_optimizer(precision: str, settings) -> bool:
    """The optimizer keeps its fp32 master weights and Adam's moments as one partition per DP rank, steps on it and
    all-gathers the updated weights: the BF16 optimizer (with ZeRO-0 too) and ZeRO-1; the torch optimizer and
    FP16_UnfusedOptimizer hold and step on every parameter on every DP rank."""
    return deepspeed_optimizer(precision, settings) in ("bf16", "zero")


def deepspeed_state_bytes_per_param(precision: str, dp: int, settings) -> dict[str, float]:
    """Bytes per parameter DeepSpeed's engine holds through a step's micro-batches, as {"weights", "gradients",
    "optimizer"} (the module docstring gives each term's source); the optimizer's step may hold another set
    (deepspeed_step_bytes_per_param), once the activations are gone."""
    E = float(element_bytes(precision))
    kind = deepspeed_optimizer(precision, settings)
    if kind == "torch":
        return {"weights": E, "gradients": E, "optimizer": float(ADAM_MOMENT_BYTES)}
    if kind == "fp16":      # fp32 master weights and moments on every rank
        return {"weights": E, "gradients": E, "optimizer": float(FP32 + ADAM_MOMENT_BYTES)}
    if kind == "bf16":
        return {"weights": E, "gradients": E + _accumulation_bytes(precision, settings),
                "optimizer": (FP32 + ADAM_MOMENT_BYTES) / dp}
    return {"weights": E, "gradients": float(_accumulation_bytes(precision, settings)),
            "optimizer": (FP32 + ADAM_MOMENT_BYTES) / dp}


def _accumulation_bytes(precision: str, settings) -> int:
    """Element size of the gradients accumulated over the micro-batches (data_types.grad_accum_dtype): the BF16
    optimizer's accumulation buffer; under ZeRO each parameter's `.grad`, or in fp32 its `grad_accum` attribute
    when that type differs from the weights' (stage_1_and_2.py:396-404, `_fill_param_grad_accum_attribute`
    :2172-2177, which frees the 16-bit `.grad` after adding it), which also types the reduce bucket
    (`_gradient_reduction_buffer_dtype`, :1253-1254)."""
    return FP32 if settings.grad_accum_fp32 else element_bytes(precision)


def _step_gradient_copy_bytes(precision: str, settings) -> int:
    """BF16_Optimizer's fp32 copy of the gradient partition its step forms from a 16-bit accumulation buffer
    (bytes per parameter of the partition)."""
    return FP32 if _accumulation_bytes(precision, settings) < FP32 else 0


def deepspeed_step_bytes_per_param(precision: str, dp: int, settings) -> dict[str, float] | None:
    """Bytes per parameter the optimizer holds at the largest point of its step (module docstring), when that is
    not what it holds through the micro-batches: the ZeRO optimizer's (stage_1_and_2.py:3119) with the reduce bucket
    and the `.grad`s outside the rank's partition freed, those inside (A/d), the flat partition copied from them
    (A/d) and its fp32 copy (4/d, none when A is 4) held beside master and moments (the straddling tensors'
    `.grad`s beyond the partition are deepspeed_step_fixed_bytes); the FP16 optimizer's set with the fp32 copy of
    every `.grad` (unfused_optimizer.py:216-222); the BF16 optimizer's with the fp32 copy of its gradient partition
    from a 16-bit accumulation buffer (bf16_optimizer.py:417). None: the torch optimizer, the BF16 optimizer with
    fp32 accumulation (their step allocates nothing but Adam's moments, held from the first step on)."""
    kind = deepspeed_optimizer(precision, settings)
    held = deepspeed_state_bytes_per_param(precision, dp, settings)
    if kind == "fp16":
        return {**held, "optimizer": held["optimizer"] + FP32}
    if kind == "bf16":
        copy = _step_gradient_copy_bytes(precision, settings)
        return {**held, "optimizer": held["optimizer"] + copy / dp} if copy else None
    if kind != "zero":
        return None
    return {"weights": float(element_bytes(precision)), "gradients": _step_gradient_bytes(precision, settings) / dp,
            "optimizer": (FP32 + ADAM_MOMENT_BYTES) / dp}


def _step_gradient_bytes(precision: str, settings) -> int:
    """The ZeRO step's gradients per element of the rank's partition: the accumulated `.grad`s still held, their
    flat copy and its fp32 conversion (stage_1_and_2.py:3113-3119)."""
    accumulation = _accumulation_bytes(precision, settings)
    return 2 * accumulation + _step_gradient_copy_bytes(precision, settings)


def deepspeed_step_fixed_bytes(precision: str, dp: int, settings, params: float,
                               tensors: tuple[float, float]) -> dict[str, float]:
    """Bytes the ZeRO optimizer's step holds beyond its per-parameter set (deepspeed_step_bytes_per_param) on the
    busiest DP rank of a stage of `params` parameters whose largest tensors are `tensors` (stage_param_tensors):
    the whole `.grad` of a tensor that straddles its partition's boundary, of which the per-parameter set counts
    only the part inside (`get_partition_info`, stage_1_and_2.py:2596-2600, keeps such a tensor in both
    partitions, and the step frees its `.grad` only after the flat copy, :3128); deepspeed_straddling_elements
    bounds it."""
    if deepspeed_optimizer(precision, settings) != "zero" or dp < 2:
        return {}
    return {"gradients": _accumulation_bytes(precision, settings) * deepspeed_straddling_elements(tensors, params, dp)}


def deepspeed_straddling_elements(tensors: tuple[float, float], params: float, dp: int) -> float:
    """An upper bound of the elements of the tensors straddling the busiest rank's partition boundaries that lie
    outside its partition: less than one tensor per boundary (one for the first and the last rank, two for a middle
    one, none at DP 1), each at most the stage's largest layer tensor or, where it is longer than a partition less
    the padding (so that it can cross a boundary from its place at an end of the stage's flat buffer: the
    embedding, the runtime's first layer, on the first stage; the head, or its tied table, at an end of the last
    stage's), the vocabulary table. `tensors`: (a layer's largest tensor, the table or 0; stage_param_tensors). Measured (2 stages x DP 2):
    14,399 and 1,921 elements of a 16,320-element MLP matrix straddling the two ranks' boundary, priced 16,320."""
    if dp < 2:
        return 0.0
    layer, table = tensors
    pad = deepspeed_padding_elements(params, dp)
    crosses = table > (params + pad) / dp - pad
    return min(2, dp - 1) * (max(layer, table) if crosses else layer)


def deepspeed_padding_elements(params: float, dp: int) -> int:
    """Elements the BF16 and ZeRO optimizers pad a stage's flat buffer with: its parameters rounded up to a multiple
    of NCCL_START_ALIGNMENT x DP (`align_dense_tensors`, runtime/utils.py:994-1005, appends one zero tensor of the
    difference; bf16_optimizer.py:166-168, zero/stage_1_and_2.py:441-446 and :505-517; zero's per-parameter
    alignment is off, `parameter_alignment` False by default, zero/config.py:317, and the configs leave it). One
    parameter group: the runtime passes a torch Adam over all the stage's parameters (runtime/deepspeed_pipeline.py
    `initialize`). Fewer than 2 x DP elements: nothing to the stage's size, but every figure of it element-exact."""
    return (-round(params)) % (NCCL_START_ALIGNMENT * dp)


def deepspeed_padding_bytes_per_element(precision: str, dp: int, settings,
                                        at_step: bool = False) -> dict[str, float]:
    """Bytes per padding element (deepspeed_padding_elements) of what covers the padded flat buffer rather than
    the parameters: the flat 16-bit weights (bf16_optimizer.py:166-171, zero/stage_1_and_2.py:505-517, which the
    parameters are views of), the BF16 optimizer's accumulation buffer (`torch.zeros_like` of the flat weights,
    bf16_optimizer.py:191-192), and the fp32 master partition, Adam's moments and the step's fp32 gradient
    partition, each the flat buffer's size over DP (bf16_optimizer.py:175-182 and :417; stage_1_and_2.py:574-577
    and :3113-3126: `partition_size` is the padded buffer's over DP), with the ZeRO step's flat partition and the
    `averaged_gradients` it is copied from (a zero tensor of the padding on the last rank, :2890-2891). The
    `.grad`s and ZeRO's `grad_accum` are per parameter, not padded; the torch and FP16 optimizers flatten nothing.
    `at_step`: the set at the optimizer's step (deepspeed_step_bytes_per_param)."""
    kind = deepspeed_optimizer(precision, settings)
    E = float(element_bytes(precision))
    if kind == "bf16":
        copy = _step_gradient_copy_bytes(precision, settings) if at_step else 0
        return {"weights": E, "gradients": float(_accumulation_bytes(precision, settings)),
                "optimizer": (FP32 + ADAM_MOMENT_BYTES + copy) / dp}
    if kind == "zero":
        return {"weights": E, "gradients": _step_gradient_bytes(precision, settings) / dp if at_step else 0.0,
                "optimizer": (FP32 + ADAM_MOMENT_BYTES) / dp}
    return {}


def deepspeed_state_fixed_bytes(precision: str, settings) -> dict[str, float]:
    """Bytes DeepSpeed's engine holds whatever the stage's size: the ZeRO optimizer's reduce bucket (gradients), in
    the accumulated gradients' type."""
    if deepspeed_optimizer(precision, settings) == "zero":
        return {"gradients": float(settings.reduce_bucket_elements * _accumulation_bytes(precision, settings))}
    return {}


def deepspeed_reduction_terms(precision: str, dp: int, settings) -> tuple:
    """What the engine holds while its gradient reduction after the last backward runs (module docstring), as
    (bytes per parameter, fixed bytes, bytes per element of the reduction's flat copy, whether that copy is cut at
    ALLREDUCE_BUFFER_ELEMENTS, the DP degree, bytes per padding element): held = per * params + fixed + copy *
    elements + padding bytes x deepspeed_padding_elements(params, dp), elements = the stage's parameters, at most
    ALLREDUCE_BUFFER_ELEMENTS and one more tensor when cut."""
    kind = deepspeed_optimizer(precision, settings)
    E = element_bytes(precision)
    per = deepspeed_state_bytes_per_param(precision, dp, settings)
    fixed = sum(deepspeed_state_fixed_bytes(precision, settings).values())
    padding = sum(deepspeed_padding_bytes_per_element(precision, dp, settings).values())
    communication = E if settings.grad_reduce_dtype == "param" else FP32     # emit/deepspeed.py
    if kind == "torch":     # fp32: the flattened copy of the .grads, in buckets of 5e8 elements
        return sum(per.values()), fixed, float(E), True, dp, 0.0
    if kind == "fp16":      # the same fallback over the fp16 .grads (the step's fp32 copies are not formed yet),
        # flattened, and converted to the communication type when that is fp32 (engine.py:3796-3801)
        return sum(per.values()), fixed, float(E + (communication if communication != E else 0)), True, dp, 0.0
    if kind == "bf16":
        accumulation = _accumulation_bytes(precision, settings)
        copy = float(communication) if communication != accumulation else 0.0
        # the copy converts the whole flat accumulation buffer, its padding included (engine.py:3800-3801)
        return sum(per.values()), fixed, copy, False, dp, padding + copy
    return sum(per.values()), 2 * fixed, 0.0, False, dp, padding     # the second reduce bucket


def deepspeed_held_at_reduction(terms: tuple, largest_tensor: float, params: float) -> float:
    """Bytes held while the reduction runs for a stage of `params` parameters: deepspeed_reduction_terms' terms,
    the stage's largest parameter tensor (largest_param_tensor)."""
    return min(deepspeed_held_at_reduction_pieces(terms, largest_tensor, params))


def deepspeed_held_at_reduction_pieces(terms: tuple, largest_tensor: float, params: float) -> tuple[float, ...]:
    """deepspeed_held_at_reduction as the smallest of these, each affine in the stage's parameters (but for the
    few padding elements): the flat copy of every parameter's gradient and, when the copy is cut, of
    ALLREDUCE_BUFFER_ELEMENTS and one more tensor. Apart so that the memory caps (plan/memory_caps.py) can fit
    each piece's line; a smallest of lines is not one line."""
    per, fixed, copy, cut, dp, padding = terms
    pad = deepspeed_padding_elements(params, dp) if padding else 0
    whole = per * params + fixed + copy * params + padding * pad
    if not cut:
        return (whole,)
    return whole, per * params + fixed + copy * (ALLREDUCE_BUFFER_ELEMENTS + largest_tensor) + padding * pad


def largest_param_tensor(model: ModelSpec, tp: int, first: bool, last: bool) -> float:
    """Elements of a stage's largest parameter tensor (an upper bound of what one reduction bucket holds beyond its
    cap): the larger of stage_param_tensors."""
    return max(stage_param_tensors(model, tp, first, last))


def stage_param_tensors(model: ModelSpec, tp: int, first: bool, last: bool) -> tuple[float, float]:
    """Elements of a stage's largest tensors: (the larger of a layer's QKV and first MLP matrix, the vocabulary
    table where the stage holds it, else 0)."""
    h = model.hidden_size
    layer = max(h * (h + 2 * model.kv_hidden), h * model.ffn_hidden_size * (2 if model.gated_mlp else 1)) / tp
    table = model.vocab_size * h / tp if first or (last and model.output_layer) else 0.0
    return layer, table
