"""Every DAG in dags/ loads without import errors and carries what an operator needs in the UI."""

from __future__ import annotations

import pytest

EXPECTED = {"shoal_backfill", "shoal_catchup_handoff", "shoal_dr_rehearsal", "shoal_retention_guard"}


def test_dags_load_without_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) >= EXPECTED


@pytest.mark.parametrize("dag_id", sorted(EXPECTED))
def test_dag_has_docs_tags_owner_and_retries(dagbag, dag_id):
    dag = dagbag.get_dag(dag_id)
    assert dag is not None, f"{dag_id} did not load"
    assert dag.doc_md and dag.doc_md.strip().startswith(f"# {dag_id}")
    assert "shoal" in dag.tags
    for task in dag.tasks:
        assert task.owner == "shoal", f"{dag_id}.{task.task_id} owner {task.owner!r}"
        assert task.retries is not None
    assert any(t.retries > 0 for t in dag.tasks), f"{dag_id}: no task retries"
