"""Shared pytest configuration.

The Kafka fixtures (``kafka_bootstrap``, ``kafka_broker``, ``kafka_topic_name``, ``kafka_group_id``,
``kafka_admin``, ``kafka_create_topic``, ``kafka_broker_factory``) come from the
``throughline_kafka`` pytest plugin (``throughline/testing/pytest_plugin.py``). Its ``pytest11`` entry
point loads it where the ``test`` extra is installed; the suite names it itself where it does not.
"""

import os

from throughline.testing.pytest_entry import plugin_enabled

# The entry point loads the plugin where the test extra is installed; name it only where it does not
# (naming it twice would register one module under two names, which pytest refuses).
pytest_plugins = [] if plugin_enabled() else ["throughline.testing.pytest_plugin"]

# The docker tier (tests/docker) needs a Docker engine and the images that scripts/test-docker provides:
# that script runs it (and CI runs that script after the main suite); the default suite leaves it out.
collect_ignore = [] if os.environ.get("THROUGHLINE_DOCKER_TIER") == "1" else ["docker"]

# Property tests: on a developer's machine Hypothesis draws new examples each run (and keeps a failing one
# in .hypothesis/ until it passes); under CI (CI=true) it draws the same examples every run, so a landing
# is decided by the code, not by which examples a run happened to draw, nor by how busy the machine was
# (no per-example deadline: a slow example on a loaded machine is not a defect; speed is the bench's).
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, deadline=None)
    settings.load_profile("ci")
