"""PublishEventsOperator's arguments."""

import pytest

from replayable import DOCUMENTS_READY, PublishEventsOperator


def test_rendered_arguments_become_limits():
    op = PublishEventsOperator(task_id="p", max_events="20", batch_size=5, lease_s="90")
    limits = op.limits()
    assert (limits.max_events, limits.batch_size, limits.lease_s) == (20, 5, 90.0)
    assert op.outlets == [DOCUMENTS_READY]


def test_a_bad_argument_is_refused_naming_it():
    with pytest.raises(ValueError, match="batch_size"):
        PublishEventsOperator(task_id="p", batch_size="many").limits()
    with pytest.raises(ValueError, match="batch_size"):
        PublishEventsOperator(task_id="p", batch_size=0).limits()
