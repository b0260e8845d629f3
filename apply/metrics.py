"""The apply job's metrics: every series ``/metrics`` shows, in one registry.

Names follow the Prometheus conventions (prefix ``cdc_apply_``, base units in the
name, ``_total`` on counters); docs/operations.md lists them and a unit test checks the
list against :meth:`ApplyMetrics.names`. Spark's own metrics stay Spark's: these are
the job's numbers, taken from what a micro-batch reports (:class:`~apply.control.progress.
BatchResult`) after its Delta commits, so a counter never counts a batch Delta skipped
as a replay twice: a table whose MERGE was skipped (``committed`` False) adds its
records and replays, not rows.

Lag in bytes needs the source's WAL position, which apply never reads (it does not
connect to PostgreSQL): it is capture's received LSN minus ``cdc_apply_applied_lsn_bytes``
in PromQL (the recording rule in deploy/prometheus/alerts.yaml).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from prometheus_client import CollectorRegistry

from apply.control.progress import BatchResult, TableResult
from apply.lanes import DEFAULT_LANE
from runtime.telemetry import Health, MetricSet

PREFIX = "cdc_apply_"
_DURATION_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


def lag_seconds(result: TableResult, now_unix_s: float) -> float | None:
    """Seconds from the newest applied source commit to when its batch was applied."""
    commit_ts = result.state.commit_ts
    return None if commit_ts is None else max(0.0, now_unix_s - commit_ts / 1_000_000)


class ApplyMetrics(MetricSet):
    """Every apply metric, registered in a registry of its own."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, health: Health | None = None
    ) -> None:
        """``health``: also expose its probes' answers (``cdc_apply_alive``/``_ready``)."""
        super().__init__(PREFIX, registry, health=health)
        self.batch_duration = self.histogram(
            "batch_duration_seconds",
            "time to apply one micro-batch of a lane's query (apply.lanes): every table's "
            "MERGE and the progress publish",
            buckets=_DURATION_BUCKETS,
            labels=("lane",),
        )
        self.batch_failures = self.counter(
            "batch_failures",
            "micro-batch attempts that failed with a transient error (retried in place, up to "
            "three attempts; then the query fails)",
        )
        self.last_batch = self.gauge(
            "last_batch_timestamp_seconds",
            "when the last micro-batch finished (Unix time)",
        )
        self.records = self.counter(
            "records",
            "Kafka records read, per table (tombstones included)",
            ["table"],
        )
        self.rows = self.counter(
            "rows",
            "rows the MERGE wrote, per table and action (inserted, updated, deleted)",
            ["table", "action"],
        )
        self.replays = self.counter(
            "replays_dropped",
            "records dropped as replays: at or below their partition's applied position",
            ["table"],
        )
        self.applied_lsn = self.gauge(
            "applied_lsn_bytes",
            "commit LSN of the newest transaction applied to the table (LSN as a number)",
            ["table"],
        )
        self.lag = self.gauge(
            "lag_seconds",
            "at the table's last applied batch: now minus the newest applied commit time",
            ["table"],
        )
        self.table_errored = self.gauge(
            "table_errored",
            "1 while the table has parked records waiting (errored), else 0",
            ["table"],
        )
        self.errored_tables = self.gauge(
            "errored_tables",
            "tables with parked records waiting",
        )
        self.parked = self.counter(
            "records_parked",
            "records written to the dead-letter table, per table",
            ["table"],
        )
        self.upkeep_runs = self.counter(
            "upkeep_runs",
            "table upkeep operations run after a table's commit (apply.lake.upkeep), per table, "
            "operation (compact, vacuum) and outcome (done; failed: left to its next turn)",
            ["table", "operation", "outcome"],
        )
        self.upkeep_duration = self.histogram(
            "upkeep_duration_seconds",
            "time one upkeep operation added to its table's part of the micro-batch",
            buckets=_DURATION_BUCKETS,
            labels=("operation",),
        )
        self._errored: set[str] = set()

    def batch(
        self, result: BatchResult, duration_s: float, now_unix_s: float, lane: str = DEFAULT_LANE
    ) -> None:
        """One micro-batch of ``lane`` applied (and its progress published)."""
        self.batch_duration.labels(lane).observe(duration_s)
        self.last_batch.set(now_unix_s)
        for r in result.applied:
            self.records.labels(r.table).inc(r.records)
            self.replays.labels(r.table).inc(r.replays)
            if r.committed:
                self.rows.labels(r.table, "inserted").inc(r.rows_inserted)
                self.rows.labels(r.table, "updated").inc(r.rows_updated)
                self.rows.labels(r.table, "deleted").inc(r.rows_deleted)
            if r.state.table_lsn is not None:
                self.applied_lsn.labels(r.table).set(r.state.table_lsn)
            lag = lag_seconds(r, now_unix_s)
            if lag is not None and r.committed:
                self.lag.labels(r.table).set(lag)
        for p in result.parked:
            self.records.labels(p.table).inc(p.records)
            self.parked.labels(p.table).inc(p.parked)

    def errored(self, tables: Iterable[str], waiting: Collection[str]) -> None:
        """The errored state of ``tables`` as the dead-letter table holds it now:
        ``waiting`` are the tables with parked records not re-applied yet."""
        for table in tables:
            if table in waiting:
                self._errored.add(table)
            else:
                self._errored.discard(table)
            self.table_errored.labels(table).set(1 if table in waiting else 0)
        self.errored_tables.set(len(self._errored))

    def upkeep(self, table: str, operation: str, duration_s: float, *, failed: bool) -> None:
        """One upkeep operation on ``table`` ran (:class:`apply.lake.upkeep.UpkeepObserver`)."""
        self.upkeep_runs.labels(table, operation, "failed" if failed else "done").inc()
        self.upkeep_duration.labels(operation).observe(duration_s)
