"""Which LSN is safe to confirm to PostgreSQL: the in-flight book.

The slot's confirmed ``flush`` LSN is a promise that everything before it is safely in
the lake; PostgreSQL may recycle that WAL and will never stream it again. So capture
confirms the end LSN of a transaction only when

1. the transaction was fully received (its Commit arrived),
2. every record it produced was acknowledged by Kafka (delivery report with an offset),
3. every such offset is applied to Delta, as the apply job reports per topic-partition
   on the control topic, and
4. the same holds for every earlier transaction (transactions commit in LSN order, and
   the slot has one position, so confirmation advances over an applied *prefix*).

When nothing is in flight and no transaction is open, the server's ``wal_end`` from a
primary keepalive is confirmable too: logical walsenders report there how far they have
decoded, and every transaction that committed before it was either sent to us (and is
applied) or had nothing for our publication. Confirming it keeps a quiet database, or a
publication whose tables are idle, from pinning WAL forever.

Backpressure counts records, not transactions: a record is in flight from the moment it
is produced until its partition's applied offset passes it. Counting per transaction
would deadlock on a transaction larger than the bound: reading would pause before its
commit arrives, and an uncommitted transaction is never released.

Applied offsets follow Kafka's convention: ``applied[tp] = n`` means offsets ``< n`` are
applied (the end offset of the apply job's last micro-batch for that partition).

This module is pure bookkeeping over values; the replication loop feeds it events.
See https://www.postgresql.org/docs/current/protocol-replication.html (Standby status
update) for what the confirmed LSN means to the server.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from schemas.lsn import INVALID_LSN, Lsn

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class _Transaction:
    """Records of one source transaction that are not yet known to be applied."""

    commit_lsn: Lsn
    end_lsn: Lsn = INVALID_LSN
    committed: bool = False
    pending_deliveries: int = 0
    # Highest offset produced per partition: applying up to it covers the whole transaction.
    high_offsets: dict[TopicPartition, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RecordTicket:
    """Handed out when a record is produced; handed back with its delivery report."""

    transaction: int
    encoded_bytes: int


class ProgressBook:
    """Tracks produced-but-unapplied records and answers "what may be confirmed"."""

    __slots__ = (
        "_applied",
        "_confirmable",
        "_in_flight_bytes",
        "_in_flight_records",
        "_next_id",
        "_open",
        "_transactions",
        "_unapplied",
    )

    def __init__(self, start: Lsn) -> None:
        self._transactions: deque[tuple[int, _Transaction]] = deque()
        self._open: _Transaction | None = None
        self._next_id = 0
        self._applied: dict[TopicPartition, int] = {}
        self._confirmable = start
        self._in_flight_records = 0
        self._in_flight_bytes = 0
        # Delivered, not yet applied records per partition, in offset order: (offset, bytes).
        self._unapplied: dict[TopicPartition, deque[tuple[int, int]]] = {}

    # -- events from the replication stream ---------------------------------------------

    def begin(self, commit_lsn: Lsn) -> None:
        if self._open is not None:
            raise ValueError("begin while a transaction is open: the stream skipped a commit")
        self._open = _Transaction(commit_lsn)
        self._transactions.append((self._next_id, self._open))
        self._next_id += 1

    def produced(self, encoded_bytes: int) -> RecordTicket:
        """A record of the open transaction was handed to the producer."""
        if self._open is None:
            raise ValueError("a record was produced outside a transaction")
        self._open.pending_deliveries += 1
        self._in_flight_records += 1
        self._in_flight_bytes += encoded_bytes
        return RecordTicket(self._next_id - 1, encoded_bytes)

    def commit(self, end_lsn: Lsn) -> None:
        if self._open is None:
            raise ValueError("commit without an open transaction")
        self._open.end_lsn = end_lsn
        self._open.committed = True
        self._open = None
        self._advance()

    def keepalive(self, wal_end: Lsn) -> None:
        """The server reported how far it has decoded; confirmable when we hold nothing."""
        if self._open is None and not self._transactions and wal_end > self._confirmable:
            self._confirmable = wal_end

    # -- events from Kafka -----------------------------------------------------------------

    def delivered(self, ticket: RecordTicket, topic: str, partition: int, offset: int) -> None:
        transaction = self._find(ticket.transaction)
        transaction.pending_deliveries -= 1
        key = (topic, partition)
        if offset > transaction.high_offsets.get(key, -1):
            transaction.high_offsets[key] = offset
        if offset < self._applied.get(key, 0):
            self._release(ticket.encoded_bytes)
        else:
            # Offsets of one partition are delivered in order (idempotent producer).
            self._unapplied.setdefault(key, deque()).append((offset, ticket.encoded_bytes))
        self._advance()

    def applied(self, topic: str, partition: int, next_offset: int) -> None:
        """The apply job has applied every offset below ``next_offset`` of that partition."""
        key = (topic, partition)
        if next_offset > self._applied.get(key, 0):
            self._applied[key] = next_offset
            waiting = self._unapplied.get(key)
            while waiting and waiting[0][0] < next_offset:
                self._release(waiting.popleft()[1])
            self._advance()

    # -- answers ---------------------------------------------------------------------------

    @property
    def confirmable(self) -> Lsn:
        """The LSN that may be sent as ``flush`` in the next standby status update."""
        return self._confirmable

    @property
    def in_flight_records(self) -> int:
        return self._in_flight_records

    @property
    def in_flight_bytes(self) -> int:
        return self._in_flight_bytes

    @property
    def in_transaction(self) -> bool:
        return self._open is not None

    @property
    def idle(self) -> bool:
        return self._open is None and not self._transactions

    def _find(self, transaction_id: int) -> _Transaction:
        first_id = self._transactions[0][0] if self._transactions else self._next_id
        index = transaction_id - first_id
        if not 0 <= index < len(self._transactions):
            raise ValueError(f"delivery report for unknown transaction {transaction_id}")
        return self._transactions[index][1]

    def _release(self, encoded_bytes: int) -> None:
        self._in_flight_records -= 1
        self._in_flight_bytes -= encoded_bytes

    def _advance(self) -> None:
        while self._transactions:
            transaction = self._transactions[0][1]
            if not (transaction.committed and transaction.pending_deliveries == 0):
                return
            for key, offset in transaction.high_offsets.items():
                if offset >= self._applied.get(key, 0):
                    return
            self._transactions.popleft()
            self._confirmable = max(self._confirmable, transaction.end_lsn)
