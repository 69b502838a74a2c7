"""The padded vocabulary of a plan: one size every mesh builds.

Megatron pads the embedding table to a multiple of make_vocab_size_divisible_by x TP, and TP differs per mesh, so
the plan pads once, to a size every mesh's multiple divides, and every mesh is told that size (the --hetauto hook
sets it; runtime/model.py builds it). Apart from the per-mesh settings (plan/settings.py) because it is a property of
the whole job, read by the cost model, the simulator and the rewrite alike.
"""
from __future__ import annotations

import math

from ..spec.model import MAKE_VOCAB_SIZE_DIVISIBLE_BY


def padded_vocab_size(vocab_size: int, tps, divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> int:
    """One padded vocabulary for the whole plan: the smallest size >= vocab_size that divisible_by x tp divides
    for every mesh's tp (Megatron pads to one such multiple per job; here each mesh gets the common size).
    E.g. 50257 with TP 1 and TP 2 -> 50432; Megatron alone would pad to 50304 at TP 1 and 50432 at TP 2."""
    step = math.lcm(*(int(divisible_by) * int(tp) for tp in tps))
    return -(-int(vocab_size) // step) * step


def model_padded_vocab_size(model, tps) -> int:
    """padded_vocab_size of a model (spec.model.ModelSpec) with its own divisor (make_vocab_size_divisible_by):
    the table the cost model prices and every mesh builds."""
    return padded_vocab_size(model.vocab_size, tps, model.make_vocab_size_divisible_by)
