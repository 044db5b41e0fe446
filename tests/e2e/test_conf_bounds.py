"""`make run` (``devtools.devenv run``) refuses bad conf, naming the field.

The REST and ``airflow dags trigger`` paths are in test_airflow_api.py; here it is the path
of ``make run CONF=…``: unknown keys and a source outside the roots are refused before any
service starts; the rest by ``airflow dags test`` with the conf, against the tests' services.
"""

import json
from pathlib import Path

import pytest

from devtools import devenv
from replayable import sources

pytestmark = pytest.mark.e2e


def test_make_run_refuses_conf_outside_its_bounds_naming_the_field(
    airflow_env, state_dir, conn, capsys
):
    assert devenv.run(state_dir, json.dumps({"item_timeout_s": 1_000_000})) != 0
    err = capsys.readouterr().err
    assert "Invalid input for param item_timeout_s:" in err
    with conn.cursor() as cur:  # refused before discover recorded the run
        cur.execute("SELECT count(*) FROM replayable.runs")
        assert cur.fetchone() == (0,)


@pytest.mark.parametrize(
    ("conf", "named"),
    [
        ({"batch_szie": 5}, "'batch_szie' (did you mean 'batch_size'?)"),
        ({"rerun": {"stage": "chunk", "stauts": ["dead"]}}, "did you mean 'rerun.status'?"),
    ],
)
def test_make_run_refuses_an_unknown_key_before_starting_anything(tmp_path, conf, named):
    with pytest.raises(SystemExit) as refused:
        devenv.run(tmp_path, json.dumps(conf))
    assert named in str(refused.value.code)
    assert list(tmp_path.iterdir()) == []  # no Postgres, model server or Airflow was started


def test_make_run_refuses_a_source_outside_the_roots_saying_how_to_allow_it(tmp_path):
    with pytest.raises(SystemExit) as refused:
        devenv.run(tmp_path, json.dumps({"source": "/etc"}))
    message = str(refused.value.code)
    assert "source: '/etc' is outside the allowed source roots" in message
    assert all(root in message for root in sources.allowed_roots())
    assert sources.ROOTS_ENV in message
    assert list(tmp_path.iterdir()) == []


def test_a_run_created_with_an_unknown_key_fails_in_plan_naming_it(run_dag, conn):
    """Past the checks of `make run` (as REST and `airflow dags trigger` are), plan refuses."""
    report = run_dag({"batch_szie": 5})
    log = Path(report["_log"]).read_text()
    assert "conf: unknown key 'batch_szie' (did you mean 'batch_size'?)" in log
    # The report runs however plan ended (trigger rule all_done): it found nothing done.
    assert report["documents"] == 0
    with conn.cursor() as cur:  # plan stopped before discover recorded the run
        cur.execute("SELECT count(*) FROM replayable.runs")
        assert cur.fetchone() == (0,)
