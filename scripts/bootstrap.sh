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
if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
  echo "shoal: Python >= 3.10 is required (found $("$py" --version 2>&1)); set SHOAL_PYTHON" >&2
  exit 1
fi
if ! command -v uv >/dev/null 2>&1; then
  echo "shoal: installing uv (the resolver/installer) into the user site" >&2
  "$py" -m pip install --quiet --user uv || "$py" -m pip install --quiet uv
  export PATH="$HOME/.local/bin:$PATH"
fi
uv_bin="$(command -v uv || echo "$("$py" -m site --user-base)/bin/uv")"

echo "shoal: creating $venv from requirements.lock" >&2
[ -x "$venv/bin/python" ] || "$uv_bin" venv --quiet --python "$py" "$venv"
# --no-deps: the lock is the complete tree (see scripts/lock.sh for the one package left out on purpose)
"$uv_bin" pip install --quiet --python "$venv/bin/python" --no-deps -r requirements.lock
# compat mode: a path entry for the checkout, so packages added later import without reinstalling
"$uv_bin" pip install --quiet --python "$venv/bin/python" --no-deps --config-settings editable_mode=compat -e .
echo "$want" > "$stamp"
