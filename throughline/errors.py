"""The root of every error throughline raises.

Each package keeps its own ``exceptions.py`` whose classes derive from these. Every error carries:

- ``code``: a stable, machine-readable string (the CLI prints it as ``{"error": {"code", "message"}}``
  and the HTTP API returns it); codes never change meaning once published.
- ``retriable``: whether the same call may succeed later without the caller changing anything
  (a broker that is down, a projection file that is busy), as kafka-python's errors do.
- ``exit_code``: what the CLI exits with: 2 for a hard input error, 1 for any other failure.

Each code is its class's: declared (``code = "..."`` in the class body) by one class only, in one of
the error modules (``ERROR_MODULES``), and never set per instance (the initialiser takes no code). A
second declaration, or a declaration in another throughline module, fails at import. ``error_class``
imports every error module, then finds a code's class; so the registry is complete by construction, and
``HttpReader`` raises the server's own error class again on the client side.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

#: Every module that declares error codes. The class tree under ``ThroughlineError`` is complete once
#: these are imported: a throughline class declaring a code anywhere else fails at import.
ERROR_MODULES = (
    "throughline.errors",
    "throughline.core.exceptions",
    "throughline.log.exceptions",
    "throughline.schemas.exceptions",
    "throughline.producers.exceptions",
    "throughline.projector.exceptions",
    "throughline.reader.exceptions",
    "throughline.serve.exceptions",
    "throughline.backup.exceptions",
)
#: The top-level folders of a checkout that install as ``throughline.<name>`` (pyproject's package-dir).
_CHECKOUT_PACKAGES = ("producers", "projector", "reader", "schemas")


class ThroughlineError(Exception):
    """Root of all throughline errors."""

    code: ClassVar[str] = "internal_error"
    retriable: bool = False
    exit_code: int = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:  # this class declares a code (rather than inheriting one)
            if _own_module(cls.__module__) and _home(cls.__module__) not in _HOMES:
                raise TypeError(
                    f"{cls.__qualname__} declares error code {cls.code!r} in {cls.__module__}: "
                    f"codes are declared in the error modules only ({', '.join(ERROR_MODULES)})"
                )
            owner = _CODE_OWNERS.setdefault(cls.code, cls)
            if owner is not cls and not _same_declaration(owner, cls):
                raise TypeError(f"error code {cls.code!r} is declared by {owner.__qualname__} already")

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retriable is not None:  # a Kafka error's own flag, a 503 answer: the instance may say more
            self.retriable = retriable

    def to_json(self) -> dict[str, dict[str, str]]:
        """The error as the CLI and HTTP API print it."""
        return {"error": {"code": self.code, "message": self.message}}

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take other constructor arguments, so rebuild from the instance's state instead:
        # an error then crosses a process boundary (the projector's fetch worker) unchanged.
        return (_restore, (type(self), self.args, dict(self.__dict__)))


#: The class that declares each code, filled as the classes are created (the root's is ``internal_error``).
_CODE_OWNERS: dict[str, type[ThroughlineError]] = {}


def _home(module: str) -> str:
    # The repo's top-level folders install as ``throughline.<name>``, but a process started in a
    # checkout can also import one as ``<name>`` (``reader.exceptions``): the same module either way.
    return module.removeprefix("throughline.")


_HOMES = frozenset(_home(m) for m in ERROR_MODULES)


def _own_module(module: str) -> bool:
    return module.startswith("throughline.") or module.split(".")[0] in _CHECKOUT_PACKAGES


def _same_declaration(first: type, again: type) -> bool:
    # A class imported under its checkout name is the same class statement run a second time, not a
    # second owner of the code; the first import keeps it.
    def where(cls: type) -> str:
        return f"{_home(cls.__module__)}.{cls.__qualname__}"

    return where(first) == where(again)


def error_classes() -> dict[str, type[ThroughlineError]]:
    """Every error code and the one class that declares it (the error modules are imported first, so
    none of throughline's is missing; a class another package declares is there once it is imported)."""
    for module in ERROR_MODULES:
        importlib.import_module(module)
    return dict(_CODE_OWNERS)


def error_class(code: str) -> type[ThroughlineError] | None:
    """The error class that declares ``code`` (``None``: no class does, such as a newer server's code)."""
    return _CODE_OWNERS.get(code) or error_classes().get(code)


_CODE_OWNERS[ThroughlineError.code] = ThroughlineError


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


class InvalidArgumentsError(InputError):
    """A command line that does not parse, or a request's parameters the API cannot take (unknown,
    repeated, missing): the same mistake made in a shell or over HTTP."""

    code = "invalid_arguments"


class Interrupted(ThroughlineError):
    """A stop was requested (a signal) before the work reached its end."""

    code = "interrupted"
