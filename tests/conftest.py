"""Shared pytest configuration.

The Kafka fixtures (``kafka_bootstrap``, ``kafka_broker``, ``kafka_topic_name``, ``kafka_group_id``,
``kafka_admin``, ``kafka_create_topic``, ``kafka_broker_factory``) come from the
``throughline_kafka`` pytest plugin (``throughline/testing/pytest_plugin.py``). Its ``pytest11`` entry
point loads it where the ``test`` extra is installed; the suite names it too, so that it never depends
on that choice.
"""

import os

pytest_plugins = ["throughline.testing.pytest_plugin"]

# The docker tier (tests/docker) needs a Docker engine and the images that scripts/test-docker provides:
# that script runs it (and CI runs that script after the main suite); the default suite leaves it out.
collect_ignore = [] if os.environ.get("THROUGHLINE_DOCKER_TIER") == "1" else ["docker"]
