"""The lake: apply's Delta tables, where they live, and the two writers that commit to them.

- where a table lives and who may commit to it: :mod:`.tables`, :mod:`.table_lock`;
- what a table holds: its columns (:mod:`.delta_schema`), its commit files
  (:mod:`.delta_log`), the applied state each apply commit carries (:mod:`.positions`)
  and read back from its history (:mod:`.history`), what the job's own last commit left
  (:mod:`.known_tables`);
- the records decoded for the writers (:mod:`.decode`) and the two writers of a MERGE:
  Spark's (:mod:`.spark_merge`) and the driver's, with delta-rs (:mod:`.driver_plan`,
  :mod:`.driver_merge`);
- the job's other tables and commits: the dead-letter table (:mod:`.dead_letter`), the
  fold of the retired change log (:mod:`.retired_log`), compaction and vacuum
  (:mod:`.upkeep`).

Nothing here knows a micro-batch's stages (:mod:`apply.batch`) or the control topic
(:mod:`apply.control`): they use the lake, never the other way round.
"""
