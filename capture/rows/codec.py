"""One table version's codec: from a tuple's column values to a record's key and value.

A :class:`TableCodec` is built from a Relation (streamed, or read from the catalog for a
snapshot) and the contract type of each of its columns (:mod:`capture.rows.typemap`);
it holds the table's Avro schemas, its topic, the parser of every column and, where
every column arrives as text, the compiled row encoder (:mod:`capture.rows.native`).
The stream and the snapshot both encode rows with it, so a row reads the same whichever
path it took.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from capture.errors import TableError
from capture.pgoutput import ColumnKind, Relation, TupleData
from capture.publish.schema_registration import Framer, single_object
from capture.rows.native import RowEncoder, row_encoder
from capture.rows.typemap import ColumnMapping
from schemas.change_record import (
    ChangeEncoder,
    Column,
    TableDescription,
    TableSchemas,
    build_table_schemas,
)
from schemas.naming import table_topic

if TYPE_CHECKING:
    from capture_native import EncodedRow

DescribeColumns = Callable[[Relation], Sequence[ColumnMapping]]
"""Maps a Relation's columns to contract types; may query the catalog."""

RecordPrefix = tuple[bytes, tuple[str, bytes], tuple[str, bytes]]
"""The value's header and ``op``, and the ``op`` and fingerprint headers, of one table
version and operation."""

_UNCHANGED = ColumnKind.UNCHANGED_TOAST
_BINARY = ColumnKind.BINARY


class TableCodec:
    """Everything needed to turn one relation's tuples into records."""

    __slots__ = (
        "_all_text",
        "_columns",
        "_parsers",
        "_table",
        "compiled",
        "encoder",
        "key_indexes",
        "names",
        "record_prefixes",
        "relation",
        "schemas",
        "topic",
    )

    def __init__(
        self,
        relation: Relation,
        mappings: Sequence[ColumnMapping],
        topic_prefix: str,
        framer: Framer = single_object,
        *,
        compiled: bool = True,
    ) -> None:
        """``framer`` gives the record headers (:mod:`capture.publish.schema_registration`): in
        registry mode it registers the schemas first, and may raise TransientError.
        ``compiled``: use the compiled row encoder where it applies
        (:mod:`capture.rows.native`); off only to measure or test the Python path."""
        if len(mappings) != len(relation.columns):
            raise ValueError("one mapping per relation column is required")
        description = TableDescription(
            schema=relation.namespace,
            table=relation.name,
            columns=tuple(
                Column(name=c.name, type=m.column_type, key=c.is_key)
                for c, m in zip(relation.columns, mappings, strict=True)
            ),
        )
        self.relation = relation
        self.schemas: TableSchemas = build_table_schemas(description)
        self.topic = table_topic(topic_prefix, relation.namespace, relation.name)
        # The type mapping hands over Avro physical values (ints, unscaled decimal bytes),
        # so the encoder skips its logical-type conversions.
        self.encoder = ChangeEncoder(
            self.schemas, physical_values=True, framing=framer(self.schemas, self.topic)
        )
        self.names = self.schemas.field_names
        self.key_indexes = tuple(i for i, c in enumerate(relation.columns) if c.is_key)
        self._parsers = tuple(m.parse for m in mappings)
        self._columns = tuple(zip(self.names, self._parsers, strict=True))
        self._all_text = (ColumnKind.TEXT,) * len(self.names)
        self._table = f"{relation.namespace}.{relation.name}"
        self.compiled: RowEncoder | None = None
        self.record_prefixes: dict[int, RecordPrefix] = {}
        """By pgoutput tag, what every record the compiled encoder writes whole for this
        table version shares, whatever its transaction (``ChangeStream._shape``)."""
        """Encodes an all-text row to the bytes of its image and key (``encode_texts``)."""
        if compiled:
            self.compiled = row_encoder(
                [m.text_kind for m in mappings],
                self.key_indexes,
                [self.schemas.description.columns[i].nullable for i in self.key_indexes],
            )

    @property
    def table(self) -> str:
        return self._table

    def row(self, data: TupleData) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The row image of ``data`` and the names of its unchanged-TOAST columns."""
        if len(data.values) != len(self.names):
            raise TableError(
                self.table,
                f"a tuple has {len(data.values)} columns, the relation {len(self.names)}: "
                "the stream and the relation cache disagree; restart capture",
            )
        row: dict[str, Any] = {}
        if data.kinds == self._all_text:
            # Every column sent as text, the usual case: nothing is null or unchanged.
            texts = cast("tuple[bytes, ...]", data.values)
            for (name, parse), text in zip(self._columns, texts, strict=True):
                row[name] = parse(text)
            return row, ()
        unchanged: list[str] = []
        for name, kind, value, parse in zip(
            self.names, data.kinds, data.values, self._parsers, strict=True
        ):
            if value is not None:
                row[name] = parse(value)
            else:
                row[name] = None
                if kind is ColumnKind.UNCHANGED_TOAST:
                    unchanged.append(name)
        return row, tuple(unchanged)

    def encode_texts(self, data: TupleData) -> EncodedRow | None:
        """The encoded row fields and key fields of ``data`` by the compiled encoder, for
        :meth:`ChangeEncoder.encode_encoded_after` and ``encode_encoded_key``; None when
        the row takes the Python path (:meth:`row`): no compiled encoder for the table, a
        column neither text nor null (unchanged TOAST, binary), or a text the encoder
        leaves to the Python parsers."""
        compiled = self.compiled
        if compiled is None:
            return None
        kinds = data.kinds
        # None in ``values`` must mean NULL: unchanged TOAST is None too.
        if kinds != self._all_text and (_UNCHANGED in kinds or _BINARY in kinds):
            return None
        return compiled.encode(data.values)

    def key_of(self, row: dict[str, Any]) -> tuple[Any, ...]:
        names = self.names
        return tuple(row[names[i]] for i in self.key_indexes)
