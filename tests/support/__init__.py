"""Helpers shared by every test tier (importable as ``support.*``: pytest puts ``tests/`` on ``sys.path``).

- ``support.topic``: reading a whole topic back (``Stored``, ``read_topic``, ``read_topic_and_ends``),
  ``closed_port`` and ``turn_ids``.
- ``support.projection``: ``PassThroughWaits`` and ``PassThroughView``, the bases of test doubles that
  wrap a projection and change only the turn rows its views show.
- ``support.world``: the one turn builder (``make_turn``; ``numbered_turn``, the n-th turn of a world) and
  log placement (``append_to_log``) of the in-memory worlds (``unit/reader_world.py``,
  ``reliability/rel_world.py``).
- ``support.fold``: the reference fold of raw log records (``fold_records``: ``ChainBook`` and the
  undecodable positions), which ``integration/projector_env.fold_topic`` and the fuzz tests compare with.
- ``support.cursor``: ``cursor_length``.
- ``support.wire``: the read wire's field sets from docs/spec.md#read-wire (``READ_FIELDS``).
- ``support.bench_run``: running a bench module as a person does, for the bench smoke tests (``run_bench``).
"""
