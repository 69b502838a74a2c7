"""What DeepSpeed's pipeline engine itself holds on a stage, beyond the layers' saved activations.

Read in DeepSpeed 0.19.8's `deepspeed/runtime/pipe/engine.py` (line numbers of that file) and measured on CPU
(tests/test_memory_deepspeed.py: every tensor a rank holds at every instruction boundary). Megatron's schedule
frees a stage's output once it is sent (`deallocate_output_tensor`) and receives into the tensor the first layer
keeps; DeepSpeed's `PipelineEngine` keeps, per stage, in `pipe_buffers` (one slot per micro-batch in flight,
`TrainSchedule.num_pipe_buffers` = max(2, min(stages - stage, micro-batches)), schedule.py:255-256):

  output        a stage other than the last keeps its output until that micro-batch's backward (`outputs`,
                engine.py:751, freed at 866): the whole activation with TP 1; with TP > 1 (`pipe_partitioned`,
                137) its data is dropped (744) and the 1/TP slice it sent is kept instead (`PartitionedTensor`,
                runtime/utils.py `_partition_tensor` clones it), so 1/TP of it.
  received      a stage other than the first, with TP 1, keeps the received activation (a clone of the receive
                buffer, 1128) until SendGrad (1111), and its forward runs on another clone (705): the layers' input
                is counted with the layers, this copy is the engine's. With TP > 1 the all-gathered input replaces
                it (721) and is itself the first layer's input: nothing more.
  receive buffer  one buffer, shared by the received activations and the received gradients (both come from
                `_allocate_or_extend_buffers`, 1284-1294, index 0 / 1 of `_grad_layer_buf`: 1000, 1014, 1180, 1203):
                one boundary tensor with TP 1, its 1/TP slice (and a small meta tensor) with TP > 1.
  last stage    the last stage's backward returns before it clears its slot (798-800), so its output, the logits,
                stays referenced until the slot is reused two micro-batches later (2 slots): the current micro-
                batch's logits (the loss works on them out of place: Megatron's vocab-parallel cross entropy,
                torch's) and the previous micro-batch's, whose autograd graph still holds that micro-batch's
                received input and its gradient (the AccumulateGrad node keeps the input leaf, and the leaf its
                `.grad`): 2 logits + 2 boundary tensors (the received input is whole with any TP: 721).
  workspace     with TP > 1 a stage other than the last rebuilds, for each backward, its whole output (819) and the
                whole received gradient (834): 2 boundary tensors while the backward runs.

At the gradient reduction and the optimizer step (ReduceGrads, then OptimizerStep, after the schedule's last backward:
  schedule.py:238-241; `_exec_reduce_grads`, 287-295, and the reduction it calls touch no pipe buffer, and the
  engine clears no slot at the end of a step) every output has been freed by its backward and every received
  activation by its SendGrad: a stage holds its receive buffer, and the last stage its two slots' logits, and now
  both slots hold a backpropagated micro-batch whose graph keeps its received input and that input's gradient:
  2 logits + 4 boundary tensors, and under full
  recomputation both micro-batches' checkpoints (cost/memory.py adds them, beside the state at the reduction and at
  the step alike). Measured (tests/test_memory_deepspeed.py, the bytes beyond the state as ReduceGrads and as
  OptimizerStep start): first and middle stages their receive buffer, the last stage receive buffer + 2 logits + 4
  boundary tensors, TP 1 and 2, and 2 micro-batches x the layers' checkpoints.

Not counted: the first stage's token ids and the last stage's labels per slot (int64, 8/(h x element) of a boundary
tensor each) and the meta tensors (a few int64). With one micro-batch per step the last stage holds one logits
tensor and no previous micro-batch's input (counted as two: a step of one micro-batch is not a pipeline).
"""
from __future__ import annotations

from typing import NamedTuple


class PipeBuffers(NamedTuple):
    """Bytes the engine holds on one stage: `per_in_flight` for each micro-batch in flight, `fixed` once, and
    `workspace` (transient, during a backward pass)."""
    per_in_flight: float
    fixed: float
    workspace: float
    at_step: float = 0.0     # held after the last backward, through the gradient reduction and the optimizer step


NONE = PipeBuffers(0.0, 0.0, 0.0, 0.0)


def deepspeed_pipe_buffers(tp: int, boundary: float, logits: float, first: bool, last: bool) -> PipeBuffers:
    """DeepSpeed 0.19.8's pipe buffers on one stage (module docstring). `boundary`: bytes of one micro-batch's
    activation between stages (sequence x micro-batch x hidden x element: what a stage sends, and the gradient
    it receives back); `logits`: bytes of the last stage's output per micro-batch (sequence x micro-batch x
    vocabulary / TP x element; a model without an output layer sends its final norm's outputs to the loss:
    ModelSpec.logits_width); `tp`: the stage's TP group, over which the engine partitions its transfers."""
    if first and last:                 # one stage: no transfers, only the output slots
        return PipeBuffers(0.0, 2 * logits, 0.0, 2 * logits)     # and both still at the reduction and the step
    part = boundary / tp               # what crosses per TP rank (the whole tensor with TP 1)
    per = 0.0 if last else part        # the output (or its slice) until its backward
    if not first and tp == 1:
        per += boundary                # the received activation, kept beside the clone the layers run on
    fixed = part                       # the receive buffer
    if last:
        fixed += 2 * logits + 2 * boundary
    workspace = 2 * boundary if tp > 1 and not last else 0.0
    # at the step both of the last stage's slots hold a backpropagated micro-batch: `fixed` counts one's input and
    # its gradient, the other's are 2 boundary tensors more
    at_step = fixed + (2 * boundary if last else 0.0)
    return PipeBuffers(per, fixed, workspace, at_step)
