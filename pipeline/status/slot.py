"""The PostgreSQL side of the status: the server's WAL position and the slot.

One connection, kept open between reads, in a read-only session
(``default_transaction_read_only``): the status never writes. One query per read.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from pydantic import SecretStr

from pipeline.status.errors import StatusError
from pipeline.status.model import SlotView
from schemas.lsn import Lsn, parse_lsn

_CONNECT_TIMEOUT_S = 5

_QUERY = """
SELECT pg_current_wal_lsn()::text,
       s.slot_name IS NOT NULL,
       coalesce(s.active, false),
       s.confirmed_flush_lsn::text,
       s.restart_lsn::text,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint,
       s.wal_status,
       s.safe_wal_size
FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots AS s ON s.slot_name = %s
"""


@dataclass(frozen=True, slots=True)
class ServerView:
    current_wal_lsn: Lsn
    slot: SlotView


def _lsn(text: object) -> Lsn | None:
    return None if text is None else parse_lsn(str(text))


def _int(value: object) -> int | None:
    return None if value is None else int(str(value))


class SlotReader:
    def __init__(self, dsn: str, password: SecretStr | None, slot: str) -> None:
        self._dsn = dsn
        self._password = None if password is None else password.get_secret_value()
        self._slot = slot
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(
                    self._dsn,
                    password=self._password,
                    autocommit=True,
                    connect_timeout=_CONNECT_TIMEOUT_S,
                    application_name="pgdelta-status",
                )
                self._conn.execute("SET default_transaction_read_only = on")
            except psycopg.Error as exc:
                raise StatusError(f"cannot connect to PostgreSQL: {exc}") from exc
        return self._conn

    def read(self) -> ServerView:
        conn = self._connection()
        try:
            row = conn.execute(_QUERY, [self._slot]).fetchone()
        except psycopg.Error as exc:
            # A broken connection is opened again by the next read.
            conn.close()
            raise StatusError(f"cannot read the replication slot {self._slot}: {exc}") from exc
        if row is None:
            raise StatusError("the slot query returned no row")
        current, exists, active, confirmed, restart, retained, wal_status, safe = row
        current_lsn = _lsn(current)
        if current_lsn is None:
            raise StatusError("PostgreSQL reported no current WAL position")
        return ServerView(
            current_lsn,
            SlotView(
                name=self._slot,
                exists=bool(exists),
                active=bool(active),
                confirmed_flush_lsn=_lsn(confirmed),
                restart_lsn=_lsn(restart),
                retained_bytes=_int(retained),
                wal_status=None if wal_status is None else str(wal_status),
                safe_wal_size=_int(safe),
            ),
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
