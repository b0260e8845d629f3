"""Where the driver's delta-rs reaches the lake: a local file system, or S3 through the
settings the job's Spark uses for it (Hadoop's S3A).

The driver writes a table only under the table's lock (:mod:`apply.lake.table_lock`),
whoever else in the job writes it, so on S3 its commits and Spark's never race inside
the job. What each needs from the store is to refuse a commit file that already exists:
Spark's ``S3SingleDriverLogStore`` checks that inside its own JVM, and delta-rs asks the
store itself with a conditional put (``If-None-Match: *``, which S3 has honoured since
2024, MinIO too; ``aws_conditional_put``). A store that refuses conditional puts makes
every driver commit fail; each batch then takes Spark's MERGE, as for any table the
driver cannot write.

delta-rs gets the S3A settings that say where and how to connect (endpoint, region,
TLS, and keys when the Hadoop configuration holds them); credentials that S3A takes from
elsewhere (the environment's ``AWS_*``, a profile, the instance's role) delta-rs takes
from the same places. Per-bucket S3A settings (``fs.s3a.bucket.<name>.*``) are not
read: a lake whose bucket needs them is written by Spark only. Other object stores
(``gs://``, ``abfss://``) are Spark's too."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

S3A_KEYS = (
    "fs.s3a.endpoint",
    "fs.s3a.endpoint.region",
    "fs.s3a.connection.ssl.enabled",
    "fs.s3a.access.key",
    "fs.s3a.secret.key",
    "fs.s3a.session.token",
)
"""The Hadoop settings :func:`driver_store` maps to delta-rs's storage options."""

_CREDENTIALS = {
    "fs.s3a.access.key": "AWS_ACCESS_KEY_ID",
    "fs.s3a.secret.key": "AWS_SECRET_ACCESS_KEY",
    "fs.s3a.session.token": "AWS_SESSION_TOKEN",
}


@dataclass(frozen=True, slots=True)
class DriverStore:
    """How delta-rs opens a table of the lake: its location for a table path and the
    storage options."""

    options: Mapping[str, str] = field(default_factory=dict)
    """delta-rs storage options (empty for a local lake)."""
    s3: bool = False
    """Whether table paths are ``s3a://`` URLs, which delta-rs knows as ``s3://``."""

    def location(self, path: str) -> str:
        """Where delta-rs finds the table at ``path`` (a path as the job names it)."""
        if self.s3 and path.startswith("s3a://"):
            return "s3://" + path[len("s3a://") :]
        return path

    def __repr__(self) -> str:
        # The options may hold a secret key: name them only.
        return f"DriverStore(s3={self.s3}, options={sorted(self.options)})"


LOCAL = DriverStore()
"""A lake on a local file system."""


def driver_store(lake_root: str, hadoop: Callable[[str], str | None]) -> DriverStore | None:
    """How the driver's delta-rs reaches the lake at ``lake_root``; None where only Spark
    writes it. ``hadoop``: a setting of the job's Hadoop configuration by name (None:
    not set)."""
    if "://" not in lake_root or lake_root.startswith("file:"):
        return LOCAL
    if not lake_root.startswith("s3a://"):
        return None
    options = {"aws_conditional_put": "etag"}
    tls = (hadoop("fs.s3a.connection.ssl.enabled") or "true").strip().lower() != "false"
    endpoint = (hadoop("fs.s3a.endpoint") or "").strip()
    if endpoint:
        if "://" not in endpoint:
            endpoint = ("https://" if tls else "http://") + endpoint
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    region = (hadoop("fs.s3a.endpoint.region") or "").strip()
    if region:
        options["AWS_REGION"] = region
    for key, option in _CREDENTIALS.items():
        value = hadoop(key)
        if value:
            options[option] = value
    return DriverStore(options, s3=True)


__all__ = ["LOCAL", "S3A_KEYS", "DriverStore", "driver_store"]
