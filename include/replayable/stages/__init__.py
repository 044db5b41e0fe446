"""The pipeline's stages, one folder each: ``extract``, ``chunk``, ``embed`` and ``summarize``.

A stage's folder holds its work as plain typed functions without Airflow (``extract.pdf``,
``chunk.chunker``, ``embed.client``, ``summarize.client``), its
:class:`~replayable.runner.StageSpec` (``spec``: keys, inputs, outputs) and, in its
``__init__``, its code version. Their definitions, what each reads and how it is built, are in
:mod:`~replayable.stages.builtin` (the API: :mod:`replayable.stage`).

What the stages share: the lineage a spec hash is made of (:mod:`~replayable.stages.lineage`),
the items of a stage that reads extracted text (:mod:`~replayable.stages.texts`), what every
model client does (:mod:`~replayable.models.http`: call records, the budget gate, the
retried request) and what a stage does around the calls it pays for
(:mod:`~replayable.stages.model_calls`).
"""
