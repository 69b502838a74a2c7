"""The two kinds of user-facing failure, and how the CLI reports them.

Everything a user can get wrong (a malformed file, an unknown device, a plan that does not fit the launched
job) raises `InputError`; the CLI prints its one-paragraph message and exits 2. A search that finds nothing
that fits raises `InfeasibleError` (exit 3) saying by how much it misses. A command that stopped its processes
on SIGTERM or SIGHUP raises `StoppedBySignal` (exit 128 + the signal's number). Internal bugs stay tracebacks.
"""
from __future__ import annotations


class InputError(Exception):
    """A user mistake: names the file, the field, what is wrong and how to fix it. Exit code 2."""

    exit_code = 2

    def __init__(self, reason: str, *, file: str | None = None, field: str | None = None, fix: str | None = None):
        self.reason, self.file, self.field, self.fix = reason, file, field, fix
        super().__init__(self.message)

    @property
    def message(self) -> str:
        where = ""
        if self.file and self.field:
            where = f"{self.file}: field '{self.field}': "
        elif self.file:
            where = f"{self.file}: "
        elif self.field:
            where = f"field '{self.field}': "
        text = where + self.reason.rstrip(".") + "."
        if self.fix:
            text += " Fix: " + self.fix.rstrip(".") + "."
        return text

    def within(self, file: str | None = None, prefix: str | None = None) -> "InputError":
        """Return this error re-addressed to a file and/or nested under a field prefix (e.g. 'clusters[1]')."""
        field = self.field
        if prefix:
            field = f"{prefix}.{field}" if field else prefix
        return InputError(self.reason, file=file or self.file, field=field, fix=self.fix)


def first_line(exc: BaseException) -> str:
    """An exception's first line of text (its class name when it has none): the reason a paragraph quotes."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class InfeasibleError(Exception):
    """No plan fits the devices; the paragraph says what is short (e.g. memory per device). Exit code 3.

    Built from its parts, as InputError: `reason` (what misses, and by how much), then the `fix` in the words
    `said` (default "Fix: <fix>"; the bare fix where it reads as a sentence of its own, with a full stop where a
    rewording quotes it mid-paragraph). `file`, `field`, `reason` and `fix` are what a script wants (the --json
    error object carries them, as InputError's), None where the paragraph names none."""

    exit_code = 3

    def __init__(self, reason: str, *, file: str | None = None, field: str | None = None, fix: str | None = None,
                 said: str | None = None):
        self.reason, self.file, self.field, self.fix = reason, file, field, fix
        self.said = (f"Fix: {fix}" if said is None else said) if fix else None
        super().__init__(f"{reason} {self.said}" if self.said else reason)

    def reworded(self, reason: str, said: str | None = None) -> "InfeasibleError":
        """The same miss in another paragraph (one that quotes this one), keeping where it points and its fix."""
        return InfeasibleError(reason, file=self.file, field=self.field, fix=self.fix, said=said)


class StoppedBySignal(SystemExit):
    """A stop signal (SIGTERM, SIGHUP) ended the command after it ended the processes it had started; `message` says
    what was ended, which the raiser has printed already. A SystemExit with the shell's status for death by that
    signal (128 + its number), so that code outside the CLI's main still exits with that status and no traceback;
    the CLI's main also reports it under --json, as a Ctrl-C (kind "interrupted")."""

    def __init__(self, signum: int, message: str):
        super().__init__(128 + signum)
        self.signum, self.message = signum, message
