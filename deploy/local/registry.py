"""A local Apicurio Registry: a real Schema Registry with the Confluent-compatible API.

Apicurio Registry 3.x is published on Maven Central as a ready-to-run Quarkus bundle
(``io.apicurio:apicurio-registry-app:<version>:tar.gz:all``), so it is fetched like the
Kafka and Spark jars, with ``mvn dependency:copy``, unpacked once under
``.local/registry/<version>/`` and started as a process. It keeps its schemas in an
in-memory H2 database (its default): a restart forgets them, which suits a local stack
and tests; production runs its own registry.

- **Java 21 or newer** is needed (the Kafka broker and Spark run on 17). The launcher
  looks at ``CDC_REGISTRY_JAVA_HOME``, then ``JAVA_HOME``, then the JDKs under
  ``/usr/lib/jvm``, and says what to install when none is new enough.
- Both the HTTP and the management interface listen on 127.0.0.1 only
  (``quarkus.http.host``, ``quarkus.management.host``). Readiness is ``/health/ready`` on
  the management port; start-up takes up to a minute on a loaded machine.
- The heap is capped (``-Xmx``): by default a JVM takes a quarter of the machine's
  memory, which next to Kafka and Spark on a small machine is too much.

The Confluent-compatible base URL is :attr:`LocalRegistry.url`
(``http://127.0.0.1:<port>/apis/ccompat/v7``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from deploy.local.errors import LauncherError, MissingPrerequisite
from deploy.local.jars import PROJECT_ROOT
from deploy.local.process import alive, read_pid, spawn, stop, wait_until

VERSION = "3.3.3"
ARTIFACT = f"io.apicurio:apicurio-registry-app:{VERSION}:tar.gz:all"
BUNDLE_ROOT = PROJECT_ROOT / ".local" / "registry"
MINIMUM_JAVA = 21
HEAP = "512m"
CCOMPAT_PATH = "/apis/ccompat/v7"


def _java_major(java_home: Path) -> int | None:
    """The feature release of the JDK at ``java_home`` from its ``release`` file."""
    try:
        text = (java_home / "release").read_text()
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="(\d+)', text, re.MULTILINE)
    return int(found.group(1)) if found else None


def jdk_candidates() -> list[str]:
    """Where a JDK may be, in the order the launcher tries them."""
    return [
        home
        for home in (
            os.environ.get("CDC_REGISTRY_JAVA_HOME"),
            os.environ.get("JAVA_HOME"),
            *sorted(str(p) for p in Path("/usr/lib/jvm").glob("*") if p.is_dir()),
        )
        if home
    ]


def find_java_21(candidates: list[str] | None = None) -> str:
    """A ``java`` of release 21 or newer among ``candidates`` (default:
    :func:`jdk_candidates`)."""
    seen: list[str] = []
    for candidate in jdk_candidates() if candidates is None else candidates:
        home = Path(candidate).resolve()
        major = _java_major(home)
        seen.append(f"{home} ({major or 'unknown'})")
        if major is not None and major >= MINIMUM_JAVA and (home / "bin" / "java").is_file():
            return str(home / "bin" / "java")
    raise MissingPrerequisite(
        f"Apicurio Registry needs Java {MINIMUM_JAVA} or newer; found: "
        f"{', '.join(seen) or 'no JDK'}. Install one (`apt-get install openjdk-21-jdk-headless` "
        "or a Temurin 21+ JDK) and point CDC_REGISTRY_JAVA_HOME at it"
    )


def resolve_bundle() -> Path:
    """The unpacked Apicurio bundle (fetched with Maven and unpacked once)."""
    target = BUNDLE_ROOT / VERSION
    if (target / "quarkus-run.jar").is_file():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingPrerequisite(
            "Maven (`mvn`) is needed once to fetch Apicurio Registry from Maven Central: "
            "`apt-get install maven` (done by `make bootstrap` when run as root)"
        )
    download = BUNDLE_ROOT / "download"
    download.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            mvn,
            "-q",
            "-B",
            "dependency:copy",
            f"-Dartifact={ARTIFACT}",
            f"-DoutputDirectory={download}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    archive = download / f"apicurio-registry-app-{VERSION}-all.tar.gz"
    if result.returncode != 0 or not archive.is_file():
        raise LauncherError(
            f"mvn could not fetch {ARTIFACT} (exit {result.returncode}):\n"
            f"{(result.stdout + result.stderr)[-2000:]}"
        )
    unpacking = BUNDLE_ROOT / f"{VERSION}.unpacking"
    shutil.rmtree(unpacking, ignore_errors=True)
    with tarfile.open(archive) as bundle:
        bundle.extractall(unpacking, filter="data")
    unpacking.rename(target)  # atomic: a half-unpacked bundle is never taken for whole
    archive.unlink()
    return target


@dataclass(frozen=True, slots=True)
class LocalRegistry:
    """One Apicurio Registry under ``root`` on ``127.0.0.1:port`` (management on
    ``management_port``)."""

    root: Path
    port: int
    management_port: int

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    @property
    def log_file(self) -> Path:
        return self.root / "registry.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "registry.pid"

    def start(self, *, timeout_s: float = 180.0) -> None:
        java = find_java_21()
        bundle = resolve_bundle()
        self.root.mkdir(parents=True, exist_ok=True)
        pid = spawn(
            [
                java,
                f"-Xmx{HEAP}",
                "-Dquarkus.http.host=127.0.0.1",
                f"-Dquarkus.http.port={self.port}",
                "-Dquarkus.management.host=127.0.0.1",
                f"-Dquarkus.management.port={self.management_port}",
                # Its own temp dir, so two registries never share Quarkus' files.
                f"-Djava.io.tmpdir={self.root}",
                "-jar",
                str(bundle / "quarkus-run.jar"),
            ],
            log_file=self.log_file,
            pid_file=self.pid_file,
        )
        wait_until(
            self.ready,
            what=f"Apicurio Registry on port {self.port}",
            timeout_s=timeout_s,
            log_file=self.log_file,
            pid=pid,
        )

    def ready(self) -> bool:
        url = f"http://127.0.0.1:{self.management_port}/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def running(self) -> bool:
        pid = read_pid(self.pid_file)
        return pid is not None and alive(pid)

    def stop(self) -> bool:
        return stop(self.pid_file, what="Apicurio Registry")
