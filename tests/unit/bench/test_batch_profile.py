"""bench.batch_profile reads Spark's event log: jobs, their batch, pool and call site."""

from __future__ import annotations

import json
from pathlib import Path

from bench.batch_profile import _short, batches, read_jobs


def _job_start(job: int, at: int, batch: int | None, pool: str, site: str) -> dict[str, object]:
    properties = {"spark.scheduler.pool": pool, "callSite.short": site}
    if batch is not None:
        properties["streaming.sql.batchId"] = str(batch)
    return {
        "Event": "SparkListenerJobStart",
        "Job ID": job,
        "Submission Time": at,
        "Stage Infos": [{"Number of Tasks": 2}, {"Number of Tasks": 1}],
        "Properties": properties,
    }


def _job_end(job: int, at: int) -> dict[str, object]:
    return {"Event": "SparkListenerJobEnd", "Job ID": job, "Completion Time": at}


def test_jobs_are_grouped_by_batch_and_table(tmp_path: Path) -> None:
    events = [
        {"Event": "SparkListenerApplicationStart"},
        _job_start(0, 1_000, 0, "lane:default", "collect at /x/apply/lake/decode.py:179"),
        _job_end(0, 1_500),
        _job_start(1, 1_600, 0, "public.a", "execute at /x/apply/lake/spark_merge.py:345"),
        _job_start(2, 1_700, 0, "public.b", "execute at /x/apply/lake/spark_merge.py:345"),
        _job_end(2, 2_700),
        _job_end(1, 3_600),
        _job_start(3, 5_000, 1, "public.a", "collect at /x/apply/lake/spark_merge.py:125"),
        _job_end(3, 5_250),
        _job_start(4, 6_000, None, "default", "count at /x/apply/lake/history.py:70"),
        _job_start(5, 6_100, 2, "public.a", "never ends"),
        _job_end(4, 6_050),
    ]
    # Spark 4 rolls the log: a directory of numbered files, read in their order.
    rolled = tmp_path / "eventlog_v2_local-1"
    rolled.mkdir()
    lines = [json.dumps(e) for e in events]
    (rolled / "events_2_local-1").write_text("\n".join(lines[6:]) + "\n")
    (rolled / "events_1_local-1").write_text("\n".join(lines[:6]) + "\n")
    (rolled / "appstatus_local-1").write_text("")
    (rolled / ".events_1_local-1.crc").write_bytes(b"\x00crc")

    jobs = read_jobs(tmp_path)

    assert [j.job_id for j in jobs] == [0, 1, 2, 3, 4]  # job 5 never completed
    assert (jobs[1].wall_ms, jobs[1].tasks, jobs[1].stages) == (2_000, 3, 2)
    profiles = batches(jobs, after_ms=0)
    assert [p.batch_id for p in profiles] == [0, 1]
    assert profiles[0].wall_ms == 2_600
    assert profiles[0].tables == ["public.a", "public.b"]
    # job 4 carries no batch id: it belongs to the newest batch begun before it
    assert [j.job_id for j in profiles[1].jobs] == [3, 4]
    assert [p.batch_id for p in batches(jobs, after_ms=1_001)] == [1]


def test_a_job_delta_starts_is_named_by_its_first_stage(tmp_path: Path) -> None:
    start = _job_start(0, 1_000, None, "public.a", "call at /v/py4j/clientserver.py:644")
    start["Stage Infos"] = [
        {"Stage ID": 8, "Stage Name": "collect at DeltaLog.scala:9", "Number of Tasks": 1},
        {"Stage ID": 7, "Stage Name": "execute at MergeIntoCommand.scala:5", "Number of Tasks": 4},
    ]
    ours = _job_start(1, 1_100, None, "public.a", "collect at /x/apply/lake/history.py:69")
    ours["Stage Infos"] = [{"Stage ID": 9, "Stage Name": "collect at history.py:69"}]
    lines = [start, _job_end(0, 1_050), ours, _job_end(1, 1_200)]
    (tmp_path / "events_1_a").write_text("\n".join(json.dumps(e) for e in lines))

    delta_job, apply_job = read_jobs(tmp_path)

    assert delta_job.site == "execute at MergeIntoCommand.scala:5"
    assert apply_job.site == "collect at /x/apply/lake/history.py:69"


def test_call_sites_are_shown_from_the_package() -> None:
    assert (
        _short("collect at /work/main/apply/lake/decode.py:179")
        == "collect at apply/lake/decode.py:179"
    )
    assert _short("run at ThreadPoolExecutor.java:1136") == "run at ThreadPoolExecutor.java:1136"
