"""The `--hetauto` command-line flags, as a Megatron `extra_args_provider`.

Megatron-LM builds its parser and then lets the entry script add its own arguments through one callable
(`parse_and_validate_args(extra_args_provider=...)`). An entry script may already use that slot (Megatron-LM's
pretrain_gpt.py passes ModelOpt's provider when it is installed), so ours composes with an existing provider
instead of replacing it. It also marks the defaults of Megatron's dropout, layout, timeout and layer-implementation
flags (`ParserDefault`, `ParserDefaultInt`, `ParserDefaultStr`), so the `--hetauto` rewrite can tell a value the user
typed from one the parser filled in. Importing this module costs nothing: no torch, no megatron.
"""
from __future__ import annotations

import argparse
import os
from typing import Callable, Optional

from ..plan.megatron_flags import MEGATRON_ARGS
from ..plan.settings import DROPOUT_KEYS

ArgsProvider = Callable[[argparse.ArgumentParser], argparse.ArgumentParser]

GROUP_TITLE = "hetauto (heterogeneous multi-cluster training)"
# Megatron's attributes of --hidden-dropout and --attention-dropout (plan/megatron_flags.py MEGATRON_ARGS)
DROPOUT_ARGS = tuple(arg for arg, (_, setting) in MEGATRON_ARGS.items() if setting in DROPOUT_KEYS)
# the parallel layout a launch may give, which must then be the plan's (rewrite.check_layout_args)
LAYOUT_ARGS = ("tensor_model_parallel_size", "micro_batch_size", "pipeline_model_parallel_size")
# the layer implementation, which CPU processes set to Megatron's local layers (settings_args.py)
IMPL_ARGS = ("transformer_impl",)
# Megatron's timeout of its process groups: typed, it is the timeout of every wait under --hetauto (timeouts.py)
TIMEOUT_ARGS = ("distributed_timeout_minutes",)


class ParserDefault(float):
    """A dropout as Megatron's parser gives it when the flag is absent: its default (0.1), a float like any other
    to Megatron. Every other setting the plan decides defaults to off or unset, so a given flag shows; a dropout's
    default is not 0, and only this mark tells an absent --hidden-dropout from a typed --hidden-dropout 0.1
    (argparse converts typed values with float(): never a ParserDefault). Read before Megatron validates the
    arguments, then made a plain float again (unmark_parser_defaults)."""

    def __reduce__(self):
        return float, (float(self),)


class ParserDefaultStr(str):
    """--transformer-impl as Megatron's parser gives it when the flag is absent (transformer_engine): only this mark
    tells it from a typed --transformer-impl transformer_engine, which a plan of CPU processes refuses."""

    def __reduce__(self):
        return str, (str(self),)


class ParserDefaultInt(int):
    """A layout degree as Megatron's parser gives it when the flag is absent (TP and PP 1): only this mark tells
    an absent --tensor-model-parallel-size from a typed 1, which must then be the plan's (argparse converts typed
    values with int(): never a ParserDefaultInt)."""

    def __reduce__(self):
        return int, (int(self),)


def mark_parser_defaults(parser: argparse.ArgumentParser) -> None:
    """Make the defaults of Megatron's dropout flags ParserDefault values, those of its layout flags and of
    --distributed-timeout-minutes ParserDefaultInt values and --transformer-impl's a ParserDefaultStr (idempotent;
    a parser without the flags is left as it is)."""
    for action in parser._actions:
        for dests, kind, mark in ((DROPOUT_ARGS, float, ParserDefault),
                                  (LAYOUT_ARGS + TIMEOUT_ARGS, int, ParserDefaultInt),
                                  (IMPL_ARGS, str, ParserDefaultStr)):
            # (exactly the plain type: not a bool, not a value marked already)
            if action.dest in dests and type(action.default) is kind:
                action.default = mark(action.default)
                if kind is str and action.type is not None:
                    # argparse passes a string default through the flag's type when the flag is absent, which
                    # would drop the mark: that conversion keeps it (a typed value arrives as a plain str)
                    action.type = _keeping_mark(action.type)


_PLAIN = {ParserDefault: float, ParserDefaultInt: int, ParserDefaultStr: str}


def unmark_parser_defaults(args) -> None:
    """Every marked default of a parsed namespace made its plain value again, once the marks are read (the --hetauto
    rewrite, timeouts.py): Megatron-LM saves its arguments in each checkpoint and loads them with torch.load's
    weights-only unpickler, which refuses the call to float(), int() or str() a marked value pickles as (measured:
    "Unsupported global: GLOBAL int", then Megatron's "could not load the checkpoint" and an exit on every rank)."""
    for key, value in list(vars(args).items()):
        plain = _PLAIN.get(type(value))
        if plain is not None:
            setattr(args, key, plain(value))


def _keeping_mark(convert):
    def keep(value):
        return value if isinstance(value, ParserDefaultStr) else convert(value)
    keep.__name__ = getattr(convert, "__name__", "convert")   # argparse names it in "invalid <name> value"
    return keep


def add_hetauto_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add --hetauto, --hetauto-plan and --hetauto-cluster to a Megatron parser, and mark its dropout and layout
    defaults (idempotent)."""
    mark_parser_defaults(parser)
    if any(a.dest == "hetauto" for a in parser._actions):
        return parser  # a provider chain may call us twice; argparse would reject the duplicate flags
    g = parser.add_argument_group(GROUP_TITLE)
    g.add_argument("--hetauto", action="store_true",
                   help="run this job as one share of a heterogeneous hetauto plan: every rank rewrites its "
                        "parallel layout (TP, DP, micro-batch, pipeline layout, recompute) from --hetauto-plan "
                        "and hetauto builds the process groups and inter-cluster transfers")
    g.add_argument("--hetauto-plan", type=str, default=None, metavar="PLAN.yaml",
                   help="the plan written by 'hetauto plan' (required with --hetauto)")
    g.add_argument("--hetauto-cluster", type=str, default=os.environ.get("HETAUTO_CLUSTER"), metavar="NAME",
                   help="name of the cluster this process runs on; checked against the plan's mesh for this rank "
                        "(default: $HETAUTO_CLUSTER, which 'hetauto emit megatron' sets)")
    return parser


def hetauto_args_provider(existing: Optional[ArgsProvider] = None) -> ArgsProvider:
    """An extra_args_provider adding the hetauto flags after `existing` (which may be None)."""

    def provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        if existing is not None:
            parser = existing(parser) or parser  # some providers mutate in place and return None
        return add_hetauto_args(parser)

    provider.__name__ = f"hetauto_args_provider({getattr(existing, '__name__', None)})"
    return provider
