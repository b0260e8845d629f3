"""ChangeStream turns decoded messages into records whose meaning matches the server's."""

from __future__ import annotations

from typing import Any

from capture.errors import TableError
from capture.pgoutput import (
    Begin,
    ColumnKind,
    Commit,
    Delete,
    Insert,
    Relation,
    RelationColumn,
    ReplicaIdentity,
    Truncate,
    TruncateOptions,
    TupleData,
    Update,
    unix_micros_to_pg_micros,
)
from capture.records import OutgoingRecord, SchemaRecord
from capture.stream.change_stream import (
    ChangeFailed,
    ChangeStream,
    Output,
    TransactionCommitted,
    TransactionStarted,
)
from schemas.lsn import Lsn
from schemas.reader import ContractReader
from tests.plugins.change_stream import ORDERS, describe_relation, run_stream

T, N, U = ColumnKind.TEXT, ColumnKind.NULL, ColumnKind.UNCHANGED_TOAST
COMMIT_TS_UNIX = 1_700_000_000_000_000


def _tuple(*cells: tuple[ColumnKind, bytes | None]) -> TupleData:
    return TupleData(tuple(k for k, _ in cells), tuple(v for _, v in cells))


def _records(outputs: list[Output]) -> tuple[ContractReader, list[OutgoingRecord]]:
    reader = ContractReader("cdc._schemas")
    for o in outputs:
        if isinstance(o, SchemaRecord):
            reader.add_schema_message(o.key, o.value)
    return reader, [o for o in outputs if isinstance(o, OutgoingRecord)]


def _tx(*changes: Any) -> list[Any]:
    begin = Begin(Lsn(0x2000), unix_micros_to_pg_micros(COMMIT_TS_UNIX), 777)
    return [begin, *changes, Commit(Lsn(0x2000), Lsn(0x2030), begin.commit_time)]


def test_insert_update_delete_positions_and_images() -> None:
    stream = ChangeStream(describe_relation, "cdc")
    outputs = run_stream(
        stream,
        [
            ORDERS,
            *_tx(
                Insert(None, ORDERS.oid, _tuple((T, b"1"), (T, b"a"), (N, None))),
                Update(None, ORDERS.oid, None, None, _tuple((T, b"1"), (T, b"b"), (U, None))),
                Delete(None, ORDERS.oid, _tuple((T, b"1"), (N, None), (N, None)), None),
            ),
        ],
    )
    assert isinstance(outputs[0], TransactionStarted)
    assert outputs[0].commit_lsn == 0x2000
    assert outputs[-1] == TransactionCommitted(Lsn(0x2030))
    reader, records = _records(outputs)
    assert [r.topic for r in records] == ["cdc.public.orders"] * 3
    values = [reader.decode_value(r.value) for r in records if r.value is not None]
    assert [v["op"] for v in values] == ["INSERT", "UPDATE", "DELETE"]
    assert [v["ordinal"] for v in values] == [0, 1, 2]
    assert {v["commit_lsn"] for v in values} == {0x2000}
    assert {v["xid"] for v in values} == {777}
    assert values[0]["after"] == {"id": 1, "note": "a", "blob": None}
    assert values[1]["after"] == {"id": 1, "note": "b", "blob": None}
    assert values[1]["unchanged_columns"] == ["blob"], "unsent TOAST is marked, not nulled"
    assert values[2]["before"] == {"id": 1, "note": None, "blob": None}
    assert values[2]["before_key_only"] is True
    keys = {reader.decode_key(r.key)["id"] for r in records}
    assert keys == {1}
    assert dict(records[0].headers)["pgdelta.op"] == b"INSERT"


def test_unchanged_toast_is_filled_from_the_old_row_when_sent() -> None:
    stream = ChangeStream(describe_relation, "cdc")
    old = _tuple((T, b"1"), (T, b"a"), (T, b"big"))
    new = _tuple((T, b"1"), (T, b"b"), (U, None))
    reader, records = _records(
        run_stream(stream, [ORDERS, *_tx(Update(None, ORDERS.oid, None, old, new))])
    )
    value = reader.decode_value(records[0].value or b"")
    assert value["after"]["blob"] == "big"
    assert value["unchanged_columns"] == []
    assert value["before"]["blob"] == "big"
    assert value["before_key_only"] is False


def test_key_change_becomes_delete_then_insert() -> None:
    stream = ChangeStream(describe_relation, "cdc")
    key = _tuple((T, b"1"), (N, None), (N, None))
    new = _tuple((T, b"2"), (T, b"x"), (T, b"y"))
    reader, records = _records(
        run_stream(stream, [ORDERS, *_tx(Update(None, ORDERS.oid, key, None, new))])
    )
    values = [reader.decode_value(r.value or b"") for r in records]
    assert [(v["op"], v["ordinal"]) for v in values] == [("DELETE", 0), ("INSERT", 1)]
    assert [reader.decode_key(r.key)["id"] for r in records] == [1, 2]


def test_key_change_with_unsent_toast_errors_the_table_with_the_fix() -> None:
    stream = ChangeStream(describe_relation, "cdc")
    key = _tuple((T, b"1"), (N, None), (N, None))
    new = _tuple((T, b"2"), (T, b"x"), (U, None))
    run_stream(stream, [ORDERS, *_tx(Update(None, ORDERS.oid, key, None, new))])
    assert "REPLICA IDENTITY FULL" in str(stream.errored["public.orders"])


def test_deferred_errors_hand_the_failure_out_and_keep_the_table() -> None:
    stream = ChangeStream(describe_relation, "cdc", defer_errors=True)
    key = _tuple((T, b"1"), (N, None), (N, None))
    bad = _tuple((T, b"2"), (T, b"x"), (U, None))
    good = _tuple((T, b"3"), (T, b"x"), (T, b"y"))
    outputs = run_stream(
        stream,
        [ORDERS, *_tx(Update(None, ORDERS.oid, key, None, bad), Insert(None, ORDERS.oid, good))],
    )
    failures = [o for o in outputs if isinstance(o, ChangeFailed)]
    assert [f.table for f in failures] == ["public.orders"]
    assert "REPLICA IDENTITY FULL" in str(failures[0].error)
    assert not stream.errored, "the caller decides whether the table errors"
    _, records = _records(outputs)
    assert len(records) == 1, "the next change of the table is still encoded"


def test_truncate_record_per_captured_table_and_tombstones() -> None:
    stream = ChangeStream(describe_relation, "cdc", tombstones=True)
    outputs = run_stream(
        stream,
        [
            ORDERS,
            *_tx(
                Delete(None, ORDERS.oid, _tuple((T, b"5"), (N, None), (N, None)), None),
                Truncate(None, TruncateOptions(0), (ORDERS.oid, 99999)),
            ),
        ],
    )
    reader, records = _records(outputs)
    assert [r.value is None for r in records] == [False, True, False]
    assert reader.decode_value(records[2].value or b"")["op"] == "TRUNCATE"
    assert reader.decode_value(records[2].value or b"")["ordinal"] == 1


def test_schema_change_publishes_a_new_writer_schema_once() -> None:
    stream = ChangeStream(describe_relation, "cdc")
    wider = Relation(
        None,
        ORDERS.oid,
        "public",
        "orders",
        ReplicaIdentity.DEFAULT,
        (*ORDERS.columns, RelationColumn(False, "extra", 25, -1)),
    )
    insert3 = Insert(None, ORDERS.oid, _tuple((T, b"1"), (T, b"a"), (N, None)))
    insert4 = Insert(None, ORDERS.oid, _tuple((T, b"2"), (T, b"a"), (N, None), (T, b"e")))
    outputs = run_stream(stream, [ORDERS, *_tx(insert3, insert3), wider, *_tx(insert4)])
    schemas = [o for o in outputs if isinstance(o, SchemaRecord)]
    assert len(schemas) == 4, "key and value schema for each of the two table versions"
    reader, records = _records(outputs)
    assert reader.decode_value(records[2].value or b"")["after"]["extra"] == "e"
    assert reader.fingerprint(records[0].value or b"") != reader.fingerprint(
        records[2].value or b""
    )


def test_unsupported_column_errors_only_that_table() -> None:
    stream = ChangeStream(describe_relation, "cdc")
    odd = Relation(
        None, 555, "public", "odd", ReplicaIdentity.DEFAULT, (RelationColumn(True, "g", 600, -1),)
    )
    outputs = run_stream(
        stream,
        [
            odd,
            ORDERS,
            *_tx(
                Insert(
                    None,
                    555,
                    _tuple(
                        (T, b"(1,2)"),
                    ),
                ),
                Insert(None, ORDERS.oid, _tuple((T, b"1"), (T, b"a"), (N, None))),
            ),
        ],
    )
    _, records = _records(outputs)
    assert [r.table for r in records] == ["public.orders"]
    assert "type 600 unsupported" in str(stream.errored["public.odd"])


def test_an_adopted_transaction_goes_on_from_the_ordinal_given() -> None:
    """The compiled stream began the transaction and wrote ordinals 0 to 4."""
    stream = ChangeStream(describe_relation, "cdc")
    run_stream(stream, [ORDERS])
    assert stream.transaction() is None
    stream.adopt((Lsn(0x2000), 777, COMMIT_TS_UNIX, 5))
    outputs = run_stream(
        stream, [Insert(None, ORDERS.oid, _tuple((T, b"1"), (T, b"a"), (N, None)))]
    )
    reader, records = _records(outputs)
    value = reader.decode_value(records[0].value or b"")
    assert (value["commit_lsn"], value["xid"], value["ordinal"]) == (0x2000, 777, 5)
    assert value["commit_ts"].timestamp() * 1_000_000 == COMMIT_TS_UNIX
    assert stream.transaction() == (0x2000, 777, COMMIT_TS_UNIX, 6)
    stream.adopt(None)
    assert stream.transaction() is None


def test_the_version_moves_with_codecs_errors_and_published_schemas() -> None:
    stream = ChangeStream(describe_relation, "cdc")
    start = stream.version
    run_stream(stream, [ORDERS])
    after_relation = stream.version
    assert after_relation > start
    codec = stream.codecs[ORDERS.oid]
    assert not stream.schema_published(codec)
    run_stream(stream, _tx(Insert(None, ORDERS.oid, _tuple((T, b"1"), (T, b"a"), (N, None)))))
    assert stream.schema_published(codec)
    assert stream.version > after_relation
    published = stream.version
    run_stream(stream, _tx(Insert(None, ORDERS.oid, _tuple((T, b"2"), (T, b"a"), (N, None)))))
    assert stream.version == published, "a record of a published table version moves nothing"
    stream.error_table("public.orders", TableError("public.orders", "broken"))
    assert stream.version > published
    assert "public.orders" in stream.errored
