"""The registry launcher picks a JDK of release 21 or newer and says what to install when
there is none (Kafka and Spark run on 17, so an older default JDK is common)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.local.errors import MissingPrerequisite
from deploy.local.registry import find_java_21


def _jdk(root: Path, name: str, version: str) -> Path:
    home = root / name
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\n")
    (home / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_VERSION="{version}"\n')
    return home


def test_the_first_jdk_of_21_or_newer_is_taken(tmp_path: Path) -> None:
    old = _jdk(tmp_path, "jdk17", "17.0.15")
    new = _jdk(tmp_path, "jdk25", "25.0.1")
    newer = _jdk(tmp_path, "jdk26", "26")
    assert find_java_21([str(old), str(new), str(newer)]) == str(new / "bin" / "java")


def test_no_new_enough_jdk_names_what_was_found_and_what_to_do(tmp_path: Path) -> None:
    old = _jdk(tmp_path, "jdk17", "17.0.15")
    with pytest.raises(MissingPrerequisite, match=r"Java 21 or newer.*jdk17 \(17\).*CDC_REGISTRY"):
        find_java_21([str(old), str(tmp_path / "missing")])


def test_a_jdk_without_a_release_file_is_skipped(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    (bare / "bin").mkdir(parents=True)
    (bare / "bin" / "java").write_text("")
    with pytest.raises(MissingPrerequisite, match="unknown"):
        find_java_21([str(bare)])
