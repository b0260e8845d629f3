"""CPU cost of capture's per-change path on recorded frames: no Kafka, no socket.

Usage::

    .venv/bin/python -m bench.capture_hot_path --rows 200000 --save /tmp/frames.bin
    .venv/bin/python -m bench.capture_hot_path --load /tmp/frames.bin [--rounds 5]

With ``--rows``, on the local stack, the workload of :mod:`bench.capture_drain` (same
tables, same pgbench and 1000-row transactions) writes a backlog, and the CopyData frames
of one pgoutput slot are recorded as the server sent them (``--save`` keeps them in a
file, so later runs replay the identical bytes with ``--load``). Then, for each round,
every frame goes through exactly what capture's loop does with it before the producer:
:func:`~capture.stream.copy_data.parse_copy_data`, :func:`~capture.pgoutput.decode`
and :meth:`~capture.stream.change_stream.ChangeStream.handle` (row parsing, Avro key and value,
headers). The report is the best round, in microseconds of one core per row change,
split by stage, plus a checksum over every record's bytes, which must not change when
the code gets faster (the bytes are the wire contract).

``ChangeStream.handle`` runs twice per round: with the compiled row encoder
(:mod:`capture.rows.native`, where built) and with the Python path alone, the baseline
of the same run; then ``ChangeStream.handle_frame``, as the service's Python loop calls
it, which takes Inserts and new-tuple-only Updates from their bytes without decoding
them. The digests of all three must be equal, or the run fails. The service's compiled
stream (:mod:`capture.stream.compiled_stream`) is not measured here: it produces to
Kafka, so the drain benchmark measures it (``--python-loop`` for the loop without it).

What it leaves out, and the drain benchmark includes: reading the socket, producing to
Kafka, delivery reports and the in-flight book. It is the part of the drain that decode
and encode workers could take off the main loop.
"""

from __future__ import annotations

import argparse
import hashlib
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psycopg

from bench.capture_drain import (
    Names,
    _create_publication_and_slots,
    _create_tables,
    _drop_postgres_objects,
    _write_backlog,
)
from capture.pgoutput import Commit, Relation, decode
from capture.records import OutgoingRecord, SchemaRecord
from capture.rows import native as native_rows
from capture.rows.typemap import SESSION_SETTINGS, ColumnMapping, map_column
from capture.stream.change_stream import ChangeStream, Output
from capture.stream.copy_data import XLogData, parse_copy_data
from capture.stream.replication import ReplicationStream
from deploy.local import stack
from deploy.local.postgres import find_bindir

_LENGTH = struct.Struct("!I")


def record_frames(rows: int) -> list[bytes]:
    """Write a backlog of at least ``rows`` row changes; its CopyData frames, in order."""
    state = stack.up()
    dsn = state.postgres.dsn
    names = Names.unique()
    with psycopg.connect(dsn, autocommit=True) as admin:
        try:
            _create_tables(dsn, names)
            start = _create_publication_and_slots(admin, names)
            backlog = _write_backlog(admin, dsn, names, find_bindir(), rows, start)
            print(f"backlog: {backlog.changes} row changes, reading them from the slot...")
            stream = ReplicationStream.start(
                dsn,
                password=None,
                slot=names.capture_slot,
                publication=names.publication,
                start_lsn=start,
                settings=SESSION_SETTINGS,
            )
            frames: list[bytes] = []
            try:
                while True:
                    data = _next_copy_data(stream)
                    frame = parse_copy_data(data)
                    if not isinstance(frame, XLogData):
                        continue
                    frames.append(data)
                    message = decode(frame.payload)
                    if isinstance(message, Commit) and message.end_lsn >= backlog.end:
                        break
            finally:
                stream.close()
        finally:
            _drop_postgres_objects(admin, names)
    return frames


def _next_copy_data(stream: ReplicationStream) -> bytes:
    size, data = stream._pgconn.get_copy_data(0)  # the bench records raw frames
    if size < 0:
        raise RuntimeError("the server ended the replication stream")
    return bytes(data)


def save(frames: Sequence[bytes], path: Path) -> None:
    with path.open("wb") as out:
        for frame in frames:
            out.write(_LENGTH.pack(len(frame)))
            out.write(frame)


def load(path: Path) -> list[bytes]:
    data = path.read_bytes()
    frames, pos = [], 0
    while pos < len(data):
        (size,) = _LENGTH.unpack_from(data, pos)
        frames.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return frames


def _describe(relation: Relation) -> Sequence[ColumnMapping]:
    # The bench tables use built-in types only, which need no catalog entry.
    table = f"{relation.namespace}.{relation.name}"
    return [
        map_column(c.type_oid, c.type_modifier, {}, table=table, column=c.name)
        for c in relation.columns
    ]


def _parse_only(frames: Sequence[bytes]) -> None:
    for data in frames:
        parse_copy_data(memoryview(data))


def _decode_only(frames: Sequence[bytes]) -> None:
    for data in frames:
        frame = parse_copy_data(memoryview(data))
        assert isinstance(frame, XLogData)
        decode(frame.payload)


def _handle(frames: Sequence[bytes], compiled: bool) -> Iterator[Output]:
    stream = ChangeStream(_describe, "bench", compiled_rows=compiled)
    for data in frames:
        frame = parse_copy_data(memoryview(data))
        assert isinstance(frame, XLogData)
        yield from stream.handle(decode(frame.payload), frame.wal_start)


def _handle_python(frames: Sequence[bytes]) -> None:
    for _ in _handle(frames, compiled=False):
        pass


def _handle_compiled(frames: Sequence[bytes]) -> None:
    for _ in _handle(frames, compiled=True):
        pass


def _handle_frames(frames: Sequence[bytes]) -> None:
    """What the service loop runs: each payload to ``handle_frame``, which decodes only
    what the compiled encoder does not take from the bytes."""
    for _ in _from_frames(frames):
        pass


def _from_frames(frames: Sequence[bytes]) -> Iterator[Output]:
    stream = ChangeStream(_describe, "bench", compiled_rows=True)
    for data in frames:
        frame = parse_copy_data(memoryview(data))
        assert isinstance(frame, XLogData)
        yield from stream.handle_frame(frame.payload, frame.wal_start)


def digest(outputs: Iterator[Output]) -> tuple[int, str]:
    """Row-change records and a digest of every record's topic, key, value and headers."""
    hashed = hashlib.sha256()
    records = 0
    for out in outputs:
        if isinstance(out, OutgoingRecord):
            records += 1
            hashed.update(out.topic.encode())
            hashed.update(out.key)
            hashed.update(out.value or b"")
            for name, value in out.headers:
                hashed.update(name.encode())
                hashed.update(value)
        elif isinstance(out, SchemaRecord):
            hashed.update(out.key)
    return records, hashed.hexdigest()[:16]


def _seconds(run: Callable[[Sequence[bytes]], None], frames: Sequence[bytes]) -> float:
    started = time.process_time()
    run(frames)
    return time.process_time() - started


def one_round(frames: Sequence[bytes]) -> dict[str, float]:
    """CPU seconds per stage: each pass does one stage more than the one before, and
    nothing is kept, as in the service's loop."""
    parsed = _seconds(_parse_only, frames)
    decoded = _seconds(_decode_only, frames)
    python = _seconds(_handle_python, frames)
    compiled = _seconds(_handle_compiled, frames)
    from_frames = _seconds(_handle_frames, frames)
    return {
        "parse_copy_data": parsed,
        "pgoutput.decode": decoded - parsed,
        "ChangeStream.handle": python - decoded,
        "ChangeStream.handle, compiled rows": compiled - decoded,
        "decode + handle, from frames": from_frames - parsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--rows", type=int, help="record a fresh backlog of this many changes")
    source.add_argument("--load", type=Path, help="replay frames saved with --save")
    parser.add_argument("--save", type=Path, help="keep the recorded frames in this file")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    frames = record_frames(args.rows) if args.rows is not None else load(args.load)
    if args.save is not None:
        save(frames, args.save)
    records, checksum = digest(_handle(frames, compiled=False))
    for name, outputs in (
        ("compiled rows", _handle(frames, compiled=True)),
        ("from frames", _from_frames(frames)),
    ):
        if digest(outputs) != (records, checksum):
            raise SystemExit(
                f"{name}: the records differ from the Python path's (digest {checksum} of "
                f"{records} records)"
            )
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        stages = one_round(frames)
        if not best or stages["ChangeStream.handle"] < best["ChangeStream.handle"]:
            best = stages
    print(f"{len(frames)} frames, {records} records, digest {checksum} (every path)")
    if not native_rows.AVAILABLE:
        print("capture_native is not built (make native): both rows are the Python path")
    for stage, seconds in best.items():
        print(f"{stage:36} {seconds / records * 1e6:6.2f} us per record")
    front = best["parse_copy_data"] + best["pgoutput.decode"]
    python = front + best["ChangeStream.handle"]
    compiled = front + best["ChangeStream.handle, compiled rows"]
    print(f"{'total, Python path (baseline)':36} {python / records * 1e6:6.2f} us per record")
    print(
        f"{'total, compiled rows':36} {compiled / records * 1e6:6.2f} us per record"
        f" ({python / compiled:.2f}x the baseline's rate)"
    )
    frames_total = best["parse_copy_data"] + best["decode + handle, from frames"]
    print(
        f"{'total, from frames (the service)':36} {frames_total / records * 1e6:6.2f} us per"
        f" record ({python / frames_total:.2f}x the baseline's rate)"
    )


if __name__ == "__main__":
    main()
