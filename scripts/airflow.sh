#!/usr/bin/env bash
# The README's UI flow: install what is needed (.venv from the lock), then start a local Airflow 3 in the foreground
# (api-server on http://localhost:8080, scheduler, dag-processor, triggerer; SQLite and the LocalExecutor in
# .airflow/) with the four Shoal DAGs, the "Shoal" page and the connections shoal_source / shoal_target (the Kafka
# sandbox's clusters, started or reused) and shoal_spark (local[2]). Ctrl-C stops it. Log in as `admin`, password in
# .airflow/passwords.json. Options: .venv/bin/python -m shoal_airflow.local_airflow up --help
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "$root/.venv/bin/python" -m shoal_airflow.local_airflow up "$@"
