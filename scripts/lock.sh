#!/usr/bin/env bash
# Re-resolves requirements.txt (exact direct pins) into requirements.lock (the whole tree).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
uv pip compile requirements.txt --python-version 3.11 --no-header -o requirements.lock
