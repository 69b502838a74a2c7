"""A frozen dataclass's hash, computed once.

The planner keys its caches (stage profiles, memory terms, cap tables) by frozen dataclasses such as the model
and the runtime settings, and hashes them many thousand times per search; the generated __hash__ rebuilds and
hashes the tuple of every field each time. Assigning `__hash__ = cached_hash` in the class body keeps the same
value (the hash of the fields' tuple, which the generated one is too) but computes it on first use only. The
fields never change (frozen), so neither does the hash; equality is still the dataclass's own.
"""
from __future__ import annotations

import dataclasses


def cached_hash(self) -> int:
    h = self.__dict__.get("_cached_hash")
    if h is None:
        h = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
        object.__setattr__(self, "_cached_hash", h)
    return h
