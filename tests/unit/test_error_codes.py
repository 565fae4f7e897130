"""Every published error code: the class that declares it, its ``retriable`` flag and its CLI exit code.

Codes are a stable interface (the CLI prints them, the HTTP API answers them, ``HttpReader`` raises the
class again by its code), so ``error_codes.json`` pins them: a code may be added (then added there), never
renamed, moved to another class or given other flags.
"""

from __future__ import annotations

import importlib
import json
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from throughline.errors import InputError, ThroughlineError, error_class

ERROR_MODULES = (
    "throughline.core.exceptions",
    "throughline.log.exceptions",
    "throughline.producers.exceptions",
    "throughline.producers.hook",
    "throughline.projector.exceptions",
    "throughline.reader.exceptions",
    "throughline.schemas.exceptions",
    "throughline.serve.exceptions",
)
PUBLISHED = json.loads((Path(__file__).parent / "error_codes.json").read_text("utf-8"))


class _Probe(InputError):
    """Declared once, at import (a code is declared by one class per process)."""

    code = "test_probe_only"
    retriable = True


class _Child(_Probe):
    """Declares nothing: inherits all three."""


def _subclasses(cls: type[ThroughlineError]) -> Iterator[type[ThroughlineError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _declared() -> dict[str, dict[str, object]]:
    for module in ERROR_MODULES:
        importlib.import_module(module)
    return {
        cls.code: {"class": f"{cls.__module__}.{cls.__qualname__}", "retriable": cls.retriable, "exitCode": cls.exit_code}
        for cls in _subclasses(ThroughlineError)
        if "code" in cls.__dict__ and cls.__module__ != __name__
    }


def test_every_published_code_keeps_its_class_and_flags() -> None:
    assert _declared() == PUBLISHED


def test_each_code_is_found_by_its_class() -> None:
    _declared()
    for code, entry in PUBLISHED.items():
        cls = error_class(code)
        assert cls is not None and f"{cls.__module__}.{cls.__qualname__}" == entry["class"]
    assert error_class("internal_error") is None  # the root's code, no subclass's
    assert error_class("some_future_code") is None


def test_a_code_declared_twice_fails_at_class_creation() -> None:
    with pytest.raises(TypeError, match="invalid_limit"):

        class _Again(InputError):
            code = "invalid_limit"

    assert getattr(error_class("invalid_limit"), "__name__", None) == "InvalidLimitError"


def test_a_subclass_that_declares_nothing_inherits() -> None:
    assert (_Probe.code, _Probe.retriable, _Probe.exit_code) == ("test_probe_only", True, 2)
    assert (_Child.code, _Child.retriable, _Child.exit_code) == ("test_probe_only", True, 2)
    assert error_class("test_probe_only") is _Probe
    error = _Child("x", code="per_instance", retriable=False)  # an instance may still say otherwise
    assert (error.code, error.retriable, type(error).code) == ("per_instance", False, "test_probe_only")


def test_the_same_declaration_imported_under_the_checkout_name_keeps_its_first_owner() -> None:
    # ``reader.exceptions`` (a top-level folder of a checkout) is ``throughline.reader.exceptions`` run
    # again (here the core's module, which declares the code): its classes must still import, and the
    # code keeps the installed class.
    installed = error_class("invalid_limit")
    assert installed is not None and installed.__module__ == "throughline.core.exceptions"

    def body(namespace: dict[str, object]) -> None:
        namespace.update(code="invalid_limit", __module__="core.exceptions", __qualname__=installed.__qualname__)

    again = types.new_class(installed.__name__, (InputError,), exec_body=body)
    assert again.code == "invalid_limit"
    assert error_class("invalid_limit") is installed
