#!/usr/bin/env bash
# throughline's Kafka image: create, list and describe topics, like Apache Kafka's bin/kafka-topics.sh.
exec /opt/kafka/bin/kafka-run-class.sh org.apache.kafka.tools.TopicCommand "$@"
