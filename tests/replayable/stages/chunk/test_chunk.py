import itertools

import pytest

from replayable.stages.chunk.chunker import ChunkConfig, chunk_id, chunk_text

TEXT = " ".join(f"word{i}" for i in range(2000))


def test_chunking_is_deterministic():
    assert chunk_text(TEXT, ChunkConfig(size=200, overlap=40)) == chunk_text(
        TEXT, ChunkConfig(size=200, overlap=40)
    )


def test_chunks_stay_within_size_and_overlap_their_neighbours():
    chunks = chunk_text(TEXT, ChunkConfig(size=200, overlap=40))
    assert all(len(c.text) <= 200 for c in chunks)
    for left, right in itertools.pairwise(chunks):
        assert right.text.split(" ")[0] in left.text.split(" ")


def test_chunks_cover_every_word_in_order():
    chunks = chunk_text(TEXT, ChunkConfig(size=300, overlap=0))
    assert " ".join(c.text for c in chunks) == TEXT
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))


def test_chunk_id_is_the_content_address():
    (only,) = chunk_text("hello  world\n", ChunkConfig())
    assert only.text == "hello world"
    assert only.chunk_id == chunk_id("hello world")


def test_blank_text_gives_no_chunks():
    assert chunk_text(" \n\t ", ChunkConfig()) == []


def test_bad_config_is_rejected_naming_the_value():
    with pytest.raises(ValueError, match="overlap"):
        ChunkConfig(size=100, overlap=60)
    with pytest.raises(ValueError, match="size"):
        ChunkConfig(size=10)
