"""What the members of a ``serve --group`` tell each other through Kafka's group protocol, as values.

Kafka's classic group protocol carries two opaque byte strings per member, and throughline fills both
(as Kafka Streams does):

- a member's **subscription** user data (``MemberSubscription``): the URL it answers reads on, the
  partitions it held in the last generation, the partitions its own DuckDB file has rows for, and the
  number of copies it was started with (``--copies``);
- the **assignment** user data the group's leader hands every member (``OwnerMap``): every member's id
  and URL, and for each partition the members that hold it. A member projects the partitions of its
  own assignment and forwards reads of the others to a URL from the map.

Both are canonical JSON (sorted keys, no spaces, ASCII) with a ``schema`` field naming the version::

    {"copies":2|null,"held":[0,3],"schema":"throughline.group_member.v1","stored":[0,3,5],"url":"http://..."}
    {"copies":2,"members":[{"id":"...","url":"..."},...],"owners":[[0,1],[1,2],...],"partitions":6,
     "schema":"throughline.owner_map.v1"}

``owners[p]`` lists indexes into ``members``, ascending. Decoding is strict: a document must be exactly
the encoding of the value it decodes to (one spelling per value), else ``GroupDataError``
(``group_data_version`` for another schema, ``group_data_malformed`` for anything else). Pure: no Kafka.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from throughline.core.exceptions import GroupDataError, GroupDataVersionError

SUBSCRIPTION_SCHEMA = "throughline.group_member.v1"
OWNER_MAP_SCHEMA = "throughline.owner_map.v1"
#: Refuse larger documents before parsing them (a 1,000-partition map of 50 members is ~20 KB).
MAX_GROUP_DATA_BYTES = 4 * 1024 * 1024
#: Longest advertised URL and member id accepted.
MAX_TEXT = 2048
#: Most partitions a topic may have in a map (Kafka's own practical bound is far below).
MAX_PARTITIONS = 1_000_000


def _canonical(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _text(value: object, what: str) -> str:
    # Printable ASCII without spaces: a URL or a Kafka member id, never anything a header could split on.
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_TEXT or not all("!" <= ch <= "~" for ch in value):
        raise GroupDataError(f"{what} must be 1..{MAX_TEXT} visible ASCII characters, got {value!r:.80}")
    return value


def _partition_set(values: Iterable[object], what: str) -> frozenset[int]:
    result = set()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_PARTITIONS:
            raise GroupDataError(f"{what} holds {value!r}, not a partition number")
        result.add(value)
    return frozenset(result)


def _copies(value: object, *, nullable: bool) -> int | None:
    # A subscription asks for >= 1 copies or the default (null); a map without members holds 0.
    if value is None and nullable:
        return None
    least = 1 if nullable else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise GroupDataError(f"copies must be an integer >= {least}{' or null' if nullable else ''}, got {value!r}")
    return value


def _load(data: bytes, schema: str) -> dict[str, Any]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise GroupDataError(f"{schema}: expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_GROUP_DATA_BYTES:
        raise GroupDataError(f"{schema}: {len(data)} bytes, more than {MAX_GROUP_DATA_BYTES}")
    try:
        document = json.loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise GroupDataError(f"not a {schema} document (not ASCII JSON)") from None
    if not isinstance(document, dict):
        raise GroupDataError(f"not a {schema} document (not a JSON object)")
    found = document.get("schema")
    if found != schema:
        if isinstance(found, str) and found.rsplit(".", 1)[0] == schema.rsplit(".", 1)[0]:
            raise GroupDataVersionError(f"{found} is not {schema}")
        raise GroupDataError(f"not a {schema} document (schema {found!r:.80})")
    return document


def _require_keys(document: dict[str, Any], keys: set[str], schema: str) -> None:
    if set(document) != keys:
        raise GroupDataError(f"{schema}: fields {sorted(document)} are not {sorted(keys)}")


def _require_canonical(data: bytes, value_bytes: bytes, schema: str) -> None:
    if bytes(data) != value_bytes:
        raise GroupDataError(f"{schema}: not in canonical form (sorted keys, no spaces, sorted lists)")


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    """What one member offers in its JoinGroup request (the subscription's user data).

    ``held``: the partitions it was assigned in the last generation it took part in (its live
    projections); ``stored``: the partitions its DuckDB file has rows for (it may have lost them since,
    or held them before a restart), so that a partition that must move prefers a member with less to
    catch up; ``copies``: its ``--copies`` (``None``: the default).
    """

    url: str
    held: frozenset[int] = frozenset()
    stored: frozenset[int] = frozenset()
    copies: int | None = None

    def __post_init__(self) -> None:
        _text(self.url, "an advertised URL")
        object.__setattr__(self, "held", _partition_set(self.held, "held"))
        object.__setattr__(self, "stored", _partition_set(self.stored, "stored"))
        _copies(self.copies, nullable=True)

    def encode(self) -> bytes:
        """The subscription user data (canonical JSON of ``throughline.group_member.v1``)."""
        return _canonical(
            {
                "copies": self.copies,
                "held": sorted(self.held),
                "schema": SUBSCRIPTION_SCHEMA,
                "stored": sorted(self.stored),
                "url": self.url,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> MemberSubscription:
        """The inverse of ``encode``; ``GroupDataError`` for anything else."""
        document = _load(data, SUBSCRIPTION_SCHEMA)
        _require_keys(document, {"copies", "held", "schema", "stored", "url"}, SUBSCRIPTION_SCHEMA)
        for key in ("held", "stored"):
            if not isinstance(document[key], list):
                raise GroupDataError(f"{SUBSCRIPTION_SCHEMA}: {key} must be a list")
        value = cls(
            url=_text(document["url"], "an advertised URL"),
            held=_partition_set(document["held"], "held"),
            stored=_partition_set(document["stored"], "stored"),
            copies=_copies(document["copies"], nullable=True),
        )
        _require_canonical(data, value.encode(), SUBSCRIPTION_SCHEMA)
        return value


@dataclass(frozen=True, slots=True, order=True)
class GroupMember:
    """One member of the group as the owner map names it: Kafka's member id and its advertised URL.

    Members order by URL, then id: the URL is what an operator configured, so it stays the same across
    a member's restarts while Kafka gives it a new member id.
    """

    url: str
    member_id: str

    def __post_init__(self) -> None:
        _text(self.url, "an advertised URL")
        _text(self.member_id, "a member id")


@dataclass(frozen=True, slots=True)
class OwnerMap:
    """Which members hold which partitions in one generation of the group (the assignment's user data).

    ``members`` are sorted and distinct by member id; ``owners[p]`` holds the indexes (into
    ``members``) of the members that hold partition ``p``, ascending and distinct; ``copies`` is how
    many members hold each partition (``min(K, members)``; 0 only for a map without members).
    """

    partitions: int
    copies: int
    members: tuple[GroupMember, ...]
    owners: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, int):
            raise GroupDataError(f"partitions must be an integer, got {self.partitions!r}")
        if not 0 <= self.partitions <= MAX_PARTITIONS:
            raise GroupDataError(f"partitions must be 0..{MAX_PARTITIONS}, got {self.partitions}")
        copies = _copies(self.copies, nullable=False)
        members = tuple(self.members)
        owners = tuple(tuple(row) for row in self.owners)
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "owners", owners)
        if list(members) != sorted(members) or len({m.member_id for m in members}) != len(members):
            raise GroupDataError("owner map: members must be sorted by (url, id) and distinct by id")
        if len(owners) != self.partitions:
            raise GroupDataError(f"owner map: {len(owners)} owner lists for {self.partitions} partitions")
        if not members and copies != 0 or members and not 1 <= (copies or 0) <= len(members):
            raise GroupDataError(f"owner map: {copies} copies with {len(members)} members")
        for p, row in enumerate(owners):
            if (
                len(row) != copies
                or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(members) for i in row)
                or list(row) != sorted(set(row))
            ):
                raise GroupDataError(f"owner map: partition {p} has owners {row!r}, not {copies} distinct members")

    # -------------------------------------------------------------------------------------- queries

    def holders(self, partition: int) -> tuple[GroupMember, ...]:
        """The members that hold ``partition`` (``()`` for a partition the map does not know)."""
        if not 0 <= partition < self.partitions:
            return ()
        return tuple(self.members[i] for i in self.owners[partition])

    def urls(self, partition: int) -> tuple[str, ...]:
        """The advertised URLs of ``partition``'s holders, in member order."""
        return tuple(member.url for member in self.holders(partition))

    def member(self, member_id: str) -> GroupMember | None:
        """The member with Kafka member id ``member_id``, if it is in this generation."""
        return next((m for m in self.members if m.member_id == member_id), None)

    def partitions_of(self, member_id: str) -> frozenset[int]:
        """The partitions ``member_id`` holds."""
        index = next((i for i, m in enumerate(self.members) if m.member_id == member_id), None)
        if index is None:
            return frozenset()
        return frozenset(p for p, row in enumerate(self.owners) if index in row)

    def loads(self) -> dict[str, int]:
        """How many partitions each member holds, by member id."""
        counts = dict.fromkeys((m.member_id for m in self.members), 0)
        for row in self.owners:
            for i in row:
                counts[self.members[i].member_id] += 1
        return counts

    # ------------------------------------------------------------------------------------- encoding

    def encode(self) -> bytes:
        """The assignment user data (canonical JSON of ``throughline.owner_map.v1``)."""
        return _canonical(
            {
                "copies": self.copies,
                "members": [{"id": m.member_id, "url": m.url} for m in self.members],
                "owners": [list(row) for row in self.owners],
                "partitions": self.partitions,
                "schema": OWNER_MAP_SCHEMA,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> OwnerMap:
        """The inverse of ``encode``; ``GroupDataError`` for anything else."""
        document = _load(data, OWNER_MAP_SCHEMA)
        _require_keys(document, {"copies", "members", "owners", "partitions", "schema"}, OWNER_MAP_SCHEMA)
        members_doc, owners_doc = document["members"], document["owners"]
        if not isinstance(members_doc, list) or not isinstance(owners_doc, list):
            raise GroupDataError(f"{OWNER_MAP_SCHEMA}: members and owners must be lists")
        members = []
        for entry in members_doc:
            if not isinstance(entry, dict) or set(entry) != {"id", "url"}:
                raise GroupDataError(f"{OWNER_MAP_SCHEMA}: a member must be {{'id', 'url'}}")
            members.append(
                GroupMember(url=_text(entry["url"], "an advertised URL"), member_id=_text(entry["id"], "a member id"))
            )
        if not all(isinstance(row, list) for row in owners_doc):
            raise GroupDataError(f"{OWNER_MAP_SCHEMA}: every owner list must be a list")
        value = cls(
            partitions=document["partitions"],
            copies=document["copies"],
            members=tuple(members),
            owners=tuple(tuple(row) for row in owners_doc),
        )
        _require_canonical(data, value.encode(), OWNER_MAP_SCHEMA)
        return value
