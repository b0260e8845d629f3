"""What every micro-batch needs besides its records: where the lake is, the query's
``txnAppId``, the writer schemas, and the job's helpers (upkeep, what it keeps of its
own commits)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from apply.batch.held_batch import HeldBatchReader
from apply.lake.dead_letter import dead_letter_path
from apply.lake.driver_merge import DriverTables
from apply.lake.known_tables import KnownTables
from apply.lake.positions import AppliedState
from apply.lake.upkeep import TableUpkeep
from schemas.single_object import Fingerprint


@dataclass(frozen=True, slots=True)
class ApplyContext:
    """What every batch needs besides its records."""

    lake_root: str
    """Delta tables live at ``<lake_root>/<schema>/<table>`` (:mod:`apply.lake.tables`)."""
    txn_app_id: str
    """Delta ``txnAppId`` of the streaming query
    (:func:`apply.lake.spark_merge.transaction_app_id`)."""
    writer_schemas: Mapping[Fingerprint, str]
    """Writer schema JSON by fingerprint, as read from the schema topic. The mapping may
    grow between batches; it is read, never changed."""
    parallelism: int = 4
    """Tables of one batch applied at the same time."""
    schema_topic: str = "the schema topic"
    """Where ``writer_schemas`` come from, named in errors."""
    default_txn_app_id: str | None = None
    """The ``txnAppId`` of the one query the job runs without lanes
    (:func:`apply.app.checkpoint_location`): the writer of table states that name none,
    all written before lanes existed (:mod:`apply.lanes`). None: such states are taken
    as this query's."""
    upkeep: TableUpkeep | None = None
    """Compaction and vacuum after a table's commit (:mod:`apply.lake.upkeep`); None: none."""
    known: KnownTables | None = None
    """What the job's earlier batches committed to each table, used again while no
    commit followed (:mod:`apply.lake.known_tables`); None: every batch reads from Delta."""
    driver_write_records: int = 0
    """A batch of at most this many records is collected to the driver, and each table's
    part is MERGEd into the table from there with no Spark job
    (:mod:`apply.lake.driver_merge`); 0: never."""
    driver_tables: DriverTables | None = None
    """delta-rs's view of the tables the driver MERGEs into, kept between batches; None:
    every batch MERGEs with Spark."""
    checkpoint: str | None = None
    """The streaming query's checkpoint location, whose offset log gives a batch's
    offset ranges (:mod:`apply.batch.held_batch`); None outside a query."""
    held_reader: HeldBatchReader | None = None
    """Reads a small batch's records from Kafka in the driver (:mod:`apply.batch.held_batch`);
    None: a batch the driver writes is collected through Spark."""
    deletion_vectors: bool = False
    """Whether the tables apply creates have deletion vectors (only Spark's MERGE writes
    those: :mod:`apply.lake.driver_merge`)."""

    def wrote(self, state: AppliedState) -> bool:
        """Whether ``state`` was committed by this query (so its batch ids compare with
        this query's), rather than by another lane that held the table before."""
        writer = state.txn_app_id or self.default_txn_app_id
        return writer is None or writer == self.txn_app_id

    @property
    def dead_letter(self) -> str:
        """Location of the dead-letter table (:mod:`apply.lake.dead_letter`)."""
        return dead_letter_path(self.lake_root)
