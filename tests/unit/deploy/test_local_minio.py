"""The MinIO launcher's decisions that need no server: when it builds, what it says when
it cannot, what it takes for an endpoint, and how it reads S3's errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.local import minio
from deploy.local.errors import MissingPrerequisite
from deploy.local.sigv4 import Credentials


def test_a_binary_that_is_there_is_never_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = tmp_path / "minio"
    binary.write_bytes(b"")
    monkeypatch.setattr("shutil.which", lambda _: pytest.fail("looked for go"))
    assert minio.build_minio(binary) == binary


def test_without_go_the_error_names_go_and_the_pinned_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shutil.which", lambda _: None)
    with pytest.raises(MissingPrerequisite, match=r"`go`.*github.com/minio/minio@v0\.0\.0-"):
        minio.build_minio(tmp_path / "minio")
    assert not (tmp_path / "minio").exists()


def test_the_build_installs_the_pinned_pseudo_version() -> None:
    assert minio.build_command("/usr/bin/go") == [
        "/usr/bin/go",
        "install",
        f"github.com/minio/minio@{minio.VERSION}",
    ]
    # A pseudo-version: go install pkg@version takes it; MinIO's RELEASE tags are not semver.
    assert minio.VERSION.startswith("v0.0.0-")


def test_an_endpoint_is_http_or_https() -> None:
    credentials = Credentials("user", "password")
    minio.S3Client("https://store.example:9000", credentials)
    with pytest.raises(ValueError, match="http:// or https://"):
        minio.S3Client("file:///tmp/bucket", credentials)


def test_s3_errors_are_read_from_their_xml_body() -> None:
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchBucket</Code>'
        b"<Message>The specified bucket does not exist</Message></Error>"
    )
    assert minio._error_code(body) == "NoSuchBucket: The specified bucket does not exist"
    assert minio._error_code(b"plain text") == "plain text"


def test_the_binary_is_cached_outside_the_clone_under_its_version(tmp_path: Path) -> None:
    # Every fresh clone on the machine (each CI run) finds the build of an earlier one.
    assert minio.cached_binary({"CDC_TOOLS_CACHE": str(tmp_path)}) == (
        tmp_path / f"minio-{minio.VERSION}"
    )
    assert minio.tools_cache({"XDG_CACHE_HOME": str(tmp_path)}) == (
        tmp_path / "pgdelta-cdc" / "bin"
    )
    assert minio.tools_cache({}) == Path.home() / ".cache" / "pgdelta-cdc" / "bin"
