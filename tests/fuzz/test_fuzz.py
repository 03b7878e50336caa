"""Generated trainer code: no crash, deterministic findings, and the right rule where it is known.

Programs come from the grammar of kl_grammar.py; mutants of them (a character deleted, a line
duplicated or cut, brackets unbalanced) must never crash the lint and get KL000 exactly when
Python's own parser rejects them. The run is derandomized (the same examples every time) and short;
for a long local run set KLAUDIT_FUZZ_EXAMPLES (e.g. 20000).
"""

from __future__ import annotations

import os
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kl_grammar import programs

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths

EXAMPLES = int(os.environ.get("KLAUDIT_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


def lint_text(directory, name: str, source: str, jobs: int = 1):
    path = directory / name
    path.write_text(source, encoding="utf-8")
    result = lint_paths([str(path)], settings=Settings(root=directory), jobs=jobs)
    return result, [(f.line, f.column, f.code, f.message) for f in result.findings]


@FUZZ
@given(programs())
def test_generated_programs_get_the_rule_their_construction_implies(tmp_path_factory, program):
    source, estimator, placement, detached, expected = program
    directory = tmp_path_factory.mktemp("program")
    result, found = lint_text(directory, "trainer.py", source)
    assert result.errors == []
    assert [code for _, _, code, _ in found] == ([expected] if expected else []), (estimator, placement, detached)
    assert lint_text(directory, "trainer.py", source)[1] == found  # the same findings on a second run


@st.composite
def mutants(draw):
    source = draw(programs())[0]
    lines = source.splitlines(keepends=True)
    kind = draw(st.sampled_from(["delete-char", "duplicate-line", "cut-line", "insert", "truncate"]))
    if kind == "delete-char":
        at = draw(st.integers(0, len(source) - 1))
        return source[:at] + source[at + 1:]
    if kind == "insert":
        at = draw(st.integers(0, len(source)))
        inserted = draw(st.sampled_from(["(", ")", ":", "[", "'", "\\", "\t", " ", "0x", "1_", "\n  "]))
        return source[:at] + inserted + source[at:]
    if kind == "truncate":
        return source[:draw(st.integers(0, len(source)))]
    at = draw(st.integers(0, len(lines) - 1))
    if kind == "duplicate-line":
        return "".join(lines[:at + 1] + lines[at:])
    return "".join(lines[:at] + lines[at + 1:])


def python_accepts(source: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in mutated strings
            compile(source, "mutant.py", "exec", dont_inherit=True)
    except SyntaxError:
        return False
    return True


@FUZZ
@given(mutants())
def test_mutants_never_crash_and_kl000_follows_pythons_parser(tmp_path_factory, source):
    directory = tmp_path_factory.mktemp("mutant")
    result, found = lint_text(directory, "mutant.py", source)
    assert result.errors == []
    assert any(code == "KL000" for _, _, code, _ in found) == (not python_accepts(source))
