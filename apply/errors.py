"""Errors of the apply job, classified by what happens next.

The classes are the shared ones of :mod:`runtime.errors`, plus the subclasses below;
what each means for apply:

- :class:`TransientError` -- the world may heal: retry the micro-batch. Nothing is lost,
  because a retried batch is idempotent (see :mod:`apply.lake.spark_merge`): tables that already
  committed it are skipped by Delta's transaction id, the others apply it.

  :class:`UnknownSchemaError` is one: the batch holds a writer fingerprint the job has
  not loaded yet. The capture publishes every schema before its first record, so the
  cure is to read the schema topic to its end again and retry.
- :class:`TableError` -- one table cannot go on until someone acts: an incompatible
  schema change (:class:`SchemaChangeError`), a record that does not decode
  (:class:`BadRecordError`), commit metadata that is not ours
  (:class:`CommitMetadataError`), a commit file that is not a Delta commit
  (:class:`CommitFileError`), records whose writer schema is still missing after
  the schema topic was read again (:class:`MissingSchemaError`). The table is parked:
  its records go to the dead-letter table (:mod:`apply.lake.dead_letter`) while the other
  tables go on, and
  ``python -m apply reapply <schema.table>`` applies them once the cause is fixed.
- :class:`ConfigError` -- the job was started wrong; fatal, with what to change.
  :class:`RetiredChangeLogError` is one: a change log left by the retired change log
  holds changes its table lacks, and the fold at start that puts them there failed
  (:mod:`apply.lake.retired_log`).

Foreign exceptions (Py4J, Spark, Delta) are translated at the boundary with
``raise X(...) from exc`` so the original stays attached. Messages name the table, the
Kafka coordinates and the fix, never a row value.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.errors import ConfigError, PipelineError, TableError, TransientError

__all__ = [
    "BadRecordError",
    "CommitFileError",
    "CommitMetadataError",
    "ConfigError",
    "MissingSchemaError",
    "PipelineError",
    "RetiredChangeLogError",
    "SchemaChangeError",
    "TableError",
    "TransientError",
    "UnknownSchemaError",
]


class UnknownSchemaError(TransientError):
    """Records name writer schemas the job has not loaded from the schema topic yet."""

    def __init__(self, topic: str, fingerprints: list[str]) -> None:
        super().__init__(
            f"topic {topic} holds records written with schema fingerprint(s) "
            f"{', '.join(fingerprints)} that are not loaded: read the schema topic to its "
            "end again and retry the batch"
        )
        self.topic = topic
        self.fingerprints = fingerprints


class MissingSchemaError(TableError):
    """The table's records name writer schemas the schema topic does not hold, even read
    to its end again: they were lost (retention, a compaction gone wrong, a different
    prefix), since the capture publishes every schema before its first record. Or they
    name Schema Registry ids the registry does not know (another registry, a schema
    deleted there)."""

    def __init__(
        self,
        table: str,
        topic: str,
        schema_topic: str,
        fingerprints: list[str],
        registry_ids: Sequence[int] = (),
    ) -> None:
        causes = []
        if fingerprints:
            causes.append(
                f"writer schema fingerprint(s) {', '.join(fingerprints)} that {schema_topic} "
                "does not hold, even read to its end again: restart the capture, which "
                f"publishes its schemas again, then run python -m apply reapply {table}"
            )
        if registry_ids:
            causes.append(
                f"Schema Registry id(s) {', '.join(str(i) for i in registry_ids)} that the "
                "registry does not know: check that APPLY_KAFKA__REGISTRY__URL names the "
                "registry capture writes to, then run python -m apply reapply "
                f"{table}; a schema deleted from the registry cannot be read back: resync "
                "the table (python -m capture resync) and discard its parked records"
            )
        super().__init__(table, f"records of {topic} name " + "; and ".join(causes))
        self.topic = topic
        self.fingerprints = fingerprints


class RetiredChangeLogError(ConfigError):
    """A retired change log's changes cannot be folded into their table at start
    (:mod:`apply.lake.retired_log`); the job must not stream past them."""

    def __init__(self, table: str, log_path: str, cause: str) -> None:
        super().__init__(
            f"table {table}: the retired change log at {log_path} holds changes the table "
            f"lacks, which the job folds into the table before it starts, but {cause}. Fix "
            "the cause and start the job again: the log is kept and nothing is lost. If the "
            "table was recreated or resynced since the log was written, the log is "
            f"superseded: resync the table (python -m capture resync {table}, then restart "
            f"capture) and move {log_path} out of the lake"
        )
        self.table = table
        self.log_path = log_path


class SchemaChangeError(TableError):
    """The table's columns changed in a way the Delta table cannot follow."""


class BadRecordError(TableError):
    """A record of the table's topic cannot be decoded with its writer schema."""

    def __init__(self, table: str, topic: str, partition: int, offset: int, reason: str) -> None:
        super().__init__(
            table,
            f"record at {topic}/{partition} offset {offset} {reason}: inspect it (e.g. "
            f"kcat -C -t {topic} -p {partition} -o {offset} -c 1) and fix the producer; "
            "the table's records are parked in the dead-letter table from this batch on. "
            "A record that can never be applied is set aside with: python -m apply discard "
            f"{table} {topic}/{partition}/{offset}, then python -m apply reapply {table}",
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset


class CommitMetadataError(TableError):
    """The Delta table's newest apply commit carries metadata this job cannot read."""


class CommitFileError(TableError):
    """A commit file in the Delta table's log is not a Delta commit: written by something
    that does not follow the protocol, or damaged since. No reader can trust the table's
    history past it, so the table is parked until its log is mended."""

    def __init__(self, table_path: str, file: str, reason: str) -> None:
        super().__init__(
            table_path,
            f"commit file {file} is not a Delta commit ({reason}): restore the file from a "
            "backup of the lake, or move the table aside and resync it "
            "(python -m capture resync SCHEMA.TABLE), then run python -m apply reapply "
            "SCHEMA.TABLE",
        )
        self.file = file


_REAPPLY = "python -m apply reapply {table}"
_RESYNC = (
    "resync it at the source: python -m capture resync {table}, then restart capture; the "
    "resync's TRUNCATE releases the table by itself (a reapply before the resync fails "
    "again)"
)
_CURES = {
    SchemaChangeError.__name__: _RESYNC,
    MissingSchemaError.__name__: (
        "restart the capture, which publishes its schemas again (or point "
        "APPLY_KAFKA__REGISTRY__URL at capture's registry), then run " + _REAPPLY
    ),
    BadRecordError.__name__: (
        "inspect the record the error names and fix the producer; one that can never be "
        "applied is set aside with python -m apply discard {table} TOPIC/PARTITION/OFFSET; "
        "then run " + _REAPPLY
    ),
    CommitMetadataError.__name__: (
        "restore the table's history from a backup of the lake, then run "
        + _REAPPLY
        + "; or "
        + _RESYNC
    ),
    CommitFileError.__name__: (
        "restore the commit file from a backup of the lake, then run "
        + _REAPPLY
        + "; or move the table aside and "
        + _RESYNC
    ),
}
_DEFAULT_CURE = (
    "fix the cause the error names (the producer, a foreign table), then run " + _REAPPLY
)


def parked_cure(error_kind: str, table: str) -> str:
    """What releases a table parked by an error of class ``error_kind`` (its name, as the
    dead-letter table records it): a schema change needs a resync at the source, which
    releases the table by itself; the other errors a fix, then ``reapply``."""
    return _CURES.get(error_kind, _DEFAULT_CURE).format(table=table)
