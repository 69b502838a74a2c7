"""What one dry-run rank really holds in memory, read from the tensors (the measured side of cost/memory.py).

- State: the bytes of the weights, the gradient buffer and the optimizer state, from the objects Megatron built:
  the DP buffers' `param_data` (the distributed optimizer keeps the parameters there) or the parameters
  themselves, the buffers' `grad_data` (every parameter's `main_grad`), and every tensor the optimizer holds
  that is not a view of those: fp32 master shards, Adam's moments, fp32 copies of 16-bit gradients. Under
  DeepSpeed's engine, `deepspeed_state_storages` walks whatever optimizer DeepSpeed built instead, and
  `at_every_line_of` with `frame_storages` reads inside a function of it (the tensors its body holds as locals
  between two lines: DeepSpeed's ZeRO step).
- Activations: `SavedTensorMeter` wraps the training step in `torch.autograd.graph.saved_tensors_hooks`, so
  every tensor autograd keeps for a backward pass is seen when it is saved and when autograd lets it go (its
  packed holder is released after the backward that used it). Bytes are counted per unique storage (a view
  such as a chunk of a fused projection's output costs its whole storage once), storages of the state above
  (a linear layer saves its weight) are left out, and the live total is followed through the whole 1F1B
  schedule: its peak is what the in-flight micro-batches hold at once, recomputation included (the hooks stay
  on during the backward pass, where full recomputation re-runs a layer's forward).
- Cross-check: `allocator_peak` runs the same step under torch's profiler with memory profiling and follows
  every CPU allocation and free the step makes: the peak of bytes allocated during the step above its start
  covers the saved activations plus the transients (a gradient being formed, the logits' gradient, the
  buffers a collective allocates). It bounds the saved-tensor peak from above.
"""
from __future__ import annotations

from contextlib import contextmanager


def _nbytes(t) -> int:
    return t.untyped_storage().nbytes()


def state_storages(model, ddp, optimizer) -> dict:
    """{"weights", "gradients", "optimizer"} bytes this rank holds, and the set of their storages' addresses."""
    import torch

    bufs = list(ddp.buffers) + list(getattr(ddp, "expert_parallel_buffers", []))
    if bufs and all(b.param_data is not None for b in bufs):      # distributed optimizer: params live in param_data
        weights = sum(b.param_data.numel() * b.param_data.element_size() for b in bufs)
    else:
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(b.grad_data.numel() * b.grad_data.element_size() for b in bufs)
    owned = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + [b.grad_data for b in bufs]
             + [b.param_data for b in bufs if b.param_data is not None]}
    seen, state = set(), 0
    for inner in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner = getattr(inner, "optimizer", inner)
        tensors = []
        for group in inner.param_groups:
            for p in group["params"]:
                tensors += [p, p.grad] + [v for k, v in inner.state.get(p, {}).items() if k != "step"]
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr in owned or ptr in seen:
                continue
            seen.add(ptr)
            state += _nbytes(t)
    return {"weights": weights, "gradients": grads, "optimizer": state, "_storages": owned | seen}


def deepspeed_state_storages(engine) -> dict:
    """{storage address: (bytes, where)} of every tensor a DeepSpeed engine's weights, gradients and optimizer
    state keep, by unique storage: the module's parameters and their `.grad`, then everything the optimizer
    reaches: its attributes, through lists, tuples, dicts and DeepSpeed's or torch.optim's own objects (not modules
    or the engine), the wrapped torch optimizer's parameters (DeepSpeed's fp32 partitions), their `.grad` and
    Adam's state. `where` is the first attribute path that reached the storage (e.g. "optimizer.ipg_buckets..."),
    so a caller can tell the reduce bucket from the rest. Nothing is assumed about which wrapper runs."""
    import torch

    out: dict = {}
    seen: set = set()

    def add(t, where):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in out:
            out[ptr] = (storage.nbytes(), where)

    def walk(obj, where, depth):
        if depth > 8 or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            add(obj, where)
            if obj.grad is not None:
                add(obj.grad, where + ".grad")
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for item in obj:
                walk(item, where, depth + 1)
        elif isinstance(obj, dict):
            for key, value in obj.items():
                walk(key, where, depth + 1)
                walk(value, f"{where}[{key!r}]" if isinstance(key, (str, int)) else where, depth + 1)
        elif not isinstance(obj, torch.nn.Module) and hasattr(obj, "__dict__") and \
                type(obj).__module__.startswith(("deepspeed", "torch.optim")) and "Engine" not in type(obj).__name__:
            for key, value in vars(obj).items():
                walk(value, f"{where}.{key}", depth + 1)

    for name, p in engine.module.named_parameters():
        add(p, f"module.{name}")
    for name, p in engine.module.named_parameters():
        for attr in ("grad", "grad_accum"):
            g = getattr(p, attr, None)
            if isinstance(g, torch.Tensor):
                add(g, f"module.{name}.{attr}")
    walk(engine.optimizer, "optimizer", 0)
    return out


@contextmanager
def at_every_line_of(function, read):
    """While the block runs, call read(frame) before each line of `function`'s own body (not of what it calls)
    and as it returns, in this thread (sys.settrace): a reading inside a framework's function, where a transient
    lives only between two of its lines (DeepSpeed's ZeRO step holds its flat gradient partition and that
    partition's fp32 copy for one line). `frame_storages` reads the function's local tensors there."""
    import sys

    code = function.__code__

    def local(frame, event, arg):
        if event in ("line", "return"):
            read(frame)
        return local

    def calls(frame, event, arg):
        return local if frame.f_code is code else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        yield
    finally:
        sys.settrace(previous)


def frame_storages(frame) -> dict:
    """{storage address: (bytes, name)} of the tensors a function's frame holds in its local variables (and in
    lists or tuples of them), by unique storage."""
    import torch

    out: dict = {}
    for name, value in frame.f_locals.items():
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage.data_ptr() and storage.data_ptr() not in out:
                    out[storage.data_ptr()] = (storage.nbytes(), f"local {name}")
    return out


class _Held:
    """What autograd keeps instead of a saved tensor while the meter runs; releasing it releases the tensor."""
    __slots__ = ("tensor", "meter", "ptr")

    def __init__(self, tensor, meter, ptr):
        self.tensor, self.meter, self.ptr = tensor, meter, ptr

    def __del__(self):
        self.meter._release(self.ptr)


class SavedTensorMeter:
    """Live bytes of the tensors autograd holds for backward, by unique storage; `peak` over the metered span."""

    def __init__(self, exclude: set):
        self.exclude = exclude
        self.refs: dict = {}          # storage address -> [holders alive, bytes]
        self.live = 0
        self.peak = 0

    def _pack(self, t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.exclude or storage.nbytes() == 0:
            return t
        ref = self.refs.get(ptr)
        if ref is None:
            ref = self.refs[ptr] = [0, storage.nbytes()]
            self.live += ref[1]
            self.peak = max(self.peak, self.live)
        ref[0] += 1
        return _Held(t.detach(), self, ptr)     # detached: the holder must not keep the graph alive

    def hold(self, t):
        """Count a tensor held outside autograd (an overlapped cross-cluster boundary's message posted ahead: the
        memory model's boundary buffers) until the returned handle is dropped; a storage autograd also saves is
        counted once."""
        return self._pack(t)

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Held) else packed

    def _release(self, ptr):
        ref = self.refs.get(ptr)
        if ref is None:
            return
        ref[0] -= 1
        if ref[0] == 0:
            self.live -= ref[1]
            del self.refs[ptr]

    @contextmanager
    def metering(self):
        import torch
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self


def scan_only_what_comes_next() -> None:
    """Leave every object alive now out of later `held_storages` scans (gc.freeze: they move to the collector's
    permanent generation, which neither gc.collect nor gc.get_objects walks). Call it once in a measuring
    process after its imports and before it builds anything a scan must see: a process with DeepSpeed imported
    holds some 200,000 objects of its imports, and a scan over them took 0.17 s against 0.01 s without them."""
    import gc

    gc.collect()
    gc.freeze()


def held_storages(exclude: set) -> dict:
    """{storage address: bytes} of every tensor a Python object holds now (found through the garbage collector's
    objects), less the storages in `exclude`: a framework's own buffers (DeepSpeed's pipe buffers), which the
    saved-tensor hooks do not see. (What autograd saves is held in C++: SavedTensorMeter counts it.) Objects left
    out by `scan_only_what_comes_next` are not seen."""
    import gc
    import time
    import warnings

    import torch

    out = {}
    # A finished collective's tensors are not held either. gloo's worker thread drops its reference to a collective
    # (e.g. the output DeepSpeed's PartitionedTensor.full() gathers into, then copies and lets go) after wait() has
    # returned, and it needs the GIL to free the tensor's Python object: until it gets the GIL, the object looks
    # alive to gc.get_objects with nothing in Python referring to it (tests/test_memory_deepspeed.py's TP 2 run read
    # that 16 KiB buffer in about 1 of 10 runs, 75,044 against 57,344 bytes). Releasing the GIL for 10 ms lets the
    # worker finish (18 of 18 runs of that test passed with the pause, under a load of 13 on 2 cores).
    time.sleep(0.01)
    gc.collect()      # what no live object reaches (a cycle the collector has not run on yet) is not held
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # isinstance on torch's deprecated module-level objects warns
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in tensors:
        try:
            storage = obj.untyped_storage()
        except (RuntimeError, NotImplementedError):      # a tensor without storage (meta, sparse)
            continue
        ptr = storage.data_ptr()
        if ptr and ptr not in exclude:
            out[ptr] = storage.nbytes()
    return out


@contextmanager
def allocator_peak(result: dict, device: str = "cpu"):
    """Profile the block's CPU allocations; on exit result["peak"] = the highest net bytes allocated inside it
    (allocations minus frees, in time order), result["end"] = the net at its end. On an accelerator ("cuda"):
    the caching allocator's own peak of allocated bytes inside the block, above what was allocated at its start."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        try:
            yield result
        finally:
            torch.cuda.synchronize()
            result["peak"] = torch.cuda.max_memory_allocated() - start
            result["end"] = torch.cuda.memory_allocated() - start
        return

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
    older = torch.empty(64)
    with _quiet_stderr():            # the profiler's start and stop notices would drown the dry run's report
        prof.__enter__()
        del older                    # torch warns (once) at the first free of a block older than the profile
    try:
        yield result
    finally:
        with _quiet_stderr():
            prof.__exit__(None, None, None)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
              and e.device_type() == torch.autograd.DeviceType.CPU]
    net = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        net += e.nbytes()
        peak = max(peak, net)
    result["peak"], result["end"] = peak, net


@contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null for the block (native libraries write there directly)."""
    import os
    import sys

    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
