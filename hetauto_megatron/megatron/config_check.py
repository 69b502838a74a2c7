"""Megatron-Core's TransformerConfig, built from a launch's rewritten and validated arguments before its ranks join
the world.

Megatron-LM's validate_args does not check everything: Megatron-Core's TransformerConfig (built from the arguments
by core_transformer_config_from_args, megatron/training/argument_utils.py) refuses more combinations in its
__post_init__ with a ValueError or an AssertionError, e.g. --use-te-activation-func on a gated MLP whose fused
bias-SwiGLU is on (what the plan prices on a mesh of accelerators: fusion_args.py), or --symmetric-ar-type without
Transformer Engine 2.3. The entry script first builds that config in pretrain(), after every rank joined the world
(hook.pretrain_kwargs builds it for the communicator), where the user got Megatron's traceback on every rank. Built
once more right after validate_args, its refusal is one paragraph (exit 2) before any rank waits for another.

Building it changes nothing a later build would not: the builder only reads the arguments, and __post_init__ sets
fields of the new config, warns (Python shows each warning once, so the later builds stay quiet) and appends to two
list arguments only what it would append at every build ('moe' to recompute_modules with --moe-layer-recompute,
the MoE router's modules to cuda_graph_modules; features the rewrite refuses anyway: unpriced.py).
"""
from __future__ import annotations

import linecache
import os
import re
import traceback

from ..errors import InputError, first_line
from ..plan.plan import Plan

# where Megatron raises while it builds the config: the builder and the config classes' __post_init__
_CONFIG_SOURCES = ("megatron/training/argument_utils.py", "megatron/core/transformer/",
                   "megatron/core/model_parallel_config.py")


def check_transformer_config(args, plan: Plan, argv: list[str], *, file: str | None = None) -> None:
    """Build Megatron-Core's TransformerConfig from `args` (validated) as the entry script will; its refusal of the
    launch is an InputError naming the flags of `argv` (the launch's command line) that it names."""
    from megatron.training.arguments import core_transformer_config_from_args

    try:
        core_transformer_config_from_args(args)
    except (ValueError, AssertionError) as exc:
        if not _raised_by_config(exc):
            raise
        raise config_refusal(_reason(exc), _names_in(exc), argv, plan, file=file) from None


def config_refusal(reason: str, names: list[str], argv: list[str], plan: Plan, *,
                   file: str | None = None) -> InputError:
    """The paragraph for Megatron-Core's refusal `reason`: the flags of the launch (`argv`) among the argument
    names the refusal points at (`names`: its message and the condition it stands under), or, where none of them
    was typed, Megatron's message with the launch's Megatron-LM flags to correct (pure)."""
    said = f"Megatron-Core's TransformerConfig (core_transformer_config_from_args) refused this launch: {reason}"
    flags = [flag for flag in dict.fromkeys("--" + name.replace("_", "-") for name in names) if _typed(flag, argv)]
    if "--use-te-activation-func" in flags and "bias_activation_fusion" in names and plan.model.gated_mlp:
        return InputError(said.rstrip(".") + "; the plan prices Megatron's fused bias-SwiGLU kernel on a mesh of "
                          "accelerators (--bias-swiglu-fusion), which Transformer Engine's activation function "
                          "would replace",
                          file=file, field="--use-te-activation-func",
                          fix="remove --use-te-activation-func (the plan's fused bias-SwiGLU then runs; "
                              "--no-bias-swiglu-fusion is refused, since the plan priced the fusion)")
    if flags:
        return InputError(said, file=file, field=flags[0], fix="remove " + ", ".join(flags))
    return InputError(said, fix="correct the launch's Megatron-LM flags that it names, or install what it asks for "
                                "on this machine (Megatron-LM's validate_args let them through; the config that "
                                "builds the model refuses them)")


def _typed(flag: str, argv: list[str]) -> bool:
    return any(word == flag or word.startswith(flag + "=") for word in argv)


def _raised_by_config(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    where = frames[-1].filename.replace(os.sep, "/") if frames else ""
    return any(source in where for source in _CONFIG_SOURCES)


def _reason(exc: BaseException) -> str:
    if str(exc).strip():
        return first_line(exc)
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return f"`{(where.line or 'assert').strip()}` ({where.filename.split('site-packages/')[-1]}, line {where.lineno})"


def _names_in(exc: BaseException) -> list[str]:
    """The argument names a refusal points at: the identifiers of its message (`bias_activation_fusion and
    use_te_activation_func cannot be both true`) and of the `if self.X` it is raised under (`if
    self.symmetric_ar_type is not None:` above an assertion that speaks of 'symmetric memory all reduce')."""
    where = traceback.extract_tb(exc.__traceback__)[-1]
    text = str(exc) + " " + (where.line or "") + " " + _enclosing_condition(where.filename, where.lineno)
    return re.findall(r"(?:self\.)?\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b", text)


def _enclosing_condition(filename: str, lineno: int) -> str:
    """The nearest line above `lineno` indented less than it (the `if` a raise or an assert stands under)."""
    line = linecache.getline(filename, lineno)
    indent = len(line) - len(line.lstrip())
    for above in range(lineno - 1, max(lineno - 40, 0), -1):
        text = linecache.getline(filename, above)
        if text.strip() and len(text) - len(text.lstrip()) < indent:
            return text.strip() if text.strip().startswith(("if ", "elif ")) else ""
    return ""
