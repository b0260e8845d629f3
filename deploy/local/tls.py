"""Throw-away TLS material for local secured services: a CA and server certificates.

Made with the ``openssl`` command line (no Python crypto package is needed), valid for
two days, for tests of clients against TLS listeners (docs/security.md). Each server
certificate names ``localhost`` and ``127.0.0.1`` as subject alternative names, so
clients can verify the host name (``sslmode=verify-full``, librdkafka's and Java's
``https`` endpoint identification) against the loopback address they dial.

Keys are unencrypted PKCS#8 PEM (``BEGIN PRIVATE KEY``), the form both PostgreSQL and a
Kafka broker's PEM keystore (``ssl.keystore.type=PEM``, Kafka >= 2.7) read.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deploy.local.errors import LauncherError, MissingPrerequisite

_DAYS = "2"
_SERVER_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
"""


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    certificate: Path
    """PEM certificate clients trust (``sslrootcert``, ``ssl.ca.location``)."""
    key: Path


@dataclass(frozen=True, slots=True)
class ServerCertificate:
    certificate: Path
    key: Path
    """Unencrypted PKCS#8 PEM, mode 0600."""

    def keystore(self, path: Path) -> Path:
        """Key and certificate in one PEM file: a Kafka PEM keystore
        (``ssl.keystore.location``)."""
        path.write_text(self.key.read_text() + self.certificate.read_text())
        path.chmod(0o600)
        return path


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise MissingPrerequisite(
            "the openssl command is needed to make test certificates: `apt-get install openssl`"
        )
    result = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LauncherError(f"openssl {args[0]} failed ({result.returncode}):\n{result.stderr}")


def make_ca(directory: Path, name: str = "pgdelta-cdc test CA") -> CertificateAuthority:
    """A self-signed CA under ``directory`` (``<stem>.pem`` and ``<stem>.key``)."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = name.replace(" ", "-").lower()
    ca = CertificateAuthority(directory / f"{stem}.pem", directory / f"{stem}.key")
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", _DAYS,
        "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", str(ca.key), "-out", str(ca.certificate),
        cwd=directory,
    )  # fmt: skip
    ca.key.chmod(0o600)
    return ca


def issue_server_certificate(
    ca: CertificateAuthority, directory: Path, name: str
) -> ServerCertificate:
    """A server certificate for ``localhost``/``127.0.0.1`` signed by ``ca``."""
    directory.mkdir(parents=True, exist_ok=True)
    server = ServerCertificate(directory / f"{name}.pem", directory / f"{name}.key")
    request = directory / f"{name}.csr"
    extensions = directory / f"{name}.ext"
    extensions.write_text(_SERVER_EXTENSIONS)
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", str(server.key), "-out", str(request),
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(request), "-days", _DAYS,
        "-CA", str(ca.certificate), "-CAkey", str(ca.key), "-CAcreateserial",
        "-extfile", str(extensions), "-out", str(server.certificate),
        cwd=directory,
    )  # fmt: skip
    server.key.chmod(0o600)
    return server
