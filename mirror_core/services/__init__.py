"""Layer 7 — services: one entry per user action, shared by every edge.

The CLI, the Airflow operators, sensors and UI page, the Spark job and the daemon call these (preflight, the
backfill's link sizing and progress, mirror status, retention metrics, what a Spark submit ships) instead of
importing each other.
"""
