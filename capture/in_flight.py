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

Backpressure counts records, not transactions: a streamed change's record is in flight
from the moment it is produced until its partition's applied offset passes it. Counting
per transaction would deadlock on a transaction larger than the bound: reading would
pause before its commit arrives, and an uncommitted transaction is never released.

A record produced under a pin (a snapshot row, a change held back behind a snapshot) is
in flight only until Kafka has it. Its pin still keeps the slot where it was until it
is applied, but reading the snapshot is not paced by the lake: paced, a snapshot would
read the source only as fast as apply merges it, and the snapshot's exported
transaction would hold back the source's vacuum horizon (and the table's changes wait
in the spool) for as long as the lake takes. Kafka is where the rows wait instead; the
book keeps nothing per such record once delivered, so its memory does not grow with
the table. The bound still caps what the producer holds undelivered. The price is that
a row may wait in Kafka as long as apply takes for the whole table, which the topics'
retention must allow; ``snapshot_pace=lake`` (``pins_paced_by_lake``) paces pins by the
lake instead, for topics whose retention cannot.

A table being snapshotted *pins* the book (:meth:`ProgressBook.pin`): its streamed
changes are held back until its snapshot is in Kafka, so the transactions carrying them
are not in the lake even when the book has seen the rest of them applied. A pin keeps
``confirmable`` at most at the value it had when the pin was taken, until the pin is
sealed (the table's snapshot and held-back changes are all produced) and every record
produced under it is applied. Transactions keep being tracked and released as usual, so
the book stays small however long a snapshot runs; only the slot waits.

Applied offsets follow Kafka's convention: ``applied[tp] = n`` means offsets ``< n`` are
applied (the end offset of the apply job's last micro-batch for that partition).

This module is pure bookkeeping over values; the replication loop feeds it events.
See https://www.postgresql.org/docs/current/protocol-replication.html (Standby status
update) for what the confirmed LSN means to the server.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
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
    # The transaction's tickets by encoded size: a ticket is a value, records of one size
    # share it, and making one per record was a measurable share of producing it.
    tickets: dict[int, RecordTicket] = field(default_factory=dict)


@dataclass(slots=True)
class _Pin:
    """Records produced outside the stream's transactions (a snapshot and the changes
    held back behind it) that the slot must wait for."""

    floor: Lsn
    sealed: bool = False
    pending_deliveries: int = 0
    high_offsets: dict[TopicPartition, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RecordTicket:
    """Handed out when records are produced; handed back with the delivery report that
    covers them: one record's, or the last of a run of ``records`` records produced one
    after another to one partition (a snapshot batch's, whose publisher checked the run
    is whole), which end at the reported offset.

    ``transaction`` is a transaction id (>= 0) or a pin id (< 0); ``encoded_bytes`` is
    the size of the records it covers, together."""

    transaction: int
    encoded_bytes: int
    records: int = 1


class ProgressBook:
    """Tracks produced-but-unapplied records and answers "what may be confirmed"."""

    __slots__ = (
        "_applied",
        "_confirmable",
        "_in_flight_bytes",
        "_in_flight_records",
        "_next_id",
        "_next_pin",
        "_open",
        "_pins",
        "_pins_paced_by_lake",
        "_transactions",
        "_unapplied",
    )

    def __init__(self, start: Lsn, *, pins_paced_by_lake: bool = False) -> None:
        """``pins_paced_by_lake``: records produced under a pin stay in flight until
        applied, like streamed ones (``snapshot_pace=lake``), not only until delivered."""
        self._pins_paced_by_lake = pins_paced_by_lake
        self._transactions: deque[tuple[int, _Transaction]] = deque()
        self._open: _Transaction | None = None
        self._next_id = 0
        self._applied: dict[TopicPartition, int] = {}
        self._confirmable = start
        self._in_flight_records = 0
        self._in_flight_bytes = 0
        # Delivered, not yet applied streamed records per partition, in offset order: (the
        # highest offset of a report's records, how many, their bytes).
        self._unapplied: dict[TopicPartition, deque[tuple[int, int, int]]] = {}
        self._pins: dict[int, _Pin] = {}
        self._next_pin = -1

    # -- events from the replication stream ---------------------------------------------

    def begin(self, commit_lsn: Lsn) -> None:
        if self._open is not None:
            raise ValueError("begin while a transaction is open: the stream skipped a commit")
        self._open = _Transaction(commit_lsn)
        self._transactions.append((self._next_id, self._open))
        self._next_id += 1

    def produced(self, encoded_bytes: int) -> RecordTicket:
        """A record of the open transaction was handed to the producer."""
        transaction = self._open
        if transaction is None:
            raise ValueError("a record was produced outside a transaction")
        transaction.pending_deliveries += 1
        self._in_flight_records += 1
        self._in_flight_bytes += encoded_bytes
        ticket = transaction.tickets.get(encoded_bytes)
        if ticket is None:
            ticket = RecordTicket(self._next_id - 1, encoded_bytes)
            transaction.tickets[encoded_bytes] = ticket
        return ticket

    def produced_records(self, records: int, encoded_bytes: int) -> None:
        """``records`` records of the open transaction, ``encoded_bytes`` in all, were
        handed to the producer without tickets: the compiled stream's, whose reports come
        summed per partition (:meth:`delivered_records`)."""
        transaction = self._open
        if transaction is None:
            raise ValueError("records were produced outside a transaction")
        transaction.pending_deliveries += records
        self._in_flight_records += records
        self._in_flight_bytes += encoded_bytes

    @property
    def next_transaction_id(self) -> int:
        """The id :meth:`begin` gives the next transaction (the compiled stream's records
        carry it)."""
        return self._next_id

    def commit(self, end_lsn: Lsn) -> None:
        if self._open is None:
            raise ValueError("commit without an open transaction")
        self._open.end_lsn = end_lsn
        self._open.committed = True
        self._open = None
        self._advance()

    # -- pins: records produced outside the stream's transactions ------------------------

    def pin(self) -> int:
        """Hold ``confirmable`` where it is until the returned pin is released."""
        pin_id = self._next_pin
        self._next_pin -= 1
        self._pins[pin_id] = _Pin(self._confirmable)
        return pin_id

    def produced_under(self, pin_id: int, encoded_bytes: int) -> RecordTicket:
        """A record belonging to ``pin_id`` was handed to the producer."""
        pin = self._pins.get(pin_id)
        if pin is None or pin.sealed:
            raise ValueError(f"pin {pin_id} is released or sealed")
        pin.pending_deliveries += 1
        self._in_flight_records += 1
        self._in_flight_bytes += encoded_bytes
        return RecordTicket(pin_id, encoded_bytes)

    def produced_runs_under(
        self, pin_id: int, runs: Sequence[tuple[int, int]]
    ) -> list[RecordTicket]:
        """Runs of records belonging to ``pin_id`` were handed to the producer, each run
        ``(records, encoded bytes)`` to be reported by one delivery report: a ticket per
        run, in order."""
        pin = self._pins.get(pin_id)
        if pin is None or pin.sealed:
            raise ValueError(f"pin {pin_id} is released or sealed")
        tickets = [RecordTicket(pin_id, size, records) for records, size in runs]
        pin.pending_deliveries += len(tickets)
        self._in_flight_records += sum(records for records, _ in runs)
        self._in_flight_bytes += sum(size for _, size in runs)
        return tickets

    def seal(self, pin_id: int) -> None:
        """No more records come under ``pin_id``; it goes once they are all applied."""
        pin = self._pins.get(pin_id)
        if pin is None:
            raise ValueError(f"pin {pin_id} is already released")
        pin.sealed = True
        self._release_pins()

    def unpin(self, pin_id: int) -> None:
        """Release ``pin_id`` now: what it held no longer matters (the table errored)."""
        self._pins.pop(pin_id, None)

    def keepalive(self, wal_end: Lsn) -> None:
        """The server reported how far it has decoded; confirmable when we hold nothing."""
        if self._open is None and not self._transactions and wal_end > self._confirmable:
            self._confirmable = wal_end

    # -- events from Kafka -----------------------------------------------------------------

    def delivered(self, ticket: RecordTicket, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        owner: _Transaction | _Pin | None
        if ticket.transaction >= 0:
            owner = self._find(ticket.transaction)
        else:
            owner = self._pins.get(ticket.transaction)  # None once unpinned: nothing to track
        if owner is None:
            pending = -1
        else:
            owner.pending_deliveries = pending = owner.pending_deliveries - 1
            if offset > owner.high_offsets.get(key, -1):
                owner.high_offsets[key] = offset
        if offset < self._applied.get(key, 0) or (
            ticket.transaction < 0 and not self._pins_paced_by_lake
        ):
            # A pin's records leave the bound once in Kafka (see the module docstring).
            self._release(ticket.records, ticket.encoded_bytes)
        else:
            # Offsets of one partition are delivered in order (idempotent producer).
            waiting = self._unapplied.get(key)
            if waiting is None:
                waiting = self._unapplied[key] = deque()
            waiting.append((offset, ticket.records, ticket.encoded_bytes))
        # Only the delivery that completes its owner can let confirmation move: the
        # others leave the checks below as they were (one per record, at full speed).
        if pending != 0:
            return
        if ticket.transaction >= 0:
            self._advance()
        else:
            self._release_pins()

    def delivered_records(  # noqa: PLR0917 -- one summed report's fields
        self,
        transaction_id: int,
        topic: str,
        partition: int,
        offset: int,
        records: int,
        encoded_bytes: int,
    ) -> None:
        """``records`` records of transaction ``transaction_id`` (booked with
        :meth:`produced_records`), ``encoded_bytes`` in all, are in ``topic`` /
        ``partition``, the last at ``offset``.

        Their reports may come before the compiled stream's replay booked them all (only
        while the transaction is open): pending deliveries then dip, but an open
        transaction never advances confirmation, and its commit comes after its last
        booking."""
        owner = self._find(transaction_id)
        owner.pending_deliveries -= records
        key = (topic, partition)
        if offset > owner.high_offsets.get(key, -1):
            owner.high_offsets[key] = offset
        if offset < self._applied.get(key, 0):
            self._release(records, encoded_bytes)
        else:
            waiting = self._unapplied.get(key)
            if waiting is None:
                waiting = self._unapplied[key] = deque()
            waiting.append((offset, records, encoded_bytes))
        if owner.pending_deliveries == 0:
            self._advance()

    def applied(self, topic: str, partition: int, next_offset: int) -> None:
        """The apply job has applied every offset below ``next_offset`` of that partition."""
        key = (topic, partition)
        if next_offset > self._applied.get(key, 0):
            self._applied[key] = next_offset
            waiting = self._unapplied.get(key)
            while waiting and waiting[0][0] < next_offset:
                _, records, encoded_bytes = waiting.popleft()
                self._release(records, encoded_bytes)
            self._advance()
            self._release_pins()

    # -- answers ---------------------------------------------------------------------------

    @property
    def confirmable(self) -> Lsn:
        """The LSN that may be sent as ``flush`` in the next standby status update."""
        if self._pins:
            return min(self._confirmable, *(p.floor for p in self._pins.values()))
        return self._confirmable

    @property
    def pinned(self) -> bool:
        return bool(self._pins)

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

    def _release(self, records: int, encoded_bytes: int) -> None:
        self._in_flight_records -= records
        self._in_flight_bytes -= encoded_bytes

    def _release_pins(self) -> None:
        for pin_id, pin in list(self._pins.items()):
            if (
                pin.sealed
                and pin.pending_deliveries == 0
                and all(o < self._applied.get(k, 0) for k, o in pin.high_offsets.items())
            ):
                del self._pins[pin_id]

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
