"""Stages of your own, each in a file of its own, used by the DAGs beside this folder."""
