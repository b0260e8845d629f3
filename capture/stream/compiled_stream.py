"""The compiled stream: the steady state of streaming, frames to produced records, in one
compiled call per burst (``capture_native.CompiledStream``,
``native/src/compiled_stream.rs``).

Most of a streamed change's cost in the Python loop was not the encoding (compiled
already) but the steps around it, each a few Python calls per frame or record: reading
the frame, the transaction's state, the record object, routing, the book's ticket,
producing, and a Python callback per delivery report. The compiled stream takes the
frames libpq already holds and does all of that for the ones that need no decision; this
module decides which, and keeps the Python objects that stay the authority in step:

- **Armed tables.** A table version is armed when nothing about its changes needs a
  decision: its codec has a compiled encoder, its schema records are out, it is not
  errored, and it streams (:class:`~schemas.control.TableState` ``streaming``; changes
  of transactions that commit at or before its snapshot LSN still go to the Python
  path, which drops them). Deletes are armed only without tombstones (the Python path
  adds the tombstone). The arming is redone whenever the table states or the change
  stream's codecs, errors or published schemas moved (their ``version``), which happens
  only in the Python path or between bursts.
- **One reader at a time.** Any frame the compiled stream does not take comes back to
  the loop, which handles it exactly as without the compiled stream. Before it does, the
  change stream adopts the compiled stream's open transaction (commit LSN, xid,
  timestamp, next ordinal); after it, the compiled stream adopts the change stream's,
  with the in-flight book's next transaction id. So ordinals run on across the two
  paths, and a Begin or Commit the Python path handled is known to the compiled stream.
- **The book.** After every call into the compiled stream, before anything can poll the
  producer, its transactions are replayed into the book in order: begin (it gave its
  records the id the book gives it, checked here), records and bytes produced, commit.
  The compiled stream's records carry no per-record ticket; their delivery reports come
  summed per transaction and partition
  (:meth:`~capture.in_flight.ProgressBook.delivered_records`).
- **Stream blocks.** With ``CAPTURE_STREAMING`` the compiled stream hands back the
  frames from a Stream Start to its Stream Stop (it keeps that one bit itself): inside a
  block a change carries an xid where it would read the relation OID. But for the
  block's row changes the Python path would encode as they arrive: while a block is
  open, the block's spool is armed (:meth:`InProgressTransactions.block_spool
  <capture.stream.in_progress.InProgressTransactions.block_spool>`, re-armed after
  every frame the Python path handles, since a Relation changes the table versions and
  a change spooled in Python moves the spool's end), and the compiled stream encodes
  and appends those itself (``native/src/spool_writer.rs``), the same entries byte for
  byte; what it appended goes back to the spool's bookkeeping after every call, before
  the Python path handles anything. The loop spools the rest, and replays a committed
  streamed transaction from its spool through
  :meth:`CompiledStream.take_spool`: the compiled stream reads the spool's file itself
  (``native/src/spool_replay.rs``, over the live ranges the spool's bookkeeping gives)
  and takes the replayed messages as it takes libpq's frames (they are the messages the
  unstreamed transaction would have been, but for rows encoded when they arrived, which
  it produces as they are when the armed table version's encoder wrote them:
  :mod:`capture.stream.encoded_change`), with no Python per change and without the
  socket being read meanwhile; the messages it hands back, as XLogData frames, go
  through the Python path as usual, and its reading goes on after them.
- **Backpressure.** The loop checks the in-flight bound per burst (``budget`` frames)
  instead of per frame, so it may overshoot the bound by up to one burst.

The compiled stream runs where the compiled producer does and psycopg's libpq can be
found in the process (:func:`libpq`); otherwise, or with
``CAPTURE_COMPILED_STREAM=false``, the loop reads every frame in Python, with the same
records.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from capture.errors import ProtocolError, TransientError
from capture.in_flight import ProgressBook
from capture.metrics import CaptureMetrics
from capture.publish.native_producer import loaded_library
from capture.rows.codec import TableCodec
from capture.stream.change_stream import ChangeStream
from capture.stream.in_progress import InProgressTransactions, StreamedReplay
from capture.stream.table_states import TableStates
from schemas.control import TableState
from schemas.headers import CHANGE_LSN, COMMIT_LSN, operation_headers
from schemas.lsn import Lsn
from schemas.operation import Operation

if TYPE_CHECKING:
    from capture_native import CompiledStream as NativeCompiledStream
    from capture_native import CompiledStreamRead, KafkaProducer, SpoolReplay

# ``Stop`` (what a read stopped on) is defined once, by the extension; the loop reads it
# from here. Where the extension is not built, no CompiledStream can be made, so nothing
# reads these names.
with contextlib.suppress(ImportError):
    from capture_native import OpenTransaction, SpoolDamagedError, Stop

__all__ = ["CompiledStream", "Stop", "libpq"]


@functools.cache
def libpq() -> str | None:
    """The file of the libpq psycopg loaded in this process, if there is exactly one."""
    return loaded_library("/libpq")


class CompiledStream:
    """Drives the compiled stream for the capture loop (see the module's text)."""

    __slots__ = (
        "_armed_at",
        "_block",
        "_book",
        "_changes",
        "_connection",
        "_counted",
        "_ensure_topic",
        "_in_progress",
        "_metrics",
        "_native",
        "_states",
        "on_commit",
    )

    def __init__(  # noqa: PLR0917 -- the objects the compiled stream keeps in step
        self,
        producer: KafkaProducer,
        connection: int,
        book: ProgressBook,
        changes: ChangeStream,
        states: TableStates,
        ensure_topic: Callable[[str], None],
        metrics: CaptureMetrics | None,
        in_progress: InProgressTransactions | None = None,
    ) -> None:
        """``in_progress``: the streamed transactions (with ``CAPTURE_STREAMING``), whose
        open block's row changes the compiled stream spools."""
        from capture_native import CompiledStream as NativeCompiledStream  # noqa: PLC0415

        path = libpq()
        if path is None:
            raise RuntimeError("psycopg's libpq is not found in this process")
        self._native: NativeCompiledStream = NativeCompiledStream(
            producer, path, COMMIT_LSN, CHANGE_LSN
        )
        self._connection = connection
        """The replication connection's ``PGconn *``: valid while its stream is open,
        which outlives the compiled stream (one compiled stream per replication
        stream)."""
        self._book = book
        self._changes = changes
        self._states = states
        self._ensure_topic = ensure_topic
        self._metrics = metrics
        self._armed_at: tuple[int, int] | None = None
        self._counted: dict[tuple[int, int], tuple[tuple[str, Operation], tuple[str, bytes]]] = {}
        """By (oid, tag) armed: the decoded and produced metrics' keys."""
        self.on_commit: Callable[[Lsn], None] = lambda _end_lsn: None
        """Called with each end LSN the compiled stream's commits reach, after the
        book's commit."""
        self._in_progress = in_progress
        self._block: int | None = None
        """The transaction whose block's spool is armed, if one is."""
        self._native.adopt(None, book.next_transaction_id)

    def read(self, budget: int) -> CompiledStreamRead:
        """Take up to ``budget`` frames libpq holds for the replication connection: what
        it stopped on (a ``Stop``; ``Stop.FRAME`` with the frame), and how many frames
        the compiled stream took. The book has the compiled stream's transactions when
        this returns."""
        self._arm()
        read = self._native.read(self._connection, budget)
        self._replay()
        self._take_spooled()
        return read

    def take_frames(self, frames: list[bytes], start: int) -> CompiledStreamRead:
        """:meth:`read` of ``frames[start:]``, XLogData payloads of a streamed transaction
        replayed from its spool rather than frames libpq holds: what it stopped on
        (``Stop.FRAME`` or ``Stop.FULL`` at ``frames[start + taken]``, ``Stop.EMPTY``
        once all are taken). The book has the compiled stream's transactions when this
        returns."""
        self._arm()
        read = self._native.take_frames(frames, start)
        self._replay()
        self._take_spooled()
        return read

    @staticmethod
    def open_spool(replay: StreamedReplay) -> SpoolReplay:
        """The compiled reader of a committed streamed transaction's spool, for
        :meth:`take_spool`: it reads the file by a descriptor of its own (the spool has
        no name), from the start of each live range, and builds the replay's Begin and
        Commit from the Stream Commit. Close it when the replay ends."""
        from capture_native import SpoolReplay  # noqa: PLC0415

        spool, commit = replay.spool, replay.commit
        file = spool.file
        return SpoolReplay(
            None if file is None else file.fileno(),
            list(spool.ranges),
            set(spool.void),
            commit.xid,
            commit.commit_lsn,
            commit.end_lsn,
            commit.commit_time,
        )

    def take_spool(self, spool: SpoolReplay, budget: int) -> CompiledStreamRead:
        """Up to ``budget`` messages of the replay ``spool`` reads (:meth:`open_spool`),
        taken as :meth:`take_frames` takes the replay's frames: what it stopped on
        (``Stop.FRAME`` with the XLogData frame of a message for the Python path, after
        which the replay goes on; ``Stop.FULL`` at a message the producer's queue held
        back, which the next call takes again; ``Stop.LIMIT`` with ``budget`` taken;
        ``Stop.EMPTY`` once the Commit is taken). The book has the compiled stream's
        transactions when this returns or raises."""
        self._arm()
        try:
            return self._native.take_spool(spool, budget)
        except SpoolDamagedError as exc:
            raise ProtocolError(
                f"{exc}; restart capture (the server streams the transaction again)"
            ) from exc
        except OSError as exc:
            raise TransientError(str(exc)) from exc
        finally:
            self._replay()

    def stop_at(self, lsn: Lsn | None) -> None:
        self._native.stop_at(lsn or 0)

    def to_python(self) -> None:
        """Before the Python path handles a frame: the change stream takes over the
        compiled stream's open transaction."""
        open_transaction = self._native.transaction()
        if open_transaction is None:
            self._changes.adopt(None)
        else:
            self._changes.adopt(
                (
                    Lsn(open_transaction.commit_lsn),
                    open_transaction.xid,
                    open_transaction.commit_ts,
                    open_transaction.ordinal,
                )
            )

    def from_python(self) -> None:
        """After it: the compiled stream takes over the change stream's open
        transaction, as the book's open one."""
        self._arm_block()
        transaction = self._changes.transaction()
        next_id = self._book.next_transaction_id
        if transaction is None or not self._book.in_transaction:
            self._native.adopt(None, next_id)
            return
        commit_lsn, xid, commit_ts, ordinal = transaction
        self._native.adopt(
            OpenTransaction(commit_lsn, xid, commit_ts, ordinal, next_id - 1), next_id
        )

    def count(self) -> None:
        """Add the compiled stream's records to the metrics (done before re-arming, and
        by the loop's periodic checks)."""
        metrics = self._metrics
        counts = self._native.take_counts()
        if metrics is None or not counts:
            return
        decoded = metrics.decoded.counts
        produced = metrics.produced.counts
        sizes = metrics.produced_bytes.counts
        for count in counts:
            keys = self._counted.get((count.oid, count.tag))
            if keys is None:
                continue
            decoded_key, produced_key = keys
            records = count.records
            decoded[decoded_key] = decoded.get(decoded_key, 0) + records
            produced[produced_key] = produced.get(produced_key, 0) + records
            table_key = (decoded_key[0],)
            sizes[table_key] = sizes.get(table_key, 0) + count.bytes

    def _replay(self) -> None:
        book = self._book
        for part in self._native.take_transactions():
            if part.began:
                expected = book.next_transaction_id
                book.begin(Lsn(part.commit_lsn))
                if part.id != expected:
                    raise RuntimeError(
                        f"the compiled stream gave transaction id {part.id}, the book "
                        f"{expected}: the compiled stream and the book are out of step"
                    )
            if part.records:
                book.produced_records(part.records, part.bytes)
            end_lsn = part.end_lsn
            if end_lsn:
                book.commit(Lsn(end_lsn))
                self.on_commit(Lsn(end_lsn))

    def _arm_block(self) -> None:
        """Arm the open stream block's spool, as it is now, or disarm it outside a
        block (after every frame the Python path handles)."""
        in_progress = self._in_progress
        block = None if in_progress is None else in_progress.block_spool()
        if block is None:
            if self._block is not None:
                self._block = None
                self._native.end_spool_block()
            return
        end = block.end
        self._native.spool_block(
            end.fd, end.at, end.room, set(end.void), list(block.encoders), list(block.tags)
        )
        self._block = block.xid

    def _take_spooled(self) -> None:
        """Hand what the compiled stream spooled to the spool's bookkeeping."""
        xid, in_progress = self._block, self._in_progress
        if xid is None or in_progress is None:
            return
        try:
            runs = self._native.take_spooled()
        except OSError as exc:
            raise TransientError(
                f"cannot write the spool of streamed transaction {xid}: {exc}"
            ) from exc
        if runs:
            in_progress.spooled(xid, [(run.subxid, run.start, run.end) for run in runs])

    def _arm(self) -> None:
        version = (self._states.version, self._changes.version)
        if version == self._armed_at:
            return
        self.count()
        self._native.disarm()
        self._counted.clear()
        changes = self._changes
        states = self._states
        for oid, codec in changes.codecs.items():
            table = codec.table
            if (
                codec.compiled is None
                or table in changes.errored
                or table not in states
                or states.state(table) is not TableState.STREAMING
                or not changes.schema_published(codec)
            ):
                continue
            self._ensure_topic(codec.topic)
            self._arm_table(oid, codec, states.snapshot_lsn(table) or 0)
        self._armed_at = version

    def _arm_table(self, oid: int, codec: TableCodec, publish_after: int) -> None:
        fingerprint = codec.schemas.value_fingerprint
        operations = []
        for tag, op in self._changes.encoded_operations.items():
            op_header, fingerprint_header = operation_headers(op, fingerprint)
            operations.append((tag, codec.encoder.value_prefix(op), op_header, fingerprint_header))
            self._counted[(oid, tag)] = ((codec.table, op), (codec.table, op_header[1]))
        self._native.arm(
            oid,
            codec.compiled,
            codec.topic,
            codec.encoder.key_header,
            publish_after,
            operations,
        )
