"""The root of every error throughline raises.

Each package keeps its own ``exceptions.py`` whose classes derive from these. Every error carries:

- ``code``: a stable, machine-readable string (the CLI prints it as ``{"error": {"code", "message"}}``
  and the HTTP API returns it); codes never change meaning once published.
- ``retriable``: whether the same call may succeed later without the caller changing anything
  (a broker that is down, a projection file that is busy), as kafka-python's errors do.
- ``exit_code``: what the CLI exits with: 2 for a hard input error, 1 for any other failure.

Each code is declared (``code = "..."`` in the class body) by one class only: a second declaration
fails at import. ``error_class`` finds that class by its code, which is how ``HttpReader`` raises the
server's own error class again on the client side.
"""

from __future__ import annotations

from typing import Any


class ThroughlineError(Exception):
    """Root of all throughline errors."""

    code: str = "internal_error"
    retriable: bool = False
    exit_code: int = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:  # this class declares a code (rather than inheriting one)
            owner = _CODE_OWNERS.setdefault(cls.code, cls)
            if owner is not cls and not _same_declaration(owner, cls):
                raise TypeError(f"error code {cls.code!r} is declared by {owner.__qualname__} already")

    def __init__(self, message: str, *, code: str | None = None, retriable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retriable is not None:
            self.retriable = retriable

    def to_json(self) -> dict[str, dict[str, str]]:
        """The error as the CLI and HTTP API print it."""
        return {"error": {"code": self.code, "message": self.message}}

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take other constructor arguments, so rebuild from the instance's state instead:
        # an error then crosses a process boundary (the projector's fetch worker) unchanged.
        return (_restore, (type(self), self.args, dict(self.__dict__)))


#: The class that declares each code (the root's ``internal_error`` is no subclass's).
_CODE_OWNERS: dict[str, type[ThroughlineError]] = {}


def _same_declaration(first: type, again: type) -> bool:
    # The repo's top-level folders install as ``throughline.<name>``, but a process started in a
    # checkout can also import one as ``<name>`` (``reader.exceptions``): that is the same class
    # statement run a second time, not a second owner of the code; the first import keeps it.
    def where(cls: type) -> str:
        return f"{cls.__module__.removeprefix('throughline.')}.{cls.__qualname__}"

    return where(first) == where(again)


def error_class(code: str) -> type[ThroughlineError] | None:
    """The error class that declares ``code``, among the classes imported so far (``None``: no class)."""
    return _CODE_OWNERS.get(code)


def _restore(cls: type[ThroughlineError], args: tuple[Any, ...], state: dict[str, Any]) -> ThroughlineError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class InputError(ThroughlineError):
    """A hard input error: the caller sent something the contract refuses (CLI exit code 2)."""

    code = "invalid_input"
    exit_code = 2


class ConfigurationError(ThroughlineError):
    """Settings are missing or contradictory (a missing bootstrap server, an unusable key file)."""

    code = "configuration_error"
    exit_code = 2
