"""docker-compose.yaml and docker/: the scale-out deployment, checked without a Docker engine.

The file is read with ``yaml.safe_load`` (which resolves the ``x-airflow-common`` anchors and
merge keys as Compose does), and ``${VAR:-default}`` references are resolved the way Compose
interpolates them, with only the variables a user must set.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
INIT_SQL = ROOT / "docker" / "init-databases.sql"

AIRFLOW_VERSION = "3.3.2"
# ARCHITECTURE.md, Runtime: Postgres, Redis, API server, scheduler, DAG processor,
# triggerer, workers; plus the one-shot migration they wait for.
COMMANDS = {
    "airflow-init": ["airflow", "db", "migrate"],
    "airflow-apiserver": ["airflow", "api-server"],
    "airflow-scheduler": ["airflow", "scheduler"],
    "airflow-dag-processor": ["airflow", "dag-processor"],
    "airflow-triggerer": ["airflow", "triggerer"],
    "airflow-worker": ["airflow", "celery", "worker"],
}
AIRFLOW_SERVICES = sorted(COMMANDS)
# The only variable without a default: the model provider's connection.
USER_ENV = {"REPLAYABLE_MODEL_CONN": '{"conn_type": "http", "host": "https://example.test/v1"}'}

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>\w+)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|(?P<bare>\w+))"
)


class UnsetVariableError(LookupError):
    pass


def interpolate(value: str, env: dict[str, str]) -> str:
    """Resolve ``$$``, ``$VAR``, ``${VAR}`` and ``${VAR[:]-|?|+arg}`` as Compose does.

    A variable that is unset and has no default raises, instead of Compose's empty string
    with a warning: the deployment must not depend on one.
    """

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["name"] or match["bare"]
        op, arg = match["op"] or "", match["arg"] or ""
        present = name in env and (env[name] != "" or not op.startswith(":"))
        if op.endswith("-"):
            return env[name] if present else arg
        if op.endswith("+"):
            return arg if present else ""
        if present:
            return env[name]
        raise UnsetVariableError(f"${{{name}}} is unset: {arg or 'no default'}")

    return _VAR.sub(replace, value)


def resolve(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, dict):
        return {key: resolve(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [resolve(item, env) for item in node]
    return node


@cache
def raw() -> dict[str, Any]:
    """The file as written, anchors and merge keys applied, ``${…}`` left in place."""
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(loaded, dict)
    return loaded


@cache
def compose() -> dict[str, Any]:
    """The file as Compose sees it with only ``USER_ENV`` set."""
    return dict(resolve(raw(), USER_ENV))


def service(name: str, *, resolved: bool = True) -> dict[str, Any]:
    return dict((compose() if resolved else raw())["services"][name])


def env_of(name: str, *, resolved: bool = True) -> dict[str, str]:
    environment = service(name, resolved=resolved)["environment"]
    assert isinstance(environment, dict), f"{name}: environment must be a mapping"
    return {key: str(value) for key, value in environment.items()}


def mounts(name: str) -> dict[str, str]:
    """Short-syntax volumes of a service as {container path: "source[:mode]"}."""
    found = {}
    for volume in service(name)["volumes"]:
        source, target, *mode = volume.split(":")
        found[target] = ":".join([source, *mode])
    return found


def sql_databases() -> list[str]:
    return re.findall(r"^\s*CREATE DATABASE (\w+)\s*;", INIT_SQL.read_text(), re.M | re.I)


def dockerfile_instructions() -> list[str]:
    """Dockerfile instructions with comments dropped and continuation lines joined."""
    text = re.sub(r"^\s*#.*\n", "", DOCKERFILE.read_text(), flags=re.M)
    return [" ".join(line.split()) for line in text.replace("\\\n", " ").splitlines() if line]


def test_every_service_the_architecture_names_exists() -> None:
    assert set(compose()["services"]) >= {"postgres", "redis", *AIRFLOW_SERVICES}


def test_file_resolves_with_only_the_model_connection_set() -> None:
    # Every other variable has a default: `docker compose up` needs nothing else.
    assert compose()["services"]


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_service_runs_its_component_from_the_shared_image(name: str) -> None:
    spec = service(name)
    assert spec["command"] == COMMANDS[name]
    assert spec["build"] == {"context": ".", "dockerfile": "docker/Dockerfile"}
    assert spec["image"] == service("airflow-apiserver")["image"]


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_service_shares_the_common_environment(name: str) -> None:
    common = {
        key: str(value) for key, value in compose()["x-airflow-common"]["environment"].items()
    }
    env = env_of(name)
    assert env.items() >= common.items()
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert {"AIRFLOW_CONN_REPLAYABLE_DB", "AIRFLOW_CONN_REPLAYABLE_MODEL"} <= env.keys()
    assert env["PYTHONPATH"] == "/opt/airflow/include"


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_service_mounts_dags_plugins_include_and_data_read_only(name: str) -> None:
    env, found = env_of(name), mounts(name)
    assert found[env["AIRFLOW__CORE__DAGS_FOLDER"]] == "./dags:ro"
    assert found[env["AIRFLOW__CORE__PLUGINS_FOLDER"]] == "./plugins:ro"
    assert found[env["PYTHONPATH"]] == "./include:ro"
    assert found["/data"] == "./data:ro"
    # document_pipeline's default source is data/samples beside dags/.
    assert found["/opt/airflow/data/samples"] == "./data/samples:ro"
    for source in ("dags", "plugins", "include/replayable", "data/samples"):
        assert (ROOT / source).is_dir(), source


def test_data_folder_comes_from_replayable_data_with_a_default() -> None:
    volumes = raw()["x-airflow-common"]["volumes"]
    assert "${REPLAYABLE_DATA:-./data}:/data:ro" in volumes
    assert "/srv/pdfs:/data:ro" in resolve(volumes, {**USER_ENV, "REPLAYABLE_DATA": "/srv/pdfs"})


def test_execution_api_url_points_at_the_apiserver_service() -> None:
    env = env_of("airflow-worker")
    url = urlparse(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert url.scheme == "http"
    assert url.hostname == "airflow-apiserver" and "airflow-apiserver" in compose()["services"]
    assert url.port == int(env["AIRFLOW__API__PORT"])
    assert url.path == "/execution/"
    # Bound to every interface inside its container, so the workers can reach it.
    assert env["AIRFLOW__API__HOST"] == "0.0.0.0"  # noqa: S104


def test_metadata_database_broker_and_result_backend_are_compose_services() -> None:
    env = env_of("airflow-scheduler")
    metadata = urlparse(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    broker = urlparse(env["AIRFLOW__CELERY__BROKER_URL"])
    backend = urlparse(env["AIRFLOW__CELERY__RESULT_BACKEND"])
    assert (metadata.scheme, metadata.hostname, metadata.path) == (
        "postgresql+psycopg2",
        "postgres",
        "/airflow",
    )
    assert (broker.scheme, broker.hostname) == ("redis", "redis")
    assert (backend.scheme, backend.hostname, backend.path) == (
        "db+postgresql",
        "postgres",
        "/airflow",
    )
    postgres = service("postgres")["environment"]
    assert (metadata.username, metadata.password) == (
        postgres["POSTGRES_USER"],
        postgres["POSTGRES_PASSWORD"],
    )


def test_replayable_db_connection_is_the_replayable_database_of_the_postgres_service() -> None:
    conn = json.loads(env_of("airflow-worker")["AIRFLOW_CONN_REPLAYABLE_DB"])
    postgres = service("postgres")["environment"]
    assert conn == {
        "conn_type": "postgres",
        "host": "postgres",
        "port": 5432,
        "login": postgres["POSTGRES_USER"],
        "password": postgres["POSTGRES_PASSWORD"],
        "schema": "replayable",
    }


def test_database_password_is_one_variable_everywhere() -> None:
    chosen = "chosen-by-the-user"
    env = {**USER_ENV, "REPLAYABLE_POSTGRES_PASSWORD": chosen}
    worker = resolve(env_of("airflow-worker", resolved=False), env)
    postgres = resolve(service("postgres", resolved=False)["environment"], env)
    assert postgres["POSTGRES_PASSWORD"] == chosen
    assert json.loads(worker["AIRFLOW_CONN_REPLAYABLE_DB"])["password"] == chosen
    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__RESULT_BACKEND"):
        assert urlparse(worker[key]).password == chosen


def test_model_connection_is_required_from_the_environment() -> None:
    value = env_of("airflow-worker", resolved=False)["AIRFLOW_CONN_REPLAYABLE_MODEL"]
    match = re.fullmatch(r"\$\{REPLAYABLE_MODEL_CONN:\?(?P<message>[^}]+)\}", value)
    assert match and "REPLAYABLE_MODEL_CONN" in match["message"]
    with pytest.raises(UnsetVariableError, match="REPLAYABLE_MODEL_CONN"):
        resolve(raw(), {})
    assert (
        env_of("airflow-worker")["AIRFLOW_CONN_REPLAYABLE_MODEL"]
        == (USER_ENV["REPLAYABLE_MODEL_CONN"])
    )


def test_no_api_key_is_committed() -> None:
    text = yaml.safe_dump(raw())  # values only: the comments show a placeholder
    assert not re.search(r"sk-[A-Za-z0-9]{8,}|Bearer\s+\w", text)
    assert not re.search(r'"password":\s*"(?!\$\{)', text)


def test_shared_secrets_come_from_the_environment_with_change_me_defaults() -> None:
    env = env_of("airflow-apiserver", resolved=False)
    for key, variable in (
        ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW_JWT_SECRET"),
        ("AIRFLOW__API__SECRET_KEY", "AIRFLOW_API_SECRET_KEY"),
    ):
        assert re.fullmatch(rf"\$\{{{variable}:-change-me[\w-]*\}}", env[key]), env[key]
        assert resolve(env[key], {variable: "from-env"}) == "from-env"


def test_published_ports_bind_loopback_only() -> None:
    published = {
        name: spec["ports"] for name, spec in compose()["services"].items() if "ports" in spec
    }
    assert published == {"airflow-apiserver": ["127.0.0.1:8080:8080"]}
    for ports in published.values():
        for port in ports:
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), port


def test_every_dependency_waits_on_health_or_completion() -> None:
    services = compose()["services"]
    for name, spec in services.items():
        depends_on = spec.get("depends_on", {})
        assert isinstance(depends_on, dict), f"{name}: depends_on needs conditions"
        for target, how in depends_on.items():
            condition = how["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits on {target}'s health"
            else:
                assert condition == "service_completed_successfully", f"{name} → {target}"
                assert services[target].get("restart") == "no", f"{target} must run once"


def test_airflow_services_wait_for_the_databases_and_the_migration() -> None:
    for name in AIRFLOW_SERVICES:
        conditions = {
            target: how["condition"] for target, how in service(name)["depends_on"].items()
        }
        assert conditions["postgres"] == "service_healthy"
        if name != "airflow-init":
            assert conditions["redis"] == "service_healthy"
            assert conditions["airflow-init"] == "service_completed_successfully"
    # Task processes call the execution API: workers start once the API server answers.
    assert service("airflow-worker")["depends_on"]["airflow-apiserver"] == {
        "condition": "service_healthy"
    }


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, spec in compose()["services"].items():
        if name != "airflow-init":
            assert spec["healthcheck"]["test"], name


def test_apiserver_healthcheck_probes_the_monitor_health_endpoint() -> None:
    probe = " ".join(service("airflow-apiserver")["healthcheck"]["test"])
    assert "http://localhost:8080/api/v2/monitor/health" in probe


def test_healthchecks_pass_shell_variables_through_to_the_container() -> None:
    # `$${HOSTNAME}` in the file is `${HOSTNAME}` for the shell, not a Compose variable.
    for name in ("airflow-worker", "airflow-dag-processor", "airflow-triggerer"):
        probe = " ".join(service(name)["healthcheck"]["test"])
        assert '${HOSTNAME}"' in probe, name


def test_worker_can_be_scaled() -> None:
    worker = service("airflow-worker")
    assert "container_name" not in worker and "ports" not in worker
    assert worker["command"] == ["airflow", "celery", "worker"]


def test_postgres_runs_pgvector_on_a_volume_with_a_healthcheck() -> None:
    postgres = service("postgres")
    assert postgres["image"] == "pgvector/pgvector:pg16"
    assert "pg_isready" in postgres["healthcheck"]["test"]
    named = [volume.split(":")[0] for volume in postgres["volumes"]]
    assert any(source in compose()["volumes"] for source in named)


def test_redis_is_version_7_with_a_healthcheck() -> None:
    redis = service("redis")
    assert redis["image"] == "redis:7"
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_init_script_creates_the_databases_the_connections_use() -> None:
    env = env_of("airflow-worker")
    metadata_db = urlparse(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).path.lstrip("/")
    replayable_db = json.loads(env["AIRFLOW_CONN_REPLAYABLE_DB"])["schema"]
    created = sql_databases()
    assert sorted(created) == sorted({metadata_db, replayable_db})
    # The image must not create one of them itself, or the script's CREATE DATABASE fails.
    assert service("postgres")["environment"]["POSTGRES_DB"] not in created
    init_scripts = {
        source.removesuffix(":ro")
        for target, source in mounts("postgres").items()
        if target.startswith("/docker-entrypoint-initdb.d/")
    }
    assert init_scripts == {"./" + INIT_SQL.relative_to(ROOT).as_posix()}


def test_init_script_creates_pgvector_in_the_replayable_database() -> None:
    pattern = r"^\\connect replayable\s+CREATE EXTENSION IF NOT EXISTS vector;"
    assert re.search(pattern, INIT_SQL.read_text(), re.M)


def test_dockerfile_pins_airflow_and_python_of_the_project() -> None:
    assert dockerfile_instructions()[0] == f"FROM apache/airflow:{AIRFLOW_VERSION}-python3.11"
    requirements = (ROOT / "requirements.txt").read_text()
    assert re.search(rf"^apache-airflow=={re.escape(AIRFLOW_VERSION)}\b", requirements, re.M)


def test_dockerfile_copies_only_files_that_exist_in_the_build_context() -> None:
    context = ROOT / service("airflow-worker")["build"]["context"]
    assert (context / service("airflow-worker")["build"]["dockerfile"]) == DOCKERFILE
    for line in dockerfile_instructions():
        if line.startswith(("COPY ", "ADD ")):
            *sources, _target = line.split()[1:]
            for source in sources:
                assert (context / source).is_file(), source
                # Code comes from the read-only mounts, not the image.
                assert source == "requirements.lock", source
