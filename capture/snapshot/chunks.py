"""Chunks of a snapshot run: which blocks each COPY reads, the positions of its rows,
and the order its records are published in. Pure: no I/O.

A table is split into ranges of heap blocks, read with a ``ctid`` range
(``WHERE ctid >= '(b0,0)' AND ctid < '(b1,0)'``, a TID Range Scan on PostgreSQL 14 and
later), not into key ranges: any key works (composite, text, uuid), a skewed key space
makes no uneven chunks, and the bounds cost one catalog read instead of a scan of the
key index (docs/capture.md, "Chunked, parallel snapshots").

Invariants:

- A table's chunks cover its blocks exactly once: chunk ``k`` reads blocks
  ``[first_block_k, end_block_k)``, ``end_block_k = first_block_(k+1)``, the first starts
  at block 0 and the last is open-ended, so a block the plan did not count (the file
  grew after its size was read) is still read. A table that fits in one chunk, and every
  table on a server without TID Range Scans (PostgreSQL < 14), is one chunk read without
  a ``ctid`` condition.
- A resumed plan (:class:`~schemas.control.SnapshotResume`: chunk ``k`` at block ``b``)
  covers blocks ``b`` on, numbered from ``k + 1``: chunk ``k`` may be published in part,
  with ordinals the new reading must stay above (docs/capture.md, "Resuming a
  snapshot").
- Row ``i`` (from 1) of chunk ``k`` has ordinal ``k * 2**32 + i``; a leading TRUNCATE
  has ordinal 0. Ordinals of a snapshot are therefore unique and increase in
  (chunk, row) order, not consecutively, and a chunk read again in the same snapshot
  carries the same ordinals, whichever worker reads it.
- :class:`ChunkSequencer` releases each table's batches in chunk order, whatever order
  they are read in: batches of the chunk being published go out at once, those of later
  chunks are held until every chunk before them is done. Since every record of a
  snapshot has the same commit LSN, publishing in that order is publishing in position
  order, as the wire contract requires of every partition.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from schemas.control import SnapshotResume

CHUNK_ORDINALS = 2**32
"""Ordinals reserved for each chunk; chunk ``k``'s rows are ``k * CHUNK_ORDINALS + 1..``."""

UNANALYZED_ROWS_PER_BLOCK = 100
"""The rows per block assumed for a table never analyzed (``reltuples`` unknown): about
right for narrow rows in 8 kB blocks, and only sets the chunk size."""

MAX_CHUNK_BLOCKS = 1_000_000
"""At most this many blocks per chunk, so even full blocks of 32 kB (1,163 tuples at
most) keep a chunk's rows far below :data:`CHUNK_ORDINALS`."""

TID_RANGE_SCAN_VERSION = 140000
"""``server_version_num`` of the first PostgreSQL with TID Range Scans."""


@dataclass(frozen=True, slots=True)
class TableSize:
    """What the plan knows of a table's size, read in the snapshot's transaction."""

    blocks: int
    """``pg_relation_size / block_size``: the heap's blocks now."""
    pages: int
    """``pg_class.relpages`` at the last VACUUM or ANALYZE (0: never, or empty)."""
    tuples: float
    """``pg_class.reltuples`` at the same time (-1 on PostgreSQL 14+: never analyzed)."""

    @property
    def rows_per_block(self) -> float | None:
        """The table's density when it was last analyzed; None when unknown."""
        if self.pages > 0 and self.tuples > 0:
            return self.tuples / self.pages
        return None


@dataclass(frozen=True, slots=True)
class Chunk:
    """Blocks ``[first_block, end_block)`` of ``table``, ``end_block`` None: to the end."""

    table: str
    index: int
    count: int
    """One past the index of the table's last chunk (its number of chunks, unless the
    plan resumes)."""
    first_block: int
    end_block: int | None

    @property
    def whole_table(self) -> bool:
        """Read without a ``ctid`` condition: the table's only chunk."""
        return self.count == 1

    @property
    def last(self) -> bool:
        return self.index == self.count - 1


def blocks_per_chunk(size: TableSize, chunk_rows: int) -> int:
    """Blocks holding about ``chunk_rows`` rows, from the table's last analyzed density."""
    if chunk_rows < 1:
        raise ValueError("a chunk has at least one row")
    density = size.rows_per_block or UNANALYZED_ROWS_PER_BLOCK
    return max(1, min(MAX_CHUNK_BLOCKS, math.ceil(chunk_rows / density)))


def plan_chunks(
    table: str,
    size: TableSize,
    chunk_rows: int,
    *,
    tid_range_scans: bool,
    resume: SnapshotResume | None = None,
) -> tuple[Chunk, ...]:
    """``table``'s chunks in block order, all of them or those from ``resume`` on; see
    the module invariants."""
    per_chunk = blocks_per_chunk(size, chunk_rows)
    if resume is not None:
        if not tid_range_scans:
            raise ValueError(f"{table} resumes at block {resume.block} without TID Range Scans")
        first_index, first_block = resume.chunk + 1, resume.block
    elif not tid_range_scans or size.blocks <= per_chunk:
        return (Chunk(table, 0, 1, 0, None),)
    else:
        first_index, first_block = 0, 0
    count = max(1, math.ceil((size.blocks - first_block) / per_chunk))
    end = first_index + count
    return tuple(
        Chunk(
            table,
            first_index + k,
            end,
            first_block + k * per_chunk,
            None if k == count - 1 else first_block + (k + 1) * per_chunk,
        )
        for k in range(count)
    )


def chunk_ordinal(chunk_index: int, row: int) -> int:
    """The ordinal of row ``row`` (from 1) of chunk ``chunk_index``."""
    if not 0 < row < CHUNK_ORDINALS:
        raise ValueError(f"row {row} of a chunk is outside 1..{CHUNK_ORDINALS - 1}")
    return chunk_index * CHUNK_ORDINALS + row


def dispatch_order(plans: Iterable[Sequence[Chunk]]) -> list[Chunk]:
    """The chunks of every table in one queue, taking one of each table in turn: a small
    table's only chunk is read among the first, not after every chunk of a big one, and
    each table's chunks stay in block order."""
    queues = [list(chunks) for chunks in plans]
    order: list[Chunk] = []
    depth = 0
    while True:
        row = [chunks[depth] for chunks in queues if depth < len(chunks)]
        if not row:
            return order
        order.extend(row)
        depth += 1


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Published(Generic[T]):
    """What a chunk read in full releases."""

    chunks: list[tuple[int, list[T]]]
    """Each chunk now read in full and next in turn, in order, with its held batches: to
    publish now, each chunk's before anything that says it is published."""
    next_chunk: int
    """The chunk being published now: every chunk before it is published in full."""
    complete: bool
    """Whether the table is published in full."""
    next_batches: list[T] = field(default_factory=list)
    """Held batches of ``next_chunk``, which is not read in full yet: published after
    ``batches``, and after anything that says the chunks before it are published."""


@dataclass(slots=True)
class _TableChunks(Generic[T]):
    end: int
    """One past the last chunk's index."""
    current: int
    """The chunk being published: every chunk before it is published in full."""
    finished: set[int] = field(default_factory=set)
    held: dict[int, list[T]] = field(default_factory=dict)
    started: set[int] = field(default_factory=set)


class ChunkSequencer(Generic[T]):
    """Publishes each table's chunks in chunk order while they are read in any order.

    :meth:`start` a chunk when a worker gets it, pass its batches to :meth:`add` as they
    arrive and call :meth:`done` when it is read in full: each returns the batches to
    publish now, in order. :attr:`in_flight` counts started chunks not yet published in
    full; the coordinator starts no more than its workers, which bounds what is held to
    that many chunks' records.
    """

    def __init__(self, plans: Mapping[str, Sequence[Chunk]]) -> None:
        """``plans``: each table's chunks, in block order."""
        self._tables: dict[str, _TableChunks[T]] = {
            table: _TableChunks(end=chunks[-1].count, current=chunks[0].index)
            for table, chunks in plans.items()
            if chunks
        }
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def held_batches(self) -> int:
        """Batches held back, of every table."""
        return sum(len(b) for t in self._tables.values() for b in t.held.values())

    def start(self, chunk: Chunk) -> None:
        state = self._tables.get(chunk.table)
        if state is None:
            return  # dropped
        if chunk.index in state.started:
            raise ValueError(f"chunk {chunk.index} of {chunk.table} was started already")
        state.started.add(chunk.index)
        self._in_flight += 1

    def add(self, chunk: Chunk, batch: T) -> list[T]:
        """``batch`` if it may be published now, else nothing (it is held)."""
        state = self._tables.get(chunk.table)
        if state is None:
            return []
        if chunk.index == state.current:
            return [batch]
        if chunk.index < state.current or chunk.index in state.finished:
            raise ValueError(f"chunk {chunk.index} of {chunk.table} is done: no more rows")
        state.held.setdefault(chunk.index, []).append(batch)
        return []

    def done(self, chunk: Chunk) -> Published[T]:
        """``chunk`` is read in full: what it releases."""
        state = self._tables.get(chunk.table)
        if state is None:
            return Published([], chunk.index, complete=False)
        state.finished.add(chunk.index)
        released: list[tuple[int, list[T]]] = []
        while state.current in state.finished:
            released.append((state.current, state.held.pop(state.current, [])))
            state.current += 1
            self._in_flight -= 1
        return Published(
            released,
            state.current,
            complete=state.current == state.end,
            next_batches=state.held.pop(state.current, []),
        )

    def drop(self, table: str) -> None:
        """Forget ``table`` (it failed): its held batches go, later calls about it do nothing."""
        state = self._tables.pop(table, None)
        if state is not None:
            self._in_flight -= len({i for i in state.started if i >= state.current})
