"""The few calls of Airflow's REST API that the cluster commands and the tests make.

The admin password is the one Airflow's simple auth manager generated into
``AIRFLOW_HOME``; a JWT for it opens ``/api/v2``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from replayable.vocabulary import PIPELINE_DAG_ID

PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"


def admin_password(env: dict[str, str]) -> str | None:
    """The password ``airflow standalone`` generated for its admin user, once it exists."""
    passwords = Path(env["AIRFLOW_HOME"]) / PASSWORDS_FILE
    return json.loads(passwords.read_text()).get("admin") if passwords.exists() else None


def api_token(url: str, airflow_home: Path, username: str = "admin") -> str:
    """A JWT for ``username`` from the API server at ``url``, with its generated password."""
    passwords = airflow_home / PASSWORDS_FILE
    password = json.loads(passwords.read_text())[username]
    response = httpx.post(f"{url}/auth/token", json={"username": username, "password": password})
    response.raise_for_status()
    return str(response.json()["access_token"])


class AirflowApi:
    """One DAG's runs through Airflow's REST API: trigger, wait, read the task instances."""

    def __init__(self, url: str, token: str, dag_id: str = PIPELINE_DAG_ID) -> None:
        self.dag_id = dag_id
        self.http = httpx.Client(
            base_url=f"{url}/api/v2", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def close(self) -> None:
        self.http.close()

    def wait_for_dag(self, timeout_s: float = 180) -> None:
        """Wait until the DAG processor has parsed the DAG."""
        deadline = time.monotonic() + timeout_s
        while self.http.get(f"/dags/{self.dag_id}").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.dag_id} was not parsed within {timeout_s:.0f} s")
            time.sleep(1)

    def trigger(self, conf: dict[str, Any]) -> str:
        """Trigger a run with ``conf``; return its run id."""
        response = self.http.post(
            f"/dags/{self.dag_id}/dagRuns", json={"logical_date": None, "conf": conf}
        )
        response.raise_for_status()
        return str(response.json()["dag_run_id"])

    def state(self, run_id: str) -> str:
        return str(self.http.get(f"/dags/{self.dag_id}/dagRuns/{run_id}").json()["state"])

    def wait(self, run_id: str, timeout_s: float = 900) -> str:
        """Wait for the run to end; return ``success`` or ``failed``."""
        deadline = time.monotonic() + timeout_s
        while (state := self.state(run_id)) not in ("success", "failed"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run_id} is still {state} after {timeout_s:.0f} s")
            time.sleep(1)
        return state

    def task_instances(self, run_id: str) -> list[dict[str, Any]]:
        found = self.http.get(
            f"/dags/{self.dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 1000}
        )
        found.raise_for_status()
        return list(found.json()["task_instances"])

    def tries(self, run_id: str, task_id: str, map_index: int) -> list[dict[str, Any]]:
        """Every try of one task instance, the current one included."""
        found = self.http.get(
            f"/dags/{self.dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}/tries"
        )
        found.raise_for_status()
        return list(found.json()["task_instances"])
