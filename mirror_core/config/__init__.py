"""Layer 1 of 9 — configuration: validated value objects and nothing else.

Cluster settings (``cluster``), the daemon's pipeline file (``pipeline_file``), a backfill request
(``plan_request``), the range-bound specs users write (``positions``), topic selection and target naming
(``topic_selection``: shared by the daemon and the planner, owned by neither), the commit bounds
(``commit_policy``) and the names Shoal gives things on the clusters (``names``). Built at the edge from what a user
typed or a file holds, refused there with the key named; every layer above takes them as given.
(``tests/unit/test_layering.py`` holds the layers' order and lists every exception still to burn down.)
"""
