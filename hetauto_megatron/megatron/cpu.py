"""Redirections that let Megatron-LM's training loop (`megatron.training.pretrain`) run on CPU processes.

Megatron-Core's own CUDA calls (RNG tracker, `device="cuda"`, `.cuda()`, streams inside DDP) are redirected by
the runtime's device layer (`hetauto_megatron.runtime.device`); this module adds only what the training loop
in `megatron.training` needs on top, each scoped as narrowly as the code allows:

| where (megatron-core 0.19.2)               | what breaks on CPU                                 | redirect                     |
|--------------------------------------------|----------------------------------------------------|------------------------------|
| training.pretrain -> initialize_megatron   | asserts CUDA is available                          | pass allow_no_cuda=True      |
| initialize._initialize_distributed         | builds model-parallel groups only if a GPU exists  | one pretend device, inside   |
| initialize._set_random_seed                | seeds the model-parallel RNG only if a GPU exists  | one pretend device, inside   |
| training.get_model, dist_utils._ddp_wrap   | torch.cuda.Stream / torch.cuda.stream              | null stream, inside          |
| arguments.validate_args (TP > 1)           | queries the GPU architecture                       | report 0 (pre-Blackwell)     |
| training.set_jit_fusion_options            | ~34 s torch.compile warm-up per rank, and random   | skipped                      |
|                                            | draws whose count depends on TP (breaks parity)    |                              |
| core.datasets.utils.compile_helpers        | runs `make`; the wheel ships the built helper but  | skip `make` when the built   |
|                                            | no Makefile                                        | helper imports               |
| transformer.torch_norm.WrappedTorchNorm    | the local spec's norm (no Apex, no Transformer      | builds runtime.norm's        |
| (--sequence-parallel)                      | Engine on CPU) refuses sequence parallelism        | SequenceParallelTorchNorm    |

Applied only when this process's device type is `cpu` (see `hook.py`); `apply()` is idempotent.
"""
from __future__ import annotations

import contextlib
import functools
import os

from ..runtime.device import NullStream
from ..runtime.norm import allow_sequence_parallel_in_torch_norm

_APPLIED = False
_MARK = "_hetauto_cpu_redirect"


@contextlib.contextmanager
def _pretend_one_cuda_device():
    import torch
    saved = torch.cuda.device_count, torch.cuda.set_device
    torch.cuda.device_count = lambda: 1
    torch.cuda.set_device = lambda *a, **k: None
    try:
        yield
    finally:
        torch.cuda.device_count, torch.cuda.set_device = saved


@contextlib.contextmanager
def _null_cuda_streams():
    import torch
    saved = torch.cuda.Stream, torch.cuda.stream, torch.cuda.current_stream
    torch.cuda.Stream = NullStream
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()
    torch.cuda.current_stream = lambda *args, **kwargs: NullStream()
    try:
        yield
    finally:
        torch.cuda.Stream, torch.cuda.stream, torch.cuda.current_stream = saved


def _scoped(fn, ctx):
    if getattr(fn, _MARK, False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with ctx():
            return fn(*args, **kwargs)
    setattr(wrapper, _MARK, True)
    return wrapper


def _compile_helpers_if_missing(orig):
    def compile_helpers():
        try:
            import megatron.core.datasets.helpers_cpp  # noqa: F401  (prebuilt in the wheel)
        except ImportError:
            return orig()
    setattr(compile_helpers, _MARK, True)
    return compile_helpers


def apply() -> None:
    """Install the training-loop redirections in this process (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return
    import megatron.core.datasets.utils as data_utils
    import megatron.training.arguments as arguments
    import megatron.training.initialize as initialize
    import megatron.training.models.dist_utils as dist_utils
    import megatron.training.training as training

    # TP > 1 without a GPU architecture to query: validate_args then only asks for this variable.
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    if not getattr(training.initialize_megatron, _MARK, False):
        wrapped = functools.partial(training.initialize_megatron, allow_no_cuda=True)
        setattr(wrapped, _MARK, True)
        training.initialize_megatron = wrapped
    initialize._initialize_distributed = _scoped(initialize._initialize_distributed, _pretend_one_cuda_device)
    initialize._set_random_seed = _scoped(initialize._set_random_seed, _pretend_one_cuda_device)
    training.get_model = _scoped(training.get_model, _null_cuda_streams)
    dist_utils._ddp_wrap = _scoped(dist_utils._ddp_wrap, _null_cuda_streams)
    arguments.get_device_arch_version = lambda: 0
    training.set_jit_fusion_options = lambda *args, **kwargs: None
    if not getattr(data_utils.compile_helpers, _MARK, False):
        data_utils.compile_helpers = _compile_helpers_if_missing(data_utils.compile_helpers)
    # The same torch norm with its parameters marked for sequence parallelism, as Transformer Engine's are
    # on GPUs: finalize_model_grads then sums their gradients over the TP group.
    allow_sequence_parallel_in_torch_norm()
    _APPLIED = True
