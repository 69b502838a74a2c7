"""Small readers for fields of parsed YAML/JSON mappings, raising InputError that names the field."""
from __future__ import annotations

import difflib
import math
import re
import reprlib
from typing import Any

from ..errors import InputError

_MISSING = object()

_KIND_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
               dict: "a mapping (key: value pairs)"}


# Shortens while it writes: a value's full repr can be enormous (a YAML alias bomb is a few hundred bytes that
# reference one list 10^8 times), so the message is never built from it whole.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 6, 6, 4, 6
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 80


_EXPONENT = re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+")

def _show(value: Any, limit: int = 60) -> str:
    """A value as the user wrote it, shortened so that a whole mis-indented block does not flood the message."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def shorten(text: str, limit: int = 60) -> str:
    """Text the user wrote, for a message: a 5,000-digit number must not fill the screen (head, tail, length)."""
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-10:]} ({len(text):,} characters)"


def _kind_name(value: Any) -> str:
    return {"NoneType": "nothing", "dict": "a mapping", "list": "a list", "str": "a string", "int": "an integer",
            "float": "a number", "bool": "true/false"}.get(type(value).__name__, type(value).__name__)


def require_mapping(data: Any, what: str, file: str | None) -> dict:
    if not isinstance(data, dict):
        raise InputError(f"expected a mapping (key: value pairs) for {what}, got {_kind_name(data)} {_show(data)}",
                         file=file, fix=f"write {what} as 'key: value' lines (docs/inputs.md has examples)")
    return data


def get(data: dict, key: str, kind: type | tuple, *, default: Any = _MISSING, file: str | None = None,
        prefix: str = "", fix: str | None = None) -> Any:
    """Read data[key] checking its type; ints are accepted where floats are expected, bools never as numbers, and
    a number must be finite (YAML's .nan and .inf, JSON's NaN and Infinity parse as floats, and would pass every
    `> 0` check while making every time and memory figure NaN)."""
    field = f"{prefix}{key}"
    if key not in data or data[key] is None:
        if default is _MISSING:
            # written but empty, null or ~: YAML's nothing (a name spelled null is text only when quoted)
            from .files import is_json_name      # (files.py imports this module)
            why = ("" if key not in data else " (it is null)" if is_json_name(file or "") else
                   " (YAML reads an empty value, null and ~ as nothing; quote text such as 'null')")
            raise InputError("is missing" + why, file=file, field=field, fix=fix or f"add '{key}:'")
        return default
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # (a field that also takes text or whole numbers, such as a name, keeps what was written: name: 5 is "5")
    if float in kinds and int not in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value) if abs(value) < 1e300 else math.inf
    if float in kinds and isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"must be a finite number, got {value}", file=file, field=field,
                         fix=fix or f"write '{key}:' as a plain number (NaN and infinity are not figures)")
    if float in kinds and str not in kinds and isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
        # YAML 1.1 reads 8e1 and 1.5e3 (an exponent without a decimal point, or without its sign) as text, though
        # they are numbers as written in any language and in YAML 1.2: read as the number where a number is due
        # (only there: a cluster named 1e3, or a digest, stays the text it is)
        value = float(value)
        if not math.isfinite(value):
            raise InputError(f"must be a finite number, got {value}", file=file, field=field,
                             fix=fix or f"write '{key}:' as a plain number")
    if float in kinds and isinstance(value, float):
        return value
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join(_KIND_WORDS.get(k, k.__name__) for k in kinds)
        raise InputError(f"must be {names}, got {_kind_name(value)} {_show(value)}", file=file, field=field,
                         fix=fix or f"write '{key}:' as {names}")
    return value


# A key that says which of hetauto's files a mapping is, for the message when one is passed for another.
_FILE_KEYS = {"clusters": "an inventory file (what --inventory reads)",
              "meshes": "a plan file (what --plan and --from read)",
              **dict.fromkeys(("num_layers", "hidden_size",
                               # a Hugging Face config.json (GPT-2's n_layer and n_embd too), also read by --model
                               "model_type", "architectures", "num_hidden_layers", "n_layer", "n_embd"),
                              "a model file (what --model reads)")}


def file_kind(keys) -> tuple[str, str] | None:
    """(the telling key, which of hetauto's files it is) for a mapping with these top-level keys (None: none of
    them), for the message when a file is passed to an option that reads another kind."""
    return next(((key, what) for key, what in _FILE_KEYS.items() if key in keys), None)


def _hf_names(known) -> dict[str, str]:
    """A Hugging Face config.json key -> the key of ours it is read into (num_hidden_layers -> num_layers), for the
    keys of a model file (hf_families.SOURCE_KEYS: the names the config reader takes)."""
    from .hf_families import SOURCE_KEYS
    names: dict[str, str] = {}
    for ours, theirs in SOURCE_KEYS.items():
        for k in theirs:
            if ours in known and k not in known:
                names.setdefault(k, ours)
    return names


# The keys only a Hugging Face config.json has (it names its family and its classes): a model YAML holding them is
# a config.json's content, which --model reads from a .json file, not a file of hetauto's own keys
_HF_CONFIG_KEYS = ("model_type", "architectures")


def reject_unknown(data: dict, known: set[str] | list[str], *, file: str | None, prefix: str = "") -> None:
    unknown = sorted((str(k) for k in set(data) - set(known)))
    kind = (file_kind(unknown) or (None, None))[1]
    own = (file_kind(known) or (None, None))[1]     # the kind of file these keys make up: never "another" kind
    if kind and kind != own and not prefix:     # a whole file of another kind: say so, not "remove them"
        raise InputError(f"has key(s) {', '.join(unknown[:4])}{', ...' if len(unknown) > 4 else ''}: it looks like "
                         f"{kind}, not the file this option reads", file=file,
                         fix="pass each file to its own option (--model, --inventory, and a plan to --plan, or to "
                             "'hetauto plan --from')")
    hf = _hf_names(known)
    if hf and not prefix and any(k in unknown for k in _HF_CONFIG_KEYS):
        said = next(k for k in _HF_CONFIG_KEYS if k in unknown)
        raise InputError(f"has '{said}:' and other Hugging Face keys: it looks like a config.json's content, "
                         "written in a model file of hetauto's own keys", file=file, field=said,
                         fix="save it as config.json (a file named .json, or the checkpoint directory holding it) "
                             "and pass that to --model, which reads Hugging Face configs (docs/inputs.md, 'Hugging "
                             "Face config.json'); or write the model with hetauto's keys: " + ", ".join(sorted(known)))
    if unknown:
        renames, drops = [], []
        for k in unknown:
            close = difflib.get_close_matches(k, list(known), n=1)
            if k in hf and hf[k] in data:
                drops.append(f"'{k}' (the Hugging Face name of {hf[k]}, which the file gives too)")
            elif k in hf:
                renames.append(f"'{k}' to '{hf[k]}' (the Hugging Face name of hetauto's {hf[k]})")
            elif close:
                renames.append(f"'{k}' to '{close[0]}' (a likely typo)")
        said = ([f"rename {', '.join(renames)}"] if renames else []) + ([f"drop {', '.join(drops)}"] if drops else [])
        fix = (f"{'; '.join(said)}; otherwise " if said else "") + \
            f"remove them; the known keys here are {', '.join(sorted(known))}"
        raise InputError(f"unknown key(s) {', '.join(unknown)}", file=file, field=prefix.rstrip(".") or None, fix=fix)


# A device or network figure beyond any hardware (a petabit link, a billion GiB of memory) is a typo; far past it
# the search's memory and time arithmetic loses its precision (memory_gib: 1e30 made `hetauto plan` run for ever).
MAX_FIGURE = 1e9
# Below any real figure (1 bit/s, 1 byte, 1 kFLOP/s): a typo, and near-zero rates make the prices overflow
MIN_FIGURE = 1e-9


def positive(value: float, field: str, file: str | None) -> float:
    if value <= 0:
        raise InputError(f"must be positive, got {value}", file=file, field=field,
                         fix="give a value above zero (bandwidths in Gbit/s, memory in GiB, peak in TFLOP/s)")
    if value < MIN_FIGURE:
        raise InputError(f"is {value:g}, below any device or network (at least {MIN_FIGURE:g})", file=file,
                         field=field, fix="check the unit: bandwidths in Gbit/s, memory in GiB, peak in TFLOP/s")
    if value > MAX_FIGURE:
        raise InputError(f"is {value:g}, beyond any device or network (at most {MAX_FIGURE:g})", file=file,
                         field=field, fix="check the unit: bandwidths in Gbit/s, memory in GiB, peak in TFLOP/s")
    return value

