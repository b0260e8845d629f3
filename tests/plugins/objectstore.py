"""A real S3-compatible object store for the tests that put the lake and the streaming
checkpoints on ``s3a://``: one MinIO for the whole session (:mod:`deploy.local.minio`),
with one bucket, and the Spark settings and jars that reach it.

Started by the first test that asks. The MinIO binary is built with ``go install`` the
first time on a machine (about ten minutes) and the object-store jar set
(deploy/jars/objectstore/pom.xml, about 690 MB) resolved with Maven the first time in a
checkout; neither is part of ``make jars`` or the bootstrap. Without ``go`` the tests
that need MinIO are skipped with the reason, except in CI (``CI=true``), where a
missing prerequisite or a failed build fails them: CI must never pass by not looking.

Invariants:

- The root credentials are drawn at random for each session and reach MinIO and the
  Spark driver through the environment only (``AWS_ACCESS_KEY_ID`` /
  ``AWS_SECRET_ACCESS_KEY``, read by S3A's ``EnvironmentVariableCredentialsProvider``);
  they are never written to a file, and no Spark or Hadoop conf carries them.
- Each test writes under its own prefix of the bucket (its unique name), so tests share
  the server without sharing objects.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy.local.errors import MissingPrerequisite
from deploy.local.minio import REGION, LocalMinio, S3Client, running_minio
from deploy.local.sigv4 import Credentials
from tests.plugins.prerequisites import missing

BUCKET = "cdc-tests"
CREDENTIALS_PROVIDER = (
    "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"
)


@dataclass(frozen=True, slots=True)
class ObjectStore:
    """The session's MinIO and its bucket."""

    server: LocalMinio
    bucket: str

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def client(self) -> S3Client:
        return self.server.client()

    def url(self, key: str) -> str:
        """The ``s3a://`` URL of ``key`` in the bucket."""
        return f"s3a://{self.bucket}/{key.strip('/')}"

    def credentials_env(self) -> dict[str, str]:
        """What a process needs in its environment to reach the bucket through S3A."""
        return {
            "AWS_ACCESS_KEY_ID": self.server.credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": self.server.credentials.secret_key,
        }

    def spark_conf(self) -> dict[str, str]:
        """The Spark confs of an apply job whose lake is in the bucket; no secret among
        them (:meth:`credentials_env`)."""
        return {
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": REGION,
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.aws.credentials.provider": CREDENTIALS_PROVIDER,
        }

    def delta_rs_options(self) -> dict[str, str]:
        """delta-rs storage options reading the bucket over the S3 API (another client
        than the job's S3A, so what it reads is what the store holds)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
            "AWS_FORCE_PATH_STYLE": "true",
            "AWS_ACCESS_KEY_ID": self.server.credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": self.server.credentials.secret_key,
        }


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    """A MinIO on loopback with the bucket :data:`BUCKET`, for the whole session."""
    credentials = Credentials(f"cdc-{secrets.token_hex(4)}", secrets.token_urlsafe(24))
    root: Path = tmp_path_factory.mktemp("minio")
    try:
        with running_minio(root, credentials, buckets=[BUCKET]) as server:
            yield ObjectStore(server, BUCKET)
    except MissingPrerequisite as exc:
        missing(f"no MinIO for the object-store tests: {exc}", exc)


@pytest.fixture(scope="session")
def objectstore_jars() -> list[str]:
    """The object-store jars for ``spark.jars`` (resolved with Maven the first time),
    minus whatever the pyspark wheel already ships."""
    from apply.engine.spark_jars import spark_jars  # noqa: PLC0415 - pyspark loads only when used
    from deploy.local.jars import resolve  # noqa: PLC0415

    return spark_jars(resolve("objectstore"))
