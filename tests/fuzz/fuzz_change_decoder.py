"""Differential fuzzing of apply's compiled change decoder (``capture_native.ChangeDecoder``)
against fastavro's path (atheris; ``capture_native`` must be built).

Usage::

    .venv/bin/python -m tests.fuzz.fuzz_change_decoder [libFuzzer flags, e.g. -runs=100000]

An input picks the framing (single-object or Schema Registry) and a record of a table
with a column of every type (``tests/plugins/column_types.py``,
``every_kind_of_change``), then edits its body: bytes set, flipped, inserted or deleted,
a cut; or it is a body of raw bytes. The edits are the input's, not libFuzzer's
mutations of the whole: the compiled decoder and fastavro's C are not instrumented, so
coverage alone would not lead the search to records that nearly decode. The property:
:func:`apply.lake.driver_plan.decode_records` gives the same change, value for value and
type for type, or the same malformed count, with the compiled decoder and without it;
the one difference allowed is a varint longer than 10 bytes, which the compiled decoder
refuses and fastavro reads. ``tests/unit/apply/test_driver_plan_native.py`` runs it for
a bounded number of inputs with a fixed seed.
"""

from __future__ import annotations

import struct
import sys
from decimal import Decimal
from typing import Any

import atheris
import pyarrow  # type: ignore[import-untyped]  # noqa: F401 -- imported before instrumenting
import pyspark.sql.types  # noqa: F401 -- large, and not the code under test

with atheris.instrument_imports():
    from apply.lake import driver_plan
    from apply.lake.delta_schema import parse_value_schema
    from apply.lake.driver_plan import CollectedRecord, decode_records
    from apply.lake.tables import TableId
    from schemas import registry_framing
    from schemas.change_record import ChangeEncoder, TableDescription, build_table_schemas
    from schemas.registry_framing import SchemaId
    from schemas.single_object import header
    from tests.plugins.column_types import EVERY_TYPE, every_kind_of_change

if driver_plan._COMPILED is None:
    raise SystemExit("capture_native is not built: run `make native`")

TABLE = TableId("public", "every")
SCHEMAS = build_table_schemas(TableDescription("public", "every", EVERY_TYPE))
REGISTRY_ID = SchemaId(4242)
FRAMINGS = (
    (
        header(SCHEMAS.value_fingerprint),
        parse_value_schema(TABLE, SCHEMAS.value_fingerprint, SCHEMAS.value_schema_json),
    ),
    (
        registry_framing.header(REGISTRY_ID),
        parse_value_schema(
            TABLE, registry_framing.writer_key(REGISTRY_ID), SCHEMAS.value_schema_json
        ),
    ),
)
COMPILED = driver_plan._COMPILED
_ENCODER = ChangeEncoder(SCHEMAS)
BODIES = [_ENCODER.encode_value(change)[len(FRAMINGS[0][0]) :] for change in every_kind_of_change()]


def _exact(value: Any) -> Any:
    """``value`` in a form equal only to the same value of the same type."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, Decimal):
        return ("Decimal", value.as_tuple())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_exact(item) for item in value))
    return (type(value).__name__, value)


def _decoded(value: bytes, framing: int, compiled: bool) -> Any:
    head, schema = FRAMINGS[framing]
    driver_plan._COMPILED = COMPILED if compiled else None
    driver_plan._compiled_decoder.cache_clear()
    decoded = decode_records([CollectedRecord(0, 1, head + value)], schema, schema.columns)
    return [
        (c.op, c.position, c.commit_ts, _exact(c.unchanged), _exact(c.row)) for c in decoded.changes
    ], dict(decoded.malformed)


def _overlong_varint(body: bytes) -> bool:
    run = 0
    for byte in body:
        run = run + 1 if byte & 0x80 else 0
        if run >= 10:
            return True
    return False


def _edited(provider: Any) -> bytes:
    """A record's body with the input's edits, or raw bytes."""
    choice = provider.ConsumeIntInRange(0, len(BODIES))
    if choice == len(BODIES):
        return bytes(provider.ConsumeBytes(provider.ConsumeIntInRange(0, 400)))
    body = bytearray(BODIES[choice])
    for _ in range(provider.ConsumeIntInRange(0, 4)):
        if not body:
            break
        at = provider.ConsumeIntInRange(0, len(body) - 1)
        edit = provider.ConsumeIntInRange(0, 3)
        if edit == 0:
            body[at] = provider.ConsumeInt(1) & 0xFF
        elif edit == 1:
            body[at] ^= 1 << provider.ConsumeIntInRange(0, 7)
        elif edit == 2:
            body[at:at] = provider.ConsumeBytes(provider.ConsumeIntInRange(1, 12))
        else:
            del body[at : at + provider.ConsumeIntInRange(1, 12)]
    if provider.ConsumeBool():
        del body[provider.ConsumeIntInRange(0, len(body)) :]
    return bytes(body)


def test_one_input(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    framing = provider.ConsumeIntInRange(0, 1)
    body = _edited(provider)
    compiled = _decoded(body, framing, compiled=True)
    reference = _decoded(body, framing, compiled=False)
    if compiled != reference and not (not compiled[0] and reference[0] and _overlong_varint(body)):
        raise AssertionError(f"{body!r}: compiled {compiled!r}, fastavro {reference!r}")


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
