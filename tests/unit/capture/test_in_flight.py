"""The confirmable LSN advances only over an applied prefix of transactions."""

from __future__ import annotations

import pytest

from capture.in_flight import ProgressBook, RecordTicket
from schemas.lsn import Lsn

T = "cdc.public.orders"
U = "cdc.public.items"


def _tx(book: ProgressBook, commit: int, end: int, records: list[tuple[str, int, int]]) -> None:
    """One transaction whose records all get delivered at (topic, partition, offset)."""
    book.begin(Lsn(commit))
    tickets = [(book.produced(100), r) for r in records]
    book.commit(Lsn(end))
    for ticket, (topic, partition, offset) in tickets:
        book.delivered(ticket, topic, partition, offset)


def test_nothing_confirmed_until_applied() -> None:
    book = ProgressBook(Lsn(10))
    _tx(book, 100, 108, [(T, 0, 0), (T, 1, 0)])
    assert book.confirmable == 10
    book.applied(T, 0, 1)
    assert book.confirmable == 10, "partition 1 still holds a record of the transaction"
    book.applied(T, 1, 1)
    assert book.confirmable == 108
    assert book.in_flight_records == 0
    assert book.in_flight_bytes == 0


def test_only_an_applied_prefix_counts() -> None:
    book = ProgressBook(Lsn(0))
    _tx(book, 100, 108, [(T, 0, 5)])
    _tx(book, 200, 208, [(U, 0, 7)])
    book.applied(U, 0, 8)
    assert book.confirmable == 0, "a later transaction applied first must not skip the earlier"
    book.applied(T, 0, 6)
    assert book.confirmable == 208


def test_applied_offset_is_exclusive() -> None:
    book = ProgressBook(Lsn(0))
    _tx(book, 100, 108, [(T, 0, 5)])
    book.applied(T, 0, 5)
    assert book.confirmable == 0
    book.applied(T, 0, 6)
    assert book.confirmable == 108


def test_undelivered_record_blocks_even_if_offsets_look_applied() -> None:
    book = ProgressBook(Lsn(0))
    book.begin(Lsn(100))
    first = book.produced(10)
    book.produced(10)
    book.commit(Lsn(108))
    book.delivered(first, T, 0, 0)
    book.applied(T, 0, 1000)
    assert book.confirmable == 0
    assert book.in_flight_records == 1, "the undelivered record is still in flight"


def test_open_transaction_blocks_confirmation_and_keepalive() -> None:
    book = ProgressBook(Lsn(0))
    book.begin(Lsn(100))
    book.keepalive(Lsn(500))
    assert book.confirmable == 0


def test_keepalive_confirms_wal_end_when_idle() -> None:
    book = ProgressBook(Lsn(50))
    book.keepalive(Lsn(500))
    assert book.confirmable == 500
    book.keepalive(Lsn(400))
    assert book.confirmable == 500, "never moves backwards"


def test_keepalive_ignored_while_records_are_in_flight() -> None:
    book = ProgressBook(Lsn(0))
    _tx(book, 100, 108, [(T, 0, 0)])
    book.keepalive(Lsn(900))
    assert book.confirmable == 0
    book.applied(T, 0, 1)
    book.keepalive(Lsn(900))
    assert book.confirmable == 900


def test_empty_transaction_is_confirmable_at_commit() -> None:
    book = ProgressBook(Lsn(0))
    _tx(book, 100, 108, [])
    assert book.confirmable == 108
    assert book.idle


def test_in_flight_counts_for_backpressure() -> None:
    book = ProgressBook(Lsn(0))
    book.begin(Lsn(100))
    for _ in range(3):
        book.produced(40)
    assert (book.in_flight_records, book.in_flight_bytes) == (3, 120)


def test_protocol_misuse_raises() -> None:
    book = ProgressBook(Lsn(0))
    with pytest.raises(ValueError, match="outside a transaction"):
        book.produced(1)
    with pytest.raises(ValueError, match="without an open transaction"):
        book.commit(Lsn(1))
    book.begin(Lsn(1))
    with pytest.raises(ValueError, match="skipped a commit"):
        book.begin(Lsn(2))


def test_records_of_an_open_transaction_are_released_as_applied() -> None:
    """A transaction larger than the in-flight bound must not deadlock backpressure."""
    book = ProgressBook(Lsn(0))
    book.begin(Lsn(100))
    for offset in range(5):
        book.delivered(book.produced(10), T, 0, offset)
    assert (book.in_flight_records, book.in_flight_bytes) == (5, 50)
    book.applied(T, 0, 3)
    assert (book.in_flight_records, book.in_flight_bytes) == (2, 20)
    assert book.confirmable == 0, "still uncommitted"
    book.commit(Lsn(108))
    book.applied(T, 0, 5)
    assert book.confirmable == 108
    assert book.in_flight_records == 0


def test_delivery_after_the_applied_offset_passed_it_is_released_at_once() -> None:
    book = ProgressBook(Lsn(0))
    book.applied(T, 0, 10)
    book.begin(Lsn(100))
    book.delivered(book.produced(7), T, 0, 4)
    assert book.in_flight_records == 0


def test_a_pin_holds_the_slot_until_its_records_are_applied() -> None:
    book = ProgressBook(Lsn(10))
    pin = book.pin()
    _tx(book, 100, 108, [(T, 0, 0)])
    snapshot_row = book.produced_under(pin, 50)
    book.applied(T, 0, 1)
    assert book.confirmable == 10, "a change of the pinned table may be held in that transaction"
    assert book.in_flight_records == 1, "produced, not delivered yet"
    book.delivered(snapshot_row, U, 0, 0)
    book.seal(pin)
    assert book.confirmable == 10, "sealed, but the snapshot row is not applied yet"
    assert book.in_flight_records == 0, "in Kafka: reading goes on, the pin holds the slot"
    book.applied(U, 0, 1)
    assert book.confirmable == 108
    assert not book.pinned


def test_a_pin_also_caps_idle_confirmation() -> None:
    book = ProgressBook(Lsn(10))
    pin = book.pin()
    book.keepalive(Lsn(500))
    assert book.confirmable == 10
    book.seal(pin)
    assert book.confirmable == 500, "an empty sealed pin goes at once"


def test_unpin_releases_at_once_and_late_deliveries_are_harmless() -> None:
    book = ProgressBook(Lsn(10))
    pin = book.pin()
    ticket = book.produced_under(pin, 10)
    book.keepalive(Lsn(40))
    book.unpin(pin)
    assert book.confirmable == 40
    book.delivered(ticket, U, 0, 3)
    book.applied(U, 0, 4)
    assert book.in_flight_records == 0


def test_a_sealed_pin_takes_no_more_records() -> None:
    book = ProgressBook(Lsn(0))
    pin = book.pin()
    book.produced_under(pin, 1)
    book.seal(pin)
    with pytest.raises(ValueError, match="sealed"):
        book.produced_under(pin, 1)


def test_runs_under_a_pin_leave_the_bound_when_delivered_and_hold_the_slot_until_applied() -> None:
    """A run's one report covers its records: all of them leave the bound with it, and
    the pin holds the slot until the applied offset passes the run's last one."""
    book = ProgressBook(Lsn(10))
    pin = book.pin()
    tickets = book.produced_runs_under(pin, [(3, 91), (1, 30)])
    assert tickets == [RecordTicket(pin, 91, 3), RecordTicket(pin, 30, 1)]
    assert (book.in_flight_records, book.in_flight_bytes) == (4, 121)
    book.delivered(tickets[0], U, 0, 2)  # offsets 0..2 of partition 0
    assert (book.in_flight_records, book.in_flight_bytes) == (1, 30)
    book.delivered(tickets[1], U, 1, 0)
    assert (book.in_flight_records, book.in_flight_bytes) == (0, 0)
    book.seal(pin)
    book.keepalive(Lsn(90))
    assert book.confirmable == 10, "delivered, not applied"
    book.applied(U, 0, 2)
    assert book.confirmable == 10, "the run's last record is not applied yet"
    book.applied(U, 0, 3)
    assert book.confirmable == 10, "partition 1's record is not applied yet"
    book.applied(U, 1, 1)
    assert book.confirmable == 90
    assert not book.pinned
    with pytest.raises(ValueError, match="sealed"):
        book.produced_runs_under(pin, [(1, 1)])


def test_delivered_streamed_records_stay_in_flight_beside_delivered_snapshot_rows() -> None:
    """Only the lake releases a streamed change (the bound keeps capture within reach of
    apply); a snapshot row leaves the bound once Kafka has it."""
    book = ProgressBook(Lsn(10))
    pin = book.pin()
    book.begin(Lsn(100))
    change = book.produced(7)
    book.commit(Lsn(108))
    (rows,) = book.produced_runs_under(pin, [(500, 5000)])
    book.delivered(change, T, 0, 0)
    book.delivered(rows, U, 0, 499)
    assert (book.in_flight_records, book.in_flight_bytes) == (1, 7)
    book.applied(T, 0, 1)
    assert (book.in_flight_records, book.in_flight_bytes) == (0, 0)
    assert book.confirmable == 10, "the pin holds the slot until the rows are applied"


def test_paced_by_the_lake_a_pins_records_stay_in_flight_until_applied() -> None:
    """``snapshot_pace=lake``: a run's records leave the bound only when the applied
    offset passes its last one."""
    book = ProgressBook(Lsn(10), pins_paced_by_lake=True)
    pin = book.pin()
    first, second = book.produced_runs_under(pin, [(3, 91), (1, 30)])
    book.delivered(first, U, 0, 2)
    book.delivered(second, U, 1, 0)
    assert (book.in_flight_records, book.in_flight_bytes) == (4, 121)
    book.applied(U, 0, 2)
    assert book.in_flight_records == 4, "the run's last record is not applied yet"
    book.applied(U, 0, 3)
    assert (book.in_flight_records, book.in_flight_bytes) == (1, 30)
    book.applied(U, 1, 1)
    assert (book.in_flight_records, book.in_flight_bytes) == (0, 0)


def test_a_run_delivered_below_the_applied_offset_is_released_at_once() -> None:
    book = ProgressBook(Lsn(10))
    pin = book.pin()
    book.applied(U, 0, 100)
    (ticket,) = book.produced_runs_under(pin, [(5, 50)])
    book.delivered(ticket, U, 0, 40)
    assert (book.in_flight_records, book.in_flight_bytes) == (0, 0)


def test_deliveries_in_any_order_confirm_once_the_last_one_of_each_transaction_is_in() -> None:
    """Only the delivery that completes a transaction can move confirmation: one that
    completes a later transaction first must not be lost when the earlier completes."""
    book = ProgressBook(Lsn(0))
    book.begin(Lsn(100))
    first = [book.produced(10), book.produced(11)]
    book.commit(Lsn(108))
    book.begin(Lsn(200))
    second = [book.produced(10), book.produced(10)]
    book.commit(Lsn(208))
    book.applied(T, 0, 100)  # applied before anything is delivered
    book.delivered(second[0], T, 0, 2)
    book.delivered(first[0], T, 0, 0)
    book.delivered(second[1], T, 0, 3)  # completes the later transaction first
    assert book.confirmable == 0, "the earlier transaction still waits for a delivery"
    book.delivered(first[1], T, 0, 1)
    assert book.confirmable == 208
    assert (book.in_flight_records, book.in_flight_bytes) == (0, 0)


def test_records_of_a_transaction_share_a_ticket_by_size_and_never_across_transactions() -> None:
    book = ProgressBook(Lsn(0))
    book.begin(Lsn(100))
    a, b, c = book.produced(10), book.produced(10), book.produced(12)
    book.commit(Lsn(108))
    book.begin(Lsn(200))
    d = book.produced(10)
    book.commit(Lsn(208))
    assert a is b
    assert a == RecordTicket(0, 10)
    assert c == RecordTicket(0, 12)
    assert d == RecordTicket(1, 10)
    assert book.in_flight_records == 4
    for ticket, offset in ((a, 0), (b, 1), (c, 2)):
        book.delivered(ticket, T, 0, offset)
    book.applied(T, 0, 3)
    assert book.confirmable == 108, "the second transaction's record is not delivered"
    book.delivered(d, T, 0, 3)
    book.applied(T, 0, 4)
    assert book.confirmable == 208


# -- the compiled stream's records: booked in sums, reported in sums -----------------------


def test_compiled_stream_records_confirm_once_every_summed_report_is_applied() -> None:
    book = ProgressBook(Lsn(0))
    first = book.next_transaction_id
    book.begin(Lsn(100))
    book.produced_records(3, 300)
    book.commit(Lsn(108))
    assert book.in_flight_records == 3
    book.delivered_records(first, T, 0, 11, 2, 200)
    assert book.confirmable == 0, "a record of the transaction is not delivered yet"
    book.delivered_records(first, T, 1, 4, 1, 100)
    book.applied(T, 1, 5)
    assert book.confirmable == 0, "partition 0 holds two of its records, unapplied"
    book.applied(T, 0, 11)
    assert book.confirmable == 0, "applied below the higher of its two offsets"
    assert book.in_flight_records == 2
    book.applied(T, 0, 12)
    assert book.confirmable == 108
    assert (book.in_flight_records, book.in_flight_bytes) == (0, 0)


def test_compiled_stream_reports_before_booking_leave_the_open_transaction_unconfirmed() -> None:
    book = ProgressBook(Lsn(0))
    transaction = book.next_transaction_id
    book.begin(Lsn(100))
    book.produced_records(1, 10)
    # The reports of records booked by a later replay came first.
    book.delivered_records(transaction, T, 0, 0, 2, 20)
    book.applied(T, 0, 1)
    assert book.confirmable == 0, "the transaction is open"
    book.produced_records(1, 10)
    book.commit(Lsn(108))
    assert book.confirmable == 108
    assert (book.in_flight_records, book.in_flight_bytes) == (0, 0)


def test_compiled_stream_and_ticketed_records_of_one_transaction_both_count() -> None:
    book = ProgressBook(Lsn(0))
    transaction = book.next_transaction_id
    book.begin(Lsn(100))
    book.produced_records(2, 20)
    ticket = book.produced(50)  # a record of the Python path in the same transaction
    book.commit(Lsn(108))
    book.delivered_records(transaction, T, 0, 1, 2, 20)
    book.applied(T, 0, 5)
    assert book.confirmable == 0, "the Python path's record is not delivered"
    book.delivered(ticket, U, 0, 0)
    book.applied(U, 0, 1)
    assert book.confirmable == 108


def test_compiled_stream_report_for_an_unknown_transaction_is_an_error() -> None:
    book = ProgressBook(Lsn(0))
    with pytest.raises(ValueError, match="unknown transaction"):
        book.delivered_records(book.next_transaction_id, T, 0, 0, 1, 10)
