"""The theory documents stay true to the code that cites them and to the catalog they describe.

* Every citation of kl-math.md or patterns.md in the package, the README, the rule pages, the
  tests, the fixtures and the docs names a section heading (and, for kl-math.md §8, a table row
  and a fix) that exists in docs/.
* No citation points at design/, a folder that users who clone the repository do not have.
* The table of docs/kl-math.md §8.2 and the row list of §8.3 agree with `klaudit.catalog`: row
  numbers, objectives, rules, and how tests/test_catalog.py proves each row.
"""

from __future__ import annotations

import inspect
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from klaudit import catalog
from klaudit.catalog import Aggregation, Objective

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
KL_MATH = DOCS / "kl-math.md"
THIS_FILE = Path(__file__).resolve()

# ----- reading the documents ---------------------------------------------------------------------

_NUMBERED_HEADING = re.compile(r"^#{2,6}\s+(\d+(?:\.\d+)?)\.?\s", re.MULTILINE)
_APPENDIX_HEADING = re.compile(r"^#{2,6}\s+(?:Appendix\s+([A-Z])\.|([A-Z]\.\d+)\s)", re.MULTILINE)


def _sections(path: Path) -> set[str]:
    """The section ids of a document's headings: '8', '3.1', 'A', 'A.3'."""
    text = path.read_text(encoding="utf-8")
    ids = set(_NUMBERED_HEADING.findall(text))
    for appendix, subsection in _APPENDIX_HEADING.findall(text):
        ids.add(appendix or subsection)
    return ids


def _section_text(path: Path, heading_id: str) -> str:
    """The text under the heading `heading_id` up to the next heading of the same or higher level."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = level = None
    for index, line in enumerate(lines):
        match = re.match(r"^(#{2,6})\s+(\S+?)\.?\s", line)
        if match and start is None and match.group(2) == heading_id:
            start, level = index + 1, len(match.group(1))
        elif match and start is not None and len(match.group(1)) <= level:
            return "\n".join(lines[start:index])
    assert start is not None, f"{path.name} has no heading {heading_id}"
    return "\n".join(lines[start:])


def _table(text: str, *, header: bool = False) -> list[list[str]]:
    """The rows of the first markdown table in `text` as lists of stripped cells, the header row
    first when `header` is true."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if all(set(cell) <= set("-: ") for cell in cells):
            continue  # the separator line
        rows.append(cells)
    return rows if header else rows[1:]


# ----- citations --------------------------------------------------------------------------------

_MENTION = re.compile(r"(?P<folder>design/|docs/)?(?P<doc>kl-math(?:\.md)?|patterns\.md)")
_SEPARATOR = re.compile(r"\s*(?:,|;|and|to|&|-|–)?\s*")
_SECTION = re.compile(r"(?:§\s*|sections?\s+)(\d+(?:\.\d+)?)(?![\d.]*\w)")
_BARE_NUMBER = re.compile(r"(\d+b?(?:\.\d+)?)(?![\d.]*\w)")
_APPENDIX = re.compile(r"(?:App\.|Appendix)\s+([A-Z])\b")
_ROWS = re.compile(r"rows?\s+")
_FIX = re.compile(r"(R-[A-F])\b")
DOC_FILES = {"kl-math": KL_MATH, "kl-math.md": KL_MATH, "patterns.md": DOCS / "patterns.md"}


@dataclass
class Citation:
    """One mention of a theory document and what it points at."""

    where: str
    folder: str
    doc: Path
    sections: list[str] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)


def parse_citation(where: str, folder: str, doc: str, after: str) -> Citation:
    """Read the references right after a mention: '§8, rows 3 and 4', 'sections 5 and 8',
    '§3-4', '12.2', 'App. A', 'R-C, R-B'. Bare numbers count as sections until 'row' is read."""
    citation = Citation(where, folder or "", DOC_FILES[doc])
    text = after.lstrip("`'\")")
    position, numbers_are = 0, "sections"
    while True:
        at = _SEPARATOR.match(text, position).end()
        if match := _SECTION.match(text, at):
            citation.sections.append(match.group(1))
            numbers_are = "sections"
        elif match := _APPENDIX.match(text, at):
            citation.sections.append(match.group(1))
        elif match := _ROWS.match(text, at):
            numbers_are = "rows"
        elif match := _FIX.match(text, at):
            citation.fixes.append(match.group(1))
        elif match := _BARE_NUMBER.match(text, at):
            getattr(citation, numbers_are).append(match.group(1))
        else:
            return citation
        position = match.end()


def _cited_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    for folder, patterns in (("klaudit", ("*.py", "*.md")), ("tests", ("*.py",)), ("fixtures", ("*.py", "*.md")),
                             ("docs", ("*.md",))):
        for pattern in patterns:
            files.extend(sorted((ROOT / folder).rglob(pattern)))
    return [path for path in files if path.is_file() and path.resolve() != THIS_FILE]


def _flowing(text: str) -> str:
    """Line breaks (and the comment or docstring indentation after them) read as one space, and a
    string literal continued on the next line ("... (kl-math.md "\n"section 5)") as one string."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", re.sub(r'"\s*\n\s*f?"', "", text))


def citations() -> list[Citation]:
    found = []
    for path in _cited_files():
        text = _flowing(path.read_text(encoding="utf-8"))
        for mention in _MENTION.finditer(text):
            where = f"{path.relative_to(ROOT)}: ...{text[max(0, mention.start() - 20):mention.end() + 30]}..."
            after = text[mention.end():mention.end() + 80]
            found.append(parse_citation(where, mention["folder"], mention["doc"], after))
    return found


def _table_numbers() -> list[str]:
    return [row[0] for row in _table(_section_text(KL_MATH, "8.2"))]


def _fix_names() -> set[str]:
    return {match.group(1) for row in _table(_section_text(KL_MATH, "8.5")) if (match := _FIX.match(row[0]))}


def _broken(citation: Citation) -> list[str]:
    if not citation.doc.is_file():
        return [f"{citation.doc.relative_to(ROOT)} does not exist"]
    problems = [f"no section {s}" for s in citation.sections if s not in _sections(citation.doc)]
    if citation.doc == KL_MATH:
        problems += [f"no row {row} in §8.2" for row in citation.rows if row not in _table_numbers()]
        problems += [f"no fix {fix} in §8.5" for fix in citation.fixes if fix not in _fix_names()]
    return problems


@pytest.mark.parametrize(
    "text, sections, rows, fixes",
    [
        ("§8, rows 3 and 4). The", ["8"], ["3", "4"], []),
        ("§7 and §8, rows 22 to 24). Exact", ["7", "8"], ["22", "24"], []),
        ("` §1 and §8). A per-sample", ["1", "8"], [], []),
        (" sections 5 and 8). A row", ["5", "8"], [], []),
        (" §3-4 says", ["3", "4"], [], []),
        (" 12.2)", ["12.2"], [], []),
        (" 5: k1 loss with 1/L", ["5"], [], []),
        (" section 4.3, App. A E).", ["4.3", "A"], [], []),
        (" row 22 applies)", [], ["22"], []),
        (" §8, row 1b).", ["8"], ["1b"], []),
        (" R-C, R-B).", [], [], ["R-C", "R-B"]),
        ("`).", [], [], []),
        (" (see the README)", [], [], []),
    ],
)
def test_citations_are_read_as_written(text, sections, rows, fixes):
    citation = parse_citation("example", "", "kl-math.md", text)
    assert (citation.sections, citation.rows, citation.fixes) == (sections, rows, fixes)


def test_a_citation_of_a_missing_section_row_or_fix_is_reported():
    citation = parse_citation("example", "docs/", "kl-math.md", " §13, row 26, R-G")
    assert citation.sections == ["13"] and citation.rows == ["26"] and citation.fixes == []
    assert _broken(citation) == ["no section 13", "no row 26 in §8.2"]
    assert _broken(parse_citation("example", "", "kl-math.md", " §8, row 24, R-F")) == []


def test_every_citation_points_at_an_existing_section_row_and_fix():
    found = citations()
    assert len(found) > 30, "the citation scan found too little to be trusted"
    assert any(c.rows for c in found) and any(c.fixes for c in found)
    assert any(c.doc.name == "patterns.md" for c in found)
    broken = {c.where: _broken(c) for c in found if _broken(c)}
    assert not broken, "\n".join(f"{where}: {', '.join(problems)}" for where, problems in broken.items())


def test_no_citation_points_at_the_design_folder():
    stale = [c.where for c in citations() if c.folder == "design/"]
    assert not stale, "\n".join(stale)


# ----- the table against the catalog ------------------------------------------------------------

PROOF_KINDS = ("zero", "exact", "multiple", "distinct")


def proof_kind(row: catalog.Row) -> str:
    """How tests/test_catalog.py::test_row_objective_holds_exactly proves `row` (docs/kl-math.md §8.4)."""
    if row.objective is Objective.ZERO:
        return "zero"
    if row.identity:
        return "exact" if row.config.aggregation is Aggregation.SUM else "multiple"
    return "distinct"


def _by_number() -> dict[str, list[catalog.Row]]:
    rows: dict[str, list[catalog.Row]] = {}
    for row in catalog.CATALOG:
        rows.setdefault(row.number, []).append(row)
    return rows


def _rules(cell: str) -> set:
    return {None if rule == "—" else rule for rule in re.split(r",\s*", cell)}


def test_the_table_lists_rows_1_to_25_in_order():
    numbers = _table_numbers()
    assert numbers == (["1", "1b", "1c", "2", "3", "3b", "4", "5", "5b", "5c", "6", "7", "8", "9", "9b", "9c"] + ["10", "10b", "10c", "11", "12", "13"]
                       + ["13b", "13c", "13d", "13e"] + [str(n) for n in range(14, 19)] + ["18b"] + [str(n) for n in range(19, 26)])


def test_each_table_row_has_the_catalog_objective_rule_and_proof():
    header, *body = _table(_section_text(KL_MATH, "8.2"), header=True)
    table = {row[0]: row for row in body}
    columns = {name: index for index, name in enumerate(header)}
    by_number = _by_number()
    for number, cells in table.items():
        rows = by_number.get(number)
        if rows is None:  # a row the catalog does not hold says so
            assert cells[columns["objective"]] == "—" and cells[columns["proof"]] == "—", number
            continue
        objectives = {row.objective.value for row in rows}
        assert len(objectives) == 1, f"catalog row {number} has several objectives: {objectives}"
        assert cells[columns["objective"]] == objectives.pop(), number
        assert _rules(cells[columns["rule"]]) == {row.rule for row in rows}, number
        named = {kind for kind in PROOF_KINDS if re.search(rf"\b{kind}\b", cells[columns["proof"]])}
        assert named == {proof_kind(row) for row in rows}, number
    numbered = {number for number in by_number if re.fullmatch(r"\d+[bcde]?", number)}
    assert numbered <= set(table), f"catalog rows missing from §8.2: {numbered - set(table)}"


def test_the_row_list_is_the_catalog():
    listed = Counter(tuple(cells) for cells in _table(_section_text(KL_MATH, "8.3")))
    in_code = Counter((row.number, row.label, row.objective.value, row.rule or "—") for row in catalog.CATALOG)
    assert listed == in_code, f"only in docs: {listed - in_code}; only in the catalog: {in_code - listed}"


def test_the_objective_legend_names_every_objective():
    legend = {row[0] for row in _table(_section_text(KL_MATH, "1").split("**The objectives.**", 1)[1])}
    assert legend == {objective.value for objective in Objective} | {"PTV", "PCHI"}


def test_the_fixes_are_real_calls_of_klaudit_estimators():
    """Each call in §8.5 names a function of klaudit.estimators with keywords it accepts and
    estimator names it knows; R-A to R-F are all there."""
    pytest.importorskip("torch")
    from klaudit import estimators

    rows = _table(_section_text(KL_MATH, "8.5"))
    assert _fix_names() == {f"R-{letter}" for letter in "ABCDEF"}
    calls = [call for row in rows for call in re.findall(r"`([a-z_]+)\(([^`]*)\)`", row[2])]
    assert len(calls) >= 6
    for name, arguments in calls:
        function = getattr(estimators, name, None)
        assert callable(function) and not name.startswith("_"), name
        parameters = inspect.signature(function).parameters
        for keyword, value in re.findall(r"(\w+)=([^,)]+)", arguments):
            assert keyword in parameters, f"{name}() has no parameter {keyword}"
            if keyword == "estimator":
                assert value.strip("\"'") in estimators.PENALTY_ESTIMATORS, value
    for row in rows:  # the alternatives listed as text: `estimator="k1"`, `"k3"`, `"rb"`
        for value in re.findall(r'`(?:estimator=)?"(\w+)"`', row[2]):
            assert value in estimators.PENALTY_ESTIMATORS, value
