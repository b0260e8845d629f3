#!/bin/bash
# The Spark executor of the apply image, for apply.spark.mode=kubernetes (deploy/helm).
#
# The driver creates each executor pod from the chart's pod template, whose command is
# this script, with the argument `executor` and the environment Spark sets on executor
# pods (SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, SPARK_EXECUTOR_CORES, SPARK_EXECUTOR_MEMORY,
# SPARK_APPLICATION_ID, SPARK_EXECUTOR_POD_IP, SPARK_EXECUTOR_POD_NAME,
# SPARK_RESOURCE_PROFILE_ID, SPARK_CONF_DIR, and the JVM options as SPARK_JAVA_OPT_0,
# _1, ... in order). It starts the executor JVM the way the entrypoint of Spark's own
# images does, on the jars of the pyspark wheel: the image has no Spark distribution, and
# the wheel's jars directory is the Spark home's. Jars the job adds (Kafka source, Delta)
# reach executors through spark.jars from the driver; the object-store jars are in the
# wheel's directory already (apply.Dockerfile), so every JVM has them from the start.
set -euo pipefail

if [ "${1:-}" != executor ]; then
  echo "spark-executor: started with '${1:-}'; Spark's driver starts it with 'executor'" >&2
  exit 64
fi

spark_home=${SPARK_HOME:-$(python -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("pyspark").origin))')}

java_opts=()
while IFS= read -r option; do
  java_opts+=("${option#*=}")
done < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n)

# The conf directory first: Spark mounts the driver's conf files there.
classpath="${SPARK_CONF_DIR:-$spark_home/conf}:$spark_home/jars/*"
if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then
  classpath="$classpath:$SPARK_EXTRA_CLASSPATH"
fi

exec "${JAVA_HOME:?JAVA_HOME is not set}/bin/java" \
  "${java_opts[@]}" \
  "-Xms$SPARK_EXECUTOR_MEMORY" "-Xmx$SPARK_EXECUTOR_MEMORY" \
  -cp "$classpath" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "$SPARK_DRIVER_URL" \
  --executor-id "$SPARK_EXECUTOR_ID" \
  --cores "$SPARK_EXECUTOR_CORES" \
  --app-id "$SPARK_APPLICATION_ID" \
  --hostname "$SPARK_EXECUTOR_POD_IP" \
  --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
  --podName "$SPARK_EXECUTOR_POD_NAME"
