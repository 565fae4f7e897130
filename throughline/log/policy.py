"""Whether the topic of completed turns keeps every turn: retention and replication, as pure functions.

No Kafka here: ``throughline.log.topic`` asks the broker and hands the answers to these functions.

Retention: the log is the source of truth, so the topic must never drop a record: ``retention.ms=-1``,
``retention.bytes=-1``, ``cleanup.policy=delete`` (``lossy_reasons``).

Replication: an acknowledged turn (``acks=all``) survives the loss of a broker only when the partition has more than
one replica *and* the leader waits for more than itself before acknowledging: ``acks=all`` waits for
the in-sync replicas, and ``min.insync.replicas`` is how few of them the broker still accepts a write
with. So throughline wants, on a cluster of ``brokers`` brokers:

- a replication factor of ``min(3, brokers)`` (3 copies survive one broker lost and one in maintenance);
- ``min.insync.replicas`` of ``min(2, RF)`` (an acknowledged turn is on two brokers; a write with only
  the leader in sync is refused instead of acknowledged on one copy);
- ``unclean.leader.election.enable=false`` (an out-of-sync replica never becomes leader and truncates
  what the others acknowledged).

``replication_reasons`` turns what the broker reports into the list of what falls short;
``topic_problems`` adds the retention check (``lossy_reasons``). An operator's explicit
``--replication-factor`` / ``--min-insync-replicas`` sets the bar instead of the defaults: the topic
throughline creates with them must pass its own check the next time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from throughline.log.exceptions import InvalidReplicationError

#: The replication factor throughline creates the topic with, at most (fewer only on a smaller cluster).
TARGET_REPLICATION_FACTOR = 3
#: The ``min.insync.replicas`` it creates the topic with, at most (fewer only when the RF is smaller).
TARGET_MIN_INSYNC_REPLICAS = 2
MIN_INSYNC = "min.insync.replicas"
UNCLEAN = "unclean.leader.election.enable"


def lossy_reasons(configs: Mapping[str, str]) -> tuple[str, ...]:
    """Why a topic with these configurations would lose records (empty when it keeps them all).

    A configuration the broker did not report counts as a reason: what cannot be checked is not trusted.
    """
    reasons: list[str] = []
    for key in ("retention.ms", "retention.bytes"):
        value = configs.get(key)
        if value is None:
            reasons.append(f"{key} was not reported")
        elif value.strip() != "-1":
            reasons.append(f"{key}={value} (finite)")
    policy = configs.get("cleanup.policy")
    if policy is None:
        reasons.append("cleanup.policy was not reported")
    elif "compact" in {p.strip().lower() for p in policy.split(",")}:
        reasons.append(f"cleanup.policy={policy} (compaction keeps one record per key)")
    return tuple(reasons)


def default_replication(brokers: int) -> tuple[int, int]:
    """The replication factor and ``min.insync.replicas`` for a new topic on ``brokers`` brokers."""
    rf = max(1, min(TARGET_REPLICATION_FACTOR, brokers))
    return rf, min(TARGET_MIN_INSYNC_REPLICAS, rf)


def check_override(replication_factor: int | None, min_insync_replicas: int | None) -> None:
    """Refuse an override that no cluster can take: below 1, or a min ISR above the replication factor."""
    for flag, value in (
        ("--replication-factor", replication_factor),
        ("--min-insync-replicas", min_insync_replicas),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InvalidReplicationError(f"{flag} must be a whole number of at least 1, got {value!r}")
    if replication_factor is not None and min_insync_replicas is not None and min_insync_replicas > replication_factor:
        raise InvalidReplicationError(
            f"--min-insync-replicas {min_insync_replicas} is above --replication-factor {replication_factor}: "
            "every acks=all write would be refused"
        )


def resolve_replication(
    brokers: int, replication_factor: int | None = None, min_insync_replicas: int | None = None
) -> tuple[int, int]:
    """The replication factor and ``min.insync.replicas`` to create the topic with on ``brokers`` brokers:
    the overrides where given, else ``default_replication``. Raises ``InvalidReplicationError`` when an
    override is below 1, the replication factor is above the broker count, or the min ISR above the RF."""
    check_override(replication_factor, min_insync_replicas)
    default_rf, _ = default_replication(brokers)
    rf = default_rf if replication_factor is None else replication_factor
    if rf > brokers:
        raise InvalidReplicationError(f"--replication-factor {rf} needs {rf} brokers but the cluster has {brokers}")
    isr = min(TARGET_MIN_INSYNC_REPLICAS, rf) if min_insync_replicas is None else min_insync_replicas
    if isr > rf:
        raise InvalidReplicationError(
            f"--min-insync-replicas {isr} is above the replication factor {rf}: every acks=all write would be refused"
        )
    return rf, isr


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    return int(text) if text.lstrip("-").isdigit() else None


def _flag(value: str | None) -> bool | None:
    if value is None:
        return None
    text = value.strip().lower()
    return True if text == "true" else False if text == "false" else None


def replication_reasons(
    brokers: int,
    replication_factors: Sequence[int],
    min_insync: int | None,
    unclean: bool | None,
    *,
    replication_factor: int | None = None,
    min_insync_replicas: int | None = None,
) -> tuple[str, ...]:
    """Why a topic could lose acknowledged turns (empty when its replication is as throughline wants).

    ``replication_factors``: each partition's replica count; ``min_insync``/``unclean``: the topic's
    effective ``min.insync.replicas`` and ``unclean.leader.election.enable`` (``None``: not reported,
    which counts as a reason: what cannot be checked is not trusted). ``replication_factor`` /
    ``min_insync_replicas``: the operator's explicit bar, instead of ``min(3, brokers)`` / ``min(2, RF)``.
    """
    reasons: list[str] = []
    want_rf = default_replication(brokers)[0] if replication_factor is None else replication_factor
    rf = min(replication_factors) if replication_factors else 0
    if rf < want_rf:
        short = sorted({n for n in replication_factors if n < want_rf})
        reasons.append(
            f"replication factor {'/'.join(map(str, short))} below {want_rf} "
            f"(on {brokers} brokers, losing {max(1, rf)} broker(s) loses acknowledged turns)"
        )
    want_isr = min(TARGET_MIN_INSYNC_REPLICAS, max(1, rf)) if min_insync_replicas is None else min_insync_replicas
    if min_insync is None:
        reasons.append(f"{MIN_INSYNC} was not reported")
    elif min_insync < want_isr:
        reasons.append(
            f"{MIN_INSYNC}={min_insync} below {want_isr} (acks=all would acknowledge a turn held by {min_insync} broker(s))"
        )
    if unclean is None:
        reasons.append(f"{UNCLEAN} was not reported")
    elif unclean:
        reasons.append(f"{UNCLEAN}=true (an out-of-sync replica may become leader and drop acknowledged turns)")
    return tuple(reasons)


def config_replication_reasons(
    brokers: int,
    replication_factors: Sequence[int],
    configs: Mapping[str, str],
    *,
    replication_factor: int | None = None,
    min_insync_replicas: int | None = None,
) -> tuple[str, ...]:
    """``replication_reasons`` with ``min.insync.replicas`` and the unclean flag read from ``configs``."""
    return replication_reasons(
        brokers,
        replication_factors,
        _int(configs.get(MIN_INSYNC)),
        _flag(configs.get(UNCLEAN)),
        replication_factor=replication_factor,
        min_insync_replicas=min_insync_replicas,
    )


@dataclass(frozen=True, slots=True)
class TopicProblems:
    """What would lose turns: records dropped by retention/compaction, or acknowledged turns by replication."""

    retention: tuple[str, ...] = ()
    replication: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.retention or self.replication)


def topic_problems(
    brokers: int,
    replication_factors: Sequence[int],
    configs: Mapping[str, str],
    *,
    replication_factor: int | None = None,
    min_insync_replicas: int | None = None,
) -> TopicProblems:
    """Every reason the topic could lose turns, from the broker count, each partition's replica count and
    the topic's effective configurations (retention, ``min.insync.replicas``, the unclean flag)."""
    return TopicProblems(
        lossy_reasons(configs),
        config_replication_reasons(
            brokers,
            replication_factors,
            configs,
            replication_factor=replication_factor,
            min_insync_replicas=min_insync_replicas,
        ),
    )


@dataclass(frozen=True, slots=True)
class PartitionReplicas:
    """One partition's replica placement as the metadata reports it (broker ids)."""

    partition: int
    leader: int | None  # None: no leader (offline)
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    def under_replicated(self, min_insync: int | None) -> bool:
        """Whether fewer replicas are in sync than exist, or than ``min.insync.replicas`` needs."""
        return len(self.isr) < len(self.replicas) or (min_insync is not None and len(self.isr) < min_insync)

    def to_json(self, min_insync: int | None) -> dict[str, Any]:
        """The partition's fields in ``status --json`` and ``/readyz``."""
        return {
            "leader": self.leader,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "underReplicated": self.under_replicated(min_insync),
        }


def replication_document(
    brokers: int | None,
    partitions: Sequence[PartitionReplicas],
    configs: Mapping[str, str],
    reasons: Sequence[str],
) -> dict[str, Any]:
    """The topic-level ``replication`` object of ``status --json`` and ``/readyz``."""
    min_insync = _int(configs.get(MIN_INSYNC))
    factors = [len(p.replicas) for p in partitions]
    return {
        "brokers": brokers,
        "replicationFactor": min(factors) if factors else None,
        "minInsyncReplicas": min_insync,
        "uncleanLeaderElection": _flag(configs.get(UNCLEAN)),
        "underReplicated": [p.partition for p in partitions if p.under_replicated(min_insync)],
        "problems": list(reasons),
    }


def min_insync_of(configs: Mapping[str, str]) -> int | None:
    """The topic's ``min.insync.replicas`` (``None`` when not reported)."""
    return _int(configs.get(MIN_INSYNC))


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def replication_lines(replication: dict[str, Any]) -> list[str]:
    """The topic's replication in a few lines (``status``, and ``status --url`` from ``/readyz``)."""
    unclean = replication.get("uncleanLeaderElection")
    lines = [
        f"replication: factor {_text(replication.get('replicationFactor'))}, min.insync.replicas "
        f"{_text(replication.get('minInsyncReplicas'))}, {_text(replication.get('brokers'))} brokers, unclean leader "
        f"election {_text(None if unclean is None else ('on' if unclean else 'off'))}; under-replicated partitions: "
        f"{', '.join(map(str, replication.get('underReplicated') or [])) or 'none'}"
    ]
    lines += [f"replication problem: {problem}" for problem in replication.get("problems") or []]
    return lines
