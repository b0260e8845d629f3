"""Apply one micro-batch of change records to the lake: the body of ``foreachBatch``.

The tables of the batch are applied at the same time (:mod:`apply.table_pool`), each by
:func:`apply_table`:

1. read the Delta table's history: its newest version and the applied state
   (:mod:`apply.history`), or take what the job's own last MERGE committed while no
   commit followed it (:mod:`apply.known_tables`) -- nothing is kept that Delta does not
   hold, so a restarted job behaves exactly like a running one;
2. decode the topic's records with their writer schemas (:mod:`apply.decode`), and plan
   the table's columns: create the table on first sight, add new columns
   (:mod:`apply.delta_schema`);
3. measure the batch per partition and compute the new state (:mod:`apply.positions`);
4. drop replays, reduce to the latest change per key and MERGE, with the state in the
   same commit (:mod:`apply.merge`);
5. when the commits took the table's version past its turn, compact or vacuum it, in
   the same task, so the MERGE is its only writer (:mod:`apply.upkeep`).

A table that fails for a definite reason (:class:`~apply.errors.TableError`), or is
errored since an earlier batch, is **parked** instead: its records of the batch go to
the dead-letter table (:mod:`apply.dead_letter`), all parked tables of the batch in one
commit, after the other tables finished.

Guarantees:

- Every record of the batch ends up applied, superseded, dropped as a replay or
  tombstone, or parked; the control messages made from the result
  (:func:`apply.progress.batch_progress`) never claim a record that is neither in its
  lake table nor parked.
- A table never blocks another: a definite error parks only its own table, and an
  errored table stays parked, batch after batch, until ``python -m apply reapply``
  (:mod:`apply.reapply`) applied its records and released it.
- A transient failure (any error that is not a :class:`~apply.errors.TableError`) fails
  the whole batch, once every table's task has finished, and parks nothing: the retried
  batch is idempotent. Each table has either the whole batch committed or nothing;
  tables that committed it are skipped by their ``txnVersion``, or because their state
  already covers the batch's offsets.
- A batch whose offsets the table's state already covers (a replay under the same id,
  or the same records under a later id after a lost checkpoint) commits nothing: no new
  version in any table, the dead-letter table included.
- All writer fingerprints are resolved before any table is touched: an unknown one
  raises :class:`~apply.errors.UnknownSchemaError` and nothing is written. Asked again
  after the schema topic was re-read (``park_missing_schemas``), a table whose schemas
  are still missing is parked instead, so one lost schema blocks only its table.
- Batch ids never go backwards for a table within one query: a skipped MERGE must be a
  replay of the table's newest apply commit, and a covered batch may not have a lower id
  than that commit's when the same query wrote it (a lane that took the table over
  counts its own ids, :mod:`apply.lanes`);
  anything else means batch ids restarted under the same ``txnAppId`` (a checkpoint
  reset in place), which would skip new data, so it raises
  :class:`~apply.errors.ConfigError`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, replace

from pyspark.sql import DataFrame, SparkSession

from apply.change_log import (
    LOG_UPKEEP,
    Append,
    append,
    change_log_path,
    create_log,
    newer_state,
    reshape_log,
    resolve_unchanged,
)
from apply.dead_letter import (
    ErroredTable,
    ParkRequest,
    dead_letter_path,
    errored_tables,
    park,
    release_superseded,
)
from apply.decode import RECORD_COLUMNS, TopicSurvey, decode_topic, persisted, survey
from apply.delta_schema import (
    ColumnPlan,
    ExistingTable,
    ValueSchema,
    ensure_table,
    parse_value_schema,
    plan_columns,
    prepare_replacement,
    read_existing_table,
    support_timestamp_ntz,
)
from apply.errors import (
    BadRecordError,
    ConfigError,
    MissingSchemaError,
    SchemaChangeError,
    TableError,
    UnknownSchemaError,
)
from apply.fold import Folds, fold_table
from apply.history import TableHistory, newest_version, read_history, recover_state
from apply.known_tables import KnownTable, KnownTables
from apply.merge import (
    BatchMeasure,
    empty_source,
    measure,
    merge_into,
    merge_source,
    replace_table,
)
from apply.positions import (
    AppliedState,
    PartitionBatch,
    Position,
    TopicPartition,
    advance,
    covers,
    encode_state,
)
from apply.progress import BatchResult, ParkedTable, TableResult
from apply.superseded import TablePlan, measure_supersession, plan_table
from apply.table_pool import SchedulerPools, run_per_table, table_session
from apply.tables import TableId, table_of_topic, table_path
from apply.upkeep import TableUpkeep
from schemas.lsn import format_lsn
from schemas.registry_framing import registry_id_of
from schemas.single_object import Fingerprint, format_fingerprint

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ApplyContext:
    """What every batch needs besides its records."""

    lake_root: str
    """Delta tables live at ``<lake_root>/<schema>/<table>`` (:mod:`apply.tables`)."""
    txn_app_id: str
    """Delta ``txnAppId`` of the streaming query (:func:`apply.merge.transaction_app_id`)."""
    writer_schemas: Mapping[Fingerprint, str]
    """Writer schema JSON by fingerprint, as read from the schema topic. The mapping may
    grow between batches; it is read, never changed."""
    parallelism: int = 4
    """Tables of one batch applied at the same time."""
    schema_topic: str = "the schema topic"
    """Where ``writer_schemas`` come from, named in errors."""
    default_txn_app_id: str | None = None
    """The ``txnAppId`` of the one query the job runs without lanes
    (:func:`apply.app.checkpoint_location`): the writer of table states that name none,
    all written before lanes existed (:mod:`apply.lanes`). None: such states are taken
    as this query's."""
    upkeep: TableUpkeep | None = None
    """Compaction and vacuum after a table's commit (:mod:`apply.upkeep`); None: none."""
    known: KnownTables | None = None
    """What the job's earlier batches committed to each table, used again while no
    commit followed (:mod:`apply.known_tables`); None: every batch reads from Delta."""
    folds: Folds | None = None
    """With the change log (:mod:`apply.change_log`): batches append to each table's
    log, and these folds merge it into the table; None: batches MERGE into the table."""

    def wrote(self, state: AppliedState) -> bool:
        """Whether ``state`` was committed by this query (so its batch ids compare with
        this query's), rather than by another lane that held the table before."""
        writer = state.txn_app_id or self.default_txn_app_id
        return writer is None or writer == self.txn_app_id

    @property
    def dead_letter(self) -> str:
        """Location of the dead-letter table (:mod:`apply.dead_letter`)."""
        return dead_letter_path(self.lake_root)


@dataclass(frozen=True, slots=True)
class _Park:
    """A table task's verdict: park the table's records of the batch."""

    survey: TopicSurvey
    error: str
    error_kind: str
    newly_errored: bool
    state: AppliedState | None
    schemas: tuple[ValueSchema, ...]


def _parsable_schemas(topic_survey: TopicSurvey, context: ApplyContext) -> tuple[ValueSchema, ...]:
    """The writer schemas of the topic's records that parse, for the parked positions."""
    table = table_of_topic(topic_survey.topic)
    schemas = []
    for fingerprint in sorted(topic_survey.fingerprints):
        schema_json = context.writer_schemas.get(fingerprint)
        if schema_json is None:
            continue  # a missing schema: its records are parked without a position
        try:
            schemas.append(parse_value_schema(table, fingerprint, schema_json))
        except TableError:
            continue  # its records are parked without a position
    return tuple(schemas)


def _lake_state(
    spark: SparkSession, topic_survey: TopicSurvey, context: ApplyContext
) -> AppliedState | None:
    """The applied state of the topic's lake table, if it has a readable one."""
    table = table_of_topic(topic_survey.topic)
    try:
        return applied_state(spark, context.lake_root, table)
    except TableError:
        return None  # the history itself is what is broken; positions stay unknown


def applied_state(spark: SparkSession, lake_root: str, table: TableId) -> AppliedState | None:
    """The applied state of ``table``: its Delta table's, or its change log's when that
    is newer (:func:`apply.change_log.newer_state`)."""
    name = str(table)
    logged = recover_state(spark, change_log_path(lake_root, table), name)
    return newer_state(recover_state(spark, table_path(lake_root, table), name), logged)


def _table_task(
    spark: SparkSession,
    *,
    batch: DataFrame,
    batch_id: int,
    context: ApplyContext,
    errored: Mapping[str, ErroredTable],
    topic_survey: TopicSurvey,
) -> TableResult | _Park | None:
    """One table's part of the batch, in a session of its own (:mod:`apply.table_pool`)."""
    session = table_session(spark)
    table = str(table_of_topic(topic_survey.topic))
    before = errored.get(table)
    if before is not None:
        released = _released(
            session,
            batch=batch,
            batch_id=batch_id,
            topic_survey=topic_survey,
            context=context,
            errored=before,
        )
        if released is not None:
            return released
        return _Park(
            survey=topic_survey,
            error=before.error,
            error_kind=before.error_kind,
            newly_errored=False,
            state=_lake_state(session, topic_survey, context),
            schemas=_parsable_schemas(topic_survey, context),
        )
    try:
        missing = _missing_schemas(topic_survey, context)
        if missing:
            registry_ids = [i for i in map(registry_id_of, missing) if i is not None]
            fingerprints = [format_fingerprint(f) for f in missing if registry_id_of(f) is None]
            raise MissingSchemaError(
                table, topic_survey.topic, context.schema_topic, fingerprints, registry_ids
            )
        return apply_table(session, batch, batch_id, topic_survey, context)
    except TableError as exc:
        log.error(  # noqa: TRY400 - the message says what to do; the trace adds nothing
            "batch %d: table %s is errored and parked: %s", batch_id, table, exc
        )
        return _Park(
            survey=topic_survey,
            error=str(exc),
            error_kind=type(exc).__name__,
            newly_errored=True,
            state=_lake_state(session, topic_survey, context),
            schemas=_parsable_schemas(topic_survey, context),
        )


def _released(
    spark: SparkSession,
    *,
    batch: DataFrame,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
    errored: ErroredTable,
) -> TableResult | None:
    """An errored table's batch applied, and its parked records released, when a TRUNCATE
    positioned after every parked record supersedes them all (a resync reached apply);
    None when the table stays parked.

    The TRUNCATE is this batch's, or one the lake table already holds: the latter when
    an earlier attempt committed the batch and died before the release."""
    table = errored.table
    newest = errored.newest
    if newest is None or errored.unpositioned or _missing_schemas(topic_survey, context):
        return None  # a record without position could be after any TRUNCATE
    state = _lake_state(spark, topic_survey, context)
    erased = None if state is None else state.truncated_at
    if erased is None or erased <= newest:
        try:
            schemas = [
                parse_value_schema(table_of_topic(topic_survey.topic), f, context.writer_schemas[f])
                for f in sorted(topic_survey.fingerprints)
            ]
        except TableError:
            return None
        if not schemas:
            return None
        erased = measure_supersession(batch, topic_survey.topic, schemas, state).truncate
        if erased is None or erased <= newest:
            return None
    try:
        result = apply_table(spark, batch, batch_id, topic_survey, context)
    except TableError as exc:
        log.error(  # noqa: TRY400 - the message says what to do; the trace adds nothing
            "batch %d: table %s stays errored, its batch after the TRUNCATE fails too: %s",
            batch_id,
            table,
            exc,
        )
        return None
    release_superseded(
        spark, context.dead_letter, table, erased, None if result is None else result.version
    )
    log.warning(
        "batch %d: table %s is released: the TRUNCATE at %s supersedes its %d parked records",
        batch_id,
        table,
        _at(erased),
        errored.records,
    )
    return result


def _at(position: Position | None) -> str:
    """A position as logs show it: ``<commit LSN>#<ordinal>``."""
    return "-" if position is None else f"{format_lsn(position.commit_lsn)}#{position.ordinal}"


def _table_name(topic_survey: TopicSurvey) -> str:
    """The table a topic's records go to: the name of its scheduler pool too."""
    return str(table_of_topic(topic_survey.topic))


def _missing_schemas(topic_survey: TopicSurvey, context: ApplyContext) -> list[Fingerprint]:
    """The writer keys (fingerprints, or registry ids as keys) of the topic's records
    that ``context`` lacks."""
    return sorted(
        fingerprint
        for fingerprint in topic_survey.fingerprints
        if fingerprint not in context.writer_schemas
    )


def apply_batch(
    batch: DataFrame,
    batch_id: int,
    context: ApplyContext,
    *,
    park_missing_schemas: bool = False,
) -> BatchResult:
    """Apply a micro-batch from the Kafka source: a result per table applied (tables
    holding only tombstones and no Delta table yet have none) and per table parked, each
    in topic order.

    A writer fingerprint ``context`` lacks raises :class:`UnknownSchemaError` before
    anything is written: the schema topic is probably read less far than the change
    topics. The caller reads it again and retries with ``park_missing_schemas``; then a
    table whose schemas are still missing is parked (:class:`MissingSchemaError`) and
    the others are applied."""
    spark = batch.sparkSession
    # Surveyed once, then read again per table. Only the columns decoding needs are
    # cached: keeping the headers too doubled the cost of the first read. Parking, the
    # rare path, reads the batch again, headers included.
    records = batch.select(*RECORD_COLUMNS)
    with persisted(records):
        surveys = survey(records)
        if not park_missing_schemas:
            for topic in sorted(surveys):
                missing = _missing_schemas(surveys[topic], context)
                if missing:
                    raise UnknownSchemaError(topic, [format_fingerprint(f) for f in missing])
        errored = errored_tables(spark, context.dead_letter)
        topics = [surveys[topic] for topic in sorted(surveys)]
        futures = run_per_table(
            topics,
            lambda topic_survey: _table_task(
                spark,
                batch=records,
                batch_id=batch_id,
                context=context,
                errored=errored,
                topic_survey=topic_survey,
            ),
            context.parallelism,
            pools=SchedulerPools(spark.sparkContext, _table_name),
        )
        # Not a TableError: the batch fails as a whole, the first failure in topic order.
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
        outcomes = [future.result() for future in futures]
        applied = tuple(o for o in outcomes if isinstance(o, TableResult))
        to_park = [o for o in outcomes if isinstance(o, _Park)]
        return BatchResult(applied=applied, parked=_park(spark, batch, batch_id, context, to_park))


def _park(
    spark: SparkSession,
    batch: DataFrame,
    batch_id: int,
    context: ApplyContext,
    to_park: list[_Park],
) -> tuple[ParkedTable, ...]:
    requests = [
        ParkRequest(
            table=str(table_of_topic(p.survey.topic)),
            topic=p.survey.topic,
            error=p.error,
            error_kind=p.error_kind,
            schemas=p.schemas,
        )
        for p in to_park
    ]
    written = park(spark, context.dead_letter, batch, batch_id, requests)
    parked = []
    for request, p in zip(requests, to_park, strict=True):
        result = ParkedTable(
            table=request.table,
            topic=request.topic,
            batch_id=batch_id,
            error=p.error,
            error_kind=p.error_kind,
            newly_errored=p.newly_errored,
            records=p.survey.records,
            parked=written[request.table],
            next_offsets={
                (request.topic, partition): seen.next_offset
                for partition, seen in p.survey.partitions.items()
            },
            state=p.state,
        )
        log.warning(
            "batch %d to %s: parked %d of %d records in %s (table errored since %s: %s)",
            batch_id,
            result.table,
            result.parked,
            result.records,
            context.dead_letter,
            "this batch" if result.newly_errored else "an earlier batch",
            result.error_kind,
        )
        parked.append(result)
    return tuple(parked)


def _metric(metrics: Mapping[str, str], name: str) -> int:
    return int(metrics.get(name, "0"))


def _partition_batches(
    topic_survey: TopicSurvey, measured: BatchMeasure
) -> dict[TopicPartition, PartitionBatch]:
    """What the batch held per partition: offsets from the survey (tombstones included),
    positions from the decoded records."""
    batches = {}
    for partition, seen in topic_survey.partitions.items():
        decoded = measured.partitions.get(partition)
        batches[(topic_survey.topic, partition)] = PartitionBatch(
            next_offset=seen.next_offset,
            position=None if decoded is None else decoded.position,
            commit_ts=None if decoded is None else decoded.commit_ts,
        )
    return batches


def _batch_ids_restarted(table: str, batch_id: int, recorded: AppliedState | None) -> ConfigError:
    return ConfigError(
        f"batch {batch_id} for table {table} is already written, but the table's newest "
        f"apply commit is from batch {None if recorded is None else recorded.batch_id}: the "
        "streaming checkpoint was reset while keeping its location, so batch ids restarted "
        "under the same txnAppId; use a new checkpoint location"
    )


def _replayed_state(spark: SparkSession, path: str, table: str, batch_id: int) -> AppliedState:
    """The state recorded at ``path`` (the table, or its change log) when Delta skipped
    the batch's write: this ``txnAppId`` committed this batch id, or a later one,
    before. Only the first is a replay; the second means batch ids restarted."""
    recorded = recover_state(spark, path, table)
    if recorded is None or recorded.batch_id != batch_id:
        raise _batch_ids_restarted(table, batch_id, recorded)
    return recorded


def _covered_result(
    topic_survey: TopicSurvey,
    batch_id: int,
    version: int,
    previous: AppliedState,
    *,
    path: str,
    context: ApplyContext,
) -> TableResult | None:
    """The result for a batch the table's state already covers, which commits nothing;
    None when the batch holds records the table has not seen. Batch ids compare only
    within one query: a lane that just took the table over counts from 0."""
    topic = topic_survey.topic
    next_offsets = {(topic, p): seen.next_offset for p, seen in topic_survey.partitions.items()}
    if not covers(previous, next_offsets):
        return None
    if context.wrote(previous) and batch_id < previous.batch_id:
        raise _batch_ids_restarted(previous.table, batch_id, previous)
    result = TableResult(
        table=previous.table,
        topic=topic,
        path=path,
        batch_id=batch_id,
        committed=False,
        version=version,
        records=topic_survey.records,
        tombstones=topic_survey.tombstones,
        # Every record is below its partition's next offset: applied before.
        replays=topic_survey.records - topic_survey.tombstones,
        superseded=0,
        truncates=0,
        source_rows=0,
        rows_inserted=0,
        rows_updated=0,
        rows_deleted=0,
        rows_truncated=0,
        table_created=False,
        columns_added=(),
        partitions=tuple(sorted(next_offsets)),
        state=previous,
    )
    log.info(
        "batch %d to %s: all %d records applied before, nothing to commit (version %d)",
        batch_id,
        previous.table,
        result.records,
        version,
    )
    return result


def apply_table(
    spark: SparkSession,
    batch: DataFrame,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
) -> TableResult | None:
    """Apply one topic's records of the batch to its Delta table (module docstring).

    Returns None only for a batch holding nothing but tombstones of a table that has no
    Delta table yet: there is nothing to record them in.
    """
    topic = topic_survey.topic
    table = table_of_topic(topic)
    name = str(table)
    path = table_path(context.lake_root, table)
    _check_framing(topic_survey, name)
    schemas = [
        parse_value_schema(table, fingerprint, context.writer_schemas[fingerprint])
        for fingerprint in sorted(topic_survey.fingerprints)
    ]
    if context.folds is not None:
        return _apply_table_logged(
            spark, batch, batch_id, topic_survey, context, schemas=schemas, folds=context.folds
        )
    known = context.known.current(spark, path) if context.known is not None else None
    existing: ExistingTable | None = None
    if known is not None:
        history: TableHistory | None = known.history
        existing = known.existing
    else:
        history = read_history(spark, path, name)
    if history is not None and history.state is not None:
        covered = _covered_result(
            topic_survey, batch_id, history.version, history.state, path=path, context=context
        )
        if covered is not None:
            return covered
    if known is None:
        existing = read_existing_table(spark, path, table) if history is not None else None
    if existing is None and not schemas:
        log.warning("tombstones for a table not created yet, nothing to record: %s", name)
        return None
    previous = history.state if history is not None else None
    plan = _plan(batch, topic, table=table, existing=existing, schemas=schemas, previous=previous)

    decoded = (
        decode_topic(batch, topic, schemas, plan.columns.columns, plan.superseded)
        if schemas
        else None
    )
    with persisted(decoded):
        result = _apply_decoded(
            spark,
            batch_id=batch_id,
            topic_survey=topic_survey,
            context=context,
            history=history,
            existing=existing,
            plan=plan,
            decoded=decoded,
        )
    _after_commit(
        spark,
        context,
        result,
        path=path,
        existing=existing if not plan.replace and not plan.columns.added else None,
        version_before=-1 if history is None else history.version,
    )
    return result


def _after_commit(
    spark: SparkSession,
    context: ApplyContext,
    result: TableResult,
    *,
    path: str,
    existing: ExistingTable | None,
    version_before: int,
) -> None:
    """After a table's batch wrote the Delta table at ``path`` (the table, or its change
    log): keep what it committed for the next batch (:mod:`apply.known_tables`), when
    ``existing`` names the columns it wrote to (None: the batch created or changed
    them, nothing is kept), and run the upkeep the commit made due (:mod:`apply.upkeep`)."""
    if context.known is not None:
        if result.committed and existing is not None:
            context.known.remember(
                path, KnownTable(TableHistory(result.version, result.state), existing)
            )
        else:
            context.known.forget(path)
    if result.committed and context.upkeep is not None:
        context.upkeep.after_commit(
            spark,
            table=result.table,
            path=path,
            version_before=version_before,
            version_after=result.version,
        )


def _check_framing(topic_survey: TopicSurvey, table: str) -> None:
    for partition, seen in sorted(topic_survey.partitions.items()):
        if seen.first_without_header is not None:
            raise BadRecordError(
                table,
                topic_survey.topic,
                partition,
                seen.first_without_header,
                "has neither framing of the contract (no single-object c3 01 header, no "
                "Schema Registry 00 header)",
            )


def _apply_table_logged(
    spark: SparkSession,
    batch: DataFrame,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
    *,
    schemas: list[ValueSchema],
    folds: Folds,
) -> TableResult | None:
    """:func:`apply_table` with the change log on: the batch's changes are appended to
    the table's log when the log can take them, while the table may be being folded
    (an append and a fold's trim never conflict, :func:`apply.change_log.create_log`);
    else, holding the table's fold lock, the log is folded and emptied and the batch is
    merged into the table (:mod:`apply.change_log`, What goes to the log)."""
    topic = topic_survey.topic
    table = table_of_topic(topic)
    name = str(table)
    path = table_path(context.lake_root, table)
    log_path = change_log_path(context.lake_root, table)
    known = (
        context.known.current(spark, log_path, passing=LOG_UPKEEP)
        if context.known is not None
        else None
    )
    table_history: TableHistory | None = None
    if known is not None:
        log_history: TableHistory | None = known.history
        existing: ExistingTable | None = known.existing
        state = known.history.state
    else:
        table_history = read_history(spark, path, name)
        log_history = read_history(spark, log_path, name)
        state = newer_state(
            None if table_history is None else table_history.state,
            None if log_history is None else log_history.state,
        )
        existing = read_existing_table(spark, path, table) if table_history is not None else None
    if state is not None:
        reported = log_history or table_history
        covered = _covered_result(
            topic_survey,
            batch_id,
            -1 if reported is None else reported.version,
            state,
            path=log_path,
            context=context,
        )
        if covered is not None:
            return covered
    if existing is None and not schemas:
        log.warning("tombstones for a table not created yet, nothing to record: %s", name)
        return None
    plan = _plan(batch, topic, table=table, existing=existing, schemas=schemas, previous=state)
    decoded = (
        decode_topic(batch, topic, schemas, plan.columns.columns, plan.superseded)
        if schemas
        else None
    )
    with persisted(decoded):
        measured = _measure(decoded, state, topic_survey, name)
        loggable = not plan.replace and measured.truncate is None
        if not loggable:
            # The table takes this batch directly: first it takes everything the log
            # holds, and the log is emptied, so no row left there is older than a change
            # in the table.
            if context.known is not None:
                context.known.forget(log_path)
            with folds.lock(table):
                return _fold_then_merge(
                    spark,
                    batch_id=batch_id,
                    topic_survey=topic_survey,
                    context=context,
                    folds=folds,
                    state=state,
                    log_history=log_history,
                    existing=existing,
                    plan=plan,
                    decoded=decoded,
                    measured=measured,
                )
        # Creating the table or adding columns to it is a commit on the table: not while
        # a fold MERGEs into it.
        ddl = plan.columns.create or bool(plan.columns.added)
        with folds.lock(table) if ddl else nullcontext():
            result = _append_decoded(
                spark,
                batch_id=batch_id,
                topic_survey=topic_survey,
                context=context,
                previous=state,
                log_history=log_history,
                existing=existing,
                plan=plan.columns,
                decoded=decoded,
                measured=measured,
            )
    folds.appended(table)
    _after_commit(
        spark,
        context,
        result,
        path=log_path,
        existing=existing if not plan.columns.added and log_history is not None else None,
        version_before=-1 if log_history is None else log_history.version,
    )
    return result


def _fold_then_merge(
    spark: SparkSession,
    *,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
    folds: Folds,
    state: AppliedState | None,
    log_history: TableHistory | None,
    existing: ExistingTable | None,
    plan: TablePlan,
    decoded: DataFrame | None,
    measured: BatchMeasure,
) -> TableResult:
    """A batch the log cannot take, under the table's fold lock: the table takes
    everything the log holds and the log is emptied, so no row left there is older than
    a change in the table; then the batch is merged into the table."""
    table = table_of_topic(topic_survey.topic)
    name = str(table)
    path = table_path(context.lake_root, table)
    log_path = change_log_path(context.lake_root, table)
    mark = folds.mark(table)
    if log_history is not None:
        fold_table(
            spark,
            lake_root=context.lake_root,
            table=table,
            default_app_id=context.txn_app_id,
            empty_log=True,
        )
    folds.folded(table, mark)
    direct = read_history(spark, path, name)
    merged = _apply_decoded(
        spark,
        batch_id=batch_id,
        topic_survey=topic_survey,
        context=context,
        history=None if direct is None else TableHistory(direct.version, state),
        existing=existing,
        plan=plan,
        decoded=decoded,
        measured=measured,
    )
    if log_history is not None and (plan.replace or plan.columns.added):
        # The emptied log takes the table's new columns, so the next append and the
        # freshest view's SQL find them (a retyped column included).
        reshape_log(spark, log_path, plan.columns.columns)
    # Nothing is kept: the next batch reads the table and its log from Delta.
    _after_commit(
        spark,
        context,
        merged,
        path=path,
        existing=None,
        version_before=-1 if direct is None else direct.version,
    )
    return merged


def _measure(
    decoded: DataFrame | None, previous: AppliedState | None, topic_survey: TopicSurvey, table: str
) -> BatchMeasure:
    """:func:`apply.merge.measure`, and a record that does not decode raises."""
    measured = (
        measure(decoded, previous, topic_survey.topic)
        if decoded is not None
        else BatchMeasure(partitions={}, unchanged_columns=frozenset())
    )
    for partition, seen_decoded in sorted(measured.partitions.items()):
        if seen_decoded.first_malformed is not None:
            raise BadRecordError(
                table,
                topic_survey.topic,
                partition,
                seen_decoded.first_malformed,
                "does not decode with the writer schema its header names",
            )
    return measured


def _append_decoded(
    spark: SparkSession,
    *,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
    previous: AppliedState | None,
    log_history: TableHistory | None,
    existing: ExistingTable | None,
    plan: ColumnPlan,
    decoded: DataFrame | None,
    measured: BatchMeasure,
) -> TableResult:
    """Append the batch's latest change per key to the table's log, with the new state
    in the same commit. The table itself is created or given new columns first, so a
    fold always finds every column the log holds."""
    topic = topic_survey.topic
    table = table_of_topic(topic)
    name = str(table)
    path = table_path(context.lake_root, table)
    log_path = change_log_path(context.lake_root, table)
    ensure_table(spark, path, table, plan, existing)
    if log_history is None:
        create_log(spark, log_path, table, plan.columns, plan.key_columns)
        version_before = newest_version(spark, log_path)
    else:
        # The append adds the batch's new columns to the log (mergeSchema), all but the
        # feature a zone-less timestamp needs.
        support_timestamp_ntz(spark, log_path, plan.added)
        version_before = newest_version(spark, log_path) if plan.added else log_history.version
    seq = version_before + 1
    state = replace(
        advance(
            previous,
            name,
            batch_id,
            _partition_batches(topic_survey, measured),
            None,
            txn_app_id=context.txn_app_id,
        ),
        log_seq=seq,
    )
    source = (
        resolve_unchanged(
            spark,
            merge_source(
                decoded,
                previous=previous,
                topic=topic,
                plan=plan,
                erased_before=None if previous is None else previous.truncated_at,
                unchanged_columns=measured.unchanged_columns,
            ),
            table_path=path,
            log_path=log_path,
            columns=plan.columns,
            key_columns=plan.key_columns,
        )
        if decoded is not None
        else empty_source(spark, plan)
    )
    outcome = append(
        spark,
        source,
        plan.columns,
        Append(
            path=log_path,
            table=name,
            seq=seq,
            version_before=version_before,
            app_id=context.txn_app_id,
            batch_id=batch_id,
            metadata=encode_state(state),
        ),
    )
    if not outcome.committed:
        state = _replayed_state(spark, log_path, name, batch_id)
    replays = sum(m.replays for m in measured.partitions.values())
    source_rows = _metric(outcome.metrics, "numOutputRows")
    changes = topic_survey.records - topic_survey.tombstones - replays
    result = TableResult(
        table=name,
        topic=topic,
        path=log_path,
        batch_id=batch_id,
        committed=outcome.committed,
        version=outcome.version,
        records=topic_survey.records,
        tombstones=topic_survey.tombstones,
        replays=replays,
        superseded=changes - source_rows if outcome.committed else 0,
        truncates=0,
        source_rows=source_rows,
        rows_inserted=0,
        rows_updated=0,
        rows_deleted=0,
        rows_truncated=0,
        table_created=plan.create,
        columns_added=tuple(column.name for column in plan.added),
        partitions=tuple(sorted((topic, partition) for partition in topic_survey.partitions)),
        state=state,
    )
    log.info(
        "batch %d to %s: change log version %d %s, %d records, %d replays, %d rows logged",
        batch_id,
        name,
        result.version,
        "committed" if result.committed else "skipped as already committed",
        result.records,
        result.replays,
        source_rows,
    )
    return result


def _plan(
    batch: DataFrame,
    topic: str,
    *,
    table: TableId,
    existing: ExistingTable | None,
    schemas: list[ValueSchema],
    previous: AppliedState | None,
) -> TablePlan:
    """The table's columns for the batch. Records a TRUNCATE superseded are left out of
    planning (:mod:`apply.superseded`); finding them costs a Spark job, so only when the
    plain plan fails or the batch holds more than one writer schema."""
    try:
        columns = plan_columns(table, existing, schemas)
    except SchemaChangeError:
        if not schemas:
            raise
    else:
        if len(schemas) <= 1:
            return TablePlan(columns, frozenset(), replace=False)
    supersession = measure_supersession(batch, topic, schemas, previous)
    plan = plan_table(table, existing, schemas, supersession, previous)
    if plan.superseded:
        log.info(
            "%s: writer schemas %s are superseded by the TRUNCATE at %s",
            table,
            ", ".join(sorted(format_fingerprint(f) for f in plan.superseded)),
            _at(supersession.erased_before(previous)),
        )
    return plan


def _apply_decoded(
    spark: SparkSession,
    *,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
    history: TableHistory | None,
    existing: ExistingTable | None,
    plan: TablePlan,
    decoded: DataFrame | None,
    measured: BatchMeasure | None = None,
) -> TableResult:
    """:func:`apply_table` once the records are decoded: measure (unless ``measured``),
    then MERGE. ``decoded`` is cached, so the measure and the MERGE decode every record
    once."""
    topic = topic_survey.topic
    table = table_of_topic(topic)
    name = str(table)
    path = table_path(context.lake_root, table)
    previous = history.state if history is not None else None
    if measured is None:
        measured = _measure(decoded, previous, topic_survey, name)
    truncate = measured.truncate
    state = advance(
        previous,
        name,
        batch_id,
        _partition_batches(topic_survey, measured),
        truncate,
        txn_app_id=context.txn_app_id,
    )

    columns = plan.columns
    if plan.replace:
        assert existing is not None  # plan_table replaces an existing table only
        prepare_replacement(spark, path, columns, existing)
        version_before = newest_version(spark, path)
    else:
        ensure_table(spark, path, table, columns, existing)
        if history is None or columns.added:
            refreshed = read_history(spark, path, name)
            assert refreshed is not None  # ensure_table just wrote the table
            version_before = refreshed.version
        else:
            version_before = history.version
    source = (
        merge_source(
            decoded,
            previous=previous,
            topic=topic,
            plan=columns,
            erased_before=state.truncated_at,
            unchanged_columns=measured.unchanged_columns,
        )
        if decoded is not None
        else empty_source(spark, columns)
    )
    if plan.replace:
        log.warning(
            "batch %d to %s: the lake table cannot take the new schema; the TRUNCATE at %s "
            "erases every row it holds, so it is replaced by the rows from there on",
            batch_id,
            name,
            _at(truncate),
        )
        outcome = replace_table(
            spark,
            path=path,
            table=name,
            source=source,
            plan=columns,
            version_before=version_before,
            app_id=context.txn_app_id,
            batch_id=batch_id,
            metadata=encode_state(state),
        )
    else:
        outcome = merge_into(
            spark,
            path=path,
            table=name,
            source=source,
            plan=columns,
            truncate=truncate,
            version_before=version_before,
            app_id=context.txn_app_id,
            batch_id=batch_id,
            metadata=encode_state(state),
        )
    if not outcome.committed:
        state = _replayed_state(spark, path, name, batch_id)

    metrics = outcome.metrics
    replays = sum(m.replays for m in measured.partitions.values())
    truncates = sum(m.truncates for m in measured.partitions.values())
    source_rows = _metric(metrics, "numSourceRows")
    changes = topic_survey.records - topic_survey.tombstones - replays - truncates
    result = TableResult(
        table=name,
        topic=topic,
        path=path,
        batch_id=batch_id,
        committed=outcome.committed,
        version=outcome.version,
        records=topic_survey.records,
        tombstones=topic_survey.tombstones,
        replays=replays,
        superseded=changes - source_rows if outcome.committed else 0,
        truncates=truncates,
        source_rows=source_rows,
        rows_inserted=_metric(
            metrics, "numOutputRows" if plan.replace else "numTargetRowsInserted"
        ),
        rows_updated=_metric(metrics, "numTargetRowsUpdated"),
        rows_deleted=_metric(metrics, "numTargetRowsDeleted"),
        rows_truncated=_metric(metrics, "numTargetRowsNotMatchedBySourceDeleted"),
        table_created=columns.create and not plan.replace,
        columns_added=tuple(column.name for column in columns.added),
        partitions=tuple(sorted((topic, partition) for partition in topic_survey.partitions)),
        state=state,
    )
    log.info(
        "batch %d to %s: version %d %s, %d records, %d replays, "
        "rows inserted %d, updated %d, deleted %d",
        batch_id,
        name,
        result.version,
        "committed" if result.committed else "skipped as already committed",
        result.records,
        result.replays,
        result.rows_inserted,
        result.rows_updated,
        result.rows_deleted,
    )
    return result
