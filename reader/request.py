"""``ReadRequest``: one page of a read series as the library, ``throughline read`` and ``serve`` take it.

One frozen value for every way in: ``read_observer_turn_page``'s keywords, the CLI's flags and the HTTP
query or JSON body all become a ``ReadRequest`` (``throughline.serve.params`` is the one place the wire
does), and ``read_page``, ``HttpReader.read`` and the serve API's ``ReadApi.answer`` take it.

Validation of the request's numbers lives here: ``limit`` (``validate_limit``: 1..100, ``None`` is the
default 10) and ``wait`` (``finite_seconds``). The texts (project, cursors, page token) are checked where
they are decoded, in the reader's order of checks (docs/spec.md#order-of-checks), so a value a JSON client sent with another
type reaches the reader as it came and is refused there with its own code (``invalid_project``,
``invalid_cursor``, ``page_token_*``).
"""

from __future__ import annotations

from dataclasses import dataclass

from throughline.core.page_range import DEFAULT_LIMIT, validate_limit
from throughline.core.seconds import finite_seconds
from throughline.reader.exceptions import InvalidWaitError


def require_seconds(value: object, what: str, *, text: bool = False) -> float:
    """``value`` as seconds when finite and >= 0, else ``InvalidWaitError`` naming ``what``.

    ``text=True`` also takes the number's text (a CLI flag); otherwise text is refused (a JSON string or
    a library argument ``"1"`` is a mistake, not a second).
    """
    seconds = None if isinstance(value, str) and not text else finite_seconds(value)
    if seconds is None:
        shown = repr(value)
        raise InvalidWaitError(f"{what} must be a finite number of seconds >= 0, got {shown[:80]}")
    return seconds


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """One page of the series (``after_cursor``, ``through_cursor``) of ``project``.

    First page of a series: no ``through_cursor`` and no ``page_token``. ``wait`` is the long-poll in
    seconds (an empty first page is held until the project's chain moves); ``throughline serve`` and
    ``HttpReader`` honour it, the in-process reader reads at once.
    """

    project: str
    after_cursor: str | None = None
    through_cursor: str | None = None
    page_token: str | None = None
    limit: int = DEFAULT_LIMIT
    wait: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit", validate_limit(self.limit))
        object.__setattr__(self, "wait", require_seconds(self.wait, "wait"))

    @property
    def first_page(self) -> bool:
        """True for the first page of a series (the only page a long-poll may hold)."""
        return self.through_cursor is None and self.page_token is None
