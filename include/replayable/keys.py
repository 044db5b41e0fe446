"""Item keys: one stable name for "this input, through this code, with this config".

A key changes exactly when the output could change: new input bytes, a new stage code
version, or a config value that shapes the output. Everything keyed is written with
``ON CONFLICT DO NOTHING``, so recomputing a key that exists is a no-op.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_READ_BLOCK = 1 << 20


def canonical_json(value: Any) -> str:
    """Serialise ``value`` so that equal configs give equal strings (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def config_hash(config: Mapping[str, Any]) -> str:
    """Return a short, stable hash of the output-shaping part of a stage config."""
    return hashlib.sha256(canonical_json(dict(config)).encode()).hexdigest()[:16]


def item_key(stage: str, code_version: str, config: Mapping[str, Any], parts: Iterable[str]) -> str:
    """Derive the key of one item of one stage from its content parts, code version and config."""
    digest = hashlib.sha256()
    for field in (stage, code_version, config_hash(config), *parts):
        # A separator that cannot occur in the fields keeps ("ab", "c") apart from ("a", "bc").
        digest.update(field.encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """Return the hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """Return the hex sha256 of a file, read in blocks so that large files stay out of memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()
