"""``--by`` keys of ``ges stats latency``: which record field or experiment tag groups records.

A name on ``--by`` is resolved once, before Spark starts, into a :class:`GroupKey`: a record field
(``hops``, ``size``, ``subscriber_broker``, …), one tag (``tags.NAME``), or the first present of
several tags (``rate`` is the tag ``rate`` or ``publish_rate``). The key knows its Spark column
and how a value shows in results (tag text that is a number becomes one, :func:`tag_value`).

A bare name that is no field is read as a tag, and must be a tag some record has: otherwise it is
more likely a misspelt field than a wish for one group of nulls. That is checked as early as it
can be: :func:`scan_tags` reads the JSON lines inputs until each such name's tag is found (a
bounded read, :data:`TAG_SCAN_BYTES`), and :func:`check_tags` refuses the names none of whose
tags is there; where the scan cannot decide (a Parquet input, or the bound reached), the job's
first Spark pass does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

import attrs

from ges import records
from ges.errors import UserInputError
from ges.stats.latency_results import STATS
from ges.stats.record_input import RecordSource, open_text

#: ``--by`` aliases: a name that reads the first of these tags a record has. Seed 004's "publish
#: rate" is tagged ``rate`` by bench/routing.py; other tools may say ``publish_rate``.
TAG_ALIASES = {"rate": ("rate", "publish_rate")}
#: Characters of JSON lines (bytes, for ASCII) read before Spark starts to find the tags a bare
#: ``--by`` name means: the scan stops at the first record with each such tag (at once, for
#: records that share their tags), and only a name no record has reads this much; beyond it (or
#: with Parquet inputs) the first Spark pass decides.
TAG_SCAN_BYTES = 32 * 1024 * 1024
#: Tag names an error lists before "…".
TAGS_LISTED = 12
#: A JSON number: tag text that is one reads as an int or a float (:func:`tag_value`).
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


@attrs.frozen
class GroupKey:
    """One ``--by`` name: a record field, or the first present of one or more tags.

    Resolution: ``tags.NAME`` is the tag NAME; a record field's name (``hops``, ``size``,
    ``client``, ``subscriber_broker``, …) is that field; ``rate`` is the tag ``rate`` or, in a
    record without it, ``publish_rate``; any other name is the tag of that name (so
    ``matching_rate`` is ``tags.matching_rate``; write ``tags.size`` for a tag that shares a
    field's name).

    A bare name read as a tag (``implied``) must be a tag some record has: otherwise it is more
    likely a misspelt field than a wish for one group of nulls, and :func:`check_tags` refuses
    it. ``tags.NAME`` is taken as written, present or not.
    """

    name: str
    field: str | None = None
    tags: tuple[str, ...] = ()
    implied: bool = False

    @classmethod
    def parse(cls, name: str) -> GroupKey:
        name = name.strip()
        if name.startswith("tags."):
            tag = name.removeprefix("tags.")
            if not tag:
                raise UserInputError("--by tags.: name a tag after the dot (tags.matching_rate)")
            return cls(name, tags=(tag,))
        if not name or name == "tags":
            raise UserInputError(f"--by {name!r}: name a field or a tag (e.g. hops, matching_rate)")
        if name in STATS:
            raise UserInputError(
                f"--by {name}: that is a statistic's column; write tags.{name} for the tag"
            )
        if name in records.FIELD_NAMES:
            return cls(name, field=name)
        return cls(name, tags=TAG_ALIASES.get(name, (name,)), implied=True)

    def column(self):
        from pyspark.sql import functions as F

        if self.field is not None:
            return F.col(self.field)
        found = [F.col("tags")[tag] for tag in self.tags]
        return found[0] if len(found) == 1 else F.coalesce(*found)

    def present(self, raw):
        """A key as results show it: fields as they are, tag text that is a number as one."""
        if self.field is not None or raw is None:
            return raw
        return tag_value(raw)


def tag_value(text: str) -> int | float | str:
    """A tag's text as a value: a JSON number becomes an int or float, anything else stays text."""
    match = _NUMBER.fullmatch(text)
    if match is None:
        return text
    return float(text) if match.group(1) or match.group(2) else int(text)


def parse_by(specs: Iterable[str]) -> tuple[GroupKey, ...]:
    """``--by`` options (each a comma list) as group keys; a name given twice is an error."""
    keys = [GroupKey.parse(n) for spec in specs for n in spec.split(",") if n.strip()]
    names = [k.name for k in keys]
    for name in names:
        if names.count(name) > 1:
            raise UserInputError(f"--by {name}: given twice")
    return tuple(keys)


def check_tags(keys: Sequence[GroupKey], present: Iterable[str]) -> None:
    """Refuse a bare ``--by`` name none of whose tags is in ``present`` (every record's tags).

    Raises:
        UserInputError: naming the key, the record fields, the tags there are, and ``tags.NAME``.
    """
    present = set(present)
    for key in keys:
        if key.implied and not present.intersection(key.tags):
            raise _no_such_key(key, present)


def _no_such_key(key: GroupKey, present: set[str]) -> UserInputError:
    tags = " or ".join(repr(t) for t in key.tags)
    fields = ", ".join(n for n in records.FIELD_NAMES if n != "tags")
    names = sorted(present)
    if names:
        shown = ", ".join(names[:TAGS_LISTED]) + (", …" if len(names) > TAGS_LISTED else "")
        have = f"tags in these records: {shown}"
    else:
        have = "these records have no tags"
    return UserInputError(
        f"--by {key.name}: not a record field, and no record has the tag {tags} "
        f"(fields: {fields}; {have}; tags.NAME groups by a tag even where no record has it)"
    )


def scan_tags(
    keys: Sequence[GroupKey], sources: Sequence[RecordSource], *, limit: int = TAG_SCAN_BYTES
) -> set[str] | None:
    """The tag names of the records, read before Spark starts, as far as ``keys`` need them.

    Only bare names read as tags need them. Reading stops once each of those has a tag found
    (the tags seen so far are returned); it reads every record only to show that one has none,
    and gives up — returns None, leaving it to :func:`latency_stats` — past ``limit`` characters or
    at a Parquet input. Lines that are not JSON objects are skipped: the Spark pass names them.
    """
    wanted = [k for k in keys if k.implied]
    seen: set[str] = set()
    if not wanted:
        return seen
    if any(s.format != "json" for s in sources):
        return None
    budget = limit
    for source in sources:  # JSON sources are files (record_sources lists a directory's)
        with open_text(source.path) as stream:
            for line in stream:
                budget -= len(line)
                if budget < 0:
                    return None
                if '"tags"' not in line:
                    continue
                try:
                    tags = json.loads(line).get("tags")
                except (ValueError, AttributeError):
                    continue
                if isinstance(tags, dict) and not tags.keys() <= seen:
                    seen.update(tags)
                    if all(seen.intersection(k.tags) for k in wanted):
                        return seen
    return seen
