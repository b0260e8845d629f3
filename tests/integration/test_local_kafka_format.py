"""The real ``kafka-storage format`` accepts every cluster id the launcher can pass.

A fresh clone's stack failed to start one time in 64 when the random id began with
``-``; the launcher now never draws such an id, and passes the id as
``--cluster-id=<id>`` so that even one beginning with ``-`` is read as a value.
"""

from __future__ import annotations

from pathlib import Path

from deploy.local.jars import kafka_classpath
from deploy.local.kafka import LocalKafka, cluster_id, find_java
from tests.plugins.kafka_cluster_ids import DASH_FIRST


def test_storage_format_takes_an_id_beginning_with_a_dash(tmp_path: Path) -> None:
    kafka = LocalKafka(root=tmp_path, port=1, controller_port=2)
    kafka._write_config()
    dash_first = cluster_id(DASH_FIRST)
    assert dash_first.startswith("-")
    kafka._format(find_java(), kafka_classpath(), dash_first)
    meta = (tmp_path / "logs" / "meta.properties").read_text()
    assert f"cluster.id={dash_first}\n" in meta
