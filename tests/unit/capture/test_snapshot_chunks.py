"""Snapshot chunks: block ranges, ordinals, dispatch order and in-order publishing; the
default number of snapshot workers under a cgroup CPU limit."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from capture.pgoutput import Relation, RelationColumn, ReplicaIdentity
from capture.snapshot.chunks import (
    CHUNK_ORDINALS,
    MAX_CHUNK_BLOCKS,
    UNANALYZED_ROWS_PER_BLOCK,
    Chunk,
    ChunkSequencer,
    Published,
    TableSize,
    blocks_per_chunk,
    chunk_ordinal,
    dispatch_order,
    plan_chunks,
)
from capture.snapshot.run import cgroup_cpu_limit, format_duration
from capture.snapshot.worker import chunk_query
from schemas.control import SnapshotResume


def _covered(chunks: tuple[Chunk, ...], blocks: int) -> list[int]:
    """Every block 0..blocks+10 each chunk reads, as a list (duplicates kept)."""
    read: list[int] = []
    for c in chunks:
        end = blocks + 10 if c.end_block is None else c.end_block
        read.extend(range(c.first_block, end))
    return sorted(read)


@pytest.mark.parametrize("blocks", [1, 9, 10, 11, 99, 100, 101, 12345])
def test_block_ranges_cover_every_block_once_and_the_last_is_open(blocks: int) -> None:
    size = TableSize(blocks=blocks, pages=blocks, tuples=blocks * 50.0)  # 50 rows a block
    chunks = plan_chunks("s.t", size, 500, tid_range_scans=True)  # 10 blocks a chunk
    # Blocks past the planned count (the file grew) are read too, by the last chunk.
    assert _covered(chunks, blocks) == list(range(blocks + 10))
    assert chunks[0].first_block == 0
    assert chunks[-1].end_block is None
    assert all(c.end_block is not None for c in chunks[:-1])
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert {c.count for c in chunks} == {len(chunks)}
    assert len(chunks) == max(1, -(-blocks // 10))
    for before, after in itertools.pairwise(chunks):
        assert before.end_block == after.first_block


def test_a_table_that_fits_one_chunk_is_read_whole() -> None:
    (chunk,) = plan_chunks("s.t", TableSize(5, 5, 250.0), 500, tid_range_scans=True)
    assert chunk.whole_table
    assert chunk.last
    assert (chunk.first_block, chunk.end_block) == (0, None)


def test_an_empty_table_is_one_chunk() -> None:
    (chunk,) = plan_chunks("s.t", TableSize(0, 0, -1.0), 1, tid_range_scans=True)
    assert chunk.whole_table


def test_without_tid_range_scans_every_table_is_one_chunk() -> None:
    (chunk,) = plan_chunks("s.t", TableSize(10**6, 10**6, 10**8), 10, tid_range_scans=False)
    assert chunk.whole_table


@pytest.mark.parametrize(
    "size",
    [
        TableSize(1000, 0, -1.0),  # PostgreSQL 14+: never analyzed
        TableSize(1000, 0, 0.0),  # PostgreSQL 13: never analyzed
        TableSize(1000, 10, 0.0),  # analyzed while empty, filled since
    ],
)
def test_an_unanalyzed_table_gets_the_assumed_density(size: TableSize) -> None:
    assert size.rows_per_block is None
    per_chunk = blocks_per_chunk(size, 10 * UNANALYZED_ROWS_PER_BLOCK)
    assert per_chunk == 10
    chunks = plan_chunks("s.t", size, 10 * UNANALYZED_ROWS_PER_BLOCK, tid_range_scans=True)
    assert len(chunks) == 100


def test_an_analyzed_table_is_sized_by_its_density() -> None:
    size = TableSize(blocks=400, pages=200, tuples=200 * 20.0)  # 20 rows a block
    assert blocks_per_chunk(size, 1000) == 50
    assert blocks_per_chunk(size, 1) == 1
    sparse = TableSize(blocks=10**9, pages=10**9, tuples=1.0)
    assert blocks_per_chunk(sparse, 10**8) == MAX_CHUNK_BLOCKS


def test_chunk_ordinals_increase_in_chunk_then_row_order() -> None:
    assert chunk_ordinal(0, 1) == 1
    assert chunk_ordinal(1, 1) == CHUNK_ORDINALS + 1
    assert chunk_ordinal(0, CHUNK_ORDINALS - 1) < chunk_ordinal(1, 1)
    assert chunk_ordinal(3, 7) == 3 * 2**32 + 7
    ordinals = [chunk_ordinal(k, i) for k in range(3) for i in (1, 2, 1000)]
    assert ordinals == sorted(ordinals)
    assert len(set(ordinals)) == len(ordinals)
    assert chunk_ordinal(2**31 - 1, CHUNK_ORDINALS - 1) < 2**63, "fits an Avro long"
    with pytest.raises(ValueError, match="outside"):
        chunk_ordinal(0, 0)
    with pytest.raises(ValueError, match="outside"):
        chunk_ordinal(0, CHUNK_ORDINALS)


def test_dispatch_takes_one_chunk_of_each_table_in_turn() -> None:
    big = plan_chunks("s.big", TableSize(40, 40, 400.0), 100, tid_range_scans=True)
    small = plan_chunks("s.small", TableSize(1, 1, 3.0), 100, tid_range_scans=True)
    mid = plan_chunks("s.mid", TableSize(20, 20, 200.0), 100, tid_range_scans=True)
    order = dispatch_order([big, small, mid])
    assert [(c.table, c.index) for c in order[:5]] == [
        ("s.big", 0),
        ("s.small", 0),
        ("s.mid", 0),
        ("s.big", 1),
        ("s.mid", 1),
    ]
    assert sorted(order, key=lambda c: (c.table, c.index)) == sorted(
        [*big, *small, *mid], key=lambda c: (c.table, c.index)
    )
    for table in ("s.big", "s.mid"):
        assert [c.index for c in order if c.table == table] == list(
            range(4 if "big" in table else 2)
        )
    assert dispatch_order([]) == []


def _chunks(table: str, count: int) -> list[Chunk]:
    return [
        Chunk(table, k, count, k * 10, None if k == count - 1 else (k + 1) * 10)
        for k in range(count)
    ]


def test_records_of_a_later_chunk_wait_for_the_chunks_before_it() -> None:
    c0, c1, c2 = _chunks("s.t", 3)
    seq: ChunkSequencer[str] = ChunkSequencer({"s.t": [c0, c1, c2]})
    for c in (c0, c1, c2):
        seq.start(c)
    assert seq.in_flight == 3
    assert seq.add(c1, "1a") == [], "chunk 1 arrives first: held"
    assert seq.add(c2, "2a") == []
    assert seq.add(c0, "0a") == ["0a"], "the current chunk streams through"
    assert seq.add(c1, "1b") == []
    assert seq.done(c1) == Published([], 0, complete=False), "done out of turn: still held"
    assert seq.held_batches() == 3
    assert seq.add(c0, "0b") == ["0b"]
    published = seq.done(c0)
    assert published.chunks == [(0, []), (1, ["1a", "1b"])], "chunk 0 streamed; chunk 1 in full"
    assert published.next_chunk == 2, "chunks 0 and 1 are published in full"
    assert published.next_batches == ["2a"], "then what chunk 2 sent so far, apart"
    assert not published.complete
    assert seq.in_flight == 1
    assert seq.add(c2, "2b") == ["2b"], "chunk 2 is current now: streams"
    assert seq.done(c2) == Published([(2, [])], 3, complete=True)
    assert seq.in_flight == 0
    assert seq.held_batches() == 0


def test_each_table_is_published_in_its_own_chunk_order() -> None:
    a0, a1 = _chunks("s.a", 2)
    (b0,) = _chunks("s.b", 1)
    seq: ChunkSequencer[str] = ChunkSequencer({"s.a": [a0, a1], "s.b": [b0]})
    seq.start(a1)
    seq.start(b0)
    assert seq.add(a1, "a1") == []
    assert seq.add(b0, "b0") == ["b0"], "another table's chunk is not held behind s.a"
    assert seq.done(b0) == Published([(0, [])], 1, complete=True)
    seq.start(a0)
    assert seq.done(a0) == Published([(0, [])], 1, complete=False, next_batches=["a1"]), (
        "chunk 1 is current now, not read in full"
    )
    assert seq.done(a1) == Published([(1, [])], 2, complete=True)


def test_a_dropped_table_releases_nothing_and_frees_its_chunks() -> None:
    c0, c1 = _chunks("s.t", 2)
    seq: ChunkSequencer[str] = ChunkSequencer({"s.t": [c0, c1]})
    seq.start(c0)
    seq.start(c1)
    seq.add(c1, "held")
    seq.drop("s.t")
    assert seq.in_flight == 0
    assert seq.held_batches() == 0
    assert seq.add(c0, "late") == []
    assert not seq.done(c0).complete


def test_rows_after_a_chunk_is_done_are_refused() -> None:
    c0, c1 = _chunks("s.t", 2)
    seq: ChunkSequencer[str] = ChunkSequencer({"s.t": [c0, c1]})
    seq.start(c0)
    seq.start(c1)
    seq.done(c1)
    with pytest.raises(ValueError, match="done"):
        seq.add(c1, "late")
    with pytest.raises(ValueError, match="started already"):
        seq.start(c1)


def test_a_resumed_plan_reads_from_its_block_on_numbered_after_the_cut_chunk() -> None:
    size = TableSize(blocks=100, pages=100, tuples=5000.0)  # 50 rows a block
    whole = plan_chunks("s.t", size, 500, tid_range_scans=True)  # 10 blocks a chunk
    resumed = plan_chunks(
        "s.t", size, 500, tid_range_scans=True, resume=SnapshotResume(chunk=4, block=40)
    )
    # Chunk 4 may be published in part: the rows read again get ordinals above it.
    assert [c.index for c in resumed] == list(range(5, 11))
    assert resumed[0].first_block == 40
    assert resumed[-1].end_block is None, "the last chunk stays open-ended"
    assert all(c.count == 11 and not c.whole_table for c in resumed)
    assert resumed[-1].last
    assert not resumed[0].last
    covered = _covered(resumed, 100)
    assert covered == list(range(40, 110)), "blocks from 40 on, each once"
    assert set(_covered(whole[:4], 100)).isdisjoint(covered), "what chunks 0..3 read"
    assert str(chunk_query(_relation(), resumed[0])).count("ctid") == 2


def test_a_resumed_plan_of_a_table_that_shrank_is_one_open_chunk() -> None:
    (chunk,) = plan_chunks(
        "s.t",
        TableSize(blocks=30, pages=30, tuples=1500.0),
        500,
        tid_range_scans=True,
        resume=SnapshotResume(chunk=4, block=40),
    )
    assert (chunk.index, chunk.first_block, chunk.end_block) == (5, 40, None)
    assert not chunk.whole_table, "a ctid condition still skips the published blocks"


def test_a_resumed_table_is_sequenced_from_its_first_chunk() -> None:
    size = TableSize(blocks=30, pages=30, tuples=1500.0)
    plan = plan_chunks(
        "s.t", size, 500, tid_range_scans=True, resume=SnapshotResume(chunk=1, block=10)
    )
    first, second = plan
    seq: ChunkSequencer[str] = ChunkSequencer({"s.t": plan})
    seq.start(first)
    seq.start(second)
    assert seq.add(second, "b") == []
    assert seq.add(first, "a") == ["a"], "the resumed plan's first chunk is current"
    assert seq.done(first) == Published(
        [(first.index, [])], second.index, complete=False, next_batches=["b"]
    )
    assert seq.done(second) == Published([(second.index, [])], second.index + 1, complete=True)


def test_a_resume_point_is_after_the_first_chunk() -> None:
    with pytest.raises(ValueError, match="after its first chunk"):
        SnapshotResume(chunk=0, block=0)


def _relation() -> Relation:
    return Relation(
        xid=None,
        oid=1,
        namespace="s",
        name="t",
        replica_identity=ReplicaIdentity.DEFAULT,
        columns=(RelationColumn(is_key=True, name="id", type_oid=23, type_modifier=-1),),
    )


def test_chunk_queries_bound_by_ctid() -> None:
    first, middle, last = (
        Chunk("s.t", 0, 3, 0, 10),
        Chunk("s.t", 1, 3, 10, 20),
        Chunk("s.t", 2, 3, 20, None),
    )
    whole = Chunk("s.t", 0, 1, 0, None)
    text = {c: chunk_query(_relation(), c).as_string(None) for c in (first, middle, last, whole)}
    assert text[first] == """COPY (SELECT "id" FROM "s"."t" WHERE ctid < '(10,0)'::tid) TO STDOUT"""
    assert text[middle] == (
        """COPY (SELECT "id" FROM "s"."t" WHERE ctid >= '(10,0)'::tid """
        """AND ctid < '(20,0)'::tid) TO STDOUT"""
    )
    assert text[last] == """COPY (SELECT "id" FROM "s"."t" WHERE ctid >= '(20,0)'::tid) TO STDOUT"""
    assert text[whole] == """COPY (SELECT "id" FROM "s"."t") TO STDOUT"""


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.4, "0s"), (45, "45s"), (190, "3m10s"), (7500, "2h05m")]
)
def test_time_left_reads_as_a_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("files", "cpus"),
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "150000 100000\n"}, 2),
        ({"cpu.max": "50000 100000\n"}, 1),
        ({"quota": "-1\n", "period": "100000\n"}, None),
        ({"quota": "400000\n", "period": "100000\n"}, 4),
        ({}, None),
    ],
)
def test_the_cgroup_cpu_limit_caps_the_default_workers(
    tmp_path: Path, files: dict[str, str], cpus: int | None
) -> None:
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    limits = (
        (tmp_path / "cpu.max", None),
        (tmp_path / "quota", tmp_path / "period"),
    )
    assert cgroup_cpu_limit(limits) == cpus
