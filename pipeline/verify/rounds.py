"""verify_tables: compare the lake with the source in rounds of verify points.

A round, as stages: take a verify point ``C`` (:func:`~pipeline.verify.source.verify_point`)
-> describe the tables at ``C`` (first round) -> wait until the pipeline's slot confirmed
``C`` -> per table: read the newest lake version -> compare buckets (the two sides at
the same time) -> fetch the keys of differing buckets -> classify
(:mod:`pipeline.verify.compare`). Later rounds take a fresh verify point and fetch only
the keys still unsettled; the last round reports what is left (docs/verify.md).

A table whose comparison fails (a query error, a lake table whose key is not the
source's) is reported FAILED and the others go on; a configuration error or a slot that
does not reach the verify point in time ends the whole run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from apply import errors as apply_errors
from apply.lake.dead_letter import dead_letter_path
from apply.lake.tables import TableId
from apply.settings import ApplySettings
from capture import errors as capture_errors
from capture.settings import CaptureSettings, PostgresSettings
from capture.source.credentials import source_password
from capture.source.setup import TableRef
from pipeline.verify import lake as lake_side
from pipeline.verify import source as source_side
from pipeline.verify.compare import (
    LakeRow,
    Outcome,
    SourceRow,
    bucket_count,
    classify,
    differing_buckets,
)
from pipeline.verify.report import TableReport, VerifyReport
from pipeline.verify.source import Connection, TableShape, VerifyPoint
from schemas.lsn import format_lsn

log = logging.getLogger(__name__)

DEFAULT_ROUNDS = 5
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MAX_KEYS = 20
DEFAULT_PAUSE_S = 1.0

_TableFailure = (capture_errors.TransientError, capture_errors.TableError, apply_errors.TableError)


@dataclass
class _TableRun:
    ref: TableRef
    report: TableReport
    shape: TableShape | None = None
    unsettled: list[str] = field(default_factory=list)
    done: bool = False


def _table_id(ref: TableRef) -> TableId:
    return TableId(ref.schema, ref.name)


def choose_tables(
    published: Sequence[TableRef],
    requested: Sequence[str] | None,
    has_lake_table: dict[TableRef, bool],
    publication: str,
) -> list[TableRef]:
    """The requested tables (each must be published), or every published table that
    has a Delta table."""
    if requested:
        chosen = []
        for text in requested:
            try:
                ref = TableRef.parse(text)
            except capture_errors.ConfigError as exc:
                raise capture_errors.ConfigError(f"--table {text}: {exc}") from exc
            if ref not in published:
                raise capture_errors.ConfigError(
                    f"table {ref.qualified} is not in publication {publication}: name a "
                    "captured table (schema.table)"
                )
            chosen.append(ref)
        return sorted(set(chosen))
    return sorted(ref for ref in published if has_lake_table.get(ref))


def verify_tables(
    capture_settings: CaptureSettings,
    apply_settings: ApplySettings,
    spark: SparkSession,
    tables: Sequence[str] | None = None,
    *,
    rounds: int = DEFAULT_ROUNDS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_keys: int = DEFAULT_MAX_KEYS,
    pause_s: float = DEFAULT_PAUSE_S,
) -> VerifyReport:
    """Compare ``tables`` (``schema.table``; default: every published table with a
    Delta table) in the lake with the source. Raises :class:`capture.errors.ConfigError`
    or :class:`apply.errors.ConfigError` for bad settings or an unknown table, and
    :class:`~pipeline.verify.source.VerifyPointTimeoutError` when the pipeline's slot
    does not reach a verify point within ``timeout_s``."""
    if rounds < 1:
        raise capture_errors.ConfigError("--rounds must be at least 1")
    started = time.monotonic()
    lake_side.check_session(spark)
    postgres = capture_settings.postgres
    dsn = postgres.dsn
    password = _password(postgres)
    root = apply_settings.lake.root
    with source_side.connect(dsn, password) as conn:
        conn.autocommit = True
        published = source_side.publication_tables(conn, postgres.publication)
    present = (
        {}
        if tables
        else {ref: lake_side.has_table(spark, root, _table_id(ref)) for ref in published}
    )
    chosen = choose_tables(list(published), tables, present, postgres.publication)
    if not chosen:
        raise capture_errors.ConfigError(
            f"nothing to verify: no table of publication {postgres.publication} has a Delta "
            f"table under {root}; check APPLY_LAKE__ROOT, or name tables with --table"
        )
    runs = [_TableRun(ref, TableReport(ref.qualified)) for ref in chosen]
    for number in range(1, rounds + 1):
        pending = [run for run in runs if not run.done]
        if not pending:
            break
        if number > 1:
            time.sleep(pause_s)
        _verify_round(
            spark,
            capture_settings,
            root,
            pending,
            published if number == 1 else None,
            final=number == rounds,
            timeout_s=timeout_s,
            max_keys=max_keys,
        )
    return VerifyReport([run.report for run in runs], time.monotonic() - started)


def _verify_round(
    spark: SparkSession,
    capture_settings: CaptureSettings,
    root: str,
    pending: list[_TableRun],
    describe: dict[TableRef, tuple[str, ...] | None] | None,
    *,
    final: bool,
    timeout_s: float,
    max_keys: int,
) -> None:
    """One round: verify point -> describe (first round: ``describe`` holds the
    published columns) -> wait for the slot -> errored tables -> compare each table."""
    postgres = capture_settings.postgres
    password = _password(postgres)
    with source_side.verify_point(postgres.dsn, password) as point:
        if describe is not None:
            for run in pending:
                _describe(point.connection, run, describe[run.ref], postgres.publication)
        source_side.wait_for_slot(postgres.dsn, password, postgres.slot, point.lsn, timeout_s)
        # Read after the wait: a table parked before the verify point is errored now.
        errored = lake_side.errored(spark, dead_letter_path(root))
        for run in pending:
            run.report.errored = errored.get(run.ref.qualified, run.report.errored)
        for run in pending:
            if run.done:
                continue
            started = time.monotonic()
            run.report.verify_points.append(format_lsn(point.lsn))
            try:
                with point.connection.transaction():  # a savepoint per table
                    _round(spark, root, point, run, final=final, max_keys=max_keys)
            except _TableFailure as exc:
                run.report.error = str(exc)
                run.done = True
            run.report.elapsed_s += time.monotonic() - started


def _describe(
    conn: Connection, run: _TableRun, published: Sequence[str] | None, publication: str
) -> None:
    try:
        with conn.transaction():
            shape = source_side.describe_table(conn, run.ref, published, publication)
    except _TableFailure as exc:
        run.report.error = str(exc)
        run.done = True
        return
    run.report.notes.extend(shape.notes)
    if not shape.key or not shape.columns:
        run.report.error = (
            "no primary key and not REPLICA IDENTITY FULL (capture rejects such a table): "
            "not verified"
            if not shape.key
            else "no column to compare"
        )
        run.done = True
        return
    if shape.keyless:
        run.report.notes.append(
            "no primary key: rows compared as a multiset of whole rows (the lake keeps one "
            "copy of rows the source holds more than once)"
        )
    run.shape = shape


def _round(
    spark: SparkSession,
    root: str,
    point: VerifyPoint,
    run: _TableRun,
    *,
    final: bool,
    max_keys: int,
) -> None:
    shape, report, conn = run.shape, run.report, point.connection
    assert shape is not None
    lake = lake_side.open_table(spark, root, _table_id(run.ref))
    if lake is None:
        if run.unsettled:  # the lake table went away between rounds
            found = source_side.rows_of_keys(conn, shape, run.unsettled)
            _settle(run, found, {}, point, final=final, max_keys=max_keys)
            return
        count, sample = source_side.row_count(conn, shape, max_keys)
        report.no_lake_table = True
        report.add(Outcome.MISSING, sample, max_keys, count=count)
        run.done = True
        return
    report.lake_versions.append(lake.version)
    absent = lake_side.absent_columns(lake, shape.columns)
    if run.unsettled:
        frame = lake_side.hashed(lake, shape, list(absent))
        source_rows = source_side.rows_of_keys(conn, shape, run.unsettled)
        lake_rows = lake_side.rows_of_keys(spark, frame, run.unsettled, report.table)
        _settle(run, source_rows, lake_rows, point, final=final, max_keys=max_keys)
        return
    if set(shape.key) & absent.keys() or lake.key_columns != shape.key:
        raise apply_errors.TableError(
            report.table,
            f"the lake table's key ({', '.join(lake.key_columns) or 'none'}) is not the "
            f"source's ({', '.join(shape.key)}): rows cannot be matched; resync the table",
        )
    report.notes.extend(absent.values())
    frame = lake_side.hashed(lake, shape, list(absent))
    buckets = bucket_count(
        max(source_side.estimated_rows(conn, run.ref), lake_side.row_count(lake, report.table))
    )
    with ThreadPoolExecutor(max_workers=1) as pool:
        source_future = pool.submit(source_side.bucket_stats, conn, shape, buckets)
        lake_stats = lake_side.bucket_stats(frame, buckets, report.table)
        source_stats = source_future.result()
    differing = differing_buckets(source_stats, lake_stats)
    log.info("verify %s: %d of %d buckets differ", report.table, len(differing), buckets)
    if not differing:
        run.done = True
        return
    source_rows = source_side.rows_in_buckets(conn, shape, buckets, differing)
    lake_rows = lake_side.rows_in_buckets(frame, buckets, differing, report.table)
    _settle(
        run,
        source_rows,
        lake_rows,
        point,
        final=final,
        max_keys=max_keys,
        keys=source_rows.keys() | lake_rows.keys(),
    )


def _settle(
    run: _TableRun,
    source_rows: dict[str, SourceRow],
    lake_rows: dict[str, LakeRow],
    point: VerifyPoint,
    *,
    final: bool,
    max_keys: int,
    keys: Collection[str] | None = None,
) -> None:
    considered = run.unsettled if keys is None else keys
    result = classify(considered, source_rows, lake_rows, point.lsn, final=final)
    for outcome in (Outcome.MISSING, Outcome.EXTRA, Outcome.DIFFERENT, Outcome.CHANGING):
        run.report.add(outcome, result.of(outcome), max_keys)
    run.unsettled = result.of(Outcome.UNSETTLED)
    run.done = not run.unsettled


def _password(postgres: PostgresSettings) -> str | None:
    """Capture's own source password: inline or from its file, as capture reads it."""
    secret = source_password(postgres)
    return secret.get_secret_value() if secret is not None else None
