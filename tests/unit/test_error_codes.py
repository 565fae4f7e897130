"""Every error code is one class: the class that declares it, its ``retriable`` flag, its CLI exit code and
its HTTP status.

Codes are a stable interface (the CLI prints them, the HTTP API answers them, ``HttpReader`` raises the
class again by its code), so ``error_codes.json`` pins them: a code may be added (then added there), never
renamed or given other flags. A code exists only as its class: no error takes a code per instance, no
throughline module but the error modules declares one, and every code the docs list has exactly one class.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import tomllib
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_import_rules import MODULES

from throughline.core.exceptions import InvalidLimitError
from throughline.errors import (
    _CHECKOUT_PACKAGES,
    ERROR_MODULES,
    InputError,
    ThroughlineError,
    error_class,
    error_classes,
)
from throughline.projector import prepare
from throughline.serve.exceptions import ServerBusyError, UnknownCodeError
from throughline.serve.responses import http_status

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = json.loads((Path(__file__).parent / "error_codes.json").read_text("utf-8"))
#: The one class whose instances carry a code of their own: a server's code this client has no class for.
FOREIGN_CODE_CLASS = UnknownCodeError.__name__
#: Codes of quarantined records (the projection's ``quarantine`` table), a namespace of their own that the
#: docs list in the same kind of table (docs/operations.md).
QUARANTINE_CODES = {v for k, v in vars(prepare).items() if k.startswith("Q_") and isinstance(v, str)}


def _subclasses(cls: type[ThroughlineError]) -> Iterator[type[ThroughlineError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _where(cls: type) -> str:
    return f"{cls.__module__.removeprefix('throughline.')}.{cls.__qualname__}"


def _declarations(code: str) -> set[str]:
    """Every class statement in the tree that declares ``code`` (a class imported under two names is one)."""
    error_classes()
    tree = [ThroughlineError, *_subclasses(ThroughlineError)]
    return {_where(cls) for cls in tree if cls.__dict__.get("code") == code}


def _entry(cls: type[ThroughlineError]) -> dict[str, object]:
    # The HTTP status the API answers an error of the class with (``request_too_large`` may be 414, and
    # ``http_error`` takes the status of the HTTP layer's refusal).
    bare = cls.__new__(cls)
    ThroughlineError.__init__(bare, "pinned")
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "retriable": cls.retriable,
        "exitCode": cls.exit_code,
        "httpStatus": http_status(bare),
    }


def test_every_published_code_keeps_its_class_and_flags() -> None:
    assert {code: _entry(cls) for code, cls in error_classes().items()} == PUBLISHED


def test_each_code_is_found_by_its_class() -> None:
    for code, entry in PUBLISHED.items():
        cls = error_class(code)
        assert cls is not None and f"{cls.__module__}.{cls.__qualname__}" == entry["class"]
        assert _declarations(code) == {_where(cls)}
    assert error_class("internal_error") is ThroughlineError  # the root's own code
    assert error_class("some_future_code") is None


def test_a_code_declared_twice_fails_at_class_creation() -> None:
    with pytest.raises(TypeError, match="invalid_limit"):

        class _Again(InputError):
            code = "invalid_limit"

    assert error_class("invalid_limit") is InvalidLimitError


def test_the_error_modules_are_production_modules_and_the_checkout_names_pyprojects() -> None:
    assert set(ERROR_MODULES) <= set(MODULES)
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]["package-dir"]
    checkout = {folder for name, folder in package_dir.items() if name != folder and "/" not in folder}
    assert checkout == set(_CHECKOUT_PACKAGES)


def test_a_throughline_module_outside_the_error_modules_cannot_declare_a_code() -> None:
    def body(namespace: dict[str, object]) -> None:
        namespace.update(code="declared_elsewhere", __module__="throughline.producers.hook")

    with pytest.raises(TypeError, match="error modules"):
        types.new_class("ElsewhereError", (InputError,), exec_body=body)
    assert error_class("declared_elsewhere") is None


def test_a_subclass_that_declares_nothing_inherits_and_an_instance_takes_no_code() -> None:
    class _Child(ServerBusyError):
        """Declares nothing: inherits all three."""

    assert (_Child.code, _Child.retriable, _Child.exit_code) == ("server_busy", True, 1)
    assert error_class("server_busy") is ServerBusyError
    with pytest.raises(TypeError):
        InputError("x", code="per_instance")  # type: ignore[call-arg]
    error = _Child("x", retriable=False)  # the flag may still be the instance's (a Kafka error's own)
    assert (error.code, error.retriable) == ("server_busy", False)


def test_the_same_declaration_imported_under_the_checkout_name_keeps_its_first_owner() -> None:
    # ``reader.exceptions`` (a top-level folder of a checkout) is ``throughline.reader.exceptions`` run
    # again: its classes must still import, and the code keeps the installed class.
    installed = error_class("page_token_unbound")
    assert installed is not None and installed.__module__ == "throughline.reader.exceptions"

    def body(namespace: dict[str, object]) -> None:
        namespace.update(code="page_token_unbound", __module__="reader.exceptions", __qualname__=installed.__qualname__)

    again = types.new_class(installed.__name__, (InputError,), exec_body=body)
    assert again.code == "page_token_unbound"
    assert error_class("page_token_unbound") is installed


def test_a_server_code_without_a_class_keeps_the_servers_code() -> None:
    unknown = UnknownCodeError("some_future_code", "x", status=400)
    assert (unknown.code, unknown.exit_code, unknown.retriable) == ("some_future_code", 2, False)
    assert unknown.to_json() == {"error": {"code": "some_future_code", "message": "x"}}
    busy = UnknownCodeError("some_future_code", "x", status=503)
    assert (busy.exit_code, busy.retriable) == (1, True)


# -- no code without its class, read off the source (every production module, imported or not)


def _python_files() -> dict[str, Path]:
    files = dict(MODULES)
    for path in sorted((ROOT / "bench").rglob("*.py")):
        files[f"bench.{path.stem}"] = path
    return files


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _code_of_an_error(document: ast.Dict) -> bool:
    """Whether an ``{"error": {...}}`` document without ``"code"``, or whose code is an error's ``.code``."""
    for key, value in zip(document.keys, document.values, strict=True):
        if isinstance(key, ast.Constant) and key.value == "code":
            return isinstance(value, ast.Attribute) and value.attr == "code"
    return True


def _error_class_names() -> set[str]:
    return {cls.__name__ for cls in [*error_classes().values(), *_subclasses(ThroughlineError)]}


def _codes_without_a_class(module: str, source: str, label: str) -> Iterator[str]:
    tree = ast.parse(source)
    classes = _error_class_names()
    allowed_instance_code: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == FOREIGN_CODE_CLASS:
            allowed_instance_code |= {id(n) for n in ast.walk(node)}
    home = module.removeprefix("throughline.")
    declares_codes = home in {m.removeprefix("throughline.") for m in ERROR_MODULES}
    for node in ast.walk(tree):
        where = f"{label}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call):
            name = _callee(node)
            if any(k.arg == "code" for k in node.keywords) and (name.endswith("Error") or name in classes):
                yield f"{where}: {name}(..., code=...) sets a code per instance"
            if name == "setattr" and len(node.args) > 1 and getattr(node.args[1], "value", None) == "code":
                yield f"{where}: setattr(..., 'code', ...) sets a code per instance"
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == "code"
                    and id(node) not in allowed_instance_code
                ):
                    yield f"{where}: .code = ... sets a code per instance"
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if not isinstance(key, ast.Constant):
                    continue
                if key.value == "code" and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    yield f"{where}: an error document with the code {value.value!r} written by hand"
                if key.value == "error" and isinstance(value, ast.Dict) and not _code_of_an_error(value):
                    yield f"{where}: an error document written by hand (use the class's to_json())"
        elif isinstance(node, ast.ClassDef) and not declares_codes:
            for statement in node.body:
                if (
                    isinstance(statement, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "code" for t in statement.targets)
                    and isinstance(statement.value, ast.Constant)
                    and isinstance(statement.value.value, str)
                    and node.bases
                ):
                    modules = ", ".join(ERROR_MODULES)
                    yield f"{where}: {node.name} declares a code outside the error modules ({modules})"


def test_the_scan_finds_a_code_without_its_class() -> None:
    source = (
        'raise InputError("x", code="invalid_thing")\n'
        "error.code = 'other'\n"
        'setattr(error, "code", "other")\n'
        'print({"error": {"code": "by_hand", "message": "m"}})\n'
        "class ElsewhereError(InputError):\n    code = 'elsewhere'\n"
        "class UnknownCodeError(ServeError):\n    def __init__(self, code):\n        self.code = code\n"
    )
    found = [line.split(": ", 1)[1] for line in _codes_without_a_class("throughline.probe", source, "probe.py")]
    assert sorted(found) == sorted(
        [
            "InputError(..., code=...) sets a code per instance",
            ".code = ... sets a code per instance",
            "setattr(..., 'code', ...) sets a code per instance",
            "an error document with the code 'by_hand' written by hand",
            "an error document written by hand (use the class's to_json())",
            f"ElsewhereError declares a code outside the error modules ({', '.join(ERROR_MODULES)})",
        ]
    )
    assert not list(
        _codes_without_a_class("throughline.core.exceptions", "class AError(InputError):\n    code = 'a'\n", "x")
    )


FILES = _python_files()


@pytest.mark.parametrize("module", sorted(FILES))
def test_no_code_is_set_or_declared_without_its_class(module: str) -> None:
    path = FILES[module]
    found = list(_codes_without_a_class(module, path.read_text("utf-8"), str(path.relative_to(ROOT))))
    assert not found, "\n".join(found)


# -- every documented code has exactly one class

_TICKED = re.compile(r"`([a-z][a-z0-9_]*\*?)`")


def _documented_codes() -> dict[str, set[str]]:
    """Code -> the documents whose tables list it (a column headed ``code`` or ``codes``)."""
    found: dict[str, set[str]] = {}
    for doc in sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]):
        column: int | None = None
        for line in doc.read_text("utf-8").splitlines():
            if not line.startswith("|"):
                column = None
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if column is None:
                column = next((i for i, c in enumerate(cells) if c in ("code", "codes")), -1)
                continue
            if column < 0 or column >= len(cells) or set(cells[0]) <= set("-: "):
                continue
            for code in _TICKED.findall(cells[column]):
                found.setdefault(code, set()).add(str(doc.relative_to(ROOT)))
    return found


def test_the_docs_list_codes() -> None:
    documented = _documented_codes()
    assert {"invalid_limit", "page_token_*", "token_expired", "kafka_tls_failed", "not_found"} <= set(documented)


def test_every_documented_code_has_exactly_one_class() -> None:
    codes = error_classes()
    problems = []
    for code, docs in sorted(_documented_codes().items()):
        if code in QUARANTINE_CODES and code not in codes:
            continue
        matches = fnmatch.filter(codes, code) if "*" in code else [code] if code in codes else []
        if not matches:
            problems.append(f"{code} ({', '.join(sorted(docs))}): no class declares it")
        for match in matches:
            if len(_declarations(match)) != 1:
                problems.append(f"{match}: declared by {sorted(_declarations(match))}")
    assert not problems, "\n".join(problems)
