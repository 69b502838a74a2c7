"""What Megatron-LM reads to train besides the model, under --hetauto: the training data and its index cache, the
tokenizer and its files, the checkpoint directory, Weights & Biases logging, ADLR's autoresume, the learning rate
and the run's length. Megatron checks them late, each a traceback there: once every rank of every cluster has
initialised (the tokenizer, wandb), or has built the model and the optimizer (the data, the scheduler, the first
save). Here they are one paragraph (exit 2):

- `check_training_args`, at the argument stage (rewrite.rewrite_args), on every rank before anything is built:
  what the launch must give, the tokenizer's files and the --save directory, which every rank reads or writes on
  its own machine, the library of --adlr-autoresume, and on the job's last rank what --wandb-project needs;
- `check_tokenizer_when_built` and `check_data_when_built`, where Megatron builds them: its own failures there
  (an assertion, a file not found, a tokenizer's package missing, a cache it cannot write) said with its words,
  naming the flag; before Megatron's build of the data, each cluster's index cache (data_cache.py). Only some
  ranks read data (each pipeline's first and last stage, tensor-parallel rank 0: pretrain_gpt.py
  is_dataset_built_on_rank), so a data prefix missing on one machine is found where it is read; the rank's refusal
  then stops the others (world_store.py).
"""
from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys

from ..errors import InputError, first_line
from ..plan.plan import Plan
from .script_guard import assertion_text

# Megatron-LM's flags that name a dataset (training/utils get_blend_and_blend_per_split reads them)
_DATA_ARGS = ("data_path", "data_args_path", "train_data_path", "valid_data_path", "test_data_path",
              "per_split_data_args_path")

# The files each --tokenizer-type reads (Megatron-Core 0.19 tokenizers/utils/build_tokenizer.py): every rank builds
# the tokenizer in initialize_megatron, so each must be on every machine of the job. GPT2BPETokenizer without its
# files downloads GPT-2's; HuggingFaceTokenizer's --tokenizer-model may name a model of the hub instead of a path,
# so only one written as a path (absolute, ./, ../, ~) is checked.
_TOKENIZER_FILES = {
    "GPT2BPETokenizer": ("vocab_file", "merge_file"),
    "BertWordPieceLowerCase": ("vocab_file",),
    "BertWordPieceCase": ("vocab_file",),
    "SentencePieceTokenizer": ("tokenizer_model",),
    "GPTSentencePieceTokenizer": ("tokenizer_model",),
    "Llama2Tokenizer": ("tokenizer_model",),
    "TikTokenizer": ("tokenizer_model",),
    "HuggingFaceTokenizer": ("vocab_file", "merge_file", "tokenizer_model"),
}
_HUB_OR_PATH = ("HuggingFaceTokenizer",)
# The Python package each --tokenizer-type is built with (Megatron-Core 0.19 tokenizers/text/libraries: GPT-2's and
# BERT's through HuggingFace's AutoTokenizer); Megatron imports it only if present and fails once it builds one
# ("NameError: name 'AutoTokenizer' is not defined", "sentencepiece library should be installed."): said where it
# fails (check_tokenizer_when_built), after Megatron's own checks of the tokenizer's arguments
_TOKENIZER_PACKAGE = {
    "GPT2BPETokenizer": "transformers", "BertWordPieceLowerCase": "transformers", "BertWordPieceCase": "transformers",
    "HuggingFaceTokenizer": "transformers", "SFTTokenizer": "transformers",
    "SentencePieceTokenizer": "sentencepiece", "GPTSentencePieceTokenizer": "sentencepiece",
    "Llama2Tokenizer": "sentencepiece", "TikTokenizer": "tiktoken",
}


def check_training_args(args, plan: Plan, rank: int) -> None:
    """A launch that names no dataset and no --mock-data (Megatron's dataset builder stops on GPTDataset with a path
    of None; the emitted launch scripts pass the data arguments through, so forgetting them is easy; Megatron's SFT
    dataset reads its own and is left to it), NullTokenizer (mock data's usual tokenizer) without --vocab-size, no
    --lr (Megatron has no default), neither --train-iters nor --train-samples, a tokenizer file this machine
    does not have, a --save directory it cannot write, the library --adlr-autoresume needs, and on the job's last
    rank (`rank`, global) what --wandb-project needs."""
    if getattr(args, "lr", 0) is None:
        raise InputError("the launch gives no --lr: Megatron-LM has no default learning rate", field="--lr",
                         fix="add --lr (the peak learning rate), with --min-lr and --lr-decay-style as the run needs")
    if getattr(args, "train_iters", 0) is None and getattr(args, "train_samples", 0) is None:
        raise InputError("the launch gives neither --train-iters nor --train-samples: Megatron-LM cannot tell how "
                         "long to train", field="--train-iters", fix="add --train-iters N (or --train-samples N)")
    if getattr(args, "tokenizer_type", None) == "NullTokenizer" and getattr(args, "vocab_size", None) is None:
        raise InputError("--tokenizer-type NullTokenizer takes its vocabulary size from --vocab-size, which the launch "
                         "does not give", field="--vocab-size",
                         fix=f"add --vocab-size {plan.model.vocab_size} (the plan's model)")
    check_tokenizer_files(args)
    check_save_dir(args)
    check_autoresume(args)
    if rank == plan.world_size - 1:
        check_wandb(args, plan)
    if getattr(args, "mock_data", False) or getattr(args, "sft", False):
        return
    if not any(getattr(args, arg, None) for arg in _DATA_ARGS):
        raise InputError("the launch names no training data: none of --data-path, --data-args-path, "
                         "--train-data-path, --per-split-data-args-path, and not --mock-data", field="--data-path",
                         fix="add --data-path PREFIX [PREFIX ...] to the command (the launch scripts of 'hetauto emit "
                             "megatron' pass it to Megatron: bash launch/<cluster>.sh --data-path ...), or "
                             "--mock-data for synthetic tokens")


def check_tokenizer_files(args) -> None:
    """Each file the launch's --tokenizer-type reads exists on this machine (a SentencePiece model Megatron could
    not find was "ValueError: tokenizer_path: ... is invalid" on every rank, once all had initialised)."""
    kind = getattr(args, "tokenizer_type", None)
    for arg in _TOKENIZER_FILES.get(kind, ()):
        path = getattr(args, arg, None)
        if not isinstance(path, str) or not path:
            continue
        if kind in _HUB_OR_PATH and arg == "tokenizer_model" and not path.startswith(("/", "./", "../", "~")):
            continue
        found = os.path.expanduser(path)
        if os.path.isfile(found) or (kind in _HUB_OR_PATH and os.path.isdir(found)):
            continue
        flag = _flag(arg)
        what = "is a directory, not a file" if os.path.isdir(found) else "does not exist"
        raise InputError(f"{flag} {path} {what} on this machine ({socket.gethostname()}); --tokenizer-type {kind} "
                         "reads it, and every rank of the job builds the tokenizer on its own machine",
                         field=flag, fix=f"give {flag} the file's path as this machine sees it (every cluster's "
                                         "machines need the file, at the path the launch gives)")


def _installed(package: str) -> bool:
    """Whether `package` can be imported here, without importing it (transformers takes seconds)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):   # a parent missing, or an import blocked (None in sys.modules)
        return False


def check_save_dir(args) -> None:
    """--save is a directory this machine can write, or can create: every rank writes its part of each checkpoint
    there, and Megatron-LM first tries when it saves, so a path under a file or on a read-only mount trained until
    --save-interval (or the end of the run) and then stopped every rank with a traceback, the iterations since the
    last checkpoint lost. A path of object storage (scheme://) is left to Megatron."""
    path = getattr(args, "save", None)
    if not isinstance(path, str) or not path or "://" in path:
        return
    probe = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)          # the nearest part that exists: Megatron creates the rest
    if os.path.isdir(probe) and os.access(probe, os.W_OK | os.X_OK):
        return
    what = (f"{probe} is a file, not a directory" if not os.path.isdir(probe) else
            f"this process cannot write {probe} (its permissions, or a read-only file system)")
    raise InputError(f"--save {path}: {what} on this machine ({socket.gethostname()}); every rank writes its part "
                     "of each checkpoint there, and Megatron-LM would find out only at the first save, after "
                     "training until then", field="--save",
                     fix="give --save a directory each machine of the job can write (it is created if missing)")


def check_autoresume(args) -> None:
    """--adlr-autoresume: every rank imports userlib.auto_resume as Megatron-LM initialises, from the Python path
    with $SUBMIT_SCRIPTS (else the current directory) appended (training/global_vars.py _set_adlr_autoresume).
    Without it Megatron printed "ADLR autoresume is not available, exiting ..." on rank 0 and called sys.exit() on
    every rank: the job ended with exit code 0, untrained, and the launch reported success."""
    if not getattr(args, "adlr_autoresume", False) or _autoresume_found():
        return
    where = os.environ.get("SUBMIT_SCRIPTS")
    place = f"$SUBMIT_SCRIPTS ({where})" if where else f"the current directory ({os.getcwd()}; $SUBMIT_SCRIPTS unset)"
    raise InputError(f"--adlr-autoresume imports the module userlib.auto_resume on every rank, and this machine "
                     f"({socket.gethostname()}) has it neither on the Python path nor under {place}; Megatron-LM "
                     "would end the job at once with exit code 0, untrained", field="--adlr-autoresume",
                     fix="set SUBMIT_SCRIPTS to the directory that holds userlib/auto_resume.py on every machine of "
                         "the job, or drop --adlr-autoresume")


def _autoresume_found() -> bool:
    """Whether `from userlib.auto_resume import AutoResume` finds its module as Megatron-LM looks for it, without
    importing it (nor the package userlib)."""
    from importlib.machinery import PathFinder
    package = PathFinder.find_spec("userlib", [*sys.path, os.environ.get("SUBMIT_SCRIPTS", ".")])
    if package is None or not package.submodule_search_locations:
        return False
    return PathFinder.find_spec("userlib.auto_resume", list(package.submodule_search_locations)) is not None


def check_wandb(args, plan: Plan) -> None:
    """--wandb-project: the job's last rank (global rank world size - 1) logs to Weights & Biases; Megatron-LM
    imports wandb there as it initialises, and writes its files under --wandb-save-dir, else --save/wandb
    (training/global_vars.py _set_wandb_writer). Without the package it was a ModuleNotFoundError traceback on that
    rank, without either directory a TypeError (os.path.join of None), once every rank had started."""
    if not getattr(args, "wandb_project", None):
        return
    if not getattr(args, "wandb_save_dir", None) and not getattr(args, "save", None):
        raise InputError("--wandb-project logs to Weights & Biases from the job's last rank, into --wandb-save-dir "
                         "or else --save/wandb, and the launch gives neither directory", field="--wandb-save-dir",
                         fix="add --wandb-save-dir DIR (or --save DIR), or drop --wandb-project")
    if not _installed("wandb"):
        raise InputError(f"--wandb-project logs to Weights & Biases from the job's last rank (global rank "
                         f"{plan.world_size - 1}, this process on {socket.gethostname()}), and its Python environment "
                         "has no wandb package", field="--wandb-project",
                         fix="install it there (pip install wandb) or drop --wandb-project")


def check_tokenizer_when_built(plan: Plan, file: str) -> None:
    """Megatron builds its tokenizer after validation (initialize_megatron), on every rank: check its vocabulary
    against the plan's there (model_checks.check_tokenizer_vocab), before any layer indexes the table. Megatron's
    own assertions on the tokenizer's arguments are one paragraph too."""
    import megatron.training.global_vars as global_vars

    from . import model_checks

    build = getattr(global_vars.build_tokenizer, "_hetauto_original", global_vars.build_tokenizer)

    def checked(args, **kwargs):
        kind = getattr(args, "tokenizer_type", None)
        try:
            tokenizer = build(args, **kwargs)
        except AssertionError as exc:      # Megatron's check of the tokenizer's arguments ("Tokenizer path must ...")
            raise InputError(f"Megatron-LM could not build the tokenizer (--tokenizer-type {kind}): "
                             f"{assertion_text(exc)}", field="--tokenizer-type",
                             fix="give the tokenizer's files (--tokenizer-model for HuggingFaceTokenizer and "
                                 "SentencePiece, --vocab-file and --merge-file for GPT2BPETokenizer), or "
                                 f"--tokenizer-type NullTokenizer --vocab-size {plan.model.vocab_size} with "
                                 "--mock-data") from None
        except Exception as exc:            # noqa: BLE001  (re-raised unless the tokenizer's package is missing)
            package = _TOKENIZER_PACKAGE.get(kind)
            if not package or _installed(package):
                raise
            raise InputError(f"Megatron-LM could not build the tokenizer (--tokenizer-type {kind}: "
                             f"{first_line(exc)}): it is built with the Python package {package}, which the "
                             f"environment of this rank lacks (on {socket.gethostname()})", field="--tokenizer-type",
                             fix=f"install it (pip install {package}) in the environment every cluster's ranks run "
                                 f"in, or use --tokenizer-type NullTokenizer --vocab-size {plan.model.vocab_size} "
                                 "with --mock-data for synthetic tokens") from None
        model_checks.check_tokenizer_vocab(getattr(tokenizer, "vocab_size", None), plan, file=file)
        return tokenizer

    checked._hetauto_original = build
    global_vars.build_tokenizer = checked


def check_data_when_built(plan: Plan, rank: int) -> None:
    """Megatron-LM builds the datasets once the model and the optimizer are built, on the ranks that read data:
    first their index cache on each cluster (data_cache.py), then its failures on the launch's data arguments
    (IndexedDataset's "One or both of the .idx and .bin files cannot be found at the path prefix ...", a
    --data-args-path file not found, a --per-split-data-args-path file it cannot read, a cache directory it cannot
    write) are one paragraph naming the flag whose value the failure names, and this machine."""
    import megatron.training.training as training

    from .data_cache import build_cache_on_each_cluster

    build = getattr(training.build_train_valid_test_datasets, "_hetauto_original",
                    training.build_train_valid_test_datasets)

    def checked(*a, **kw):
        from megatron.training import get_args
        args = get_args()
        _check_per_split_file(args.per_split_data_args_path)
        try:
            build_cache_on_each_cluster(build, a, kw, args, plan, rank)
            return build(*a, **kw)
        except Exception as exc:
            said = _data_failure(exc, args)
            if said is None:
                raise
            raise said from None

    checked._hetauto_original = build
    training.build_train_valid_test_datasets = checked


def _data_failure(exc: Exception, args) -> InputError | None:
    """The paragraph for a failure of Megatron's dataset build on the launch's data arguments (check_data_when_built),
    None for any other exception (it keeps its traceback)."""
    host = socket.gethostname()
    cause = _cache_write_failure(exc, args.data_cache_path)
    if cause is not None:
        return InputError(f"Megatron-LM could not write the dataset indices it draws to its cache directory on this "
                          f"machine ({host}): {cause}", field="--data-cache-path",
                          fix="give --data-cache-path a directory each cluster's machines can write (without it, "
                              "Megatron-LM writes under each prefix's path: PREFIX/cache/GPTDataset_indices)")
    if isinstance(exc, FileNotFoundError) and _in_cache(exc, args.data_cache_path):
        return InputError(f"the dataset indices this cluster's first rank that reads data wrote to the cache "
                          f"directory are not on this machine ({host}): {exc}. Megatron-LM writes them once and every "
                          "rank that reads data loads them from the same path", field="--data-cache-path",
                          fix="give --data-cache-path a directory the machines of each cluster share (each cluster "
                              "writes its own copy)")
    if not isinstance(exc, (AssertionError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
                            PermissionError)):
        return None
    text = assertion_text(exc) if isinstance(exc, AssertionError) else str(exc)
    flag = _flag_named_in(args, text)
    missing = isinstance(exc, OSError) or ".bin" in text or ".idx" in text
    return InputError(f"Megatron-LM could not build the training data on this machine ({host}) from the launch's "
                      f"{flag}: {text}", field=flag,
                      fix=_MISSING_DATA_FIX if missing else f"correct {flag} as Megatron-LM's words say, or use "
                                                            "--mock-data for synthetic tokens")


def _in_cache(exc: OSError, cache_dir: str | None) -> bool:
    """Whether the path of an OSError lies in the dataset index cache: --data-cache-path, else the directory
    Megatron-Core makes of a prefix when none is given (gpt_dataset.py: PREFIX/cache/GPTDataset_indices)."""
    path = os.path.abspath(str(exc.filename)) if exc.filename else ""
    return bool(path) and (re.search(r"/cache/\w+_indices(/|$)", path.replace(os.sep, "/")) is not None or (
        bool(cache_dir) and path.startswith(os.path.abspath(cache_dir) + os.sep)))


def _cache_write_failure(exc: BaseException, cache_dir: str | None) -> OSError | None:
    """The OSError of writing the dataset index cache, else None: under Megatron-Core's "Failed to write dataset
    materials to the data cache directory" (build_generic_dataset re-raises it as a bare Exception, which a mock
    dataset wraps once more), or, built alone (data_cache.py), raised as it is for a path in the cache."""
    said = False
    while exc is not None:
        said = said or "data cache directory" in str(exc)
        if isinstance(exc, OSError):
            return exc if said or (_in_cache(exc, cache_dir) and not isinstance(exc, FileNotFoundError)) else None
        exc = exc.__cause__
    return None


_SPLITS = ("train", "valid", "test")


def _check_per_split_file(path) -> None:
    """The JSON file of --per-split-data-args-path, as Megatron-LM reads it right after this (training/utils
    get_blend_and_blend_per_split: json.load, then [train], [valid] and [test], each a string of prefixes or a
    list): its mistakes were a JSONDecodeError, KeyError or TypeError traceback there. A file that cannot be read
    is left to Megatron (a file not found is said by the wrap), and so is a remote path (scheme://)."""
    if not path or "://" in path or not os.path.isfile(path):
        return
    import json
    problem = None
    try:
        with open(path, encoding="utf-8") as f:
            splits = json.load(f)
    except (OSError, UnicodeDecodeError):
        return
    except json.JSONDecodeError as exc:
        problem = f"it is not JSON ({exc})"
    else:
        if not isinstance(splits, dict):
            problem = f"it holds a JSON {type(splits).__name__}, not an object"
        elif missing := [s for s in _SPLITS if s not in splits]:
            problem = f"it has no key {', '.join(repr(s) for s in missing)}"
        elif wrong := [s for s in _SPLITS if splits[s] is not None and not isinstance(splits[s], (str, list))]:
            problem = f"the value of {', '.join(repr(s) for s in wrong)} is not a string or a list"
    if problem:
        raise InputError(f"Megatron-LM cannot read the launch's blend of each split from this file on this machine "
                         f"({socket.gethostname()}): {problem}", file=path, field="--per-split-data-args-path",
                         fix='write a JSON object with the keys "train", "valid" and "test", each the blend of its '
                             'split as --data-path takes it: a string of prefixes, or a list (e.g. {"train": '
                             '["30", "PREFIX_A", "70", "PREFIX_B"], "valid": "PREFIX_C", "test": "PREFIX_C"})')


_MISSING_DATA_FIX = ("each data prefix (of --data-path, the file of --data-args-path, --train-data-path and the "
                     "other splits' flags) names PREFIX.bin and PREFIX.idx, as Megatron-LM's "
                     "tools/preprocess_data.py writes them; the ranks that read data (each pipeline's first and last "
                     "stage, tensor-parallel rank 0) need them on their machines, at the path the launch gives; or "
                     "--mock-data for synthetic tokens")
# the flags a failure of Megatron's dataset builder can be about
_BUILD_ARGS = _DATA_ARGS + ("split", "data_cache_path", "per_dataset_sequences_path")


def _flag_named_in(args, text: str) -> str:
    """The flag a failure's text is about: the one whose value (a path, a prefix of a blend) it names, the longest
    found; else the one whose name it says ("split must be provided ..."); else the data flag the launch gives."""
    best, flag = 0, None
    for arg in _BUILD_ARGS:
        value = getattr(args, arg, None)
        for item in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(item, str) and len(item) > best and item in text:
                best, flag = len(item), _flag(arg)
    if flag is None:
        named = [arg for arg in _BUILD_ARGS if re.search(rf"\b{arg}\b", text)]
        given = [arg for arg in _DATA_ARGS if getattr(args, arg, None)]
        flag = _flag((named + given + ["data_path"])[0])
    return flag


def _flag(arg: str) -> str:
    """Megatron-LM's flag of an argument's attribute: data_path -> --data-path."""
    return "--" + arg.replace("_", "-")
