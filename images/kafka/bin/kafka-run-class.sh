#!/usr/bin/env bash
# throughline's Kafka image: run one Kafka class on the Maven Central jars in /opt/kafka/libs.
#
# The jars from Maven Central come without the release tarball's bin/ folder, so this image carries its
# own small launchers. They read the environment variables Apache Kafka's bin/kafka-run-class.sh reads:
# KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS, KAFKA_GC_LOG_OPTS, KAFKA_JMX_OPTS, KAFKA_LOG4J_OPTS,
# KAFKA_OPTS, LOG_DIR and JAVA_HOME. (No -daemon mode, no JMX_PORT, no GC log by default.)
set -o nounset -o errexit

base_dir=/opt/kafka
java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
log_dir="${LOG_DIR:-$base_dir/logs}"
mkdir -p "$log_dir" 2>/dev/null || true

heap="${KAFKA_HEAP_OPTS:--Xmx256M}"
performance="${KAFKA_JVM_PERFORMANCE_OPTS:--server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true}"
log4j="${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=$base_dir/config/tools-log4j2.yaml}"

# Word splitting of the *_OPTS variables is intended: each holds several JVM flags.
# shellcheck disable=SC2086
exec "$java" $heap $performance ${KAFKA_GC_LOG_OPTS-} ${KAFKA_JMX_OPTS-} \
  "-Dkafka.logs.dir=$log_dir" $log4j -cp "$base_dir/libs/*" ${KAFKA_OPTS-} "$@"
