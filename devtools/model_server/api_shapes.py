"""The Files and Batch API's shapes on the wire: ids, JSON bytes, forms, metadata, list pages.

What :mod:`~devtools.model_server.batches` reads from a request and writes into an answer,
checked as OpenAI checks it; a bad value raises a 400 :class:`HttpError` naming it.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from devtools.model_server.errors import HttpError

METADATA_MAX_PAIRS = 16
METADATA_KEY_MAX_CHARS = 64
METADATA_VALUE_MAX_CHARS = 512


def new_id(prefix: str) -> str:
    """A fresh object id, e.g. ``file-…`` or ``batch_…``."""
    return prefix + secrets.token_hex(12)


def to_bytes(payload: object) -> bytes:
    """``payload`` as compact JSON, as the server answers every body."""
    return json.dumps(payload, separators=(",", ":")).encode()


def parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """The fields of a ``multipart/form-data`` body: name -> (filename or None, bytes).

    The first field of a name wins. Raise a 400 :class:`HttpError` for another body.
    """
    if content_type.split(";", 1)[0].strip().lower() != "multipart/form-data":
        raise HttpError(
            400,
            "the request body must be multipart/form-data with the fields 'purpose' and 'file'",
        )
    head = b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n"
    parser = email.parser.BytesParser(policy=email.policy.HTTP)
    message = parser.parsebytes(head + body)
    if not message.is_multipart():
        raise HttpError(400, "the multipart/form-data body has no boundary or no parts")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or name in fields:
            continue
        payload = part.get_payload(decode=True)
        fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields


def metadata(raw: object) -> dict[str, str] | None:
    """A batch's ``metadata``, checked as OpenAI checks it; None when it has none."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > METADATA_MAX_PAIRS:
        raise HttpError(
            400, f"'metadata' must be an object of at most {METADATA_MAX_PAIRS} pairs, or null"
        )
    for key, value in raw.items():
        if len(key) > METADATA_KEY_MAX_CHARS:
            raise HttpError(
                400, f"'metadata' keys must be at most {METADATA_KEY_MAX_CHARS} characters"
            )
        if not isinstance(value, str) or len(value) > METADATA_VALUE_MAX_CHARS:
            raise HttpError(
                400,
                f"'metadata[{key}]' must be a string of at most {METADATA_VALUE_MAX_CHARS} "
                "characters",
            )
    return dict(raw)


def page(
    items: Sequence[Mapping[str, Any]], query: Mapping[str, str], default: int, most: int
) -> dict[str, Any]:
    """A list object of ``items`` (in listing order) after ``?after=ID``, ``?limit`` long."""
    raw_limit = query.get("limit", str(default))
    try:
        limit = int(raw_limit)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise HttpError(400, f"'limit' must be an integer between 1 and {most}")
    start = 0
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise HttpError(400, f"'after' must be the id of a listed object, not {after!r}")
        start = ids.index(after) + 1
    data = list(items[start : start + limit])
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(items),
    }
