"""Benchmarks for Shoal's copy path; figures are reported in ``docs/performance.md`` (not timed tests)."""
