"""The TORCHRUN a launch script honours: a command and its arguments, split on blanks, or one executable file's path.

The emitted h800.sh of the 736-device plan runs in bash with TORCHRUN set to a recorder (test_emit_megatron's),
which writes the arguments it was started with to the file `launched`.
"""
import json
import sys

from test_emit_megatron import run_launch_check


def launched(tmp_path, torchrun):
    """The argv the launcher got (after the recorder's own path), or None with the script's stderr if refused."""
    record = tmp_path / "launched"
    record.unlink(missing_ok=True)
    proc = run_launch_check(tmp_path, {"TORCHRUN": torchrun})
    if proc.returncode != 0:
        assert proc.returncode == 2 and not record.exists(), proc
        return None, proc.stderr
    return json.loads(record.read_text())["argv"], proc.stderr


def test_torchrun_is_a_command_with_arguments_or_one_path_with_spaces(tmp_path):
    """Before, the script ran `exec $launcher` and checked the value up to its first space: a tab or a leading blank
    said 'the launcher ... is not on PATH', a `*` among the arguments reached torchrun as the file names it matched,
    and a path with a space was cut at it."""
    run_launch_check(tmp_path, {})      # writes the script, the entry script and the recorder into tmp_path
    rec = tmp_path / "recorder.py"
    for value in (f"{sys.executable} {rec}", f" {sys.executable}\t{rec}  ", f"{sys.executable} -u {rec}"):
        argv, err = launched(tmp_path, value)
        assert argv is not None and argv[0] == "--nnodes=32" and "pretrain_gpt.py" in argv, (value, err)
    # no globbing: the recorder and pretrain_gpt.py lie where the script runs, and match *.py
    argv, err = launched(tmp_path, f"{sys.executable} {rec} *.py")
    assert argv is not None and argv[:2] == ["*.py", "--nnodes=32"], (argv, err)
    # a launcher whose path has a space, given alone: run as that one file
    spaced = tmp_path / "my tools" / "torch run"
    spaced.parent.mkdir()
    spaced.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{rec}" "$@"\n')
    spaced.chmod(0o755)
    argv, err = launched(tmp_path, str(spaced))
    assert argv is not None and argv[0] == "--nnodes=32", err
    # ... with arguments it cannot be told from a command (no quotes are read): one line, exit 2, nothing started
    for value, command in ((f"{spaced} --max-restarts=0", str(tmp_path / "my")), ("   ", "(none)")):
        argv, err = launched(tmp_path, value)
        assert argv is None and len(err.strip().splitlines()) == 1, err
        assert f"TORCHRUN={value}: its command {command} is not on PATH" in err and "hetauto launch" in err, err
        assert "no quotes" in err and "one executable file alone" in err, err
