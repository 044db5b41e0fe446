"""DeadLetterGrowthSensor against a real Postgres, through a real Airflow connection."""

import itertools

import pytest
from airflow.sdk.exceptions import AirflowFailException

from devtools import devenv
from replayable.airflow.sensors import DeadLetterGrowth, DeadLetterGrowthSensor, alert

_keys = itertools.count()


@pytest.fixture
def replayable_db(conn, dsn, monkeypatch):
    """The emptied database, reachable as Airflow connection ``replayable_db``."""
    monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_DB", devenv.postgres_conn_json(dsn))
    return conn


def add_letters(conn, n, *, minutes_ago=1, stage="embed", error_class="http_500", status="open"):
    """Insert ``n`` dead letters created ``minutes_ago`` minutes before the database's now()."""
    with conn.cursor() as cur:
        for _ in range(n):
            cur.execute(
                "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
                " error_kind, error, attempts, code_version, status, created_at)"
                " VALUES (%s, %s, 'doc', %s, 'terminal', 'boom', 3, '1.0', %s,"
                " now() - make_interval(mins => %s))",
                (stage, f"item-{next(_keys)}", error_class, status, minutes_ago),
            )
    conn.commit()


def poke(**kwargs):
    """Poke a fresh sensor once; return (fired, the measured growth)."""
    sensor = DeadLetterGrowthSensor(task_id="watch", **kwargs)
    result = sensor.poke({})
    return result.is_done, DeadLetterGrowth.from_xcom(result.xcom_value)


def test_fires_when_more_than_max_new_letters_arrived_in_the_window(replayable_db):
    add_letters(replayable_db, 4)
    fired, growth = poke(window_minutes=60, max_new=3)
    assert fired
    assert (growth.new_letters, growth.open_letters, growth.max_new) == (4, 4, 3)


@pytest.mark.parametrize(("letters", "max_new"), [(3, 3), (0, 0), (0, 10)])
def test_stays_quiet_at_or_below_the_threshold(replayable_db, letters, max_new):
    add_letters(replayable_db, letters)
    fired, growth = poke(max_new=max_new)
    assert not fired
    assert growth.new_letters == letters


def test_a_single_letter_fires_a_zero_threshold(replayable_db):
    add_letters(replayable_db, 1)
    assert poke(max_new=0)[0]


def test_only_the_window_counts_not_old_letters_or_the_depth(replayable_db):
    add_letters(replayable_db, 50, minutes_ago=90)  # a large backlog from before the window
    add_letters(replayable_db, 2, minutes_ago=5)
    fired, growth = poke(window_minutes=60, max_new=2)
    assert not fired
    assert (growth.new_letters, growth.open_letters) == (2, 52)
    assert poke(window_minutes=120, max_new=2)[0]


def test_letters_resolved_since_they_arrived_still_count_as_growth(replayable_db):
    add_letters(replayable_db, 2, status="redriven")
    add_letters(replayable_db, 1, status="ignored")
    fired, growth = poke(max_new=2)
    assert fired
    assert (growth.new_letters, growth.open_letters) == (3, 0)


def test_a_stage_of_your_own_is_watched_by_its_name(replayable_db):
    """No stage list is fixed here: a user's stage (keywords) gets its own alert."""
    add_letters(replayable_db, 3, stage="keywords", error_class="no_words")
    add_letters(replayable_db, 2, stage="embed")
    fired, growth = poke(max_new=2, stage="keywords")
    assert fired
    assert (growth.new_letters, growth.stage) == (3, "keywords")


def test_a_stage_counts_only_its_own_letters_and_depth(replayable_db):
    add_letters(replayable_db, 5, stage="embed")
    add_letters(replayable_db, 1, stage="extract")
    add_letters(replayable_db, 4, stage="extract", minutes_ago=600)
    fired, growth = poke(max_new=1, stage="extract")
    assert not fired
    assert (growth.new_letters, growth.open_letters, growth.stage) == (1, 5, "extract")
    assert poke(max_new=1, stage="embed")[0]
    assert poke(max_new=1)[1].new_letters == 6


def test_the_message_names_rate_window_depth_and_commonest_error_classes(replayable_db):
    for error_class, n in [("http_500", 4), ("timeout", 3), ("http_404", 2), ("encrypted", 1)]:
        add_letters(replayable_db, n, error_class=error_class)
    add_letters(replayable_db, 7, error_class="old_bug", minutes_ago=120)
    _, growth = poke(window_minutes=30, max_new=5, stage="embed")
    assert growth.top_error_classes == [("http_500", 4), ("timeout", 3), ("http_404", 2)]
    assert growth.message() == (
        "10 new dead letters in the last 30 min (stage embed), above the threshold of 5;"
        " 17 open in total; top error classes: http_500 (4), timeout (3), http_404 (2)"
    )


def test_alert_fails_the_task_with_the_growth_message(replayable_db):
    add_letters(replayable_db, 3, error_class="http_401")
    sensor = DeadLetterGrowthSensor(task_id="watch", max_new=1)
    xcom = sensor.poke({}).xcom_value
    with pytest.raises(AirflowFailException, match=r"3 new dead letters.*http_401 \(3\)"):
        alert(xcom)


def test_templated_arguments_are_rendered_then_checked(replayable_db):
    add_letters(replayable_db, 2)
    sensor = DeadLetterGrowthSensor(
        task_id="watch",
        window_minutes="{{ params.window }}",
        max_new="{{ params.max_new }}",
        timeout="{{ params.timeout }}",
    )
    sensor.render_template_fields({"params": {"window": 15, "max_new": 1, "timeout": 30}})
    result = sensor.poke({})
    assert result.is_done
    assert result.xcom_value["window_minutes"] == 15

    sensor = DeadLetterGrowthSensor(task_id="watch", window_minutes="{{ params.window }}")
    sensor.render_template_fields({"params": {"window": 0}})
    with pytest.raises(ValueError, match=r"window_minutes.*got '0'$"):
        sensor.poke({})


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"window_minutes": 0}, r"window_minutes.*got 0$"),
        ({"window_minutes": "an hour"}, r"window_minutes.*got 'an hour'"),
        ({"max_new": -1}, r"max_new.*got -1$"),
        ({"max_new": True}, r"max_new.*got True$"),
        ({"stage": "OCR pages"}, r"stage.*got 'OCR pages'$"),
        ({"stage": "None"}, r"stage.*got 'None' .*render_template_as_native_obj"),
        ({"timeout": -5}, r"timeout.*got -5$"),
        ({"poke_interval": "soon"}, r"poke_interval.*got 'soon'$"),
    ],
)
def test_bad_arguments_are_rejected_naming_the_value(kwargs, named):
    with pytest.raises(ValueError, match=named):
        DeadLetterGrowthSensor(task_id="watch", **kwargs)
