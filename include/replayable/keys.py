"""Item keys: one stable name for "this input, through this code, with this config".

A key changes exactly when the output could change: new input bytes, a new stage code
version, or a config value that shapes the output. Everything keyed is written with
``ON CONFLICT DO NOTHING``, so recomputing a key that exists is a no-op.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
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
    """Return the hex sha256 of a regular file, read in blocks to keep large files out of memory.

    ``path`` is resolved first, and what it resolved to is opened once, without following a
    final symlink and without blocking, and checked through that descriptor (ADR 0074): a
    FIFO or a device swapped in after the caller's checks is refused (``OSError`` with
    ``EINVAL``) instead of blocking the reader, and a symlink swapped in after the resolution
    is refused by the open (``ELOOP``). Any other ``OSError`` of the open is raised as it is.
    """
    digest = hashlib.sha256()
    real = os.path.realpath(path)
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()
