"""SQL is parameterised everywhere (docs/reliability.md#6-security-review): a static scan of the source tree.

An AST scanner reads every module of ``projector/``, ``reader/``, ``throughline/``, ``producers/`` and
``schemas/`` and fails on SQL text built from data that is not a constant of the code:

- the SQL argument of every ``.execute(`` / ``.executemany(`` / ``.sql(`` / ``.query(`` call, and
- every f-string, ``%``-format, ``.format()`` call or ``+`` concatenation whose literal text looks
  like SQL (wherever it is built, so a helper that returns SQL is covered too),

must be *constant-derived*: literals, module constants (this module's, or one imported by name from
another scanned module, e.g. ``projector/store/schema.py``'s ``TABLE_ORDER``), loop variables over
constants or ``range``, numbers (``len(...)``, ``x + 1``), and calls of this module's own functions (or
of a scanned module's functions imported by name) with constant-derived arguments. Everything else (a function parameter, an attribute, a value read from a request) is
data, and data goes in the parameter list (``?`` / ``$n``), never in the text.

Reviewed exceptions live in module-level allow-lists:

- ``CONSTANT_PARAMETERS``: a function parameter that carries SQL identifiers (column lists) is
  accepted only if EVERY call of that function in the module passes a constant-derived value for it;
- ``SANITIZERS``: a function whose result may enter SQL text because it admits only a fixed set of
  characters (e.g. a DuckDB size setting, which ``SET`` cannot take as a parameter);
- ``REVIEWED_EXPRESSIONS``: an exact expression of one module that is a number the code computes
  itself (``SET`` takes no parameters); an entry no longer found in its module fails the scan, so the
  list cannot go stale.

The scanner is itself tested on snippets that build SQL from request data in each of those ways.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import rel_support

REPO = rel_support.REPO
SCANNED = ("projector", "reader", "throughline", "producers", "schemas")
SQL_CALLS = {"execute", "executemany", "sql", "query"}
_SQL_TEXT = re.compile(
    r"\b(SELECT\b[\s\S]*\bFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+[\s\S]*\bSET|DELETE\s+FROM|CREATE\s+"
    r"(TABLE|INDEX|VIEW|SEQUENCE)|DROP\s+(TABLE|INDEX|VIEW)|ALTER\s+TABLE|PRAGMA\s|ATTACH\s|COPY\s|SET\s+\w+\s*=|"
    r"WITH\s+\w+\s+AS\b|\bFROM\s+\w+\s+WHERE\b|\bWHERE\s+\w+\s*(=|IN|BETWEEN)\b)"
)

#: (module path, function, parameter) -> why; every call must pass a constant-derived value for it.
CONSTANT_PARAMETERS: dict[tuple[str, str, str], str] = {
    ("projector/store/view.py", "_bucket_sql", "columns"): "a tuple of fixed column names of the turns table",
    ("projector/store/view.py", "turn_rows", "columns"): "a tuple of fixed column names of the turns table",
    (
        "projector/store/writes.py",
        "execute_over",
        "sql",
    ): "the statement of a write, built by its caller from constants",
}
#: (module path, function) -> why its result may enter SQL text.
SANITIZERS: dict[tuple[str, str], str] = {}
#: (module path, expression as ``ast.unparse`` prints it) -> why it is not data.
REVIEWED_EXPRESSIONS: dict[tuple[str, str], str] = {
    ("projector/store/projection_file.py", "self._memory_limit"): "an int the store computes (max of DuckDB's "
    "own ART index size and the configured headroom); DuckDB's SET takes no bound parameters",
}
_SAFE_BUILTINS = {"len", "int", "range", "enumerate", "min", "max", "abs", "bool", "round", "sum"}
_PURE_BUILTINS = {"str", "tuple", "list", "sorted", "dict", "set", "frozenset", "reversed", "zip", "repr"}
_NUMERIC_OPS = (ast.Add, ast.Sub)


@dataclass(frozen=True)
class Violation:
    """One place that builds SQL from non-constant data."""

    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _is_range_like(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("range",)


@dataclass
class _Scope:
    """Names bound in one function (or the module), with every expression bound to each."""

    name: str
    params: list[str] = field(default_factory=list)
    bindings: dict[str, list[ast.expr | None]] = field(default_factory=dict)  # None: bound to a safe int

    def bind(self, target: ast.expr, value: ast.expr | None, *, element: bool = False) -> None:
        if isinstance(target, ast.Name):
            self.bindings.setdefault(target.id, []).append(value if not element else _Element(value))
        elif isinstance(target, ast.Tuple | ast.List):
            for t in target.elts:
                self.bind(t.value if isinstance(t, ast.Starred) else t, value, element=True)


class _Element(ast.expr):
    """A stand-in for "an element of ``source``" (a loop or unpacking target)."""

    def __init__(self, source: ast.expr | None) -> None:
        super().__init__()
        self.source = source


def _collect(body: Iterable[ast.AST], scope: _Scope) -> None:
    """Record every binding in ``body`` (not descending into nested functions or classes)."""
    for node in body:
        for sub in _walk_local(node):
            if isinstance(sub, ast.Assign):
                for t in sub.targets:
                    scope.bind(t, sub.value)
            elif isinstance(sub, ast.AnnAssign) and sub.value is not None:
                scope.bind(sub.target, sub.value)
            elif isinstance(sub, ast.AugAssign):
                scope.bind(sub.target, ast.BinOp(left=sub.target, op=sub.op, right=sub.value))
            elif isinstance(sub, ast.For | ast.AsyncFor):
                scope.bind(
                    sub.target, None if _is_range_like(sub.iter) else sub.iter, element=not _is_range_like(sub.iter)
                )
            elif isinstance(sub, ast.comprehension):
                scope.bind(
                    sub.target, None if _is_range_like(sub.iter) else sub.iter, element=not _is_range_like(sub.iter)
                )
            elif isinstance(sub, ast.withitem) and sub.optional_vars is not None:
                scope.bind(sub.optional_vars, ast.Call(func=ast.Name(id="__unknown__"), args=[], keywords=[]))
            elif isinstance(sub, ast.NamedExpr):
                scope.bind(sub.target, sub.value)
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                scope.bindings.setdefault(sub.name, []).append(
                    ast.Call(func=ast.Name(id="__unknown__"), args=[], keywords=[])
                )


def _walk_local(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and what it holds, without the bodies of functions (each is scanned in its own scope)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _walk_local(child)


class ModuleScan:
    """The constant analysis and the SQL checks of one module."""

    def __init__(
        self,
        path: str,
        source: str,
        *,
        constant_parameters: dict[tuple[str, str, str], str] | None = None,
        sanitizers: dict[tuple[str, str], str] | None = None,
    ) -> None:
        self.path = path
        self.tree = ast.parse(source)
        self.constant_parameters = CONSTANT_PARAMETERS if constant_parameters is None else constant_parameters
        self.sanitizers = SANITIZERS if sanitizers is None else sanitizers
        self.reviewed = {e for (p, e) in REVIEWED_EXPRESSIONS if p == path} if sanitizers is None else set()
        self.reviewed_used: set[str] = set()
        # Every function and method is scanned; only module-level functions resolve calls by name.
        self.all_functions = [n for n in ast.walk(self.tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {
            n.name: n for n in self.tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        self.module = _Scope("<module>")
        _collect(self.tree.body, self.module)
        # Names imported from throughline's own modules: (module, name there), resolved in that module.
        self.imports: dict[str, tuple[str, str]] = {
            alias.asname or alias.name: (n.module, alias.name)
            for n in self.tree.body
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("throughline.")
            for alias in n.names
        }
        self.violations: list[Violation] = []

    def _imported(self, name: str) -> tuple[ModuleScan, str] | None:
        """The scanned module a name was imported from, and its name there (``None``: not one of ours)."""
        if name not in self.imports:
            return None
        module, original = self.imports[name]
        other = _scan_of(module)
        return None if other is None else (other, original)

    # -- constant-derived expressions

    def const(self, node: ast.expr | None, scope: _Scope, seen: frozenset[str] = frozenset()) -> bool:
        if node is None:
            return True  # an int from range()
        if self.reviewed and not isinstance(node, _Element) and ast.unparse(node) in self.reviewed:
            self.reviewed_used.add(ast.unparse(node))
            return True
        if isinstance(node, _Element):
            return self.const(node.source, scope, seen)
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return self._name_const(node.id, scope, seen)
        if isinstance(node, ast.JoinedStr):
            return all(self.const(v.value, scope, seen) for v in node.values if isinstance(v, ast.FormattedValue))
        if isinstance(node, ast.FormattedValue):
            return self.const(node.value, scope, seen)
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, _NUMERIC_OPS) and (
                (isinstance(node.right, ast.Constant) and type(node.right.value) is int)
                or (isinstance(node.left, ast.Constant) and type(node.left.value) is int)
            ):
                return True  # a number: str + int cannot be built, so this is arithmetic
            return self.const(node.left, scope, seen) and self.const(node.right, scope, seen)
        if isinstance(node, ast.UnaryOp):
            return self.const(node.operand, scope, seen)
        if isinstance(node, ast.BoolOp):
            return all(self.const(v, scope, seen) for v in node.values)
        if isinstance(node, ast.Compare):
            return True  # a bool
        if isinstance(node, ast.IfExp):
            return self.const(node.body, scope, seen) and self.const(node.orelse, scope, seen)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return all(self.const(e, scope, seen) for e in node.elts)
        if isinstance(node, ast.Starred):
            return self.const(node.value, scope, seen)
        if isinstance(node, ast.Dict):
            return all(self.const(k, scope, seen) for k in node.keys if k is not None) and all(
                self.const(v, scope, seen) for v in node.values
            )
        if isinstance(node, ast.Subscript):
            return self.const(node.value, scope, seen) and self.const(node.slice, scope, seen)
        if isinstance(node, ast.Slice):
            return all(self.const(p, scope, seen) for p in (node.lower, node.upper, node.step) if p is not None)
        if isinstance(node, ast.GeneratorExp | ast.ListComp | ast.SetComp):
            inner = self._comprehension_scope(node, scope)
            return self.const(node.elt, inner, seen) and all(
                self.const(c.iter, scope, seen) or _is_range_like(c.iter) for c in node.generators
            )
        if isinstance(node, ast.DictComp):
            inner = self._comprehension_scope(node, scope)
            return self.const(node.key, inner, seen) and self.const(node.value, inner, seen)
        if isinstance(node, ast.Call):
            return self._call_const(node, scope, seen)
        return False  # attributes, awaits, lambdas...: data

    def _comprehension_scope(
        self, node: ast.GeneratorExp | ast.ListComp | ast.SetComp | ast.DictComp, scope: _Scope
    ) -> _Scope:
        inner = _Scope(scope.name, scope.params, {k: list(v) for k, v in scope.bindings.items()})
        for gen in node.generators:
            ranged = _is_range_like(gen.iter)
            inner.bindings.pop(getattr(gen.target, "id", ""), None)
            inner.bind(gen.target, None if ranged else gen.iter, element=not ranged)
        return inner

    def _name_const(self, name: str, scope: _Scope, seen: frozenset[str]) -> bool:
        key = f"{self.path}:{scope.name}:{name}"
        if key in seen:
            return True  # a cycle (x = x + 1): decided by its other bindings
        seen = seen | {key}
        if name in scope.params:
            return (self.path, scope.name, name) in self.constant_parameters
        if scope is not self.module and name in scope.bindings:
            return all(self.const(v, scope, seen) for v in scope.bindings[name])
        if name in self.module.bindings:
            return all(self.const(v, self.module, seen) for v in self.module.bindings[name])
        imported = self._imported(name)
        if imported is not None:
            other, original = imported
            if original in other.module.bindings:  # a constant of that module
                return other._name_const(original, other.module, seen)
        return name in ("True", "False", "None")

    def _call_const(self, node: ast.Call, scope: _Scope, seen: frozenset[str]) -> bool:
        args = [*node.args, *(k.value for k in node.keywords)]
        func = node.func
        if isinstance(func, ast.Name):
            if (self.path, func.id) in self.sanitizers:
                return True
            if func.id in _SAFE_BUILTINS:
                return True  # numbers
            if func.id in _PURE_BUILTINS or func.id in self.functions:
                return all(self.const(a, scope, seen) for a in args)
            imported = self._imported(func.id)
            if imported is not None and imported[1] in imported[0].functions:  # that module's own function
                return all(self.const(a, scope, seen) for a in args)
            return False
        if isinstance(func, ast.Attribute):
            receiver = func.value
            if isinstance(receiver, ast.Name) and receiver.id in _PURE_BUILTINS | {"str"}:
                return all(self.const(a, scope, seen) for a in args)  # dict.fromkeys(...), str.join(...)
            return self.const(receiver, scope, seen) and all(self.const(a, scope, seen) for a in args)
        return False

    # -- the checks

    def scan(self) -> list[Violation]:
        self._scan_body(self.tree.body, self.module)
        for fn in self.all_functions:
            scope = _Scope(fn.name)
            a = fn.args
            scope.params = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            scope.params += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
            _collect(fn.body, scope)
            self._scan_body(fn.body, scope)
        self._check_constant_parameters()
        for stale in sorted(self.reviewed - self.reviewed_used):
            self.violations.append(Violation(self.path, 1, f"reviewed expression {stale!r} is no longer in SQL here"))
        return self.violations

    def _scan_body(self, body: Iterable[ast.AST], scope: _Scope) -> None:
        for stmt in body:
            for node in _walk_local(stmt):
                if isinstance(node, ast.Call):
                    self._check_sql_call(node, scope)
                if isinstance(node, ast.JoinedStr | ast.BinOp) or (
                    isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
                ):
                    self._check_sql_text(node, scope)

    def _check_sql_call(self, node: ast.Call, scope: _Scope) -> None:
        if not (isinstance(node.func, ast.Attribute) and node.func.attr in SQL_CALLS):
            return
        sql = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg in ("query", "sql")), None)
        if sql is None:
            return
        if not self.const(sql, scope):
            self.violations.append(
                Violation(
                    self.path, node.lineno, f".{node.func.attr}() with SQL built from data: {ast.unparse(sql)[:120]}"
                )
            )

    def _check_sql_text(self, node: ast.expr, scope: _Scope) -> None:
        literal = " ".join(_literal_parts(node))
        if not _SQL_TEXT.search(literal):
            return
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            built_from: list[ast.expr] = [node.right]
        elif isinstance(node, ast.Call):
            built_from = [*node.args, *(k.value for k in node.keywords)]
        else:
            built_from = [node]
        if not all(self.const(part, scope) for part in built_from):
            self.violations.append(
                Violation(self.path, node.lineno, f"SQL text built from data: {ast.unparse(node)[:120]}")
            )

    def _check_constant_parameters(self) -> None:
        for (path, function, parameter), _why in self.constant_parameters.items():
            if path == self.path:
                name, fn = function, self.functions.get(function)
                if fn is None:
                    if self.constant_parameters is CONSTANT_PARAMETERS:  # keep the reviewed list current
                        self.violations.append(Violation(path, 1, f"allow-listed function {function} no longer exists"))
                    continue
            else:
                # A module that imports the function by name must pass it constants too.
                found = self._imported_function(path, function)
                if found is None:
                    continue
                name, fn = found
            names = [p.arg for p in (*fn.args.posonlyargs, *fn.args.args)]
            index = names.index(parameter)
            for caller in self.all_functions:
                scope = _Scope(caller.name)
                a = caller.args
                scope.params = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                _collect(caller.body, scope)
                for node in ast.walk(caller):
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                        given = [k.value for k in node.keywords if k.arg == parameter]
                        if not given and index < len(node.args):
                            given = [node.args[index]]
                        for value in given:
                            if not self.const(value, scope):
                                self.violations.append(
                                    Violation(
                                        self.path,
                                        node.lineno,
                                        f"{function}({parameter}=...) called with data: {ast.unparse(value)[:80]}",
                                    )
                                )

    def _imported_function(self, path: str, function: str) -> tuple[str, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        """The local name and definition of ``function`` of module ``path`` when this module imports it by name."""
        for local, (module, original) in self.imports.items():
            if original != function:
                continue
            other = _scan_of(module)
            if other is not None and other.path == path and function in other.functions:
                return local, other.functions[function]
        return None


#: Where the installed package names of the scanned folders live (pyproject's package-dir).
_PACKAGE_DIRS = {
    "throughline.projector": "projector",
    "throughline.reader": "reader",
    "throughline.producers": "producers",
    "throughline.schemas": "schemas",
    "throughline": "throughline",
}
_SCANS: dict[str, ModuleScan | None] = {}


def _scan_of(module: str) -> ModuleScan | None:
    """The scan of a throughline module by its dotted name (cached), or ``None`` when it is not a file here."""
    if module not in _SCANS:
        _SCANS[module] = None
        for package, folder in _PACKAGE_DIRS.items():
            if module == package or module.startswith(package + "."):
                rest = module[len(package) :].lstrip(".").replace(".", "/")
                base = REPO / folder / rest if rest else REPO / folder
                for path in (base.with_suffix(".py"), base / "__init__.py"):
                    if path.is_file():
                        _SCANS[module] = ModuleScan(path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8"))
                        break
                break
    return _SCANS[module]


def _literal_parts(node: ast.AST) -> Iterator[str]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            yield sub.value


SNIPPET_ALLOWED = {("snippet.py", "_turn_rows", "columns"): "the scanner's own test"}


def scan_source(path: str, source: str) -> list[Violation]:
    """The violations of a snippet (with the snippet allow-list)."""
    return ModuleScan(path, source, constant_parameters=SNIPPET_ALLOWED, sanitizers={}).scan()


def scanned_files() -> list[Path]:
    out: list[Path] = []
    for folder in SCANNED:
        out.extend(p for p in sorted((REPO / folder).rglob("*.py")) if "__pycache__" not in p.parts)
    return out


# ------------------------------------------------------------------------------------------ the scan


def test_no_sql_is_built_from_data_anywhere() -> None:
    files = scanned_files()
    assert len(files) > 20
    violations: list[Violation] = []
    sql_calls = 0
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        scan = ModuleScan(rel, path.read_text(encoding="utf-8"))
        violations.extend(scan.scan())
        sql_calls += sum(
            1
            for n in ast.walk(scan.tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in SQL_CALLS
        )
    rel_support.record(
        "security", "sql_parameterised", files=len(files), sql_calls=sql_calls, violations=len(violations)
    )
    assert not violations, "SQL built from data:\n" + "\n".join(map(str, violations))
    assert sql_calls >= 30  # the projection's queries were found (the scan is not looking at nothing)


def _defined(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_allowance_names_code_that_still_exists() -> None:
    """An allowance outlives its code when the code moves or goes: it would then excuse whatever comes to
    carry its name, so each must name a module, function, parameter or expression that is there."""
    stale: list[str] = []
    trees: dict[str, ast.Module] = {}

    def tree(path: str) -> ast.Module | None:
        if path not in trees and (REPO / path).is_file():
            trees[path] = ast.parse((REPO / path).read_text(encoding="utf-8"))
        return trees.get(path)

    for (path, function, parameter), _why in CONSTANT_PARAMETERS.items():
        module = tree(path)
        fn = _defined(module).get(function) if module is not None else None
        if fn is None or parameter not in {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}:
            stale.append(f"CONSTANT_PARAMETERS {path}::{function}({parameter})")
    for (path, function), _why in SANITIZERS.items():
        module = tree(path)
        if module is None or function not in _defined(module):
            stale.append(f"SANITIZERS {path}::{function}")
    for (path, expression), _why in REVIEWED_EXPRESSIONS.items():
        module = tree(path)
        if module is None or not any(
            isinstance(n, ast.expr) and ast.unparse(n) == expression for n in ast.walk(module)
        ):
            stale.append(f"REVIEWED_EXPRESSIONS {path}: {expression}")
    assert not stale, "allowances naming code that is gone (remove or re-anchor them):\n" + "\n".join(stale)


# ------------------------------------------------------------------------------------------ the scanner itself

BAD = {
    "f-string": "def f(cur, project):\n    cur.execute(f\"SELECT * FROM t WHERE p = '{project}'\")\n",
    "percent": "def f(cur, project):\n    cur.execute(\"SELECT * FROM t WHERE p = '%s'\" % project)\n",
    "format": "def f(cur, project):\n    cur.execute(\"SELECT * FROM t WHERE p = '{}'\".format(project))\n",
    "concatenation": 'def f(cur, project):\n    cur.execute("SELECT * FROM t WHERE p = \'" + project + "\'")\n',
    "via a local": "def f(cur, req):\n    sql = 'DELETE FROM t WHERE id = ' + req.args['id']\n    cur.execute(sql)\n",
    "in a helper": "def where(project):\n    return f\"SELECT x FROM t WHERE p = '{project}'\"\n",
    "helper call": "def q(x):\n    return x\ndef f(cur, request):\n    cur.execute(q(request.body))\n",
    "attribute": "def f(self):\n    self.cur.sql(f'SELECT {self.column} FROM t')\n",
    "query()": "import duckdb\ndef f(name):\n    duckdb.query('SELECT * FROM ' + name)\n",
    "loop over data": "def f(cur, names):\n    for n in names:\n        cur.execute(f'DROP TABLE {n}')\n",
    "augmented": "def f(cur, x):\n    sql = 'SELECT a FROM t WHERE '\n    sql += x\n    cur.execute(sql)\n",
    "an imported name that is no constant": (
        "from throughline.projector.store.schema import ensure_schema\n"
        "def f(cur):\n    cur.execute(f'SELECT * FROM {ensure_schema}')\n"
    ),
    "allow-listed parameter given data": (
        "def _turn_rows(cur, columns):\n    cur.execute(f\"SELECT {', '.join(columns)} FROM turns\")\n"
        "def g(cur, request):\n    _turn_rows(cur, request.columns)\n"
    ),
}
GOOD = {
    "parameters": "def f(cur, project):\n    cur.execute('SELECT * FROM t WHERE p = ?', [project])\n",
    "constant f-string": "COLS = ('a', 'b')\ndef f(cur, p):\n    cur.execute(f\"SELECT {', '.join(COLS)} FROM t WHERE p = $1\", [p])\n",
    "placeholders by index": (
        "def f(cur, keys):\n    sql = ' UNION ALL '.join(f'SELECT k FROM t WHERE k = ${i + 1}' for i in range(len(keys)))\n"
        "    cur.execute(sql, keys)\n"
    ),
    "fixed table names": (
        "ORDER = {'a': 'x', 'b': 'y'}\ndef f(cur):\n    for table, order in ORDER.items():\n"
        "        cur.execute(f'SELECT * FROM {table} ORDER BY {order}')\n"
    ),
    "allow-listed parameter given constants": (
        "_VIEW = ('a', 'b')\ndef _turn_rows(cur, columns):\n    cur.execute(f\"SELECT {', '.join(columns)} FROM turns\")\n"
        "def g(cur):\n    _turn_rows(cur, _VIEW)\n    _turn_rows(cur, ('row_id', *_VIEW))\n"
    ),
    "another module's constants": (
        "from throughline.projector.store.schema import TABLE_ORDER\ndef f(cur):\n"
        "    for table, order in TABLE_ORDER.items():\n        cur.execute(f'SELECT * FROM {table} ORDER BY {order}')\n"
    ),
    "a message, not SQL": "def f(x):\n    raise ValueError(f'cannot select {x} from the list')\n",
}


def test_the_scanner_flags_sql_built_from_request_data() -> None:
    for name, source in BAD.items():
        found = scan_source("snippet.py", source)
        assert found, f"the scanner missed: {name}"


def test_the_scanner_accepts_parameterised_and_constant_sql() -> None:
    for name, source in GOOD.items():
        found = scan_source("snippet.py", source)
        assert not found, f"{name}: {[str(v) for v in found]}"


def test_an_allow_listed_function_imported_elsewhere_is_checked_there_too() -> None:
    """``execute_over`` (projector/store/writes.py) takes SQL text; a module that imports it by name
    must hand it constants, as writes.py's own callers must."""
    imports = "from throughline.projector.store.writes import execute_over as run\n"
    bad = imports + "def f(cur, req):\n    run(cur, req.args['sql'], None)\n"
    good = imports + "SQL = 'SELECT 1'\ndef f(cur, rows):\n    run(cur, SQL + ' FROM tl_rows', rows)\n"
    assert [v.what for v in ModuleScan("projector/snippet.py", bad).scan()] == [
        "execute_over(sql=...) called with data: req.args['sql']"
    ]
    assert ModuleScan("projector/snippet.py", good).scan() == []
