"""Shoal's Airflow plugins: hooks, operators, sensors, triggers and the UI page. They import ``mirror_core``;
``mirror_core`` never imports them (docs/architecture.md)."""
