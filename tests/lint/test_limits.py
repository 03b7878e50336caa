"""Never crash, never hang: syntax Python accepts, nesting past the parser's means, the per-file budget.

The real analysis runs here (no stand-in): each case is what a user's tree may hold.
"""

from __future__ import annotations

import sys
import time

import libcst
import pytest

from klaudit.config import Settings
from klaudit.lint import parsing
from klaudit.lint.engine import lint_paths

K3_LOSS = """\
import torch


def k3_loss(policy_log_probs, ref_log_probs, mask, pg_loss):
    log_ratio = ref_log_probs - policy_log_probs
    kl = torch.exp(log_ratio) - log_ratio - 1
    loss = pg_loss + (kl * mask).sum()
    loss.backward()
"""


def lint(tmp_path, name, source, **settings):
    path = tmp_path / name
    path.write_text(source)
    result = lint_paths([str(path)], settings=Settings(root=tmp_path, **settings), jobs=1)
    assert result.errors == []
    return [(f.line, f.code) for f in result.findings], result.findings


@pytest.mark.parametrize("chain", [
    " + ".join(["logprobs"] * 20_000),  # 20,000-term operator chain
    "logprobs" + ".float()" * 5_000,  # 5,000-call method chain
    "logprobs" + ".float()" * 450,  # within Python's means, past LibCST's affordable depth
])
def test_long_chains_end_quickly_with_one_note(tmp_path, chain):
    start = time.monotonic()
    found, findings = lint(tmp_path, "chain.py", K3_LOSS + f"\n\ndef kl_chain(logprobs):\n    return {chain}\n")
    assert time.monotonic() - start < 10
    assert [code for _, code in found] == ["KL099"]
    assert "not analysed" in findings[0].message


def test_a_chain_within_the_limit_is_analysed(tmp_path):
    found, _ = lint(tmp_path, "chain.py", K3_LOSS + "\n\ndef scale(x):\n    return x" + " + x" * 150 + "\n")
    assert found == [(7, "KL002")]


def test_nesting_is_measured_without_recursion():
    import ast
    depth, line = parsing.nesting(ast.parse("a = 1\n\n\nb = " + "(" * 50 + "x" + ")" * 50 + " + y + z\n"))
    assert (depth, line) == (6, 4)  # Module > Assign > BinOp > BinOp > Name > Load


@pytest.mark.parametrize("source", [
    "def f[T](x: T) -> T:\n    return x\n",  # PEP 695 type parameters (Python 3.12)
    "type Vector = list[float]\n",
])
def test_syntax_of_a_newer_python_that_libcst_reads_is_not_a_syntax_error(tmp_path, source):
    assert lint(tmp_path, "newer.py", source)[0] == []
    assert lint(tmp_path, "newer_kl.py", "kl = 1\n" + source)[0] == []


def test_a_kl_loss_beside_newer_syntax_is_reported_where_it_is(tmp_path):
    """VideoAuto-R1 (twelfth fresh set): one f-string that reuses its quotes (Python 3.12) in a trainer made every
    finding of the file disappear on Python 3.11, which cannot parse it: the statements had no position.
    LibCST reads the file; its own positions place the findings, and the fix is refused with the reason."""
    newer = 'def describe(batch):\n    return f"size {batch["pixel_values"].size(0)}"\n\n\n'
    _, findings = lint(tmp_path, "trainer.py", newer + K3_LOSS)
    _, alone = lint(tmp_path, "alone.py", K3_LOSS)  # Python's positions, four lines up
    assert [(f.code, f.line, f.column, f.end_line, f.end_column) for f in findings] == \
        [(f.code, f.line + 4, f.column, f.end_line + 4, f.end_column) for f in alone] == [("KL002", 11, 5, 11, 39)]
    if sys.version_info < (3, 12):
        assert findings[0].autofix is None and "cannot parse the file" in findings[0].no_autofix


@pytest.mark.parametrize("construct", [
    "match kl_type:\n    case 'k1' | 'k2':\n        pass\n"
    "    case {'k': [1, *rest]}:\n        pass\n    case _:\n        pass\n",
    "if (n := len(kl)) > 1:\n    pass\n",
    "try:\n    pass\nexcept* ValueError as group:\n    pass\n",
    "x = f'{kl!r:>{width}} {kl=}'\n",
    "async def g():\n    async with a as b:\n        return [y async for y in b]\n",
    "lam = lambda *a, k=1, **kw: (a, k, kw)\n",
    "def pos(a, /, b, *, c):\n    return a\n",
    "x = 0xFF + 0o17 + 0b1 + 1_000 + 1e-3 + 2j\n",
])
def test_constructs_do_not_disturb_the_analysis(tmp_path, construct):
    body = "\n".join("    " + line if line else line for line in construct.splitlines())
    source = K3_LOSS + "\n\ndef other(kl, kl_type, width, a, b):\n" + body + "\n"
    assert lint(tmp_path, "constructs.py", source)[0] == [(7, "KL002")]


def test_a_file_python_reads_but_libcst_does_not_is_a_note_not_a_syntax_error(tmp_path, monkeypatch):
    def refuse(source):
        raise libcst.ParserSyntaxError("unsupported", lines=["x"], raw_line=3, raw_column=0)

    monkeypatch.setattr(parsing.libcst, "parse_module", refuse)
    found, findings = lint(tmp_path, "a.py", K3_LOSS)
    assert found == [(3, "KL099")] and "Python reads this file but LibCST does not" in findings[0].message


def test_a_syntax_error_is_kl000_at_pythons_place(tmp_path):
    assert lint(tmp_path, "broken.py", "import torch\n\ndef kl_loss(x)\n    return x\n")[0] == [(3, "KL000")]
    assert lint(tmp_path, "plain.py", "def f(:\n    pass\n")[0] == [(1, "KL000")]


def test_code_pythons_parser_reads_and_its_compiler_rejects_is_analysed_without_a_crash(tmp_path):
    """`return* loss` parses (ast.parse) but does not compile (found by scripts/crash_hunt.py --mutants).
    LibCST's parser builds its tree; only the node's own check would refuse it (a CSTValidationError),
    and trees are built without those checks (klaudit.lint.syntax.libcst_module): the file is read as
    Python's parser reads it, and its KL term is judged. Python names the compiler's error on import."""
    broken = K3_LOSS + "    return* loss\n"
    assert lint(tmp_path, "starred.py", broken)[0] == [(7, "KL002")]
    importer = "import torch\nfrom starred import k3_loss\n\n\ndef kl(logprobs, ref_logprobs):\n    return k3_loss\n"
    assert lint(tmp_path, "importer.py", importer)[0] == []


def test_a_spent_budget_keeps_the_findings_so_far_and_adds_one_note(tmp_path):
    later = "\n\ndef later(policy_log_probs, ref_log_probs, pg_loss):\n" \
            "    kl = policy_log_probs - ref_log_probs\n    loss = pg_loss + kl.sum()\n    loss.backward()\n"
    full, _ = lint(tmp_path, "two.py", K3_LOSS + later)
    assert full == [(7, "KL002"), (13, "KL001")]
    small, findings = lint(tmp_path, "two.py", K3_LOSS + later, analysis_budget=40)
    assert small == [(7, "KL002"), (11, "KL099")]
    assert "analysis budget (40 work units) exceeded in the function at line 11" in findings[1].message
    none, findings = lint(tmp_path, "two.py", K3_LOSS + later, analysis_budget=1)
    assert none == [(4, "KL099")]


def test_a_budget_spent_in_a_script_s_top_level_code_names_where_that_code_starts(tmp_path):
    script = ("import torch\n\nBETA = 0.1\nfor step in range(10):\n    logp = policy(x).log_softmax(-1)\n"
              "    kl = logp - ref_log_probs\n    loss = pg_loss + BETA * kl.sum()\n    loss.backward()\n")
    assert lint(tmp_path, "script.py", script)[0] == [(7, "KL001")]
    codes, findings = lint(tmp_path, "script.py", script, analysis_budget=1)
    assert codes == [(3, "KL099")]
    assert "exceeded in the module's top-level code from line 3; it was not analysed" in findings[0].message


def test_the_budget_does_not_depend_on_what_was_analysed_before(tmp_path):
    # the helper's call summary is cached by the first file; the second must be charged the same
    (tmp_path / "helper.py").write_text(
        "import torch\n\n\ndef k3(logp, ref_logp):\n    r = ref_logp - logp\n    return torch.exp(r) - r - 1\n")
    for name in ("a_user.py", "b_user.py"):
        (tmp_path / name).write_text(
            "from helper import k3\n\n\ndef train(policy_log_probs, ref_log_probs, pg_loss):\n"
            "    loss = pg_loss + k3(policy_log_probs, ref_log_probs).mean()\n    loss.backward()\n")
    for budget in (20, 40, 80, 10_000):
        together = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path, analysis_budget=budget), jobs=1)
        alone = lint_paths([str(tmp_path / "b_user.py")], settings=Settings(root=tmp_path, analysis_budget=budget),
                           jobs=1)
        pick = [(f.line, f.code) for f in together.findings if f.path.endswith("b_user.py")]
        assert pick == [(f.line, f.code) for f in alone.findings], budget


def switch_product_trainer(switches: int) -> str:
    """A loss summed from `switches` KL terms, each scaled by its own string switch: 2**switches alternatives."""
    lines = ["import torch", "", "", "def compute_loss(policy_log_probs, ref_log_probs, mask, pg_loss, config):",
             "    log_ratio = ref_log_probs - policy_log_probs",
             "    kl = torch.exp(log_ratio) - log_ratio - 1"]
    for i in range(switches):
        lines += [f"    if config.mode_{i} == 'a':", f"        t{i} = kl * {i + 2}",
                  "    else:", f"        t{i} = kl * {i + 3}"]
    lines += ["    total = " + " + ".join(f"t{i}" for i in range(switches)),
              "    loss = pg_loss + (total * mask).sum() / mask.sum()", "    loss.backward()"]
    return "\n".join(lines) + "\n"


def test_alternatives_of_independent_switches_are_widened_not_multiplied(tmp_path):
    # unbounded, the sum of 16 switched terms holds 65,536 alternatives: far past this budget
    few, _ = lint(tmp_path, "few.py", switch_product_trainer(4), analysis_budget=20_000)
    many, _ = lint(tmp_path, "many.py", switch_product_trainer(16), analysis_budget=20_000)
    assert few == [(24, "KL002")] and many == [(72, "KL002")]


def test_bounded_keeps_small_values_and_merges_labels_past_the_limit():
    from klaudit.lint.algebra import Atom, Poly
    from klaudit.lint.facts import MAX_ALTERNATIVES, Fact, bounded

    few = tuple(Fact(role="str", text=str(i)) for i in range(MAX_ALTERNATIVES))
    assert bounded(few) is few
    d = Poly.atom(Atom("d", True))
    # the same KL value under 100 values of switch `s`, all also under t=1: one fact, selected by t=1 only
    same = tuple(Fact(poly=d, labels=(("s", (i,)), ("t", (1,)))) for i in range(100))
    assert bounded(same) == (Fact(poly=d, labels=(("t", (1,)),)),)
    # distinct values past the limit: one witness per estimator (its polynomial), origin and use, the
    # KL ones first. k3 and ratio*k3 of one origin (TRL's use_bias_correction_kl) keep a witness each.
    origins = [object() for _ in range(5)]
    estimators = (d, alg_scale(d, 2.0))
    kl = tuple(Fact(poly=estimators[i % 2], origin=origins[i % 5], name=f"v{i}") for i in range(20))
    plain = tuple(Fact(poly=Poly.const(0.0), name=f"p{i}") for i in range(100))
    assert bounded(plain + kl) == kl[:10] + plain[:1]
    many = tuple(Fact(poly=d, origin=object()) for _ in range(3 * MAX_ALTERNATIVES))
    assert bounded(many) == many[:MAX_ALTERNATIVES]  # past the limit even so: cut, in order


def alg_scale(poly, factor):
    from klaudit.lint.algebra import scale
    return scale(poly, factor)


def test_pythons_warnings_about_the_users_code_are_not_printed(tmp_path, recwarn):
    lint(tmp_path, "escapes.py", "import torch\n\nkl_path = '\\d+'\n")
    assert [str(w.message) for w in recwarn] == []
