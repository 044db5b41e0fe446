-- Creates the databases of the docker-compose deployment and one role per client, so that
-- nothing but this script logs in as the superuser (ADR 0079). The postgres image runs this
-- file with psql (ON_ERROR_STOP), as the superuser POSTGRES_USER, once: when its data volume
-- is empty. To re-run it, remove the volume (`docker compose down --volumes` deletes all
-- data), or run it by hand as the superuser with the four passwords in psql's environment.
--
--   airflow     Airflow's metadata database (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN), owned
--               by the role airflow
--   replayable  the pipeline's ledger and outputs: schema replayable, owned by the role
--               replayable_pipeline (connection replayable_db), which migrates it; the role
--               replayable_ui (connection replayable_ui_db, the API server only) reads the
--               ledger and, for the search, chunks and their vectors, and changes dead
--               letters' work-list columns, nothing else
--
-- POSTGRES_DB is set to `postgres` in docker-compose.yaml so that the image itself creates
-- neither database (a second CREATE DATABASE would stop the initialisation).
--
-- The passwords come from the postgres container's environment (`make secrets` writes
-- them); psql quotes each as a literal. An unset one leaves `:'name'` unexpanded, which is
-- a syntax error: the initialisation stops rather than create a role without a password.
\getenv airflow_password REPLAYABLE_AIRFLOW_DB_PASSWORD
\getenv pipeline_password REPLAYABLE_PIPELINE_DB_PASSWORD
\getenv ui_password REPLAYABLE_UI_DB_PASSWORD

CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE ROLE replayable_pipeline LOGIN PASSWORD :'pipeline_password';
-- The UI's limits, as in the README's least-privilege role: a few connections, short queries.
CREATE ROLE replayable_ui LOGIN CONNECTION LIMIT 8 PASSWORD :'ui_password';
ALTER ROLE replayable_ui SET statement_timeout = '5s';

-- Airflow creates its tables in the public schema, which belongs to the database's owner.
CREATE DATABASE airflow OWNER airflow;
CREATE DATABASE replayable;
-- PUBLIC may connect to a new database by default: only the roles named here may.
REVOKE ALL ON DATABASE airflow, replayable FROM PUBLIC;
-- CREATE: the migration's CREATE SCHEMA IF NOT EXISTS checks it even when the schema exists.
GRANT CONNECT, TEMPORARY, CREATE ON DATABASE replayable TO replayable_pipeline;
GRANT CONNECT ON DATABASE replayable TO replayable_ui;

-- The pipeline's schema migration starts with CREATE EXTENSION IF NOT EXISTS vector, which
-- only a superuser may run the first time: it is done here, so the migration finds it.
\connect replayable
CREATE EXTENSION IF NOT EXISTS vector;
-- The pipeline owns its schema: its migrations create, alter and grant within it.
CREATE SCHEMA replayable AUTHORIZATION replayable_pipeline;
GRANT USAGE ON SCHEMA replayable TO replayable_ui;

-- The UI's grants name tables that the pipeline's migrations create later, on the first run
-- of `plan`, and columns that later migrations add. This trigger grants them whenever DDL
-- in this database ends, to whatever exists by then; GRANT is idempotent. The list is the
-- README's ui-role block (tests/test_docker_compose.py checks that they grant alike).
CREATE FUNCTION public.replayable_grant_ui() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    relation text;
    work_list_column text;
BEGIN
    FOREACH relation IN ARRAY ARRAY[
        'documents', 'stage_runs', 'stage_counts', 'runs', 'run_docs', 'run_reports',
        'dead_letters', 'dead_letter_history', 'dead_letter_counts', 'model_call_counts',
        'model_cost_counts', 'outbox_counts',
        -- The search reads chunks and their vectors; its writes go through replayable_db.
        'doc_chunks', 'chunks', 'embeddings',
        -- The invariant check (ADR 0150) reads each done item's outputs and the batch
        -- claims; the metrics read the last recorded check.
        'item_artifacts', 'provider_batch_chunks', 'invariant_checks',
        -- Each user's searches and their cost on the overview (ADR 0153), and the last count
        -- of what a search covered (ADR 0152).
        'search_counts', 'search_coverage'
    ] LOOP
        IF to_regclass('replayable.' || relation) IS NOT NULL THEN
            EXECUTE format('GRANT SELECT ON replayable.%I TO replayable_ui', relation);
        END IF;
    END LOOP;
    -- The outbox's backlog age on the overview: its order, status and age, not its payloads.
    IF to_regclass('replayable.outbox') IS NOT NULL THEN
        EXECUTE 'GRANT SELECT (seq, status, created_at) ON replayable.outbox TO replayable_ui';
    END IF;
    -- The invariant check: which extractions exist (not their text), submissions' status.
    IF to_regclass('replayable.extractions') IS NOT NULL THEN
        EXECUTE 'GRANT SELECT (doc_id, extractor_version) ON replayable.extractions'
            ' TO replayable_ui';
    END IF;
    IF to_regclass('replayable.provider_batches') IS NOT NULL THEN
        EXECUTE 'GRANT SELECT (submission, status) ON replayable.provider_batches'
            ' TO replayable_ui';
    END IF;
    -- What runs cost (ADR 0110, 0114): a run's billed calls, their model, tokens and cost.
    IF EXISTS (
        SELECT FROM pg_attribute
        WHERE attrelid = to_regclass('replayable.model_calls') AND attname = 'cost_usd'
    ) THEN
        EXECUTE 'GRANT SELECT (run_id, status, http_status, model, mode, tokens,'
            ' output_tokens, cost_usd) ON replayable.model_calls TO replayable_ui';
    END IF;
    FOREACH work_list_column IN ARRAY ARRAY[
        'owner', 'note', 'status', 'resolved_at', 'resolved_by', 'resolution'
    ] LOOP
        IF EXISTS (
            SELECT FROM pg_attribute
            WHERE attrelid = to_regclass('replayable.dead_letters')
              AND attname = work_list_column AND NOT attisdropped
        ) THEN
            EXECUTE format(
                'GRANT UPDATE (%I) ON replayable.dead_letters TO replayable_ui', work_list_column
            );
        END IF;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION public.replayable_grant_ui() FROM PUBLIC;
-- Not on GRANT itself: the function's own GRANTs would fire it again.
CREATE EVENT TRIGGER replayable_grant_ui ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'CREATE VIEW', 'CREATE MATERIALIZED VIEW',
                 'ALTER TABLE', 'ALTER VIEW')
    EXECUTE FUNCTION public.replayable_grant_ui();
