"""AWS Signature Version 4 for the few S3 requests the local launcher and the tests make
(create a bucket, list, get and delete objects) against a local MinIO, with the standard
library only: the project has no S3 client library, and the launcher needs none.

Pure functions over values; the caller sends the request. The rules are those of S3's
header-based signing (https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html):

- the canonical URI is the path with each segment percent-encoded *once* (S3 differs
  from the other services, which encode twice), every byte but ``A-Z a-z 0-9 - . _ ~``,
  slashes between segments kept;
- the canonical query string is sorted by name, names and values encoded the same way
  (``/`` included), a parameter without a value written ``name=``;
- every header the request carries is signed (names lowercased, values trimmed,
  sorted); ``host``, ``x-amz-date`` and ``x-amz-content-sha256`` (the payload's SHA-256,
  which S3 requires) are always among them.

tests/unit/deploy/test_sigv4.py checks these against the examples AWS publishes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_PAYLOAD_SHA256 = hashlib.sha256(b"").hexdigest()
_UNRESERVED = "-_.~"


@dataclass(frozen=True, slots=True)
class Credentials:
    access_key: str
    secret_key: str

    def __repr__(self) -> str:
        return f"Credentials(access_key={self.access_key!r}, secret_key=***)"


def amz_date(moment: datetime) -> str:
    """``20130524T000000Z``: the form of ``x-amz-date``."""
    return moment.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def canonical_uri(path: str) -> str:
    """The path with each segment encoded once (module docstring); ``/`` when empty."""
    return quote(path or "/", safe="/" + _UNRESERVED)


def canonical_query(query: Sequence[tuple[str, str]]) -> str:
    pairs = sorted((quote(k, safe=_UNRESERVED), quote(v, safe=_UNRESERVED)) for k, v in query)
    return "&".join(f"{k}={v}" for k, v in pairs)


def _canonical_headers(headers: Mapping[str, str]) -> tuple[str, str]:
    cleaned = sorted((name.lower(), " ".join(value.split())) for name, value in headers.items())
    lines = "".join(f"{name}:{value}\n" for name, value in cleaned)
    return lines, ";".join(name for name, _ in cleaned)


def canonical_request(
    method: str,
    path: str,
    query: Sequence[tuple[str, str]],
    headers: Mapping[str, str],
    payload_sha256: str,
) -> tuple[str, str]:
    """The canonical request and its signed-headers list."""
    header_lines, signed = _canonical_headers(headers)
    text = "\n".join(
        [
            method,
            canonical_uri(path),
            canonical_query(query),
            header_lines,
            signed,
            payload_sha256,
        ]
    )
    return text, signed


def signing_key(secret_key: str, date: str, region: str, service: str) -> bytes:
    """The key derived for one day, region and service (``date`` is ``YYYYMMDD``)."""
    key = f"AWS4{secret_key}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def authorization(
    credentials: Credentials,
    *,
    method: str,
    path: str,
    query: Sequence[tuple[str, str]],
    headers: Mapping[str, str],
    payload_sha256: str,
    region: str,
    service: str = "s3",
) -> str:
    """The ``Authorization`` header of a request whose ``headers`` (``host`` and
    ``x-amz-date`` among them) are exactly those it will carry."""
    lowered = {name.lower(): value for name, value in headers.items()}
    stamp = lowered.get("x-amz-date")
    if stamp is None or "host" not in lowered:
        raise ValueError("a signed request needs its host and x-amz-date headers")
    date = stamp[:8]
    scope = f"{date}/{region}/{service}/aws4_request"
    request, signed = canonical_request(method, path, query, headers, payload_sha256)
    to_sign = "\n".join(
        [ALGORITHM, stamp, scope, hashlib.sha256(request.encode("utf-8")).hexdigest()]
    )
    key = signing_key(credentials.secret_key, date, region, service)
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    return (
        f"{ALGORITHM} Credential={credentials.access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )


def signed_headers(
    credentials: Credentials,
    *,
    method: str,
    host: str,
    path: str,
    query: Sequence[tuple[str, str]] = (),
    payload: bytes = b"",
    region: str,
    now: datetime,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Every header the request must carry, ``Authorization`` included."""
    payload_sha256 = hashlib.sha256(payload).hexdigest()
    headers = {
        "host": host,
        "x-amz-date": amz_date(now),
        "x-amz-content-sha256": payload_sha256,
        **(extra or {}),
    }
    headers["authorization"] = authorization(
        credentials,
        method=method,
        path=path,
        query=query,
        headers=headers,
        payload_sha256=payload_sha256,
        region=region,
    )
    return headers
