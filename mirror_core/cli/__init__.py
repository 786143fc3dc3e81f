"""Layer 9 — cli: ``shoal``, parsing and printing (``python -m mirror_core.cli``).

``main`` builds the parser and dispatches; one module per command family; ``deadlines_report`` renders.
"""
