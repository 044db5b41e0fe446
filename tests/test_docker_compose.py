"""docker-compose.yaml and docker/: the scale-out deployment, checked without a Docker engine.

``docker compose config`` cannot run here, so the file is read the way Compose reads it:
YAML anchors and merge keys (``yaml.safe_load`` applies them), ``${VAR}``, ``${VAR:-x}``,
``${VAR-x}``, ``${VAR:?msg}``, ``${VAR:+x}`` and ``$$`` interpolated with only the variables a
user must set, and each service's ``env_file`` read and overlaid by its ``environment``.

Then it is checked against the rest of the project rather than against itself: the local
cluster (``devtools.devenv``, what ``make cluster`` runs and tests/e2e/test_cluster.py
tests) must run the same components with the same commands and the same settings, and every
name, port, path and credential one part refers to must be what another part defines.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import stat
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from devtools import devenv
from replayable import sources

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
INIT_SQL = ROOT / "docker" / "init-databases.sql"
SECRETS_SCRIPT = ROOT / "docker" / "make_secrets.py"
README = ROOT / "README.md"

# Which component of the local cluster each Compose service is.
COMPONENTS = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
    "airflow-worker": "celery worker",
}
AIRFLOW_SERVICES = sorted([*COMPONENTS, "airflow-init"])
# The variables without a default: the model provider's connection and the secrets.
MODEL_ENV = {"REPLAYABLE_MODEL_CONN": '{"conn_type": "http", "host": "https://example.test/v1"}'}
SECRETS = {
    "AIRFLOW__API_AUTH__JWT_SECRET": "AIRFLOW_JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY": "AIRFLOW_API_SECRET_KEY",
    "AIRFLOW__CORE__FERNET_KEY": "AIRFLOW_FERNET_KEY",
}
# Each database role's password, and the role it is for (docker/init-databases.sql).
ROLE_PASSWORDS = {
    "REPLAYABLE_POSTGRES_PASSWORD": "postgres",  # the superuser: the postgres container only
    "REPLAYABLE_AIRFLOW_DB_PASSWORD": "airflow",  # Airflow's metadata database
    "REPLAYABLE_PIPELINE_DB_PASSWORD": "replayable_pipeline",  # connection replayable_db
    "REPLAYABLE_UI_DB_PASSWORD": "replayable_ui",  # connection replayable_ui_db
}
SECRET_VARIABLES = [*SECRETS.values(), *ROLE_PASSWORDS]
USER_ENV = {
    **MODEL_ENV,
    "AIRFLOW_JWT_SECRET": "jwt-from-env",
    "AIRFLOW_API_SECRET_KEY": "api-from-env",
    "AIRFLOW_FERNET_KEY": "fernet-from-env",
    "REPLAYABLE_POSTGRES_PASSWORD": "pg-from-env",
    "REPLAYABLE_AIRFLOW_DB_PASSWORD": "airflow-db-from-env",
    "REPLAYABLE_PIPELINE_DB_PASSWORD": "pipeline-db-from-env",
    "REPLAYABLE_UI_DB_PASSWORD": "ui-db-from-env",
}

# Settings only one of the two deployments has, and why. Everything else that either sets,
# both set.
COMPOSE_ONLY = {
    # Containers share no airflow.cfg; local components share the one in AIRFLOW_HOME,
    # where Airflow writes generated secrets on first start.
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY",
    "AIRFLOW__CORE__FERNET_KEY",
    # For the containers' healthchecks; locally it would be one more port per scheduler.
    "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK",
    # The image's init (dumb-init) on the workers.
    "DUMB_INIT_SETSID",
}
DEVENV_ONLY = {
    # The local server's webhook receiver stands in for a downstream system; a deployment
    # adds its own (without one, events go out as Airflow asset events only).
    "AIRFLOW_CONN_REPLAYABLE_EVENTS",
    "AIRFLOW_HOME",  # the image sets it (/opt/airflow)
    "NO_PROXY",  # everything local is on 127.0.0.1
    "PATH",  # the venv's `airflow`; the image has it on PATH
}

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


def read_env_file_like_compose(path: Path, env: dict[str, str]) -> dict[str, str]:
    """An ``env_file`` as Compose reads it: ``#`` comments, ``export``, quotes, interpolation."""
    found: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        key, _, value = line.partition("=")
        value = value.strip()
        if value[:1] == "'" and value.endswith("'") and len(value) > 1:
            found[key.strip()] = value[1:-1]
            continue
        if value[:1] == '"' and value.endswith('"') and len(value) > 1:
            value = value[1:-1].replace('\\"', '"')
        else:
            value = re.sub(r"\s+#.*$", "", value)
        found[key.strip()] = interpolate(value, {**env, **found})
    return found


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
    """A service's container environment: its env files, overlaid by ``environment``."""
    spec = service(name, resolved=resolved)
    found: dict[str, str] = {}
    env_files = spec.get("env_file", [])
    for entry in [env_files] if isinstance(env_files, str) else env_files:
        path = entry if isinstance(entry, str) else entry["path"]
        found.update(read_env_file_like_compose(COMPOSE_FILE.parent / path, USER_ENV))
    environment = spec.get("environment", {})
    assert isinstance(environment, dict), f"{name}: environment must be a mapping"
    found.update({key: str(value) for key, value in environment.items()})
    return found


def mounts(name: str) -> dict[str, str]:
    """Short-syntax volumes of a service as {container path: "source[:mode]"}."""
    found = {}
    for volume in service(name)["volumes"]:
        source, target, *mode = volume.split(":")
        found[target] = ":".join([source, *mode])
    return found


def sql_databases() -> list[str]:
    return re.findall(r"^\s*CREATE DATABASE (\w+)\b[^;]*;", INIT_SQL.read_text(), re.M | re.I)


def dockerfile_instructions() -> list[str]:
    """Dockerfile instructions with comments dropped and continuation lines joined."""
    text = re.sub(r"^\s*#.*\n", "", DOCKERFILE.read_text(), flags=re.M)
    return [" ".join(line.split()) for line in text.replace("\\\n", " ").splitlines() if line]


def local_cluster_env() -> dict[str, str]:
    """What ``make cluster`` gives its components, for services on made-up local addresses."""
    services = devenv.Services(
        replayable_dsn="postgresql://postgres@/replayable?host=/run/pg",
        airflow_db_url="postgresql+psycopg2://postgres@/airflow?host=/run/pg",
        model_url="http://127.0.0.1:9/v1",
        model_pid=None,
        pgdata=None,
    )
    return devenv.cluster_env(
        services, Path("/state"), api_port=8793, broker_url="redis://127.0.0.1:6390/0"
    )


def test_every_service_the_architecture_names_exists() -> None:
    assert set(compose()["services"]) >= {"postgres", "redis", *AIRFLOW_SERVICES}


def test_file_resolves_with_the_model_connection_and_the_secrets_set() -> None:
    # Every other variable has a default: `docker compose up` needs nothing else.
    assert compose()["services"]


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_service_runs_from_the_shared_image(name: str) -> None:
    spec = service(name)
    assert spec["build"] == {"context": ".", "dockerfile": "docker/Dockerfile"}
    assert spec["image"] == service("airflow-apiserver")["image"]


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_airflow_service_runs_the_command_the_local_cluster_runs(name: str) -> None:
    assert service(name)["command"] == ["airflow", *devenv.COMMANDS[COMPONENTS[name]]]


def test_compose_and_the_local_cluster_run_the_same_components() -> None:
    local = {label.split("#")[0] for label in devenv.CLUSTER}
    assert set(COMPONENTS.values()) == local == set(devenv.COMMANDS)
    assert sum(label.startswith("celery worker#") for label in devenv.CLUSTER) == 2


def test_migration_runs_the_command_devenv_runs_before_starting_components() -> None:
    assert service("airflow-init")["command"] == ["airflow", *devenv.MIGRATE]


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_service_reads_the_shared_settings_without_overriding_them(name: str) -> None:
    assert service(name)["env_file"] == ["airflow.env"]
    shared = devenv.shared_airflow_env()
    env = env_of(name)
    assert env.items() >= shared.items()
    assert not shared.keys() & service(name).get("environment", {}).keys()
    common = compose()["x-airflow-common"]["environment"]
    assert env.items() >= {key: str(value) for key, value in common.items()}.items()


def test_compose_and_devenv_read_the_shared_file_alike() -> None:
    path = devenv.SHARED_ENV_FILE
    assert read_env_file_like_compose(path, {}) == devenv.read_env_file(path)
    assert devenv.shared_airflow_env()["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"


def test_the_local_cluster_runs_the_shared_settings() -> None:
    local = local_cluster_env()
    assert local.items() >= devenv.shared_airflow_env().items()


def test_compose_and_the_local_cluster_set_the_same_settings() -> None:
    """Nothing is configured in one deployment and forgotten in the other."""
    in_compose = set(env_of("airflow-worker")) - COMPOSE_ONLY
    in_local = set(local_cluster_env()) - DEVENV_ONLY
    assert in_compose == in_local


def test_addresses_differ_between_deployments_but_not_their_kind() -> None:
    """Same database driver, broker, result backend and execution API, each where it runs."""
    compose_env, local = env_of("airflow-worker"), local_cluster_env()
    for key in (
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW__CELERY__BROKER_URL",
        "AIRFLOW__CELERY__RESULT_BACKEND",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    ):
        ours, theirs = urlparse(local[key]), urlparse(compose_env[key])
        assert (ours.scheme, ours.path) == (theirs.scheme, theirs.path), key
    for key in ("AIRFLOW_CONN_REPLAYABLE_DB",):
        ours, theirs = json.loads(local[key]), json.loads(compose_env[key])
        assert (ours["conn_type"], ours["schema"]) == (theirs["conn_type"], theirs["schema"])


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_service_mounts_dags_plugins_include_and_data_read_only(name: str) -> None:
    env, found = env_of(name), mounts(name)
    assert found[env["AIRFLOW__CORE__DAGS_FOLDER"]] == "./dags:ro"
    assert found[env["AIRFLOW__CORE__PLUGINS_FOLDER"]] == "./plugins:ro"
    assert found[env["PYTHONPATH"]] == "./include:ro"
    assert found["/data"] == "./data:ro"
    # A run's source must be under an allowed root (ADR 0012): /data is one.
    assert "/data" in env[sources.ROOTS_ENV].split(":")
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
    assert (metadata.username, metadata.password) == ("airflow", "airflow-db-from-env")


def test_replayable_db_connection_is_the_replayable_database_of_the_postgres_service() -> None:
    conn = json.loads(env_of("airflow-worker")["AIRFLOW_CONN_REPLAYABLE_DB"])
    assert conn == {
        "conn_type": "postgres",
        "host": "postgres",
        "port": 5432,
        "login": "replayable_pipeline",
        "password": "pipeline-db-from-env",
        "schema": "replayable",
    }


def test_the_ui_connects_as_its_own_role_from_the_api_server_only() -> None:
    """The UI plugin runs in the API server; it uses replayable_ui_db when that exists."""
    from replayable.web.database import UI_DSN_CONN_ID

    variable = f"AIRFLOW_CONN_{UI_DSN_CONN_ID.upper()}"
    conn = json.loads(env_of("airflow-apiserver")[variable])
    assert conn == {
        "conn_type": "postgres",
        "host": "postgres",
        "port": 5432,
        "login": "replayable_ui",
        "password": "ui-db-from-env",
        "schema": "replayable",
    }
    for name in AIRFLOW_SERVICES:
        if name != "airflow-apiserver":
            assert variable not in env_of(name), name


def test_no_airflow_service_logs_in_as_the_superuser() -> None:
    """The superuser's password is given to the postgres container and nothing else."""
    superuser = service("postgres")["environment"]["POSTGRES_USER"]
    password = USER_ENV["REPLAYABLE_POSTGRES_PASSWORD"]
    for name in AIRFLOW_SERVICES:
        env = env_of(name)
        assert not any(password in value for value in env.values()), name
        logins = [urlparse(env[key]).username for key in _DATABASE_URLS]
        logins += [json.loads(env[key])["login"] for key in env if key in _DATABASE_CONNS]
        assert superuser not in logins, name


_DATABASE_URLS = ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__RESULT_BACKEND")
_DATABASE_CONNS = ("AIRFLOW_CONN_REPLAYABLE_DB", "AIRFLOW_CONN_REPLAYABLE_UI_DB")


@pytest.mark.parametrize(("variable", "role"), ROLE_PASSWORDS.items())
def test_each_roles_password_is_its_own_variable_wherever_the_role_logs_in(
    variable: str, role: str
) -> None:
    chosen = "chosen-by-the-user"
    env = {**USER_ENV, variable: chosen}
    postgres = resolve(service("postgres", resolved=False)["environment"], env)
    # The init script sets every role's password from the postgres container's environment.
    assert postgres["POSTGRES_PASSWORD" if role == "postgres" else variable] == chosen
    for name in AIRFLOW_SERVICES:
        found = resolve(env_of(name, resolved=False), env)
        for key in _DATABASE_URLS:
            url = urlparse(found[key])
            assert (url.password == chosen) == (url.username == role), (name, key)
        for key in set(_DATABASE_CONNS) & set(found):
            conn = json.loads(found[key])
            assert (conn["password"] == chosen) == (conn["login"] == role), (name, key)


def test_model_connection_is_required_from_the_environment() -> None:
    value = env_of("airflow-worker", resolved=False)["AIRFLOW_CONN_REPLAYABLE_MODEL"]
    match = re.fullmatch(r"\$\{REPLAYABLE_MODEL_CONN:\?(?P<message>[^}]+)\}", value)
    assert match and "REPLAYABLE_MODEL_CONN" in match["message"]
    with pytest.raises(UnsetVariableError, match="REPLAYABLE_MODEL_CONN"):
        resolve(raw(), {k: v for k, v in USER_ENV.items() if k != "REPLAYABLE_MODEL_CONN"})
    assert (
        env_of("airflow-worker")["AIRFLOW_CONN_REPLAYABLE_MODEL"]
        == (USER_ENV["REPLAYABLE_MODEL_CONN"])
    )


def test_no_api_key_is_committed() -> None:
    text = yaml.safe_dump(raw())  # values only: the comments show a placeholder
    assert not re.search(r"sk-[A-Za-z0-9]{8,}|Bearer\s+\w", text)
    assert not re.search(r'"password":\s*"(?!\$\{)', text)


@pytest.mark.parametrize(("key", "variable"), SECRETS.items())
def test_shared_secrets_are_required_from_the_environment(key: str, variable: str) -> None:
    """No default: a well-known JWT secret lets anyone who reaches the API sign a token."""
    value = env_of("airflow-apiserver", resolved=False)[key]
    match = re.fullmatch(rf"\$\{{{variable}:\?(?P<message>[^}}]+)\}}", value)
    assert match and "make secrets" in match["message"], value
    assert resolve(value, {variable: "from-env"}) == "from-env"
    for missing in ({}, {variable: ""}):  # `:?` refuses an empty value too
        with pytest.raises(UnsetVariableError, match=variable):
            resolve(value, missing)


@pytest.mark.parametrize("variable", SECRET_VARIABLES)
def test_compose_refuses_to_start_without_each_secret(variable: str) -> None:
    with pytest.raises(UnsetVariableError, match=variable):
        resolve(raw(), {k: v for k, v in USER_ENV.items() if k != variable})


def test_no_secret_has_a_default_anywhere_in_the_file() -> None:
    text = COMPOSE_FILE.read_text()
    for variable in SECRET_VARIABLES:
        uses = re.findall(rf"\$\{{{variable}(?P<op>[^}}]*)\}}", text)
        assert uses, variable
        assert all(op.startswith(":?") for op in uses), (variable, uses)
    assert "change-me" not in text


def test_env_files_are_kept_out_of_the_build_context() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for name in (".env", ".env.local", ".env.production"):
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name
    assert not any(p.startswith("!") and fnmatch.fnmatch(".env", p[1:]) for p in patterns)
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()


def _write_secrets(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SECRETS_SCRIPT), "--env", str(path), *args],
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )


def dotenv(path: Path) -> dict[str, str]:
    """``KEY=value`` lines, as Compose reads them (single quotes removed)."""
    found = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip().removeprefix("'").removesuffix("'")
    return found


def test_make_secrets_writes_fresh_secrets_the_file_resolves_with(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    done = _write_secrets(env_file)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    values = dotenv(env_file)
    assert sorted(values) == sorted(SECRET_VARIABLES)
    for value in values.values():
        assert value not in done.stdout + done.stderr  # never printed
        assert re.fullmatch(r"[A-Za-z0-9_=-]{32,}", value), value
    from cryptography.fernet import Fernet

    Fernet(values["AIRFLOW_FERNET_KEY"].encode())  # a valid key
    resolved = resolve(raw(), {**MODEL_ENV, **values})
    env = resolved["services"]["airflow-apiserver"]["environment"]
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == values["AIRFLOW_JWT_SECRET"]
    password = values["REPLAYABLE_AIRFLOW_DB_PASSWORD"]
    assert urlparse(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).password == password
    assert len(set(values.values())) == len(values)  # no role shares another's password

    other = tmp_path / "other.env"
    assert _write_secrets(other).returncode == 0
    assert not set(dotenv(other).values()) & set(values.values())  # fresh each time


def test_make_secrets_keeps_an_existing_env_unless_forced(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    model = 'REPLAYABLE_MODEL_CONN=\'{"conn_type": "http", "host": "h"}\'\n'
    env_file.write_text(model + "AIRFLOW_JWT_SECRET=old\nREPLAYABLE_DATA=/srv/pdfs\n")
    before = env_file.read_text()
    refused = _write_secrets(env_file)
    assert refused.returncode == 1 and "FORCE=1" in refused.stderr
    assert env_file.read_text() == before

    forced = _write_secrets(env_file, "--force")
    assert forced.returncode == 0, forced.stderr
    text = env_file.read_text()
    assert text.startswith(model) and "REPLAYABLE_DATA=/srv/pdfs\n" in text
    values = dotenv(env_file)
    assert values["AIRFLOW_JWT_SECRET"] != "old"  # noqa: S105 - the value it must replace
    assert set(SECRET_VARIABLES) <= set(values)
    assert text.count("AIRFLOW_JWT_SECRET=") == 1
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600


def test_make_secrets_runs_the_script_and_passes_force() -> None:
    def dry_run(*args: str) -> list[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
        done = subprocess.run(
            ["make", "-n", "--no-print-directory", "-C", str(ROOT), "secrets", *args],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        return done.stdout.split()

    assert dry_run()[1:] == ["docker/make_secrets.py", "--env", ".env"]
    assert dry_run("FORCE=1")[1:] == ["docker/make_secrets.py", "--env", ".env", "--force"]


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


def test_apiserver_healthcheck_probes_what_devenv_waits_for_on_the_apiservers_port() -> None:
    """The same endpoint that devenv.wait_until_up polls, on the port the server listens on."""
    probe = " ".join(service("airflow-apiserver")["healthcheck"]["test"])
    port = env_of("airflow-apiserver")["AIRFLOW__API__PORT"]
    assert f"http://localhost:{port}/api/v2/monitor/health" in probe
    assert "/api/v2/monitor/health" in Path(devenv.airflow.__file__).read_text()


def test_healthchecks_pass_shell_variables_through_to_the_container() -> None:
    # `$${HOSTNAME}` in the file is `${HOSTNAME}` for the shell, not a Compose variable.
    for name in ("airflow-worker", "airflow-dag-processor", "airflow-triggerer"):
        probe = " ".join(service(name)["healthcheck"]["test"])
        assert '${HOSTNAME}"' in probe, name


def test_worker_can_be_scaled() -> None:
    worker = service("airflow-worker")
    assert "container_name" not in worker and "ports" not in worker


def test_postgres_keeps_its_data_on_a_declared_named_volume() -> None:
    named = [volume.split(":")[0] for volume in service("postgres")["volumes"]]
    assert any(source in compose()["volumes"] for source in named)


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


def test_dockerfile_builds_on_the_airflow_and_python_the_lock_has() -> None:
    locked = (ROOT / "requirements.lock").read_text()
    version = re.search(r"^apache-airflow==(\S+)", locked, re.M)
    assert version
    python = re.search(r'requires-python = ">=(\d+\.\d+)', (ROOT / "pyproject.toml").read_text())
    assert python
    assert dockerfile_instructions()[0] == f"FROM apache/airflow:{version[1]}-python{python[1]}"


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


def test_the_shared_file_refuses_what_compose_would_rewrite(tmp_path: Path) -> None:
    for line in ('A="quoted"', "A='quoted'", "A=${B:-x}", "not a setting"):
        path = tmp_path / "x.env"
        path.write_text(line + "\n")
        with pytest.raises(ValueError, match=r"x\.env:1"):
            devenv.read_env_file(path)


# The init script against a real Postgres: what the image does with it, then each role at work.


@pytest.fixture(scope="module")
def initialised(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A fresh server (its superuser is `postgres`, as in compose) after the init script ran.

    Run by psql with ON_ERROR_STOP and the passwords in its environment, as the image's
    entrypoint runs the files of /docker-entrypoint-initdb.d.
    """
    from chaos.env import EmbeddedPostgres

    server = EmbeddedPostgres(tmp_path_factory.mktemp("init-sql") / "pg").start()
    try:
        # Imported once the server is up: pgserver's first import warns about XDG dirs.
        from pgserver._commands import POSTGRES_BIN_PATH

        done = subprocess.run(
            [
                str(POSTGRES_BIN_PATH / "psql"),
                "-v",
                "ON_ERROR_STOP=1",
                "--no-psqlrc",
                "-h",
                server.host,
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-f",
                str(INIT_SQL),
            ],
            env={**os.environ, **{k: v for k, v in USER_ENV.items() if k in ROLE_PASSWORDS}},
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        yield server
    finally:
        server.stop()


def _as_role(server: Any, role: str, database: str = "replayable") -> Any:
    import psycopg2

    return psycopg2.connect(f"postgresql://{role}@/{database}?host={server.host}")


def _refused(conn: Any, statement: str) -> bool:
    import psycopg2

    try:
        with conn.cursor() as cur:
            cur.execute(statement)
    except psycopg2.errors.InsufficientPrivilege:
        conn.rollback()
        return True
    conn.rollback()
    return False


@pytest.fixture(scope="module")
def migrated(initialised: Any) -> Any:
    """The pipeline's role has applied every migration, as `plan` does on a first run."""
    from replayable import db

    conn = _as_role(initialised, "replayable_pipeline")
    try:
        assert db.migrate(conn)
    finally:
        conn.close()
    return initialised


def test_the_pipeline_role_migrates_and_runs_a_stage_and_is_no_superuser(migrated: Any) -> None:
    from replayable import db
    from replayable.ledger import Ledger, Outcome, RunContext
    from replayable.retry import Classified, ErrorKind

    dsn = f"postgresql://replayable_pipeline@/replayable?host={migrated.host}"
    database = db.Database(dsn)
    try:
        doc = "ab" * 32
        database.transaction(
            lambda conn: db.execute_values(conn, "plan/upsert_documents", [(doc, "/a.pdf", 10)])
        )
        ledger = Ledger(database, "extract", "1.0", "cfg", "spec", RunContext("w1", "r1"))
        assert ledger.claim([("k", doc)])["k"].status == "running"
        failed = Classified("malformed", ErrorKind.TERMINAL, "broken")
        states = database.transaction(
            lambda conn: ledger.finish(conn, [Outcome("k", "failed", failed, "traceback")])
        )
        assert states["k"].status == "dead"
    finally:
        database.close()
    conn = _as_role(migrated, "replayable_pipeline")
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles"
                " WHERE rolname = current_user"
            )
            assert cur.fetchone() == (False, False, False)
        assert _refused(conn, "CREATE TABLE public.mine (x int)")
    finally:
        conn.close()
    with pytest.raises(Exception, match="permission denied"):
        _as_role(migrated, "replayable_pipeline", "airflow").close()


def _table_grants(conn: Any, role: str) -> set[tuple[str, str, str]]:
    """(relation, privilege, column or '') the role holds in schema replayable."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT table_name, privilege_type, '' FROM information_schema.role_table_grants"
            " WHERE grantee = %(role)s AND table_schema = 'replayable'"
            " UNION SELECT table_name, privilege_type, column_name"
            " FROM information_schema.column_privileges"
            " WHERE grantee = %(role)s AND table_schema = 'replayable'"
            " AND privilege_type = 'UPDATE'",
            {"role": role},
        )
        found = {tuple(row) for row in cur.fetchall()}
    conn.rollback()
    return found


def test_the_ui_role_holds_what_the_readme_grants_once_the_pipeline_has_migrated(
    migrated: Any,
) -> None:
    """The README's role is the one the UI is tested with (web/test_ui_role.py runs it too)."""
    found = re.search(r"<!-- ui-role -->\s*```sql\n(?P<sql>.*?)```", README.read_text(), re.S)
    assert found, "README.md has no ui-role block"
    readme_block = found["sql"]
    superuser = _as_role(migrated, "postgres")
    try:
        with superuser.cursor() as cur:
            cur.execute(readme_block.replace("replayable_ui", "readme_ui"))
        superuser.commit()
        assert _table_grants(superuser, "replayable_ui") == _table_grants(superuser, "readme_ui")
        assert ("stage_runs", "SELECT", "") in _table_grants(superuser, "replayable_ui")
    finally:
        superuser.close()
    ui = _as_role(migrated, "replayable_ui")
    try:
        with ui.cursor() as cur:
            cur.execute("SHOW statement_timeout")
            assert cur.fetchone() == ("5s",)
            cur.execute("SELECT count(*) FROM replayable.stage_runs")
            cur.execute("UPDATE replayable.dead_letters SET owner = 'olga'")
        ui.rollback()
        assert _refused(ui, "SELECT text FROM replayable.extractions")
        assert _refused(ui, "UPDATE replayable.dead_letters SET error = 'rewritten'")
    finally:
        ui.close()


def test_airflow_owns_its_metadata_database_and_nothing_else(initialised: Any) -> None:
    conn = _as_role(initialised, "airflow", "airflow")
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE public.airflow_table (x int)")
            cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            assert cur.fetchone() == (False,)
        conn.rollback()
    finally:
        conn.close()
    with pytest.raises(Exception, match="permission denied"):
        _as_role(initialised, "airflow", "replayable").close()


def test_postgres_has_shared_memory_for_the_largest_search_index_build() -> None:
    """pgvector builds an index in parallel in /dev/shm: the container's must hold the most
    memory a build is given (ADR 0120), not Docker's 64 MB default."""
    from replayable.search import BUILD_MEMORY_MAX_MB

    shm = str(compose()["services"]["postgres"].get("shm_size", "64m")).lower()
    number, unit = re.fullmatch(r"(\d+)([kmg]?)b?", shm).groups()  # type: ignore[union-attr]
    megabytes = int(number) * {"k": 1 / 1024, "m": 1, "g": 1024, "": 1 / 2**20}[unit]
    assert megabytes >= BUILD_MEMORY_MAX_MB
