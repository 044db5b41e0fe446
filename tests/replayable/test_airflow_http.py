"""Links into Airflow's UI and the REST calls, against a fake Airflow over real HTTP."""

from __future__ import annotations

import asyncio

import pytest

from fake_airflow import PASSWORD, TOKEN, USERNAME, FakeAirflow
from replayable import airflow_http

RUN = "manual__2026-11-30T07:00:00.123456+00:00"


def test_a_mapped_stage_task_links_to_its_instance_its_log_and_its_run() -> None:
    links = airflow_http.task_links(
        dag_id="document_pipeline", run_id=RUN, stage="embed", map_index=3, try_number=2
    )
    assert links is not None
    run = f"dags/document_pipeline/runs/{RUN}"
    assert links.run == run
    assert links.task_instance == f"{run}/tasks/batch.embed/mapped/3/details"
    assert links.log == f"{run}/tasks/batch.embed/mapped/3?try_number=2"


def test_without_a_try_the_log_link_shows_the_latest_try() -> None:
    links = airflow_http.task_links(
        dag_id="d", run_id="r", stage="extract", map_index=0, try_number=None
    )
    assert links is not None and links.log == "dags/d/runs/r/tasks/batch.extract/mapped/0"


@pytest.mark.parametrize("map_index", [None, -1])
def test_an_unmapped_task_has_no_mapped_segment(map_index: int | None) -> None:
    path = airflow_http.task_instance_path("d", "r", "report", map_index)
    assert path == "dags/d/runs/r/tasks/report"


def test_a_row_without_a_run_has_no_links() -> None:
    assert (
        airflow_http.task_links(dag_id=None, run_id="r", stage="x", map_index=0, try_number=1)
        is None
    )
    assert (
        airflow_http.task_links(dag_id="d", run_id=None, stage="x", map_index=0, try_number=1)
        is None
    )


def test_characters_outside_a_run_id_are_percent_encoded() -> None:
    assert airflow_http.run_path("d", "a b/c?d#e") == "dags/d/runs/a%20b%2Fc%3Fd%23e"


def test_a_trigger_sends_a_null_logical_date_the_conf_and_the_callers_token() -> None:
    with FakeAirflow() as airflow:
        run = airflow_http.trigger_run(
            airflow.url, "the-jwt", "document_pipeline", {"redrive": {"stage": "embed"}}, note="n"
        )
    assert run["dag_run_id"] == "manual__fake-1"
    (sent,) = airflow.sent
    assert sent.path == "/api/v2/dags/document_pipeline/dagRuns"
    assert sent.authorization == "Bearer the-jwt"
    assert sent.body == {"logical_date": None, "conf": {"redrive": {"stage": "embed"}}, "note": "n"}


def test_an_awaited_trigger_sends_the_same_request_as_a_blocking_one() -> None:
    """The UI's trigger, awaited inside the API server, asks exactly what the CLI's asks."""
    conf = {"redrive": {"stage": "embed"}}
    with FakeAirflow() as airflow:
        blocking = airflow_http.trigger_run(airflow.url, "the-jwt", "document_pipeline", conf)
        awaited = asyncio.run(
            airflow_http.trigger_run_async(airflow.url, "the-jwt", "document_pipeline", conf)
        )
    assert (blocking["dag_run_id"], awaited["dag_run_id"]) == ("manual__fake-1", "manual__fake-2")
    first, second = airflow.sent
    assert (first.path, first.authorization, first.body) == (
        second.path,
        second.authorization,
        second.body,
    )


def test_an_awaited_trigger_raises_airflows_refusal() -> None:
    with (
        FakeAirflow(answer=(400, {"detail": "Invalid input for param redrive"})) as airflow,
        pytest.raises(airflow_http.AirflowRefusedError) as refused,
    ):
        asyncio.run(airflow_http.trigger_run_async(airflow.url, "t", "document_pipeline", {}))
    assert (refused.value.status, refused.value.detail) == (400, "Invalid input for param redrive")


def test_a_refused_trigger_raises_with_airflows_status_and_detail() -> None:
    with (
        FakeAirflow(answer=(403, {"detail": "Forbidden"})) as airflow,
        pytest.raises(airflow_http.AirflowRefusedError) as refused,
    ):
        airflow_http.trigger_run(airflow.url, "t", "document_pipeline", {})
    assert (refused.value.status, refused.value.detail) == (403, "Forbidden")


def test_a_token_comes_from_a_login() -> None:
    with FakeAirflow() as airflow:
        assert airflow_http.fetch_token(airflow.url + "/", USERNAME, PASSWORD) == TOKEN
        with pytest.raises(airflow_http.AirflowRefusedError) as refused:
            airflow_http.fetch_token(airflow.url, USERNAME, "wrong")
    assert refused.value.status == 401
