"""The spec's rule ids against the tests and the code (spec/README.md, "Rule ids").

A rule is *defined* by a paragraph of a ``spec/*.md`` file that starts with its id in bold,
``**TOP-1**``. A rule is *cited* when its id appears as a whole word in the name of a test
function (``test_*``, with ``_`` read as ``-``: ``test_TOP_1_...``) or in that function's
docstring, in a ``tests/**/test_*.py`` file. Every defined rule must be cited; an id of a
family the spec uses (``TOP``, ``WAL``, ...) that no spec file defines must not appear in the
code, tests, spec or docs; and no id is defined twice. Nor do they cite documents outside the
repository (the source designs by file or section number, research notes, planning issues):
spec/README.md says which public design each part follows, by title.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC_DIR = REPO / "spec"
#: Where ids may be cited: every folder of the repository's own text, plus its top-level files.
CITING = (
    "tidelog",
    "backends",
    "adapters",
    "conformance",
    "bench",
    "service",
    "model",
    "tests",
    "spec",
    "docs",
)
CITING_FILES = ("README.md", "noxfile.py", "run.py", "setup.py", "pyproject.toml")
SUFFIXES = (".py", ".md", ".toml")

DEFINITION = re.compile(r"^\*\*([A-Z]+-\d+)\*\*", re.MULTILINE)
#: A paragraph that starts with a bold id in any other form (``**TOP-1 Title.**``).
MISFORMED = re.compile(r"^\*\*([A-Z]+-\d+)(?!\d|\*\*)", re.MULTILINE)
RULE_ID = re.compile(r"\b([A-Z]+)-(\d+)\b")
#: A citation of something a reader of the repository cannot open: a source design by its file
#: number or section sign, notes kept outside the repository, or a planning issue number.
EXTERNAL = re.compile(
    r"(?i:\bseeds?\s?(?:0\d|§)|\bseeds/|\bissue\s\d+|\bresearch(?:/| §)|shared/research"
    r"|anchors\.md|failover\.md)|\banchors? [A-Z]\b|\bJQ #"
)


def spec_files() -> list[Path]:
    return sorted(SPEC_DIR.glob("*.md"))


def definitions() -> list[tuple[str, str]]:
    """(id, spec file name) for every definition, in file order."""
    return [
        (m[1], path.name)
        for path in spec_files()
        for m in DEFINITION.finditer(path.read_text(encoding="utf-8"))
    ]


def defined_rules() -> set[str]:
    return {rule for rule, _ in definitions()}


def cited_rules() -> set[str]:
    """Ids in the name (``_`` as ``-``) or docstring of every test function under tests/."""
    cited: set[str] = set()
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                text = node.name.replace("_", "-") + " " + (ast.get_docstring(node) or "")
                cited |= {m[0] for m in RULE_ID.finditer(text)}
    return cited


def citing_files() -> list[Path]:
    files = [REPO / name for name in CITING_FILES if (REPO / name).is_file()]
    for folder in CITING:
        files += [
            p
            for p in sorted((REPO / folder).rglob("*"))
            if p.suffix in SUFFIXES and p.is_file() and "egg-info" not in p.parts
        ]
    return files


def test_spec_rules_follow_one_form() -> None:
    """Every rule definition in spec/*.md is written ``**ID-n**`` (title, if any, after it), so
    one pattern finds them all; the spec defines at least the families SPEC.md lists."""
    bad = [
        f"{path.name}: {m[0]}"
        for path in spec_files()
        for m in MISFORMED.finditer(path.read_text(encoding="utf-8"))
    ]
    assert bad == []
    families = {rule.split("-")[0] for rule in defined_rules()}
    assert {"TOP", "TMB", "DEL", "RET", "SUB", "QUE", "DUR", "ERR", "URI", "CAP"} <= families
    assert {"FSN", "RING", "CON", "FLT", "WAL", "SEG", "BDEV", "SF", "FWD", "CNF"} <= families


def test_no_rule_is_defined_twice() -> None:
    """A rule id has one definition across all spec files."""
    where: dict[str, list[str]] = {}
    for rule, name in definitions():
        where.setdefault(rule, []).append(name)
    twice = {rule: names for rule, names in where.items() if len(names) > 1}
    assert twice == {}


def test_every_spec_rule_is_cited_by_a_test() -> None:
    """Every rule any spec/*.md defines (SPEC.md included) is cited by the name or docstring of
    a test function under tests/."""
    defined = defined_rules()
    assert len(defined) >= 300, len(defined)
    missing = sorted(defined - cited_rules())
    assert missing == []


def test_no_citation_of_an_undefined_rule() -> None:
    """An id of a rule family the spec uses, cited anywhere in the code, tests, spec or docs,
    names a rule some spec file defines (no dangling citations)."""
    defined = defined_rules()
    families = {rule.split("-")[0] for rule in defined}
    dangling = sorted(
        f"{path.relative_to(REPO)}: {m[0]}"
        for path in citing_files()
        for m in RULE_ID.finditer(path.read_text(encoding="utf-8"))
        if m[1] in families and m[0] not in defined
    )
    assert dangling == []


def test_no_citation_of_a_document_outside_the_repository() -> None:
    """Code, tests, spec and docs cite rule ids and files of the repository, never the source
    designs by number or section, notes kept elsewhere, or planning issues (spec/README.md,
    "Provenance", names the designs by title)."""
    found = sorted(
        f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m[0]}"
        for path in citing_files()
        if path != Path(__file__).resolve()
        for text in [path.read_text(encoding="utf-8")]
        for m in EXTERNAL.finditer(text)
    )
    assert found == []
