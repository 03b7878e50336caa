"""KL101: suppression comments naming klaudit codes that suppress nothing, and their safe fix."""

from __future__ import annotations

from klaudit.config import Settings
from klaudit.lint.edits import SAFE, apply_edits
from klaudit.lint.engine import lint_paths
from klaudit.lint.fixing import applicabilities, fix_findings

SOURCE = '''import torch


def metrics(logprobs, ref_logprobs, mask):
    kl = ((logprobs - ref_logprobs) * mask).sum(-1).detach()  # noqa: KL002, E501
    return kl.mean().item()  # klaudit: ignore[KL001] - was a loss once


def loss_fn(logprobs, ref_logprobs, mask, beta):
    kl = torch.exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1
    loss = beta * (kl * mask).sum() / mask.sum()  # noqa: KL002, KL007
    text = "# noqa: KL003"  # a string is no comment
    kept = 1  # noqa: KL004, KL101
    other = 2  # noqa: KL999
    return loss
'''

FIXED = SOURCE.replace("# noqa: KL002, E501", "# noqa: E501").replace(
    "  # klaudit: ignore[KL001] - was a loss once", "  # - was a loss once").replace(
    "# noqa: KL002, KL007", "# noqa: KL002").replace("  # noqa: KL999", "")


def lint(path, *codes):
    return lint_paths([str(path)], settings=Settings().with_overrides(select=list(codes)))


def test_unused_codes_are_reported_where_they_are(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(SOURCE)
    found = [(f.line, f.code, f.message) for f in lint(path, "KL0", "KL101").findings]
    assert found == [
        (5, "KL101", "unused suppression: KL002 suppresses nothing on this line"),
        (6, "KL101", "unused suppression: KL001 suppresses nothing on this line"),
        (11, "KL101", "unused suppression: KL007 suppresses nothing on this line"),
        (14, "KL101", "unused suppression: KL999 (no such code) suppresses nothing on this line"),
    ]


def test_off_by_default_and_never_failing(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(SOURCE)
    assert lint(path, "KL0").findings == []


def test_codes_the_run_does_not_select_are_not_judged(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(SOURCE)
    assert [f.line for f in lint(path, "KL101").findings] == [14]  # only the unknown code


def test_the_fix_is_safe_and_removes_only_the_unused_codes(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(SOURCE)
    findings = lint(path, "KL0", "KL101").findings
    assert {f.autofix.applicability for f in findings} == {SAFE}
    run = fix_findings(findings, applicabilities(unsafe=False), write=True)
    assert len(run.fixed) == 4 and path.read_text() == FIXED
    assert lint(path, "KL0", "KL101").findings == []  # the fixed file has nothing left to report


def test_an_edit_can_fail(tmp_path):
    """The expected text differs from the source: the comparison above can fail."""
    assert apply_edits(SOURCE, []) != FIXED
