"""The Kafka edge shared by producers, projector and reader: the topic and a live view of the log."""

from __future__ import annotations

from throughline.log.exceptions import (
    BrokerUnavailableError,
    InvalidTopicError,
    LogError,
    LossyTopicError,
    TopicMissingError,
)
from throughline.log.topic import (
    CHECKED_CONFIGS,
    DEFAULT_PARTITIONS,
    RECONNECT_BACKOFF_MAX_MS,
    TopicInfo,
    TopicSettings,
    bootstrap_list,
    describe_topic,
    ensure_topic,
    lossy_reasons,
    translate_kafka_error,
)
from throughline.log.view import KafkaLog

__all__ = [
    "CHECKED_CONFIGS",
    "DEFAULT_PARTITIONS",
    "RECONNECT_BACKOFF_MAX_MS",
    "BrokerUnavailableError",
    "InvalidTopicError",
    "KafkaLog",
    "LogError",
    "LossyTopicError",
    "TopicInfo",
    "TopicMissingError",
    "TopicSettings",
    "bootstrap_list",
    "describe_topic",
    "ensure_topic",
    "lossy_reasons",
    "translate_kafka_error",
]
