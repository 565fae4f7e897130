"""Shared pytest configuration.

The Kafka fixtures (``kafka_bootstrap``, ``kafka_broker``, ``kafka_topic_name``, ``kafka_group_id``,
``kafka_admin``, ``kafka_create_topic``, ``kafka_broker_factory``) come from the
``throughline_kafka`` pytest plugin (``throughline/testing/pytest_plugin.py``), registered as a
``pytest11`` entry point by the package install; nothing needs to be imported here.
"""
