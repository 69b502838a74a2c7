"""`hetauto patch-megatron /path/to/Megatron-LM`: add --hetauto to a Megatron-LM checkout's pretrain_gpt.py.

The patch ships inside the package (hetauto_megatron/data/patches/pretrain_gpt.patch, so an installed hetauto
needs no source checkout; patches/pretrain_gpt.patch in the repository is a link to it) and changes five
lines; this command applies it without needing `patch`
or git, idempotently (a patched file is recognised and left alone), checks the result, and says what changed.
Where the lines around a change differ from core_r0.19.0's (later commits move imports and add arguments),
up to two context lines at each end of a hunk may be left out, as GNU patch's fuzz does, and the output says
so; the changed lines themselves must be found, once. A file the patch does not fit (another Megatron-LM
version, local edits) is left untouched: exit 2 with the lines that were not found.
"""
from __future__ import annotations

import os
import shutil
import re
from dataclasses import dataclass

from ..errors import InputError

DESCRIPTION = """\
Add the --hetauto flag to Megatron-LM's pretrain_gpt.py (branch core_r0.19.0, matching megatron-core 0.19.x).

The patch changes five lines of pretrain_gpt.py:
  1. imports hetauto_megatron.megatron.hook;
  2. routes the main block's user errors through the hook (one paragraph and exit 2, no traceback);
  3. parses the arguments with hook.parse_and_validate_args (Megatron's own, plus --hetauto, --hetauto-plan,
     --hetauto-cluster; under --hetauto each rank's TP, DP, micro-batch, pipeline layout and recompute come
     from the plan);
  4. adds **hook.pretrain_kwargs(args) to pretrain(...) (the plan's process groups and inter-cluster
     communicator; nothing without --hetauto);
  5. ends the process after pretrain(...) with hook.exit_after_training() (process groups destroyed, then
     exit 0 without interpreter teardown; under --hetauto, or on a machine with no accelerator).
Without --hetauto the patched script trains exactly as before on an accelerator. Running it twice changes
nothing the second time. hetauto_megatron must be importable by the Python that runs pretrain_gpt.py (pip install it)."""

EPILOG = """\
examples:
  hetauto patch-megatron ~/Megatron-LM
  hetauto patch-megatron ~/Megatron-LM --check        # only report whether it is patched / patchable
  then: torchrun ... pretrain_gpt.py <Megatron arguments> --hetauto --hetauto-plan plan.yaml

exit codes: 0 patched (or already patched; with --check: patched or patchable), 2 not a Megatron-LM
checkout, or a pretrain_gpt.py the patch does not fit (the file is left untouched)."""

TARGET = "pretrain_gpt.py"
_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


@dataclass(frozen=True)
class Hunk:
    old_start: int               # 1-based line in the unpatched file (a hint; the text decides)
    old: tuple[str, ...]         # context + removed lines
    new: tuple[str, ...]         # context + added lines

    @property
    def added(self) -> list[str]:
        return [line for line in self.new if line not in self.old]

    @property
    def removed(self) -> list[str]:
        return [line for line in self.old if line not in self.new]


def default_patch_path() -> str:
    """The patch shipped as package data (setup.py package_data "data/*/*")."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "data", "patches", "pretrain_gpt.patch"))


def parse_patch(text: str, *, file: str | None = None) -> list[Hunk]:
    """Hunks of a one-file unified diff (text before the first '---' line is commentary)."""
    hunks, old, new, start, in_hunk = [], [], [], 0, False
    for raw in text.splitlines():
        m = _HUNK_HEADER.match(raw)
        if m:
            if in_hunk:
                hunks.append(Hunk(start, tuple(old), tuple(new)))
            start, old, new, in_hunk = int(m.group(1)), [], [], True
            continue
        if not in_hunk:
            continue
        if raw.startswith("\\"):        # "\ No newline at end of file"
            continue
        tag, line = (raw[:1], raw[1:]) if raw else (" ", "")
        if tag == " ":
            old.append(line)
            new.append(line)
        elif tag == "-":
            old.append(line)
        elif tag == "+":
            new.append(line)
        else:
            raise InputError(f"malformed diff line {raw!r}", file=file, fix="use the patch shipped with hetauto")
    if in_hunk:
        hunks.append(Hunk(start, tuple(old), tuple(new)))
    if not hunks:
        raise InputError("contains no hunks", file=file, fix="use the patch shipped with hetauto")
    return hunks


def _find(lines: list[str], block: tuple[str, ...]) -> list[int]:
    n = len(block)
    return [i for i in range(len(lines) - n + 1) if tuple(lines[i:i + n]) == block]


@dataclass(frozen=True)
class PatchState:
    status: str                  # "applied" | "patchable" | "conflict"
    reasons: tuple[str, ...] = ()
    positions: tuple[int, ...] = ()   # 0-based start of each hunk's old block (when patchable)
    hunks: tuple[Hunk, ...] = ()      # the hunks as found: context lines left out where the file differs there
    fuzz: tuple[int, ...] = ()        # per hunk, the context lines left out at each end (0: the whole context)


MAX_FUZZ = 2     # as GNU patch: up to two context lines at each end of a hunk may differ, never a changed line


def trim_context(hunk: Hunk, fuzz: int) -> Hunk:
    """The hunk without up to `fuzz` unchanged lines at its start and at its end. Megatron-LM's file moves
    around the five changed lines from one commit to the next (an import added above, an argument added to
    pretrain(...)); the lines the patch changes, and the context next to them, are what must be found."""
    lead = next((i for i, (a, b) in enumerate(zip(hunk.old, hunk.new)) if a != b), min(len(hunk.old), len(hunk.new)))
    trail = next((i for i, (a, b) in enumerate(zip(reversed(hunk.old), reversed(hunk.new))) if a != b),
                 min(len(hunk.old), len(hunk.new)))
    a, b = min(fuzz, lead), min(fuzz, trail)
    return Hunk(hunk.old_start + a, hunk.old[a:len(hunk.old) - b], hunk.new[a:len(hunk.new) - b])


def _locate(lines: list[str], hunk: Hunk) -> tuple[bool | None, int, Hunk, int, list[int]]:
    """(applied?, position, the hunk as found, fuzz, where its whole old block occurs): the least fuzz at
    which the file holds exactly one copy of the unpatched text, or the patched text and not the unpatched;
    (None, ...) when no fuzz does."""
    whole = _find(lines, hunk.old)
    for fuzz in range(MAX_FUZZ + 1):
        h = trim_context(hunk, fuzz)
        if not h.removed and not any(line.strip() for line in h.old):
            break       # no line left to anchor the added ones: the place is unknown
        new_at = _find(lines, h.new)
        # the unpatched text found inside the patched text (its context and nothing removed) is the patch
        old_at = [i for i in _find(lines, h.old)
                  if not any(j <= i and i + len(h.old) <= j + len(h.new) for j in new_at)]
        if new_at and not old_at:
            return True, new_at[0], h, fuzz, whole
        if len(old_at) == 1:
            return False, old_at[0], h, fuzz, whole
        if len(old_at) > 1:
            break       # leaving out more context cannot make it unique
    return None, 0, hunk, 0, whole


def inspect_file(lines: list[str], hunks: list[Hunk]) -> PatchState:
    """Decide, per hunk, whether the file holds the patched text (applied), exactly one copy of the
    unpatched text (patchable), or neither (conflict, with the reason)."""
    applied, positions, found, fuzzes, reasons = [], [], [], [], []
    for k, hunk in enumerate(hunks, 1):
        state, pos, h, fuzz, whole = _locate(lines, hunk)
        applied.append(state)
        positions.append(pos)
        found.append(h)
        fuzzes.append(fuzz)
        if state is None:
            first = next((line for line in hunk.removed or hunk.old if line.strip()), hunk.old[0])
            if len(whole) > 1:
                reasons.append(f"hunk {k}: its lines occur {len(whole)} times, so the place to change is ambiguous")
            else:
                reasons.append(f"hunk {k} (near line {hunk.old_start}): the lines it changes were not found, e.g. "
                               f"{first.strip()!r}")
    if all(a is True for a in applied):
        return PatchState("applied", positions=tuple(positions), hunks=tuple(found), fuzz=tuple(fuzzes))
    if all(a is False for a in applied):
        return PatchState("patchable", positions=tuple(positions), hunks=tuple(found), fuzz=tuple(fuzzes))
    if not reasons:
        reasons.append("some hunks are applied and others are not (a partly patched or hand-edited file)")
    return PatchState("conflict", tuple(reasons))


def apply_hunks(lines: list[str], hunks: list[Hunk], positions: tuple[int, ...]) -> list[str]:
    out = list(lines)
    # bottom-up, so earlier positions stay valid
    for hunk, pos in sorted(zip(hunks, positions), key=lambda hp: hp[1], reverse=True):
        out[pos:pos + len(hunk.old)] = list(hunk.new)
    return out


def verify(text: str, hunks: list[Hunk], *, file: str) -> None:
    """The patched file must hold each added line exactly once and still be valid Python."""
    lines = text.splitlines()
    for hunk in hunks:
        for line in hunk.added:
            count = sum(1 for x in lines if x == line)
            if count != 1:
                raise InputError(f"after patching, the line {line.strip()!r} occurs {count} times", file=file,
                                 fix="restore the original pretrain_gpt.py (git checkout pretrain_gpt.py) and "
                                     "run hetauto patch-megatron again")
    try:
        compile(text, file, "exec")
    except SyntaxError as exc:
        raise InputError(f"the patched file is not valid Python (line {exc.lineno}: {exc.msg})", file=file,
                         fix="restore the original pretrain_gpt.py and report this") from None


def explain(hunks: list[Hunk]) -> list[str]:
    out = []
    for hunk in hunks:
        for line in hunk.removed:
            out.append(f"  - {line.strip()}")
        for line in hunk.added:
            out.append(f"  + {line.strip()}")
    return out


def fuzz_notes(state: PatchState) -> list[str]:
    """As GNU patch says "with fuzz": where the lines around a change differ from core_r0.19.0's file."""
    return [f"  (hunk {k}, at line {pos + 1}: found with {fuzz} line(s) of its context at each end left out, "
            "since they differ from core_r0.19.0's file; look it over)"
            for k, (pos, fuzz) in enumerate(zip(state.positions, state.fuzz), 1) if fuzz]


def add_arguments(parser) -> None:
    parser.add_argument("megatron_lm", metavar="MEGATRON_LM_DIR", help="a Megatron-LM checkout (holds pretrain_gpt.py)")
    parser.add_argument("--check", action="store_true",
                        help="only report whether the file is patched, patchable or conflicting (exit 2 on conflict)")
    parser.add_argument("--patch", default=None, metavar="FILE",
                        help="the patch to apply (default: the one shipped with hetauto, "
                             "hetauto_megatron/data/patches/pretrain_gpt.patch)")


def _read_text(path: str, what: str) -> str:
    """The file as UTF-8 text, line endings kept; a binary or unreadable file is named, not a traceback."""
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            return fh.read()
    except UnicodeDecodeError:
        raise InputError("is not a UTF-8 text file", file=path, fix=f"pass {what}") from None
    except OSError as exc:
        raise InputError(f"cannot be read: {exc.strerror}", file=path, fix="check the file's permissions") from None


def patch_megatron(megatron_lm: str, *, patch_file: str | None = None, check: bool = False,
                   out=print) -> str:
    """Apply (or with check=True, inspect) the patch. Returns the final status: 'applied' (already),
    'patched' (changed now) or 'patchable' (check only). Raises InputError when it does not fit."""
    patch_file = patch_file or default_patch_path()
    if not os.path.isfile(patch_file):
        raise InputError("patch file not found", file=patch_file,
                         fix="pass --patch with an existing file, or reinstall hetauto (the default patch is "
                             "package data: hetauto_megatron/data/patches/pretrain_gpt.patch)")
    hunks = parse_patch(_read_text(patch_file, "the patch (a unified diff)"), file=patch_file)
    if not os.path.isdir(megatron_lm):
        what = ("the Megatron-LM path is empty" if not megatron_lm else "does not exist"
                if not os.path.exists(megatron_lm) else "is a file, not a directory")
        raise InputError(what, file=megatron_lm or None,
                         fix="pass the root of a Megatron-LM checkout (the folder holding pretrain_gpt.py)")
    target = os.path.join(megatron_lm, TARGET)
    if not os.path.isfile(target):
        raise InputError(f"has no {TARGET}", file=megatron_lm,
                         fix="pass the root of a Megatron-LM checkout (git clone -b core_r0.19.0 "
                             "https://github.com/NVIDIA/Megatron-LM)")
    text = _read_text(target, f"Megatron-LM's {TARGET}")
    crlf = "\r\n" in text
    lines = text.replace("\r\n", "\n").split("\n")
    state = inspect_file(lines, hunks)
    import_line = hunks[0].added[0] if hunks[0].added else None
    if state.status == "conflict" and import_line in lines:
        # it imports the hook: patched by an earlier version of the patch (four lines before the line that ends
        # the process after training, three before the one for user errors), which this one does not patch over
        raise InputError("this pretrain_gpt.py holds an earlier version (or a part) of the hetauto patch and was left "
                         "unchanged: " + "; ".join(state.reasons), file=target,
                         fix=f"restore NVIDIA's file (git checkout {TARGET} in the checkout; git diff first if you "
                             "changed it yourself) and run hetauto patch-megatron again")
    if state.status == "conflict":
        raise InputError("the hetauto patch does not fit this pretrain_gpt.py, which was left unchanged: "
                         + "; ".join(state.reasons), file=target,
                         fix="use a Megatron-LM checkout of branch core_r0.19.0 (megatron-core 0.19.x), or make the "
                             "five changes by hand (patches/README.md lists them)")
    if state.status == "applied":
        verify("\n".join(lines), hunks, file=target)
        out(f"{target}: already patched for --hetauto; nothing to do.")
        return "applied"
    if check:
        out(f"{target}: not patched yet; the patch fits ({len(hunks)} places).")
        for line in fuzz_notes(state):
            out(line)
        return "patchable"
    new_text = "\n".join(apply_hunks(lines, list(state.hunks), state.positions))
    verify(new_text, hunks, file=target)
    real = os.path.realpath(target)        # a symlinked file is patched where it lives, as before
    tmp = f"{real}.hetauto-tmp"
    if not os.access(real, os.W_OK):       # (a rename would replace a read-only file: refused, as writing it was)
        raise InputError("is read-only", file=target, fix=f"make it writable (chmod u+w {target}), or patch a copy")
    try:   # written beside it and renamed over it: a failed write (a full disk) leaves the original whole
        with open(tmp, "w", newline="") as fh:
            fh.write(new_text.replace("\n", "\r\n") if crlf else new_text)
        st = os.stat(real)
        shutil.copymode(real, tmp)
        if hasattr(os, "chown") and os.geteuid() == 0:     # (as root the new file would be root's)
            os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, real)
    except OSError as exc:
        raise InputError(f"cannot write it: {exc.strerror or exc}", file=target,
                         fix="free space or permissions in its folder, or patch a copy") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    out(f"patched {target}:")
    for line in explain(hunks):
        out(line)
    for line in fuzz_notes(state):
        out(line)
    out("Now run it with: --hetauto --hetauto-plan plan.yaml (without --hetauto it trains exactly as before).")
    return "patched"


def run(args) -> int:
    patch_megatron(args.megatron_lm, patch_file=args.patch, check=args.check)
    return 0
