"""Changes held back while their table is snapshotted, spooled to disk in stream order.

A table's streamed changes wait here from the moment it is pending until its snapshot
is in Kafka (:mod:`capture.stream.table_states`). A snapshot of a big, busy table can take long
enough for these to outgrow memory, so every held record goes straight to an unnamed
temporary file (one per table, gone when closed or when the process dies) and only the
file offsets live in memory. Records come back in the order they were held, with the
commit LSN they were held under, so the ones the snapshot turned out to contain can be
dropped on the way out.

Nothing here needs to survive a restart: held changes are never confirmed to
PostgreSQL (the table's pin keeps the slot behind them), so a new attempt streams them
again.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from capture.errors import ConfigError
from capture.records import OutgoingRecord
from schemas.lsn import Lsn

# commit LSN, then the lengths of topic, table, key, value (-1 = None), header count.
_RECORD = struct.Struct(">QHHIiH")
# A held failure (a change that could not be encoded) has this topic length; its table
# and message follow in the table and key fields.
_FAILURE = 0xFFFF


@dataclass(frozen=True, slots=True)
class HeldFailure:
    """A change of the table that could not be encoded, held in its place: it errors
    the table only if the snapshot does not contain it."""

    table: str
    message: str


_HEADER = struct.Struct(">HI")


class HeldChanges:
    """FIFO spool of one table's held-back records."""

    __slots__ = ("_count", "_file", "_read_at", "_write_at")

    def __init__(self, directory: Path | None = None) -> None:
        try:
            if directory is not None:
                # A configured spool directory that does not exist yet is created, as a
                # user pointing CAPTURE_SPOOL_DIR at a fresh volume path expects.
                directory.mkdir(parents=True, exist_ok=True)
            self._file: IO[bytes] = tempfile.TemporaryFile(  # noqa: SIM115 (closed by close())
                prefix="held-changes-", dir=directory
            )
        except OSError as exc:
            where = "the system temporary directory" if directory is None else str(directory)
            raise ConfigError(
                f"cannot create a spool file for held changes in {where}: {exc}; set "
                "CAPTURE_SPOOL_DIR to a writable directory"
            ) from exc
        self._read_at = 0
        self._write_at = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def hold(self, commit_lsn: Lsn, record: OutgoingRecord) -> None:
        topic, table = record.topic.encode(), record.table.encode()
        value = record.value
        parts = [
            _RECORD.pack(
                commit_lsn,
                len(topic),
                len(table),
                len(record.key),
                -1 if value is None else len(value),
                len(record.headers),
            ),
            topic,
            table,
            record.key,
            b"" if value is None else value,
        ]
        for name, header_value in record.headers:
            encoded = name.encode()
            parts += [_HEADER.pack(len(encoded), len(header_value)), encoded, header_value]
        self._append(b"".join(parts))

    def hold_failure(self, commit_lsn: Lsn, failure: HeldFailure) -> None:
        table, message = failure.table.encode(), failure.message.encode()
        self._append(
            _RECORD.pack(commit_lsn, _FAILURE, len(table), len(message), -1, 0) + table + message
        )

    def _append(self, data: bytes) -> None:
        self._file.seek(self._write_at)
        self._file.write(data)
        self._write_at += len(data)
        self._count += 1

    def release(self, limit: int) -> Iterator[tuple[Lsn, OutgoingRecord | HeldFailure]]:
        """Up to ``limit`` of the oldest records, removed from the spool."""
        self._file.flush()
        for _ in range(min(limit, self._count)):
            self._file.seek(self._read_at)
            commit_lsn, topic_n, table_n, key_n, value_n, header_n = _RECORD.unpack(
                self._read(_RECORD.size)
            )
            if topic_n == _FAILURE:
                failure = HeldFailure(self._read(table_n).decode(), self._read(key_n).decode())
                self._consumed()
                yield commit_lsn, failure
                continue
            topic = self._read(topic_n).decode()
            table = self._read(table_n).decode()
            key = self._read(key_n)
            value = None if value_n < 0 else self._read(value_n)
            headers = []
            for _ in range(header_n):
                name_n, header_value_n = _HEADER.unpack(self._read(_HEADER.size))
                headers.append((self._read(name_n).decode(), self._read(header_value_n)))
            self._consumed()
            yield commit_lsn, OutgoingRecord(topic, key, value, headers, table)

    def _consumed(self) -> None:
        self._read_at = self._file.tell()
        self._count -= 1
        if self._count == 0:
            # Empty again: start over so a long catch-up does not grow the file.
            self._file.seek(0)
            self._file.truncate()
            self._read_at = self._write_at = 0

    def _read(self, size: int) -> bytes:
        data = self._file.read(size)
        if len(data) != size:
            raise OSError(f"held-changes spool is short by {size - len(data)} bytes")
        return data

    def close(self) -> None:
        self._file.close()
