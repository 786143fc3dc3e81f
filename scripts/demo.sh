#!/usr/bin/env bash
# The README's main job: install what is needed (.venv from the lock, Kafka jars from Maven Central on first run),
# start the local embedded default (two sandbox Kafka clusters) and run the demo end to end.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
exec "$root/.venv/bin/shoal" demo "$@"
