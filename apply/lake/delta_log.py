"""A Delta table's commit files read on the driver: no Spark job.

Every batch used to ask Delta for a table's history twice (its applied state before
the MERGE, the MERGE's own commit after it) and for its details once (the columns and
the properties apply keeps there): five Spark jobs per table and batch, and the planning
around each, where the answer is one or two small JSON files. Measured with
``bench/batch_profile.py`` (docs/benchmarks.md), those reads were a fifth of a batch's
jobs.

What the Delta protocol guarantees, and this module relies on: commit ``n`` of a table
is the file ``_delta_log/<n, 20 digits>.json``, written once, atomically and only if
absent (the log store's put-if-absent), and versions follow each other without gaps. So
when ``<v + 1>.json`` does not exist, ``v`` is the newest version, and a commit's
actions (``commitInfo`` with its ``operationMetrics`` and ``userMetadata``, ``txn``
with the writer's ``appId`` and ``version``) are one JSON object per line. Commit files
live for ``delta.logRetentionDuration`` (30 days), far longer than a batch.

A commit file is newline-delimited JSON: actions are separated by ``\n`` and nothing
else. JSON lets a string carry U+2028, U+2029, U+0085, ``\x1c``-``\x1e``, ``\x0b`` and
``\x0c`` raw, and Delta writes them so (a text column's min/max statistics keep the
first 32 characters of a value, ``userMetadata`` and keys are the writer's own), so the
file is split on ``\n`` alone, never with ``str.splitlines``, which breaks a line at
each of those and turns one action into two halves that do not parse. A line that is
not a JSON object raises :class:`MalformedCommitError`, naming the version and line.

Files are read through the JVM's Hadoop file system, as Delta reads them, so every
lake Delta can write (local, ``s3a://``, ``abfss://``, ``gs://``) works the same; a
check is a ``stat`` (an HTTP HEAD on an object store), a read one ``GET``. Tables with
coordinated commits (commit files elsewhere until backfilled) are not created by
apply, which never turns that feature on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from pyspark.sql import SparkSession

from apply.errors import CommitFileError


def commit_file(table_path: str, version: int) -> str:
    """Where commit ``version`` of the table at ``table_path`` lives."""
    return f"{table_path.rstrip('/')}/_delta_log/{version:020d}.json"


@dataclass(frozen=True, slots=True)
class CommitFile:
    """One commit as its file holds it."""

    version: int
    operation: str
    metrics: Mapping[str, str]
    """``operationMetrics`` (values are decimal strings, as Delta writes them)."""
    user_metadata: str | None
    transactions: Mapping[str, int] = field(default_factory=dict)
    """``txn`` actions: application id to the version it committed."""
    added: tuple[str, ...] = ()
    """The paths of the data files the commit adds (``add`` actions), relative to the
    table, URL-encoded as Delta writes them."""

    def written_by(self, app_id: str, txn_version: int) -> bool:
        return self.transactions.get(app_id) == txn_version


class MalformedCommitError(ValueError):
    """A commit file holds a line that is not a Delta action: the table's log was written
    by something that does not follow the protocol, or damaged after it was written."""

    def __init__(self, version: int, line: int, reason: str) -> None:
        super().__init__(f"commit {version}, line {line}: {reason}")
        self.version = version
        self.line = line
        self.reason = reason


def parse_commit(version: int, text: str) -> CommitFile:
    """A commit file's ``commitInfo`` and ``txn`` actions; the others are left alone.

    Raises :class:`MalformedCommitError` for a line that is not a JSON object, or a
    ``commitInfo``/``txn`` action of the wrong shape."""
    info: dict[str, Any] = {}
    info_line = 0
    transactions: dict[str, int] = {}
    added: list[str] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError as exc:  # JSONDecodeError
            raise MalformedCommitError(version, number, f"not JSON ({exc})") from exc
        except RecursionError as exc:
            raise MalformedCommitError(version, number, "JSON nested too deeply") from exc
        if not isinstance(action, dict):
            raise MalformedCommitError(version, number, "not a JSON object")
        if "commitInfo" in action:
            info = _object(action["commitInfo"], version, number, "commitInfo")
            info_line = number
        elif "txn" in action:
            txn = _object(action["txn"], version, number, "txn")
            app_id, txn_version = txn.get("appId"), txn.get("version")
            if not isinstance(app_id, str) or type(txn_version) is not int:
                raise MalformedCommitError(
                    version, number, "a txn action without a string appId and an integer version"
                )
            transactions[app_id] = txn_version
        elif "add" in action:
            add = _object(action["add"], version, number, "add")
            if not isinstance(add.get("path"), str):
                raise MalformedCommitError(version, number, "an add action without a path")
            added.append(add["path"])
    raw_metrics = info.get("operationMetrics")
    metrics = _object(
        {} if raw_metrics is None else raw_metrics, version, info_line, "operationMetrics"
    )
    user_metadata = info.get("userMetadata")
    if user_metadata is not None and not isinstance(user_metadata, str):
        raise MalformedCommitError(version, info_line, "userMetadata is not a string")
    return CommitFile(
        version=version,
        operation=str(info.get("operation", "")),
        metrics={str(k): str(v) for k, v in metrics.items()},
        user_metadata=user_metadata,
        transactions=transactions,
        added=tuple(added),
    )


def local_path(uri: str) -> str | None:
    """The local file system path of a lake location: a plain path or a ``file:`` URI;
    None for any other scheme (an object store)."""
    if uri.startswith("file:"):
        return "/" + uri[len("file:") :].lstrip("/")
    return None if "://" in uri else uri


def _fsync(path: str, *, directory: bool = False) -> None:
    descriptor = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def sync_commits(table_path: str, first: int, last: int) -> int:
    """Make commits ``first`` to ``last`` of the local table at ``table_path`` durable:
    the data files each adds, the directories that hold them, each commit file and the
    log's directory, flushed to disk. Delta's writers (Spark's local log store, delta-rs)
    rename a commit into place without a flush, so a host crash can take back a commit
    that apply already reported applied, and capture would have confirmed its changes
    past the slot. Returns the number of files and directories flushed; 0 for a table
    that is not local (an object store's put is durable when it returns)."""
    root = local_path(table_path)
    if root is None or last < first:
        return 0
    directories = {os.path.join(root, "_delta_log")}
    if first <= 0:
        # The batch created the table: the directories that name its log, the table, its
        # schema and (a schema's first table) the schema's own may be new with it, and a
        # crash could take their entries back too.
        schema = os.path.dirname(root) or "."
        directories.update({root, schema, os.path.dirname(schema) or "."})
    files = 0
    for version in range(max(first, 0), last + 1):
        commit = os.path.join(root, "_delta_log", f"{version:020d}.json")
        with open(commit, encoding="utf-8") as file:
            parsed = parse_commit(version, file.read())
        for added in parsed.added:
            absolute = local_path(unquote(added)) if ":" in added.split("/")[0] else None
            data_file = absolute or os.path.join(root, unquote(added))
            _fsync(data_file)
            directories.add(os.path.dirname(data_file))
            files += 1
        _fsync(commit)
        files += 1
    for directory in sorted(directories):
        _fsync(directory, directory=True)
    return files + len(directories)


def newest_local_version(table_path: str) -> int | None:
    """The newest commit version in the log of the local table at ``table_path``, read
    from its directory; None when the table is not local or has no commit yet."""
    root = local_path(table_path)
    if root is None:
        return None
    try:
        names = os.listdir(os.path.join(root, "_delta_log"))
    except FileNotFoundError:
        return None
    versions = [int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit()]
    return max(versions, default=None)


def _object(value: object, version: int, line: int, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedCommitError(version, line, f"{what} is not a JSON object")
    return value


class DeltaLogFiles:
    """The commit files of Delta tables, through the session's Hadoop configuration."""

    def __init__(self, spark: SparkSession) -> None:
        context = spark.sparkContext
        self._jvm: Any = context._jvm
        self._conf: Any = context._jsc.hadoopConfiguration()

    def _path(self, table_path: str, version: int) -> tuple[Any, Any]:
        path = self._jvm.org.apache.hadoop.fs.Path(commit_file(table_path, version))
        return path, path.getFileSystem(self._conf)

    def exists(self, table_path: str, version: int) -> bool:
        """Whether commit ``version`` exists."""
        path, fs = self._path(table_path, version)
        return bool(fs.exists(path))

    def read(self, table_path: str, version: int) -> CommitFile | None:
        """Commit ``version``, or None when it does not exist."""
        path, fs = self._path(table_path, version)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            text = str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()
        try:
            return parse_commit(version, text)
        except MalformedCommitError as exc:
            raise CommitFileError(table_path, str(path), str(exc)) from exc

    def own_commit(
        self, table_path: str, after: int, app_id: str, txn_version: int
    ) -> tuple[CommitFile | None, int]:
        """The commit after version ``after`` that ``app_id`` wrote as ``txn_version``
        (None when there is none: Delta skipped the write as a duplicate), and the
        table's newest version."""
        version = after
        found = None
        while (commit := self.read(table_path, version + 1)) is not None:
            version = commit.version
            if found is None and commit.written_by(app_id, txn_version):
                found = commit
        return found, version


__all__ = [
    "CommitFile",
    "DeltaLogFiles",
    "MalformedCommitError",
    "commit_file",
    "local_path",
    "parse_commit",
    "sync_commits",
]
