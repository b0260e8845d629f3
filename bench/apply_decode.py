"""Decode speed of apply's driver route: the compiled change decoder against fastavro's
path, over the same records in the same run.

Usage: ``.venv/bin/python -m bench.apply_decode [--records N] [--rounds R]``

N ``pgbench_accounts``-shaped UPDATE records (``aid`` key, ``bid``, ``abalance``, an
84-character ``filler``), as capture publishes them, go through
:func:`apply.lake.driver_plan.decode_records` with the compiled decoder
(``capture_native.ChangeDecoder``) and then without it (fastavro's ``schemaless_reader``
and ``_decode``): the whole step, ``DecodedChange`` objects included. Each reports the
best of R rounds as CPU microseconds per record (``time.process_time``), and the ratio
of the two. Both results are compared first: a bench of two paths that disagree would
measure nothing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from apply.lake import driver_plan
from apply.lake.delta_schema import parse_value_schema, plan_columns
from apply.lake.driver_plan import CollectedRecord, DecodedRecords, decode_records
from apply.lake.tables import TableId
from schemas import column_type as ct
from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    build_table_schemas,
)
from schemas.lsn import Lsn
from schemas.operation import Operation

TABLE = TableId("public", "pgbench_accounts")
COLUMNS = (
    Column("aid", ct.INT, nullable=False, key=True),
    Column("bid", ct.INT),
    Column("abalance", ct.INT),
    Column("filler", ct.STRING),
)


def _records(count: int) -> list[CollectedRecord]:
    schemas = build_table_schemas(TableDescription(TABLE.schema, TABLE.table, COLUMNS))
    encoder = ChangeEncoder(schemas, physical_values=True)
    records = []
    for n in range(count):
        lsn = Lsn(0x1_0000_0000 + n * 200)
        row = {
            "aid": n + 1,
            "bid": n // 100_000 + 1,
            "abalance": (n * 37) % 5000,
            "filler": " " * 84,
        }
        change = Change(
            Operation.UPDATE, lsn, lsn, 1000 + n, 1_715_941_815_123_456 + n, 0, after=row
        )
        records.append(CollectedRecord(n % 4, n, encoder.encode_value(change)))
    return records


def _best(rounds: int, run: Callable[[], DecodedRecords]) -> tuple[float, DecodedRecords]:
    best = float("inf")
    result = run()
    for _ in range(rounds):
        started = time.process_time()
        result = run()
        best = min(best, time.process_time() - started)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if driver_plan._COMPILED is None:
        raise SystemExit("capture_native is not built: run `make native`")
    schemas = build_table_schemas(TableDescription(TABLE.schema, TABLE.table, COLUMNS))
    value_schema = parse_value_schema(TABLE, schemas.value_fingerprint, schemas.value_schema_json)
    columns = plan_columns(TABLE, None, [value_schema]).columns
    records = _records(args.records)

    compiled_time, compiled = _best(
        args.rounds, lambda: decode_records(records, value_schema, columns)
    )
    saved = driver_plan._COMPILED
    driver_plan._COMPILED = None
    driver_plan._compiled_decoder.cache_clear()
    try:
        fastavro_time, reference = _best(
            args.rounds, lambda: decode_records(records, value_schema, columns)
        )
    finally:
        driver_plan._COMPILED = saved
        driver_plan._compiled_decoder.cache_clear()
    if compiled != reference or len(compiled.changes) != args.records:
        raise SystemExit("the compiled decoder and fastavro's path disagree")

    per_record = 1e6 / args.records
    print(f"{args.records} pgbench_accounts UPDATE records, best of {args.rounds} rounds (CPU)")
    print(f"  fastavro path:     {fastavro_time * per_record:6.2f} µs/record")
    print(f"  compiled decoder:  {compiled_time * per_record:6.2f} µs/record")
    print(f"  ratio:             {fastavro_time / compiled_time:6.1f}x")


if __name__ == "__main__":
    main()
