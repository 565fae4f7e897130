#!/usr/bin/env bash
# throughline's Kafka image: KRaft storage tool (format, info, random-uuid), like Apache Kafka's bin/kafka-storage.sh.
exec /opt/kafka/bin/kafka-run-class.sh kafka.tools.StorageTool "$@"
