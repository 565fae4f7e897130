#!/usr/bin/env bash
# throughline's Kafka image: start the broker (kafka.Kafka) with a server.properties file, as Apache Kafka's
# bin/kafka-server-start.sh does: log4j2 from /opt/kafka/config/log4j2.yaml, 1 GB heap unless
# KAFKA_HEAP_OPTS says otherwise.
set -o nounset -o errexit
if [[ $# -lt 1 ]]; then
  echo "USAGE: $0 server.properties [--override property=value]*" >&2
  exit 1
fi
export KAFKA_LOG4J_OPTS="${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=/opt/kafka/config/log4j2.yaml}"
export KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx1G -Xms1G}"
exec /opt/kafka/bin/kafka-run-class.sh kafka.Kafka "$@"
