"""PublishEventsOperator's arguments."""

from datetime import timedelta

import pytest

from replayable import DOCUMENTS_READY, PublishEventsOperator


def test_rendered_arguments_become_limits():
    op = PublishEventsOperator(task_id="p", max_events="20", batch_size=5, lease_s="90")
    limits = op.limits()
    assert (limits.max_events, limits.claim_size, limits.lease_s) == (20, 5, 90.0)
    assert op.outlets == [DOCUMENTS_READY]


def test_a_bad_argument_is_refused_naming_it():
    with pytest.raises(ValueError, match="batch_size"):
        PublishEventsOperator(task_id="p", batch_size="many").limits()
    with pytest.raises(ValueError, match="batch_size"):
        PublishEventsOperator(task_id="p", batch_size=0).limits()


def test_the_time_budget_is_an_argument():
    assert PublishEventsOperator(task_id="p", max_s="120").limits().max_s == 120.0


def test_a_time_budget_the_execution_timeout_would_cut_short_is_refused():
    op = PublishEventsOperator(task_id="p", max_s=1800, execution_timeout=timedelta(minutes=30))
    with pytest.raises(ValueError, match="max_s"):
        op.limits()
