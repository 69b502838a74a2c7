#!/usr/bin/env bash
# Creates (or reuses) the project's environment: a shared environment with the heavy dependencies, and this
# clone's own small .venv on top of it.
#
# The heavy dependencies (torch, megatron-core, deepspeed, ...) live outside the clone, in
# ~/.cache/hetauto/venv-<hash of requirements.txt and the Python version>, so every clone, CI run and later
# session with the same pins reuses them (a fresh install takes about a minute; torch alone is several GB).
# This clone's code is installed (editable) into .venv in the repo root only: a small virtual environment
# whose site-packages reaches the shared one's packages through a .pth file. Two clones therefore share the
# dependencies but each .venv imports its own clone's code; .venv/bin has `hetauto` and the shared
# environment's console scripts (torchrun, pytest, deepspeed, ...) running .venv's Python, so workers that
# torchrun starts with sys.executable see this clone too. Takes a few seconds once the shared part exists.
# Set HETAUTO_PYTHON to pick the interpreter and HETAUTO_CACHE to move the cache.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

find_python() {
  if [ -n "${HETAUTO_PYTHON:-}" ]; then echo "$HETAUTO_PYTHON"; return; fi
  if command -v pyenv >/dev/null 2>&1; then
    for p in "$(pyenv root)"/versions/3.12*/bin/python3; do
      [ -x "$p" ] && { echo "$p"; return; }
    done
  fi
  for p in python3.12 python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
      command -v "$p"; return
    fi
  done
}

py="$(find_python)"
if [ -z "$py" ] || ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
  echo "hetauto setup: Python 3.12 is required (megatron-core 0.19.2 needs >= 3.12) and none was found." >&2
  echo "Fix: install it (e.g. 'pyenv install 3.12') or point HETAUTO_PYTHON at a python3.12 binary." >&2
  exit 2
fi

# pip, quiet: its log is shown only when it fails (without the "Location ... is ignored" noise some machines'
# pip configuration adds).
# Usage: pip_install PYTHON ARGS...
pip_install() {
  local python="$1" log rc=0
  shift
  log="$(mktemp)"
  "$python" -m pip install -q "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    grep -v "^WARNING: Location 'file:" "$log" >&2 || true
    rm -f "$log"
    echo "hetauto setup: 'pip install $*' failed (exit $rc); see the lines above. It needs access to PyPI." >&2
    exit "$rc"
  fi
  rm -f "$log"
}

key="$( (cat requirements.txt; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-12)"
cache="${HETAUTO_CACHE:-$HOME/.cache/hetauto}"
shared="$cache/venv-$key"
mkdir -p "$cache"
# One clone at a time builds the shared environment; the others wait for it instead of racing (where flock
# exists: util-linux).
exec 9>"$cache/.lock-$key"
command -v flock >/dev/null 2>&1 && flock 9
if [ ! -f "$shared/.hetauto-complete" ]; then
  echo "hetauto setup: creating $shared (first time only, about a minute)" >&2
  rm -rf "$shared"
  "$py" -m venv "$shared"
  pip_install "$shared/bin/python" --upgrade pip setuptools wheel
  # torch first: deepspeed's build step imports it; DS_BUILD_OPS=0 skips compiling kernels.
  pip_install "$shared/bin/python" "$(grep '^torch==' requirements.txt)"
  DS_BUILD_OPS=0 pip_install "$shared/bin/python" --no-build-isolation -r requirements.txt
  touch "$shared/.hetauto-complete"
fi
command -v flock >/dev/null 2>&1 && flock -u 9
exec 9>&-

# This clone's own environment, rebuilt every time (a second or two). Earlier versions of this script linked
# .venv to the shared environment and installed the clone there, so the last clone set up won for every
# clone: such a link is replaced.
own="$repo/.venv"
if [ -L "$own" ]; then rm -f "$own"; else rm -rf "$own"; fi
"$py" -m venv --without-pip "$own"
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
# A path line in a .pth file is appended to sys.path after this site-packages, so this clone's own install
# comes first. The shared environment's .pth files are not processed: a clone an older set-up installed
# there stays invisible.
site_of "$shared/bin/python" >"$(site_of "$own/bin/python")/_hetauto_shared_env.pth"
# pip (from the shared environment) installs into .venv, the environment of the Python that runs it.
pip_install "$own/bin/python" --no-deps --no-build-isolation -e "$repo"
# Its bytecode, once: an editable install leaves compiling to each interpreter, and where PYTHONDONTWRITEBYTECODE
# is set (as on some machines) every process a command starts (torchrun's workers, each test's subprocess)
# compiled the package's modules again (0.1-0.3 s of CPU each; measured here, 12 % of the CLI input tests' time).
# Python checks each file's bytecode against its source, so an edited module is compiled anew.
"$own/bin/python" -m compileall -q "$repo/hetauto_megatron"
# The shared environment's console scripts, running .venv's Python (torchrun, pytest, deepspeed, ...).
for script in "$shared"/bin/*; do
  name="$(basename "$script")"
  [ -e "$own/bin/$name" ] && continue
  if [ "$(head -c 256 "$script" | tr -d '\0' | head -n 1)" = "#!$shared/bin/python" ]; then
    { echo "#!$own/bin/python"; tail -n +2 "$script"; } >"$own/bin/$name"
    chmod +x "$own/bin/$name"
  fi
done

# NVIDIA's Megatron-LM entry script and the two files it imports, at tag core_v0.19.0 (what hetauto's patch is
# written for), for the tests that patch and run it. Best effort and verified: without network access those
# tests are skipped (or set HETAUTO_MEGATRON_LM to a Megatron-LM checkout of branch core_r0.19.0).
mlm="$cache/megatron-lm-core_v0.19.0"
mlm_files="7283c4aeb5a00c694bbf2930527a184fc0d5f607f548c74707c71cc240d05fae  pretrain_gpt.py
8486f2047dd2bd23c82900ac8d0580270d810f1ac6bf3207260d79ac1460e227  model_provider.py
cf4b409d598cd2bbba52edf41f2f772dd59cde741e093fe52c41a2acf9a8ea7b  gpt_builders.py"
if ! (cd "$mlm" 2>/dev/null && echo "$mlm_files" | sha256sum --check --quiet >/dev/null 2>&1); then
  tmp="$(mktemp -d)"
  ok=1
  for f in pretrain_gpt.py model_provider.py gpt_builders.py; do
    curl -fsSL --connect-timeout 5 --max-time 30 -o "$tmp/$f" \
      "https://raw.githubusercontent.com/NVIDIA/Megatron-LM/core_v0.19.0/$f" 2>/dev/null || { ok=0; break; }
  done
  if [ "$ok" = 1 ] && (cd "$tmp" && echo "$mlm_files" | sha256sum --check --quiet >/dev/null 2>&1); then
    rm -rf "$mlm" && mkdir -p "$mlm" && cp "$tmp"/*.py "$mlm"/
  else
    echo "hetauto setup: note: could not download NVIDIA's pretrain_gpt.py (core_v0.19.0); the tests that run it" \
         "will be skipped. Set HETAUTO_MEGATRON_LM to a Megatron-LM checkout of branch core_r0.19.0 to run them." >&2
  fi
  rm -rf "$tmp"
fi
echo "hetauto setup: ready ($own; dependencies from $shared)" >&2
