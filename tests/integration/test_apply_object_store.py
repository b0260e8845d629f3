"""The apply job with its lake and its streaming checkpoint on a real S3-compatible store
(MinIO, :mod:`tests.plugins.objectstore`), through Hadoop's S3A (``s3a://``).

``python -m apply`` runs as a process, configured only through its environment as a user
runs it: both roots are ``s3a://`` URLs, the object-store jars come through
``APPLY_SPARK__JARS`` and the S3A settings through ``APPLY_SPARK__CONF``, the keys
through ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` only.

- Inserts, then updates and deletes MERGEd into the files the inserts wrote, are
  applied, and the table read back from the bucket by another client (delta-rs over the
  S3 API) equals the source. Spark's reads through S3A are the job's own: the second
  round's MERGE reads the first round's files, and a restart reads the log and the
  checkpoint. (A third JVM only to read the table back through S3A again cost a minute
  of the suite's busiest worker and proved nothing these do not.)
- The objects are in MinIO: the table's Delta log and data files and the checkpoint are
  listed, and the log read, through the S3 API, so the test cannot pass against a local
  path.
- The batches are the driver's (delta-rs over the S3 API, reaching the bucket through
  the job's own S3A settings, :mod:`apply.lake.driver_store`): every commit that carries
  a batch is delta-rs's.
- A restart resumes from the s3a checkpoint without re-applying: the checkpoint is cut
  back to before the commit record of the table's last batch, as a crash between the
  Delta commit and the checkpoint's commit leaves it. The restarted job replays that
  batch and no earlier one, commits nothing for it (the table's version stays), and goes
  on with new changes; no two commits of the Delta log carry the same batch (``txn``
  version).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from psycopg import sql

from tests.plugins.capture import CaptureThread, capture_settings
from tests.plugins.objectstore import ObjectStore
from tests.plugins.pipeline import Service, wait_service_applied
from tests.plugins.services import Services
from tests.plugins.waiting import wait_for

# Started by this test's first use of the session's MinIO, a cold build of MinIO with
# `go install` takes about ten minutes and the jar set another minute or more.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2700)]
Connection = psycopg.Connection[tuple[Any, ...]]
COLUMNS = ["id", "owner", "balance"]


def _table(name: str) -> sql.Identifier:
    return sql.Identifier(name, "accounts")


def _create_table(pg: Connection, name: str) -> None:
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    pg.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, owner text NOT NULL, balance bigint)").format(
            _table(name)
        )
    )


def _inserts(pg: Connection, name: str) -> None:
    pg.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, 'owner-' || g, g * 10 FROM generate_series(1, 20) g"
        ).format(_table(name))
    )


def _updates_and_deletes(pg: Connection, name: str) -> None:
    table = _table(name)
    pg.execute(sql.SQL("UPDATE {} SET balance = balance + 100 WHERE id <= 5").format(table))
    pg.execute(sql.SQL("DELETE FROM {} WHERE id BETWEEN 6 AND 8").format(table))
    pg.execute(sql.SQL("INSERT INTO {} VALUES (21, 'owner-21', NULL)").format(table))


def _changes_after_restart(pg: Connection, name: str) -> None:
    table = _table(name)
    pg.execute(sql.SQL("UPDATE {} SET owner = 'renamed' WHERE id = 1").format(table))
    pg.execute(sql.SQL("DELETE FROM {} WHERE id = 21").format(table))


EXPECTED = [
    *[(i, f"owner-{i}", i * 10 + 100) for i in range(1, 6)],
    *[(i, f"owner-{i}", i * 10) for i in range(9, 21)],
    (21, "owner-21", None),
]
EXPECTED_AFTER_RESTART = [(1, "renamed", 110), *EXPECTED[1:-1]]


def _apply_service(
    services: Services, store: ObjectStore, jars: list[str], name: str, workdir: Path
) -> Service:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("APPLY_", "CAPTURE_", "CDC_", "PYSPARK_", "SPARK_", "AWS_"))
    }
    conf = {
        **store.spark_conf(),
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "1g",
        "spark.log.level": "WARN",
    }
    env |= store.credentials_env() | {
        "PYSPARK_PYTHON": sys.executable,
        "APPLY_KAFKA__BOOTSTRAP_SERVERS": services.kafka_bootstrap_servers,
        "APPLY_KAFKA__TOPIC_PREFIX": name,
        "APPLY_KAFKA__CONTROL_TOPIC": f"{name}._control",
        "APPLY_KAFKA__SCHEMA_TOPIC": f"{name}._schemas",
        "APPLY_LAKE__ROOT": store.url(f"{name}/lake"),
        "APPLY_LAKE__CHECKPOINT_ROOT": store.url(f"{name}/checkpoints"),
        "APPLY_TRIGGER__INTERVAL": "1 second",
        "APPLY_SPARK__MASTER": "local[2]",
        "APPLY_SPARK__APP_NAME": name,
        "APPLY_SPARK__JARS": json.dumps(jars),
        "APPLY_SPARK__CONF": json.dumps(conf),
        "APPLY_METRICS__ENABLED": "false",
    }
    workdir.mkdir(parents=True, exist_ok=True)
    return Service("apply", [sys.executable, "-m", "apply"], env, workdir / "apply.log")


def _lake_rows(store: ObjectStore, url: str) -> list[tuple[Any, ...]]:
    """The table as delta-rs reads it from the bucket over the S3 API."""
    from deltalake import DeltaTable, QueryBuilder  # noqa: PLC0415

    table = DeltaTable(url, storage_options=store.delta_rs_options())
    result = QueryBuilder().register("t", table).execute("SELECT id, owner, balance FROM t")
    rows = [tuple(row[c] for c in COLUMNS) for row in pa.table(result.read_all()).to_pylist()]
    return sorted(rows, key=lambda row: row[0])


def _source_rows(pg: Connection, name: str) -> list[tuple[Any, ...]]:
    return pg.execute(
        sql.SQL("SELECT id, owner, balance FROM {} ORDER BY id").format(_table(name))
    ).fetchall()


def _commits(store: ObjectStore, log_prefix: str) -> dict[int, list[dict[str, Any]]]:
    """The Delta log's commits by version, each a list of its actions, read from MinIO."""
    commits = {}
    for key in store.client.list_keys(store.bucket, log_prefix):
        found = re.fullmatch(r"(\d{20})\.json", key.rsplit("/", 1)[-1])
        if found:
            text = store.client.get_object(store.bucket, key).decode()
            commits[int(found.group(1))] = [json.loads(line) for line in text.split("\n") if line]
    return commits


def _batches(commits: dict[int, list[dict[str, Any]]]) -> list[int]:
    """The batch ids (``txn`` versions) the commits carry, in commit order."""
    return [
        action["txn"]["version"]
        for version in sorted(commits)
        for action in commits[version]
        if "txn" in action
    ]


def _writers(commits: dict[int, list[dict[str, Any]]]) -> set[str]:
    """Who wrote the commits that carry a batch: ``delta-rs`` (its ``clientVersion``)
    or the ``engineInfo`` of Delta's Spark writer."""
    writers = set()
    for actions in commits.values():
        if any("txn" in action for action in actions):
            info = next(action["commitInfo"] for action in actions if "commitInfo" in action)
            client = str(info.get("clientVersion", ""))
            writers.add("delta-rs" if client.startswith("delta-rs") else info.get("engineInfo"))
    return writers


def _checkpoint_batches(store: ObjectStore, prefix: str) -> list[int]:
    """Batch ids with a file under the checkpoint's ``prefix`` (``.../commits/``)."""
    names = (key.rsplit("/", 1)[-1] for key in store.client.list_keys(store.bucket, prefix))
    return sorted(int(n) for n in names if n.isdigit())


def test_lake_and_checkpoint_on_s3_apply_and_resume_without_reapplying(
    services: Services,
    object_store: ObjectStore,
    objectstore_jars: list[str],
    pg: Connection,
    unique_name: str,
    tmp_path: Path,
) -> None:
    from deploy.local.jars import resolve, spark_jars  # noqa: PLC0415 - resolves when run

    resolve("spark")
    jars = spark_jars() + objectstore_jars
    names = [Path(jar).name for jar in jars]
    assert any(n.startswith("hadoop-aws-") for n in names), names
    # The wheel's shaded Hadoop client is the only one: no hadoop-client jar from the
    # object-store set or Delta's closure may sit beside it.
    assert not [n for n in names if n.startswith("hadoop-client")], names

    name = unique_name
    store = object_store
    _create_table(pg, name)
    workdir = tmp_path / "apply"
    apply = _apply_service(services, store, jars, name, workdir)
    capture = CaptureThread(capture_settings(services, name, [f"{name}.accounts"]))
    table_prefix = f"{name}/lake/{name}/accounts/"
    commits_prefix = f"{name}/checkpoints/apply/commits/"
    try:
        capture.start(pg)
        apply.start()
        # Two rounds, each waited for: the second one's updates and deletes are MERGEd
        # into the files the first wrote to the bucket, and the table gets commits of
        # more than one batch, so the restart below has earlier batches to not re-run.
        _inserts(pg, name)
        wait_service_applied(pg, name, apply, timeout_s=600)
        _updates_and_deletes(pg, name)
        wait_service_applied(pg, name, apply, timeout_s=600)
        source = _source_rows(pg, name)
        # The exit status is not judged: SIGTERM reaches the JVM's group too, and the
        # checkpoint and the lake below are what the test is about.
        apply.terminate()

        assert source == EXPECTED
        assert _lake_rows(store, store.url(table_prefix)) == source
        keys = store.client.list_keys(store.bucket, f"{name}/")
        assert [k for k in keys if k.startswith(f"{table_prefix}_delta_log/")], keys
        assert [k for k in keys if k.startswith(f"{table_prefix}") and k.endswith(".parquet")]
        assert [k for k in keys if k.startswith(commits_prefix)], keys

        # Cut the checkpoint back to where a crash right after the Delta commit of the
        # table's last batch leaves it: that batch's offsets written, its commit not,
        # and no later batch planned.
        commits = _commits(store, f"{table_prefix}_delta_log/")
        batches = _batches(commits)
        assert len(batches) >= 2, batches
        assert batches == sorted(set(batches)), f"a batch committed twice: {batches}"
        # The batches are the driver's: delta-rs committed them over the S3 API, reaching
        # MinIO through the job's S3A settings (apply/lake/driver_store.py).
        assert _writers(commits) == {"delta-rs"}, _writers(commits)
        last = batches[-1]
        for batch in _checkpoint_batches(store, commits_prefix):
            if batch >= last:
                store.client.delete_object(store.bucket, f"{commits_prefix}{batch}")
        offsets_prefix = f"{name}/checkpoints/apply/offsets/"
        for batch in _checkpoint_batches(store, offsets_prefix):
            if batch > last:
                store.client.delete_object(store.bucket, f"{offsets_prefix}{batch}")
        assert all(batch < last for batch in _checkpoint_batches(store, commits_prefix))

        apply.start()
        wait_for(
            lambda: last in _checkpoint_batches(store, commits_prefix),
            f"the restarted job to replay batch {last}",
            timeout_s=600,
        )
        # The replayed batch wrote nothing: the table has no new version.
        assert sorted(_commits(store, f"{table_prefix}_delta_log/")) == sorted(commits)
        restarted_log = apply.tail(200_000).rsplit("==== start apply at", 1)[-1]
        replayed = rf"batch {last} table {name}\.accounts: .*committed=False"
        assert re.search(replayed, restarted_log), restarted_log[-4000:]
        # Resumed from the checkpoint: no batch before the replayed one ran again.
        ran = [int(b) for b in re.findall(r"batch (\d+) table", restarted_log)]
        assert min(ran) == last, ran

        _changes_after_restart(pg, name)
        wait_service_applied(pg, name, apply, timeout_s=600)
        source = _source_rows(pg, name)
        apply.terminate()
    finally:
        if apply.running():
            apply.kill()
        capture.close(pg)
        pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
    assert not capture.errors, capture.errors

    assert source == EXPECTED_AFTER_RESTART
    assert _lake_rows(store, store.url(table_prefix)) == source
    after = _commits(store, f"{table_prefix}_delta_log/")
    batches_after = _batches(after)
    assert len(after) > len(commits), "the changes after the restart made no commit"
    assert batches_after[: len(batches)] == batches
    assert batches_after == sorted(set(batches_after)), f"a batch committed twice: {batches_after}"
    assert batches_after[len(batches)] > last
