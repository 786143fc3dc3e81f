"""Layer 1 of 9 — configuration: validated value objects and nothing else.

Cluster settings (``cluster``), the daemon's pipeline file (``pipeline_file``) and the range-bound specs users write
(``positions``). Built at the edge from what a user typed or a file holds, refused there with the key named; every
layer above takes them as given. Imports only :mod:`mirror_core.errors` (the layer check in
``tests/unit/test_layers.py`` holds the order and lists every exception still to burn down).
"""
