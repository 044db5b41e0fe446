"""The Files and Batch API: uploads, batches and their results, their faults and charges."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest
from model_server_calls import API_KEY, DIM, wait_until

from devtools.model_server import LocalModelServer
from devtools.model_server.stats import charge_key


def request_line(custom_id: str, body: dict[str, Any] | Any, **fields: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/embeddings",
        "body": body,
        **fields,
    }


def embedding_line(custom_id: str, inputs: str | list[str], **extra: Any) -> dict[str, Any]:
    return request_line(custom_id, {"model": "local-hash", "input": inputs, **extra})


def jsonl(lines: list[Any]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def upload(client: httpx.Client, data: bytes, name: str = "requests.jsonl") -> httpx.Response:
    return client.post(
        "/files", files={"file": (name, data, "application/jsonl")}, data={"purpose": "batch"}
    )


def create_batch(client: httpx.Client, file_id: str, **extra: Any) -> httpx.Response:
    body = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
    return client.post("/batches", json={**body, **extra})


def start_batch(client: httpx.Client, lines: list[Any], **extra: Any) -> dict[str, Any]:
    """Upload ``lines`` and create a batch over them; return the batch object."""
    uploaded = upload(client, jsonl(lines))
    assert uploaded.status_code == 200, uploaded.text
    created = create_batch(client, uploaded.json()["id"], **extra)
    assert created.status_code == 200, created.text
    batch: dict[str, Any] = created.json()
    return batch


def batch_when(client: httpx.Client, batch_id: str, *statuses: str) -> dict[str, Any]:
    """Poll the batch until its status is one of ``statuses``; return it."""
    found: dict[str, Any] = {}

    def reached() -> bool:
        found.update(client.get(f"/batches/{batch_id}").json())
        return found["status"] in statuses

    wait_until(reached)
    return found


def file_lines(client: httpx.Client, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    response = client.get(f"/files/{file_id}/content")
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/octet-stream"
    return [json.loads(line) for line in response.content.splitlines()]


def by_custom_id(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {line["custom_id"]: line for line in lines}


# The happy path


def test_batch_output_equals_the_sync_answers_and_is_charged_apart(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=0)
    lines = [
        embedding_line("one", "a single input"),
        embedding_line("two", ["first of two", "second of two"]),
        embedding_line("small", "fewer dimensions", dimensions=4),
        embedding_line("packed", ["base64 please", "and again"], encoding_format="base64"),
    ]
    batch = start_batch(client, lines, metadata={"run": "r1"})
    assert batch["status"] == "completed"
    assert batch["object"] == "batch"
    assert batch["endpoint"] == "/v1/embeddings"
    assert batch["metadata"] == {"run": "r1"}
    assert batch["errors"] is None
    assert batch["error_file_id"] is None
    assert batch["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    assert re.fullmatch(r"batch_\w+", batch["id"])
    assert batch["completed_at"] >= batch["created_at"]

    stats = server.stats()
    assert (stats["batches_created"], stats["batch_lines_charged"]) == (1, 4)
    assert stats["batch_inputs_charged"] == 6
    assert stats["batch_line_charges"] == {"one": 1, "two": 1, "small": 1, "packed": 1}
    # Nothing was embedded synchronously: the batch's charges are kept apart.
    assert (stats["requests"], stats["charged"], stats["inputs_embedded"]) == (0, 0, 0)
    assert stats["input_success_counts"] == {}

    output = file_lines(client, batch["output_file_id"])
    assert [line["custom_id"] for line in output] == ["one", "two", "small", "packed"]
    tokens = 0
    for line, sent in zip(output, lines, strict=True):
        assert line["error"] is None
        assert re.fullmatch(r"batch_req_\w+", line["id"])
        assert line["response"]["status_code"] == 200
        assert line["response"]["request_id"].startswith("req_")
        sync = client.post("/embeddings", json=sent["body"])
        assert sync.status_code == 200
        assert line["response"]["body"] == sync.json()
        tokens += line["response"]["body"]["usage"]["total_tokens"]
    assert server.stats()["batch_tokens_charged"] == tokens

    output_file = client.get(f"/files/{batch['output_file_id']}").json()
    assert output_file["purpose"] == "batch_output"
    assert output_file["object"] == "file"


def test_status_goes_from_validating_to_completed_and_charges_at_the_end(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=2.0)
    batch = start_batch(client, [embedding_line(f"c{i}", f"text {i}") for i in range(8)])
    assert batch["status"] == "validating"
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert batch["in_progress_at"] is None
    seen = [batch["status"]]
    charged_before_the_end = []
    while seen[-1] != "completed":
        # The charges are read first: a batch seen unfinished after them had not ended then.
        charged = server.stats()["batch_lines_charged"]
        current = client.get(f"/batches/{batch['id']}").json()
        if current["status"] != seen[-1]:
            seen.append(current["status"])
        if current["status"] != "completed":
            assert current["output_file_id"] is None
            charged_before_the_end.append(charged)
        time.sleep(0.02)
    assert seen == ["validating", "in_progress", "finalizing", "completed"]
    assert set(charged_before_the_end) == {0}
    assert current["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    for stamp in ("in_progress_at", "finalizing_at", "completed_at"):
        assert current[stamp] is not None
    assert current["failed_at"] is None
    assert server.stats()["batch_lines_charged"] == 8


def test_batch_runs_under_the_faults_set_when_it_was_created(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=0.6, batch_fail_inputs_containing={"LATER": 400})
    batch = start_batch(client, [embedding_line("a", "LATER"), embedding_line("b", "fine")])
    server.clear_faults()
    done = batch_when(client, batch["id"], "completed")
    assert done["request_counts"] == {"total": 2, "completed": 1, "failed": 1}


# Validation


def test_invalid_lines_fail_the_batch_naming_each_line(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=0)
    lines: list[Any] = [
        embedding_line("ok", "fine"),
        "not an object",
        {"method": "POST", "url": "/v1/embeddings", "body": {"model": "local-hash"}},
        embedding_line("get", "x") | {"method": "GET"},
        embedding_line("chat", "x") | {"url": "/v1/chat/completions"},
        embedding_line("ok", "again"),
        request_line("notbody", ["x"]),
        request_line("othermodel", {"model": "other", "input": "x"}),
    ]
    data = jsonl(lines) + b"{broken json\n"
    uploaded = upload(client, data).json()
    batch = create_batch(client, uploaded["id"]).json()
    assert batch["status"] == "failed"
    assert batch["failed_at"] is not None
    assert batch["output_file_id"] is None and batch["error_file_id"] is None
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    errors = batch["errors"]
    assert errors["object"] == "list"
    found = [(error["line"], error["code"], error["param"]) for error in errors["data"]]
    assert found == [
        (2, "invalid_json_line", None),
        (3, "missing_required_parameter", "custom_id"),
        (4, "invalid_value", "method"),
        (5, "url_mismatch", "url"),
        (6, "duplicate_custom_id", "custom_id"),
        (7, "invalid_value", "body"),
        (8, "model_mismatch", "body.model"),
        (9, "invalid_json_line", None),
    ]
    assert all(error["message"] for error in errors["data"])
    stats = server.stats()
    assert (stats["batches_created"], stats["batch_lines_charged"]) == (1, 0)


def test_failure_shows_only_once_validation_is_over(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=0.8)
    batch = start_batch(client, ["no"])
    assert (batch["status"], batch["errors"]) == ("validating", None)
    failed = batch_when(client, batch["id"], "failed")
    assert failed["errors"]["data"][0]["code"] == "invalid_json_line"


@pytest.mark.parametrize("data", [b"", b"\n", b"  \n\n"])
def test_empty_file_fails_the_batch(
    client: httpx.Client, server: LocalModelServer, data: bytes
) -> None:
    server.set_faults(batch_delay_s=0)
    batch = create_batch(client, upload(client, data).json()["id"]).json()
    assert batch["status"] == "failed"
    assert batch["errors"]["data"][0]["code"] == "empty_file"


def test_a_body_the_sync_endpoint_refuses_is_a_failed_line_not_a_failed_batch(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=0)
    bad_body = {"model": "local-hash", "input": "x", "dimensions": 0}
    batch = start_batch(client, [embedding_line("good", "fine"), request_line("bad", bad_body)])
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    (failure,) = file_lines(client, batch["error_file_id"])
    sync = client.post("/embeddings", json=bad_body)
    assert sync.status_code == 400
    assert failure["custom_id"] == "bad"
    assert failure["response"]["status_code"] == 400
    assert failure["response"]["body"] == sync.json()


def test_line_limit_fails_the_batch_at_the_first_line_past_it(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=0, batch_max_requests=3)
    fits = start_batch(client, [embedding_line(f"c{i}", "x") for i in range(3)])
    assert fits["status"] == "completed"
    over = start_batch(client, [embedding_line(f"c{i}", "x") for i in range(4)])
    assert over["status"] == "failed"
    (error,) = over["errors"]["data"]
    assert (error["code"], error["line"]) == ("too_many_tasks", 4)
    assert "3" in error["message"]


def test_input_limit_counts_inputs_over_every_line(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=0, batch_max_inputs=5)
    fits = start_batch(
        client, [embedding_line("a", ["1", "2"]), embedding_line("b", ["3", "4", "5"])]
    )
    assert fits["status"] == "completed"
    lines = [embedding_line(f"c{i}", ["x", "y"]) for i in range(3)]
    over = start_batch(client, lines)
    assert over["status"] == "failed"
    (error,) = over["errors"]["data"]
    assert (error["code"], error["line"], error["param"]) == ("too_many_inputs", 3, "body.input")
    assert server.stats()["batch_lines_charged"] == 2


# Faults


def test_poisoned_lines_go_to_the_error_file_with_their_status(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(
        batch_delay_s=0,
        batch_fail_inputs_containing={"RETRY-ME": 503, "NEVER": 400},
        fail_inputs_containing={"EVERYWHERE": 500},
    )
    lines = [
        embedding_line("good-1", "fine"),
        embedding_line("transient", ["fine", "RETRY-ME please"]),
        embedding_line("permanent", "NEVER works"),
        embedding_line("sync-poison", "EVERYWHERE fails"),
        embedding_line("good-2", "also fine"),
    ]
    batch = start_batch(client, lines)
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 5, "completed": 2, "failed": 3}
    assert [line["custom_id"] for line in file_lines(client, batch["output_file_id"])] == [
        "good-1",
        "good-2",
    ]
    failures = by_custom_id(file_lines(client, batch["error_file_id"]))
    statuses = {custom_id: line["response"]["status_code"] for custom_id, line in failures.items()}
    assert statuses == {"transient": 503, "permanent": 400, "sync-poison": 500}
    for line in failures.values():
        assert line["error"] is None
        assert line["response"]["body"]["error"]["code"] == "injected"
    assert failures["transient"]["response"]["body"]["error"]["type"] == "server_error"
    assert server.stats()["batch_line_charges"] == {"good-1": 1, "good-2": 1}
    # The batch-only key leaves synchronous requests alone.
    assert client.post("/embeddings", json=lines[1]["body"]).status_code == 200


def test_expired_batch_keeps_the_share_done_and_charges_only_it(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(
        batch_delay_s=0, batch_expire_after_fraction=0.6, batch_fail_inputs_containing={"BAD": 400}
    )
    lines = [embedding_line(f"c{i}", f"text {i}") for i in range(10)]
    lines[1] = embedding_line("c1", "BAD input")
    batch = start_batch(client, lines)
    assert batch["status"] == "expired"
    assert batch["expired_at"] is not None and batch["completed_at"] is None
    assert batch["request_counts"] == {"total": 10, "completed": 5, "failed": 1}
    output = file_lines(client, batch["output_file_id"])
    assert [line["custom_id"] for line in output] == ["c0", "c2", "c3", "c4", "c5"]
    failures = by_custom_id(file_lines(client, batch["error_file_id"]))
    assert failures["c1"]["response"]["status_code"] == 400
    expired = {custom_id: line for custom_id, line in failures.items() if custom_id != "c1"}
    assert sorted(expired) == ["c6", "c7", "c8", "c9"]
    for line in expired.values():
        assert line["response"] is None
        assert line["error"]["code"] == "batch_expired"
        assert line["error"]["message"]
    stats = server.stats()
    assert stats["batch_lines_charged"] == 5
    assert stats["batch_line_charges"] == dict.fromkeys(["c0", "c2", "c3", "c4", "c5"], 1)


def test_a_completed_batch_charges_the_lines_it_loses_and_returns_none_of_them(
    client: httpx.Client, server: LocalModelServer
) -> None:
    """``batch_lose_lines_rate``: a completed batch runs and charges the lines it draws to
    lose, and writes them to neither file; the draws follow the seed."""
    lines = [embedding_line(f"c{i}", f"text {i}") for i in range(40)]
    lines[3] = embedding_line("c3", "BAD input")

    def lost_lines() -> tuple[set[str], dict[str, Any]]:
        server.reset_stats()
        server.set_faults(
            batch_delay_s=0,
            batch_lose_lines_rate=0.5,
            batch_fail_inputs_containing={"BAD": 400},
            seed=7,
        )
        batch = start_batch(client, lines)
        assert batch["status"] == "completed"
        returned = {line["custom_id"] for line in file_lines(client, batch["output_file_id"])}
        assert {line["custom_id"] for line in file_lines(client, batch["error_file_id"])} == {"c3"}
        return {f"c{i}" for i in range(40)} - returned - {"c3"}, batch

    lost, batch = lost_lines()
    assert 0 < len(lost) < 39
    assert batch["request_counts"] == {"total": 40, "completed": 39, "failed": 1}
    stats = server.stats()
    assert stats["batch_lines_lost"] == len(lost)
    assert stats["batch_lines_charged"] == 39
    assert set(stats["batch_line_charges"]) == {f"c{i}" for i in range(40)} - {"c3"}
    assert stats["embedding_charges"][charge_key("local-hash", DIM, "text 0")] == 1
    assert stats["lost_embedding_charges"] == {}  # lost /v1 responses only
    assert lost_lines()[0] == lost  # the same seed loses the same lines


def test_an_expired_batch_loses_no_line(client: httpx.Client, server: LocalModelServer) -> None:
    server.set_faults(batch_delay_s=0, batch_lose_lines_rate=1.0, batch_expire_after_fraction=0.5)
    batch = start_batch(client, [embedding_line(f"c{i}", f"text {i}") for i in range(4)])
    assert batch["status"] == "expired"
    assert [line["custom_id"] for line in file_lines(client, batch["output_file_id"])] == [
        "c0",
        "c1",
    ]
    assert server.stats()["batch_lines_lost"] == 0


def test_expiring_batch_is_in_progress_until_its_delay(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=1.2, batch_expire_after_fraction=0.5)
    batch = start_batch(client, [embedding_line(f"c{i}", "x") for i in range(4)])
    # Its deadline is batch_delay_s away (in whole seconds), not the 24 h window.
    assert 1 <= batch["expires_at"] - batch["created_at"] <= 2
    in_progress = batch_when(client, batch["id"], "in_progress", "expired")
    assert in_progress["status"] == "in_progress"
    expired = batch_when(client, batch["id"], "expired")
    assert expired["finalizing_at"] is None
    assert expired["request_counts"] == {"total": 4, "completed": 2, "failed": 0}


def test_cancel_keeps_and_charges_the_lines_done_before_it(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=1.6, batch_cancel_after_fraction=0.5)
    batch = start_batch(client, [embedding_line(f"c{i}", f"text {i}") for i in range(6)])
    cancelling = client.post(f"/batches/{batch['id']}/cancel")
    assert cancelling.status_code == 200
    assert cancelling.json()["status"] == "cancelling"
    assert cancelling.json()["cancelling_at"] is not None
    assert server.stats()["batch_lines_charged"] == 0
    again = client.post(f"/batches/{batch['id']}/cancel")
    assert again.json()["status"] in ("cancelling", "cancelled")
    cancelled = batch_when(client, batch["id"], "cancelled")
    assert cancelled["cancelled_at"] is not None and cancelled["completed_at"] is None
    assert cancelled["request_counts"] == {"total": 6, "completed": 3, "failed": 0}
    output = file_lines(client, cancelled["output_file_id"])
    assert [line["custom_id"] for line in output] == ["c0", "c1", "c2"]
    assert cancelled["error_file_id"] is None
    assert server.stats()["batch_line_charges"] == {"c0": 1, "c1": 1, "c2": 1}
    assert client.post(f"/batches/{batch['id']}/cancel").json()["status"] == "cancelled"


def test_cancel_while_validating_leaves_nothing_done(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=1.6)
    batch = start_batch(client, [embedding_line(f"c{i}", "x") for i in range(4)])
    assert client.post(f"/batches/{batch['id']}/cancel").json()["status"] == "cancelling"
    cancelled = batch_when(client, batch["id"], "cancelled")
    assert cancelled["in_progress_at"] is None
    assert cancelled["output_file_id"] is None and cancelled["error_file_id"] is None
    assert cancelled["request_counts"]["completed"] == 0
    assert server.stats()["batch_lines_charged"] == 0


def test_an_ended_batch_cannot_be_cancelled(client: httpx.Client, server: LocalModelServer) -> None:
    server.set_faults(batch_delay_s=0)
    batch = start_batch(client, [embedding_line("a", "x")])
    refused = client.post(f"/batches/{batch['id']}/cancel")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "batch_not_cancellable"
    assert client.post("/batches/batch_unknown/cancel").status_code == 404


def test_lost_upload_response_leaves_an_orphan_file_that_delete_removes(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(lose_upload_responses=1)
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        upload(client, jsonl([embedding_line("a", "x")]), name="orphan.jsonl")
    stats = server.stats()
    assert (stats["files_uploaded"], stats["upload_responses_lost"], stats["files_stored"]) == (
        1,
        1,
        1,
    )
    listed = client.get("/files", params={"purpose": "batch"}).json()
    assert listed["object"] == "list"
    (orphan,) = listed["data"]
    assert (orphan["filename"], orphan["purpose"]) == ("orphan.jsonl", "batch")

    # Only the next upload was lost.
    kept = upload(client, jsonl([embedding_line("b", "y")]))
    assert kept.status_code == 200
    assert server.stats()["files_stored"] == 2

    deleted = client.delete(f"/files/{orphan['id']}")
    assert deleted.json() == {"id": orphan["id"], "object": "file", "deleted": True}
    assert client.get(f"/files/{orphan['id']}").status_code == 404
    assert client.delete(f"/files/{orphan['id']}").status_code == 404
    remaining = client.get("/files", params={"purpose": "batch"}).json()["data"]
    assert [item["id"] for item in remaining] == [kept.json()["id"]]
    assert server.stats()["files_stored"] == 1


# Charges and stats


def test_stats_count_each_custom_id_charged_in_every_batch(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=0)
    file_id = upload(client, jsonl([embedding_line("a", "x y"), embedding_line("b", "z")])).json()
    for _ in range(2):
        assert create_batch(client, file_id["id"]).json()["status"] == "completed"
    stats = server.stats()
    assert stats["batches_created"] == 2
    assert stats["files_uploaded"] == 1
    assert stats["files_stored"] == 3  # the upload and each batch's output file
    assert stats["batch_line_charges"] == {"a": 2, "b": 2}
    assert (stats["batch_lines_charged"], stats["batch_tokens_charged"]) == (4, 6)


def test_reset_drops_every_file_and_batch(client: httpx.Client, server: LocalModelServer) -> None:
    server.set_faults(batch_delay_s=0)
    batch = start_batch(client, [embedding_line("a", "x")])
    running = server.set_faults(batch_delay_s=60)
    assert running["batch_delay_s"] == 60
    unfinished = start_batch(client, [embedding_line("b", "x")])
    server.reset_stats()
    for path in (
        f"/files/{batch['input_file_id']}",
        f"/files/{batch['output_file_id']}/content",
        f"/batches/{batch['id']}",
        f"/batches/{unfinished['id']}",
    ):
        assert client.get(path).status_code == 404, path
    assert client.get("/files").json()["data"] == []
    assert client.get("/batches").json()["data"] == []
    stats = server.stats()
    for counter in ("files_uploaded", "files_stored", "batches_created", "batch_lines_charged"):
        assert stats[counter] == 0, counter
    assert stats["batch_line_charges"] == {}


# The API key and bad requests


def test_every_endpoint_needs_the_api_key(auth_server: LocalModelServer) -> None:
    data = jsonl([embedding_line("a", "x")])
    with httpx.Client(base_url=auth_server.base_url, trust_env=False, timeout=10.0) as anonymous:
        refused = [
            upload(anonymous, data),
            anonymous.get("/files"),
            anonymous.get("/files/file-x/content"),
            anonymous.delete("/files/file-x"),
            create_batch(anonymous, "file-x"),
            anonymous.get("/batches"),
            anonymous.post("/batches/batch_x/cancel"),
        ]
        assert [response.status_code for response in refused] == [401] * len(refused)
        assert refused[0].json()["error"]["code"] == "invalid_api_key"
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(
        base_url=auth_server.base_url, headers=headers, trust_env=False, timeout=10.0
    ) as keyed:
        auth_server.set_faults(batch_delay_s=0)
        try:
            assert start_batch(keyed, [embedding_line("a", "x")])["status"] == "completed"
        finally:
            auth_server.clear_faults()
            auth_server.reset_stats()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"endpoint": "/v1/chat/completions"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"input_file_id": ""}, "input_file_id"),
        ({"metadata": {"k": 1}}, "metadata[k]"),
        ({"metadata": [1]}, "metadata"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ],
)
def test_bad_batch_fields_get_400_naming_them(
    client: httpx.Client, change: dict[str, Any], field: str
) -> None:
    file_id = upload(client, jsonl([embedding_line("a", "x")])).json()["id"]
    response = create_batch(client, file_id, **change)
    assert response.status_code == 400
    assert f"'{field}'" in response.json()["error"]["message"]
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_batch_input_must_be_an_uploaded_batch_file(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(batch_delay_s=0)
    missing = create_batch(client, "file-missing")
    assert missing.status_code == 404
    assert "input_file_id" in missing.json()["error"]["message"]
    batch = start_batch(client, [embedding_line("a", "x")])
    output_as_input = create_batch(client, batch["output_file_id"])
    assert output_as_input.status_code == 400
    assert "'input_file_id'" in output_as_input.json()["error"]["message"]
    assert client.post("/batches", content=b"[1]").status_code == 400


def test_bad_uploads_get_400_naming_the_field(client: httpx.Client) -> None:
    data = b'{"x": 1}\n'
    no_purpose = client.post("/files", files={"file": ("a.jsonl", data)})
    wrong_purpose = client.post(
        "/files", files={"file": ("a.jsonl", data)}, data={"purpose": "fine-tune"}
    )
    no_file = client.post("/files", data={"purpose": "batch"}, files={"other": ("a", b"x")})
    not_multipart = client.post("/files", json={"purpose": "batch", "file": "x"})
    for response, field in (
        (no_purpose, "purpose"),
        (wrong_purpose, "purpose"),
        (no_file, "file"),
        (not_multipart, "multipart/form-data"),
    ):
        assert response.status_code == 400, response.text
        assert field in response.json()["error"]["message"]
    assert client.get("/files").json()["data"] == []


def test_uploads_past_the_storage_cap_get_413(
    client: httpx.Client, server: LocalModelServer
) -> None:
    server.set_faults(files_max_total_bytes=100)
    first = upload(client, b"x" * 80)
    assert first.status_code == 200
    refused = upload(client, b"y" * 30)
    assert refused.status_code == 413
    assert refused.json()["error"]["code"] == "storage_full"
    assert client.delete(f"/files/{first.json()['id']}").status_code == 200
    assert upload(client, b"y" * 30).status_code == 200


# The file and batch endpoints


def test_file_object_content_and_listing(client: httpx.Client) -> None:
    data = b'{"custom_id": "a"}\r\n\xc3\xa9t\xc3\xa9\n'
    first = upload(client, data, name="first.jsonl").json()
    assert first["object"] == "file"
    assert (first["bytes"], first["filename"], first["purpose"]) == (
        len(data),
        "first.jsonl",
        "batch",
    )
    assert re.fullmatch(r"file-\w+", first["id"])
    assert client.get(f"/files/{first['id']}").json() == first
    assert client.get(f"/files/{first['id']}/content").content == data
    second = upload(client, b"{}\n", name="second.jsonl").json()

    newest_first = client.get("/files").json()
    assert [item["id"] for item in newest_first["data"]] == [second["id"], first["id"]]
    assert newest_first["has_more"] is False
    page = client.get("/files", params={"limit": 1, "order": "asc"}).json()
    assert ([item["id"] for item in page["data"]], page["has_more"]) == ([first["id"]], True)
    rest = client.get("/files", params={"order": "asc", "after": page["last_id"]}).json()
    assert [item["id"] for item in rest["data"]] == [second["id"]]
    assert client.get("/files", params={"purpose": "batch_output"}).json()["data"] == []
    assert client.get("/files", params={"limit": 0}).status_code == 400
    assert client.get("/files", params={"order": "up"}).status_code == 400


def test_batch_listing_pages_newest_first(client: httpx.Client, server: LocalModelServer) -> None:
    server.set_faults(batch_delay_s=0)
    file_id = upload(client, jsonl([embedding_line("a", "x")])).json()["id"]
    ids = [create_batch(client, file_id).json()["id"] for _ in range(3)]
    listed = client.get("/batches").json()
    assert [batch["id"] for batch in listed["data"]] == ids[::-1]
    page = client.get("/batches", params={"limit": 2}).json()
    assert (page["has_more"], page["last_id"]) == (True, ids[1])
    rest = client.get("/batches", params={"after": page["last_id"]}).json()
    assert ([batch["id"] for batch in rest["data"]], rest["has_more"]) == ([ids[0]], False)
    assert client.get("/batches", params={"limit": 101}).status_code == 400


def test_unknown_paths_and_methods_below_files_and_batches(client: httpx.Client) -> None:
    assert client.get("/files/file-missing").status_code == 404
    assert client.get("/batches/batch_missing").status_code == 404
    assert client.get("/files/a/b/c").status_code == 404
    wrong = client.put("/batches", json={})
    assert wrong.status_code == 405
    assert wrong.headers["Allow"] == "GET, POST"


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"batch_delay_s": -1}, "batch_delay_s"),
        ({"batch_delay_s": 86_401}, "batch_delay_s"),
        ({"batch_fail_inputs_containing": {"X": 200}}, "batch_fail_inputs_containing[X]"),
        ({"batch_fail_inputs_containing": ["X"]}, "batch_fail_inputs_containing"),
        ({"batch_expire_after_fraction": 1.5}, "batch_expire_after_fraction"),
        ({"batch_cancel_after_fraction": "half"}, "batch_cancel_after_fraction"),
        ({"batch_max_requests": 0}, "batch_max_requests"),
        ({"batch_max_requests": 50_001}, "batch_max_requests"),
        ({"batch_max_inputs": 1.5}, "batch_max_inputs"),
        ({"lose_upload_responses": -1}, "lose_upload_responses"),
        ({"batch_lose_lines_rate": 1.5}, "batch_lose_lines_rate"),
        ({"files_max_total_bytes": 0}, "files_max_total_bytes"),
    ],
)
def test_invalid_batch_fault_values_are_refused_naming_the_key(
    server: LocalModelServer, config: dict[str, Any], key: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(key)):
        server.set_faults(config)


def test_batch_fault_keys_read_back(server: LocalModelServer) -> None:
    defaults = server.faults()
    assert defaults["batch_delay_s"] == 1.0
    assert (defaults["batch_max_requests"], defaults["batch_max_inputs"]) == (50_000, 50_000)
    assert defaults["batch_expire_after_fraction"] is None
    assert defaults["batch_lose_lines_rate"] == 0.0
    config = {
        "batch_delay_s": 0.5,
        "batch_fail_inputs_containing": {"POISON": 503},
        "batch_expire_after_fraction": 0.6,
        "batch_cancel_after_fraction": 0.25,
        "batch_lose_lines_rate": 0.1,
        "batch_max_requests": 10,
        "batch_max_inputs": 20,
        "lose_upload_responses": 2,
        "files_max_total_bytes": 1000,
    }
    shown = server.set_faults(config)
    assert {key: shown[key] for key in config} == config


def test_embedding_charges_count_each_input_per_model_and_dimensions_sync_and_batch(
    client: httpx.Client, server: LocalModelServer
) -> None:
    """An input bought twice per model and dimensions shows 2, whatever mode bought it; a
    lost answer's inputs are counted apart, as charged and never received."""
    server.set_faults(batch_delay_s=0, dedupe=False)
    assert client.post("/embeddings", json={"model": "local-hash", "input": ["a", "b"]}).is_success
    start_batch(client, [embedding_line("one", "a"), embedding_line("small", "a", dimensions=4)])
    server.set_faults(batch_delay_s=0, dedupe=False, lose_response_rate=1.0)
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        client.post("/embeddings", json={"model": "local-hash", "input": "b"})
    stats = server.stats()
    key = charge_key
    assert stats["embedding_charges"] == {
        key("local-hash", DIM, "a"): 2,
        key("local-hash", 4, "a"): 1,
        key("local-hash", DIM, "b"): 2,
    }
    assert stats["lost_embedding_charges"] == {key("local-hash", DIM, "b"): 1}
