"""apply.lake.decode.survey_held: the survey of a batch the driver holds, which must say what
Spark's survey says (tests/integration/test_apply_driver_merge.py compares the two on
real batches); here each kind of record on its own."""

from __future__ import annotations

from apply.lake.decode import PartitionSurvey, survey_held, writer_key
from schemas import registry_framing
from schemas.registry_framing import SchemaId
from schemas.single_object import MARKER, Fingerprint, fingerprint_bytes

FINGERPRINT = Fingerprint(0x0102030405060708)


def single_object(body: bytes) -> bytes:
    return MARKER + fingerprint_bytes(FINGERPRINT) + body


def registry_framed(schema_id: int, body: bytes) -> bytes:
    return registry_framing.MAGIC + schema_id.to_bytes(registry_framing.ID_SIZE, "big") + body


def test_each_framing_names_its_writer_and_other_values_name_none() -> None:
    assert writer_key(single_object(b"\x02")) == fingerprint_bytes(FINGERPRINT)
    key = writer_key(registry_framed(42, b"\x02"))
    assert key is not None
    assert int.from_bytes(key, "little") == registry_framing.writer_key(SchemaId(42))
    assert writer_key(b"\xc3") is None  # a marker cut short
    assert writer_key(b"plain json") is None


def test_partitions_count_records_tombstones_and_the_first_value_without_header() -> None:
    topic = "cdc.public.t"
    surveys = survey_held(
        [
            (topic, 0, 10, single_object(b"a")),
            (topic, 0, 11, None),
            (topic, 0, 14, b"no header"),
            (topic, 0, 12, b"no header either"),
            (topic, 1, 3, registry_framed(7, b"b")),
            ("cdc.public.u", 0, 0, None),
        ]
    )

    t = surveys[topic]
    assert t.partitions == {
        0: PartitionSurvey(records=4, next_offset=15, tombstones=1, first_without_header=12),
        1: PartitionSurvey(records=1, next_offset=4, tombstones=0, first_without_header=None),
    }
    assert t.fingerprints == {FINGERPRINT, registry_framing.writer_key(SchemaId(7))}
    assert (t.records, t.tombstones) == (5, 1)
    only_tombstones = surveys["cdc.public.u"]
    assert (only_tombstones.records, only_tombstones.fingerprints) == (1, frozenset())
