#!/usr/bin/env bash
# The README's test command: install what is needed, then run the whole suite (unit, property and integration
# tests against real Kafka brokers that the suite starts itself and stops afterwards). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"
