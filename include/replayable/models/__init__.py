"""The model provider's clients, below the hooks and the stages that both use them.

- :mod:`~replayable.models.endpoint`: a connection's fields as :class:`ModelSettings`;
- :mod:`~replayable.models.http`: the HTTP base every client shares (retries, costs);
- :mod:`~replayable.models.embeddings`, :mod:`~replayable.models.chat`,
  :mod:`~replayable.models.batch_api`: the endpoints' clients;
- :mod:`~replayable.models.clients`: each client built from one endpoint's settings;
- :mod:`~replayable.models.choice`: the models and budget a run resolves.

Nothing here imports Airflow: the hooks read the connection and hand its settings in.
"""
