"""A cluster that outlived its stack's folder is not started again by a new stack there."""

from __future__ import annotations

from pathlib import Path

from deploy.local import stack


def test_an_orphaned_cluster_is_removed_and_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "stack"
    cluster = stack._postgres_root(root)
    (cluster / "data").mkdir(parents=True)
    (cluster / "data" / "PG_VERSION").write_text("15\n")
    neighbour = tmp_path / "other"
    neighbour.mkdir()
    stack.clear_orphaned_cluster(root)
    assert not cluster.exists(), "the old cluster would have been started again"
    assert neighbour.exists()
    stack.clear_orphaned_cluster(root)  # nothing left: a no-op
