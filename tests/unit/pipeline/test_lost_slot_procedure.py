"""The one resync after a lost slot (docs/operations.md) deletes every checkpoint the
apply job uses, lanes included, and every message about a slot capture cannot trust
points at it (issue #33)."""

from __future__ import annotations

import glob
import re
import shlex
from pathlib import Path

import yaml

from apply.app import checkpoint_location, lanes_of
from apply.lake.dead_letter import dead_letter_path
from apply.lake.retired_log import change_log_path
from apply.lake.tables import TableId, table_path
from apply.settings import LakeSettings
from capture.errors import SLOT_RESYNC, ConfigError
from capture.source.setup import check_slot_history
from capture.source.wal_safety import slot_lost_error
from pipeline.status.model import PipelineStatus, SlotView
from pipeline.status.render import render_text
from schemas.lsn import Lsn
from tests.plugins.settings import ApplyFromArguments

ROOT = Path(__file__).resolve().parents[3]
OPERATIONS = ROOT / "docs" / "operations.md"


def status(slot: SlotView) -> PipelineStatus:
    return PipelineStatus("cdc._control", True, 1_700_000_000_000_000, Lsn(1), slot, ())


def _section(title: str) -> str:
    text = OPERATIONS.read_text()
    start = text.index(f"### {title}\n")
    end = text.find("\n## ", start)
    return text[start:end]


def _deleted_patterns(lake_root: Path, checkpoint_root: Path) -> list[str]:
    """The paths step 3 of the procedure removes, its variables replaced by ``*_root``."""
    (line,) = [
        line for line in _section("Resync after a lost slot").splitlines() if line.startswith("rm ")
    ]
    variables = {
        "APPLY_LAKE__ROOT": str(lake_root),
        "APPLY_LAKE__CHECKPOINT_ROOT": str(checkpoint_root),
    }
    words = shlex.split(line.replace('"', ""))
    assert words[:2] == ["rm", "-rf"]
    return [re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], word) for word in words[2:]]


def _deleted(lake_root: Path, checkpoint_root: Path) -> set[str]:
    """What step 3 deletes, expanded as the shell would."""
    return {
        found
        for pattern in _deleted_patterns(lake_root, checkpoint_root)
        for found in glob.glob(pattern)
    }


def test_the_procedure_deletes_every_lane_checkpoint_and_the_lake(tmp_path: Path) -> None:
    lake_root, checkpoint_root = tmp_path / "lake", tmp_path / "checkpoints"
    lake = LakeSettings(root=str(lake_root), checkpoint_root=str(checkpoint_root))
    earlier = ApplyFromArguments(lake=lake, lanes={"big": ["public.events"]})
    now = ApplyFromArguments(
        lake=lake, lanes={"big": ["public.events", "public.clicks"], "audit": ["audit.*"]}
    )
    unlaned = ApplyFromArguments(lake=lake)
    checkpoints = {
        lane.checkpoint for settings in (earlier, now, unlaned) for lane in lanes_of(settings)
    }
    checkpoints.add(checkpoint_location(now))
    assert len(checkpoints) == 6, "the default lane of each set, and each named lane"
    table = TableId("public", "events")
    lake_paths = {
        table_path(str(lake_root), table),
        change_log_path(str(lake_root), table),
        dead_letter_path(str(lake_root)),
    }
    for path in checkpoints | lake_paths:
        Path(path).mkdir(parents=True)
        (Path(path) / "0").write_text("offsets")
    kept = checkpoint_root / "not-apply"
    kept.mkdir()

    deleted = _deleted(lake_root, checkpoint_root)
    for path in checkpoints:
        assert path in deleted, f"{path} survives the procedure"
    for path in lake_paths:
        assert any(path == d or path.startswith(d + "/") for d in deleted), path
    assert str(kept) not in deleted


def test_every_message_about_an_untrusted_slot_points_at_the_procedure() -> None:
    """pipeline status, capture's refusals and the CdcSlotLost alert name the section,
    and the section exists."""
    document, _, title = SLOT_RESYNC.partition(", ")
    assert (ROOT / document) == OPERATIONS
    assert _section(title[0].upper() + title[1:])

    lost = SlotView("cdc_slot", True, False, Lsn(1), None, None, "lost", 0)
    line = render_text(status(lost)).splitlines()[0]
    assert f"LOST (its WAL is gone: resync the pipeline, {SLOT_RESYNC})" in line
    absent = SlotView("cdc_slot", False, False, None, None, None, None, None)
    assert render_text(status(absent)).splitlines()[0].endswith(f"{SLOT_RESYNC})")

    messages = [str(slot_lost_error("s", "wal_removed"))]
    for slot, checkpoint in ((None, Lsn(100)), (None, None)):
        try:
            check_slot_history(
                slot, "s", checkpoint=checkpoint, applied_topics=["cdc.public.orders"]
            )
        except ConfigError as exc:
            messages.append(str(exc))
    assert len(messages) == 3
    for message in messages:
        assert "every checkpoint of apply's queries" in message
        assert "apply-*" in message
        assert message.endswith(f"({SLOT_RESYNC})")

    alerts = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yaml").read_text())
    (rule,) = [
        rule
        for group in alerts["spec"]["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "CdcSlotLost"
    ]
    assert f"({SLOT_RESYNC})" in " ".join(rule["annotations"]["description"].split())
