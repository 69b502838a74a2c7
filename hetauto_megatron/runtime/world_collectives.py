"""Collectives over the whole world with accelerator tensors: through host memory, on gloo.

A plan's world maps each device type to its own vendor's backend (device.init_backend: `cpu:gloo,cuda:nccl`, with
`npu:hccl` beside an Ascend cluster). A collective on the default group with an accelerator tensor goes to that
vendor's library over every rank of every cluster: the ranks of another vendor's cluster send theirs to their own
library, which never meets it (the job hangs until the backend's timeout), and one vendor's library alone would
still cross the slow links outside the plan's host-staged paths. Megatron-LM's loop issues such collectives on the
default group: the start-time MIN all-reduce and the data flags' broadcast at start, the checkpoint iteration's MAX
at load, the timers' all-gather when they are logged, and every iteration the result validation's any-rank
all-reduce (core/rerun_state_machine.py `_reduce_any`, under Megatron-LM's default `--rerun-mode
validate_results`). Its reductions over hetauto's world gloo group (`pg.mp`) put their scalar on the device too,
which gloo takes from CUDA tensors but from no other vendor's.

`install()` (runtime/rendezvous.py, on an accelerator rank once the world is joined) makes each such collective
copy its tensors to host memory, run on the same group's gloo backend (the world's timeout applies) and copy the
result back into the caller's tensors: the same collective over the same ranks, bit for bit. Collectives on a group
of one cluster (TP, DP, the pipeline's) and point-to-point operations keep their native backend; CPU tensors pass
through (a CPU world, the dry runs). A caller asking for `async_op` gets the collective done and a finished handle.
"""
from __future__ import annotations

import functools
import inspect
import sys

import torch.distributed as dist

# Each wrapped collective of torch.distributed: (its tensor arguments, those it writes into).
STAGED = {
    "all_reduce": (("tensor",), ("tensor",)),
    "broadcast": (("tensor",), ("tensor",)),
    "reduce": (("tensor",), ("tensor",)),
    "all_gather": (("tensor_list", "tensor"), ("tensor_list",)),
    "all_gather_into_tensor": (("output_tensor", "input_tensor"), ("output_tensor",)),
    "all_gather_single": (("output_tensor", "input_tensor"), ("output_tensor",)),
    "_all_gather_base": (("output_tensor", "input_tensor"), ("output_tensor",)),
}
# Module attributes bound to one of those functions when their module was imported (rebind_aliases).
ALIASES = {"megatron.core.timers": ("dist_all_gather_func",)}
# Stage CPU tensors too (copied to fresh host tensors and back): how the tests run this path on CPU processes.
STAGE_CPU = False


class _Finished:
    """The handle of a collective already done (async_op=True on a staged collective)."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True


def spans_clusters(group) -> bool:
    """Whether `group` is the world's default group or a gloo-only group (hetauto's world groups): the groups whose
    accelerator tensors are staged. Groups of one cluster carry its native backend. Asked on every collective of
    the job (the TP all-reduces of every layer too), so each group's answer is kept."""
    if group is None or group is dist.GroupMember.WORLD:
        return True
    known = _SPANS.get(group)
    if known is None:
        try:
            known = str(dist.get_backend(group)) == "gloo"
        except (ValueError, RuntimeError):       # not a group of this rank: torch's own call says so
            known = False
        _SPANS[group] = known
    return known


_SPANS: dict = {}      # group -> spans_clusters(group)


def _flat(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def staged(collective, inputs: tuple, outputs: tuple):
    """`collective` (a torch.distributed function), run on host copies of its tensor arguments `inputs` when its
    group spans clusters and one of them is an accelerator's, the results copied back into `outputs`."""
    signature = inspect.signature(collective)
    group_at = list(signature.parameters).index("group")

    @functools.wraps(collective)
    def run(*args, **kwargs):
        group = kwargs["group"] if "group" in kwargs else args[group_at] if len(args) > group_at else None
        if not spans_clusters(group):           # first, and cheaply: most collectives are a cluster's
            return collective(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        if not any(STAGE_CPU or t.device.type != "cpu" for name in inputs for t in _flat(given[name])):
            return collective(*args, **kwargs)
        mine = {name: _flat(given[name]) for name in outputs}
        host = {name: [t.detach().to("cpu", copy=True) for t in _flat(given[name])] for name in inputs}
        for name in inputs:
            given[name] = host[name] if isinstance(given[name], (list, tuple)) else host[name][0]
        asked_async = given.get("async_op", False)
        given["async_op"] = False
        collective(**given)
        for name in outputs:
            for tensor, copy in zip(mine[name], host[name]):
                tensor.copy_(copy)
        return _Finished() if asked_async else None

    run._hetauto_staged = collective
    return run


def install() -> None:
    """Wrap the collectives of torch.distributed listed in STAGED (once per process), and the aliases Megatron
    bound to them at import."""
    for name, (inputs, outputs) in STAGED.items():
        original = getattr(dist, name, None)
        if original is not None and not hasattr(original, "_hetauto_staged"):
            setattr(dist, name, staged(original, inputs, outputs))
    rebind_aliases()


def rebind_aliases() -> None:
    """Point the module attributes of ALIASES that hold an unwrapped collective at its wrapper (modules imported
    already; a later import binds the wrapper itself)."""
    wrapped = {}       # each function a wrapper stands for (what it wraps, and what that wraps in turn) -> it
    for name in STAGED:
        wrapper = getattr(dist, name, None)
        inner = getattr(wrapper, "_hetauto_staged", None)
        while inner is not None:
            wrapped[inner] = wrapper
            inner = getattr(inner, "__wrapped__", None)
    for module_name, attrs in ALIASES.items():
        module = sys.modules.get(module_name)
        for attr in attrs if module is not None else ():
            value = getattr(module, attr, None)
            if value in wrapped:
                setattr(module, attr, wrapped[value])
