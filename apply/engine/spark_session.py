"""Build the SparkSession the apply job runs in.

The defaults suit one small machine and every setting can be overridden through
``APPLY_SPARK__CONF``:

- Delta's SQL extension and catalog, so ``MERGE`` and Delta tables work by name and path;
- few shuffle partitions (a micro-batch of CDC records is small; 200 empty tasks per
  batch would dominate its latency);
- the UI off unless asked, ``commitStats.collect`` off (it scans every written file's
  statistics after each commit, pure overhead for a MERGE-per-batch workload);
- UTC session time zone, so timestamps read back as the UTC instants the source held;
- timestamps written to Parquet as INT64 microseconds
  (``spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS``; Spark's default is the
  legacy INT96). Delta writes its data files through Spark's Parquet writer, so the
  session conf decides, for new tables and for every file an existing table gets from
  the next write on. INT96 holds nanoseconds, and readers that map it to a 64-bit
  nanosecond count cannot hold instants outside 1677-2262 nor ``+-infinity`` (the int64
  extremes in microseconds): delta-rs's pyarrow reader fails on them, its query engine
  returns other instants. INT64 microseconds is the exact value capture published.
  Files written before stay INT96 until something rewrites them (docs/apply.md,
  Reading the lake);
- Delta snapshots rebuilt with 2 tasks (``snapshotPartitions``, Delta's default is 50):
  the table's state is rebuilt after every commit, i.e. every batch, and for the few
  files of a CDC table 50 tasks cost seconds of scheduling on a small machine;
- deletion vectors off by default (``properties.defaults.enableDeletionVectors``, from
  ``APPLY_LAKE__DELETION_VECTORS``; apply also sets each table's property when it
  creates the table, :func:`apply.lake.delta_schema.ensure_table`): a small batch is then
  MERGEd from the driver with delta-rs, which cannot write a table with deletion
  vectors (:mod:`apply.lake.driver_merge`), and any Delta reader reads the table. With them
  on, Spark's MERGE marks the rows it replaces as deleted and writes only the changed
  rows instead of copying every other row of each file it touches, and every batch of
  such a table takes a Spark MERGE; readers then need the ``deletionVectors`` table
  feature (Delta reader version 3). Tables created before keep their properties;
- FAIR scheduling (``spark.scheduler.mode=FAIR``): the tables of a batch are applied
  side by side, each submitting its jobs to a scheduler pool named after it
  (:mod:`apply.batch.table_pool`), and FAIR mode shares the executor cores between those
  pools, where Spark's default FIFO mode gives them all to the job submitted first, so
  one big table's MERGE would hold every other table of the batch behind it. It cannot
  shorten the batch itself, which ends with its slowest table: measured, small tables
  still wait for a big one's batch (docs/apply.md, "What FAIR does not fix");
- the change data feed on new tables when ``APPLY_LAKE__CHANGE_DATA_FEED`` asks
  (``properties.defaults.enableChangeDataFeed``).

The lake settings reach Delta as its ``properties.defaults.*`` session confs, which
Delta copies into the properties of every table created in the session; they never
change an existing table. ``APPLY_SPARK__CONF`` still overrides them.

The master is the settings' (``APPLY_SPARK__MASTER``) when given; else the one
``spark-submit --master`` was given, so the same program runs under ``spark-submit`` to
a cluster with nothing set; else ``local[*]``. Under ``spark-submit`` the JVM is up
before this code runs, so the jars must be on its command line (``--jars``, see
``python -m apply jars``): ``spark.jars`` set here reaches the executors, not the
driver's class loader.

Jars come through ``spark.jars`` (resolved by ``make jars`` locally, or given by the
operator); nothing is fetched by Ivy at run time.

**The driver owns termination.** When this process starts the JVM, the JVM starts with
SIGTERM ignored, so stopping is one shutdown in one order: Python's handler stops the
queries, then the session, then the JVM exits (it also exits when this process dies,
since it watches its stdin). A JVM that took SIGTERM itself ran Spark's own shutdown
hook (stop the streaming queries, stop the context) while the Python side was stopping
the same queries: every stop logged a ``Cannot call methods on a stopped SparkContext``
trace, and one, while a micro-batch ran on a busy machine, hung until it was killed 90 s
later. The signal reaches both whenever it goes to the whole process group or cgroup
(``kill -- -PGID``, systemd's default ``KillMode``), not only Kubernetes' PID 1 form.
Under ``spark-submit`` the JVM is the parent and keeps Spark's own handling.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from apply.settings import LOCAL_MASTER, LakeSettings, SparkSettings

DEFAULT_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.databricks.delta.commitStats.collect": "false",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
    "spark.sql.streaming.stopGracefullyOnShutdown": "true",
    "spark.scheduler.mode": "FAIR",
}


PROPERTY_DEFAULTS = "spark.databricks.delta.properties.defaults."
"""Delta sets ``delta.<name>`` on every table the session creates from the session
conf ``<this prefix><name>``."""
DELETION_VECTORS_DEFAULT = PROPERTY_DEFAULTS + "enableDeletionVectors"
CHANGE_DATA_FEED_DEFAULT = PROPERTY_DEFAULTS + "enableChangeDataFeed"


def lake_conf(lake: LakeSettings) -> dict[str, str]:
    """The Delta session defaults that carry the lake settings into new tables."""
    conf = {
        DELETION_VECTORS_DEFAULT: str(lake.deletion_vectors).lower(),
        PROPERTY_DEFAULTS
        + "deletedFileRetentionDuration": f"interval {lake.deleted_file_retention_hours} hours",
        PROPERTY_DEFAULTS + "logRetentionDuration": f"interval {lake.log_retention_hours} hours",
    }
    if lake.change_data_feed:
        # Only when on: off is Delta's default, and a default of false would still write
        # delta.enableChangeDataFeed=false into every new table's properties.
        conf[CHANGE_DATA_FEED_DEFAULT] = "true"
    return conf


def table_property_defaults(spark: SparkSession) -> dict[str, str]:
    """The ``delta.*`` properties the session gives every table it creates (its
    ``properties.defaults`` confs: the lake settings and the operator's), for a table
    created by another writer (:mod:`apply.lake.driver_merge`) to get the same."""
    return {
        "delta." + key.removeprefix(PROPERTY_DEFAULTS): str(value)
        for key, value in spark.conf.getAll.items()
        if key.startswith(PROPERTY_DEFAULTS)
    }


def session_conf(
    settings: SparkSettings, jars: Sequence[str], lake: LakeSettings | None = None
) -> dict[str, str]:
    """The full Spark configuration: defaults, then the lake settings, then jars, then the
    operator's overrides."""
    conf = dict(DEFAULT_CONF)
    if lake is not None:
        conf.update(lake_conf(lake))
    if jars:
        conf["spark.jars"] = ",".join(jars)
    conf.update(settings.conf)
    return conf


def master_to_set(configured: str | None, submitted: str | None) -> str | None:
    """The master the builder must set (module docstring); None leaves spark-submit's."""
    if configured:
        return configured
    return None if submitted else LOCAL_MASTER


def _submitted_master() -> str | None:
    """The master spark-submit was given, when this process runs under spark-submit.

    spark-submit hands PySpark its JVM through ``PYSPARK_GATEWAY_PORT``; only then is it
    asked. Asking otherwise would start the JVM here, before the builder's settings
    (the jars above all) could reach its command line."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    # Connects to spark-submit's JVM; a SparkConf made before that holds no defaults.
    SparkContext._ensure_initialized()
    master: str | None = SparkConf().get("spark.master", None)
    return master


@contextmanager
def termination_left_to_driver() -> Iterator[None]:
    """While inside, a child process starts with SIGTERM ignored, and a SIGTERM sent to
    this process waits and reaches its own handler afterwards (module docstring).

    Ignored dispositions survive ``exec``, and HotSpot installs no handler for a shutdown
    signal it found ignored. The signal is blocked meanwhile, and Linux keeps a blocked
    signal pending even while it is ignored, so none sent in this window is lost; it
    is delivered when the handler is back. Only the main thread can change handlers:
    anywhere else this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def build_session(
    settings: SparkSettings, jars: Sequence[str], lake: LakeSettings | None = None
) -> SparkSession:
    """The session apply runs in; ``lake`` is given where the session creates lake tables
    (the apply job), and left out by tools that only read them."""
    builder = SparkSession.builder.appName(settings.app_name)
    master = master_to_set(settings.master, _submitted_master())
    if master is not None:
        builder = builder.master(master)
    for key, value in session_conf(settings, jars, lake).items():
        builder = builder.config(key, value)
    with termination_left_to_driver():
        spark = builder.getOrCreate()
    warm_delta_json(spark)
    return spark


_WARM_ACTION = '{"txn":{"appId":"cdc-apply-warm-up","version":0}}'


def warm_delta_json(spark: SparkSession) -> None:
    """Have Delta's JSON mapper build its action deserializers once, on this thread.

    Otherwise the first commit files it reads are read by a Spark job's tasks, several
    at once, and Jackson's Scala module building those deserializers on two threads at
    the same time has failed here: a restarted job under load stopped at its first
    history read with ``InvalidDefinitionException: ... SidecarFile: Argument #0 of
    Creator ... has no property name``, in both tasks of the job, while the same start
    passes every other time. Built once, the mapper keeps them. In local mode the
    executors share this JVM; a cluster's executors are JVMs of their own, which this
    does not reach."""
    jvm: Any = spark.sparkContext._jvm
    jvm.org.apache.spark.sql.delta.actions.Action.fromJson(_WARM_ACTION)
