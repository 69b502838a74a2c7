"""torch.compile deferred to the first call in processes with no accelerator, so that importing Megatron-Core does
not import TorchDynamo and Inductor for kernels a CPU run never calls.

Megatron-Core applies torch.compile at import time: `megatron.core.jit` makes it the JIT fuser of some forty fused
kernels (bias + GeLU, bias + SwiGLU, bias + dropout + add, rotary embeddings, cross entropy, ...), and the MoE
router decorates a method with it. torch.compile builds its wrapper eagerly, which imports TorchDynamo and Inductor:
about 2 s of every process's start-up (measured with megatron-core 0.19.2 and torch 2.13 on a 2-core machine:
`import megatron.training` and the GPT model took 5.2 s, 3.3 s with torch.compile deferred), paid by every rank of a
CPU dry run, where none of those kernels runs: a CPU process's launch turns every fusion off by flag
(plan/megatron_flags.py CPU_LAYER_ARGS), skips Megatron's torch.compile warm-up (megatron/cpu.py), and builds a
dense model.

So in a process with no accelerator (runtime/device.py has_accelerator, the test the --hetauto hook makes before
it turns on the CPU redirections), torch.compile is replaced, as Megatron-Core is first imported, by one that
returns a function calling the real torch.compile on its first call: what runs is unchanged (torch.compile itself
compiles at the first call), a module is still compiled at once, and only the import is saved. A process with an
accelerator is left exactly as it is. Installed by the runtime package's import, which comes before Megatron's in
every entry point hetauto has (the patched pretrain_gpt.py imports the hook first); where Megatron-Core was
imported already, nothing changes.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys

MEGATRON_CORE = "megatron.core"


def deferred(compile_):
    """torch.compile (`compile_`) with each function's compilation made at its first call."""

    @functools.wraps(compile_)
    def compile_later(model=None, **options):
        if model is None:                         # @torch.compile(mode=...): the decorator
            return lambda fn: compile_later(fn, **options)
        import torch
        if isinstance(model, torch.nn.Module) or not callable(model):
            return compile_(model, **options)     # a module's compiled copy is another object: made now
        compiled = []

        @functools.wraps(model)
        def first_call_compiles(*args, **kwargs):
            if not compiled:
                compiled.append(compile_(model, **options))
            return compiled[0](*args, **kwargs)
        return first_call_compiles
    compile_later.hetauto_deferred = True
    return compile_later


def defer_without_accelerator() -> None:
    """Replace torch.compile by `deferred(torch.compile)` in this process when it has no accelerator."""
    import torch

    from .device import has_accelerator
    if not getattr(torch.compile, "hetauto_deferred", False) and not has_accelerator():
        torch.compile = deferred(torch.compile)


class _BeforeMegatronCore(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for `megatron.core` it lends the usual spec a loader that first defers torch.compile
    (defer_without_accelerator). Leaves sys.meta_path at its first use."""

    def find_spec(self, name, path, target=None):
        if name != MEGATRON_CORE:
            return None
        uninstall()
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            defer_without_accelerator()
            run(module)
        spec.loader.exec_module = exec_module
        return spec


_FINDER = _BeforeMegatronCore()


def install() -> None:
    """Idempotent, torch-free; nothing to do once Megatron-Core is imported."""
    if MEGATRON_CORE not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
