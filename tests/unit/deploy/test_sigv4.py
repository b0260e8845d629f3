"""SigV4 signing (deploy/local/sigv4.py) against the examples AWS publishes for S3
(https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html), with
AWS's example credentials: the signatures must come out byte for byte."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from deploy.local import sigv4

EXAMPLE = sigv4.Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
HOST = "examplebucket.s3.amazonaws.com"
STAMP = "20130524T000000Z"
EMPTY = sigv4.EMPTY_PAYLOAD_SHA256


def _signature(
    method: str,
    path: str,
    query: list[tuple[str, str]],
    headers: dict[str, str],
    payload_sha256: str = EMPTY,
) -> str:
    header = sigv4.authorization(
        EXAMPLE,
        method=method,
        path=path,
        query=query,
        headers={"host": HOST, "x-amz-date": STAMP, "x-amz-content-sha256": payload_sha256}
        | headers,
        payload_sha256=payload_sha256,
        region="us-east-1",
    )
    return header.rsplit("Signature=", 1)[1]


def test_get_object_example() -> None:
    request, signed = sigv4.canonical_request(
        "GET",
        "/test.txt",
        [],
        {"Host": HOST, "Range": "bytes=0-9", "x-amz-content-sha256": EMPTY, "x-amz-date": STAMP},
        EMPTY,
    )
    assert signed == "host;range;x-amz-content-sha256;x-amz-date"
    # The hash AWS prints as the last line of the example's string to sign.
    assert hashlib.sha256(request.encode()).hexdigest() == (
        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"
    )
    assert _signature("GET", "/test.txt", [], {"range": "bytes=0-9"}) == (
        "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


def test_put_object_example_encodes_the_key_once() -> None:
    payload = hashlib.sha256(b"Welcome to Amazon S3.").hexdigest()
    headers = {"date": "Fri, 24 May 2013 00:00:00 GMT", "x-amz-storage-class": "REDUCED_REDUNDANCY"}
    assert _signature("PUT", "/test$file.text", [], headers, payload) == (
        "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"
    )


def test_bucket_lifecycle_example_signs_a_parameter_without_value() -> None:
    assert _signature("GET", "/", [("lifecycle", "")], {}) == (
        "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"
    )


def test_list_objects_example_sorts_the_query() -> None:
    assert _signature("GET", "/", [("prefix", "J"), ("max-keys", "2")], {}) == (
        "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
    )


def test_query_values_encode_slashes_and_paths_keep_them() -> None:
    assert sigv4.canonical_query([("prefix", "lake/a b")]) == "prefix=lake%2Fa%20b"
    assert sigv4.canonical_uri("/bucket/lake/a b+c") == "/bucket/lake/a%20b%2Bc"
    assert sigv4.canonical_uri("") == "/"


def test_signed_headers_carry_everything_signed() -> None:
    headers = sigv4.signed_headers(
        EXAMPLE,
        method="PUT",
        host="127.0.0.1:9000",
        path="/bucket",
        region="us-east-1",
        now=datetime(2013, 5, 24, tzinfo=UTC),
    )
    assert headers["x-amz-date"] == STAMP
    assert headers["x-amz-content-sha256"] == EMPTY
    assert headers["authorization"].startswith(
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature="
    )


def test_a_request_without_its_date_cannot_be_signed() -> None:
    with pytest.raises(ValueError, match="x-amz-date"):
        sigv4.authorization(
            EXAMPLE,
            method="GET",
            path="/",
            query=[],
            headers={"host": HOST},
            payload_sha256=EMPTY,
            region="us-east-1",
        )


def test_the_secret_never_shows_in_a_repr() -> None:
    assert EXAMPLE.secret_key not in repr(EXAMPLE)
