"""Shoal's Airflow package. It imports ``mirror_core``; ``mirror_core`` never imports it (docs/architecture.md).

- :mod:`shoal_airflow.hooks`     ``ShoalKafkaHook``: an Airflow ``kafka`` connection → validated, masked ClusterConfig
- :mod:`shoal_airflow.operators` preflight, plan, retention check, Spark backfill, verify, handoff, drop scratch topics
- :mod:`shoal_airflow.sensors`   caught-up (deferrable) and retention-deadline sensors
- :mod:`shoal_airflow.triggers`  ``ShoalLagTrigger`` (serialize() holds ids and numbers only)
- :mod:`shoal_airflow.params`    the backfill form (JSON Schema Params) and its cross-field validation
- :mod:`shoal_airflow.errors`    mirror_core errors mapped to Airflow failures and retries (the lag and the DR
  rehearsal's records need no Airflow: :mod:`mirror_core.services.lag`, :mod:`mirror_core.services.rehearsal`)
- :mod:`shoal_airflow.shoal_ui`  the "Shoal" page in the Airflow UI (``AirflowPlugin``, entry point ``airflow.plugins``)
- :mod:`shoal_airflow.provider_info` what Airflow's providers manager lists (entry point ``apache_airflow_provider``)
- :mod:`shoal_airflow.legacy_paths` the old module paths (``plugins.triggers.ShoalLagTrigger`` …) kept importable
- :mod:`shoal_airflow.local_airflow` the README's local Airflow: config, connections, the four processes

Importing this package is cheap (no Airflow import): Airflow imports it in every process through the entry points.
"""

from shoal_airflow import legacy_paths as _legacy_paths

_legacy_paths.install()
