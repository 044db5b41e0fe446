"""A real embedding model, offline: WordLlama's ``l2_supercat`` 256-dimension weights.

The ``wordllama`` wheel carries the weights and the tokenizer, so nothing is fetched; it
looks for the tokenizer under a folder name the wheel does not use, though, and would then
download it. :func:`load` lays out a cache folder the way its loader expects, pointing at
the wheel's own file, and loads with downloads disabled, so a missing file is an error,
never a request to the network.

Its vectors mean something (texts about the same thing land close together), which feature
hashing's do not; it is good for demos, tests and small private corpora, not a substitute
for a hosted model. A request's ``dimensions`` below 256 is served by truncation and
re-normalisation, which this model is trained for (Matryoshka).
"""

from __future__ import annotations

import math
import tempfile
import threading
from pathlib import Path
from typing import Any

MODEL = "local-wordllama-256"
DIM = 256

_lock = threading.Lock()
_model: Any = None


def load() -> Any:
    """The loaded model, once per process (about 0.2 s), never touching the network."""
    global _model
    with _lock:
        if _model is None:
            import wordllama
            from wordllama import WordLlama

            bundled = Path(wordllama.__file__).parent / "tokenizers"
            cache = Path(tempfile.mkdtemp(prefix="wordllama-"))
            (cache / "tokenizers").mkdir()
            for config in bundled.glob("*.json"):
                (cache / "tokenizers" / config.name).symlink_to(config)
            _model = WordLlama.load(
                config="l2_supercat", dim=DIM, cache_dir=cache, disable_download=True
            )
    return _model


def embed(texts: list[str], dim: int = DIM) -> list[list[float]]:
    """Unit vectors of ``texts``, truncated to ``dim`` (1 to 256) and normalised again."""
    if not 1 <= dim <= DIM:
        raise ValueError(f"dimensions must be between 1 and {DIM} for {MODEL}, got {dim}")
    matrix = load().embed(texts, norm=False)
    vectors = []
    for row in matrix:
        cut = [float(x) for x in row[:dim]]
        norm = math.sqrt(math.fsum(x * x for x in cut))
        vectors.append([x / norm for x in cut] if norm > 0 else [1.0] + [0.0] * (dim - 1))
    return vectors
