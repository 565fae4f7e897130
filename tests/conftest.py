"""Shared pytest configuration.

The Kafka fixtures (``kafka_bootstrap``, ``kafka_broker``, ``kafka_topic_name``, ``kafka_group_id``,
``kafka_admin``, ``kafka_create_topic``, ``kafka_broker_factory``) come from the
``throughline_kafka`` pytest plugin (``throughline/testing/pytest_plugin.py``), registered as a
``pytest11`` entry point by the package install; nothing needs to be imported here.
"""

import os

# The docker tier (tests/docker) needs a Docker engine and the images that scripts/test-docker provides:
# that script runs it (and CI runs that script after the main suite); the default suite leaves it out.
collect_ignore = [] if os.environ.get("THROUGHLINE_DOCKER_TIER") == "1" else ["docker"]
