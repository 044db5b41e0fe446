"""The ``replayable`` command: ``replayable status|failed|dead-letters|rerun|redrive|outbox``.

Installed as a console script by ``make install`` (``pip install -e .``; ADR 0063), and
also ``python -m replayable`` where ``include/`` is on PYTHONPATH. Every command reads the
replayable database through a read-only session and :mod:`replayable.views`, the read model
the UI shares; ``rerun`` and ``redrive`` print the DAG-run conf, what it matches now and the
commands that trigger it. Only ``redrive --trigger`` changes anything, and only through
Airflow: it triggers ``document_pipeline`` with Airflow's REST API, as the Airflow user
whose token or login it is given (ADR 0064). ``outbox requeue`` is the one command that
writes to the database itself: it sends dead outbox events again (ADR 0072). ``--json``
prints JSON for scripts instead of tables. Exit codes: 0 ok; 1 ``status --watch`` timed out
with the run unfinished, ``redrive --trigger`` found no open letter to redrive, or ``outbox
requeue`` found no dead event to requeue; 2 usage or connection problems, or Airflow
refused.

Text from the ledger (file names, errors, owners, notes, run ids) comes from documents and
the people and runs that handled them: tables show it through :func:`replayable.terminal.
for_terminal`, which replaces escape sequences and control characters, and JSON escapes them.

The package: :mod:`.app` runs one command and maps failures to exit codes,
:mod:`.connection` finds and opens the database, :mod:`.parser` and :mod:`.arguments` read
the command line, :mod:`.commands` holds one module per command, :mod:`.render` prints.
"""

from __future__ import annotations

from replayable.cli.app import main

__all__ = ["main"]
