"""Coverage-guided fuzzing of the pgoutput decoder (atheris, libFuzzer underneath).

Usage::

    .venv/bin/python -m tests.fuzz.fuzz_decoder [libFuzzer flags, e.g. -runs=100000]

Every input is one pgoutput message (its first byte says whether it is read inside a
streamed transaction). The properties:

- :func:`capture.pgoutput.decode` returns a message or raises ``MalformedMessageError``: never
  another exception, never a hang, whatever the bytes.
- The fast paths of ``decode`` (row changes, Begin, Commit) and the ``Reader``-based
  decoder agree: the same message, or both refuse it.

``tests/unit/capture/test_fuzzing.py`` runs it for a bounded number of inputs with a
fixed seed, starting from the recorded vectors, so CI replays the same search each time.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from capture.pgoutput import MalformedMessageError, decode
    from capture.pgoutput.decode import _decode_checked


def test_one_input(data: bytes) -> None:
    if not data:
        return
    in_stream, payload = bool(data[0] & 1), data[1:]
    try:
        fast = decode(payload, in_stream=in_stream)
    except MalformedMessageError:
        fast = None
    try:
        checked = _decode_checked(payload, in_stream)
    except MalformedMessageError:
        checked = None
    if fast != checked:
        raise AssertionError(
            f"decode and the Reader-based decoder disagree: {fast!r} != {checked!r}"
        )


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
