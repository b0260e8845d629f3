"""A local MinIO: a real S3-compatible server, for the tests that put the lake and the
streaming checkpoints on object storage (``s3a://``).

MinIO publishes no binaries to a package registry this project uses, but it is a Go
module: ``go install github.com/minio/minio@<VERSION>`` builds it from the Go module
proxy. :data:`VERSION` is a pseudo-version (MinIO tags its releases ``RELEASE.<date>``,
which are not semver, so the proxy lists no tagged versions) whose ``go.mod`` has no
``replace`` directive, which ``go install pkg@version`` refuses.

Invariants:

- The binary is built once per machine into the tools cache
  (``~/.cache/pgdelta-cdc/bin/minio-<VERSION>``, or ``$CDC_TOOLS_CACHE``; the same cache
  ``deploy/helm/tools.sh`` keeps helm and kubeconform in) and never rebuilt while it is
  there: the build takes about ten minutes on a busy two-core machine, and a fresh clone
  of the project on the same machine (every CI run) finds it there. The version is in
  the file name, so moving the pin builds the new one. It is built into a directory of
  its own and moved into place, so a build cut short never leaves a half-written binary
  that would be taken for whole.
- The server binds to 127.0.0.1 only (S3 API and console), on ports free when chosen,
  with its data, log and pid file under the instance's ``root``.
- The root user and password come from the caller, reach MinIO through its environment
  (``MINIO_ROOT_USER``/``MINIO_ROOT_PASSWORD``) and are written to no file.
- Ready means ``GET /minio/health/ready`` answers 200 *and* a signed S3 request
  (ListBuckets) succeeds, not an open port: the health endpoint answers 200 a moment
  before the object layer is initialised, and a request then gets 503
  ``XMinioServerNotInitialized``. A start that does not get there fails with the log's
  tail and stops what it started.

:class:`S3Client` makes the few S3 calls the launcher and the tests need (create a
bucket, list, get and delete objects), signed with :mod:`deploy.local.sigv4`: the
project has no S3 client library, and these four calls do not justify one.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from deploy.local.errors import LauncherError, MissingPrerequisite
from deploy.local.process import alive, free_port, read_pid, spawn, stop, wait_until
from deploy.local.sigv4 import Credentials, signed_headers

MODULE = "github.com/minio/minio"
VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
"""The newest commit the Go module proxy served on 2026-11-23 (``go list -m
github.com/minio/minio@latest``); its go.mod needs Go 1.24 and has no replace directive."""
BUILD_TIMEOUT_S = 3600.0
REGION = "us-east-1"
"""MinIO's default region; clients must sign for it."""

_S3_NAMESPACE = "{http://s3.amazonaws.com/doc/2006-03-01/}"

log = logging.getLogger(__name__)


class S3Error(LauncherError):
    """An S3 request was refused; the message carries S3's error code."""


def build_command(go: str, version: str = VERSION) -> list[str]:
    return [go, "install", f"{MODULE}@{version}"]


def tools_cache(env: Mapping[str, str] = os.environ) -> Path:
    """Where built tools live outside any clone (see the module docstring):
    ``$CDC_TOOLS_CACHE``, else ``$XDG_CACHE_HOME/pgdelta-cdc/bin``, else
    ``~/.cache/pgdelta-cdc/bin``. ``deploy/helm/tools.sh`` computes the same path."""
    if env.get("CDC_TOOLS_CACHE"):
        return Path(env["CDC_TOOLS_CACHE"])
    cache_home = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else None
    return (cache_home or Path.home() / ".cache") / "pgdelta-cdc" / "bin"


def cached_binary(env: Mapping[str, str] = os.environ) -> Path:
    """The MinIO binary of the pinned version in the tools cache."""
    return tools_cache(env) / f"minio-{VERSION}"


def build_minio(binary: Path | None = None, *, timeout_s: float = BUILD_TIMEOUT_S) -> Path:
    """The MinIO binary: ``binary`` (default :func:`cached_binary`) when it is there, else
    built with ``go install``."""
    binary = binary or cached_binary()
    if binary.is_file():
        return binary
    go = shutil.which("go")
    if go is None:
        raise MissingPrerequisite(
            "Go (`go`) is needed once to build MinIO for the object-store tests "
            f"(`go install {MODULE}@{VERSION}`): install Go 1.24 or newer "
            "(https://go.dev/dl/ or `apt-get install golang`) and put it on PATH"
        )
    binary.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log.info("building minio %s with go install (about ten minutes the first time)", VERSION)
    with tempfile.TemporaryDirectory(prefix="minio-build-", dir=binary.parent) as building:
        env = {**os.environ, "GOBIN": building}
        try:
            # cwd outside any Go module or workspace: `go install pkg@version` then
            # builds exactly the pinned module's dependency graph.
            result = subprocess.run(
                build_command(go),
                cwd=building,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise LauncherError(
                f"go install {MODULE}@{VERSION} did not finish in {timeout_s:.0f}s"
            ) from None
        built = Path(building) / "minio"
        if result.returncode != 0 or not built.is_file():
            raise LauncherError(
                f"go install {MODULE}@{VERSION} failed (exit {result.returncode}):\n"
                f"{(result.stdout + result.stderr)[-3000:]}"
            )
        os.replace(built, binary)  # atomic: see the module docstring
    log.info("built minio in %.0fs", time.monotonic() - started)
    return binary


@dataclass(frozen=True, slots=True)
class S3Client:
    """Signed S3 requests to ``endpoint`` (``http://host:port``), path-style."""

    endpoint: str
    credentials: Credentials
    region: str = REGION
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if urllib.parse.urlsplit(self.endpoint).scheme not in ("http", "https"):
            raise ValueError(f"an S3 endpoint is http:// or https://, not {self.endpoint!r}")

    def _request(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        payload: bytes = b"",
    ) -> bytes:
        host = urllib.parse.urlsplit(self.endpoint).netloc
        headers = signed_headers(
            self.credentials,
            method=method,
            host=host,
            path=path,
            query=query,
            payload=payload,
            region=self.region,
            now=datetime.now(UTC),
        )
        # The same encoding as the signature's canonical form, so what is sent is what
        # was signed.
        url = self.endpoint.rstrip("/") + urllib.parse.quote(path, safe="/-_.~")
        if query:
            url += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
        request = urllib.request.Request(  # noqa: S310 - the scheme is checked in __post_init__
            url, data=payload if method == "PUT" else None, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as exc:
            raise S3Error(
                f"S3 {method} {path} at {self.endpoint}: HTTP {exc.code} {_error_code(exc.read())}"
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise S3Error(f"S3 {method} {path}: {self.endpoint} does not answer: {exc}") from exc

    def list_buckets(self) -> list[str]:
        root = ET.fromstring(self._request("GET", "/"))  # noqa: S314 - see list_keys
        return [node.text or "" for node in root.iter(f"{_S3_NAMESPACE}Name")]

    def create_bucket(self, bucket: str) -> None:
        self._request("PUT", f"/{bucket}")

    def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` (ListObjectsV2, all pages)."""
        keys: list[str] = []
        token: str | None = None
        while True:
            query = [("list-type", "2"), ("prefix", prefix)]
            if token is not None:
                query.append(("continuation-token", token))
            # The answer of the local MinIO the caller started, not untrusted input.
            root = ET.fromstring(self._request("GET", f"/{bucket}", query))  # noqa: S314
            keys.extend(node.text or "" for node in root.iter(f"{_S3_NAMESPACE}Key"))
            token = root.findtext(f"{_S3_NAMESPACE}NextContinuationToken")
            if root.findtext(f"{_S3_NAMESPACE}IsTruncated") != "true" or not token:
                return keys

    def get_object(self, bucket: str, key: str) -> bytes:
        return self._request("GET", f"/{bucket}/{key}")

    def delete_object(self, bucket: str, key: str) -> None:
        self._request("DELETE", f"/{bucket}/{key}")


def _error_code(body: bytes) -> str:
    """S3's ``<Code>`` and ``<Message>`` from an error body, else the body's start."""
    try:
        root = ET.fromstring(body)  # noqa: S314 - the local MinIO's answer
    except ET.ParseError:
        return body[:200].decode(errors="replace")
    return f"{root.findtext('Code', '')}: {root.findtext('Message', '')}"


@dataclass(frozen=True, slots=True)
class LocalMinio:
    """One MinIO server under ``root``, S3 API on ``127.0.0.1:port``."""

    root: Path
    port: int
    console_port: int
    credentials: Credentials

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "minio.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "minio.pid"

    def client(self) -> S3Client:
        return S3Client(self.endpoint, self.credentials)

    def start(self, *, timeout_s: float = 60.0) -> None:
        binary = build_minio()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "MINIO_ROOT_USER": self.credentials.access_key,
            "MINIO_ROOT_PASSWORD": self.credentials.secret_key,
            # A test server neither phones home for updates nor sends usage data.
            "MINIO_UPDATE": "off",
        }
        pid = spawn(
            [
                str(binary),
                "server",
                str(self.data_dir),
                "--address",
                f"127.0.0.1:{self.port}",
                "--console-address",
                f"127.0.0.1:{self.console_port}",
            ],
            log_file=self.log_file,
            pid_file=self.pid_file,
            env=env,
        )
        try:
            wait_until(
                self.ready,
                what=f"MinIO on port {self.port}",
                timeout_s=timeout_s,
                log_file=self.log_file,
                pid=pid,
            )
        except LauncherError:
            self.stop()
            raise

    def ready(self) -> bool:
        """The health endpoint says ready and the S3 API answers (module docstring)."""
        try:
            url = f"http://127.0.0.1:{self.port}/minio/health/ready"
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status != 200:
                    return False
        except (urllib.error.URLError, OSError):
            return False
        try:
            self.client().list_buckets()
        except S3Error:
            return False
        return True

    def running(self) -> bool:
        pid = read_pid(self.pid_file)
        return pid is not None and alive(pid)

    def stop(self) -> bool:
        return stop(self.pid_file, what="MinIO")


@contextmanager
def running_minio(
    root: Path, credentials: Credentials, *, buckets: Sequence[str] = ()
) -> Iterator[LocalMinio]:
    """A started MinIO under ``root`` with ``buckets`` created; always stopped on exit."""
    port = free_port()
    console_port = free_port()
    while console_port == port:
        console_port = free_port()
    server = LocalMinio(root, port, console_port, credentials)
    server.start()
    try:
        client = server.client()
        for bucket in buckets:
            client.create_bucket(bucket)
        yield server
    finally:
        server.stop()
