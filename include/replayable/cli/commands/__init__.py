"""One module per command; each ``run*`` function is a handler the parser sets.

A handler is called as ``handler(conn, args, console, as_json)`` with a read-only session
and returns the exit code. What it prints comes from a ``*_data`` function of the read layer
(:mod:`replayable.read`), so scripts and benchmarks get the same data as ``--json`` without
the CLI.
"""
