"""Which lakes the driver's delta-rs writes, and how it reaches one on S3 from the job's
S3A settings."""

from __future__ import annotations

import pytest

from apply.lake.driver_store import LOCAL, DriverStore, driver_store


def _unset(_key: str) -> str | None:
    return None


@pytest.mark.parametrize("root", [".local/lake", "/data/lake", "file:///data/lake"])
def test_a_local_lake_is_reached_as_it_is(root: str) -> None:
    store = driver_store(root, _unset)
    assert store == LOCAL
    assert store is not None
    assert store.location(f"{root}/public/t") == f"{root}/public/t"


@pytest.mark.parametrize(
    "root", ["abfss://c@a.dfs.core.windows.net/lake", "gs://bucket/lake", "s3://bucket/lake"]
)
def test_only_spark_writes_a_lake_on_another_store(root: str) -> None:
    assert driver_store(root, _unset) is None


def test_an_s3a_lake_is_reached_over_s3_with_the_jobs_endpoint_and_a_conditional_put() -> None:
    hadoop = {
        "fs.s3a.endpoint": "127.0.0.1:9000",
        "fs.s3a.endpoint.region": "eu-west-1",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.access.key": "key",
        "fs.s3a.secret.key": "secret",
    }
    store = driver_store("s3a://bucket/lake", hadoop.get)
    assert store == DriverStore(
        {
            "aws_conditional_put": "etag",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "eu-west-1",
            "AWS_ACCESS_KEY_ID": "key",
            "AWS_SECRET_ACCESS_KEY": "secret",
        },
        s3=True,
    )
    assert store.location("s3a://bucket/lake/public/t") == "s3://bucket/lake/public/t"
    assert "secret" not in repr(store)


def test_an_s3a_lake_on_aws_leaves_endpoint_and_credentials_to_their_own_chain() -> None:
    """S3A's defaults (TLS on, no endpoint, keys from the environment or a role): delta-rs
    looks for them where S3A does."""
    store = driver_store("s3a://bucket/lake", _unset)
    assert store == DriverStore({"aws_conditional_put": "etag"}, s3=True)


def test_an_endpoint_without_a_scheme_takes_https_unless_tls_is_off() -> None:
    store = driver_store("s3a://b/lake", {"fs.s3a.endpoint": "s3.example.com"}.get)
    assert store is not None
    assert store.options["AWS_ENDPOINT_URL"] == "https://s3.example.com"
    assert "AWS_ALLOW_HTTP" not in store.options
