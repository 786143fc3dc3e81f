"""Layer 7 — services: one entry per user action, shared by every edge.

The CLI, the Airflow operators, sensors and UI page, the Spark job and the daemon call these instead of importing
each other: preflight, plan inputs and plan files (``plan_inputs``), the retention verdict and its report
(``deadlines``, ``deadlines_report``), handoff and the seam check, group sync, mirror status and the page's pipeline
view, lag, DR rehearsal records, a backfill run's driver work (``backfill_run``) with its link sizing and progress,
retention metrics, and what a Spark submit ships.
"""
