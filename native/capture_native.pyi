"""Types of the compiled row encoder (src/lib.rs says what it does)."""

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
