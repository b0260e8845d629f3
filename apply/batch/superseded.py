"""Records a TRUNCATE superseded, and what that means for planning a table's columns.

A TRUNCATE at position ``T`` erases every row last changed before ``T`` (docs/apply.md,
TRUNCATE), so a record positioned before the newest TRUNCATE -- of the batch, or applied
before (the state's ``truncated_at``) -- can never reach the table: the MERGE drops it
anyway. Such records must not take part in planning the table's columns either. That is
what lets a resync mend a table whose schema the lake could not follow: after
``ALTER COLUMN v TYPE text`` the topic holds records of both writer schemas, then the
resync's TRUNCATE and its snapshot rows; only the writer schemas of records from the
TRUNCATE on describe the table as it now is.

Planning (:func:`plan_table`, pure):

- A writer schema **survives** when one of its records that is not a replay is at or
  after the newest TRUNCATE; every other schema is *superseded*: its records are decoded
  for their positions only (:func:`apply.lake.decode.decode_topic`) and never planned.
- The surviving schemas are planned against the lake table as usual
  (:func:`apply.lake.delta_schema.plan_columns`).
- If they cannot evolve the lake table (a retyped column, changed key columns) and the
  batch itself holds a TRUNCATE, the table is **replaced**: the batch erases every row
  the lake holds from before it, so nothing of the old schema has to be kept. The new
  columns are those of the surviving schemas alone, and the replacement is one Delta
  commit (:func:`apply.lake.spark_merge.replace_table`).
- Without a TRUNCATE in the batch the error stands: rows of the old schema would stay.

Measuring (:func:`measure_supersession`) is one Spark job over the envelopes, run only
when the plain plan fails or the batch holds more than one writer schema of the table,
so a batch without a schema change costs nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as sf

from apply.errors import SchemaChangeError
from apply.lake.decode import COMMIT_LSN, OP, ORDINAL, decode_envelopes
from apply.lake.delta_schema import ColumnPlan, ExistingTable, ValueSchema, plan_columns
from apply.lake.positions import AppliedState, Position
from apply.lake.spark_merge import replay_flag
from apply.lake.tables import TableId
from schemas.lsn import Lsn
from schemas.operation import Operation
from schemas.single_object import Fingerprint, format_fingerprint


@dataclass(frozen=True, slots=True)
class Supersession:
    """What a batch holds of one table, as far as TRUNCATEs are concerned."""

    truncate: Position | None
    """The newest TRUNCATE of the batch that is not a replay."""
    newest: Mapping[Fingerprint, Position]
    """Per writer fingerprint, the position of its newest record that is not a replay
    (a fingerprint with only replays or undecodable records is absent)."""

    def erased_before(self, previous: AppliedState | None) -> Position | None:
        """The newest TRUNCATE, of the batch or applied before."""
        applied = None if previous is None else previous.truncated_at
        found = [p for p in (self.truncate, applied) if p is not None]
        return max(found) if found else None

    def surviving(self, previous: AppliedState | None) -> frozenset[Fingerprint]:
        """The writer fingerprints with a record at or after the newest TRUNCATE."""
        erased = self.erased_before(previous)
        return frozenset(
            fingerprint
            for fingerprint, newest in self.newest.items()
            if erased is None or newest >= erased
        )


@dataclass(frozen=True, slots=True)
class TablePlan:
    """How a batch writes its table."""

    columns: ColumnPlan
    superseded: frozenset[Fingerprint]
    """Writer schemas whose records are all superseded: decoded for positions only."""
    replace: bool
    """The table is replaced (module docstring): schema and rows, in one commit."""


def plan_table(
    table: TableId,
    existing: ExistingTable | None,
    schemas: Sequence[ValueSchema],
    supersession: Supersession,
    previous: AppliedState | None,
) -> TablePlan:
    """The plan for a batch with ``schemas`` (module docstring); pure. Raises
    :class:`SchemaChangeError` when even the surviving schemas cannot be applied."""
    alive = supersession.surviving(previous)
    surviving = [schema for schema in schemas if schema.fingerprint in alive]
    superseded = frozenset(s.fingerprint for s in schemas if s.fingerprint not in alive)
    if not surviving and existing is None:
        # Nothing the batch holds can reach the table: plan it from every schema, so
        # that a table is still created (and its offsets recorded) when it can be.
        return TablePlan(plan_columns(table, None, schemas), frozenset(), replace=False)
    try:
        return TablePlan(plan_columns(table, existing, surviving), superseded, replace=False)
    except SchemaChangeError:
        if existing is None or supersession.truncate is None:
            raise
    return TablePlan(plan_columns(table, None, surviving), superseded, replace=True)


def measure_supersession(
    batch: DataFrame,
    topic: str,
    schemas: Sequence[ValueSchema],
    previous: AppliedState | None,
) -> Supersession:
    """The newest TRUNCATE and the newest record per writer schema of ``topic``'s records
    in ``batch``, replays left out; one Spark job."""
    envelopes = decode_envelopes(batch, topic, schemas)
    position = sf.struct(sf.col(COMMIT_LSN), sf.col(ORDINAL))
    # An undecodable envelope has a null op: left out here, reported by the measure.
    fresh = sf.col(OP).isNotNull() & ~replay_flag(previous, topic, malformed=sf.lit(False))
    rows = (
        envelopes.where(fresh)
        .groupBy("fingerprint")
        .agg(
            sf.max(position).alias("newest"),
            sf.max(sf.when(sf.col(OP) == sf.lit(Operation.TRUNCATE.value), position)).alias(
                "truncate"
            ),
        )
        .collect()
    )
    by_hex = {format_fingerprint(schema.fingerprint): schema.fingerprint for schema in schemas}
    newest: dict[Fingerprint, Position] = {}
    truncates: list[Position] = []
    for row in rows:
        newest[by_hex[row["fingerprint"]]] = _position(row["newest"])
        if row["truncate"] is not None:
            truncates.append(_position(row["truncate"]))
    return Supersession(truncate=max(truncates) if truncates else None, newest=newest)


def _position(value: Row) -> Position:
    return Position(Lsn(int(value[COMMIT_LSN])), int(value[ORDINAL]))
