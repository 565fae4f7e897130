"""Every citation resolves inside the repository (docs/spec.md#system is the cited authority).

A newcomer with a clone must be able to open what the code and the documents cite. So this test scans
the source, tests, scripts, benchmarks and documents and fails on:

- a link to a repository document that does not exist, or to an anchor the document does not have:
  ``docs/NAME.md#anchor`` anywhere (relative to the repository root), and markdown links
  ``[text](path#anchor)`` in ``.md`` files (relative to that file). A document's anchors are its
  explicit ``<a id="...">`` and the GitHub slugs of its headings;
- a section cited by its name, ``docs/NAME.md, "Name"``, that the document does not have (a heading,
  or a bold label opening a line or a list item, that starts with the name);
- a bare citation of a document a clone does not hold: the product contract by its file name or by its
  section numbers, the ADR or its decision numbers (except in ``docs/spec.md``, which restates them),
  an issue or a phase of work by number. Cite ``docs/spec.md#anchor`` or say the behaviour instead;
- ``item N`` outside the benchmark's own files, or naming a section ``## N.`` that ``docs/benchmarks.md``
  does not have (inside them, ``item N`` is that file's numbered section N).

Transcript fixtures (``tests/fixtures/``) are data, not citations, and are not scanned.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve()
SPEC = ROOT / "docs" / "spec.md"

#: What is scanned: every text file of these kinds, outside these directories.
SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".cfg", ".txt", ".ini", ""}
SKIP_DIRS = {".git", ".venv", "__pycache__", "node_modules", ".mypy_cache", ".ruff_cache", "fixtures"}
SKIP_SUFFIX_DIRS = ("throughline.egg-info",)

#: The benchmark's own files, where ``item N`` is docs/benchmarks.md's numbered section N.
BENCH_FILES = re.compile(r"^(bench/|docs/benchmarks\.md$|tests/integration/test_bench_)")

#: Bare citations of documents a clone does not hold. Written so this file does not match itself.
BARE = {
    "the product contract's file or sections": re.compile(r"\b" + "CONTRACT" + r"\b"),
    "the ADR": re.compile(r"\b" + "ADR" + r"\b"),
    "an ADR decision by number": re.compile(r"\b[Dd]ecisions? " + r"\d"),
    "an issue by number": re.compile(r"\b[Ii]ssues? " + r"#?\d"),
    "a phase of work by number": re.compile(r"\b[Pp]hases? " + r"\d"),
    "a section by number": re.compile(r"\b[Ss]ections? " + r"\d"),
}
#: What docs/spec.md may say bare: it is where the ADR and its decisions are restated.
SPEC_MAY = {"the ADR", "an ADR decision by number"}
ITEM = re.compile(r"\b[Ii]tems? (\d+)((?:(?:, | and |-)\d+)*)")

#: A repository document named anywhere (root-relative), with an optional anchor.
DOC_REF = re.compile(r"(?<![\w./-])(docs/[\w./-]*?\.(?:md|json))(?:#([\w-]+)((?:,? (?:and )?#[\w-]+)*))?")
#: Paths in other projects' repositories that a document quotes (not this repository's documents).
FOREIGN = {"docs/hooks/session-lifecycle.md"}  # github/copilot-cli's hook documentation, in docs/hosts.md
#: A markdown link's target (not an image's or a web page's).
MD_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
#: A document's section cited by name: docs/design.md, "Quiet reads" (or without the comma, or in brackets).
QUOTED = re.compile(r'(?<![\w./-])(docs/[\w./-]+\.md),? \(?"([^"\n]+)"')
BOLD_LABEL = re.compile(r"^\s*(?:[-*] )?\*\*([^*]+)\*\*")
ANCHOR_TAG = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def scanned_files() -> list[Path]:
    """The text files whose citations must resolve (this file excluded: it spells the patterns)."""
    out = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if not path.is_file() or path == THIS or path.suffix not in SUFFIXES:
            continue
        if any(part in SKIP_DIRS or part.endswith(SKIP_SUFFIX_DIRS) for part in rel.parts[:-1]):
            continue
        if path.suffix == "" and rel.parts[0] not in ("scripts", "Dockerfile"):
            continue  # only the scripts are extensionless text
        out.append(path)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFC", text).lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of a markdown file: explicit ``<a id>`` tags and its headings' slugs."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text("utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        found.update(ANCHOR_TAG.findall(line))
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


@cache
def section_names(path: Path) -> tuple[str, ...]:
    """The names a section of a markdown file is cited by: its headings and bold labels, without markup."""
    names = []
    for line in path.read_text("utf-8").splitlines():
        match = HEADING.match(line) or BOLD_LABEL.match(line)
        if match:
            names.append(match.group(match.lastindex or 1).replace("`", "").casefold())
    return tuple(names)


def resolve(target: Path, anchor: str | None) -> str | None:
    """Why ``target#anchor`` does not resolve, or None when it does."""
    if not target.exists():
        return "no such file"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"no anchor #{anchor}"
    return None


def broken_links(path: Path, text: str) -> list[str]:
    """The links in ``text`` (the content of ``path``) that do not resolve."""
    rel = path.relative_to(ROOT)
    problems = []
    if path.suffix == ".md":
        for target in MD_LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            why = resolve(resolved, anchor or None)
            if why:
                problems.append(f"{rel}: link ({target}): {why}")
        text = MD_LINK.sub("", text)  # a root-relative mention inside a link target was judged above
    for file_part, name in QUOTED.findall(text):
        target = ROOT / file_part
        if target.exists() and not any(n.startswith(name.casefold()) for n in section_names(target)):
            problems.append(f'{rel}: {file_part}, "{name}": no section of that name')
    for file_part, first, more in DOC_REF.findall(text):
        if file_part in FOREIGN:
            continue
        for anchor in [first or None, *re.findall(r"#([\w-]+)", more)]:  # "docs/x.md#a, #b and #c"
            why = resolve(ROOT / file_part, anchor)
            if why:
                problems.append(f"{rel}: {file_part}{'#' + anchor if anchor else ''}: {why}")
    return problems


def bench_sections() -> set[int]:
    """The numbered sections ``## N.`` of docs/benchmarks.md."""
    text = (ROOT / "docs" / "benchmarks.md").read_text("utf-8")
    return {int(n) for n in re.findall(r"^##+ (\d+)\. ", text, flags=re.M)}


def bare_citations(path: Path, text: str, sections: set[int]) -> list[str]:
    """The citations in ``text`` of documents or numbers a clone cannot open."""
    rel = path.relative_to(ROOT).as_posix()
    problems = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for what, pattern in BARE.items():
            if path == SPEC and what in SPEC_MAY:
                continue
            for match in pattern.finditer(line):
                problems.append(f"{rel}:{lineno}: {what}: {line[max(0, match.start() - 30) : match.end() + 30]!r}")
        for match in ITEM.finditer(line):
            numbers = {int(n) for n in re.findall(r"\d+", match.group(0))}
            if not BENCH_FILES.match(rel):
                problems.append(f"{rel}:{lineno}: 'item N' outside the benchmark's files: {match.group(0)!r}")
            elif numbers - sections:
                problems.append(f"{rel}:{lineno}: docs/benchmarks.md has no section {sorted(numbers - sections)}")
    return problems


def test_the_scan_sees_the_tree_and_the_spec() -> None:
    files = scanned_files()
    names = {p.relative_to(ROOT).as_posix() for p in files}
    assert len(files) > 200
    assert {"docs/spec.md", "reader/page.py", "bench/report.py", "scripts/oracle-mutants"} <= names
    assert not any(name.startswith("tests/fixtures/") for name in names)
    assert {"decision-1", "decision-10", "page-token-binding", "freshness", "observer"} <= anchors(SPEC)


def test_every_link_to_a_document_resolves() -> None:
    problems = [p for path in scanned_files() for p in broken_links(path, path.read_text("utf-8"))]
    assert problems == []


def test_no_bare_citation_of_a_document_outside_the_repository() -> None:
    sections = bench_sections()
    assert {1, 4, 8} <= sections
    problems = [p for path in scanned_files() for p in bare_citations(path, path.read_text("utf-8"), sections)]
    assert problems == []


def test_every_decision_of_the_adr_has_its_anchor() -> None:
    text = SPEC.read_text("utf-8")
    for n in range(1, 11):
        assert f'<a id="decision-{n}"></a>' in text


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("see docs/spec.md#page-token-binding here", False),
        ("see docs/spec.md#page-token-bound here", True),  # an anchor the spec does not have
        ("see docs/spek.md#freshness here", True),  # a file that does not exist
        ("see docs/benchmarks.md#4-freshness-at-every-rate", False),  # a heading's slug
        ("(docs/spec.md#read-range, #snapshot and #pagination)", False),
        ("(docs/spec.md#read-range, #snapshots)", True),  # a later anchor of the same file
        ('(docs/design.md, "Quiet reads")', False),  # a bold label
        ('(docs/design.md, "Varints")', False),  # a heading
        ('(docs/design.md, "Noisy reads")', True),
    ],
)
def test_the_link_check_catches_a_broken_anchor(text: str, found: bool) -> None:
    assert bool(broken_links(ROOT / "reader" / "page.py", text)) is found


@pytest.mark.parametrize(
    ("rel", "text", "found"),
    [
        ("reader/page.py", "Freshness (" + "CONTRACT section 5).", True),
        ("reader/page.py", "one page (ADR 0005 " + "decisions 1-9).", True),
        ("reader/page.py", "the cliff of " + "issue 15", True),
        ("reader/page.py", "the reader's " + "phase 2", True),
        ("reader/page.py", "Freshness (docs/spec.md#freshness).", False),
        ("reader/page.py", "reliability " + "item 1", True),
        ("bench/report.py", "the ceiling " + "item 1 defines", False),
        ("bench/report.py", "the ceiling " + "item 9 defines", True),
        ("docs/spec.md", "ADR 0005, " + "decisions 1-9", False),
    ],
)
def test_the_citation_check_catches_a_bare_citation(rel: str, text: str, found: bool) -> None:
    assert bool(bare_citations(ROOT / rel, text, {1, 2, 3, 4, 5, 6, 7, 8})) is found
