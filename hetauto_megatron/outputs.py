"""Writing what the commands produce (plans, launch scripts, configs, profiles, fitted models).

Where an output goes is the user's choice, so the system refusing it (a folder that cannot hold files such as
/proc, a read-only disk, a directory where the file should go, a full disk) is a user error: it becomes an
InputError naming the path, the option and the fix, never a traceback. Every layer writes through these
(they import nothing of hetauto's but errors.py), so the same path is refused the same way by every command.
"""
from __future__ import annotations

import contextlib
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
