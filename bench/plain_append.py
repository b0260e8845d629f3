"""The baseline of the freshness benchmark: a plain Delta append of the change topics.

``python -m bench.plain_append --bootstrap H:P --pattern RE --path P --checkpoint C
--trigger "2 seconds"`` runs a Structured Streaming query that appends every Kafka
record of the topics matching ``RE`` (key, value, headers, coordinates) to one Delta
table, with the same Spark build, jars and trigger interval as the apply job, until
SIGTERM. It is what a micro-batch costs with no decoding, no dedup and no MERGE: the
floor that apply's commit-to-Delta latency is compared with.
"""

from __future__ import annotations

import argparse
import signal
import threading

from apply.engine.spark_jars import configured_jars
from apply.engine.spark_session import build_session
from apply.settings import SparkSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plain_append")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--pattern", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--trigger", default="2 seconds")
    arguments = parser.parse_args(argv)
    settings = SparkSettings(
        master="local[2]",
        app_name="bench-plain-append",
        conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
    )
    spark = build_session(settings, configured_jars(settings))
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", arguments.bootstrap)
        .option("subscribePattern", arguments.pattern)
        .option("startingOffsets", "latest")
        .option("includeHeaders", "true")
        .load()
        .writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", arguments.checkpoint)
        .trigger(processingTime=arguments.trigger)
        .start(arguments.path)
    )
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    while not stopped.wait(1) and query.isActive:
        pass
    exception = query.exception()
    query.stop()
    spark.stop()
    return 1 if exception is not None else 0


if __name__ == "__main__":
    raise SystemExit(main())
