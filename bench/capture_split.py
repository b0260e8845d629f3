"""Prototype: decode and encode in a second process, fed with raw frames.

Usage::

    .venv/bin/python -m bench.capture_split --load /tmp/frames.bin [--batch 256]

(frames recorded by ``bench.capture_hot_path --rows N --save /tmp/frames.bin``).

Two runs over the same recorded CopyData frames, each ending with every record as an
:class:`~capture.records.OutgoingRecord` in the measuring process, in stream order:

- **one process**: ``parse_copy_data``, ``decode`` and ``ChangeStream.handle`` inline,
  as capture's loop does them today;
- **split**: the measuring process (standing in for capture's loop, the only reader of
  the socket) sends batches of raw frames over a pipe to a worker process, which parses,
  decodes and encodes them and sends the outputs back in order, as ``marshal``-ed tuples
  of bytes, strings and ints; the loop rebuilds the records. Up to ``--depth`` batches
  are in flight, so both processes work at once.

Reported: wall time and CPU of each side per record. The split pays off when the loop's
share (framing, unmarshalling, rebuilding) plus what it does per record today after
``handle`` (routing, ``Producer.produce``, the in-flight book) is well below the
worker's. Kafka is not involved; on a machine where the broker and the walsender share
the cores, the gain is smaller than the one measured here.
"""

from __future__ import annotations

import argparse
import marshal
import multiprocessing
import resource
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench.capture_hot_path import _describe, load
from capture.pgoutput import decode
from capture.records import OutgoingRecord, SchemaRecord
from capture.stream.change_stream import (
    ChangeStream,
    Output,
    TransactionCommitted,
    TransactionStarted,
)
from capture.stream.copy_data import XLogData, parse_copy_data
from schemas.lsn import Lsn

_RECORD, _SCHEMA, _BEGIN, _COMMIT = range(4)


def _flatten(out: Output) -> tuple[Any, ...]:
    if isinstance(out, OutgoingRecord):
        return (_RECORD, out.topic, out.key, out.value, out.headers, out.table)
    if isinstance(out, SchemaRecord):
        return (_SCHEMA, out.key, out.value)
    if isinstance(out, TransactionStarted):
        return (_BEGIN, out.commit_lsn)
    if isinstance(out, TransactionCommitted):
        return (_COMMIT, out.end_lsn)
    raise TypeError(f"unexpected output {out!r}")


def _rebuild(item: tuple[Any, ...]) -> Output:
    kind = item[0]
    if kind == _RECORD:
        return OutgoingRecord(item[1], item[2], item[3], item[4], item[5])
    if kind == _SCHEMA:
        return SchemaRecord(item[1], item[2])
    if kind == _BEGIN:
        return TransactionStarted(Lsn(item[1]))
    return TransactionCommitted(Lsn(item[1]))


def worker(conn: Connection) -> None:
    """Decode and encode batches of frames until an empty batch arrives."""
    stream = ChangeStream(_describe, "bench")
    while True:
        frames: list[bytes] = marshal.loads(conn.recv_bytes())
        if not frames:
            break
        outputs = []
        for data in frames:
            frame = parse_copy_data(data)
            assert isinstance(frame, XLogData)
            for out in stream.handle(decode(frame.payload), frame.wal_start):
                outputs.append(_flatten(out))
        conn.send_bytes(marshal.dumps(outputs))
    conn.close()


def one_process(frames: Sequence[bytes]) -> int:
    stream = ChangeStream(_describe, "bench")
    records = 0
    for data in frames:
        frame = parse_copy_data(memoryview(data))
        assert isinstance(frame, XLogData)
        for out in stream.handle(decode(frame.payload), frame.wal_start):
            records += isinstance(out, OutgoingRecord)
    return records


def split(frames: Sequence[bytes], batch: int, depth: int) -> tuple[int, float]:
    """Records and the worker's CPU seconds."""
    ours, theirs = multiprocessing.Pipe()
    process = multiprocessing.get_context("fork").Process(target=worker, args=(theirs,))
    process.start()
    theirs.close()
    records = 0
    in_flight = 0
    batches = [list(frames[i : i + batch]) for i in range(0, len(frames), batch)]

    def receive() -> None:
        nonlocal records
        for item in marshal.loads(ours.recv_bytes()):
            out = _rebuild(item)
            records += isinstance(out, OutgoingRecord)

    for chunk in batches:
        ours.send_bytes(marshal.dumps(chunk))
        in_flight += 1
        if in_flight == depth:
            receive()
            in_flight -= 1
    while in_flight:
        receive()
        in_flight -= 1
    ours.send_bytes(marshal.dumps([]))
    process.join()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return records, children.ru_utime + children.ru_stime


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--load", type=Path, required=True, help="frames saved by capture_hot_path")
    parser.add_argument("--batch", type=int, default=256, help="frames per batch")
    parser.add_argument("--depth", type=int, default=4, help="batches in flight")
    args = parser.parse_args()
    frames = load(args.load)

    started, cpu = time.perf_counter(), _cpu()
    records = one_process(frames)
    wall, used = time.perf_counter() - started, _cpu() - cpu
    print(f"{records} records")
    print(
        f"one process: wall {wall / records * 1e6:5.2f} us/record, CPU {used / records * 1e6:5.2f}"
    )

    started, cpu = time.perf_counter(), _cpu()
    split_records, worker_cpu = split(frames, args.batch, args.depth)
    wall, used = time.perf_counter() - started, _cpu() - cpu
    assert split_records == records
    print(
        f"split:       wall {wall / records * 1e6:5.2f} us/record, CPU loop "
        f"{used / records * 1e6:5.2f} + worker {worker_cpu / records * 1e6:5.2f}"
    )


if __name__ == "__main__":
    main()
