"""Operator profiler: times the pieces of a transformer layer on the local device (cuda, npu or cpu).

The grid (measure/grids.py) is made of model-like configurations (hidden size, heads and key/value heads,
FFN width, sequence, micro-batch, TP); each is cut into the operators one TP rank runs (cost/features.py:
`layer_ops`, `head_ops`), and shapes that repeat are measured once. Each operator is timed forward and backward
(gradients of all inputs and weights) after warm-up, over repetitions; rows keep the median, the 10th percentile
and the relative spread ((p90 - p10) / median).

With a layer grid (`--layers`) it times whole transformer layers instead, for model-like shapes: the same
operators chained into one layer in plain PyTorch (at each TP degree), or Megatron-Core's own layer as the CPU
dry runs build it (`--layer-impl megatron`, measure/layer_timing.py). `hetauto fit` learns from them how
operators compose into a layer (cost/learned/composition.py, stage 3); `hetauto validate-cost-model --profile
layers-T.jsonl` checks the planner's layer time against them.

On accelerators, each pass is timed with device events (the stream's own clock, no host synchronisation inside
the interval), on CUDA behind a spin kernel that hides the host's launch path; on CPU with the wall clock.

Output: JSON lines, a header (format, granularity, device type and its datasheet figures, dtype, library
versions, how rows were timed, the grids and seeds profiled into it) then one row per operator or layer. A run
that finds its file already there checks the header matches and skips the rows it holds, so an interrupted
profile resumes where it stopped; one with another grid (or an operator grid's seed) adds that grid's rows and
its name to the header. torch is imported only when timing starts.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

from ..errors import InputError
from ..outputs import make_output_dir, output_errors, write_text_file
from ..spec.devices import DeviceType
from ..cost import features as F
from ..cost.learned import PROFILE_FORMAT, read_profile
from ..cost.learned.profile_merge import holds_grid, profile_grids
from ..runtime.model import causal_mask
from .attention import megatron_local_attention
from .grids import GRIDS, LAYER_GRIDS, granularity, grid_entry, grid_ops, layer_shapes, with_unfused_attention


# ---- timing ---------------------------------------------------------------------------------------------
# Cycles of the spin kernel per second of host launch time to cover: a GPU clock of ~2 GHz; a slower clock only
# makes the spin longer, never too short.
SPIN_CYCLES_PER_S = 2.0e9


class Runner:
    """Builds an operator's inputs once and runs forward / forward+backward on them."""

    def __init__(self, torch, device: str, dtype, unfused_attention: bool = False):
        self.torch, self.device, self.dtype = torch, device, dtype
        self.unfused_attention = unfused_attention     # the layers' attention (features.runs_unfused_attention)
        kind = device.split(":")[0]
        # Accelerators: the device's own events time each pass on its stream (torch.cuda.Event, torch.npu.Event).
        self.backend = getattr(torch, kind) if kind in ("cuda", "npu") else None
        # CUDA: keep the device busy (a spin kernel) while the host enqueues the timed passes, so that the events
        # time the kernels back to back - the device time a training step pays - and not the host's launch path
        # (tens of microseconds per operator, hidden in a real step where the host runs ahead of the device).
        self.spin = None
        if kind == "cuda":
            try:
                torch.cuda._sleep(1000)
                torch.cuda.synchronize()
                self.spin = torch.cuda._sleep
            except Exception:   # a build without the spin kernel: events then include launch gaps
                self.spin = None

    @property
    def timing(self) -> str:
        """How the rows were timed (written into the profile's header)."""
        if self.backend is None:
            return "wall clock"
        return "device events, launch hidden" if self.spin else "device events"

    def sync(self):
        if self.backend is not None:
            self.backend.synchronize()

    def _param(self, *dims):
        """A random tensor that needs its gradient (an input or a weight)."""
        return self.torch.randn(*dims, device=self.device, dtype=self.dtype).mul_(0.1).requires_grad_(True)

    def _rotary_tables(self, rows: int, head_dim: int):
        """(cos, sin) of random angles, [rows, 1, head_dim], for rotating [rows, heads, head_dim] tensors."""
        t = self.torch
        ang = t.randn(rows, 1, head_dim // 2, device=self.device, dtype=t.float32)
        return t.cat([ang.cos(), ang.cos()], -1).to(self.dtype), t.cat([ang.sin(), ang.sin()], -1).to(self.dtype)

    def _rotate(self, x, cos, sin):
        """Rotary embedding over the last dimension (rotate-half form)."""
        half = x.shape[-1] // 2
        return x * cos + self.torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def build(self, op: F.Op):
        """(inputs needing grads, forward function)."""
        t, dev = self.torch, self.device
        nnf = t.nn.functional
        p = self._param
        k = op.kind
        if k == "gemm":
            x, w = p(op.tokens, op.k), p(op.n, op.k)
            return [x, w], lambda: nnf.linear(x, w)
        if k == "attention":
            q = p(op.batch, op.heads, op.seq, op.head_dim)
            kk, v = p(op.batch, op.kv_heads, op.seq, op.head_dim), p(op.batch, op.kv_heads, op.seq, op.head_dim)
            gqa = op.heads != op.kv_heads
            return [q, kk, v], lambda: nnf.scaled_dot_product_attention(q, kk, v, is_causal=True, enable_gqa=gqa)
        if k == "attention_unfused":     # Megatron's layout: [s, b, heads, d]
            q = p(op.seq, op.batch, op.heads, op.head_dim)
            kk, v = p(op.seq, op.batch, op.kv_heads, op.head_dim), p(op.seq, op.batch, op.kv_heads, op.head_dim)
            mask = causal_mask(op.seq, dev)
            return [q, kk, v], lambda: megatron_local_attention(t, q, kk, v, mask)
        if k == "norm":
            x, w = p(op.tokens, op.n), p(op.n)
            return [x, w], lambda: nnf.rms_norm(x, (op.n,), w, 1e-5)
        if k == "rotary":
            x = p(op.tokens, op.heads, op.head_dim)
            cos, sin = self._rotary_tables(op.tokens, op.head_dim)
            return [x], lambda: self._rotate(x, cos, sin)
        if k == "activation":
            if op.gated:
                a, b = p(op.tokens, op.n), p(op.tokens, op.n)
                return [a, b], lambda: nnf.silu(a) * b
            a = p(op.tokens, op.n)
            return [a], lambda: nnf.gelu(a)
        if k == "add":
            a, b = p(op.tokens, op.n), p(op.tokens, op.n)
            return [a, b], lambda: a + b
        if k == "loss":
            logits = p(op.tokens, op.n)
            target = t.randint(0, op.n, (op.tokens,), device=dev)
            return [logits], lambda: nnf.cross_entropy(logits.float(), target)
        if k == "embedding":
            table = p(op.k, op.n)
            ids = t.randint(0, op.k, (op.tokens,), device=dev)
            return [table], lambda: nnf.embedding(ids, table)
        raise ValueError(f"no profiler for operator kind {k}")

    def build_layer(self, shape: F.LayerShape):
        """(inputs and weights needing grads, forward function) of one transformer layer as one TP rank runs
        it: exactly the operators of `features.layer_ops`, chained, so the sum of the operators' predictions
        can be checked against the whole; its attention the one the profile times (`unfused_attention`)."""
        t = self.torch
        nnf = t.nn.functional
        p = self._param
        tp, b, s, h = shape.tp, shape.micro_batch, shape.seq, shape.hidden
        heads, kv, ffn, d = shape.heads // tp, shape.kv_heads // tp, shape.ffn // tp, shape.hidden // shape.heads
        x = p(b * s, h)
        n1, n2 = p(h), p(h)
        w_qkv, w_proj = p((heads + 2 * kv) * d, h), p(h, heads * d)
        w_fc1, w_fc2 = p((2 if shape.gated else 1) * ffn, h), p(h, ffn)
        cos, sin = self._rotary_tables(s, d)
        mask = causal_mask(s, self.device)

        def fwd():
            qkv = nnf.linear(nnf.rms_norm(x, (h,), n1, 1e-5), w_qkv).view(b, s, heads + 2 * kv, d)
            qk, v = qkv[:, :, :heads + kv], qkv[:, :, heads + kv:]
            if shape.rope:
                qk = self._rotate(qk, cos, sin)
            q, k = qk[:, :, :heads], qk[:, :, heads:]
            if self.unfused_attention:    # [b, s, ...] as [s, b, ...] views: the same kernels on these shapes
                a = megatron_local_attention(t, q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), mask)
                a = a.transpose(0, 1)
            else:
                a = nnf.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=True, enable_gqa=heads != kv).transpose(1, 2)
            x1 = x + nnf.linear(a.reshape(b * s, heads * d), w_proj)
            u = nnf.linear(nnf.rms_norm(x1, (h,), n2, 1e-5), w_fc1)
            act = nnf.silu(u[:, :ffn]) * u[:, ffn:] if shape.gated else nnf.gelu(u)
            return x1 + nnf.linear(act, w_fc2)
        return [x, n1, n2, w_qkv, w_proj, w_fc1, w_fc2], fwd

    def time_fn(self, inputs, fwd, *, warmup: int, min_reps: int, max_reps: int, budget_s: float) -> dict:
        """Median / 10th percentile / spread of the forward pass and of the backward pass (gradients of all
        `inputs`), after `warmup` untimed iterations; at least min_reps, then until budget_s or max_reps."""
        t = self.torch
        out = fwd()
        grad = t.ones_like(out)
        for _ in range(warmup):
            out = fwd()
            t.autograd.grad(out, inputs, grad)
        self.sync()
        ft, bt = [], []
        spin = self.spin
        launch_s = 1e-3      # host time to enqueue one repetition, re-measured each time
        start = time.perf_counter()
        while len(ft) < max_reps and (len(ft) < min_reps or time.perf_counter() - start < budget_s):
            if self.backend is not None:
                ev = [self.backend.Event(enable_timing=True) for _ in range(3)]
                if spin is not None:
                    spin(int(min(2.0 * launch_s, 0.05) * SPIN_CYCLES_PER_S))
                h = time.perf_counter()
                ev[0].record()
                out = fwd()
                ev[1].record()
                t.autograd.grad(out, inputs, grad)
                ev[2].record()
                launch_s = time.perf_counter() - h
                ev[2].synchronize()
                ft.append(ev[0].elapsed_time(ev[1]) / 1e3)    # milliseconds -> seconds
                bt.append(ev[1].elapsed_time(ev[2]) / 1e3)
                continue
            a = time.perf_counter()
            out = fwd()
            b = time.perf_counter()
            t.autograd.grad(out, inputs, grad)
            c = time.perf_counter()
            ft.append(b - a)
            bt.append(c - b)
        return {"fwd_s": statistics.median(ft), "bwd_s": statistics.median(bt),
                "fwd_p10_s": _p10(ft), "bwd_p10_s": _p10(bt),
                "fwd_spread": _spread(ft), "bwd_spread": _spread(bt), "reps": len(ft)}


def _p10(xs: list[float]) -> float:
    return sorted(xs)[int(0.1 * (len(xs) - 1))]


def _spread(xs: list[float]) -> float:
    """(p90 - p10) / median."""
    med = statistics.median(xs)
    hi = sorted(xs)[int(round(0.9 * (len(xs) - 1)))]
    return round((hi - _p10(xs)) / med, 4) if med > 0 else 0.0


def _header(device: DeviceType, torch_device: str, dtype_name: str, grid: str, seed: int, torch) -> dict:
    try:
        from importlib.metadata import version
        ours = version("hetauto-megatron")
    except Exception:   # running from a source tree that was never installed
        ours = "source"
    info = {"format": PROFILE_FORMAT, "granularity": granularity(grid), "feature_version": F.FEATURE_VERSION,
            "device_type": device.name,
            "vendor": device.vendor, "peak_tflops": device.peak_tflops, "hbm_gbps": device.hbm_gbps,
            "torch_device": torch_device, "dtype": dtype_name, "dtype_bytes": F.DTYPE_BYTES[dtype_name],
            "grids": [grid_entry(grid, seed)], "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "hetauto": ours, "host_cpu": platform.processor() or platform.machine(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if torch_device.startswith("cuda"):
        info["accelerator"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def default_dtype(device: DeviceType) -> str:
    # CPU dry runs compute in fp32; accelerators train in bf16.
    return "float32" if device.vendor == "cpu" else "bfloat16"


LAYER_IMPLS = ("torch", "megatron")


def layer_attention(layer_impl: str, unfused: bool) -> str:
    """The attention a layer file's layers ran (its header's "attention"): Megatron-Core's layers their local unfused
    one; torch layers the profile's (`unfused`: features.runs_unfused_attention; files written before the field
    timed torch's fused scaled_dot_product_attention)."""
    return "unfused" if layer_impl == "megatron" or unfused else "fused"


def profile(device: DeviceType, out_path: str, *, grid: str, dtype: str | None = None, torch_device: str | None = None,
            warmup: int = 2, min_reps: int = 7, max_reps: int = 100, budget_s: float = 0.15, seed: int = 0,
            threads: int | None = None, layer_impl: str = "torch", progress=None) -> dict:
    """Time the grid's operators (or, for a layer grid, whole layers) into `out_path` (resuming it).
    `layer_impl`: layers built from the profiled operators in plain PyTorch ("torch"), or Megatron-Core's own
    layer as hetauto's runtime builds it ("megatron": CPU, fp32, TP 1). Returns a summary dict."""
    granularity(grid)
    if layer_impl not in LAYER_IMPLS:
        raise InputError(f"unknown layer implementation {layer_impl!r}", field="--layer-impl",
                         fix=f"use one of: {', '.join(LAYER_IMPLS)}")
    if layer_impl == "megatron" and (device.vendor != "cpu" or (dtype or "float32") != "float32"):
        raise InputError("Megatron-Core layers are timed as the CPU dry runs build them (cpu, float32)",
                         field="--layer-impl", fix="profile --device-type cpu, or use --layer-impl torch")
    if layer_impl == "megatron":
        import importlib.util
        if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
            raise InputError("needs Megatron-Core, which this Python cannot import", field="--layer-impl",
                             fix="install the pinned packages (bash scripts/setup.sh) or use --layer-impl torch")
    dtype = dtype or default_dtype(device)
    if dtype not in F.DTYPE_BYTES:
        raise InputError(f"unknown dtype {dtype!r}", field="--dtype", fix=f"use one of: {', '.join(F.DTYPE_BYTES)}")
    torch_device = torch_device or device.torch_device
    import torch
    _check_device(torch, torch_device, device)
    # float32 on a device with TF32 tensor cores: its GEMMs on them, as an fp32 job runs them (Transformer Engine's
    # fp32 GEMMs; spec/devices.py), and the header says so (the learned model keys its rows by that arithmetic)
    tf32 = dtype == "float32" and device.vendor == "nvidia" and device.has_tf32 and device.tf32
    if dtype == "float32" and torch_device.startswith("cuda"):
        from ..runtime.device import set_fp32_gemms
        set_fp32_gemms(tf32)
    if threads is None and torch_device == "cpu":
        # One intra-op thread: each CPU rank of a dry run computes alone, and with several threads a single
        # descheduled thread (a shared machine) stalls the whole GEMM for a scheduler slice (~16 ms).
        threads = 1
    # the caller's intra-op thread count back afterwards: called from Python (cli.main with a list, a notebook),
    # a count left changed would time the caller's later work, and forked ranks, with another team
    threads_before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        done: set[str] = set()
        # the attention Megatron runs on this device in this dtype: unfused ones are timed as their own operator kind
        unfused = F.runs_unfused_attention(device, F.DTYPE_BYTES[dtype])
        runner = Runner(torch, torch_device, getattr(torch, dtype), unfused_attention=unfused)
        header = {**_header(device, torch_device, dtype, grid, seed, torch), "timing": runner.timing, "tf32": tf32}
        if dtype == "float32" and device.vendor != "cpu" and device.peak_tflops_at("fp32") is not None:
            header["peak_tflops"] = device.at_precision("fp32").peak_tflops     # not the 16-bit peak: what fp32 runs at
        if grid in LAYER_GRIDS:
            header["layer_impl"] = layer_impl
            header["attention"] = layer_attention(layer_impl, unfused)
        if os.path.exists(out_path) and os.path.getsize(out_path) > 0:
            old, rows = read_profile(out_path)
            # files written before a field existed hold its first meaning
            defaults = {"granularity": "op", "layer_impl": "torch", "tf32": False,
                        "attention": layer_attention(old.get("layer_impl", "torch"), False)}
            for key in ("granularity", "device_type", "dtype", "torch_device", "tf32") + (
                    ("layer_impl", "attention") if grid in LAYER_GRIDS else ()):
                if old.get(key, defaults.get(key)) != header[key]:
                    raise InputError(f"holds a profile with {key} {old.get(key, defaults.get(key))!r}, this run has "
                                     f"{header[key]!r}",
                                     file=out_path, field=key,
                                     fix="write to another --out directory or delete the file")
            # a CPU row's time depends on the intra-op thread count, so rows timed with another count would mix
            # into the fit unnoticed (accelerator kernels do not depend on it); a header without the field passes
            if torch_device == "cpu" and old.get("threads") not in (None, header["threads"]):
                raise InputError(f"holds a profile timed with threads {old['threads']!r}, this run has "
                                 f"{header['threads']!r}", file=out_path, field="threads",
                                 fix=f"pass the file's thread count (--threads {old['threads']}) to resume it, or "
                                     "write to another --out directory")
            done = {r.get("key") for r in rows}
            grids, entry = profile_grids(old), grid_entry(grid, seed)
            if not holds_grid(grids, entry):     # this run adds another grid's rows: the header says so
                old.pop("grid", None)       # (the single name of a file written before the list)
                _replace_header(out_path, {**old, "grids": grids + [entry]})
        else:
            # before any timing: an --out the system refuses (e.g. under /proc) is named at once
            make_output_dir(os.path.dirname(os.path.abspath(out_path)), "--out")
            write_text_file(out_path, json.dumps(header, sort_keys=True) + "\n", field="--out")
        timing = dict(warmup=warmup, min_reps=min_reps, max_reps=max_reps, budget_s=budget_s)
        # (key, label, row fields, measure) of everything the grid measures
        if grid in LAYER_GRIDS and layer_impl == "megatron":
            from ..runtime.dryrun import preload_megatron
            from .layer_timing import megatron_layer_times
            preload_megatron()   # once, so that each layer's forked process starts with Megatron-Core imported
            items = [(sh.key(), f"{name} b{sh.micro_batch} s{sh.seq}", {"model": name, "layer": sh.to_dict()},
                      lambda sh=sh, name=name: megatron_layer_times(sh, name, timing=timing, threads=threads or 1))
                     for name, sh in layer_shapes(LAYER_GRIDS[grid]) if sh.tp == 1]
        elif grid in LAYER_GRIDS:
            items = [(sh.key(), f"{name} tp{sh.tp} b{sh.micro_batch} s{sh.seq}", {"model": name, "layer": sh.to_dict()},
                      lambda sh=sh: runner.time_fn(*runner.build_layer(sh), **timing))
                     for name, sh in layer_shapes(LAYER_GRIDS[grid])]
        else:
            items = [(op.key(), op.name, {"op": op.to_dict()},
                      lambda op=op: runner.time_fn(*runner.build(op), **timing))
                     for op in with_unfused_attention(grid_ops(GRIDS[grid], seed), unfused)]
        todo = [it for it in items if it[0] not in done]
        torch.manual_seed(seed)
        started = time.perf_counter()
        with torch.inference_mode(False), open(out_path, "a") as fh:
            for i, (key, label, fields, measure) in enumerate(todo, 1):
                res = measure()
                fh.write(json.dumps({"key": key, **fields, **res}, sort_keys=True) + "\n")
                fh.flush()   # a crash loses at most the row being timed
                if progress:
                    elapsed = time.perf_counter() - started
                    progress(i, len(todo), label, res, elapsed / i * (len(todo) - i))
        return {"file": out_path, "device_type": device.name, "grid": grid, "granularity": granularity(grid),
                "operators" if grid in GRIDS else "layers": len(items),
                "measured_now": len(todo), "resumed": len(items) - len(todo),
                "seconds": round(time.perf_counter() - started, 2)}
    finally:
        torch.set_num_threads(threads_before)


def _replace_header(path: str, header: dict) -> None:
    """Write `header` over the first line of the profile at `path`, its rows as they are: into a new file renamed over
    the old one, so that an interruption leaves one of the two whole."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.readlines()
    first = next(i for i, line in enumerate(lines) if line.strip())      # read_profile found the header there
    lines[first] = json.dumps(header, sort_keys=True) + "\n"
    write_text_file(path + ".tmp", "".join(lines), field="--out")
    with output_errors(path, "--out"):
        os.replace(path + ".tmp", path)


def _check_device(torch, torch_device: str, device: DeviceType) -> None:
    kind = torch_device.split(":")[0]
    ok = kind == "cpu" or (kind == "cuda" and torch.cuda.is_available()) or \
        (kind == "npu" and hasattr(torch, "npu") and torch.npu.is_available())
    if not ok:
        raise InputError(f"device type {device.name} runs on '{kind}', which this machine does not have",
                         field="--device-type", fix="run the profile on a machine with that device "
                                                    "(or profile this machine with --device-type cpu)")


def stderr_progress(i: int, n: int, label: str, res: dict, eta_s: float) -> None:
    width = 24
    filled = int(width * i / n)
    line = (f"\rprofile [{'#' * filled}{'.' * (width - filled)}] {i}/{n}  {label:<10} "
            f"fwd {res['fwd_s'] * 1e3:8.3f} ms  bwd {res['bwd_s'] * 1e3:8.3f} ms  eta {eta_s:5.0f} s")
    sys.stderr.write(line if sys.stderr.isatty() else line[1:] + "\n")
    if i == n and sys.stderr.isatty():
        sys.stderr.write("\n")
    sys.stderr.flush()
