"""Types of ``capture_native``, the compiled part of capture and apply: the row encoder
(``src/lib.rs``), the record producer (``src/producer.rs``), the compiled stream
(``src/compiled_stream.rs``) and apply's change decoder (``src/change_decoder.rs``);
those files say how each is held to the Python path.

Every value the extension hands back is one of the frozen classes below, read by field
name; a class the caller never builds has no constructor here.
"""

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, final

# -- the row encoder (src/lib.rs) -----------------------------------------------------

@final
class EncodedRow:
    """A row's Avro fields (:meth:`TextRowEncoder.encode`), both without any header."""

    @property
    def row(self) -> bytes:
        """The row image's fields as the change record writes them, each a
        ``["null", T]`` union."""
    @property
    def key(self) -> bytes:
        """The key record's fields."""

@final
class ChangeRecord:
    """The whole record of a row message (:meth:`TextRowEncoder.encode_change`)."""

    @property
    def key(self) -> bytes:
        """The record's key, its header first."""
    @property
    def value(self) -> bytes:
        """The record's value, its header first."""
    @property
    def change_lsn_text(self) -> bytes:
        """The change LSN as PostgreSQL prints it (``16/B374D848``), for the record's
        ``change_lsn`` header."""

@final
class CopyRecords:
    """A snapshot chunk's records (:meth:`TextRowEncoder.encode_copy`): one key and one
    value per complete line, in order."""

    @property
    def keys(self) -> list[bytes | None]:
        """Each line's record key, or None for a line the encoder left to the Python
        path."""
    @property
    def values(self) -> list[bytes]:
        """Each line's record value, or, where the key is None, the line itself."""
    @property
    def rest(self) -> bytes:
        """What follows the last newline: the start of a line still to come."""

@final
class TextRowEncoder:
    """The row image and key of one table version, from rows whose every column is
    text. Immutable: one encoder serves any thread."""

    def __init__(self, kinds: list[str], key_columns: list[int], key_nullable: list[bool]) -> None:
        """``kinds``: per column, in order, one of ``boolean``, ``int``, ``long``,
        ``string``, ``float``, ``double``, ``date``, ``time``, ``timestamp``,
        ``timestamptz``; ``key_columns``: the key columns' indexes in key order, and
        ``key_nullable`` whether each is nullable in the key schema. Raises ValueError
        for an unknown kind or key column."""
    def encode(self, values: tuple[bytes | None, ...], /) -> EncodedRow | None:
        """The fields of a row given as each column's text (None: NULL). None when the
        encoder does not take the row (a value neither bytes nor None, another column
        count, a null non-null key field, a text not in PostgreSQL's plain output
        form): the Python path encodes it, or says what is wrong with it."""
    def encode_change(
        self,
        message: bytes,
        key_header: bytes,
        value_start: bytes,
        change_lsn: int,
        value_middle: bytes,
        ordinal: int,
        /,
    ) -> ChangeRecord | None:
        """The record of a pgoutput Insert, new-tuple-only Update or Delete
        (``message``): key ``key_header`` then the key fields; value ``value_start``,
        ``change_lsn``, ``value_middle``, ``ordinal``, then the images. None for any
        other message or a row the encoder does not take: decode it in Python."""
    def encode_copy(
        self, data: bytes, key_header: bytes, value_head: bytes, first_ordinal: int, /
    ) -> CopyRecords:
        """The records of COPY text (``data``, one row per line): key ``key_header``
        then the key fields, value ``value_head``, the ordinal (from
        ``first_ordinal`` on) and an after-only image."""
    def __len__(self) -> int:
        """The number of columns a row has."""

def key_partitions(keys: list[bytes], count: int, /) -> list[int]:
    """The partition of each key among ``count``: murmur2 as Kafka's Java client and
    librdkafka's ``murmur2_random`` compute it. Raises ValueError for a count of 0."""

# -- the record producer (src/producer.rs) --------------------------------------------

@final
class Delivered:
    """Where a reported record went, with the accessors of ``confluent_kafka.Message``
    that delivery callbacks read."""

    def __init__(self, topic: str, partition: int, offset: int, /) -> None:
        """A report of ``topic``, ``partition`` and ``offset`` (negative: none)."""
    def topic(self) -> str:
        """The record's topic."""
    def partition(self) -> int:
        """The record's partition."""
    def offset(self) -> int | None:
        """The record's offset; None when librdkafka has none (a failed delivery)."""

@final
class BatchProduced:
    """How far :meth:`KafkaProducer.produce_batch` got."""

    @property
    def next(self) -> int:
        """The index of the first record not queued; the batch's length when all
        were."""
    @property
    def code(self) -> int:
        """librdkafka's error code for that record (its queue full, say); 0 when all
        were queued."""

@final
class UnreportedFailure:
    """A record produced without a delivery callback that failed: reported anyway, so
    no record is lost unseen."""

    @property
    def code(self) -> int:
        """librdkafka's error code (:meth:`KafkaProducer.error_text` words it)."""
    @property
    def topic(self) -> str:
        """The record's topic."""
    @property
    def partition(self) -> int:
        """The record's partition."""

@final
class ClientError:
    """An error the client reported (librdkafka's ``error_cb``): a refused login, a
    failed TLS handshake, all brokers down."""

    @property
    def code(self) -> int:
        """librdkafka's error code."""
    @property
    def reason(self) -> str:
        """librdkafka's words for it."""

@final
class StreamedRun:
    """The compiled stream's records of one transaction delivered to one partition since
    the last poll, summed into one report."""

    @property
    def transaction(self) -> int:
        """The transaction's id in the in-flight book."""
    @property
    def topic(self) -> str:
        """The records' topic."""
    @property
    def partition(self) -> int:
        """The records' partition."""
    @property
    def offset(self) -> int:
        """The highest offset among them."""
    @property
    def records(self) -> int:
        """How many were delivered."""
    @property
    def bytes(self) -> int:
        """Their key and value bytes."""

@final
class Polled:
    """What one :meth:`KafkaProducer.poll` served and collected."""

    @property
    def served(self) -> int:
        """How many delivery callbacks were called."""
    @property
    def unreported_failures(self) -> list[UnreportedFailure]:
        """Records without a callback that failed, a compiled stream's included."""
    @property
    def client_errors(self) -> list[ClientError]:
        """The client's errors since the last poll (the latest 100 at most)."""
    @property
    def streamed(self) -> list[StreamedRun]:
        """The compiled stream's delivered records, one run per transaction and
        partition, in the order each first appeared (per partition, offset order)."""

@final
class KafkaProducer:
    """librdkafka's producer, the very library confluent-kafka loaded, driven without a
    Python object per record."""

    def __init__(self, library: str, config: list[tuple[str, str]], /) -> None:
        """A producer of the librdkafka at ``library`` with ``config``'s properties,
        in order. Raises OSError when the library cannot be loaded, ValueError for a
        property librdkafka refuses (its message names the property)."""
    def produce(
        self,
        topic: str,
        partition: int,
        key: bytes,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]],
        on_delivery: Callable[[Any, Delivered], object] | None,
        /,
    ) -> int:
        """Queue one record for ``partition`` (-1: the configured partitioner);
        ``on_delivery``, if given, is called by a later :meth:`poll` with
        ``(KafkaError or None, Delivered)``. librdkafka's error code: 0 when queued."""
    def produce_batch(
        self,
        topic: str,
        partitions: list[int],
        keys: list[bytes],
        values: list[bytes],
        headers: list[tuple[str, str | bytes | None]],
        reports: Sequence[tuple[int, Callable[[Any, Delivered], object]]],
        start: int,
        /,
    ) -> BatchProduced:
        """Queue ``keys[i]``/``values[i]`` for ``partitions[i]`` from ``start`` on, all
        with ``headers``; the records at the indexes of ``reports`` (sorted index and
        callback pairs) ask for reports. Stops at the first record librdkafka
        refuses."""
    def poll(self, timeout_ms: int, /) -> Polled:
        """Serve librdkafka's callbacks for up to ``timeout_ms`` (without the GIL),
        then call the delivery callbacks of the reports that came, in order. Raises the
        first exception a callback raised, after serving every report."""
    def flush(self, timeout_ms: int, /) -> int:
        """Wait up to ``timeout_ms`` (-1: no limit) for every queued record; their
        reports wait for the next :meth:`poll`. The records still queued."""
    def error_text(self, code: int, /) -> str:
        """librdkafka's text for an error code."""
    def library_version(self) -> str:
        """The version of the librdkafka in use."""
    def __len__(self) -> int:
        """Records queued or in flight, and reports not served yet."""

# -- the compiled stream (src/compiled_stream.rs) -------------------------------------

@final
class Stop:
    """What :meth:`CompiledStream.read` stopped on. Values compare with each other
    (``==``, hashable), not with numbers."""

    EMPTY: ClassVar[Stop]
    """Nothing more is buffered."""
    FRAME: ClassVar[Stop]
    """A frame for the Python path, in :attr:`CompiledStreamRead.frame`."""
    FULL: ClassVar[Stop]
    """The producer's queue is full: serve reports, then read again."""
    LIMIT: ClassVar[Stop]
    """The budget is used up, or a commit reached :meth:`CompiledStream.stop_at`."""
    ENDED: ClassVar[Stop]
    """The server ended the replication stream."""
    FAILED: ClassVar[Stop]
    """libpq could not read: the connection's error message says why."""

@final
class CompiledStreamRead:
    """What one :meth:`CompiledStream.read` did."""

    @property
    def stopped(self) -> Stop:
        """What it stopped on."""
    @property
    def frame(self) -> bytes | None:
        """With :attr:`Stop.FRAME`, the frame for the Python path (a CopyData
        payload); otherwise None."""
    @property
    def taken(self) -> int:
        """How many frames the compiled stream took itself (``frame`` not counted)."""

@final
class TransactionPart:
    """What the compiled stream did in one transaction since the last
    :meth:`CompiledStream.take_transactions`, for the caller's in-flight book."""

    @property
    def id(self) -> int:
        """The transaction's id in the book (its records carry it)."""
    @property
    def commit_lsn(self) -> int:
        """The transaction's commit LSN, from its Begin."""
    @property
    def began(self) -> bool:
        """Whether its Begin is in this part: the book must begin it."""
    @property
    def records(self) -> int:
        """Records the compiled stream produced for it in this part."""
    @property
    def bytes(self) -> int:
        """Their key and value bytes."""
    @property
    def end_lsn(self) -> int:
        """The Commit's end LSN when the Commit is in this part; 0 while open."""

@final
class TableCount:
    """Records the compiled stream produced for one armed table and operation since the
    last :meth:`CompiledStream.take_counts`."""

    @property
    def oid(self) -> int:
        """The table's relation oid, as armed."""
    @property
    def tag(self) -> int:
        """The operation's pgoutput tag (``ord("I")``, ``"U"`` or ``"D"``)."""
    @property
    def records(self) -> int:
        """How many records."""
    @property
    def bytes(self) -> int:
        """Their key and value bytes."""

@final
class OpenTransaction:
    """An open transaction as the compiled stream and the Python path hand it to each
    other (:meth:`CompiledStream.transaction`, :meth:`CompiledStream.adopt`)."""

    def __init__(self, commit_lsn: int, xid: int, commit_ts: int, ordinal: int, id: int, /) -> None:
        """The transaction as the Python path holds it, with its book id."""
    @property
    def commit_lsn(self) -> int:
        """Its commit LSN, from its Begin."""
    @property
    def xid(self) -> int:
        """Its transaction id on the server."""
    @property
    def commit_ts(self) -> int:
        """Its commit timestamp, microseconds since 1970-01-01 UTC."""
    @property
    def ordinal(self) -> int:
        """The ordinal its next record gets."""
    @property
    def id(self) -> int:
        """Its id in the in-flight book."""

ENCODED_CHANGE: int
"""The tag of a change a streamed transaction's spool holds encoded, capture's own
message (no pgoutput message has it): Int32 relation oid, Int8 pgoutput tag, Int64 the
identity (``id``) of the :class:`TextRowEncoder` that encoded it, Int32 the key fields'
length, the key fields, then the value's fields after ``ordinal``
(``capture/stream/encoded_change.py`` writes it, :meth:`CompiledStream.take_frames`
produces it)."""

@final
class CompiledStream:
    """Streamed changes from the replication connection's buffer to the producer's
    queue, one call per burst, for the frames that need no decision
    (``capture/stream/compiled_stream.py`` drives it)."""

    def __init__(
        self, producer: KafkaProducer, libpq: str, commit_header: str, change_header: str, /
    ) -> None:
        """A compiled stream producing with ``producer``, reading with the libpq at
        ``libpq`` (the file psycopg loaded); the headers name the records' LSN headers.
        Raises OSError when libpq cannot be loaded."""
    def arm(
        self,
        oid: int,
        encoder: Any,
        topic: str,
        key_header: bytes,
        publish_after: int,
        operations: list[tuple[int, bytes, tuple[str, bytes], tuple[str, bytes]]],
        /,
    ) -> None:
        """Arm a table version, whose rows ``encoder`` (a :class:`TextRowEncoder`)
        encodes: ``operations`` holds, per pgoutput tag it takes
        (``I``, ``U``, ``D``), the value's bytes before ``commit_lsn`` and the ``op``
        and fingerprint headers. Changes of transactions committing at or before
        ``publish_after`` go to the Python path. Replaces what ``oid`` had."""
    def disarm(self) -> None:
        """Disarm every table (after :meth:`take_counts`, so no count is lost)."""
    def read(self, connection: int, budget: int, /) -> CompiledStreamRead:
        """Take up to ``budget`` of the frames libpq holds for the connection at
        ``connection`` (its ``PGconn *``); never waits. Every frame from a Stream Start
        to its Stream Stop, both included, is handed back (:attr:`Stop.FRAME`), but the
        row changes the armed block spool takes (:meth:`spool_block`)."""
    def spool_block(
        self,
        fd: int,
        at: int,
        room: int,
        void: set[int],
        encoders: list[tuple[int, Any]],
        tags: list[int],
        /,
    ) -> None:
        """Arm the open stream block's spool (``native/src/spool_writer.rs``): the
        transaction's spool file by descriptor ``fd`` (duplicated), its next entry at
        byte ``at``, ``room`` bytes left under the spool limit, the rolled-back subxids
        ``void``, per relation oid the :class:`TextRowEncoder` of the transaction's
        current table version, and the pgoutput tags (``I``, ``U``, ``D``) encoded
        whole. Replaces the armed one; raises ValueError if its runs were not taken."""
    def end_spool_block(self) -> None:
        """Disarm the block's spool; raises ValueError if its runs were not taken."""
    def take_spooled(self) -> list[SpooledRun]:
        """The runs the armed block's spool appended since the last call, written to its
        file; empty when none is armed. Raises OSError when a write failed."""
    def take_frames(self, frames: list[bytes], start: int, /) -> CompiledStreamRead:
        """Take ``frames[start:]`` (XLogData payloads of a streamed transaction replayed
        from its spool, pgoutput messages or :data:`ENCODED_CHANGE` ones, produced as they
        are when the armed table version's encoder is the one that encoded them) as
        :meth:`read` takes libpq's: :attr:`Stop.FRAME` at a frame for
        the Python path (``frames[start + taken]``), :attr:`Stop.FULL` at one the
        producer's queue held back (``frames[start + taken]``, to give again),
        :attr:`Stop.EMPTY` once all are taken."""
    def take_spool(self, replay: SpoolReplay, budget: int, /) -> CompiledStreamRead:
        """Take up to ``budget`` messages of a committed streamed transaction that
        ``replay`` reads from its spool (its Begin, the entries of the spool's live
        ranges, its Commit) as :meth:`take_frames` takes the frames of its replay, with
        no Python object per change: :attr:`Stop.FRAME` at a message for the Python
        path, in :attr:`CompiledStreamRead.frame` as the XLogData frame the server would
        have sent (``replay`` goes on after it); :attr:`Stop.FULL` at one the producer's
        queue held back (``replay`` hands it out again); :attr:`Stop.LIMIT` once
        ``budget`` are taken; :attr:`Stop.EMPTY` once the Commit is. Raises
        :class:`SpoolDamagedError` for an entry cut short or past its range, OSError
        when the file cannot be read."""
    def take_transactions(self) -> list[TransactionPart]:
        """What the compiled stream did since the last call, a part per transaction, in
        order."""
    def take_counts(self) -> list[TableCount]:
        """Records and bytes per armed table and operation since the last call,
        nonzero ones only."""
    def transaction(self) -> OpenTransaction | None:
        """The open transaction, or None."""
    def adopt(self, transaction: OpenTransaction | None, next_id: int, /) -> None:
        """Take over the open transaction as the Python path left it (None: none is
        open), and the book id the next Begin gets."""
    def stop_at(self, lsn: int, /) -> None:
        """After a Commit whose end LSN reaches ``lsn``, :meth:`read` stops (0:
        never)."""
    def __len__(self) -> int:
        """How many tables are armed."""

# -- apply's change decoder (src/change_decoder.rs) -----------------------------------

@final
class DecodedFields:
    """What ``apply.lake.driver_plan`` builds a ``DecodedChange`` from, for one record."""

    @property
    def op(self) -> str:
        """The operation's symbol (``c``, ``u``, ``d``, ``r``, ``t``)."""
    @property
    def commit_lsn(self) -> int:
        """The commit LSN, as the record's long."""
    @property
    def ordinal(self) -> int:
        """The record's ordinal in its transaction."""
    @property
    def commit_ts(self) -> int:
        """The commit time, microseconds since 1970-01-01 UTC."""
    @property
    def unchanged(self) -> tuple[str, ...]:
        """``unchanged_columns``."""
    @property
    def row(self) -> tuple[Any, ...]:
        """The ``after`` image, else ``before``, projected onto the decoder's names:
        each value as fastavro reads it with logical types but ``decimal`` read as
        their physical type; None for a null, a name the record lacks, or no image."""

@final
class ChangeDecoder:
    """The decoder of one writer schema's change records, projected onto the columns of
    a table. Immutable: one decoder serves any thread."""

    def __init__(self, schema_json: str, writer_key: bytes, names: list[str | None], /) -> None:
        """Records written with ``schema_json`` (the writer schema, as
        ``ValueSchema.decode_json`` holds it) whose header (single-object or Schema
        Registry) names ``writer_key`` (the fingerprint's 8 little-endian bytes); each
        row projected onto ``names`` (per column, the Row field's name, or None).
        Raises ValueError for a schema the decoder does not read (fastavro does) or a
        key of another size."""
    def decode(self, values: list[bytes], /) -> list[DecodedFields | None]:
        """Each record value decoded; None where its header names another writer or its
        body does not decode, as ``driver_plan._decode`` says."""

@final
class SpooledRun:
    """Consecutive entries of one subxid the compiled stream appended to a spool: bytes
    ``start`` to ``end`` of its file."""

    @property
    def subxid(self) -> int:
        """The subtransaction that made the entries."""
    @property
    def start(self) -> int:
        """The first entry's first byte."""
    @property
    def end(self) -> int:
        """The byte after the last entry."""

@final
class SpoolReplay:
    """A committed streamed transaction's replay read from its spool
    (``native/src/spool_replay.rs``) for :meth:`CompiledStream.take_spool`: the Begin
    built from the Stream Commit, each entry (``>IQI``: subxid, change LSN, message
    length; the message) of the file's live ranges, bounds-checked, then the Commit."""

    def __init__(
        self,
        fd: int | None,
        ranges: list[tuple[int, int]],
        void: set[int],
        xid: int,
        commit_lsn: int,
        end_lsn: int,
        commit_time: int,
        /,
    ) -> None:
        """The replay of transaction ``xid`` from the spool open as descriptor ``fd``
        (None: it spooled no change; the descriptor is duplicated, the caller's stays its
        own and must be flushed), reading the ``(start, end)`` byte ``ranges``
        (ascending and apart, else ValueError) but the entries of the ``void`` subxids;
        ``commit_lsn``, ``end_lsn`` and
        ``commit_time`` (microseconds since 2000-01-01) as Stream Commit carries
        them."""
    @property
    def position(self) -> int:
        """Where the next spooled entry starts in the file."""
    @property
    def done(self) -> bool:
        """Whether the Commit is taken: nothing is left."""
    def close(self) -> None:
        """Release the file (the replay ended, or is abandoned with its attempt)."""

class SpoolDamagedError(Exception):
    """A spool's entry is cut short, or runs past its live range: the message names the
    transaction and the byte."""
