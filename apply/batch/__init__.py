"""Apply one micro-batch of change records to the lake: the body of ``foreachBatch``.

A batch flows in one direction through named stages, one module each:

- :mod:`.micro_batch` (:func:`apply_batch`): survey the batch once (topics, partitions,
  offsets, writer fingerprints; :func:`apply.lake.decode.survey`), then run every table's
  part at the same time (:mod:`apply.batch.table_pool`), each by :func:`apply_table`
  (:mod:`.table`):

  1. **read** (:mod:`.read`): check the records against the contract and read what the
     lake holds: the table's history and applied state (:mod:`apply.lake.history`), or what
     the job's own last commit left while no commit followed it
     (:mod:`apply.lake.known_tables`) -- nothing is kept that Delta does not hold, so a
     restarted job behaves exactly like a running one. A batch the state already covers
     stops here and commits nothing;
  2. **plan** (:mod:`.plan`): decode the records with their writer schemas
     (:mod:`apply.lake.decode`), plan the table's columns (create it on first sight, add new
     columns, :mod:`apply.lake.delta_schema`), measure the batch per partition and compute
     the new state (:mod:`apply.lake.positions`);
  3. **write** (:mod:`.write`): drop replays, reduce to the latest change per key and
     MERGE it into the table (:mod:`apply.lake.spark_merge`, or from the driver
     :mod:`apply.lake.driver_merge`), with the state in the same commit; then, when the
     commits took the table's version past its turn, compact or vacuum it in the same
     task, so the write is its only writer (:mod:`apply.lake.upkeep`);

  and **park** (:mod:`.park`) the tables that failed for a definite reason.
- **publish**: the job (:mod:`apply.app`) turns the result into control messages
  (:func:`apply.control.progress.batch_progress`) and publishes them (:mod:`apply.control.feedback`)
  after every commit of the batch.

A table that fails for a definite reason (:class:`~apply.errors.TableError`), or is
errored since an earlier batch, is **parked** instead: its records of the batch go to
the dead-letter table (:mod:`apply.lake.dead_letter`), all parked tables of the batch in one
commit, after the other tables finished.

Guarantees:

- Every record of the batch ends up applied, superseded, dropped as a replay or
  tombstone, or parked; the control messages made from the result
  (:func:`apply.control.progress.batch_progress`) never claim a record that is neither in its
  lake table nor parked.
- A table never blocks another: a definite error parks only its own table, and an
  errored table stays parked, batch after batch, until ``python -m apply reapply``
  (:mod:`apply.reapply`) applied its records and released it.
- A transient failure (any error that is not a :class:`~apply.errors.TableError`) fails
  the whole batch, once every table's task has finished, and parks nothing: the retried
  batch is idempotent. Each table has either the whole batch committed or nothing;
  tables that committed it are skipped by their ``txnVersion``, or because their state
  already covers the batch's offsets.
- A batch whose offsets the table's state already covers (a replay under the same id,
  or the same records under a later id after a lost checkpoint) commits nothing: no new
  version in any table, the dead-letter table included.
- All writer fingerprints are resolved before any table is touched: an unknown one
  raises :class:`~apply.errors.UnknownSchemaError` and nothing is written. Asked again
  after the schema topic was re-read (``park_missing_schemas``), a table whose schemas
  are still missing is parked instead, so one lost schema blocks only its table.
- Batch ids never go backwards for a table within one query: a skipped MERGE must be a
  replay of the table's newest apply commit, and a covered batch may not have a lower id
  than that commit's when the same query wrote it (a lane that took the table over
  counts its own ids, :mod:`apply.lanes`);
  anything else means batch ids restarted under the same ``txnAppId`` (a checkpoint
  reset in place), which would skip new data, so it raises
  :class:`~apply.errors.ConfigError`.
"""

from apply.batch.context import ApplyContext
from apply.batch.micro_batch import apply_batch
from apply.batch.read import applied_state, recorded_state
from apply.batch.table import apply_table

__all__ = ["ApplyContext", "applied_state", "apply_batch", "apply_table", "recorded_state"]
