"""Write `.env` for docker-compose.yaml with fresh random secrets: ``make secrets``.

Writes AIRFLOW_JWT_SECRET, AIRFLOW_API_SECRET_KEY, AIRFLOW_FERNET_KEY and a password for
each database role: REPLAYABLE_POSTGRES_PASSWORD (the superuser), REPLAYABLE_AIRFLOW_DB_PASSWORD,
REPLAYABLE_PIPELINE_DB_PASSWORD and REPLAYABLE_UI_DB_PASSWORD (readable by the owner only), plus
a commented line for the model connection. An existing file is never replaced silently:
without ``--force`` it is kept (at a terminal you are asked first); with ``--force`` its
secrets are replaced and every other line (the model connection, REPLAYABLE_DATA, ...) is
kept. Only the standard library: it runs before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

# Letters, digits, '-' and '_' only: safe unquoted in .env, in URLs and in JSON strings.
GENERATORS: dict[str, Callable[[], str]] = {
    "AIRFLOW_JWT_SECRET": lambda: secrets.token_urlsafe(48),
    "AIRFLOW_API_SECRET_KEY": lambda: secrets.token_urlsafe(48),
    # Fernet: 32 random bytes, URL-safe base64 (what Fernet.generate_key() returns).
    "AIRFLOW_FERNET_KEY": lambda: base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
    "REPLAYABLE_POSTGRES_PASSWORD": lambda: secrets.token_hex(24),
    # One per role (docker/init-databases.sql): holding one never logs you in as another.
    "REPLAYABLE_AIRFLOW_DB_PASSWORD": lambda: secrets.token_hex(24),
    "REPLAYABLE_PIPELINE_DB_PASSWORD": lambda: secrets.token_hex(24),
    "REPLAYABLE_UI_DB_PASSWORD": lambda: secrets.token_hex(24),
}
HEADER = """\
# Secrets for docker-compose.yaml, written by `make secrets`. Never commit this file.
# A new AIRFLOW_FERNET_KEY cannot decrypt what the old one encrypted, and the database
# passwords (REPLAYABLE_*_PASSWORD) are only read when the database volume is first created.
"""
MODEL_HINT = """\
# The model provider (required), as an Airflow connection in JSON, e.g.:
# REPLAYABLE_MODEL_CONN='{"conn_type": "http", "host": "https://api.openai.com/v1",
#   "password": "sk-..."}'  (on one line)
"""
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*=")


def render(existing: str | None) -> str:
    """The new file: fresh secrets, and every other line of ``existing`` as it was."""
    fresh = {name: make() for name, make in GENERATORS.items()}
    if existing is None:
        lines = [HEADER, *(f"{name}={value}\n" for name, value in fresh.items()), MODEL_HINT]
        return "".join(lines)
    kept: list[str] = []
    for line in existing.splitlines(keepends=True):
        match = _ASSIGNMENT.match(line)
        name = match["name"] if match else None
        if name in fresh:
            kept.append(f"{name}={fresh.pop(name)}\n")
        else:
            kept.append(line if line.endswith("\n") else line + "\n")
    kept += [f"{name}={value}\n" for name, value in fresh.items()]
    return "".join(kept)


def _confirmed(path: Path) -> bool:
    if not sys.stdin.isatty():
        return False
    answer = input(f"{path} exists. Replace its secrets (other lines are kept)? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", type=Path, default=Path(".env"), help="default: %(default)s")
    parser.add_argument(
        "--force", action="store_true", help="replace the secrets of an existing file"
    )
    args = parser.parse_args(argv)
    path: Path = args.env
    existing = path.read_text() if path.exists() else None
    if existing is not None and not (args.force or _confirmed(path)):
        print(
            f"{path} exists; kept as it is. `make secrets FORCE=1` replaces its secrets "
            "(and keeps its other lines).",
            file=sys.stderr,
        )
        return 1
    text = render(existing)
    # Created owner-only before anything is written; an existing file is narrowed too.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)
    verb = "replaced the secrets in" if existing is not None else "wrote"
    print(f"{verb} {path}: {', '.join(GENERATORS)} (values not shown)")
    if existing is not None:
        print(
            "note: a new AIRFLOW_FERNET_KEY cannot read what the old one encrypted, and a "
            "new REPLAYABLE_POSTGRES_PASSWORD needs a new database volume",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
