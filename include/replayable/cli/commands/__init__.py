"""One module per command; each ``run*`` function is a handler the parser sets.

A handler is called as ``handler(conn, args, console, as_json)`` with a read-only session
and returns the exit code. Its ``*_data`` function builds what it prints, from
:mod:`replayable.views`, so scripts and benchmarks get the same data as ``--json``.
"""
