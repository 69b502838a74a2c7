"""`hetauto`: one entry point, one module per sub-command under hetauto_megatron/commands/.

Each command module defines `add_arguments(parser)`, `run(args) -> int` and optionally `DESCRIPTION` and
`EPILOG` (its --help text); the one-line help is in COMMANDS below. Every command module is imported to build
the parser, so none imports torch, megatron or deepspeed at module level: each does inside `run`, and only
when it needs them, so `hetauto plan` never pays for them.
User mistakes (InputError) print one paragraph and exit 2; an infeasible problem exits 3; Ctrl-C exits 130 and a
stop signal the command turned into StoppedBySignal 128 + its number.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import code_digest, tool_version
from .errors import InfeasibleError, InputError, StoppedBySignal

# (command name, module under hetauto_megatron.commands, one-line help). Order = order in --help.
COMMANDS = [
    ("plan", "plan", "search the best heterogeneous plan for a model on a device inventory"),
    ("simulate", "simulate", "predict time, throughput and memory of a plan or a homogeneous layout"),
    ("explain", "explain", "why this plan: bottleneck, memory headroom, runners-up, what-if sensitivity"),
    ("compare", "compare", "plans side by side: throughput, memory, clusters, cross-cluster bytes, $/1M tokens"),
    ("emit", "emit", "write Megatron arguments / launch commands or DeepSpeed configs for a plan"),
    ("dryrun", "dryrun", "run a plan's real Megatron-Core layout on local CPU processes and check its loss"),
    ("demo", "demo", "the end-to-end tour: plan a LLaMA job on example clusters, then dry-run it"),
    ("profile", "profile", "time transformer operators on the local device for the learned cost model"),
    ("fit", "fit", "fit the learned (LightGBM) cost model from profiles"),
    ("validate-cost-model", "validate_cost_model", "compare cost-model predictions with measurements"),
    ("probe-link", "probe_link", "measure a link's bandwidth and latency through torch.distributed gloo"),
    ("patch-megatron", "patch_megatron", "add --hetauto to a Megatron-LM checkout's pretrain_gpt.py"),
]

EPILOG = """\
typical flow:
  hetauto plan --model llama2-70b --inventory examples/llama/inventory-2clusters.yaml -o plan.yaml
  hetauto simulate --model llama2-70b --inventory examples/llama/inventory-2clusters.yaml --plan plan.yaml \\
      --timeline plan.png
  hetauto explain --plan plan.yaml
  hetauto emit megatron --plan plan.yaml -o launch/
  hetauto plan --model tiny --inventory examples/llama/inventory-cpu-dryrun.yaml --global-batch-size 24 -o tiny.yaml
  hetauto dryrun --plan tiny.yaml --tiny --reference      # a plan small enough for this machine's CPU processes

exit codes: 0 ok, 1 a run that failed (a dryrun rank, probe-link --local's second process), 2 invalid input
(the message names file, field and fix), 3 no feasible plan, 130 stopped by Ctrl-C (143 SIGTERM, 129 SIGHUP).
'hetauto COMMAND --help' explains each command."""


class _Version(argparse.Action):
    """--version: the package's version and the first 12 digits of its code's digest, read only when asked (the
    digest reads every file of the package)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"hetauto {tool_version()} (code {code_digest()[:12]})")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors (a value of the wrong type, a missing or unknown option) end as every other
    invalid input does: usage and the message on stderr with a fix, exit 2, and under --json one error object on
    stdout (sub-parsers are made of the root parser's class)."""
    json_requested = False      # set by main() from its argv: an error is raised before args exist

    def error(self, message):
        self.print_usage(sys.stderr)
        fix = f"see '{self.prog} --help'"
        if _Parser.json_requested:
            import json
            import re
            # "argument --seq-length: invalid int value: 'x'"; "unrecognized arguments: --foo 3" (the first)
            named = re.match(r"argument ([^:/ ]+)", message) or re.match(r"unrecognized arguments: (\S+)", message)
            print(json.dumps({"error": {"kind": "invalid input", "exit_code": 2, "message": f"{message}. Fix: {fix}.",
                                        "file": None, "field": named.group(1) if named else None,
                                        "reason": message, "fix": fix}}))
        self.exit(2, f"{self.prog}: error: {message}. Fix: {fix}.\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hetauto", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Plan and run one Megatron training job across clusters of different accelerators.")
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and the digest of the code "
                        "(every cluster of a job must run the same) and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module, help_text in COMMANDS:
        mod = importlib.import_module(f".commands.{module}", __package__)
        p = sub.add_parser(name, help=help_text, description=getattr(mod, "DESCRIPTION", help_text),
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=getattr(mod, "EPILOG", None))
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command of `argv` (default: this process's command line) and return its exit status. Run on this
    process's own command line (the `hetauto` script, `python -m hetauto_megatron.cli`), a command that joined a
    torch.distributed world (probe-link: runtime/clean_exit.py took charge of the exit) ends the process here, with
    that status, as a Megatron rank ends: its groups destroyed and the atexit handlers run, then no interpreter
    finalisation, in which a gloo thread can abort a command that succeeded (SIGABRT, pytorch#190489). Called with
    a list (from Python), it returns, and a charge of the exit the command took is given up: the caller's process
    is not the command's to end, and torch's C++ log level that dryrun and probe-link set for their own process
    (TORCH_CPP_LOG_LEVEL) is the caller's again, so that processes the caller starts later log as it asked."""
    def in_charge() -> bool:
        clean_exit = sys.modules.get("hetauto_megatron.runtime.clean_exit")     # never imported: no world joined
        return clean_exit is not None and clean_exit.in_charge_of_exit()
    was_in_charge = in_charge()
    log_level = os.environ.get("TORCH_CPP_LOG_LEVEL")
    try:
        code = _run(argv)
    finally:
        if argv is not None and os.environ.get("TORCH_CPP_LOG_LEVEL") != log_level:
            if log_level is None:
                os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
            else:
                os.environ["TORCH_CPP_LOG_LEVEL"] = log_level
    if in_charge() and not was_in_charge:
        from .runtime import clean_exit
        if argv is None:
            clean_exit.end_process(code)
        clean_exit.give_up_charge()
    return code


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    # --json, or an abbreviation argparse takes for it (--jso)
    _Parser.json_requested = any(len(a) >= 4 and "--json".startswith(a)
                                 for a in (sys.argv[1:] if argv is None else argv))
    args, extra = parser.parse_known_args(argv)
    if extra:     # told by the command's own parser: its usage, not the top level's
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except InputError as exc:
        print(f"hetauto {args.command}: error: {exc.message}", file=sys.stderr)
        json_error(args, exc.exit_code, "invalid input", exc.message, file=exc.file, field=exc.field,
                    reason=exc.reason, fix=exc.fix)
        return exc.exit_code
    except InfeasibleError as exc:
        print(f"hetauto {args.command}: no feasible plan: {exc}", file=sys.stderr)
        json_error(args, exc.exit_code, "no feasible plan", str(exc), file=exc.file, field=exc.field,
                   reason=exc.reason, fix=exc.fix)
        return exc.exit_code
    except BrokenPipeError:          # output piped into `head` and friends: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"hetauto {args.command}: interrupted", file=sys.stderr)
        json_error(args, 130, "interrupted", "interrupted (Ctrl-C) before it finished")
        return 130
    except StoppedBySignal as exc:   # (a SystemExit, its paragraph printed: caught, or --json's stdout stays empty)
        json_error(args, exc.code, "interrupted", exc.message)
        return exc.code


def json_error(args, exit_code: int, kind: str, message: str, **parts) -> None:
    """Under --json, the failure as one JSON object on stdout too (the paragraph stays on stderr), so that a
    script reading stdout gets an object, not nothing: {"error": {"kind", "exit_code", "message", and for invalid
    input and no feasible plan "file", "field", "reason", "fix"}} (null where the paragraph names none)."""
    if getattr(args, "json", False):
        import json
        print(json.dumps({"error": {"kind": kind, "exit_code": exit_code, "message": message, **parts}}))


if __name__ == "__main__":
    sys.exit(main())
