"""What a task reads from its Airflow context, beyond its own arguments."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.sdk import Context


def triggered_by(context: Context) -> str:
    """The person (or system) behind this run, for the ledger's resolution notes."""
    dag_run = context["dag_run"]
    return getattr(dag_run, "triggering_user_name", None) or str(dag_run.run_type)
