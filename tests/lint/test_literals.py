"""Every numeric literal Python accepts is read, wherever the analysis reads numbers.

Each form is placed where a number matters: as the KL coefficient (a scale: the k3 loss stays
KL002), as the exponent of `** 2`, as a reduction axis and as the index of the last token.
"""

from __future__ import annotations

import libcst as cst
import pytest

from klaudit.lint.engine import lint_paths
from klaudit.lint.syntax import int_literal, number_value

# (spelling, value) of every numeric literal form: decimal, hex, octal, binary, underscores in each,
# floats with exponents, leading or trailing dots and underscores.
FORMS = [
    ("7", 7.0), ("0", 0.0), ("00", 0.0), ("0_0", 0.0), ("0xFFFFFFF", 268435455.0), ("0XfF", 255.0),
    ("0o17", 15.0), ("0O7_7", 63.0), ("0b101", 5.0), ("0B1_0", 2.0), ("1_000", 1000.0),
    ("0x_ff", 255.0), ("1e-3", 0.001), ("1E+3", 1000.0), ("1_000.5", 1000.5), (".5", 0.5),
    ("5.", 5.0), ("1_0e1_0", 1e11), ("1_0e-1_0", 1e-9), ("0.000_1", 0.0001),
]
# Literals no float holds: the analysis treats them as numbers it cannot explain.
HUGE = ["1" + "0" * 400, "1e400", "0x" + "F" * 300]


def expression(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)


@pytest.mark.parametrize("text, value", FORMS)
def test_number_value_reads_every_real_literal(text, value):
    assert number_value(expression(text)) == value


@pytest.mark.parametrize("text", ["2j", "1.5J", "1_0j", "1e3j", *HUGE])
def test_imaginary_and_unrepresentable_literals_have_no_value(text):
    assert number_value(expression(text)) is None


@pytest.mark.parametrize("text, value", [("0x1", 1), ("-0x1", -1), ("-0b1", -1), ("0o2", 2), ("1_0", 10), ("-00", 0)])
def test_int_literal_reads_prefixed_and_negated_integers(text, value):
    assert int_literal(expression(text)) == value


TRAINER = """\
import torch


def compute_loss(policy_log_probs, ref_log_probs, mask, pg_loss):
    kl_coef = {literal}
    log_ratio = ref_log_probs - policy_log_probs
    kl = torch.exp(log_ratio) - log_ratio - 1
    loss = pg_loss + kl_coef * (kl * mask).sum(dim=-1).mean()
    loss.backward()
"""


NONZERO = [text for text, _ in FORMS if text not in ("0", "00", "0_0")]


@pytest.mark.parametrize("literal", NONZERO + ["2j", "1_0J", *HUGE])
def test_a_coefficient_in_any_spelling_keeps_the_finding(literal, tmp_path):
    path = tmp_path / "trainer.py"
    path.write_text(TRAINER.format(literal=literal))
    result = lint_paths([str(path)], jobs=1)
    assert result.errors == []
    assert [(f.line, f.code) for f in result.findings] == [(8, "KL002")]


@pytest.mark.parametrize("two", ["2", "0x2", "0b10", "0o2", "2.0", "2_0e-1", "0b11"])
def test_the_exponent_two_in_any_spelling_squares_the_log_ratio(two, tmp_path):
    # (log-ratio) ** 2 / 2 is k2 as a per-token loss: KL003 (the future term is missing).
    path = tmp_path / "trainer.py"
    path.write_text(
        "def compute_loss(policy_log_probs, ref_log_probs, mask, pg_loss):\n"
        "    log_ratio = policy_log_probs - ref_log_probs\n"
        f"    loss = pg_loss + ((log_ratio ** {two}) * mask).sum() / mask.sum()\n"
        "    loss.backward()\n")
    codes = [f.code for f in lint_paths([str(path)], jobs=1).findings]
    assert codes == (["KL003"] if number_value(expression(two)) == 2.0 else [])


@pytest.mark.parametrize("last", ["-1", "-0x1", "-0b1", "-0o1"])
def test_the_last_token_index_in_any_spelling(last, tmp_path):
    path = tmp_path / "trainer.py"
    path.write_text(
        "def compute_loss(policy_log_probs, ref_log_probs, rewards):\n"
        "    kl = policy_log_probs - ref_log_probs\n"
        f"    rewards[:, {last}] -= 0.1 * kl[:, {last}]\n"
        "    return rewards\n")
    result = lint_paths([str(path)], jobs=1)
    assert result.errors == []
