"""`hetauto profile`: time transformer operators on this machine's device for the learned cost model."""
from __future__ import annotations

import json
import os

from ..errors import InputError
from ..outputs import json_text, make_output_dir, write_text_file

DESCRIPTION = """\
Time the operators a transformer layer is made of (QKV and output projections, attention core, MLP GEMMs,
SwiGLU/GELU, norms, rotary embedding, residual adds, logits GEMM, cross-entropy, embedding), forward and
backward, over a grid of shapes and TP degrees, on this machine's device (cuda, npu or cpu).

Each operator is warmed up, then repeated; the file keeps the median and the spread. On a GPU each pass is
timed with CUDA events while a spin kernel keeps the GPU busy, so a row is the kernels' device time, not the
host's launch path; on CPU, wall clock. The output is a JSON-lines file DIR/profile-<device type>.jsonl with
the device and library versions in its header. Re-running resumes: rows already in the file are skipped (a file
timed with another dtype or, on cpu, another --threads is refused). Resuming with another --grid or --seed adds
that grid's rows, and the header's "grids" lists every grid and seed the rows come from (a layer grid's shapes do
not depend on --seed: it lists no seed): so two grids of one device reach 'hetauto fit', which takes one operator
profile per device. Feed the file to 'hetauto fit'.

--layers times whole transformer layers instead (the same operators chained, for model-like shapes at each TP
degree) into DIR/layers-<device type>.jsonl. Given to 'hetauto fit' with the operator profile, they teach it
how operators compose into a layer (kept only if that carries over to a model left out); given to
'hetauto validate-cost-model --profile', they check the planner's layer time, learned and analytic."""

EPILOG = """\
examples:
  hetauto profile --device-type cpu --quick                      # ~1-3 minutes on a laptop
  hetauto profile --device-type h800 --out profiles/             # on a GPU node of the H800 cluster
  hetauto fit profiles/profile-h800.jsonl -o cost-model/
  hetauto profile --device-type h800 --layers --out profiles/    # whole layers (half a minute on an H200)
  hetauto fit profiles/profile-h800.jsonl profiles/layers-h800.jsonl -o cost-model/
  hetauto validate-cost-model --cost-model cost-model/ --profile profiles/layers-h800.jsonl

exit codes: 0 ok, 2 invalid options (an unknown device type, a grid of the wrong kind, --out a file, ...)."""


def add_arguments(p):
    p.add_argument("--device-type", required=True, metavar="TYPE", help="catalog device type of this machine's device "
                                                        "(h800, ascend-910b, mi300x, cpu, ...)")
    p.add_argument("--out", default="profiles", metavar="DIR", help="output directory (default: profiles)")
    p.add_argument("--quick", action="store_true", help="a smaller grid: minutes instead of tens of minutes")
    p.add_argument("--layers", action="store_true", help="time whole transformer layers instead of operators "
                                                         "(for the fit's layer composition, and as a check)")
    p.add_argument("--layer-impl", default="torch", choices=("torch", "megatron"),
                   help="with --layers: 'torch' chains the profiled operators in plain PyTorch (any device); "
                        "'megatron' times Megatron-Core's own layer as the CPU dry runs build it (cpu, float32, "
                        "TP 1), so the fit composes operators into what a Megatron job runs (default: torch)")
    p.add_argument("--grid", default=None, help="grid by name (operators: tiny, quick-cpu, full-cpu, quick-gpu, "
                                                "full-gpu; layers: layers-tiny, layers-cpu, layers-gpu); default: "
                                                "picked from the device type, --quick and --layers")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bfloat16 on "
                                                 "accelerators, float32 on cpu). float32 on a device with TF32 "
                                                 "tensor cores times the GEMMs on them, as an fp32 job runs them, "
                                                 "and the file's header says tf32: true")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU intra-op threads (default 1 on cpu)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the grid's random shapes and of the input tensors (default 0)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.add_argument("--overheads", action="store_true",
                   help="measure the runtime memory overheads instead (context, collective buffers, workspace, "
                        "allocator fragmentation; spec/overheads.py) into overheads-TYPE.json, which an inventory "
                        "cluster's 'overheads:' gives the memory model: needs the device (a GPU or an Ascend NPU); "
                        "the collective buffers only under torchrun with 2+ ranks")


def run(args) -> int:
    from ..spec.devices import get_device
    from ..measure.grids import GRIDS, LAYER_GRIDS, granularity, grid_name
    from ..measure.profile import profile, stderr_progress
    device = get_device(args.device_type, field="--device-type")
    if args.overheads:
        # the grid's options time operators or layers, which --overheads does not: taken, they did nothing
        unread = [flag for flag, given in (("--quick", args.quick), ("--layers", args.layers),
                                           ("--layer-impl", args.layer_impl != "torch"), ("--grid", args.grid),
                                           ("--dtype", args.dtype), ("--threads", args.threads is not None),
                                           ("--seed", args.seed != 0)) if given]
        if unread:
            raise InputError(f"measures memory overheads, not timings: {', '.join(unread)} would do nothing",
                             field="--overheads", fix=f"drop {', '.join(unread)}, or profile timings without "
                             "--overheads")
        return _overheads(args, device)
    grid = args.grid or grid_name(device, args.quick, args.layers)
    gran = granularity(grid)
    if args.layers and gran != "layer":
        raise InputError(f"{grid} is an operator grid, --layers times layers", field="--grid",
                         fix=f"drop --layers, or pick a layer grid: {', '.join(LAYER_GRIDS)}")
    if gran == "layer" and not args.layers:     # a grid never changes what is timed behind the user's back
        raise InputError(f"{grid} is a layer grid, and without --layers profile times operators", field="--grid",
                         fix=f"add --layers to time whole layers, or pick an operator grid: {', '.join(GRIDS)}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if args.threads is not None and not 1 <= args.threads <= cores:
        # more threads than cores time the scheduler, not the device (and 100,000 crashed the process)
        raise InputError(f"must be 1 to {cores}, the cores this process may use, got {args.threads}",
                         field="--threads", fix=f"give --threads 1 to {cores} (default 1 on cpu)")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise InputError("exists and is not a directory", file=args.out, field="--out",
                         fix="pass a directory (it is created when missing)")
    stem = "layers" if gran == "layer" else "profile"
    out = os.path.join(args.out, f"{stem}-{device.name}.jsonl")
    if args.layer_impl != "torch" and gran != "layer":
        raise InputError("only applies to whole layers", field="--layer-impl", fix="add --layers, or drop it")
    summary = profile(device, out, grid=grid, dtype=args.dtype, seed=args.seed, threads=args.threads,
                      layer_impl=args.layer_impl, progress=stderr_progress)
    if args.json:
        print(json_text(summary, indent=1))
    else:
        what = "operators" if "operators" in summary else "layers"
        print(f"{summary['file']}: {summary[what]} {what} ({summary['measured_now']} measured now, "
              f"{summary['resumed']} kept from before) in {summary['seconds']} s")
    return 0


def _overheads(args, device) -> int:
    """`--overheads`: measure them on this machine's accelerator and write overheads-<type>.json."""
    from ..measure.overheads import accelerator_at_hand, measure_overheads
    if device.vendor == "cpu":      # CPU processes hold no accelerator context, collective buffers or allocator pool
        raise InputError("CPU processes have no accelerator overheads to measure (their memory is the dry run's, "
                         "measured by 'hetauto dryrun')", field="--overheads",
                         fix="profile --overheads with an accelerator's --device-type, on a machine that has it")
    if not accelerator_at_hand(device.vendor):
        raise InputError(f"measuring runtime overheads needs a {device.name} ({device.vendor}) device, and this "
                         "machine has none that torch can use", field="--overheads",
                         fix="run it on a machine with the device (one process per device, alone on it)")
    result = {"device_type": device.name, **measure_overheads(device.vendor)}
    make_output_dir(args.out, "--out")
    path = write_text_file(os.path.join(args.out, f"overheads-{device.name}.json"), json_text(result, indent=1),
                           field="--out")
    comm = "not measured (one rank)" if result["comm_gib"] is None else f"{result['comm_gib']:.2f} GiB"
    print(json_text(result, indent=1) if args.json else
          f"{path}: context {result['context_gib']:.2f} GiB, workspace {result['workspace_gib']:.2f} GiB, "
          f"collective buffers {comm}, fragmentation {result['fragmentation']:.1%}")
    return 0
