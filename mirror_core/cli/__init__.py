"""Layer 9 — cli: ``shoal``, parsing and printing (``python -m mirror_core.cli``).

``main`` builds the parser and dispatches; one module per command family; ``clusters`` resolves ``--source`` /
``--target``. Library code never imports this layer (the layer check says so).
"""
