"""Reading the project's YAML and JSON files: every syntax, encoding or I/O failure becomes one InputError that
names the file and the fix, and no file can make the reader run for ever or exhaust memory (nested aliases,
self-references, hundreds of nesting levels, a key written twice)."""
from __future__ import annotations

import json
import os
import re
import sys

import yaml

from ..errors import InputError
from ._fields import require_mapping, shorten

# The page that describes each kind of file load_yaml_file reads (for the fix of an empty one).
FORMAT_DOCS = {"plan": "docs/plan-format.md", "published-runs table": "docs/cost-model.md"}


# Aliases (*name) may add at most this many nodes beyond those written out. PyYAML shares an aliased value, so a
# few hundred bytes of nested aliases load at once as a structure of 10^8 elements, and whatever walks it later
# (an error message's repr, a copy, a JSON dump) takes minutes and gigabytes; no hetauto file needs such sharing.
MAX_ALIAS_EXPANSION = 100_000


_TOO_DEEP = "nests its lists and mappings too deeply to be read (hundreds of levels)"

# The largest input file read: hetauto's inventories, models, plans and tables take kilobytes (a plan of 16,384
# devices under a megabyte); a path to /dev/zero or to a multi-gigabyte file filled memory without an end.
MAX_INPUT_BYTES = 64 << 20


def _read_bounded(fh, path: str, field: str | None = None) -> str:
    """The file's text, read once (a second open of a pipe would wait for ever), refused beyond MAX_INPUT_BYTES."""
    text = fh.read(MAX_INPUT_BYTES + 1)
    if len(text) > MAX_INPUT_BYTES:
        raise InputError(f"is larger than {MAX_INPUT_BYTES >> 20} MiB, far more than any input hetauto reads (a plan "
                         "of 16,384 devices takes under 1 MiB)", file=path, field=field,
                         fix="check the path: it names another kind of file (or a device such as /dev/zero)")
    return text


_SEXAGESIMAL = re.compile(r"\n\s*\|[^\n|]*\(\?::\[0-5\]\?\[0-9\]\)\+[^\n|]*?(?=\)\$\Z|\n)")


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader refusing a key written twice in one mapping: YAML keeps the last silently, so a pasted block
    or a typo would drop a cluster or a setting without a word. Keys merged in with `<<: *anchor` may be
    overridden, as YAML intends."""

    # YAML 1.1 reads 1:30 as the base-60 number 90 (and 1:30.5 as 90.5): a typo would pass as a figure. Numbers
    # here are written in base 10; the resolvers of ints and floats lose that alternative, so 1:30 stays text.
    yaml_implicit_resolvers = {
        first: [(tag, re.compile(_SEXAGESIMAL.sub("", rx.pattern), rx.flags)
                 if tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float") else rx) for tag, rx in entries]
        for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()}

    def construct_yaml_int(self, node):
        # YAML 1.1 reads a leading zero as octal: global_batch_size: 01000 was 512, silently
        text = str(node.value).replace("_", "")
        if re.fullmatch(r"[-+]?0[0-9]+", text):
            raise InputError(f"the number {node.value} (line {node.start_mark.line + 1}) starts with a 0, which YAML "
                             f"reads as octal ({node.value} = {super().construct_yaml_int(node)})", file=self.name,
                             fix=f"write {int(text)} without the leading zero (or 0o{text.lstrip('+-0')} for octal)")
        return super().construct_yaml_int(node)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key, _ in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                    continue
                if (key.tag, key.value) in seen:
                    raise InputError(f"the key {shorten(key.value)!r} is written twice in one mapping (line "
                                     f"{key.start_mark.line + 1}); YAML would keep the last and drop the first",
                                     file=self.name, field=key.value,
                                     fix="delete or rename one of the two (two list entries each need their own '-')")
                seen.add((key.tag, key.value))
        return super().construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)


# Keys whose values are names (a cluster, a device type, a link's two ends, a model or inventory label): read as
# the text written. YAML 1.1 reads a bare 0x10 as 16, 007 as 7, 1_000 as 1000, on and yes as true, 1.50 as 1.5 and
# 2024-01-01 as a date, so a cluster named 0x10 became "16" without a word, and no longer matched --tp 0x10=8,
# --exclude-clusters 0x10 or --set cluster.0x10.nodes=8 (which are text). An empty value, null and ~ stay nothing.
NAME_KEYS = frozenset({"name", "cluster", "device", "device_type", "between",
                       "use_clusters", "exclude_clusters"})   # (a plan's recorded constraints: lists of names)
# Keys whose values map cluster names to a setting: a plan's recorded constraints (estimate.search.constraints,
# `tp: {h800: 8}`, `recompute: {a100: full}`), which 'plan --from' and explain's re-plans keep. Their keys are
# names, read as the text written the same way: `tp: {007: 8}` pins cluster 007, not a cluster "7".
CLUSTER_KEYED = frozenset({"tp", "recompute"})
_STR_TAG, _NULL_TAG = "tag:yaml.org,2002:str", "tag:yaml.org,2002:null"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _as_text(node):
    """A plain scalar YAML resolved to something other than text, as a text node of what was written (a copy: an
    alias may share the node with a field where it is a number); a sequence (between: [a, b]) item by item."""
    if isinstance(node, yaml.ScalarNode):
        if node.tag in (_STR_TAG, _NULL_TAG) or node.style is not None:
            return node
        return yaml.ScalarNode(_STR_TAG, node.value, node.start_mark, node.end_mark, node.style)
    if isinstance(node, yaml.SequenceNode):
        items = [_as_text(n) if isinstance(n, yaml.ScalarNode) else n for n in node.value]
        if any(a is not b for a, b in zip(items, node.value)):
            return yaml.SequenceNode(node.tag, items, node.start_mark, node.end_mark, node.flow_style)
    return node


def _keys_as_text(node):
    """A mapping whose plain keys YAML resolved to something other than text, as a copy keyed by what was written
    (a merge key, <<, stays one); any other node as it is."""
    if not isinstance(node, yaml.MappingNode):
        return node
    pairs = [(k if k.tag == _MERGE_TAG else _as_text(k), v) if isinstance(k, yaml.ScalarNode) else (k, v)
             for k, v in node.value]
    if all(a is b for (a, _), (b, _) in zip(pairs, node.value)):
        return node
    return yaml.MappingNode(node.tag, pairs, node.start_mark, node.end_mark, node.flow_style)


def _names_as_written(root) -> None:
    """Re-tag the values of NAME_KEYS, and the keys of CLUSTER_KEYED mappings, in a composed node graph (acyclic:
    checked before) as the text written."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for j, (key, value) in enumerate(node.value):
                if isinstance(key, yaml.ScalarNode) and key.tag == _STR_TAG and key.value in NAME_KEYS:
                    value = _as_text(value)
                    node.value[j] = (key, value)
                elif isinstance(key, yaml.ScalarNode) and key.tag == _STR_TAG and key.value in CLUSTER_KEYED:
                    value = _keys_as_text(value)
                    node.value[j] = (key, value)
                stack += [key, value]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value


def _value_problem(exc: ValueError) -> str:
    """What is wrong with a value the parser could not convert, in the user's terms."""
    if "integer string conversion" in str(exc):
        return f"a number of more than {sys.get_int_max_str_digits():,} digits"
    return shorten(str(exc), 120)


def _safe_load_bounded(stream, path: str):
    """yaml.safe_load, refusing a document whose aliases expand to more than MAX_ALIAS_EXPANSION extra nodes, and a
    key written twice in one mapping."""
    loader = _UniqueKeyLoader(stream)
    loader.name = path
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded, written = _expanded_size(node)
        if expanded is None:
            raise InputError("an alias (*name) refers to a value that contains it, which never ends", file=path,
                             fix="write the values out instead of referring to an enclosing anchor (&name)")
        if expanded - written > MAX_ALIAS_EXPANSION:
            raise InputError(f"its aliases (*name) expand to {expanded:,} values from {written:,} written (at most "
                             f"{MAX_ALIAS_EXPANSION:,} more are allowed)", file=path,
                             fix="write the values out instead of nesting references to anchors (&name)")
        _names_as_written(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(root) -> tuple[int | None, int]:
    """(nodes counting every alias expanded, distinct nodes) of a composed YAML node graph, None for the first when
    a value contains itself; linear in the distinct nodes (each one's expanded size is computed once), iterative
    so a deeply nested file cannot exhaust the stack."""
    size: dict[int, int] = {}
    entered: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size:
            continue
        if not done:
            if id(node) in entered:      # met again before it was finished: it is inside itself
                return None, len(entered)
            entered.add(id(node))
        children = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            size[id(node)] = 1 + sum(size[id(c)] for c in children)
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in size)
    return size[id(root)], len(size)


def is_json_name(path: str) -> bool:
    """Whether a file is JSON by its name (.json, in any case): the one rule for reading and for writing, so that a
    plan written to P.JSON, which was written as YAML while every reader took it for JSON, reads back."""
    return str(path).lower().endswith(".json")


def load_yaml_file(path: str, what: str) -> dict:
    """Read a YAML (or JSON) file into a mapping, turning every I/O or syntax failure into an InputError."""
    if not os.path.exists(path):
        raise InputError(f"{what} file not found", file=path, fix="check the path")
    if os.path.isdir(path):
        article = "an" if what[:1] in "aeiou" else "a"
        raise InputError(f"is a directory, not {article} {what} file", file=path, fix=f"pass the {what} YAML file itself")
    if is_json_name(path):
        # read as JSON, by a JSON parser: the YAML parser refused JSON's tab indentation and took a missing value
        # or a trailing comma for valid
        data = read_json_file(path)
        if data is None:
            raise InputError("is empty (null)", file=path, fix=f"write the {what} as a JSON object "
                                                           f"({FORMAT_DOCS.get(what, 'docs/inputs.md')})")
        return require_mapping(data, what, path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = _safe_load_bounded(_read_bounded(fh, path), path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"is not valid YAML{at}: {problem}", file=path,
                         fix="correct the syntax (indentation, colons, quotes)") from None
    except UnicodeDecodeError:
        raise InputError("is not a UTF-8 text file", file=path, fix=f"pass the {what} YAML file") from None
    except OSError as exc:
        raise InputError(f"cannot be read: {exc.strerror}", file=path, fix="check the file's permissions") from None
    except RecursionError:
        raise InputError(_TOO_DEEP, file=path, fix=f"write the {what} with its usual few levels of keys and lists "
                                                    f"({FORMAT_DOCS.get(what, 'docs/inputs.md')})") from None
    except ValueError as exc:     # e.g. an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise InputError(f"holds a value that cannot be read: {_value_problem(exc)}", file=path,
                         fix="write each number with at most a few dozen digits") from None
    if data is None:
        page = FORMAT_DOCS.get(what, "docs/inputs.md")
        raise InputError("is empty", file=path, fix=f"write the {what} as YAML keys ({page})")
    return require_mapping(data, what, path)


class DuplicateJSONKey(ValueError):
    """A key written twice in one JSON object (a ValueError, as json's own failures to convert a value are)."""

    def __init__(self, key: str):
        self.key = key
        super().__init__(f"the key {shorten(key)!r} is written twice in one object")


def json_object_pairs(pairs):
    """json's object_pairs_hook: a dict, refusing a key written twice (json would keep the last silently)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateJSONKey(k)
        out[k] = v
    return out


def _line_of_second(text: str, key: str) -> int | None:
    """The line where `key` is written the second time in one object of the JSON `text`, None if not found.
    json's pairs hook is given no positions, so the text is read again (only after it was refused) by json's
    Python scanner with an object reader that notes where each key starts."""
    from json import decoder, scanner
    space = decoder.WHITESPACE.match

    class Found(Exception):
        pass

    def parse_object(s_and_end, strict, scan_once, *_):
        text, end = s_and_end       # just past the '{'; the text parsed once already, so its syntax is sound
        seen = set()
        end = space(text, end).end()
        while text[end] != "}":
            start = end
            name, end = decoder.scanstring(text, end + 1, strict)
            if name == key and name in seen:
                raise Found(text.count("\n", 0, start) + 1)
            seen.add(name)
            _, end = scan_once(text, space(text, space(text, end).end() + 1).end())     # past the ':'
            end = space(text, end).end()
            if text[end] == ",":
                end = space(text, end + 1).end()
        return {}, end + 1

    reader = json.JSONDecoder()
    reader.parse_object = parse_object
    reader.scan_once = scanner.py_make_scanner(reader)
    try:
        reader.decode(text)
    except Found as found:
        return found.args[0]
    except (ValueError, RecursionError):
        pass
    return None


def read_json_file(path: str, *, field: str | None = None, fix: str | None = None):
    """Parse a JSON file, turning every syntax, encoding or I/O failure into an InputError naming the file."""
    try:
        with open(path, encoding="utf-8-sig") as fh:      # a byte-order mark (PowerShell writes one) is no error
            text = _read_bounded(fh, path, field)
        return json.loads(text, object_pairs_hook=json_object_pairs)
    except json.JSONDecodeError as exc:
        raise InputError(f"is not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", file=path,
                         field=field, fix=fix or "correct the syntax (quotes, commas, braces)") from None
    except RecursionError:
        raise InputError(_TOO_DEEP, file=path, field=field,
                         fix=fix or "write it with its usual few levels of keys and lists") from None
    except UnicodeDecodeError:      # (a ValueError too: before it)
        raise InputError("is not a UTF-8 text file", file=path, field=field,
                         fix=fix or "save it as UTF-8 text") from None
    except DuplicateJSONKey as exc:     # named with its line, as a YAML file's key written twice is
        line = _line_of_second(text, exc.key)
        # (the fix is this one whatever the caller's: theirs is about the file's content, not a key written twice)
        raise InputError(f"the key {shorten(exc.key)!r} is written twice in one object"
                         + (f" (line {line})" if line else "") + "; most JSON readers keep the last and drop the first",
                         file=path, field=field or exc.key, fix="delete or rename one of the two") from None
    except ValueError as exc:     # a key twice, or an integer of more digits than Python converts
        raise InputError(f"cannot be read: {_value_problem(exc)}", file=path, field=field,
                         fix=fix or "correct that value or key, as the message names it") from None
    except OSError as exc:
        raise InputError(f"cannot be read: {exc.strerror}", file=path, field=field,
                         fix="check the path and the file's permissions") from None
