"""The capture service's metrics: every series ``/metrics`` shows, in one registry.

Names follow the Prometheus conventions (https://prometheus.io/docs/practices/naming/):
prefix ``cdc_capture_``, base units in the name (``_bytes``, ``_seconds``), ``_total``
on counters. docs/operations.md lists them; a unit test checks that list against
:meth:`CaptureMetrics.names`, so neither can drift.

Invariants:

- The hot path (a few microseconds per change) never takes a lock for a metric: counts
  per table and operation are plain dict increments in the capture loop's thread
  (:class:`Tally`), and positions are plain attributes (:class:`StreamPosition`); both
  are read only when Prometheus scrapes, by a collector that copies them (a dict copy
  is atomic under the GIL, so a scrape sees each count whole).
- Everything else is a prometheus_client object updated where the number is known: the
  WAL watch thread (slot gauges), the snapshot worker (rows done and estimated), the
  loop once per status interval (table states).
- LSNs are exported as numbers (bytes into the WAL): exact up to 2**53, 8 PiB of WAL.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from capture.in_flight import ProgressBook
from runtime.telemetry import Health, MetricDoc, MetricSet
from schemas.control import TableState
from schemas.headers import OPERATION as OPERATION_HEADER
from schemas.headers import Headers
from schemas.operation import Operation

PREFIX = "cdc_capture_"
WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")
"""``pg_replication_slots.wal_status`` values, each a series of ``slot_wal_status``."""
TOMBSTONE = "tombstone"


LabelValue = str | bytes | Operation


def _label(value: LabelValue) -> str:
    if isinstance(value, Operation):
        return value.value
    return value.decode("ascii") if isinstance(value, bytes) else value


class Tally:
    """Counts by label values, bumped without a lock from one thread."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[tuple[LabelValue, ...], float] = {}
        """By label values as the hot path has them at hand (an Operation, an operation
        header's bytes), turned into strings only when scraped."""

    def add(self, key: tuple[LabelValue, ...], amount: float = 1) -> None:
        counts = self.counts
        counts[key] = counts.get(key, 0) + amount

    def total(self) -> float:
        return sum(self.counts.copy().values())


@dataclass(slots=True)
class StreamPosition:
    """Where the replication stream is; written by the capture loop."""

    received_lsn: int = 0
    confirmed_lsn: int = 0
    last_keepalive: float | None = None
    """``time.monotonic()`` of the last primary keepalive; None before the first."""
    stream_started: float | None = None


class _TallyCollector(Collector):
    def __init__(
        self, name: str, documentation: str, labels: tuple[str, ...], tally: Tally
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = list(labels)
        self._tally = tally

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._documentation, labels=self._labels)
        for labels, value in sorted(
            ([_label(k) for k in key], value) for key, value in self._tally.counts.copy().items()
        ):
            family.add_metric(labels, value)
        yield family

    def describe(self) -> Iterable[CounterMetricFamily]:
        return [CounterMetricFamily(self._name, self._documentation, labels=self._labels)]

    @property
    def doc(self) -> MetricDoc:
        return MetricDoc(self._name, "counter", tuple(self._labels), self._documentation)


class _StreamCollector(Collector):
    """Gauges read from the loop's plain attributes at scrape time."""

    def __init__(self, metrics: CaptureMetrics) -> None:
        self._metrics = metrics

    def _families(self) -> dict[str, GaugeMetricFamily]:
        return {
            "received": GaugeMetricFamily(
                f"{PREFIX}received_lsn_bytes",
                "end LSN of the newest transaction received (between transactions: how far "
                "the server has decoded), as a number",
            ),
            "confirmed": GaugeMetricFamily(
                f"{PREFIX}confirmed_lsn_bytes",
                "LSN last confirmed to the slot: the lake holds everything before it",
            ),
            "keepalive": GaugeMetricFamily(
                f"{PREFIX}keepalive_age_seconds",
                "seconds since the server's last keepalive (since the stream started, "
                "before the first)",
            ),
            "records": GaugeMetricFamily(
                f"{PREFIX}in_flight_records",
                "streamed records produced and not yet applied to the lake, plus snapshot "
                "rows not yet in Kafka (until applied with snapshot_pace=lake)",
            ),
            "bytes": GaugeMetricFamily(
                f"{PREFIX}in_flight_bytes", "encoded bytes of the in-flight records"
            ),
        }

    def collect(self) -> Iterator[GaugeMetricFamily]:
        metrics = self._metrics
        position = metrics.position
        families = self._families()
        families["received"].add_metric([], position.received_lsn)
        families["confirmed"].add_metric([], position.confirmed_lsn)
        since = position.last_keepalive or position.stream_started
        if since is not None:
            families["keepalive"].add_metric([], max(0.0, time.monotonic() - since))
        book = metrics.book
        families["records"].add_metric([], 0 if book is None else book.in_flight_records)
        families["bytes"].add_metric([], 0 if book is None else book.in_flight_bytes)
        yield from families.values()

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return list(self._families().values())

    def docs(self) -> list[MetricDoc]:
        return [MetricDoc(f.name, "gauge", (), f.documentation) for f in self._families().values()]


_TOMBSTONE = TOMBSTONE.encode("ascii")
_UNKNOWN = b"unknown"


def operation_of(headers: Headers, value: bytes | None) -> bytes:
    """The operation of a record, as its header holds it (bytes: decoded only when
    scraped); a tombstone has none. Per produced record, so the usual place of the
    header (schemas.headers.record_headers puts it third) is looked at first."""
    if value is None:
        return _TOMBSTONE
    if len(headers) > 2:
        name, op = headers[2]
        if name == OPERATION_HEADER and isinstance(op, bytes):
            return op
    for name, op in headers:
        if name == OPERATION_HEADER and isinstance(op, bytes):
            return op
    return _UNKNOWN


def operation_label(headers: Headers, value: bytes | None) -> str:
    """:func:`operation_of` as the label value."""
    return operation_of(headers, value).decode("ascii")


class CaptureMetrics(MetricSet):
    """Every capture metric, registered in a registry of its own."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, health: Health | None = None
    ) -> None:
        """``health``: also expose its probes' answers (``cdc_capture_alive``/``_ready``)."""
        super().__init__(PREFIX, registry, health=health)
        self.decoded = Tally()
        """(table, operation) -> changes decoded from the stream."""
        self.produced = Tally()
        """(table, operation) -> records handed to the producer (stream and snapshot)."""
        self.produced_bytes = Tally()
        """(table,) -> encoded key and value bytes produced."""
        self.position = StreamPosition()
        self.book: ProgressBook | None = None
        """The current attempt's in-flight book (None between attempts)."""
        self._errored_tables: set[str] = set()
        """The tables errored at the last :meth:`table_states`."""
        for tally in (
            _TallyCollector(
                f"{PREFIX}changes_decoded_total",
                "row changes decoded from the replication stream",
                ("table", "operation"),
                self.decoded,
            ),
            _TallyCollector(
                f"{PREFIX}records_produced_total",
                "records handed to the Kafka producer (READ: snapshot rows; tombstone: the "
                "null value after a delete)",
                ("table", "operation"),
                self.produced,
            ),
            _TallyCollector(
                f"{PREFIX}produced_bytes_total",
                "encoded key and value bytes handed to the Kafka producer",
                ("table",),
                self.produced_bytes,
            ),
        ):
            self.custom(tally, [tally.doc])
        stream = _StreamCollector(self)
        self.custom(stream, stream.docs())
        self.slot_retained_wal = self.gauge(
            "slot_retained_wal_bytes",
            "WAL the server keeps for the slot: pg_current_wal_lsn() - restart_lsn",
        )
        self.slot_safe_wal_size = self.gauge(
            "slot_safe_wal_size_bytes",
            "WAL that can still be written before the slot may be lost (-1: unlimited)",
        )
        self.slot_wal_status = self.gauge(
            "slot_wal_status",
            "1 for the slot's current wal_status (reserved, extended, unreserved, lost)",
            ["status"],
        )
        self.retained_warn = self.gauge(
            "slot_retained_wal_warn_bytes",
            "the retained-WAL warning threshold (CAPTURE_WAL__WARN_RETAINED_BYTES; 0: off)",
        )
        self.keep_size = self.gauge(
            "max_slot_wal_keep_size_bytes",
            "the server's max_slot_wal_keep_size (-1: unlimited)",
        )
        self.snapshot_rows = self.gauge(
            "snapshot_rows",
            "rows copied by the table's current or last snapshot",
            ["table"],
        )
        self.snapshot_rows_estimate = self.gauge(
            "snapshot_rows_estimate",
            "the table's row count estimate when its snapshot began (pg_class.reltuples)",
            ["table"],
        )
        self.table_state = self.gauge(
            "table_state",
            "1 for the table's current state (pending, snapshot, catch_up, streaming, errored)",
            ["table", "state"],
        )
        self.streaming = self.gauge(
            "streaming",
            "1 while capture asks the server to stream transactions in progress "
            "(CAPTURE_STREAMING, until a streamed transaction outgrows the spools' limit)",
        )
        self.streamed_transactions = self.counter(
            "streamed_transactions",
            "transactions the server streamed in progress (CAPTURE_STREAMING): first blocks "
            "received, counted again when a reconnect makes the server stream one again",
        )
        self.streamed_open = self.gauge(
            "streamed_open_transactions",
            "transactions streamed in progress and neither committed nor aborted yet",
        )
        self.streamed_spool_bytes = self.gauge(
            "streamed_spool_bytes",
            "bytes the open streamed transactions' spools hold in CAPTURE_SPOOL_DIR, "
            "against CAPTURE_STREAMING_SPOOL_MAX_BYTES",
        )
        self.reconnects = self.counter(
            "reconnects",
            "capture attempts started again after a transient failure",
        )
        self.errors = self.counter(
            "errors",
            "errors by kind: ones that ended an attempt, and tables that went errored",
            ["kind"],
        )
        for status in WAL_STATUSES:
            self.slot_wal_status.labels(status).set(0)

    # -- updates ---------------------------------------------------------------------------

    def record_produced(self, table: str, headers: Headers, value: bytes | None, size: int) -> None:
        # Tally.add inlined: this runs once per produced record.
        counts = self.produced.counts
        key = (table, operation_of(headers, value))
        counts[key] = counts.get(key, 0) + 1
        sizes = self.produced_bytes.counts
        table_key = (table,)
        sizes[table_key] = sizes.get(table_key, 0) + size

    def records_produced(self, table: str, headers: Headers, count: int, size: int) -> None:
        """:meth:`record_produced` of ``count`` records of ``size`` bytes in all that
        share ``headers`` (a snapshot batch)."""
        counts = self.produced.counts
        key = (table, operation_of(headers, b""))
        counts[key] = counts.get(key, 0) + count
        sizes = self.produced_bytes.counts
        sizes[(table,)] = sizes.get((table,), 0) + size

    def slot_wal(self, retained: int | None, wal_status: str | None, safe: int | None) -> None:
        if retained is not None:
            self.slot_retained_wal.set(retained)
        self.slot_safe_wal_size.set(-1 if safe is None else safe)
        for status in WAL_STATUSES:
            self.slot_wal_status.labels(status).set(1 if status == wal_status else 0)

    def table_states(self, states: dict[str, TableState]) -> None:
        """Every table's state, once per status interval; a table newly errored counts as
        an error of its kind (``TableError``), once however long it stays errored."""
        for table, current in states.items():
            for state in TableState:
                self.table_state.labels(table, state.value).set(1 if state is current else 0)
        errored = {t for t, s in states.items() if s is TableState.ERRORED}
        for _ in errored - self._errored_tables:
            self.errors.labels("TableError").inc()
        self._errored_tables = errored
