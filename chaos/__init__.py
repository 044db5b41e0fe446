"""Chaos scenarios: production faults injected into real Airflow runs of the document pipeline.

A development tool, like ``bench/``: not part of the package a deployment installs. ``make
chaos`` runs every scenario at full size (:mod:`chaos.__main__`); ``make test`` runs (a)
and (c) at a reduced size (``tests/e2e/test_chaos.py``). See chaos/README.md.
"""
