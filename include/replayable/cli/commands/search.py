"""``replayable search``: the chunks nearest a question, through the model connection."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from replayable import db
from replayable.cli.errors import UsageError
from replayable.cli.render import emit, search_table
from replayable.keys import sha256_bytes
from replayable.search import Scope, SearchError, check_query, search
from replayable.vocabulary import MODEL_CONN_ID


def scope_of(model: str | None, dag_id: str) -> tuple[Scope, Any]:
    """What a run of ``dag_id`` with default settings (and ``model``) embeds, and the model
    connection's client for it; the caller closes the client."""
    # Imported here: the hook loads Airflow, which only this command needs.
    from replayable.hooks import EmbeddingsHook, run_models
    from replayable.settings import PipelineSettings
    from replayable.stage import pipeline_of
    from replayable.stages import extract

    settings = PipelineSettings(model=model)
    pipeline = pipeline_of(dag_id)
    hook = EmbeddingsHook(MODEL_CONN_ID)
    models = run_models(settings, hook, ["embed"])
    scope = Scope(
        model=models.embed,
        spec_hash=pipeline.spec_hashes(settings, models)["embed"],
        extractor_version=extract.extractor_id(settings.extractor),
        chunker_key=settings.chunk_config.key,
    )
    return scope, hook.get_client(model=models.embed, dimensions=models.dimensions)


def run(conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool) -> int:
    """Print the ``--k`` chunks nearest the question, best first."""
    try:
        query = check_query(args.query)
        scope, client = scope_of(args.model, args.dag_id)
        try:
            key = "replayable-search-" + sha256_bytes(f"{scope.model}\x00{query}".encode())[:40]
            vector = client.embed([query], idempotency_key=key).vectors[0]
        finally:
            client.close()
        hits = search(conn, vector, scope, k=args.k, source=args.source)
    except SearchError as err:
        raise UsageError(str(err)) from None
    data = {"query": query, "model": scope.model, "hits": [hit.as_dict() for hit in hits]}
    emit(console, as_json, data, search_table)
    return 0
