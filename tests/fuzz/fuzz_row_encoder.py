"""Coverage-guided differential fuzzing of the compiled row encoder against the Python
path (atheris; ``capture_native`` must be built).

Usage::

    .venv/bin/python -m tests.fuzz.fuzz_row_encoder [libFuzzer flags, e.g. -runs=100000]

An input picks what it is: a row of a table with a column of every kind the encoder
reads, a single column of one kind, a piece of COPY text for that wide table, or a
pgoutput Insert, Update or Delete of it (now and then cut short or overlong), which
``ChangeStream.handle_frame`` must handle exactly as decoding it and handling the
message does, errors included. Column
texts come from a small grammar of the forms PostgreSQL prints for each type (dates with
any digits, offsets with any sign, integers of any size...), with the input choosing
the values, or are raw bytes. The property, in every case: what
the compiled encoder writes is byte for byte what the Python path writes, and it writes
nothing the Python path refuses (it may leave to the Python path what the Python path
accepts). Keys, values, ordinals and the line left over in COPY text are all compared.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import atheris

with atheris.instrument_imports():
    from capture.errors import ProtocolError, TableError
    from capture.pgoutput import (
        Begin,
        ColumnKind,
        Relation,
        RelationColumn,
        ReplicaIdentity,
        TupleData,
        decode,
    )
    from capture.rows.codec import TableCodec
    from capture.rows.typemap import map_column
    from capture.snapshot.copy_text import CopyRows
    from capture.stream.change_stream import ChangeFailed, ChangeStream, Output
    from schemas.errors import ChangeEncodingError
    from schemas.lsn import Lsn
    from schemas.operation import Operation

# bool, int2, int4, int8, oid, text, bpchar, uuid, jsonb, float4, float8, date, time,
# timestamp, timestamptz: one column each; the first three (text, int8, timestamptz
# among them) are the key.
TYPE_OIDS = (25, 20, 1184, 16, 21, 23, 26, 1042, 2950, 3802, 700, 701, 1082, 1083, 1114)
KEYS = 3
_REFUSED = (TableError, ChangeEncodingError, ProtocolError, ValueError, TypeError)
_HEAD: dict[str, Any] = {
    "op": Operation.READ,
    "commit_lsn": Lsn(0x10),
    "change_lsn": Lsn(0x10),
    "xid": 0,
    "commit_ts": 5,
}


def _codec(oids: tuple[int, ...], keys: int) -> TableCodec:
    relation = Relation(
        xid=None,
        oid=16400 + len(oids),
        namespace="public",
        name="fuzz",
        replica_identity=ReplicaIdentity.DEFAULT,
        columns=tuple(RelationColumn(i < keys, f"c{i}", oid, -1) for i, oid in enumerate(oids)),
    )
    mappings = [map_column(oid, -1, {}, table="public.fuzz", column="c") for oid in oids]
    codec = TableCodec(relation, mappings, "fuzz", compiled=True)
    if codec.compiled is None:
        raise SystemExit("capture_native is not built: run `make native`")
    return codec


WIDE = _codec(TYPE_OIDS, KEYS)
WIDE_MAPPINGS = [map_column(oid, -1, {}, table="public.fuzz", column="c") for oid in TYPE_OIDS]
SINGLE = [_codec((oid,), 1) for oid in TYPE_OIDS]


def _python(codec: TableCodec, data: TupleData, ordinal: int) -> tuple[bytes, bytes] | None:
    """Key and value by the Python path; None when it refuses the row."""
    try:
        after, _ = codec.row(data)
        return codec.encoder.encode_row_key(after), codec.encoder.encode_fields(
            **_HEAD,
            ordinal=ordinal,
            before=None,
            after=after,
            unchanged_columns=(),
            before_key_only=False,
        )
    except _REFUSED:
        return None


def _check_row(codec: TableCodec, texts: list[bytes | None]) -> None:
    kinds = tuple(ColumnKind.NULL if t is None else ColumnKind.TEXT for t in texts)
    data = TupleData(kinds, tuple(texts))
    encoded = codec.encode_texts(data)
    if encoded is None:
        return
    compiled = (
        codec.encoder.encode_encoded_key(encoded.key),
        codec.encoder.encode_encoded_after(**_HEAD, ordinal=7, after_fields=encoded.row),
    )
    expected = _python(codec, data, 7)
    if compiled != expected:
        raise AssertionError(f"{texts!r}: compiled {compiled!r}, Python {expected!r}")


def _check_copy(text: bytes) -> None:
    assert WIDE.compiled is not None
    head = WIDE.encoder.value_head(**_HEAD)
    records = WIDE.compiled.encode_copy(text, WIDE.encoder.key_header, head, 100)
    keys, values, rest = records.keys, records.values, records.rest
    *lines, expected_rest = text.split(b"\n")
    if rest != expected_rest or len(keys) != len(lines):
        raise AssertionError(f"{text!r}: {len(keys)} records and rest {rest!r}")
    parser = CopyRows(len(TYPE_OIDS))
    for ordinal, (key, value, line) in enumerate(zip(keys, values, lines, strict=True), 100):
        if key is None:
            if value != line:
                raise AssertionError(f"{line!r} left to Python as {value!r}")
            continue
        try:
            data = parser.row(line)
        except ProtocolError as exc:
            raise AssertionError(f"{line!r}: compiled a line Python cannot split") from exc
        if (key, value) != _python(WIDE, data, ordinal):
            raise AssertionError(f"{line!r}: compiled differs from Python")


def _digits(provider: Any, low: int, high: int, width: int) -> str:
    return f"{provider.ConsumeIntInRange(low, high):0{width}d}"


def _date(provider: Any) -> str:
    year = _digits(provider, 0, 10_001, 4)
    return f"{year}-{_digits(provider, 0, 13, 2)}-{_digits(provider, 0, 32, 2)}"


def _time(provider: Any) -> str:
    text = ":".join(_digits(provider, 0, 61, 2) for _ in range(3))
    fraction = provider.ConsumeIntInRange(0, 8)
    return text + ("." + _digits(provider, 0, 10**fraction - 1, fraction) if fraction else "")


def _offset(provider: Any) -> str:
    parts = [_digits(provider, 0, 15, 2) for _ in range(provider.ConsumeIntInRange(1, 3))]
    sign = "-" if provider.ConsumeBool() else "+"
    return sign + ":".join(parts)


def _text(provider: Any, oid: int) -> bytes:
    """One column's text: mostly in the form the server prints for the type, with the
    values (and now and then the form) chosen by the input; otherwise raw bytes."""
    if provider.ConsumeIntInRange(0, 7) == 0:
        return bytes(provider.ConsumeBytes(provider.ConsumeIntInRange(0, 40)))
    if oid == 16:
        return b"t" if provider.ConsumeBool() else b"f"
    if oid in (20, 21, 23, 26):
        return str(provider.ConsumeIntInRange(-(2**70), 2**70)).encode()
    if oid in (700, 701):
        value = provider.ConsumeFloat()
        style = provider.PickValueInList(["{!r}", "{:e}", "{:.17g}", "{:.9g}", "{:f}"])
        return str(style.format(value)).encode()
    if oid == 1082:
        return _date(provider).encode()
    if oid == 1083:
        return _time(provider).encode()
    if oid == 1114:
        return f"{_date(provider)} {_time(provider)}".encode()
    if oid == 1184:
        return f"{_date(provider)} {_time(provider)}{_offset(provider)}".encode()
    return str(provider.ConsumeUnicode(provider.ConsumeIntInRange(0, 30))).encode(
        "utf-8", "surrogatepass"
    )


def _tuple_bytes(texts: list[bytes | None]) -> bytes:
    parts = [len(texts).to_bytes(2, "big")]
    for text in texts:
        parts.append(b"n" if text is None else b"t" + len(text).to_bytes(4, "big") + text)
    return b"".join(parts)


def _stream() -> ChangeStream:
    """A stream inside a transaction of the wide table. Two live for the whole run, one
    per path: they see the same messages, so their ordinals stay in step (a message one
    refuses, the other refuses before any state changes)."""
    stream = ChangeStream(lambda relation: WIDE_MAPPINGS, "fuzz", defer_errors=True)
    list(stream.handle(WIDE.relation, Lsn(1)))
    list(stream.handle(Begin(Lsn(0x2000), 0, 7), Lsn(2)))
    return stream


FROM_FRAMES, DECODED = _stream(), _stream()


def _outcome(run: Callable[[], Iterator[Output]]) -> list[Any] | str:
    try:
        outputs = list(run())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return [(o.table, str(o.error)) if isinstance(o, ChangeFailed) else o for o in outputs]


def _check_frame(message: bytes) -> None:
    """A row message handled from its bytes gives what decoding it gives."""
    from_frame = _outcome(lambda: FROM_FRAMES.handle_frame(message, Lsn(3)))
    decoded = _outcome(lambda: DECODED.handle(decode(message), Lsn(3)))
    if from_frame != decoded:
        raise AssertionError(f"{message!r}: from bytes {from_frame!r}, decoded {decoded!r}")


_ROW_MESSAGE_SHAPES = ((b"I", b"N"), (b"U", b"N"), (b"D", b"K"), (b"D", b"O"))


def test_one_input(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    mode = provider.ConsumeIntInRange(0, 3)
    if mode == 3:
        texts = [
            None if provider.ConsumeIntInRange(0, 15) == 0 else _text(provider, o)
            for o in TYPE_OIDS
        ]
        # An Insert, an Update with its new tuple, or a Delete with its key or old row.
        tag, part = _ROW_MESSAGE_SHAPES[provider.ConsumeIntInRange(0, len(_ROW_MESSAGE_SHAPES) - 1)]
        message = tag + WIDE.relation.oid.to_bytes(4, "big") + part + _tuple_bytes(texts)
        cut = provider.ConsumeIntInRange(-3, 3)  # now and then cut short or overlong
        message = message[:cut] if cut < 0 else message + bytes(provider.ConsumeBytes(cut))
        _check_frame(message)
        return
    if mode == 2:
        lines = []
        for _ in range(provider.ConsumeIntInRange(0, 4)):
            texts = [
                None if provider.ConsumeIntInRange(0, 15) == 0 else _text(provider, o)
                for o in TYPE_OIDS
            ]
            lines.append(b"\t".join(b"\\N" if t is None else t for t in texts))
        _check_copy(b"\n".join(lines) + bytes(provider.ConsumeBytes(provider.remaining_bytes())))
        return
    codec = WIDE if mode == 0 else SINGLE[provider.ConsumeIntInRange(0, len(SINGLE) - 1)]
    oids = TYPE_OIDS if mode == 0 else (codec.relation.columns[0].type_oid,)
    texts = [None if provider.ConsumeIntInRange(0, 15) == 0 else _text(provider, o) for o in oids]
    _check_row(codec, texts)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
