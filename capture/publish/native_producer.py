"""capture's producer on the compiled extension (``capture_native.KafkaProducer``,
``native/src/producer.rs``), where it can run: the librdkafka confluent-kafka loaded,
driven without confluent-kafka's per-record Python objects.

It offers the part of ``confluent_kafka.Producer`` the publisher uses (``produce`` with
``on_delivery``, ``poll``, ``flush``, ``error_cb``), with the same meanings, plus
:meth:`NativeProducer.produce_batch` for a snapshot batch. Invariants:

- **Same library, same properties.** The extension opens the librdkafka file this
  process already loaded for confluent-kafka (read from ``/proc/self/maps``), and checks
  it reports the version confluent-kafka does. So TLS, SASL and every other property
  work exactly as for the other clients. Where that cannot be done (not Linux, the
  extension not built), :func:`library` is None and the publisher uses
  confluent-kafka's producer: slower, never different.
- **No record goes unseen.** A record produced without ``on_delivery`` that fails is
  still reported (:attr:`NativeProducer.unreported_failure`), so a snapshot run's middle
  record cannot be lost silently.
- **Full queue** raises ``BufferError``, as confluent-kafka does; other refusals raise
  ``KafkaException`` with librdkafka's error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, Producer

from runtime.kafka_client import KafkaConf

if TYPE_CHECKING:
    from capture_native import KafkaProducer, StreamedRun

_QUEUE_FULL = KafkaError._QUEUE_FULL


class Delivery(Protocol):
    """Where a reported record went: ``confluent_kafka.Message``, or
    ``capture_native.Delivered`` from the compiled producer."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...


Report = Callable[[KafkaError | None, Delivery], None]
"""A delivery callback: the error or None, and where the record went."""


@functools.cache
def library() -> str | None:
    """The file of the librdkafka confluent-kafka loaded in this process, if the
    extension can drive it; None otherwise."""
    try:
        from capture_native import KafkaProducer  # noqa: F401, PLC0415
    except ImportError:
        return None
    return loaded_library("librdkafka")


def loaded_library(marker: str) -> str | None:
    """The one file this process has mapped whose path contains ``marker``
    (``/proc/self/maps``); None when there is none, more than one, or no such file."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if marker in line}
    except OSError:
        return None
    loaded = [p for p in paths if p.startswith("/")]
    return loaded[0] if len(loaded) == 1 else None


def _property(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class NativeProducer:
    """``confluent_kafka.Producer``'s producing part on the compiled extension."""

    def __init__(self, conf: KafkaConf, *, error_cb: Callable[[KafkaError], None]) -> None:
        path = library()
        if path is None:
            raise RuntimeError("the compiled producer is not available in this process")
        from capture_native import KafkaProducer  # noqa: PLC0415

        try:
            self._native = KafkaProducer(
                path, [(name, _property(value)) for name, value in conf.items()]
            )
        except ValueError as exc:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, str(exc))) from exc
        expected = confluent_kafka.libversion()[0]
        if self._native.library_version() != expected:
            raise RuntimeError(
                f"librdkafka {self._native.library_version()} loaded, confluent-kafka "
                f"uses {expected}"
            )
        self._error_cb = error_cb
        self.unreported_failure: str | None = None
        """The first failure of a record produced without a report."""
        self.on_streamed: Callable[[list[StreamedRun]], None] | None = None
        """Takes the compiled stream's delivered records
        (:mod:`capture.stream.compiled_stream`), per transaction and partition."""

    @property
    def native(self) -> KafkaProducer:
        """The compiled producer itself, for the compiled stream to produce with."""
        return self._native

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes,
        partition: int = -1,
        *,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        on_delivery: Report | None = None,
    ) -> None:
        code = self._native.produce(topic, partition, key, value, headers or [], on_delivery)
        if code == 0:
            return
        if code == _QUEUE_FULL:
            raise BufferError(self._native.error_text(code))
        raise KafkaException(KafkaError(code, self._native.error_text(code)))

    def produce_batch(  # noqa: PLR0917 -- a batch is these parallel lists
        self,
        topic: str,
        partitions: list[int],
        keys: list[bytes],
        values: list[bytes],
        headers: list[tuple[str, str | bytes | None]],
        reports: dict[int, Report],
    ) -> None:
        """Produce ``keys[i]``/``values[i]`` to ``partitions[i]``, the records at the
        indexes in ``reports`` with those callbacks; serves reports while the queue is
        full."""
        callbacks = sorted(reports.items())
        start = 0
        while True:
            produced = self._native.produce_batch(
                topic, partitions, keys, values, headers, callbacks, start
            )
            start, code = produced.next, produced.code
            if code == 0:
                return
            if code != _QUEUE_FULL:
                raise KafkaException(KafkaError(code, self._native.error_text(code)))
            self.poll(0.1)

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve callbacks for up to ``timeout_s``: delivery reports, failures of
        records without one, client errors. How many reports were served."""
        polled = self._native.poll(int(timeout_s * 1000))
        streamed = polled.streamed
        if streamed and self.on_streamed is not None:
            self.on_streamed(streamed)
        for failure in polled.unreported_failures:
            if self.unreported_failure is None:
                self.unreported_failure = (
                    f"delivery to {failure.topic} [{failure.partition}] failed: "
                    f"{self._native.error_text(failure.code)}"
                )
        for error in polled.client_errors:
            self._error_cb(KafkaError(error.code, error.reason))
        return polled.served

    def flush(self, timeout_s: float = -1) -> int:
        """Wait for every queued record, serving its report; the records left."""
        remaining = self._native.flush(int(timeout_s * 1000) if timeout_s >= 0 else -1)
        self.poll(0)
        return remaining

    def __len__(self) -> int:
        return len(self._native)


RecordProducer = Producer | NativeProducer
"""The producer the publisher uses: confluent-kafka's, or the compiled one."""
