"""Shoal's Airflow plugins. They import ``mirror_core``; ``mirror_core`` never imports them (docs/architecture.md).

- :mod:`plugins.hooks`     ``ShoalKafkaHook``: an Airflow ``kafka`` connection → validated, masked ClusterConfig
- :mod:`plugins.operators` preflight, plan, retention check, Spark backfill, verify, handoff, drop scratch topics
- :mod:`plugins.sensors`   caught-up (deferrable) and retention-deadline sensors
- :mod:`plugins.triggers`  ``ShoalLagTrigger`` (serialize() holds ids and numbers only)
- :mod:`plugins.params`    the backfill form (JSON Schema Params) and its cross-field validation
- :mod:`plugins.lag`, :mod:`plugins.rehearsal`, :mod:`plugins.errors` helpers (lag, DR results, error mapping)
- :mod:`plugins.shoal_ui`  the "Shoal" page in the Airflow UI (AirflowPlugin)
"""
