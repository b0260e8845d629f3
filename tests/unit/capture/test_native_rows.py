"""The compiled row encoder writes exactly what the Python path writes, or leaves the row
to it: keys, values, errors and outputs compared between ``compiled=True`` and
``compiled=False`` over edge values of every kind it takes, random texts, and every
recorded pgoutput vector."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from capture.errors import ProtocolError, TableError
from capture.pgoutput import (
    Begin,
    ColumnKind,
    Commit,
    Insert,
    MalformedMessageError,
    Relation,
    RelationColumn,
    ReplicaIdentity,
    TupleData,
    Update,
    decode,
)
from capture.records import OutgoingRecord
from capture.rows import native as native_rows
from capture.rows.codec import TableCodec
from capture.rows.typemap import ColumnMapping, map_column
from capture.snapshot.copy_text import CopyRows
from capture.stream.change_stream import ChangeFailed, ChangeStream, Output
from schemas.errors import ChangeEncodingError
from schemas.headers import CHANGE_LSN
from schemas.lsn import Lsn, format_lsn
from schemas.operation import Operation

if not native_rows.AVAILABLE:
    # In CI the bootstrap builds it (native/build.sh), so its absence is a failure there.
    if os.environ.get("CI") == "true":
        pytest.fail("capture_native is not built: run `make native`", pytrace=False)
    pytest.skip("capture_native is not built: run `make native`", allow_module_level=True)

VECTORS = Path(__file__).parent / "vectors"
T, N, U = ColumnKind.TEXT, ColumnKind.NULL, ColumnKind.UNCHANGED_TOAST

# One column per kind the encoder takes, and types that map onto those kinds.
TYPES = {
    "flag": 16,  # bool
    "small": 21,  # int2
    "medium": 23,  # int4
    "big": 20,  # int8
    "ident": 26,  # oid
    "label": 25,  # text
    "padded": 1042,  # bpchar
    "name": 19,  # name
    "token": 2950,  # uuid
    "doc": 3802,  # jsonb
    "ratio": 700,  # float4
    "score": 701,  # float8
    "day": 1082,  # date
    "at": 1083,  # time
    "local": 1114,  # timestamp
    "moment": 1184,  # timestamptz
}
EDGES: dict[int, list[bytes]] = {
    16: [b"t", b"f", b"true", b"", b"T", b"1"],
    21: [b"0", b"-32768", b"32767", b"-0", b"007", b"+1", b" 1", b"1_0", b"", b"-", b"x"],
    23: [b"2147483647", b"-2147483648", b"2147483648", b"-2147483649", b"63", b"64", b"-65"],
    20: [
        b"9223372036854775807",
        b"-9223372036854775808",
        b"9223372036854775808",
        b"-9223372036854775809",
        b"99999999999999999999999",
        b"8191",
        b"8192",
        b"-8193",
    ],
    26: [b"4294967295", b"0", b"12345"],
    # Valid UTF-8; not UTF-8; a surrogate and an overlong NUL, which Python refuses too.
    25: ["é€😀".encode(), b"", b"tab\tnewline\n", b"\xff", b"\xed\xa0\x80", b"\xc0\x80"],
    700: [
        b"1.5",
        b"-0",
        b"3.4028235e+38",
        b"3.4028236e+38",
        b"1e-46",
        b"0.1",
        b"NaN",
        b"-Infinity",
    ],
    701: [
        b"0.1",
        b"-1.2345678901234567e-300",
        b"1.7976931348623157e+308",
        b"5e-324",
        b"1e+400",
        b"Infinity",
        b"1.",
        b"1E5",
    ],
    1082: [
        b"1970-01-01",
        b"0001-01-01",
        b"9999-12-31",
        b"2024-02-29",
        b"2023-02-29",
        b"infinity",
        b"-infinity",
        b"0044-03-15 BC",
        b"10000-01-01",
    ],
    1083: [b"00:00:00", b"23:59:59.999999", b"12:34:56.5", b"24:00:00", b"12:34"],
    1114: [
        b"1970-01-01 00:00:00",
        b"2024-01-02 03:04:05.123456",
        b"0001-01-01 00:00:00",
        b"9999-12-31 23:59:59.999999",
        b"2024-01-02 03:04:05.1",
        b"infinity",
        b"0044-03-15 12:00:00 BC",
        b"12024-01-02 03:04:05",
    ],
    1184: [
        b"2024-01-02 03:04:05.123456+00",
        b"2024-01-02 03:04:05-05:30",
        b"1883-11-18 12:00:00+05:53:28",
        b"0001-01-01 00:00:00+14",
        b"2024-01-02 03:04:05",
        b"-infinity",
        b"0044-03-15 12:00:00+00 BC",
    ],
    1042: [b"padded    ", b" "],
    19: [b"pg_catalog"],
    2950: [b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
    3802: [b'{"a": [1, 2.5, null]}'],
}


def _relation(columns: Sequence[tuple[str, int, bool]], oid: int = 16400) -> Relation:
    return Relation(
        xid=None,
        oid=oid,
        namespace="public",
        name=f"t{oid}",
        replica_identity=ReplicaIdentity.DEFAULT,
        columns=tuple(RelationColumn(key, name, type_oid, -1) for name, type_oid, key in columns),
    )


def _describe(relation: Relation) -> list[ColumnMapping]:
    table = f"{relation.namespace}.{relation.name}"
    return [
        map_column(c.type_oid, c.type_modifier, {}, table=table, column=c.name)
        for c in relation.columns
    ]


def _codec(relation: Relation, compiled: bool) -> TableCodec:
    return TableCodec(relation, _describe(relation), "cdc", compiled=compiled)


def _python_path(codec: TableCodec, data: TupleData) -> tuple[bytes, bytes] | Exception:
    """The record's key and value by the Python path, or the error it raises."""
    try:
        after, _ = codec.row(data)
        key = codec.encoder.encode_row_key(after)
        value = codec.encoder.encode_fields(
            op=Operation.READ,
            commit_lsn=Lsn(0x10),
            change_lsn=Lsn(0x10),
            xid=0,
            commit_ts=5,
            ordinal=(1 << 32) + 1,
            before=None,
            after=after,
            unchanged_columns=(),
            before_key_only=False,
        )
    except (TableError, ChangeEncodingError, ValueError, TypeError) as exc:
        # ValueError, TypeError: texts PostgreSQL never prints for the type (e.g. int()
        # of b"", a timestamptz without its offset).
        return exc
    return key, value


def _compiled_path(codec: TableCodec, data: TupleData) -> tuple[bytes, bytes] | None:
    encoded = codec.encode_texts(data)
    if encoded is None:
        return None
    after_fields, key_fields = encoded.row, encoded.key
    value = codec.encoder.encode_encoded_after(
        op=Operation.READ,
        commit_lsn=Lsn(0x10),
        change_lsn=Lsn(0x10),
        xid=0,
        commit_ts=5,
        ordinal=(1 << 32) + 1,
        after_fields=after_fields,
    )
    return codec.encoder.encode_encoded_key(key_fields), value


def _assert_same(relation: Relation, data: TupleData) -> bool:
    """Both paths agree on ``data``; whether the compiled one wrote it."""
    compiled = _compiled_path(_codec(relation, True), data)
    reference = _python_path(_codec(relation, False), data)
    if compiled is None:
        return False
    assert not isinstance(reference, Exception), (data, reference)
    assert compiled == reference, data
    return True


@pytest.mark.parametrize("type_oid", sorted(EDGES))
def test_edge_values_of_every_kind_encode_the_same_or_fall_back(type_oid: int) -> None:
    # The value both as a key column and as a plain column beside an int8 key.
    keyed = _relation([("v", type_oid, True)])
    plain = _relation([("id", 20, True), ("v", type_oid, False)], oid=16401)
    written = 0
    for text in EDGES[type_oid]:
        written += _assert_same(keyed, TupleData((T,), (text,)))
        written += _assert_same(plain, TupleData((T, T), (b"1", text)))
    assert written > 0, "every kind has values the compiled path writes"


def test_what_the_compiled_path_refuses_is_what_python_reads_differently_or_refuses() -> None:
    relation = _relation([("id", 23, True), ("s", 25, False), ("b", 16, False)])
    codec = _codec(relation, True)
    python = _codec(relation, False)
    # Texts PostgreSQL never prints for these types, but the Python parsers read:
    for values in ((b"+1", b"x", b"t"), (b" 1", b"x", b"t"), (b"1", b"x", b"true")):
        assert codec.encode_texts(TupleData((T, T, T), values)) is None
        assert not isinstance(_python_path(python, TupleData((T, T, T), values)), Exception)
    # ... and texts the contract cannot carry, which the Python path names:
    for values in ((b"2147483648", b"x", b"t"), (b"1", b"\xff", b"t")):
        assert codec.encode_texts(TupleData((T, T, T), values)) is None
        assert isinstance(_python_path(python, TupleData((T, T, T), values)), Exception)
    # Nulls are written; unchanged TOAST (None too, in values) always takes the Python path.
    assert _assert_same(relation, TupleData((T, N, T), (b"1", None, b"t")))
    assert _assert_same(relation, TupleData((T, N, N), (b"1", None, None)))
    assert codec.encode_texts(TupleData((T, U, T), (b"1", None, b"t"))) is None
    assert codec.encode_texts(TupleData((T, N, U), (b"1", None, None))) is None


def test_a_column_without_a_text_kind_leaves_the_table_to_python() -> None:
    for type_oid, modifier in ((17, -1), (1700, (10 << 16 | 2) + 4)):
        relation = _relation([("id", 20, True), ("v", 25, False)])
        other = RelationColumn(False, "other", type_oid, modifier)
        relation = dataclasses.replace(relation, columns=(*relation.columns, other))
        assert _codec(relation, True).compiled is None, type_oid
    assert _codec(_relation([("id", 20, True)]), True).compiled is not None
    assert _codec(_relation([("id", 20, True)]), False).compiled is None


def _pools(columns: Sequence[tuple[str, int, bool]]) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """Per column, the edge texts the compiled path takes alone, and those it refuses."""
    taken: list[list[bytes]] = []
    refused: list[list[bytes]] = []
    for _, oid, _ in columns:
        single = _codec(_relation([("v", oid, True)]), True)
        texts = EDGES[oid]
        taken.append([t for t in texts if single.encode_texts(TupleData((T,), (t,)))])
        refused.append([t for t in texts if not single.encode_texts(TupleData((T,), (t,)))])
    return taken, refused


def test_composite_keys_in_key_order_and_random_rows() -> None:
    """Rows of every kind at once, keyed by three columns out of column order: each
    column null or drawn from the texts the compiled path takes alone; one row in ten
    with a text it refuses, one in ten with an unchanged TOAST value."""
    columns = [(name, oid, name in ("label", "big", "moment")) for name, oid in TYPES.items()]
    relation = _relation(columns)
    taken, refused = _pools(columns)
    rng = random.Random(20261124)
    written = expected = 0
    for round_ in range(2000):
        kinds = [N if rng.random() < 0.1 else T for _ in taken]
        values = [
            None if kind is N else rng.choice(pool) for kind, pool in zip(kinds, taken, strict=True)
        ]
        column = rng.choice([i for i, pool in enumerate(refused) if pool])
        if round_ % 10 == 0:
            kinds[column], values[column] = T, rng.choice(refused[column])
        elif round_ % 10 == 1:
            kinds[column], values[column] = U, None
        else:
            expected += 1
        written += _assert_same(relation, TupleData(tuple(kinds), tuple(values)))
    assert written == expected, "exactly the rows without a refused text or TOAST value"


def _stream_outputs(compiled: bool, messages: Sequence[Any]) -> list[Any]:
    """The outputs, with each failure as its table and message (errors do not compare)."""
    stream = ChangeStream(_describe, "cdc", defer_errors=True, compiled_rows=compiled)
    out: list[Output] = []
    for i, message in enumerate(messages):
        out += stream.handle(message, Lsn(0x1000 + i))
    return [(o.table, str(o.error)) if isinstance(o, ChangeFailed) else o for o in out]


def test_the_change_stream_outputs_the_same_records_either_way() -> None:
    relation = _relation([("id", 20, True), ("name", 25, False), ("ok", 16, False)])
    rows = [(b"1", b"a", b"t"), (b"2", b"\xff", b"f"), (b"3", b"c", b"maybe"), (b"4", b"d", b"f")]
    messages: list[Any] = [
        relation,
        Begin(Lsn(0x2000), 0, 7),
        *(Insert(None, relation.oid, TupleData((T, T, T), r)) for r in rows),
        Update(None, relation.oid, None, None, TupleData((T, T, T), (b"1", b"z", b"f"))),
        Update(None, relation.oid, None, None, TupleData((T, U, T), (b"1", None, b"f"))),
        Commit(Lsn(0x2000), Lsn(0x2030), 0),
    ]
    compiled = _stream_outputs(True, messages)
    assert compiled == _stream_outputs(False, messages)
    failed = [o for o in compiled if isinstance(o, tuple)]
    assert len(failed) == 1, "the \\xff row fails, the others are records"


def test_every_recorded_vector_streams_the_same_either_way() -> None:
    messages: list[Any] = []
    for name in ("pgoutput_v2.json", "pgoutput_v3.json"):
        for scenario in json.loads((VECTORS / name).read_text())["scenarios"]:
            for vector in scenario["messages"]:
                messages.append(decode(bytes.fromhex(vector["hex"]), in_stream=vector["in_stream"]))
    assert messages
    assert _stream_outputs(True, messages) == _stream_outputs(False, messages)


def _copy_line(values: Sequence[bytes | None]) -> bytes:
    """A COPY text line of ``values`` as PostgreSQL writes it (escapes, ``\\N``)."""
    fields = []
    for value in values:
        if value is None:
            fields.append(b"\\N")
        else:
            escaped = value.replace(b"\\", b"\\\\").replace(b"\t", b"\\t").replace(b"\n", b"\\n")
            fields.append(escaped.replace(b"\r", b"\\r"))
    return b"\t".join(fields) + b"\n"


def _python_copy_records(
    codec: TableCodec, data: bytes, head_fields: dict[str, Any], first: int
) -> list[tuple[bytes, bytes] | Exception]:
    parser = CopyRows(len(codec.relation.columns))
    out: list[tuple[bytes, bytes] | Exception] = []
    for ordinal, line in enumerate(data.split(b"\n")[:-1], start=first):
        try:
            after, _ = codec.row(parser.row(line))
            key = codec.encoder.encode_row_key(after)
            value = codec.encoder.encode_fields(
                **head_fields,
                ordinal=ordinal,
                before=None,
                after=after,
                unchanged_columns=(),
                before_key_only=False,
            )
        except (TableError, ChangeEncodingError, ProtocolError, ValueError, TypeError) as exc:
            out.append(exc)
        else:
            out.append((key, value))
    return out


def test_copy_text_becomes_the_records_the_python_path_writes() -> None:
    columns = [(name, oid, name in ("label", "big", "moment")) for name, oid in TYPES.items()]
    relation = _relation(columns)
    codec = _codec(relation, True)
    assert codec.compiled is not None
    taken, refused = _pools(columns)
    # Texts COPY prints without an escape (the escaped ones come below, on purpose).
    plain = [[t for t in pool if not any(c in t for c in b"\t\n\r\\")] for pool in taken]
    label = [name for name, _, _ in columns].index("label")
    rng = random.Random(7)
    lines = []
    for round_ in range(600):
        row: list[bytes | None] = [None if rng.random() < 0.1 else rng.choice(p) for p in plain]
        if round_ % 10 == 1:
            column = rng.choice([i for i, pool in enumerate(refused) if pool])
            row[column] = rng.choice(refused[column])
        if round_ % 10 == 2:
            row[label] = b"a\tb\\c\nd"  # escaped in COPY text: the Python path
        line = _copy_line(row)
        if round_ % 50 == 0:
            line = line.replace(b"\t", b"", 1)  # a column short: ProtocolError in Python
        lines.append(line)
    data = b"".join(lines)
    head_fields: dict[str, Any] = {
        "op": Operation.READ,
        "commit_lsn": Lsn(0x10),
        "change_lsn": Lsn(0x10),
        "xid": 0,
        "commit_ts": 5,
    }
    first = (3 << 32) + 1
    head = codec.encoder.value_head(**head_fields)
    cut = len(data) - 7  # inside the last line: it stays for the next call
    records = codec.compiled.encode_copy(data[:cut], codec.encoder.key_header, head, first)
    keys, values, rest = records.keys, records.values, records.rest
    assert rest == data[data.rindex(b"\n", 0, cut) + 1 : cut]
    assert len(keys) == len(values) == len(lines) - 1
    expected = _python_copy_records(codec, data, head_fields, first)
    compiled = 0
    for index, (key, value, want) in enumerate(zip(keys, values, expected, strict=False)):
        if key is None:
            assert value + b"\n" == lines[index], "left to the Python path: the line itself"
            continue
        assert (key, value) == want
        compiled += 1
    # Rows 1 and 2 of every ten hold a refused text or an escape, row 0 of every fifty
    # misses a column: all the others take the compiled path.
    assert compiled == sum(1 for i in range(len(keys)) if i % 10 not in (1, 2) and i % 50)


def _tuple_bytes(values: Sequence[bytes | None], unchanged: int | None = None) -> bytes:
    parts = [len(values).to_bytes(2, "big")]
    for index, value in enumerate(values):
        if index == unchanged:
            parts.append(b"u")
        elif value is None:
            parts.append(b"n")
        else:
            parts.append(b"t" + len(value).to_bytes(4, "big") + value)
    return b"".join(parts)


def _frames_outputs(frames: bool, messages: Sequence[bytes]) -> list[Any]:
    stream = ChangeStream(_describe, "cdc", defer_errors=True)
    out: list[Output] = []
    for i, payload in enumerate(messages):
        lsn = Lsn(0x1000 + i)
        out += stream.handle_frame(payload, lsn) if frames else stream.handle(decode(payload), lsn)
    return [(o.table, str(o.error)) if isinstance(o, ChangeFailed) else o for o in out]


def test_row_messages_from_their_bytes_give_the_outputs_of_decoding_them() -> None:
    columns = [(name, oid, name in ("label", "big", "moment")) for name, oid in TYPES.items()]
    relation = _relation(columns)
    taken, refused = _pools(columns)
    # Texts the server never prints and int() cannot read raise ValueError in the Python
    # path, which the stream does not catch: only those it reads or refuses by name.
    for (_, type_oid, _), pool in zip(columns, refused, strict=True):
        single = _codec(_relation([("v", type_oid, True)]), False)
        pool[:] = [
            t
            for t in pool
            if not isinstance(_python_path(single, TupleData((T,), (t,))), ValueError | TypeError)
        ]
    oid = relation.oid.to_bytes(4, "big")
    rng = random.Random(11)
    begin = bytes.fromhex("42") + (0x2000).to_bytes(8, "big") + (0).to_bytes(8, "big")
    messages = [
        _relation_message(relation),
        begin + (7).to_bytes(4, "big"),
    ]
    for round_ in range(400):
        row: list[bytes | None] = [None if rng.random() < 0.1 else rng.choice(p) for p in taken]
        if round_ % 7 == 1:
            column = rng.choice([i for i, pool in enumerate(refused) if pool])
            row[column] = rng.choice(refused[column])
        unchanged = rng.randrange(len(row)) if round_ % 7 == 2 else None
        new = b"N" + _tuple_bytes(row, unchanged)
        kind = round_ % 4
        if kind == 0:
            messages.append(b"I" + oid + new)
        elif kind == 1:
            messages.append(b"U" + oid + new)
        elif kind == 2:  # an Update with the old key: always decoded
            key = [
                v if name in ("label", "big", "moment") else None
                for (name, _, _), v in zip(columns, row, strict=True)
            ]
            messages.append(b"U" + oid + b"K" + _tuple_bytes(key) + new)
        else:
            messages.append(b"D" + oid + b"K" + _tuple_bytes(row))
    messages.append(
        b"C" + bytes(1) + (0x2000).to_bytes(8, "big") + (0x2030).to_bytes(8, "big") + bytes(8)
    )
    from_frames = _frames_outputs(True, messages)
    assert from_frames == _frames_outputs(False, messages)
    records = [o for o in from_frames if isinstance(o, OutgoingRecord)]
    assert len(records) > 250
    assert any(isinstance(o, tuple) for o in from_frames), "refused texts fail their change"


def _frames_outputs_at(frames: bool, messages: Sequence[tuple[bytes, Lsn]]) -> list[Any]:
    stream = ChangeStream(_describe, "cdc", defer_errors=True)
    out: list[Output] = []
    for payload, lsn in messages:
        out += stream.handle_frame(payload, lsn) if frames else stream.handle(decode(payload), lsn)
    return out


def test_records_from_frames_across_transactions_tables_and_table_versions() -> None:
    """What the stream shares between the records it writes from their bytes (per
    transaction, table version and operation) is never carried to another: ordinals,
    commit positions, xids, schema headers and operations are those of decoding."""
    first = _relation([("id", 20, True), ("label", 25, False)], oid=16500)
    second = _relation([("k", 23, True), ("at", 1184, False)], oid=16501)
    # The first table gains a column in the middle of a transaction: a new version.
    widened = dataclasses.replace(
        first, columns=(*first.columns, RelationColumn(False, "extra", 701, -1))
    )

    def row(relation: Relation, tag: bytes, values: list[bytes | None]) -> bytes:
        return tag + relation.oid.to_bytes(4, "big") + b"N" + _tuple_bytes(values)

    def begin(final_lsn: int, xid: int) -> bytes:
        return (
            b"B"
            + final_lsn.to_bytes(8, "big")
            + (123_456).to_bytes(8, "big")
            + xid.to_bytes(4, "big")
        )

    def commit(lsn: int, end: int) -> bytes:
        return b"C" + bytes(1) + lsn.to_bytes(8, "big") + end.to_bytes(8, "big") + bytes(8)

    # LSNs beyond 32 bits, and at the edges of each half of their text form.
    base = 0x1_FFFF_FFF0
    messages: list[tuple[bytes, Lsn]] = [
        (_relation_message(first), Lsn(0)),
        (_relation_message(second), Lsn(0)),
    ]
    lsn = base
    table_one, extra = first, list[bytes | None]()
    for xid, count in ((700, 3), (701, 5), (4_000_000_000, 2)):
        final = lsn + 0x100
        messages.append((begin(final, xid), Lsn(lsn)))
        for i in range(count):
            lsn += 7
            tag = b"IU"[i % 2 : i % 2 + 1]
            messages.append((row(table_one, tag, [str(i).encode(), b"x", *extra]), Lsn(lsn)))
            lsn += 7
            messages.append(
                (row(second, b"I", [str(-i).encode(), b"2024-02-29 23:59:59.5+00"]), Lsn(lsn))
            )
        if xid == 701:
            messages.append((_relation_message(widened), Lsn(0)))
            lsn += 7
            messages.append((row(widened, b"I", [b"9", None, b"1.5"]), Lsn(lsn)))
            lsn += 7
            messages.append((row(widened, b"U", [b"9", b"y", b"-2.25"]), Lsn(lsn)))
            table_one, extra = widened, [b"0.5"]
        messages.append((commit(final, final + 0x10), Lsn(final + 0x10)))
        lsn = final + 0x10
    from_frames = _frames_outputs_at(True, messages)
    assert from_frames == _frames_outputs_at(False, messages)
    assert not any(isinstance(o, ChangeFailed) for o in from_frames)
    records = [o for o in from_frames if isinstance(o, OutgoingRecord)]
    assert len(records) == 2 * (3 + 5 + 2) + 2
    texts = {dict(r.headers)[CHANGE_LSN] for r in records}
    assert b"1/FFFFFFF7" in texts
    assert b"2/5" in texts  # the low half printed without leading zeros


@pytest.mark.parametrize("lsn", [0, 1, 0xFFFF_FFFF, 1 << 32, (1 << 63) - 1])
def test_a_record_written_whole_carries_the_change_lsn_as_the_python_path_writes_it(
    lsn: int,
) -> None:
    relation = _relation([("id", 20, True)])
    codec = _codec(relation, True)
    assert codec.compiled is not None
    message = b"I" + relation.oid.to_bytes(4, "big") + b"N" + _tuple_bytes([b"5"])
    start, middle = codec.encoder.value_around_change_lsn(
        op=Operation.INSERT, commit_lsn=Lsn(lsn), xid=3, commit_ts=4
    )
    encoded = codec.compiled.encode_change(message, codec.encoder.key_header, start, lsn, middle, 6)
    assert encoded is not None
    key, value, text = encoded.key, encoded.value, encoded.change_lsn_text
    after, _ = codec.row(TupleData((T,), (b"5",)))
    assert key == codec.encoder.encode_row_key(after)
    assert value == codec.encoder.encode_fields(
        op=Operation.INSERT,
        commit_lsn=Lsn(lsn),
        change_lsn=Lsn(lsn),
        xid=3,
        commit_ts=4,
        ordinal=6,
        before=None,
        after=after,
        unchanged_columns=(),
        before_key_only=False,
    )
    assert text == format_lsn(Lsn(lsn)).encode()


@pytest.mark.parametrize("tuple_tag", [b"K", b"O"])
def test_a_delete_written_whole_is_the_record_the_python_path_writes(tuple_tag: bytes) -> None:
    """A Delete's tuple becomes its ``before`` image, key only when the server sent the
    replica identity's key (the other columns null) rather than the whole old row."""
    relation = _relation([("id", 20, True), ("name", 25, False), ("at", 1082, False)])
    codec = _codec(relation, True)
    assert codec.compiled is not None
    values: list[bytes | None] = (
        [b"-12", None, None] if tuple_tag == b"K" else [b"-12", b"gone", b"2024-02-29"]
    )
    message = b"D" + relation.oid.to_bytes(4, "big") + tuple_tag + _tuple_bytes(values)
    start, middle = codec.encoder.value_around_change_lsn(
        op=Operation.DELETE, commit_lsn=Lsn(0x5000), xid=9, commit_ts=10
    )
    encoded = codec.compiled.encode_change(
        message, codec.encoder.key_header, start, 0x4FF0, middle, 2
    )
    assert encoded is not None
    key, value, text = encoded.key, encoded.value, encoded.change_lsn_text
    before, _ = codec.row(TupleData((T, N, N) if tuple_tag == b"K" else (T, T, T), tuple(values)))
    assert key == codec.encoder.encode_row_key(before)
    assert value == codec.encoder.encode_fields(
        op=Operation.DELETE,
        commit_lsn=Lsn(0x5000),
        change_lsn=Lsn(0x4FF0),
        xid=9,
        commit_ts=10,
        ordinal=2,
        before=before,
        after=None,
        unchanged_columns=(),
        before_key_only=tuple_tag == b"K",
    )
    assert text == b"0/4FF0"


def test_deletes_from_frames_with_tombstones_are_followed_by_theirs() -> None:
    """With tombstones on, a Delete takes the Python path, which adds the tombstone;
    without, it is written whole: the outputs match decoding's either way."""
    relation = _relation([("id", 20, True), ("name", 25, False)])
    oid = relation.oid.to_bytes(4, "big")
    messages = [
        _relation_message(relation),
        b"B" + (0x2000).to_bytes(8, "big") + bytes(8) + (7).to_bytes(4, "big"),
        b"I" + oid + b"N" + _tuple_bytes([b"1", b"a"]),
        b"D" + oid + b"K" + _tuple_bytes([b"1", None]),
        b"D" + oid + b"O" + _tuple_bytes([b"2", b"b"]),
        b"C" + bytes(1) + (0x2000).to_bytes(8, "big") + (0x2030).to_bytes(8, "big") + bytes(8),
    ]
    for tombstones in (False, True):
        outputs = []
        for frames in (True, False):
            stream = ChangeStream(_describe, "cdc", tombstones=tombstones)
            out: list[Output] = []
            for i, payload in enumerate(messages):
                lsn = Lsn(0x1000 + i)
                if frames:
                    out += stream.handle_frame(payload, lsn)
                else:
                    out += stream.handle(decode(payload), lsn)
            outputs.append(out)
        assert outputs[0] == outputs[1]
        records = [o for o in outputs[0] if isinstance(o, OutgoingRecord)]
        assert [r.value is None for r in records] == (
            [False, False, True, False, True] if tombstones else [False, False, False]
        )


def test_an_lsn_past_the_signed_range_is_left_to_the_python_path() -> None:
    relation = _relation([("id", 20, True)])
    codec = _codec(relation, True)
    assert codec.compiled is not None
    message = b"I" + relation.oid.to_bytes(4, "big") + b"N" + _tuple_bytes([b"5"])
    assert codec.compiled.encode_change(message, b"", b"", 1 << 63, b"", 0) is None


def test_recorded_frames_give_the_outputs_of_decoding_them() -> None:
    messages = [
        bytes.fromhex(vector["hex"])
        for name in ("pgoutput_v2.json", "pgoutput_v3.json")
        for scenario in json.loads((VECTORS / name).read_text())["scenarios"]
        for vector in scenario["messages"]
        if not vector["in_stream"]  # capture streams with protocol version 1
    ]
    assert _frames_outputs(True, messages) == _frames_outputs(False, messages)


def test_a_malformed_row_message_raises_what_decoding_raises() -> None:
    relation = _relation([("id", 20, True), ("name", 25, False)])
    oid = relation.oid.to_bytes(4, "big")
    stream = ChangeStream(_describe, "cdc")
    list(stream.handle_frame(_relation_message(relation), Lsn(1)))
    list(stream.handle(Begin(Lsn(0x2000), 0, 7), Lsn(2)))
    good = b"I" + oid + b"N" + _tuple_bytes([b"1", b"a"])
    delete = b"D" + oid + b"K" + _tuple_bytes([b"1", None])
    bad_messages = (
        good[:-1],
        good + b"x",
        good.replace(b"N", b"Q", 1),
        delete[:-1],
        delete + b"x",
        b"D" + oid + b"N" + _tuple_bytes([b"1", None]),
    )
    for bad in bad_messages:
        with pytest.raises(MalformedMessageError) as from_frame:
            list(stream.handle_frame(bad, Lsn(3)))
        with pytest.raises(MalformedMessageError) as decoded:
            decode(bad)
        assert str(from_frame.value) == str(decoded.value)


def _relation_message(relation: Relation) -> bytes:
    """The pgoutput Relation message of ``relation`` (protocol version 1)."""
    parts = [
        b"R",
        relation.oid.to_bytes(4, "big"),
        relation.namespace.encode() + b"\0",
        relation.name.encode() + b"\0",
        relation.replica_identity.value.encode(),
        len(relation.columns).to_bytes(2, "big"),
    ]
    for column in relation.columns:
        parts += [
            bytes([1 if column.is_key else 0]),
            column.name.encode() + b"\0",
            column.type_oid.to_bytes(4, "big"),
            column.type_modifier.to_bytes(4, "big", signed=True),
        ]
    return b"".join(parts)
