"""The history grammar: a generated list of steps (Hypothesis strategies).

Steps carry abstract choices (small integers) that the driver resolves against the model's state at the
time the step runs (``index % count``), so every generated list is a valid history and shrinking keeps
it valid. A step that cannot apply (no series yet, no page to re-read) is a no-op.

=========  ============================================================================================
Append     a host completes a turn on a project's head source (``source=None``) or on source
           ``SOURCES[source]`` (another host or thread: the head switches)
Rewind     a host rewinds a non-empty source ``back`` turns from its end (seq ``length - back%length``)
Apply      the projector applies ``count`` pending records (all when ``None``)
Fetch      the projector fetches ``count`` more records (all when ``None``) and has not applied them
           yet: it knows their projects, so a read of another project need not wait for them
Start      open a read series on a project, with or without an after cursor and an explicit through
           (one in six: an after cursor the projector has not applied, a through cursor it has)
Next       read the next page of open series ``series`` (counted among the open ones)
Reread     read page ``page`` of series ``series`` again (same after, through and token), counted
           among the series with a page read
Replay     replay a token of series ``series`` (counted among the series holding one) with another
           project, after or through
Damage     the projection loses (``hide``) or garbles (``alter``) one live turn row, ``back`` turns
           from the end of the head source (``source=None``) or of another source
Repair     the projection's damaged rows are restored
Gap        (``histories(breaks=True)`` only) a host completes a turn whose seq leaves a gap after
           the chain of the project's head source (``source=None``) or of ``SOURCES[source]`` (seq ``length + 2 + skip % 3``): the record is quarantined and the
           source broken
Mend       (``breaks=True`` with ``repairs=True`` only) an operator appends a repair record for the
           project's head source when it is broken (``source=None``), else for one of its broken
           sources (``source`` counted among them), or for ``SOURCES[source]`` when none is broken (a
           repair with nothing to do)
=========  ============================================================================================

Read pages of several series interleave in whatever order the list gives their ``Next`` steps; turns
complete between pages wherever an ``Append`` falls between two ``Next`` steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

from .model import SOURCES


@dataclass(frozen=True)
class Append:
    project: int
    source: int | None
    body: str


@dataclass(frozen=True)
class Rewind:
    project: int
    source: int
    back: int
    body: str


@dataclass(frozen=True)
class Apply:
    count: int | None


@dataclass(frozen=True)
class Fetch:
    count: int | None


@dataclass(frozen=True)
class Pick:
    """A cursor chosen when a series starts, among the chains as the hosts know them now (perhaps not
    yet applied; perhaps rolled back later).

    ``prefix``: seq ``1 + n % length`` of one of the project's sources (counted from the start, so an
    after cursor usually leaves a long range). ``tip``: seq ``length - n % length`` (near the end).
    ``saved``: the through cursor of an earlier completed series of the project (what an Observer
    saves). ``foreign``: a prefix of the other project. ``pending``: the tip of one of the project's
    sources whose last record the projector has not applied yet (else as ``tip``). ``applied``: the
    tip of a source as the projector has applied it (else as ``tip``).
    """

    kind: Literal["prefix", "tip", "saved", "foreign", "pending", "applied"]
    source: int
    n: int


@dataclass(frozen=True)
class Start:
    project: int
    after: Pick | None
    through: Pick | None
    limit: int
    body_limit: int


@dataclass(frozen=True)
class Next:
    series: int


@dataclass(frozen=True)
class Reread:
    series: int
    page: int


Variant = Literal["project", "after", "through"]
VARIANTS: tuple[Variant, ...] = ("project", "after", "through")


@dataclass(frozen=True)
class Replay:
    series: int
    page: int
    variant: Variant


@dataclass(frozen=True)
class Damage:
    project: int
    source: int | None  # None: the project's head source (the one most reads serve)
    back: int
    kind: Literal["hide", "alter"]


@dataclass(frozen=True)
class Repair:
    pass


@dataclass(frozen=True)
class Gap:
    project: int
    source: int | None  # None: the project's head source (the one most reads serve)
    skip: int
    body: str


@dataclass(frozen=True)
class Mend:
    project: int
    source: int | None  # None: the project's head source when it is broken


Step = Append | Rewind | Apply | Fetch | Start | Next | Reread | Replay | Damage | Repair | Gap | Mend


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Pick one strategy with the given weights (shrinking moves towards the first one listed)."""
    buckets = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(buckets) - 1).flatmap(lambda i: buckets[i])


projects = weighted((3, st.just(0)), (1, st.just(1)))  # most turns on one project: longer chains
sources = st.integers(0, len(SOURCES) - 1)
small = st.integers(0, 7)
# ASCII, accented and CJK text, so body cuts land inside multi-byte characters.
bodies = st.text(alphabet="ab z\u00e9\u65e5\U0001f600", max_size=10)
limits = st.sampled_from([1, 1, 1, 1, 2, 2, 3, 10])
body_limits = st.sampled_from([5, 1 << 20])

after_picks = st.builds(Pick, st.sampled_from(["prefix"] * 4 + ["tip", "saved", "saved", "foreign"]), sources, small)
through_picks = st.builds(Pick, st.sampled_from(["tip", "tip", "prefix", "saved", "foreign"]), sources, small)

appends = st.builds(Append, projects, weighted((2, st.none()), (1, sources)), bodies)
rewinds = st.builds(Rewind, projects, sources, small, bodies)
applies = st.builds(Apply, weighted((2, st.none()), (1, st.integers(1, 4))))
fetches = st.builds(Fetch, weighted((2, st.none()), (1, st.integers(1, 4))))
plain_starts = st.builds(
    Start,
    projects,
    weighted((1, st.none()), (6, after_picks)),
    weighted((5, st.none()), (1, through_picks)),
    limits,
    body_limits,
)
#: A series whose after cursor names a record the projector has not applied yet while its through cursor
#: names an applied one: every page of it must wait for the after cursor's record too (a defect once found: a reader
#: waiting for the through cursor's record alone passed every other history of the fixed seed).
ahead_starts = st.builds(
    Start,
    projects,
    st.builds(Pick, st.just("pending"), sources, small),
    st.builds(Pick, st.just("applied"), sources, small),
    limits,
    body_limits,
)
starts = weighted((5, plain_starts), (1, ahead_starts))
nexts = st.builds(Next, small)
rereads = st.builds(Reread, small, small)
replays = st.builds(Replay, small, small, st.sampled_from(VARIANTS))
damages = st.builds(Damage, projects, weighted((2, st.none()), (1, sources)), small, st.sampled_from(["hide", "alter"]))
repairs = st.just(Repair())

# Appends and page reads dominate, so series are long and turns complete between pages.
steps: st.SearchStrategy[Step] = weighted(
    (10, appends),
    (2, rewinds),
    (5, applies),
    (5, starts),
    (12, nexts),
    (2, rereads),
    (2, replays),
    (3, damages),
    (1, repairs),
    (3, fetches),
)


gaps = st.builds(Gap, projects, weighted((2, st.none()), (1, sources)), small, bodies)
mends = st.builds(Mend, projects, weighted((2, st.none()), (1, sources)))


def _steps_with_breaks(repairs: bool) -> st.SearchStrategy[Step]:
    """``steps`` plus gaps (and, with ``repairs``, repair records), often enough that most histories
    break a source that a series reads and, with repairs, mend it while series are open."""
    mix: list[tuple[int, st.SearchStrategy[Any]]] = [
        (10, appends),
        (2, rewinds),
        (5, applies),
        (5, starts),
        (12, nexts),
        (2, rereads),
        (2, replays),
        (3, damages),
        (1, st.just(Repair())),
        (6, gaps),
    ]
    if repairs:
        mix.append((5, mends))
    return weighted(*mix)


def history(prologue: list[Step], first: Start, body: list[Step]) -> list[Step]:
    """The steps of one history: the prologue, the projector catching up, a first series, the body."""
    return [*prologue, Apply(None), first, *body]


def histories(max_steps: int = 40, *, breaks: bool = False, repairs: bool = False) -> st.SearchStrategy[list[Step]]:
    """A prologue of 2..12 appends the projector applies, a first series, then 1..``max_steps``
    mixed steps (with ``breaks``: gaps too; with ``repairs`` as well: repair records).

    The prologue gives the first series chains to read; the lengths are drawn first, so shrinking
    shortens both parts. Without ``breaks`` the strategy is the one the calibrated runs and the
    mutant blobs of docs/oracle.md were made with.
    """
    mixed = _steps_with_breaks(repairs) if breaks else steps
    prologue = st.integers(2, 12).flatmap(lambda n: st.lists(appends, min_size=n, max_size=n))
    body = st.integers(1, max_steps).flatmap(lambda n: st.lists(mixed, min_size=n, max_size=n))
    return st.builds(history, prologue, plain_starts, body)  # nothing is unapplied at the first start
