"""Fixtures of the runner's tests."""

import pytest

from helpers.runner import CHUNKS, connect_to, run, seed_documents
from replayable.stages.chunk.spec import ChunkSpec


@pytest.fixture
def chunked(conn, dsn):
    doc_ids = seed_documents(conn, 6)
    result = run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    assert sorted(result.done) == doc_ids
    return doc_ids
