"""The postmaster's pid comes from ``postmaster.pid``, not the launcher's pid file, whose
process may be a ``runuser`` wrapper that does not pass PostgreSQL's shutdown signals on."""

from __future__ import annotations

from pathlib import Path

from deploy.local.postgres import LocalPostgres


def test_the_postmaster_pid_is_the_first_line_of_postmaster_pid(tmp_path: Path) -> None:
    postgres = LocalPostgres(root=tmp_path, port=5999)
    postgres.data_dir.mkdir()
    (postgres.data_dir / "postmaster.pid").write_text(
        "4242\n/tmp/data\n1795445237\n5999\n/tmp/data\n127.0.0.1\n  5999001  32768\nready\n"
    )
    postgres.pid_file.write_text("4200\n")
    assert postgres.postmaster_pid() == 4242


def test_no_postmaster_pid_without_a_running_cluster(tmp_path: Path) -> None:
    postgres = LocalPostgres(root=tmp_path, port=5999)
    assert postgres.postmaster_pid() is None
    postgres.data_dir.mkdir()
    (postgres.data_dir / "postmaster.pid").write_text("")
    assert postgres.postmaster_pid() is None
