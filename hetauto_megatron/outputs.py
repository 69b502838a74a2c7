"""Writing what the commands produce (plans, launch scripts, configs, profiles, fitted models).

Where an output goes is the user's choice, so the system refusing it (a folder that cannot hold files such as
/proc, a read-only disk, a directory where the file should go, a full disk) is a user error: it becomes an
InputError naming the path, the option and the fix, never a traceback. Every layer writes through these
(they import nothing of hetauto's but errors.py), so the same path is refused the same way by every command.
"""
from __future__ import annotations

import contextlib
import math
import os

from .errors import InputError


@contextlib.contextmanager
def output_errors(path: str, field: str | None):
    """Turn an OSError raised while writing `path` (given by the option `field`) into an InputError."""
    try:
        yield
    except OSError as exc:
        where = exc.filename if isinstance(exc.filename, str) else path
        if os.path.isdir(where):
            fix = f"remove or rename the directory {where!r}, or write elsewhere"
        else:
            fix = "write to a folder you can create files in"
        raise InputError(f"cannot write {where!r}: {exc.strerror or exc}", field=field, fix=fix) from None


def write_text_file(path: str, text: str, *, field: str | None, mode: int | None = None) -> str:
    """Write `text` to `path` (made `mode` if given); returns the path."""
    with output_errors(path, field):
        with open(path, "w") as fh:
            fh.write(text)
        if mode is not None:
            os.chmod(path, mode)
    return path


def make_output_dir(path: str, field: str | None) -> str:
    """Create the output directory `path` (with its parents), or say why it cannot be used."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"{path!r} exists and is not a directory", field=field,
                         fix="name a directory (it is created if needed)")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{path!r} cannot be created: {exc.strerror or exc}", field=field,
                         fix="choose a directory you can create (its parents must be directories)") from None
    return path


def refuse_overwriting_inputs(outputs, inputs) -> None:
    """Refuse, before any work, an output that names the same file as an input or as another output.

    `outputs` and `inputs` are (option, path) pairs (a path may be None: the option was not given; an input that
    is not a file, e.g. a model preset's name, is skipped; a folder with a manifest.json, a learned cost model, stands
    for that manifest). Writing the plan over the inventory it was made from
    (-o inv.yaml) would lose the input silently; the same file is found through symbolic and hard links too.
    """
    def same(a: str, b: str) -> bool:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        try:
            return os.path.samefile(a, b)
        except OSError:       # one of them does not exist (yet): only the same name is the same file
            return False

    outs = [(flag, path) for flag, path in outputs if path]
    ins = [(flag, path) for flag, path in inputs if path and os.path.isfile(path)]
    # a learned cost model (--cost-model DIR): its manifest is what names the rest
    ins += [(flag, os.path.join(path, "manifest.json")) for flag, path in inputs
            if path and os.path.isdir(path) and os.path.isfile(os.path.join(path, "manifest.json"))]
    for i, (flag, path) in enumerate(outs):
        for in_flag, in_path in ins:
            if same(path, in_path):
                # (an emitted file lands in the --emit folder: the other file must move, or the folder)
                fix = (f"give --emit another folder, or {in_flag} a file outside it" if flag == "--emit"
                       else f"give {flag} another file name")
                raise InputError(f"{path!r} is also {in_flag} {in_path!r}; writing it would overwrite that file",
                                 field=flag, fix=fix)
        for other_flag, other in outs[:i]:
            if same(path, other):
                # (an emitted file's name is the plan's, not the user's: the other file or the folder must move)
                fix = (f"give {other_flag} a file outside the --emit folder, or --emit another folder"
                       if flag == "--emit" else f"give {flag} and {other_flag} different file names")
                what = f"{path!r}, a file {flag} writes," if flag == "--emit" else repr(path)
                raise InputError(f"{what} is also the output {other_flag} {other!r}; one would overwrite the "
                                 "other", field=flag, fix=fix)


def refuse_folder_over_files(folder, files) -> None:
    """Refuse, before any work, an output folder ((option, path); path None: not given) that is one of the output
    files `files` ((option, path) pairs) or lies under one: the file is written first, and the folder then cannot
    be made (`plan -o out --emit out` wrote the plan, then called the file it had made not a directory)."""
    flag, path = folder
    if not path:
        return
    where = os.path.realpath(path)
    for file_flag, file in files:
        if not file:
            continue
        target = os.path.realpath(file)
        if where == target or where.startswith(target + os.sep):
            how = "is" if where == target else "lies under"
            raise InputError(f"{path!r} {how} the output file of {file_flag} ({file!r}), which is written first, "
                             "so the folder could not be made there", field=flag,
                             fix=f"give {flag} and {file_flag} different names (a folder apart from the file)")


def _non_finite(obj, where: str = "") -> str | None:
    """Where in a JSON document the first NaN or infinity sits ('estimate.iteration_time_s'), None if nowhere."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return where or "(the document)"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        found = _non_finite(v, f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}" if where else str(k))
        if found:
            return found
    return None


def json_text(obj, **kwargs) -> str:
    """`obj` as JSON text with no NaN or Infinity, which Python writes by default and no JSON parser reads: a figure
    that is not finite came from an input figure beyond any hardware that no reader caught, so it is refused
    naming where it sits rather than handed to a script as JSON that is not."""
    import json
    try:
        return json.dumps(obj, allow_nan=False, **kwargs)
    except ValueError:
        where = _non_finite(obj)
        if where is None:
            raise
        raise InputError(f"the result's {where} is not a finite number, which JSON cannot hold", field=where,
                         fix="check the figures of the input files (a rate, overhead, bandwidth or peak far beyond "
                             "any hardware); the run without --json shows the figures") from None
