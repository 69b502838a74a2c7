"""scripts/setup.sh: two clones share the heavy dependencies but each clone's .venv runs that clone's code.

Two temporary clones of this repository (with this checkout's setup.sh) are set up one after the other; then
each clone's .venv/bin/python, its `hetauto` console script, its `torchrun` and a worker started with
sys.executable must import hetauto_megatron from that clone, and torch from the shared environment.
"""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP = os.path.join(ROOT, "scripts", "setup.sh")

# What a process (and a worker it starts with sys.executable) imports, and from where.
PROBE = ("import subprocess, sys, hetauto_megatron, torch; print(hetauto_megatron.__file__); print(torch.__file__); "
         "print(subprocess.check_output([sys.executable, '-c', "
         "'import hetauto_megatron; print(hetauto_megatron.__file__)'], text=True).strip())")


def _env():
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


def _run(args, cwd, timeout=300):
    proc = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def clones(tmp_path_factory):
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")) and \
            not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("needs git and a git checkout of the repository")
    base = tmp_path_factory.mktemp("clones")
    out = []
    for name in ("a", "b"):
        clone = base / name
        _run(["git", "clone", "-q", "--no-hardlinks", ROOT, str(clone)], cwd=base)
        shutil.copy(SETUP, clone / "scripts" / "setup.sh")   # this checkout's set-up, committed or not
        out.append(str(clone))
    for clone in out:   # one after the other: the second must not repoint the first
        _run(["bash", "scripts/setup.sh"], cwd=clone)
    return out


def test_each_clone_imports_its_own_code(clones, tmp_path):
    shared_torch = set()
    for clone in clones:
        python = os.path.join(clone, ".venv", "bin", "python")
        # run from elsewhere, so the current directory cannot be what puts the clone on sys.path
        own, torch_file, worker = _run([python, "-c", PROBE], cwd=tmp_path).split()
        assert own == os.path.join(clone, "hetauto_megatron", "__init__.py")
        assert worker == own, "a worker started with sys.executable imports another clone's code"
        assert not torch_file.startswith(clone), "torch must come from the shared environment"
        shared_torch.add(torch_file)
        # console scripts run the clone's Python: hetauto (the clone's install) and torchrun (the shared one's)
        for script in ("hetauto", "torchrun"):
            path = os.path.join(clone, ".venv", "bin", script)
            with open(path) as fh:
                assert fh.readline().strip() == f"#!{python}", script
        assert "COMMAND" in _run([os.path.join(clone, ".venv", "bin", "hetauto"), "--help"], cwd=tmp_path)
    assert len(shared_torch) == 1, shared_torch


def test_setting_up_again_keeps_the_clone_its_own(clones, tmp_path):
    """Re-running the set-up in the first clone (after the second) still gives the first its own code."""
    first, second = clones
    _run(["bash", "scripts/setup.sh"], cwd=first)
    for clone in (second, first):
        python = os.path.join(clone, ".venv", "bin", "python")
        got = _run([python, "-c", "import hetauto_megatron; print(hetauto_megatron.__file__)"], cwd=tmp_path).strip()
        assert got == os.path.join(clone, "hetauto_megatron", "__init__.py")
