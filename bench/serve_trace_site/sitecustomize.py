"""Loaded by a traced ``throughline serve`` and its fetch worker only (``bench.serve_trace.serve_env`` puts
this folder first on their ``PYTHONPATH``): installs the trace's import hook."""

from bench.serve_trace import install

install()
