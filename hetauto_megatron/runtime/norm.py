"""The layer norm of Megatron's local (non-Transformer-Engine) layer spec, with sequence parallelism allowed.

With sequence parallelism each TP rank normalises only its own sequence shard, so the gradient of a norm's
weight (and bias) on one TP rank covers only those positions: the TP ranks' gradients must be summed.
Megatron's `finalize_model_grads` does exactly that for every parameter marked `sequence_parallel = True`;
Transformer Engine's and Apex's norms set the mark, torch's do not, and Megatron's `WrappedTorchNorm` therefore
refuses sequence parallelism outright ("sequence parallel not supported by torch LayerNorm").

`SequenceParallelTorchNorm` builds the same torch module `WrappedTorchNorm` builds (same checks, same class:
LayerNorm, RMSNorm or L2Norm) and marks its parameters with the config's `sequence_parallel`. The numbers are
unchanged; only the gradient bookkeeping Megatron already has is switched on. It serves the dry run's layer
spec (runtime/model.py) and, on CPU ranks, Megatron-LM's own local spec under `--hetauto` (megatron/cpu.py).
"""
from __future__ import annotations


class _WithoutSequenceParallel:
    """A read-only view of a TransformerConfig that reports sequence_parallel=False (the one check we lift)."""

    def __init__(self, config):
        self._config = config

    def __getattr__(self, name):
        return False if name == "sequence_parallel" else getattr(self._config, name)


class SequenceParallelTorchNorm:
    """Drop-in for Megatron's `WrappedTorchNorm` (same constructor) that supports sequence parallelism."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                zero_centered_gamma: bool = False, normalization: str = "LayerNorm"):
        norm = _build_torch_norm(_WithoutSequenceParallel(config), hidden_size, eps, persist_layer_norm,
                                 zero_centered_gamma, normalization)
        for param in norm.parameters():
            # finalize_model_grads all-reduces the gradients of marked parameters over the TP group
            param.sequence_parallel = bool(config.sequence_parallel)
        return norm


def _build_torch_norm(config, hidden_size, eps, persist_layer_norm, zero_centered_gamma, normalization):
    """Megatron's own WrappedTorchNorm construction (its checks and its choice of torch class)."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    build = _ORIGINAL_NEW.get("wrapped") or WrappedTorchNorm.__new__
    return build(WrappedTorchNorm, config, hidden_size, eps, persist_layer_norm, zero_centered_gamma,
                 normalization)


_ORIGINAL_NEW: dict = {}


def allow_sequence_parallel_in_torch_norm() -> None:
    """Make Megatron's `WrappedTorchNorm` itself build `SequenceParallelTorchNorm` (idempotent).

    For code that builds Megatron's local spec on its own (Megatron-LM's `pretrain_gpt.py` under `--hetauto`):
    the spec modules bind `WrappedTorchNorm` under several names at import, and all of them name the one class
    object changed here.
    """
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    if "wrapped" in _ORIGINAL_NEW:
        return
    _ORIGINAL_NEW["wrapped"] = WrappedTorchNorm.__new__

    def __new__(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False, zero_centered_gamma=False,
                normalization="LayerNorm"):
        return SequenceParallelTorchNorm(config, hidden_size, eps, persist_layer_norm, zero_centered_gamma,
                                         normalization)

    WrappedTorchNorm.__new__ = staticmethod(__new__)
