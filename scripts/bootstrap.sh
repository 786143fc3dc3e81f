#!/usr/bin/env bash
# Creates the project-local virtual environment (.venv) from the resolved lock and installs Shoal into it.
# Idempotent and quick when nothing changed: the lock's hash is stamped into the venv.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
stamp="$venv/.shoal-lock.sha256"
want="$(cat requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi

py="${SHOAL_PYTHON:-python3}"
# the lock is resolved for 3.11 and several of its packages need >= 3.11; Airflow 3.3 excludes 3.15
if ! "$py" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 15) else 1)'; then
  echo "shoal: Python 3.11 to 3.14 is required (found $("$py" --version 2>&1)); set SHOAL_PYTHON" >&2
  exit 1
fi
user_uv="$("$py" -m site --user-base 2>/dev/null)/bin/uv"  # an earlier install's, used if there, never made here
if command -v uv >/dev/null 2>&1; then
  uv_bin="$(command -v uv)"
elif [ -x "$user_uv" ]; then
  uv_bin="$user_uv"
else
  # No `pip install --user`: PEP 668 refuses it on Debian/Ubuntu/Homebrew Pythons. uv goes into the project's own
  # venv instead (created with the standard library's venv module).
  if [ ! -x "$venv/bin/python" ] && ! "$py" -m venv "$venv"; then
    echo "shoal: '$py -m venv' failed; install the venv module (Debian/Ubuntu: apt install python3-venv) or uv" >&2
    exit 1
  fi
  if [ ! -x "$venv/bin/uv" ]; then
    # a venv made by uv has no pip: the standard library's ensurepip adds it
    "$venv/bin/python" -m pip --version >/dev/null 2>&1 || "$venv/bin/python" -m ensurepip --quiet
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check uv
  fi
  uv_bin="$venv/bin/uv"
fi

echo "shoal: creating $venv from requirements.lock" >&2
[ -x "$venv/bin/python" ] || "$uv_bin" venv --quiet --python "$py" "$venv"
# --no-deps: the lock is the complete tree (see scripts/lock.sh for the one package left out on purpose)
"$uv_bin" pip install --quiet --python "$venv/bin/python" --no-deps -r requirements.lock
# compat mode: a path entry for the checkout, so packages added later import without reinstalling
"$uv_bin" pip install --quiet --python "$venv/bin/python" --no-deps --config-settings editable_mode=compat -e .
# setuptools leaves shoal.egg-info in the checkout, which that path entry puts on sys.path: a second copy of the
# metadata beside the venv's dist-info, so Airflow would load the Shoal plugin twice (a plugin import error in the UI)
rm -rf "$root/shoal.egg-info"
echo "$want" > "$stamp"
