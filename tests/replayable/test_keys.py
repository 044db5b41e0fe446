from replayable.keys import config_hash, item_key, sha256_bytes, sha256_file


def test_same_inputs_give_the_same_key():
    assert item_key("extract", "1.0", {"a": 1, "b": 2}, ["doc"]) == item_key(
        "extract", "1.0", {"b": 2, "a": 1}, ["doc"]
    )


def test_key_changes_with_version_config_content_or_stage():
    base = item_key("chunk", "1.0", {"size": 800}, ["doc", "text"])
    assert base != item_key("chunk", "1.1", {"size": 800}, ["doc", "text"])
    assert base != item_key("chunk", "1.0", {"size": 900}, ["doc", "text"])
    assert base != item_key("chunk", "1.0", {"size": 800}, ["doc", "text2"])
    assert base != item_key("embed", "1.0", {"size": 800}, ["doc", "text"])


def test_parts_are_separated_so_concatenation_cannot_collide():
    assert item_key("s", "1", {}, ["ab", "c"]) != item_key("s", "1", {}, ["a", "bc"])


def test_config_hash_ignores_key_order():
    assert config_hash({"x": 1, "y": [1, 2]}) == config_hash({"y": [1, 2], "x": 1})


def test_file_hash_equals_bytes_hash(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 3_000_000)
    assert sha256_file(path) == sha256_bytes(b"x" * 3_000_000)
