"""The Megatron-LM integration (docs/megatron-integration.md)."""
# The runtime package's import comes first: in a process with no accelerator it defers torch.compile before any
# module here imports Megatron (runtime/lazy_compile.py).
from .. import runtime as _runtime  # noqa: F401
