"""Coverage-guided fuzzing of the Delta commit file reader (atheris, libFuzzer underneath).

Usage::

    .venv/bin/python -m tests.fuzz.fuzz_commit_file [libFuzzer flags, e.g. -runs=30000]

A commit file is not ours: Delta's writers (Spark's, delta-rs) put the table's own text
in it, raw, inside JSON strings (a text column's min/max statistics, keys, the writer's
``userMetadata``). An input's first byte picks one of two properties:

- **any text**: :func:`apply.lake.delta_log.parse_commit` returns a commit or raises
  ``MalformedCommitError``, never another exception and never a hang, whatever the
  bytes (read as UTF-8 with surrogate escapes, as a damaged file could be).
- **a well-formed commit**: actions built from the input (``txn``, an ``add`` whose
  statistics hold the input's text, ``commitInfo`` with metrics and ``userMetadata``),
  written as Delta writes them (one JSON object a line, non-ASCII characters raw, so
  U+2028, U+2029, U+0085 and the ASCII separators appear unescaped), read back exactly.

``tests/unit/apply/test_delta_log.py`` runs it for a bounded number of inputs with a
fixed seed, so CI replays the same search each time.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

import atheris

with atheris.instrument_imports():
    from apply.lake.delta_log import MalformedCommitError, parse_commit

# Characters that a line splitter other than "\n" breaks on: the fuzzer gets them often.
LINE_BOUNDARIES = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def _text(data: atheris.FuzzedDataProvider) -> str:
    parts = []
    for _ in range(data.ConsumeIntInRange(0, 6)):
        if data.ConsumeBool():
            parts.append(data.PickValueInList(list(LINE_BOUNDARIES)))
        else:
            parts.append(data.ConsumeUnicodeNoSurrogates(data.ConsumeIntInRange(0, 12)))
    return "".join(parts)


def _any_text(data: atheris.FuzzedDataProvider) -> None:
    text = data.ConsumeBytes(data.remaining_bytes()).decode("utf-8", "surrogateescape")
    with contextlib.suppress(MalformedCommitError):
        parse_commit(1, text)


def _well_formed(data: atheris.FuzzedDataProvider) -> None:
    transactions = {_text(data): data.ConsumeIntInRange(0, 2**62) for _ in range(2)}
    metrics = {_text(data): _text(data) for _ in range(data.ConsumeIntInRange(0, 3))}
    metadata = _text(data) if data.ConsumeBool() else None
    operation = _text(data)
    stats = {"numRecords": 1, "minValues": {"k": _text(data)}, "maxValues": {"k": _text(data)}}
    info: dict[str, Any] = {"operation": operation, "operationMetrics": metrics}
    if metadata is not None:
        info["userMetadata"] = metadata
    actions: list[dict[str, Any]] = [
        {"txn": {"appId": app_id, "version": version}} for app_id, version in transactions.items()
    ]
    actions.append({"add": {"path": _text(data), "stats": json.dumps(stats, ensure_ascii=False)}})
    actions.insert(data.ConsumeIntInRange(0, len(actions)), {"commitInfo": info})
    text = "\n".join(json.dumps(a, ensure_ascii=False) for a in actions)
    commit = parse_commit(7, text + ("\n" if data.ConsumeBool() else ""))
    expected = (operation, metrics, metadata, transactions)
    got = (commit.operation, dict(commit.metrics), commit.user_metadata, dict(commit.transactions))
    if got != expected:
        raise AssertionError(f"a well-formed commit read back wrong: {got!r} != {expected!r}")


def test_one_input(raw: bytes) -> None:
    if not raw:
        return
    data = atheris.FuzzedDataProvider(raw[1:])
    if raw[0] & 1:
        _any_text(data)
    else:
        _well_formed(data)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
