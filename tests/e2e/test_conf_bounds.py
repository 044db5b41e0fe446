"""`make run` (``replayable.devenv run``) refuses conf outside its bounds, naming the field.

The REST and ``airflow dags trigger`` paths are in test_airflow_api.py; here it is the path
of ``make run CONF=…``: ``airflow dags test`` with the conf, against the tests' services.
"""

import json

import pytest

from replayable import devenv

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("conf", "field"),
    [({"source": "/etc"}, "source"), ({"item_timeout_s": 1_000_000}, "item_timeout_s")],
)
def test_make_run_refuses_conf_outside_its_bounds_naming_the_field(
    airflow_env, state_dir, conn, capsys, conf, field
):
    assert devenv.run(state_dir, json.dumps(conf)) != 0
    err = capsys.readouterr().err
    assert f"Invalid input for param {field}:" in err
    with conn.cursor() as cur:  # refused before discover recorded the run
        cur.execute("SELECT count(*) FROM replayable.runs")
        assert cur.fetchone() == (0,)
