"""`hetauto demo`: the end-to-end tour on one machine, every step real."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

DESCRIPTION = """\
The whole product in one command, on this machine (CPU only, a few minutes):

  1. plan LLaMA-2-70B on the example inventory of two clusters (64 H800 + 32 Ascend 910B joined by a
     25 Gbit/s link): the searched plan, its summary, why it is what it is (bottleneck, memory headroom,
     runners-up, sensitivity to links, cluster sizes and batch), its predicted timeline as a picture,
     Megatron launch scripts and DeepSpeed configs;
  2. plan the tiny model on two CPU "clusters" (4 + 2 processes) with the same search, then dry-run
     whatever plan it picks on real Megatron-Core: one process per device of the plan, each mesh with its
     own TP/DP and layers, host-staged inter-cluster transfers, 3 Adam steps; the losses and grad norms must
     match a single-process run of the same model (losses within 1e-5, grad norms within 1e-4 of themselves),
     the measured memory is printed beside the
     predicted, and the measured timeline is drawn under the predicted one;
  3. run Megatron-LM's own training loop (megatron.training.pretrain) with --hetauto on a hand-written
     two-cluster CPU plan (examples/llama/plans/tiny-2clusters-cpu.yaml, uneven stages) and check that its
     losses match Megatron's homogeneous layout of the same stages.

Everything it writes goes to --out (default ./hetauto-demo). Each step is printed as the 'hetauto' command
it runs, so it can be re-run alone."""

EPILOG = """\
examples:
  hetauto demo                                   # all three steps, a few minutes on CPU
  hetauto demo --skip-training --out /tmp/demo   # only the planning step, seconds

exit codes: 0 every step succeeded and the losses matched, 2 invalid options (--out a file), otherwise the
failing step's exit code (1: a run failed or its losses did not match; 128 + N: a step killed by signal N).
SIGTERM or SIGHUP stops the running step (its own handling ends its ranks) and exits 128 + the signal's number
(143, 129); Ctrl-C (130) likewise."""


def add_arguments(parser) -> None:
    parser.add_argument("--out", default="hetauto-demo", metavar="DIR", help="output directory (default ./hetauto-demo)")
    parser.add_argument("--skip-training", action="store_true", help="only the planning step")


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# After the step was sent the signal, how long it has to stop: its own launch gives its ranks STOP_GRACE_S before
# killing them (runtime/launcher.py), and then says so; a step still there after this is killed (its ranks die with
# it: each asked the kernel to).
STEP_STOP_S = 15.0


def _step(title: str, argv: list[str]) -> int:
    print(f"\n=== {title}\n$ hetauto {' '.join(argv)}" if argv[0] != "-m" else f"\n=== {title}\n$ python {' '.join(argv)}",
          flush=True)
    from ..runtime.launcher import StopRequested, catch_stop_signals
    cmd = [sys.executable] + (argv if argv[0] == "-m" else ["-m", "hetauto_megatron.cli"] + argv)
    # Megatron and torch print import-time warnings about optional GPU libraries; they say nothing here.
    env = dict(os.environ, PYTHONWARNINGS="ignore", TORCH_CPP_LOG_LEVEL="ERROR")
    # The step is a process of its own, which a signal sent to the demo's pid alone (kill, timeout, a batch
    # scheduler) does not reach: it kept running, and writing into --out, after the demo had gone. So the stop
    # signals are the launcher's here too (raised as StopRequested), and passed on to the step's process group:
    # its own (process_group=0), which holds the processes it forked (the search's workers, which a signal to the
    # step alone left running, reparented to init), and which a terminal's Ctrl-C reaches through the demo.
    previous = catch_stop_signals()
    proc = None
    try:
        proc = subprocess.Popen(cmd, env=env, process_group=0)
        rc = proc.wait()
    except (StopRequested, KeyboardInterrupt) as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        previous = {}
        if proc is not None:
            _stop(proc, signum)
        if isinstance(exc, KeyboardInterrupt):
            raise               # the CLI's "interrupted", exit 130
        from ..errors import StoppedBySignal
        said = f"stopped by {signal.Signals(signum).name}; its running step was stopped"
        print(f"hetauto demo: {said}", file=sys.stderr, flush=True)
        raise StoppedBySignal(signum, said) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return step_status(rc)


def _stop(proc: subprocess.Popen, signum: int) -> None:
    """Pass `signum` on to the running step's process group and wait for the step to stop, STEP_STOP_S at most,
    then kill the group."""
    for sig in (signum, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:      # (the group is gone)
            pass
        try:
            proc.wait(STEP_STOP_S)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def step_status(rc: int) -> int:
    """The demo's exit status for a step's return code, said on stderr where the step failed: a step killed by a
    signal (subprocess's -N) is the shell's 128 + N, not -N (which exit statuses wrap to 256 - N: 247 for SIGKILL)."""
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
        print(f"hetauto demo: step killed by {name} (exit {128 - rc})", file=sys.stderr)
        return 128 - rc
    if rc:
        print(f"hetauto demo: step failed with exit code {rc}", file=sys.stderr)
    return rc


def run(args) -> int:
    from ..outputs import make_output_dir
    root = _root()
    ex = os.path.join(root, "examples", "llama")
    out = args.out
    make_output_dir(out, "--out")
    big_plan = os.path.join(out, "llama2-70b-plan.yaml")
    tiny_plan = os.path.join(out, "tiny-cpu-plan.yaml")
    steps = [
        ("1/3  Plan LLaMA-2-70B on 64 H800 + 32 Ascend 910B (25 Gbit/s between the sites)",
         ["plan", "--model", "llama2-70b", "--inventory", os.path.join(ex, "inventory-2clusters.yaml"),
          "--global-batch-size", "512", "-o", big_plan, "--emit", os.path.join(out, "launch"), "--explain",
          "--timeline", os.path.join(out, "llama2-70b-timeline.png"),
          "--timeline", os.path.join(out, "llama2-70b-timeline.json")]),
    ]
    if not args.skip_training:
        steps += [
            ("2a/3 Plan the tiny model on two CPU 'clusters' (4 + 2 processes)",
             ["plan", "--model", "tiny", "--inventory", os.path.join(ex, "inventory-cpu-dryrun.yaml"),
              "--global-batch-size", "24", "-o", tiny_plan, "--quiet"]),
            ("2b/3 Dry-run that plan on real Megatron-Core and compare with one process",
             ["dryrun", "--plan", tiny_plan, "--tiny", "--reference",
              "--timeline", os.path.join(out, "tiny-dryrun-timeline.png"), "--compare"]),
            ("3/3  Megatron-LM's training loop with --hetauto on a two-cluster CPU plan",
             ["-m", "hetauto_megatron.megatron.demo", "--plan", os.path.join(ex, "plans", "tiny-2clusters-cpu.yaml"),
              "--log-dir", os.path.join(out, "megatron-logs")]),
        ]
    for title, argv in steps:
        rc = _step(title, argv)
        if rc:
            return rc
    print(f"\nhetauto demo: all steps passed; plans, timelines (.png pictures, .json traces for ui.perfetto.dev), "
          f"launch scripts and DeepSpeed configs are in {out}/")
    return 0
