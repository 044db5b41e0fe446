-- Creates the two databases of the docker-compose deployment. The postgres image runs this
-- file with psql, as the superuser POSTGRES_USER, once: when its data volume is empty.
-- To re-run it, remove the volume (`docker compose down --volumes` deletes all data).
--
--   airflow     Airflow's metadata database (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN)
--   replayable  the pipeline's ledger and outputs (connection replayable_db)
--
-- POSTGRES_DB is set to `postgres` in docker-compose.yaml so that the image itself creates
-- neither of these (a second CREATE DATABASE would stop the initialisation).
CREATE DATABASE airflow;
CREATE DATABASE replayable;

-- The pipeline's schema migration starts with CREATE EXTENSION IF NOT EXISTS vector. Doing it
-- here, as the superuser, lets that succeed whatever role the replayable_db connection uses.
\connect replayable
CREATE EXTENSION IF NOT EXISTS vector;
