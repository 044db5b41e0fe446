"""The pipeline's stages, one folder each: ``extract``, ``chunk`` and ``embed``.

``summarize`` holds, so far, only its chat completions client; what every model client
shares (call records, the budget gate, the retried request) is in ``model_http``.

A stage's folder holds its work as plain typed functions without Airflow (``extract.pdf``,
``chunk.chunker``, ``embed.client``), its :class:`~replayable.runner.StageSpec` (``spec``:
keys, inputs, outputs) and, in its ``__init__``, its code version. What the stages share,
the lineage a spec hash is made of, lives in :mod:`replayable.stages.lineage`.
"""
