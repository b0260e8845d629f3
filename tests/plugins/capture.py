"""Run the capture service in a background thread of the test process, or in a child
process (:class:`CaptureProcess`) for the tests that kill it.

Shared by the integration and end-to-end tests: settings named after the test (slot,
publication, topic prefix, control and schema topics), a start that waits until the
slot is streaming, and a stop that joins the thread and drops the slot.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import psycopg

from apply.settings import ApplySettings, LakeSettings, TriggerSettings
from apply.settings import KafkaSettings as ApplyKafka
from capture import admin
from capture.metrics import CaptureMetrics
from capture.publish.control import ControlTopicMissingError
from capture.service import CaptureService
from capture.settings import CaptureSettings, KafkaSettings, PostgresSettings
from runtime.retry import run_with_retry
from runtime.schema_registry import SchemaRegistrySettings
from schemas.control import TableState, TableStatus
from schemas.lsn import Lsn, parse_lsn
from tests.plugins.services import Services

Connection = psycopg.Connection[tuple[object, ...]]


def capture_settings(
    services: Services,
    name: str,
    tables: Sequence[str],
    *,
    status_interval_s: float = 0.2,
    snapshot_mode: Literal["initial", "never"] = "never",
) -> CaptureSettings:
    """Settings whose every slot, publication and topic name derives from ``name``.

    Snapshots are off unless asked for: most tests assert the exact changes they make,
    and a snapshot taken after some of them would fold those into READ records."""
    return CaptureSettings(
        postgres=PostgresSettings(
            dsn=services.postgres_dsn, slot=name, publication=name, tables=list(tables)
        ),
        kafka=KafkaSettings(
            bootstrap_servers=services.kafka_bootstrap_servers,
            topic_prefix=name,
            control_topic=f"{name}._control",
            schema_topic=f"{name}._schemas",
            partitions=2,
        ),
        status_interval_s=status_interval_s,
        snapshot_mode=snapshot_mode,
    )


def registry_settings(services: Services, name: str, url: str) -> CaptureSettings:
    """:func:`capture_settings` writing the registry's framing, against the registry at ``url``."""
    settings = capture_settings(services, name, [])
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(
                update={"encoding": "registry", "registry": SchemaRegistrySettings(url=url)}
            )
        }
    )


def apply_settings_for(capture: CaptureSettings, tmp_path: Path) -> ApplySettings:
    """An apply job's settings on the capture's topics, lake and checkpoints under
    ``tmp_path``: what ``pipeline status`` and a test's apply job read."""
    return ApplySettings(
        kafka=ApplyKafka(
            bootstrap_servers=capture.kafka.bootstrap_servers,
            topic_prefix=capture.kafka.topic_prefix,
            control_topic=capture.kafka.control_topic,
            schema_topic=capture.kafka.schema_topic,
        ),
        lake=LakeSettings(root=str(tmp_path / "lake"), checkpoint_root=str(tmp_path / "cp")),
        trigger=TriggerSettings(mode="available_now"),
    )


def table_status(settings: CaptureSettings, table: str) -> TableStatus | None:
    """The table's last status on the control topic; None before capture made the topic
    or wrote one for it."""
    try:
        statuses = admin.table_statuses(settings)
    except ControlTopicMissingError:
        return None
    return next((s for s in statuses if s.table == table), None)


def table_streaming(settings: CaptureSettings, table: str) -> bool:
    """Whether capture recorded ``table`` as streaming: its snapshot is published."""
    found = table_status(settings, table)
    return found is not None and found.state is TableState.STREAMING


def confirmed_lsn(pg: Connection, slot: str) -> Lsn:
    """The slot's ``confirmed_flush_lsn``."""
    row = pg.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [slot]
    ).fetchone()
    assert row is not None, f"slot {slot} does not exist"
    return parse_lsn(str(row[0]))


def current_lsn(pg: Connection) -> Lsn:
    """Where the WAL ends, committed transactions included: the insert position. Under
    ``synchronous_commit=off`` (the local stack) the flush position can still be short
    of a commit just made, and a wait on it would end before that commit arrived."""
    row = pg.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return parse_lsn(str(row[0]))


def slot_active(pg: Connection, slot: str) -> bool:
    """Whether a walsender holds the slot: also while it is still creating it, so this
    tells when capture *let go* of a slot, not when it started streaming
    (:func:`slot_streaming`)."""
    row = pg.execute(
        "SELECT active FROM pg_replication_slots WHERE slot_name = %s", [slot]
    ).fetchone()
    return bool(row and row[0])


def slot_streaming(pg: Connection, slot: str) -> bool:
    """Whether the slot's walsender has started replication (``START_REPLICATION``).

    A slot is active from the start of ``CREATE_REPLICATION_SLOT``, which waits for the
    transactions running then to end before it fixes its consistent point; a change
    committed meanwhile lies before that point and is never decoded. On a server busy
    with other tests that wait is seconds long, and a test that wrote its first change
    as soon as the slot turned active lost it (the change data feed test, once). The
    walsender's state leaves ``startup`` only once streaming began, past that point."""
    row = pg.execute(
        "SELECT r.state FROM pg_replication_slots s "
        "JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = %s",
        [slot],
    ).fetchone()
    return bool(row and row[0] in ("catchup", "streaming"))


@dataclass
class CaptureThread:
    settings: CaptureSettings
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)
    thread: threading.Thread | None = None
    metrics: CaptureMetrics | None = None
    """What the service counts into (a fresh set of its own when None)."""
    retry: bool = False
    """Whether a transient failure starts another attempt after a backoff, as ``python -m
    capture`` does, instead of ending the thread with it in :attr:`errors`."""

    def start(self, pg: Connection, timeout_s: float = 30) -> None:
        def run() -> None:
            try:
                service = CaptureService(self.settings, self.stop, metrics=self.metrics)
                if self.retry:
                    run_with_retry(service.run, should_stop=self.stop.is_set, sleep=self._pause)
                else:
                    service.run()
            except BaseException as exc:  # surfaced by the test through self.errors
                self.errors.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not slot_streaming(pg, self.settings.postgres.slot):
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, "capture never started streaming"
            time.sleep(0.1)

    def _pause(self, seconds: float) -> None:
        """The retry's backoff, cut short by a stop."""
        self.stop.wait(seconds)

    def join(self, timeout_s: float = 30) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout_s)

    def close(self, pg: Connection) -> None:
        """Stop, and drop the slot once the walsender has let go of it."""
        self.join()
        slot = self.settings.postgres.slot
        deadline = time.monotonic() + 20
        while slot_active(pg, slot) and time.monotonic() < deadline:
            time.sleep(0.1)
        pg.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s AND NOT active",
            [slot],
        )


_RUN_CAPTURE = """
import logging, sys, threading
from capture.metrics import CaptureMetrics
from capture.service import CaptureService
from capture.settings import CaptureSettings
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
CaptureService(CaptureSettings.model_validate_json(sys.argv[1]), threading.Event()).run()
"""
_REPO = Path(__file__).resolve().parents[2]


@dataclass
class CaptureProcess:
    """The capture service in a child process of its own, logging to ``log`` (appended
    to, so a restart's lines follow the first run's): for the tests that kill it."""

    settings: CaptureSettings
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, pg: Connection, timeout_s: float = 60) -> None:
        """Start it, and wait until its slot streams."""
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _RUN_CAPTURE, self.settings.model_dump_json()],
                cwd=_REPO,
                env={**os.environ, "PYTHONPATH": str(_REPO)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while not slot_streaming(pg, self.settings.postgres.slot):
            assert self.process.poll() is None, f"capture exited: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"capture never streamed: {self.log.read_text()}"
            time.sleep(0.1)

    def kill(self, pg: Connection, timeout_s: float = 30) -> None:
        """``kill -9`` if it runs, and wait until the server let go of its slot."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout_s)
        deadline = time.monotonic() + timeout_s
        while slot_active(pg, self.settings.postgres.slot):
            assert time.monotonic() < deadline, "the killed capture's slot stayed active"
            time.sleep(0.1)
