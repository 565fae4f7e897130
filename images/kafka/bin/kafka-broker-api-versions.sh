#!/usr/bin/env bash
# throughline's Kafka image: list a broker's API versions (compose.yaml's health check), like Apache Kafka's script.
exec /opt/kafka/bin/kafka-run-class.sh org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
