"""Failure notifications for Shoal's paging DAGs (the retention guard, the DR rehearsal): an ``on_failure_callback``
that hands the failure to the notifier the user configured, so a failed guard pages someone.

Configure it with two Airflow Variables (or ``AIRFLOW_VAR_*``):

- ``shoal_failure_notifier``: the dotted path of an Airflow notifier class (a ``BaseNotifier`` such as
  ``airflow.providers.slack.notifications.slack.SlackNotifier``) or of a plain callable ``f(context, **kwargs)``;
- ``shoal_failure_notifier_kwargs``: a JSON object passed to it (e.g. the Slack connection id and channel;
  credentials stay in connections).

Without them the failure is logged, saying how to configure one. A broken notifier is logged, never raised: the
task's own failure is what matters.
"""

from __future__ import annotations

import importlib
import inspect
import logging

log = logging.getLogger(__name__)

NOTIFIER_VARIABLE = "shoal_failure_notifier"
KWARGS_VARIABLE = "shoal_failure_notifier_kwargs"


def notify_failure(context) -> None:
    """``on_failure_callback``: call the configured notifier with the task's context."""
    from airflow.sdk import Variable

    ti = context.get("ti") or context.get("task_instance")
    what = f"{getattr(ti, 'dag_id', '?')}.{getattr(ti, 'task_id', '?')} run {context.get('run_id', '?')}"
    try:
        spec = Variable.get(NOTIFIER_VARIABLE, default=None)
        if not spec:
            log.warning("Shoal failure in %s: no notifier configured (set the Variable %s to a notifier class or "
                        "callable, and %s to its arguments)", what, NOTIFIER_VARIABLE, KWARGS_VARIABLE)
            return
        kwargs = Variable.get(KWARGS_VARIABLE, default={}, deserialize_json=True) or {}
        module, _, name = spec.rpartition(".")
        target = getattr(importlib.import_module(module), name)
        if inspect.isclass(target):
            target(**kwargs)(context)   # a BaseNotifier instance is called with the context
        else:
            target(context, **kwargs)
        log.info("Shoal failure in %s: notified through %s", what, spec)
    except Exception:  # noqa: BLE001 - a broken notifier must not mask the task's own failure
        log.exception("Shoal failure in %s: the notifier %s failed", what, NOTIFIER_VARIABLE)
