#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment and links it as .venv in the repo root.
#
# The environment lives outside the clone, in ~/.cache/hetauto/venv-<hash of requirements.txt and the
# Python version>, so every clone, CI run and later session with the same pins reuses it (a fresh install
# takes about a minute; torch alone is several GB). Set HETAUTO_PYTHON to pick the interpreter and
# HETAUTO_CACHE to move the cache.
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
pip_install() {
  local log rc=0
  log="$(mktemp)"
  "$venv/bin/python" -m pip install -q "$@" >"$log" 2>&1 || rc=$?
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
venv="$cache/venv-$key"
if [ ! -f "$venv/.hetauto-complete" ]; then
  echo "hetauto setup: creating $venv (first time only, about a minute)" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  "$py" -m venv "$venv"
  pip_install --upgrade pip setuptools wheel
  # torch first: deepspeed's build step imports it; DS_BUILD_OPS=0 skips compiling kernels.
  pip_install "$(grep '^torch==' requirements.txt)"
  DS_BUILD_OPS=0 pip_install --no-build-isolation -r requirements.txt
  touch "$venv/.hetauto-complete"
fi
# Editable install of this clone (cheap; re-run every time so the venv points at the current clone).
pip_install --no-deps --no-build-isolation -e "$repo"
ln -sfn "$venv" "$repo/.venv"
echo "hetauto setup: ready ($repo/.venv -> $venv)" >&2
