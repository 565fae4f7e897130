"""Helpers shared by every test tier (importable as ``support.*``: pytest puts ``tests/`` on ``sys.path``).

- ``support.topic``: reading a whole topic back (``Stored``, ``read_topic``, ``read_topic_and_ends``),
  ``closed_port`` and ``turn_ids``.
"""
