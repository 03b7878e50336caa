"""What the lint's cost grows with: shared values stay shared, modules are parsed once and only when
needed, work that does not change a finding is skipped. Bounds are ratios measured in the same test
(against a bare parse, or between sizes), never absolute times.
"""

from __future__ import annotations

import contextlib
import gc
import time

import libcst
import pytest

from klaudit.config import Settings
from klaudit.frameworks import lint_python
from klaudit.lint.engine import lint_paths


def lint(path, **kw):
    result = lint_paths([str(path)], settings=Settings(root=path if path.is_dir() else path.parent), jobs=1, **kw)
    assert result.errors == []
    return [(f.path.rsplit("/", 1)[-1], f.line, f.code) for f in result.findings]


def seconds(action) -> float:
    """The least CPU time of three runs of `action`."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        action()
        best = min(best, time.process_time() - start)
    return max(best, 1e-4)


def nested_closures(count: int) -> str:
    """A function defining `count` nested helpers, each closing over the ones defined before it."""
    lines = ["import torch", "", "", "def train(policy_log_probs, ref_log_probs, pg_loss):",
             "    kl = policy_log_probs - ref_log_probs"]
    for index in range(count):
        lines += [f"    def scale{index}(x):", f"        return x * {index + 1}"]
    lines += [f"    loss = pg_loss + scale{count - 1}(kl).mean()", "    loss.backward()"]
    return "\n".join(lines) + "\n"


def test_nested_closures_cost_what_their_text_does_not_twice_per_closure(tmp_path):
    # As a tree the 20th closure holds 2**19 callees; hashing it as one took seconds (gen_variable_type.py
    # of torchgen: minutes, with no work unit spent). As a graph it holds 20.
    path = tmp_path / "closures.py"
    source = nested_closures(20)
    path.write_text(source)
    assert lint(path) == [("closures.py", 46, "KL001")]
    analysis = seconds(lambda: lint(path))
    parse = seconds(lambda: libcst.parse_module(source))
    assert analysis < 200 * parse, (analysis, parse)


HELPER = "import torch\n\n\ndef k3(logp, ref_logp):\n    r = ref_logp - logp\n    return torch.exp(r) - r - 1\n"
OTHER = "import torch\n\n\ndef kl_stat(logp, ref_logp):\n    return (logp - ref_logp).mean()\n"
USER = ("from helper import k3\nfrom other import elsewhere\n\n\n"
        "def train(policy_log_probs, ref_log_probs, pg_loss):\n"
        "    loss = pg_loss + k3(policy_log_probs, ref_log_probs).mean() + elsewhere(ref_log_probs)\n"
        "    loss.backward()\n")


@pytest.fixture
def parses(monkeypatch):
    """The first line of every text LibCST parses during the test."""
    seen: list = []
    parse_module = libcst.parse_module

    def counting(source, *args, **kwargs):
        seen.append(source.splitlines()[0] if source else "")
        return parse_module(source, *args, **kwargs)

    monkeypatch.setattr(libcst, "parse_module", counting)
    return seen


def test_an_imported_module_is_parsed_only_where_it_may_define_the_name_called(tmp_path, parses):
    (tmp_path / "helper.py").write_text("# helper\n" + HELPER)
    (tmp_path / "other.py").write_text("# other\n" + OTHER)  # KL vocabulary, but no `elsewhere`
    (tmp_path / "user.py").write_text("# user\n" + USER)
    assert lint(tmp_path / "user.py") == [("user.py", 7, "KL002")]
    assert sorted(parses) == ["# helper", "# user"]


def test_a_file_followed_as_an_import_is_not_parsed_again_to_be_linted(tmp_path, parses):
    (tmp_path / "a_user.py").write_text("# user\n" + USER.replace("from other import elsewhere\n", "")
                                        .replace(" + elsewhere(ref_log_probs)", ""))
    (tmp_path / "helper.py").write_text("# helper\n" + HELPER)
    assert lint(tmp_path) == [("a_user.py", 6, "KL002")]  # a_user.py first: it imports helper.py
    assert sorted(parses) == ["# helper", "# user"]


def test_the_callers_garbage_collection_thresholds_are_restored(tmp_path):
    (tmp_path / "helper.py").write_text(HELPER)
    before = gc.get_threshold()
    lint(tmp_path)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0  # the trees frozen during the run are back in the collector's care


def test_trees_are_kept_out_of_the_collectors_passes_in_a_run_only_and_the_findings_are_the_same(tmp_path,
                                                                                              monkeypatch):
    from klaudit.lint import collection
    from klaudit.lint.syntax import libcst_module

    (tmp_path / "a_user.py").write_text(USER.replace("from other import elsewhere\n", "")
                                        .replace(" + elsewhere(ref_log_probs)", ""))
    (tmp_path / "helper.py").write_text(HELPER)
    frozen = []
    building = collection.building_tree

    @contextlib.contextmanager
    def counted():
        with building():
            yield
        frozen.append(gc.get_freeze_count())

    monkeypatch.setattr(collection, "building_tree", counted)
    monkeypatch.setattr("klaudit.lint.syntax.building_tree", counted)
    findings = lint(tmp_path)
    assert findings and len(frozen) == 2 and all(count > 0 for count in frozen)
    frozen.clear()
    libcst_module("x = 1\n")  # outside a run: nothing is frozen
    assert frozen == [0]
    monkeypatch.setattr("klaudit.lint.syntax.building_tree", contextlib.nullcontext)
    assert lint(tmp_path) == findings


def test_code_only_pythons_compiler_rejects_is_not_a_syntax_error_in_a_file_without_kl(tmp_path):
    # the quick syntax check (a bytecode compile) objects; Python's parser, which decides, does not
    path = tmp_path / "script.py"
    path.write_text("import sys\n\nreturn sys.argv\n")
    assert lint(path) == []
    path.write_text("import sys\n\nreturn sys.argv[\n")
    assert lint(path) == [("script.py", 3, "KL000")]


def test_a_configuration_class_named_only_in_prose_is_not_read():
    source = '"""Build it with `GRPOConfig(beta=0.1)`."""\nfrom trl import GRPOConfig\n\n\ndef train(args: GRPOConfig):\n    pass\n'
    assert lint_python("t.py", libcst.parse_module(source), source) == []


def _first_letters(items) -> set:
    """The characters a match of a parsed pattern (re._parser) can start with; fails on what it cannot tell."""
    from re import _constants as c

    for op, arg in items:
        if op in (c.ASSERT, c.ASSERT_NOT, c.AT):
            continue  # zero width: the next item starts the match
        if op is c.LITERAL:
            return {chr(arg)}
        if op is c.SUBPATTERN:
            return _first_letters(arg[-1])
        if op is c.BRANCH:
            return set().union(*(_first_letters(branch) for branch in arg[1]))
        if op is c.IN and all(kind is c.LITERAL for kind, _ in arg):
            return {chr(value) for _, value in arg}
        raise AssertionError(f"the pre-filter's first letters cannot be told past {op}")
    raise AssertionError("a pattern that matches the empty text")


def test_the_prefilters_lookahead_admits_every_letter_a_match_starts_with():
    import re

    from klaudit.lint import roles

    starts = {letter.lower() for letter in _first_letters(re._parser.parse(roles._KL_VOCABULARY_PATTERN))}
    assert starts <= set(roles._KL_VOCABULARY_STARTS)
    plain = re.compile(roles._KL_VOCABULARY_PATTERN, re.IGNORECASE)
    for text in ("kl", "use_kl_loss", "\u212al_coef", "\u0130nit_logps", "REF", "teacher_logits", "logprobs_ref",
                 "quickly", "preference", "x = 1"):
        assert roles.might_contain_kl(text) == (plain.search(text) is not None), text


def _holds_a_word(items, words) -> bool:
    """Whether every match of a parsed pattern (re._parser) holds one of `words` (lower case), told from
    its runs of literal letters and its groups of alternatives; False where it cannot tell."""
    from re import _constants as c

    run = ""
    for op, arg in items:
        if op is c.LITERAL:
            run += chr(arg).lower()
            if any(word in run for word in words):
                return True
            continue
        run = ""
        if op is c.SUBPATTERN and _holds_a_word(arg[-1], words):
            return True
        if op is c.BRANCH and all(_holds_a_word(branch, words) for branch in arg[1]):
            return True
    return False


def test_the_prefilter_tries_its_pattern_on_every_line_that_can_hold_a_match():
    import re
    import sys

    from klaudit.lint import roles

    words = roles._KL_VOCABULARY_WORDS
    assert _holds_a_word(re._parser.parse(roles._KL_VOCABULARY_PATTERN), words)
    assert not _holds_a_word(re._parser.parse(r"kl|(ref|base)_\w*"), words)  # the check can fail
    # the lines are found in the lowered text: a letter of the words matches (IGNORECASE) only characters
    # that lower to it, and no match holds a line break
    everything = "".join(map(chr, range(sys.maxunicode + 1)))
    for letter in set("".join(words)):
        assert {found.lower() for found in re.findall(letter, everything, re.IGNORECASE)} == {letter}
    assert not re.compile(roles._KL_VOCABULARY_PATTERN, re.IGNORECASE).search("k\nl r\nef l\nogp teacher_\nlogp")
    plain = re.compile(roles._KL_VOCABULARY_PATTERN, re.IGNORECASE)
    for text in ("x = 1\nuse_kl = True\n", "logger.info(x)\nprefix = 2\n", "\u0130\nref_logprob", "a\n\u212al\n",
                 "log\nprobs_ref", "ref\n", "\nkl", "kl\u2028x", "base_\nlogp"):
        assert roles.might_contain_kl(text) == (plain.search(text) is not None), text


DEEP = {
    "operators": "x = " + " + ".join(["a"] * 60) + "\n",
    "calls": "x = a" + ".f()" * 40 + "\n",
    "brackets": "x = " + "[" * 60 + "]" * 60 + "\n",
    "decorator": "@" + "(" * 30 + "d" + " + d" * 40 + ")" * 30 + "\ndef f():\n    pass\n",
    "f-string": 'x = f"{' + " + ".join(["a"] * 60) + '}"\n',
    "elif": "if a:\n    pass\n" + "elif a:\n    pass\n" * 60,
    "blocks": "".join("    " * i + "if a:\n" for i in range(40)) + "    " * 40 + "pass\n",
}


@pytest.mark.parametrize("name", sorted(DEEP))
def test_the_nesting_bound_never_passes_code_that_nests_deeper(name):
    import ast

    from klaudit.lint.parsing import may_nest_past, nesting

    source = DEEP[name]
    tree = ast.parse(source)
    depth, _ = nesting(tree)
    assert depth > 40
    for limit in (10, 20, 40, depth - 1):
        assert may_nest_past(tree, source, limit), limit
    assert not may_nest_past(tree, source, 2 * len(source) + 3)  # the bound: 2 levels a character


def test_the_nesting_bound_holds_on_real_code_and_passes_it_at_the_limit():
    import ast
    from pathlib import Path

    from klaudit.lint.parsing import MAX_NESTING, may_nest_past, nesting

    for path in sorted(Path(__file__).resolve().parents[2].joinpath("klaudit").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        depth, _ = nesting(tree)
        for limit in (6, 10, 16, max(depth - 1, 1)):
            assert may_nest_past(tree, source, limit) or depth <= limit, (path, limit)
        assert not may_nest_past(tree, source, MAX_NESTING)


def test_a_replaced_fact_equals_the_one_dataclasses_makes_and_unknown_fields_still_raise():
    import dataclasses

    from klaudit.lint import algebra as alg
    from klaudit.lint.facts import Fact, replace

    fact = Fact(poly=alg.Poly.atom(alg.Atom(alg.DELTA, True)), labels=(("mode", ("k3",)),))
    assert alg.kl_atoms(fact.poly)  # kept on the polynomial: not a field, equality and hash unchanged
    for changes in ({"clamped": True}, {"labels": (), "calls": 2}, {}):
        fast, slow = replace(fact, **changes), dataclasses.replace(fact, **changes)
        assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    with pytest.raises(TypeError):
        replace(fact, clampd=True)
    assert fact.poly == alg.Poly.atom(alg.Atom(alg.DELTA, True)) and hash(fact.poly) == hash(
        alg.Poly.atom(alg.Atom(alg.DELTA, True)))


def test_a_tree_parsed_without_node_checks_equals_the_checked_one_and_the_checks_come_back():
    from pathlib import Path

    from klaudit.lint.syntax import libcst_module

    for path in sorted(Path(__file__).resolve().parents[2].joinpath("klaudit", "lint").glob("*.py"))[:12]:
        source = path.read_text(encoding="utf-8")
        tree = libcst_module(source)
        assert tree.deep_equals(libcst.parse_module(source)), path
        assert tree.code == source
    with pytest.raises(libcst.ParserSyntaxError):
        libcst_module("def f(:\n")
    with pytest.raises(libcst.CSTValidationError):  # nodes built outside the parse still check themselves
        libcst.Name("not a name")


def test_the_fast_store_scans_find_what_a_pattern_starting_at_every_word_finds():
    import re
    from pathlib import Path

    from klaudit.lint.modules import _constructor_arguments, _field_writes

    every_field = re.compile(r"\b(?!self\b|cls\b)[A-Za-z_]\w*\.([A-Za-z_]\w*)\s*(?:[-+*/]?=)(?!=)([^\n]*)")
    every_call = re.compile(r"\b[A-Z]\w*\(([^()]*)\)")
    tricky = ("self.a = out.kl = kl\ncls.b = 1\nselfish.c += ref\nx.y == 3\n_p.q /= 2\n1.e = 0\né1x.f = 2\n"
              "a.b.c = k\nfooBar(kl=kl) + Bar(kl=ref, x=Baz(y)) + Exp(kl=kl)\nx.y = (\n 1)\nsamples.kl\n= kl\n")
    sources = [tricky] + [p.read_text(encoding="utf-8")
                          for p in sorted(Path(__file__).resolve().parents[2].joinpath("klaudit").rglob("*.py"))]
    for source in sources:
        assert list(_field_writes(source)) == [(m.start(), m.group(1), m.group(2)) for m in every_field.finditer(source)]
        assert list(_constructor_arguments(source)) == [(m.start(), m.group(1)) for m in every_call.finditer(source)]
    assert [field for _, field, _ in _field_writes(tricky)] == ["kl", "c", "q", "c", "y", "kl"]


def test_a_file_whose_functions_can_meet_no_kl_term_is_not_parsed_by_libcst(tmp_path, parses):
    (tmp_path / "settings.py").write_text(  # KL vocabulary in its text, but in no function
        "# settings\n\"\"\"Options: kl_coef is the weight of the KL penalty.\"\"\"\nKL_COEF_DEFAULT = 0.1\n\n\n"
        "def describe(x):\n    return str(x)\n")
    (tmp_path / "user.py").write_text("# user\n" + USER.replace("from other import elsewhere\n", "")
                                      .replace(" + elsewhere(ref_log_probs)", "").replace("from helper", "from settings import describe\nfrom helper"))
    (tmp_path / "helper.py").write_text("# helper\n" + HELPER)
    assert lint(tmp_path) == [("user.py", 7, "KL002")]
    assert sorted(parses) == ["# helper", "# user"]


CHAIN = ("import torch\n\n\ndef h4(x):\n    return x\n\n\ndef h3(x):\n    return h4(x)\n\n\ndef h2(x):\n    return h3(x)\n\n\n"
         "def h1(x):\n    return h2(x)\n\n\ndef g(x):\n    return h1(x)\n\n\n"
         "def train(logprobs, ref_logprobs, pg_loss):\n    r = ref_logprobs - logprobs\n    k3 = torch.exp(r) - r - 1\n"
         "    FIRST\n    loss = pg_loss + h1(k3).mean()\n    LAST\n    loss.backward()\n")


@pytest.mark.parametrize("first, last", [("g(k3)", "pass"), ("pass", "g(k3)")])
def test_a_summary_cut_off_at_the_depth_limit_is_not_reused_where_the_whole_chain_fits(tmp_path, first, last):
    # g(k3) runs h1 one level deeper than train's own call, where h4 is cut off and nothing comes back
    path = tmp_path / "chain.py"
    path.write_text(CHAIN.replace("FIRST", first).replace("LAST", last))
    assert lint(path) == [("chain.py", 28, "KL002")]


def test_a_summary_that_fits_is_reused_at_another_depth(tmp_path, monkeypatch):
    from klaudit.lint import flow

    runs: list[str] = []
    run = flow.FunctionRun.run

    def counting(self):
        runs.append(self.func.name.value)
        return run(self)

    monkeypatch.setattr(flow.FunctionRun, "run", counting)
    path = tmp_path / "chain.py"
    path.write_text(CHAIN.replace("FIRST", "h3(k3)").replace("LAST", "h4(k3)"))
    assert lint(path) == [("chain.py", 28, "KL002")]
    # h4 is given k3 at three depths (under h1's chain, under h3, by train) and h3 at two: each is
    # interpreted once (the helpers name no KL: none is interpreted on its own, klaudit.lint.relevance)
    assert sorted(runs) == ["h1", "h2", "h3", "h4", "train"]


def test_a_modules_key_is_its_resolved_path_however_the_path_is_given(tmp_path, monkeypatch):
    from pathlib import Path

    from klaudit.lint.project import Project

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "helper.py").write_text(HELPER)
    (tmp_path / "link").symlink_to(tmp_path / "pkg")
    monkeypatch.chdir(tmp_path)
    project = Project([tmp_path])
    given = ["pkg/helper.py", Path("pkg/helper.py"), str(tmp_path / "link" / "helper.py"), "link/../pkg/helper.py"]
    for path in given * 2:  # the second time from the table
        assert project.key(path) == str(Path(path).resolve()) == str((tmp_path / "pkg" / "helper.py").resolve())


def test_the_program_ends_at_once_with_its_whole_report_and_exit_code(tmp_path, monkeypatch):
    # `klaudit lint` run as the program leaves by os._exit once the report is flushed (cli._end); a report
    # larger than a pipe's buffer arrives whole, and the exit code is the usual one
    import os
    import subprocess
    import sys

    from click.testing import CliRunner
    from snippets import K3_LOSS_TRAINER

    from klaudit import cli

    for index in range(40):
        (tmp_path / f"trainer_{index:02d}.py").write_text(K3_LOSS_TRAINER)
    command = ["lint", "--output-format", "json", "--jobs", "1", "."]
    done = subprocess.run([sys.executable, "-m", "klaudit", *command], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, NO_COLOR="1"))
    monkeypatch.chdir(tmp_path)
    invoked = CliRunner().invoke(cli.main, command)
    assert done.returncode == invoked.exit_code == 1, done.stderr
    assert len(done.stdout) > 65536 and done.stdout == invoked.stdout


def test_child_nodes_are_libcsts_children_less_the_layout():
    """Every child LibCST lists is there, except whitespace, comments, parentheses and punctuation, which hold
    no code: the code nodes reached through child_nodes are all of them."""
    from klaudit.lint.syntax import child_nodes

    source = ('@decorate(x)\nasync def f(a, /, b: int = 1, *c, d, **e) -> "T":\n    """doc"""\n'
              '    x = [i async for i in y if i] + {k: v for k, v in z} - (a if b else -c) ** 2\n'
              '    y: dict = {**x, "a": f"{x!r:>{w}}"}; del y[1:2, ...]\n'
              '    with open(p) as h, g():\n        match h:\n            case [1, *rest] | {"k": v}:\n'
              '                yield from (lambda q=1: q)(*rest)\n    try:\n        pass\n'
              '    except* (E, F) as error:\n        raise G from error\n    finally:\n        return\n'
              'class C(B, metaclass=M):\n    global g\n    a = b = 1 if x else 2  # comment\n'
              'import a.b as c; from .d import (e, f)\n')
    layout = (libcst.BaseParenthesizableWhitespace, libcst.TrailingWhitespace, libcst.EmptyLine, libcst.Newline,
              libcst.Comment, libcst.Comma, libcst.Semicolon, libcst.LeftParen, libcst.RightParen, libcst.Dot,
              libcst.LeftSquareBracket, libcst.RightSquareBracket, libcst.LeftCurlyBrace, libcst.RightCurlyBrace,
              libcst.AssignEqual, libcst.Colon)
    stack = [libcst.parse_module(source)]
    reached = 0
    while stack:
        node = stack.pop()
        mine, theirs = child_nodes(node), node.children
        assert {id(child) for child in mine} <= {id(child) for child in theirs}, type(node).__name__
        left_out = [child for child in theirs if all(child is not kept for kept in mine)]
        assert all(isinstance(child, layout) for child in left_out), (type(node).__name__, left_out)
        reached += len(mine)
        stack.extend(mine)
    assert reached > 150  # the walk went through the whole module
