"""What apply tells the operator about a parked table: the error's own text and the cure
that fits its cause, read from the code that logs, prints or raises it (issue #33)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
import yaml
from pyspark.errors import AnalysisException
from pyspark.sql.types import LongType, StringType

from apply.app import log_results
from apply.control.progress import ParkedTable
from apply.control.table_status import errored_line, format_errored, table_statuses
from apply.errors import BadRecordError, ConfigError, SchemaChangeError, parked_cure
from apply.lake import retired_log, spark_merge
from apply.lake.delta_schema import (
    ColumnPlan,
    ColumnSpec,
    ExistingTable,
    parse_value_schema,
    plan_columns,
)
from apply.lake.history import TableHistory
from apply.lake.positions import PartitionProgress
from apply.lake.spark_merge import MergeSource
from apply.lake.table_lock import TABLE_LOCKS
from apply.lake.tables import TableId
from schemas import column_type as ct
from schemas.change_record import Column, TableDescription, build_table_schemas
from tests.plugins.table_states import PROGRESS_STATE, TOPIC

ROOT = Path(__file__).resolve().parents[3]
TABLE = TableId("public", "orders")
NAME = str(TABLE)
RESYNC = f"python -m capture resync {NAME}"
REAPPLY = f"python -m apply reapply {NAME}"
KEY = Column("id", ct.LONG, nullable=False, key=True)


def _value_schema(*columns: Column) -> Any:
    built = build_table_schemas(TableDescription(TABLE.schema, TABLE.table, columns))
    return parse_value_schema(TABLE, built.value_fingerprint, built.value_schema_json)


def _existing(*columns: ColumnSpec) -> ExistingTable:
    return ExistingTable(
        columns=(ColumnSpec("id", LongType(), key=True), *columns),
        key_columns=("id",),
        has_timestamp_ntz=False,
    )


def _retyped() -> SchemaChangeError:
    with pytest.raises(SchemaChangeError) as raised:
        plan_columns(
            TABLE,
            _existing(ColumnSpec("note", StringType())),
            [_value_schema(KEY, Column("note", ct.INT))],
        )
    return raised.value


def _rekeyed() -> SchemaChangeError:
    with pytest.raises(SchemaChangeError) as raised:
        plan_columns(TABLE, _existing(), [_value_schema(Column("code", ct.STRING, key=True))])
    return raised.value


@pytest.mark.parametrize("error", [_retyped, _rekeyed], ids=["retyped", "rekeyed"])
def test_a_schema_change_names_the_resync_and_keeps_the_delta_table(error: Any) -> None:
    message = str(error())
    assert RESYNC in message
    assert "restart capture" in message
    assert "drop" not in message, "dropping the Delta table loses its history for nothing"


def _parked(exc: Exception) -> ParkedTable:
    """The parked table as apply.batch.park builds it from the table task's error."""
    return ParkedTable(
        table=NAME,
        topic="cdc.public.orders",
        batch_id=7,
        error=str(exc),
        error_kind=type(exc).__name__,
        newly_errored=True,
        records=3,
        parked=3,
        next_offsets={},
        state=None,
    )


def _logged(caplog: pytest.LogCaptureFixture, parked: ParkedTable) -> str:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="apply.app"):
        log_results(7, [], 0.0, (parked,))
    (record,) = [r for r in caplog.records if r.name == "apply.app"]
    return record.getMessage()


def test_a_table_parked_by_a_schema_change_is_told_to_resync(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error = _retyped()
    line = _logged(caplog, _parked(error))
    assert str(error) in line, "the error's own text, not only its class"
    assert "SchemaChangeError" in line
    cure = line.split("; cure: ", 1)[1]
    assert cure.startswith(f"resync it at the source: {RESYNC}, then restart capture")
    assert f"then run {REAPPLY}" not in cure, "a reapply before the resync fails again"


def test_a_table_parked_by_a_bad_record_is_told_to_discard_and_reapply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error = BadRecordError(NAME, "cdc.public.orders", 0, 12, "has no single-object header")
    line = _logged(caplog, _parked(error))
    assert str(error) in line
    cure = line.split("; cure: ", 1)[1]
    assert f"python -m apply discard {NAME}" in cure
    assert cure.endswith(f"then run {REAPPLY}")
    assert RESYNC not in cure


def test_errored_prints_each_table_with_its_cure() -> None:
    waiting = MagicMock(records=4, error=str(_rekeyed()), error_kind="SchemaChangeError")
    statuses = {s.table: s for s in table_statuses([NAME, "public.ok"], {NAME: waiting}, 1)}
    printed = format_errored(statuses)
    assert printed.startswith(f"{NAME}: 4 records parked: SchemaChangeError: table {NAME}:")
    assert f"; cure: resync it at the source: {RESYNC}" in printed
    assert "public.ok" not in printed
    from_lake = errored_line(NAME, 2, "BadRecordError: bad", since_batch=5)
    assert from_lake.startswith(f"{NAME}: 2 records parked since batch 5: BadRecordError: bad")
    assert from_lake.endswith(f"then run {REAPPLY}")


def test_the_errored_tables_alert_gives_both_cures() -> None:
    """The alert names the resync for a schema change and reapply for the rest, the cures
    apply's own lines give; the chart ships the same file (test_helm_chart)."""
    document = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yaml").read_text())
    (rule,) = [
        rule
        for group in document["spec"]["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "CdcApplyErroredTables"
    ]
    text = " ".join(rule["annotations"]["description"].split())
    schema_cure = parked_cure(_parked(_retyped()).error_kind, "<table>")
    other_cure = parked_cure("TableError", "<table>")
    assert "python -m capture resync <table>" in text
    assert "python -m capture resync <table>" in schema_cure
    assert "python -m apply reapply <table>" in text
    assert "python -m apply reapply <table>" in other_cure
    assert text.index("capture resync") < text.index("apply reapply")


class _Expression:
    """A stand-in for a Spark column expression: every operation gives itself back."""

    def __getattr__(self, _name: str) -> Any:
        return lambda *_a, **_k: self

    def _same(self, _other: object) -> _Expression:
        return self

    __gt__ = __lt__ = __eq__ = __and__ = __or__ = _same  # type: ignore[assignment]
    __hash__ = object.__hash__

    def __invert__(self) -> _Expression:
        return self


def test_a_merge_that_does_not_fit_the_table_names_the_resync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """merge_into with Spark and Delta replaced by stand-ins whose MERGE fails as Delta's
    does when the table was altered outside apply."""
    functions = MagicMock()
    for name in ("col", "lit", "when", "array_contains"):
        getattr(functions, name).return_value = _Expression()
    monkeypatch.setattr(spark_merge, "sf", functions)
    monkeypatch.setattr(spark_merge, "Column", MagicMock())
    delta = MagicMock()
    builder = delta.forPath.return_value.alias.return_value.merge.return_value
    chained = builder.whenMatchedDelete.return_value.whenMatchedUpdate.return_value
    chained.whenNotMatchedInsert.return_value.execute.side_effect = AnalysisException(
        message="cannot resolve column"
    )
    monkeypatch.setattr(spark_merge, "DeltaTable", delta)
    plan = ColumnPlan(
        columns=(ColumnSpec("id", LongType(), key=True),),
        added=(),
        key_columns=("id",),
        create=False,
    )
    source = MergeSource(frame=MagicMock(), unchanged_columns=())
    with pytest.raises(SchemaChangeError) as raised, TABLE_LOCKS.held("/lake/public/orders"):
        spark_merge.merge_into(
            MagicMock(),
            path="/lake/public/orders",
            table=NAME,
            source=source,
            plan=plan,
            truncate=None,
            version_before=1,
            app_id="app",
            batch_id=1,
            metadata="{}",
        )
    assert f"{RESYNC}, then restart capture" in str(raised.value)


def test_a_retired_log_of_a_recreated_table_names_the_resync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fold at start with Delta replaced by stand-ins: the log says sequence 9, the
    table holds the log up to 5, and the fold's MERGE was skipped as written before."""
    table_state = replace(PROGRESS_STATE, log_seq=5)
    # The log holds a batch the table lacks: partition 1's records up to offset 11.
    partitions = dict(PROGRESS_STATE.partitions)
    partitions[TOPIC, 1] = PartitionProgress(11, None)
    logged = replace(PROGRESS_STATE, partitions=partitions, log_seq=9, txn_app_id="app")
    histories = {
        "log": TableHistory(3, logged),
        "table": TableHistory(4, table_state),
    }
    monkeypatch.setattr(
        retired_log,
        "read_history",
        lambda _s, path, _n: histories["log" if "_change-log" in path else "table"],
    )
    monkeypatch.setattr(retired_log, "read_existing_table", lambda *_a: _existing())
    monkeypatch.setattr(retired_log, "_unfolded", lambda *_a, **_k: MagicMock())
    monkeypatch.setattr(retired_log, "merge_source", lambda *_a, **_k: MagicMock())
    monkeypatch.setattr(retired_log, "merge_into", lambda *_a, **_k: MagicMock(committed=False))
    with pytest.raises(ConfigError) as raised:
        retired_log.fold_retired_log(
            MagicMock(), lake_root="/lake", table=TABLE, default_app_id="app"
        )
    assert "the table was recreated since" in str(raised.value)
    assert "/lake/_change-log/public/orders" in str(raised.value)
    assert f"{RESYNC}, then restart capture" in str(raised.value)
