"""What a person reads of the ledger, composed once: the data each ``replayable`` command shows.

:mod:`replayable.views` is the ledger's read model: one query per read, plain rows and small
frozen dataclasses. The functions here compose those reads into what a command prints with
``--json``, a JSON-ready ``dict``: the CLI only renders it (:mod:`replayable.cli.render`),
and scripts and the benchmarks read the same data without going through the CLI. The UI
renders the same view rows through its models (:mod:`replayable.web.models`).

- :mod:`.status`: ``status`` (items per stage, model calls, costs, the run's end) and
  ``check`` (the invariants);
- :mod:`.lists`: ``failed``, ``dead-letters`` and ``outbox list``;
- :mod:`.runs`: the confs of ``rerun`` and ``redrive``, with what they match now.
"""

from __future__ import annotations

from replayable.read.lists import dead_letters_data, failed_data, outbox_data
from replayable.read.runs import redrive_data, rerun_conf, rerun_data, trigger_commands
from replayable.read.status import check_data, status_data

__all__ = [
    "check_data",
    "dead_letters_data",
    "failed_data",
    "outbox_data",
    "redrive_data",
    "rerun_conf",
    "rerun_data",
    "status_data",
    "trigger_commands",
]
