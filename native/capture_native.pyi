"""Types of the compiled row encoder and producer (src/lib.rs, src/producer.rs say
what they do)."""

from collections.abc import Callable, Sequence
from typing import Any

class TextRowEncoder:
    def __init__(
        self, kinds: list[str], key_columns: list[int], key_nullable: list[bool]
    ) -> None: ...
    def encode(self, values: tuple[bytes | None, ...], /) -> tuple[bytes, bytes] | None: ...
    def encode_change(
        self,
        message: bytes,
        key_header: bytes,
        value_start: bytes,
        change_lsn: int,
        value_middle: bytes,
        ordinal: int,
        /,
    ) -> tuple[bytes, bytes, bytes] | None: ...
    def encode_copy(
        self, data: bytes, key_header: bytes, value_head: bytes, first_ordinal: int, /
    ) -> tuple[list[bytes | None], list[bytes], bytes]: ...
    def __len__(self) -> int: ...

def key_partitions(keys: list[bytes], count: int, /) -> list[int]: ...

class Delivered:
    def __init__(self, topic: str, partition: int, offset: int, /) -> None: ...
    def topic(self) -> str: ...
    def partition(self) -> int: ...
    def offset(self) -> int | None: ...

class KafkaProducer:
    def __init__(self, library: str, config: list[tuple[str, str]], /) -> None: ...
    def produce(
        self,
        topic: str,
        partition: int,
        key: bytes,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]],
        on_delivery: Callable[[Any, Delivered], object] | None,
        /,
    ) -> int: ...
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
    ) -> tuple[int, int]: ...
    def poll(
        self, timeout_ms: int, /
    ) -> tuple[
        int,
        list[tuple[int, str, int]],
        list[tuple[int, str]],
        list[tuple[int, str, int, int, int, int]],
    ]: ...
    def flush(self, timeout_ms: int, /) -> int: ...
    def error_text(self, code: int, /) -> str: ...
    def library_version(self) -> str: ...
    def __len__(self) -> int: ...

class StreamLane:
    def __init__(
        self, producer: KafkaProducer, libpq: str, commit_header: str, change_header: str, /
    ) -> None: ...
    def arm(
        self,
        oid: int,
        encoder: Any,
        topic: str,
        key_header: bytes,
        publish_after: int,
        operations: list[tuple[int, bytes, tuple[str, bytes], tuple[str, bytes]]],
        /,
    ) -> None: ...
    def disarm(self) -> None: ...
    def read(self, connection: int, budget: int, /) -> tuple[int, bytes | None, int]: ...
    def take_transactions(self) -> list[tuple[int, int, bool, int, int, int]]: ...
    def take_counts(self) -> list[tuple[int, int, int, int]]: ...
    def transaction(self) -> tuple[int, int, int, int, int] | None: ...
    def adopt(
        self, transaction: tuple[int, int, int, int, int] | None, next_id: int, /
    ) -> None: ...
    def stop_at(self, lsn: int, /) -> None: ...
    def __len__(self) -> int: ...
