"""Which embedding endpoint is used: decided here, from the Airflow connection's fields.

:class:`replayable.airflow.hooks.ModelHook` reads the connection (default id
``replayable_model``) and hands its fields to :func:`settings_from_fields`. It holds the
endpoint and the secret:

- ``host``: the API root including ``/v1`` (``https://api.openai.com/v1``,
  ``http://127.0.0.1:11434/v1`` for Ollama, …), or a bare host with ``port`` and
  ``schema`` (``http``/``https``) plus ``extra.base_path`` (default ``/v1``);
- ``password``: the API key, if any (never logged, never stored in the ledger);
- ``extra``: ``model``, ``dimensions``, ``timeout_s`` defaults, ``chat_model`` (the
  summarize stage's default), ``max_in_flight``: the
  provider's budget of concurrent requests, ``max_rps``: its budget of requests per
  second, and ``max_tpm``: its budget of tokens per minute, all shared by every task and
  worker; ``prices``: each model's price in USD per million tokens,
  ``{"text-embedding-3-small": {"input": 0.02}, "gpt-4o-mini": {"input": 0.15,
  "output": 0.6}}``, which each answered call is costed at (ADR 0110), and
  ``batch_input``/``batch_output`` for lines of the Batch API (default: half; ADR 0117);
  ``min_batch_poll_s``: the shortest ``batch_poll_s`` a run may ask for (default 10 s;
  ADR 0149).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replayable.endpoints import url_from_fields
from replayable.models.http import Price


@dataclass(frozen=True)
class ModelSettings:
    """Endpoint, credentials and defaults for the embeddings provider."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    model: str | None = None
    dimensions: int | None = None
    timeout_s: float = 30.0
    max_in_flight: int | None = None
    max_rps: float | None = None
    max_tpm: float | None = None
    chat_model: str | None = None
    prices: Mapping[str, Price] = field(default_factory=dict)
    min_batch_poll_s: float = 10.0

    def price_of(self, model: str) -> Price | None:
        return self.prices.get(model)


def settings_from_fields(
    host: str | None,
    port: int | None,
    schema: str | None,
    password: str | None,
    extra: dict[str, Any],
) -> ModelSettings:
    """Build ModelSettings from an Airflow connection's fields; raises naming a missing field."""
    if not host:
        raise ValueError(
            "the model connection has no host: set it to the API root, e.g. "
            "http://127.0.0.1:8765/v1"
        )
    base_url = url_from_fields(host, port, schema, extra.get("base_path", "/v1")).rstrip("/")
    dimensions = extra.get("dimensions")
    return ModelSettings(
        base_url=base_url,
        api_key=password or None,
        model=extra.get("model"),
        dimensions=int(dimensions) if dimensions else None,
        timeout_s=float(extra.get("timeout_s", 30.0)),
        max_in_flight=int(extra["max_in_flight"]) if extra.get("max_in_flight") else None,
        max_rps=float(extra["max_rps"]) if extra.get("max_rps") else None,
        max_tpm=_positive(extra, "max_tpm"),
        chat_model=extra.get("chat_model") or None,
        prices=prices_from_extra(extra.get("prices")),
        min_batch_poll_s=_positive(extra, "min_batch_poll_s") or 10.0,
    )


PRICE_FIELDS = ("input", "output", "batch_input", "batch_output")


def prices_from_extra(value: object) -> dict[str, Price]:
    """The extra's ``prices``: model → ``{"input": usd, "output": usd}`` per million tokens
    (``output`` defaults to 0); raises naming the first field that is not a number >= 0."""
    if value in (None, ""):
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(
            "the model connection's extra prices must map each model to its prices,"
            f' e.g. {{"gpt-4o-mini": {{"input": 0.15, "output": 0.6}}}}, not {value!r}'
        )
    prices = {}
    for model, fields in value.items():
        name = f"prices.{model}"
        if not isinstance(fields, Mapping) or "input" not in fields:
            raise ValueError(
                f"the model connection's extra {name} must hold at least input, not {fields!r}"
            )
        unknown = sorted(set(fields) - set(PRICE_FIELDS))
        if unknown:
            raise ValueError(
                f"the model connection's extra {name} has unknown fields {unknown};"
                f" known: {list(PRICE_FIELDS)}"
            )
        numbers = {}
        for key in PRICE_FIELDS:
            if key.startswith("batch_") and key not in fields:
                continue  # half the synchronous price (Price.of)
            raw = fields.get(key, 0)
            number = (
                float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else -1
            )
            if not (number >= 0 and math.isfinite(number)):
                raise ValueError(
                    f"the model connection's extra {name}.{key} must be USD per million"
                    f" tokens, a number >= 0, not {raw!r}"
                )
            numbers[key] = number
        prices[str(model)] = Price(**numbers)
    return prices


def _positive(extra: dict[str, Any], name: str) -> float | None:
    """``extra[name]`` as a number above 0, None when unset; raises naming it otherwise."""
    value = extra.get(name)
    if value in (None, ""):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise ValueError(
            f"the model connection's extra {name} must be a number above 0, not {value!r}"
        )
    return number
