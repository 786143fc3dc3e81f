#!/usr/bin/env bash
# The README's main job: install what is needed (.venv from the lock, Kafka jars from Maven Central on first run),
# then run shoal_catchup_handoff end to end on the local embedded default: two sandbox Kafka clusters, Spark
# local[2], Airflow on SQLite (.airflow/), and the mirror daemon taking over at the handoff. Prints the report.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "$root/.venv/bin/python" "$root/scripts/main_job.py" "$@"
