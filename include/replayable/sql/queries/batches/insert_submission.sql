INSERT INTO replayable.provider_batches
    (submission, provider, model, dimensions, lines, inputs, dag_id, run_id, map_index)
VALUES (%(submission)s, %(provider)s, %(model)s, %(dimensions)s, %(lines)s, %(inputs)s,
        %(dag_id)s, %(run_id)s, %(map_index)s)
