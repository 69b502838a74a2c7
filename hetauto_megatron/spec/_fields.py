"""Small readers for fields of parsed YAML/JSON mappings, raising InputError that names the field."""
from __future__ import annotations

from typing import Any

from ..errors import InputError

_MISSING = object()


def require_mapping(data: Any, what: str, file: str | None) -> dict:
    if not isinstance(data, dict):
        raise InputError(f"expected a mapping (key: value pairs) for {what}, got {type(data).__name__}", file=file,
                         fix=f"write {what} as YAML keys, see the docs for an example")
    return data


def get(data: dict, key: str, kind: type | tuple, *, default: Any = _MISSING, file: str | None = None,
        prefix: str = "", fix: str | None = None) -> Any:
    """Read data[key] checking its type; ints are accepted where floats are expected, bools never as numbers."""
    field = f"{prefix}{key}"
    if key not in data or data[key] is None:
        if default is _MISSING:
            raise InputError("is missing", file=file, field=field, fix=fix or f"add '{key}:'")
        return default
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise InputError(f"must be {names}, got {value!r}", file=file, field=field, fix=fix or f"write {key}: <{names}>")
    return value


def reject_unknown(data: dict, known: set[str] | list[str], *, file: str | None, prefix: str = "") -> None:
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise InputError(f"unknown key(s) {', '.join(unknown)}", file=file, field=prefix.rstrip(".") or None,
                         fix=f"remove them or use one of: {', '.join(sorted(known))}")


def positive(value: float, field: str, file: str | None) -> float:
    if value <= 0:
        raise InputError(f"must be positive, got {value}", file=file, field=field)
    return value
