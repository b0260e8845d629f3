"""From decoded pgoutput messages to Kafka records: pure, no I/O.

:class:`ChangeStream` consumes messages in stream order and returns what to publish.
It owns the per-transaction state (commit LSN from Begin, ordinal) and the relation
cache (relation OID -> :class:`TableCodec`), and the rules that make a record mean
exactly what the server said:

- A record's position is ``(commit_lsn, ordinal)``: Begin announces the commit LSN
  (``final_lsn``) before the first change, and ordinals count records within the
  transaction, so a transaction streamed again yields byte-identical positions.
- An UPDATE that changes the key becomes a DELETE of the old key and an INSERT of the
  new one (two records, two ordinals), so per-key order holds even when the keys land in
  different partitions.
- Unchanged TOAST values (``u`` columns) are never published as data: filled from the
  old row when the server sent one (``REPLICA IDENTITY FULL``), otherwise listed in
  ``unchanged_columns`` so the apply side keeps its current value.
- TRUNCATE becomes one truncate record per truncated, captured table.
- A Relation that differs from the cached one is a schema change: the codec is rebuilt,
  with a new writer schema (new fingerprint) published before the next record of the
  table.

Tables in :attr:`ChangeStream.errored` are skipped: their changes are not published, so
they need a resync (docs/architecture.md) -- the other tables keep streaming.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from capture.errors import ProtocolError, TableError
from capture.metrics import Tally
from capture.pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Relation,
    Truncate,
    Update,
    decode,
    pg_micros_to_unix_micros,
)
from capture.pgoutput.messages import DELETE, INSERT, UPDATE, frozen_constructor
from capture.publish.schema_registration import Framer, single_object
from capture.records import OutgoingRecord, SchemaRecord
from capture.rows.codec import DescribeColumns, TableCodec
from capture.stream import encoded_change
from capture.stream.encoded_change import ENCODED_CHANGE
from schemas.avro_binary import long_
from schemas.change_record import (
    transaction_fields,
)
from schemas.errors import ChangeEncodingError
from schemas.headers import (
    SharedHeaders,
    commit_lsn_header,
    headers_at,
    operation_headers,
    position_headers,
    record_headers,
)
from schemas.lsn import Lsn, format_lsn
from schemas.operation import Operation
from schemas.schema_topic import table_schema_messages

if TYPE_CHECKING:
    from capture_native import EncodedRow


@dataclass(frozen=True, slots=True)
class TransactionStarted:
    commit_lsn: Lsn


@dataclass(frozen=True, slots=True)
class TransactionCommitted:
    end_lsn: Lsn


@dataclass(frozen=True, slots=True)
class RelationChanged:
    """A table's Relation differs from the one cached (a DDL): the codec is rebuilt
    already. The caller decides whether the rows the table held before need a resync
    (:mod:`capture.stream.schema_change`)."""

    table: str
    previous: Relation
    current: Relation


@dataclass(frozen=True, slots=True)
class RelationReceived:
    """A Relation of a table arrived, changed or not (with
    :attr:`ChangeStream.report_relations`): pgoutput sends one again after the table's
    publication entry changed, which the message itself does not show
    (:func:`capture.stream.schema_change.publication_change_reason`)."""

    table: str


@dataclass(frozen=True, slots=True)
class ChangeFailed:
    """A change could not be turned into a record (with
    :attr:`ChangeStream.defer_errors`). The caller decides: a snapshot may turn out to
    hold the change, and then the failure never mattered."""

    table: str
    error: TableError


_ROW_CHANGES = (Insert, Update, Delete)
_new_record = frozen_constructor(OutgoingRecord)
_new_started = frozen_constructor(TransactionStarted)
_new_committed = frozen_constructor(TransactionCommitted)

Output = (
    OutgoingRecord
    | SchemaRecord
    | TransactionStarted
    | TransactionCommitted
    | ChangeFailed
    | RelationChanged
    | RelationReceived
)


_ENCODED_OPERATIONS: dict[int, Operation] = {
    INSERT: Operation.INSERT,
    UPDATE: Operation.UPDATE,
    DELETE: Operation.DELETE,
}
"""Message tags the compiled encoder may take whole, and the operation they publish."""
_ENCODED_WITHOUT_TOMBSTONES: dict[int, Operation] = {
    tag: op for tag, op in _ENCODED_OPERATIONS.items() if op is not Operation.DELETE
}
"""The same where a DELETE is followed by a tombstone, which the Python path adds."""


_TransactionParts = tuple[bytes, bytes, tuple[str, bytes]]
"""``commit_lsn``, then ``xid`` and ``commit_ts``, encoded, and the ``commit_lsn``
header, of one transaction."""
_RecordShape = tuple[bytes, bytes, bytes, SharedHeaders]
"""What the records of one transaction, table version and operation share: the key's
header, the value's start and middle around ``change_lsn``
(:meth:`~schemas.change_record.ChangeEncoder.value_around_change_lsn`) and the headers
but ``change_lsn``."""


@dataclass(slots=True)
class _Transaction:
    commit_lsn: Lsn
    xid: int
    commit_ts: int
    ordinal: int = 0
    parts: _TransactionParts | None = None
    """Made on the first record the compiled encoder writes whole."""
    shapes: dict[tuple[TableCodec, int], _RecordShape] = field(default_factory=dict)
    """By table codec and pgoutput tag, for the records the compiled encoder writes
    whole (a codec is a key by identity: a new table version is a new codec)."""


def _as_sent(relation: Relation) -> Relation:
    return relation


@dataclass(slots=True)
class ChangeStream:
    """Turns pgoutput messages into :data:`Output` items, in order."""

    describe: DescribeColumns
    topic_prefix: str
    tombstones: bool = False
    codecs: dict[int, TableCodec] = field(default_factory=dict)
    errored: dict[str, TableError] = field(default_factory=dict)
    rekey: Callable[[Relation], Relation] = _as_sent
    """Chooses the key columns of a Relation (see capture.source.setup.key_by_primary_key)."""
    defer_errors: bool = False
    """Hand failed changes out (:class:`ChangeFailed`) instead of erroring the table at
    once: the caller knows whether a snapshot already holds the change."""
    decoded: Tally | None = None
    """Counts every change record made, by (table, operation), for the metrics."""
    framer: Framer = single_object
    """Record headers per table version (:mod:`capture.publish.schema_registration`)."""
    compiled_rows: bool = True
    """Encode all-text rows with the compiled encoder where it applies
    (:mod:`capture.rows.native`); off only to measure or test the Python path."""
    report_relations: bool = False
    """Hand out every Relation as :class:`RelationReceived` (after any
    :class:`RelationChanged` it causes)."""
    version: int = 0
    """Bumped whenever a table's codec, its errored mark or its schema's publication
    changes: what the compiled stream's arming depends on
    (:mod:`capture.stream.compiled_stream`)."""
    replayed_codecs: dict[int, TableCodec] = field(default_factory=dict)
    """The table versions that encoded the changes of the streamed transaction being
    replayed, by their compiled encoder's ``id`` (:mod:`capture.stream.encoded_change`);
    set by the loop for the replay, empty otherwise."""
    _streamed_codecs: dict[int, TableCodec] = field(default_factory=dict)
    """By oid, the latest table version :meth:`codec_in_stream` made: a Relation the
    stream sends later for the same relation takes it rather than a twin, so the
    changes it encoded are produced as they are."""
    _published_schemas: set[int] = field(default_factory=set)
    _tx: _Transaction | None = None
    _encoded_operations: dict[int, Operation] = field(init=False, repr=False)
    """What :meth:`handle_frame` may write whole: fixed by ``tombstones``, chosen once."""

    def __post_init__(self) -> None:
        self._encoded_operations = (
            _ENCODED_WITHOUT_TOMBSTONES if self.tombstones else _ENCODED_OPERATIONS
        )

    @property
    def encoded_operations(self) -> dict[int, Operation]:
        """The pgoutput tags whose messages the compiled encoder writes whole, and the
        operation each publishes (not DELETE with tombstones: the Python path adds the
        tombstone)."""
        return self._encoded_operations

    def transaction(self) -> tuple[Lsn, int, int, int] | None:
        """The open transaction: commit LSN, xid, commit timestamp (Unix microseconds)
        and the next record's ordinal; None between transactions."""
        tx = self._tx
        return None if tx is None else (tx.commit_lsn, tx.xid, tx.commit_ts, tx.ordinal)

    def adopt(self, transaction: tuple[Lsn, int, int, int] | None) -> None:
        """Take over the open transaction as another reader of the stream left it (the
        compiled stream): its records so far took the ordinals before the one given."""
        if transaction is None:
            self._tx = None
            return
        commit_lsn, xid, commit_ts, ordinal = transaction
        tx = self._tx
        if tx is not None and (tx.commit_lsn, tx.xid) == (commit_lsn, xid):
            tx.ordinal = ordinal  # the same transaction: its record shapes still hold
        else:
            self._tx = _Transaction(commit_lsn, xid, commit_ts, ordinal)

    def schema_published(self, codec: TableCodec) -> bool:
        """Whether the schema records of ``codec``'s table version are out."""
        return codec.schemas.value_fingerprint in self._published_schemas

    def error_table(self, table: str, error: TableError) -> None:
        """Skip ``table``'s changes from now on (unless already errored)."""
        if table not in self.errored:
            self.errored[table] = error
            self.version += 1

    def handle(self, message: Message, change_lsn: Lsn) -> Iterator[Output]:
        """Outputs for one message; ``change_lsn`` is its XLogData ``wal_start``."""
        # One list per message rather than nested generators: a frame is a few
        # microseconds of work, and each generator level cost a sizeable share of it.
        out: list[Output] = []
        if isinstance(message, _ROW_CHANGES):
            self._row_change(message, change_lsn, out)
        elif isinstance(message, Begin):
            out.append(self._begin(message))
        elif isinstance(message, Commit):
            out.append(self._commit(message))
        elif isinstance(message, Relation):
            self._relation(message, out)
        elif isinstance(message, Truncate):
            for oid in message.relation_oids:
                codec = self.codecs.get(oid)
                if codec is not None and codec.table not in self.errored:
                    self._emit(codec, Operation.TRUNCATE, change_lsn, out)
        # Origin, Type and logical messages carry nothing to publish: types are read from
        # the catalog, and the publication does not request messages.
        return iter(out)

    def handle_frame(self, payload: bytes | memoryview, change_lsn: Lsn) -> Iterator[Output]:
        """:meth:`handle` of the pgoutput message in an XLogData ``payload`` (outside a
        streamed transaction): an Insert, an Update with only its new tuple, or a Delete
        (without tombstones) of a table with a compiled encoder goes from its bytes to
        its record without being decoded into objects; anything else is decoded and
        handled as usual, so the outputs are the same either way
        (``tests/unit/capture/test_native_rows.py``)."""
        data = bytes(payload)
        tag = data[0] if data else -1
        operation = self._encoded_operations.get(tag)
        tx = self._tx
        if operation is not None and tx is not None:
            codec = self.codecs.get(int.from_bytes(data[1:5]))
            if codec is not None and codec.compiled is not None and codec.table not in self.errored:
                shape = tx.shapes.get((codec, tag))
                if shape is None:
                    shape = self._shape(codec, tag, operation, tx)
                    tx.shapes[(codec, tag)] = shape
                key_header, value_start, value_middle, shared = shape
                encoded = codec.compiled.encode_change(
                    data,
                    key_header,
                    value_start,
                    change_lsn,
                    value_middle,
                    tx.ordinal,
                )
                if encoded is not None:
                    out: list[Output] = []
                    # Takes the ordinal written above: nothing ran in between.
                    self._record_start(codec, operation, out)
                    headers = headers_at(shared, encoded.change_lsn_text)
                    record = _new_record(
                        codec.topic, encoded.key, encoded.value, headers, codec.table
                    )
                    out.append(record)
                    return iter(out)
        if tag == ENCODED_CHANGE:
            return self._encoded_change(data, change_lsn)
        message = decode(data)
        # A transaction's bounds are a third of the frames of small transactions: taken
        # here, without the type tests of handle().
        kind = type(message)
        if kind is Begin:
            return iter((self._begin(cast("Begin", message)),))
        if kind is Commit:
            return iter((self._commit(cast("Commit", message)),))
        return self.handle(message, change_lsn)

    def _begin(self, begin: Begin) -> TransactionStarted:
        self._tx = _Transaction(
            begin.final_lsn, begin.xid, pg_micros_to_unix_micros(begin.commit_time)
        )
        return _new_started(begin.final_lsn)

    def _commit(self, commit: Commit) -> TransactionCommitted:
        self._tx = None
        return _new_committed(commit.end_lsn)

    @staticmethod
    def _shape(codec: TableCodec, tag: int, op: Operation, tx: _Transaction) -> _RecordShape:
        """The :data:`_RecordShape` of ``codec``'s records of ``tag`` in ``tx``, from what
        the transaction's records share and what the table version's share, each made
        once: small transactions touch each table once, so a shape is often used once."""
        parts = tx.parts
        if parts is None:
            commit, transaction = transaction_fields(tx.commit_lsn, tx.xid, tx.commit_ts)
            parts = tx.parts = (commit, transaction, commit_lsn_header(tx.commit_lsn))
        prefix = codec.record_prefixes.get(tag)
        if prefix is None:
            fingerprint = codec.schemas.value_fingerprint
            prefix = (codec.encoder.value_prefix(op), *operation_headers(op, fingerprint))
            codec.record_prefixes[tag] = prefix
        value_prefix, operation, fingerprint_header = prefix
        commit, transaction, commit_header = parts
        return (
            codec.encoder.key_header,
            value_prefix + commit,
            transaction,
            (commit_header, operation, fingerprint_header),
        )

    def codec_in_stream(self, relation: Relation, known: Iterable[TableCodec]) -> TableCodec | None:
        """The table version a streamed transaction's changes after its Relation
        ``relation`` are encoded with as they arrive: the cached one, or one of ``known``
        (the transaction's own so far), when the relation is the same, else a new one;
        None when the table cannot be encoded (its changes are then spooled as they came
        and fail at the commit, as unstreamed). The cache is left alone: the relation is
        the transaction's, not yet the stream's."""
        rekeyed = self.rekey(relation)
        cached = self.codecs.get(relation.oid)
        if cached is not None and cached.relation == rekeyed:
            return cached
        for codec in known:
            if codec.relation == rekeyed:
                return codec
        try:
            codec = self._new_codec(rekeyed)
        except TableError:
            return None
        self._streamed_codecs[relation.oid] = codec
        return codec

    def _new_codec(self, relation: Relation) -> TableCodec:
        """A codec for ``relation``: the replayed streamed transaction's own when it has
        one for the same relation (its changes were encoded with it), else a new one."""
        for codec in self.replayed_codecs.values():
            if codec.relation == relation:
                return codec
        streamed = self._streamed_codecs.get(relation.oid)
        if streamed is not None and streamed.relation == relation:
            return streamed
        return TableCodec(
            relation,
            self.describe(relation),
            self.topic_prefix,
            self.framer,
            compiled=self.compiled_rows,
        )

    def _encoded_change(self, data: bytes, change_lsn: Lsn) -> Iterator[Output]:
        """The record of a change its streamed transaction encoded when it arrived
        (:mod:`capture.stream.encoded_change`): the bytes it holds, with the
        transaction's fields and ordinal written around them as :meth:`handle_frame`
        writes them around the compiled encoder's."""
        change = encoded_change.decode(data)
        codec = self.codecs.get(change.oid)
        if codec is None or codec.table in self.errored:
            return iter(())
        operation = self._encoded_operations.get(change.tag)
        encoded_by = self.replayed_codecs.get(change.encoder)
        if operation is None or encoded_by is None:
            raise ProtocolError(
                f"a spooled change of {codec.table} names an encoder or operation "
                f"(tag {change.tag}) the replayed transaction does not have: the spool and "
                "the replay disagree; restart capture"
            )
        out: list[Output] = []
        if encoded_by is not codec and (
            encoded_by.relation != codec.relation
            or encoded_by.schemas.value_fingerprint != codec.schemas.value_fingerprint
        ):
            error = TableError(
                codec.table,
                "a streamed transaction's change was encoded with another version of the "
                f"table than the stream has at its commit; resync {codec.table}",
            )
            if self.defer_errors:
                out.append(ChangeFailed(codec.table, error))
            else:
                self.error_table(codec.table, error)
            return iter(out)
        tx = self._tx
        if tx is None:
            raise TableError(codec.table, "a change arrived outside a transaction")
        shape = tx.shapes.get((codec, change.tag))
        if shape is None:
            shape = self._shape(codec, change.tag, operation, tx)
            tx.shapes[(codec, change.tag)] = shape
        key_header, value_start, value_middle, shared = shape
        _, ordinal = self._record_start(codec, operation, out)
        value = b"".join(
            (value_start, long_(change_lsn), value_middle, long_(ordinal), change.images)
        )
        headers = headers_at(shared, format_lsn(change_lsn).encode("ascii"))
        out.append(
            _new_record(codec.topic, key_header + change.key_fields, value, headers, codec.table)
        )
        return iter(out)

    def _relation(self, relation: Relation, out: list[Output]) -> None:
        self._codec_for(self.rekey(relation), out)
        if self.report_relations:
            out.append(RelationReceived(f"{relation.namespace}.{relation.name}"))

    def _codec_for(self, relation: Relation, out: list[Output]) -> None:
        """The table's codec for ``relation``, rebuilt when it differs from the cached one."""
        cached = self.codecs.get(relation.oid)
        if cached is not None and cached.relation == relation:
            return
        table = f"{relation.namespace}.{relation.name}"
        self.version += 1
        try:
            self.codecs[relation.oid] = self._new_codec(relation)
        except TableError as exc:
            self.errored[table] = exc
            self.codecs.pop(relation.oid, None)
            return
        if cached is not None and table not in self.errored:
            out.append(RelationChanged(table, cached.relation, relation))

    def _row_change(
        self, message: Insert | Update | Delete, change_lsn: Lsn, out: list[Output]
    ) -> None:
        codec = self.codecs.get(message.relation_oid)
        if codec is None:
            # Only an errored table has no codec: the server always sends Relation first.
            return
        table = codec.table
        if table in self.errored:
            return
        try:
            self._changes(codec, message, change_lsn, out)
        except (TableError, ChangeEncodingError) as exc:
            # Records already appended for this message stay: the caller sees them before
            # the failure, in order.
            error = exc if isinstance(exc, TableError) else TableError(table, str(exc))
            if self.defer_errors:
                out.append(ChangeFailed(table, error))
            else:
                self.error_table(table, error)

    def _changes(
        self,
        codec: TableCodec,
        message: Insert | Update | Delete,
        change_lsn: Lsn,
        out: list[Output],
    ) -> None:
        if type(message) is Insert or (
            type(message) is Update and message.old is None and message.key is None
        ):
            # Only an after image: the compiled encoder may write the whole row.
            encoded = codec.encode_texts(message.new)
            if encoded is not None:
                op = Operation.INSERT if type(message) is Insert else Operation.UPDATE
                self._emit_encoded(codec, op, change_lsn, out, encoded)
                return
        if isinstance(message, Insert):
            after, _ = codec.row(message.new)
            self._emit(codec, Operation.INSERT, change_lsn, out, after=after)
            return
        if isinstance(message, Delete):
            old = message.old if message.old is not None else message.key
            if old is None:
                raise TableError(codec.table, "a DELETE without key or old row")
            deleted, _ = codec.row(old)
            self._emit(
                codec,
                Operation.DELETE,
                change_lsn,
                out,
                before=deleted,
                key_only=message.old is None,
            )
            return
        after, unchanged = codec.row(message.new)
        before: dict[str, Any] | None = None
        if message.old is not None:
            before, _ = codec.row(message.old)
            for name in unchanged:
                after[name] = before[name]
            unchanged = ()
        elif message.key is not None:
            before, _ = codec.row(message.key)
        if before is not None and codec.key_of(before) != codec.key_of(after):
            if unchanged:
                raise TableError(
                    codec.table,
                    "an UPDATE changed the primary key and left TOASTed columns unsent, so "
                    "the new row cannot be published whole: run `ALTER TABLE "
                    f"{codec.table} REPLICA IDENTITY FULL`, then resync the table",
                )
            self._emit(
                codec,
                Operation.DELETE,
                change_lsn,
                out,
                before=before,
                key_only=message.old is None,
            )
            self._emit(codec, Operation.INSERT, change_lsn, out, after=after)
            return
        self._emit(
            codec,
            Operation.UPDATE,
            change_lsn,
            out,
            before=before,
            after=after,
            unchanged=unchanged,
            key_only=message.old is None and before is not None,
        )

    def _emit_encoded(
        self,
        codec: TableCodec,
        op: Operation,
        change_lsn: Lsn,
        out: list[Output],
        encoded: EncodedRow,
    ) -> None:
        """:meth:`_emit` of a change with only an after image, already encoded: its row
        fields and key fields from :meth:`TableCodec.encode_texts`."""
        after_fields, key_fields = encoded.row, encoded.key
        tx, ordinal = self._record_start(codec, op, out)
        encoder = codec.encoder
        value = encoder.encode_encoded_after(
            op=op,
            commit_lsn=tx.commit_lsn,
            change_lsn=change_lsn,
            xid=tx.xid,
            commit_ts=tx.commit_ts,
            ordinal=ordinal,
            after_fields=after_fields,
        )
        fingerprint = codec.schemas.value_fingerprint
        headers = record_headers(op, tx.commit_lsn, change_lsn, fingerprint)
        out.append(
            _new_record(
                codec.topic, encoder.encode_encoded_key(key_fields), value, headers, codec.table
            )
        )

    def _record_start(
        self, codec: TableCodec, op: Operation, out: list[Output]
    ) -> tuple[_Transaction, int]:
        """The open transaction and the record's ordinal in it (taken), after the table
        version's schema records if they are not out yet; counts the record for the
        metrics."""
        tx = self._tx
        if tx is None:
            raise TableError(codec.table, "a change arrived outside a transaction")
        fingerprint = codec.schemas.value_fingerprint
        if fingerprint not in self._published_schemas:
            for message in table_schema_messages(codec.schemas):
                out.append(SchemaRecord(message.key, message.value))
            self._published_schemas.add(fingerprint)
            self.version += 1
        decoded = self.decoded
        if decoded is not None:
            # Tally.add inlined: once per change record.
            counts = decoded.counts
            counted = (codec.table, op)
            counts[counted] = counts.get(counted, 0) + 1
        ordinal = tx.ordinal
        tx.ordinal = ordinal + 1
        return tx, ordinal

    def _emit(
        self,
        codec: TableCodec,
        op: Operation,
        change_lsn: Lsn,
        out: list[Output],
        *,
        before: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
        unchanged: tuple[str, ...] = (),
        key_only: bool = False,
    ) -> None:
        tx, ordinal = self._record_start(codec, op, out)
        fingerprint = codec.schemas.value_fingerprint
        # The fields of a Change, encoded without building one: the branches above
        # already guarantee what Change checks (which images each operation carries).
        encoder = codec.encoder
        key = encoder.encode_row_key(after if after is not None else before)
        value = encoder.encode_fields(
            op=op,
            commit_lsn=tx.commit_lsn,
            change_lsn=change_lsn,
            xid=tx.xid,
            commit_ts=tx.commit_ts,
            ordinal=ordinal,
            before=before,
            after=after,
            unchanged_columns=unchanged,
            before_key_only=key_only,
        )
        headers = record_headers(op, tx.commit_lsn, change_lsn, fingerprint)
        out.append(_new_record(codec.topic, key, value, headers, codec.table))
        if self.tombstones and op is Operation.DELETE:
            out.append(
                OutgoingRecord(
                    codec.topic,
                    key,
                    None,
                    position_headers(tx.commit_lsn, change_lsn),
                    codec.table,
                )
            )
