"""The Kafka Streams peer's correctness gate (bench/streams_peer.py): the bench times no peer whose chains
differ from the projector's."""

from __future__ import annotations

import hashlib

import pytest

from bench.streams_peer import PeerDisagreesError, compare_chains, parse_dump, require_agreement


def _d(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


REFERENCE = {_d("a"): (3, _d("a3"), False), _d("b"): (1, _d("b1"), True)}


def test_agreeing_chains_pass() -> None:
    assert compare_chains(REFERENCE, dict(REFERENCE)) == []
    require_agreement(REFERENCE, dict(REFERENCE), "peer")


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ({_d("a"): (2, _d("a3"), False), _d("b"): REFERENCE[_d("b")]}, "length 2 != 3"),
        ({_d("a"): (3, _d("other"), False), _d("b"): REFERENCE[_d("b")]}, "head chain digest differs"),
        ({_d("a"): REFERENCE[_d("a")], _d("b"): (1, _d("b1"), False)}, "broken False != True"),
        ({_d("a"): REFERENCE[_d("a")]}, "the peer does not have it"),
        ({**REFERENCE, _d("c"): (1, _d("c1"), False)}, "only the peer has it"),
    ],
)
def test_a_disagreeing_peer_is_refused(peer: dict[bytes, tuple[int, bytes, bool]], expected: str) -> None:
    diffs = compare_chains(REFERENCE, peer)
    assert len(diffs) == 1 and expected in diffs[0]
    with pytest.raises(PeerDisagreesError, match=expected):
        require_agreement(REFERENCE, peer, "Kafka Streams (exactly_once_v2)")


def test_nothing_to_compare_is_refused() -> None:
    with pytest.raises(PeerDisagreesError, match="no chains"):
        require_agreement({}, {}, "peer")


def test_the_peer_dump_parses() -> None:
    line = f"{_d('a').hex()} 3 {_d('a3').hex()} 0\n{_d('b').hex()} 1 {_d('b1').hex()} 1\n\n"
    assert parse_dump(line) == REFERENCE
