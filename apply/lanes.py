"""Lanes: the apply job's independent streaming queries, and which tables each one reads.

One query over every change topic has one micro-batch barrier: a small table's change
waits until the batch's slowest MERGE, usually the biggest table's, has committed, and
Spark's FAIR pools cannot shorten that (docs/apply.md, "What FAIR does not fix"). A
**lane** is a query of its own, with its own checkpoint, trigger cadence and batch ids,
for the tables named in ``APPLY_LANES``; the **default lane** reads every other change
topic, including tables that appear later. Putting a big or bursty table in a lane of
its own lets the rest of the tables commit at their own pace, as far as there are cores
for them: lanes remove the barrier, not the competition for cores (measured on two
cores, docs/benchmarks.md, "The big table in a lane of its own").

Why named lanes rather than one query per table: every query costs a Kafka consumer, a
driver thread and a checkpoint commit per batch, which is what 2-core machines run out
of with hundreds of tables; the usual shape is a few heavy tables and a long tail.

The contract that keeps lanes safe:

- **A table belongs to exactly one lane.** The patterns are disjoint by construction
  (the default lane's pattern excludes every lane's tables), and :func:`plan_lanes`
  refuses a table named by two lanes. So every Delta table has one writer, and Delta
  needs no coordination between the queries; the dead-letter table only ever gets blind
  appends from them, which never conflict (:mod:`apply.lake.dead_letter`).
- **A lane's checkpoint is named after what it reads** (:func:`checkpoint_of`), and
  its ``txnAppId`` is derived from that location
  (:func:`apply.lake.spark_merge.transaction_app_id`), so its batch ids count on their own.
  Without lanes the default lane keeps the checkpoint ``<checkpoint_root>/apply`` that the
  job has always used.
- **Changing lanes is a restart with new settings, nothing else.** Every lane whose set
  of tables changed (the default lane too, when a table joins or leaves a named lane)
  starts a new checkpoint from the earliest offsets, and the replay guard drops every
  record its tables already hold (:mod:`apply.lake.positions`): correct, at the price of
  re-reading those topics once. Each commit records the ``txnAppId`` that wrote it, so
  a new lane's low batch ids are not mistaken for a checkpoint reset
  (:mod:`apply.batch`). The old checkpoint directories are no longer read; going back to
  an earlier set of lanes would reuse theirs, so delete them once the new lanes run.

Table selectors are ``schema.table`` or ``schema.*`` with the PostgreSQL names as they
are (unquoted, case kept); a name that itself contains ``.`` cannot be selected.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from apply.errors import ConfigError
from schemas.naming import topic_segment

DEFAULT_LANE = "default"
"""The lane of every table no other lane names."""

QUERY_NAME = "pgdelta-apply"
"""The default lane's query name; a lane's is ``pgdelta-apply-<lane>``."""

_LANE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_SEGMENT = r"[A-Za-z0-9_\-]+"
_ANY_TABLE = "*"


@dataclass(frozen=True, slots=True)
class TableSelector:
    """One entry of a lane: a table, or every table of a schema (``table`` is None)."""

    schema: str
    table: str | None

    def __str__(self) -> str:
        return f"{self.schema}.{self.table or _ANY_TABLE}"

    def topic_regex(self, topic_prefix: str) -> str:
        """Java regex (no anchors) of the change topics this selector names."""
        table = _SEGMENT if self.table is None else re.escape(topic_segment(self.table))
        return rf"{re.escape(topic_prefix)}\.{re.escape(topic_segment(self.schema))}\.{table}"


@dataclass(frozen=True, slots=True)
class Lane:
    """One streaming query of the apply job."""

    name: str
    topic_pattern: str
    """Java regex for the Kafka source's ``subscribePattern``."""
    checkpoint: str
    query_name: str
    selectors: tuple[TableSelector, ...]
    """What the lane reads; empty for the default lane (everything else)."""

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_LANE

    @property
    def pool(self) -> str:
        """The FAIR scheduler pool of the query's own jobs; no table's pool is named so
        (those are ``schema.table``, :mod:`apply.batch.table_pool`)."""
        return f"lane:{self.name}"


def parse_selector(lane: str, text: str) -> TableSelector:
    """``schema.table`` or ``schema.*``; anything else is a :class:`ConfigError`."""
    parts = text.split(".")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise ConfigError(
            f"lane {lane!r}: {text!r} is not a table selector: write schema.table or "
            "schema.* with the PostgreSQL names unquoted (names containing '.' cannot "
            "be selected; leave such tables in the default lane)"
        )
    schema, table = parts
    return TableSelector(schema, None if table == _ANY_TABLE else table)


def _excluded_topics(control_topic: str, schema_topic: str) -> list[str]:
    return [re.escape(topic) for topic in (control_topic, schema_topic)]


def checkpoint_of(checkpoint_root: str, lane: str, tables: Sequence[TableSelector] = ()) -> str:
    """Where ``lane``'s query keeps its checkpoint, named after what it reads.

    ``tables`` are the lane's selectors, or for the default lane every other lane's (what
    it does not read). The default lane without any other lane keeps ``<root>/apply``,
    the location the job has always used; otherwise ``<root>/apply-<lane>-<digest>``,
    beside it rather than inside it, with a digest of ``tables``. A query whose topic set
    shrank cannot go on from its checkpoint: Spark's Kafka source takes a subscribed
    topic that stopped matching for a deleted one and fails the query for data loss. So
    a lane whose tables change starts afresh, from the earliest offsets, and the replay
    guard drops what its tables already hold."""
    root = checkpoint_root.rstrip("/")
    if lane == DEFAULT_LANE and not tables:
        return f"{root}/apply"
    names = "\n".join(sorted({str(selector) for selector in tables}))
    digest = hashlib.sha256(names.encode("utf-8")).hexdigest()[:12]
    return f"{root}/apply-{lane}-{digest}"


def default_topic_pattern(
    topic_prefix: str, control_topic: str, schema_topic: str, taken: Sequence[str] = ()
) -> str:
    """Java regex of the change topics ``<prefix>.<schema>.<table>`` that no lane takes,
    never the control or schema topic even when they share the prefix."""
    excluded = "|".join([*_excluded_topics(control_topic, schema_topic), *taken])
    return rf"^(?!(?:{excluded})$){re.escape(topic_prefix)}\.{_SEGMENT}\.{_SEGMENT}$"


def plan_lanes(
    lanes: Mapping[str, Sequence[str]],
    *,
    topic_prefix: str,
    control_topic: str,
    schema_topic: str,
    checkpoint_root: str,
) -> tuple[Lane, ...]:
    """The default lane first, then the configured ones by name.

    Raises :class:`ConfigError` for a bad lane name, an empty lane, a malformed
    selector, or a table (or schema) that two lanes name."""
    owner: dict[TableSelector, str] = {}
    planned: list[Lane] = []
    for name in sorted(lanes):
        if name == DEFAULT_LANE or not _LANE_NAME.fullmatch(name):
            raise ConfigError(
                f"lane name {name!r} is not usable: use 1 to 63 lowercase letters, digits, "
                f"'_' and '-', starting with a letter or digit, and not {DEFAULT_LANE!r} "
                "(the lane of every table no other lane names)"
            )
        selectors = tuple(dict.fromkeys(parse_selector(name, text) for text in lanes[name]))
        if not selectors:
            raise ConfigError(f"lane {name!r} names no table: give it schema.table entries")
        for selector in selectors:
            overlapping = [
                other
                for other in owner
                if owner[other] != name
                and other.schema == selector.schema
                and (other.table is None or selector.table is None or other == selector)
            ]
            if overlapping:
                first = overlapping[0]
                raise ConfigError(
                    f"{selector} (lane {name!r}) and {first} (lane {owner[first]!r}) name "
                    "the same table: a table belongs to one lane only, or two queries "
                    "would write its Delta table"
                )
            owner[selector] = name
        alternatives = "|".join(s.topic_regex(topic_prefix) for s in selectors)
        excluded = "|".join(_excluded_topics(control_topic, schema_topic))
        planned.append(
            Lane(
                name=name,
                topic_pattern=rf"^(?!(?:{excluded})$)(?:{alternatives})$",
                checkpoint=checkpoint_of(checkpoint_root, name, selectors),
                query_name=f"{QUERY_NAME}-{name}",
                selectors=selectors,
            )
        )
    default = Lane(
        name=DEFAULT_LANE,
        topic_pattern=default_topic_pattern(
            topic_prefix,
            control_topic,
            schema_topic,
            [s.topic_regex(topic_prefix) for s in owner],
        ),
        checkpoint=checkpoint_of(checkpoint_root, DEFAULT_LANE, tuple(owner)),
        query_name=QUERY_NAME,
        selectors=(),
    )
    return (default, *planned)
