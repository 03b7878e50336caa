"""A suggested fix keeps the KL scale of the code it replaces, so the user's beta keeps its strength.

The estimators' `.loss` has the forward value of the per-sequence KL sum (klaudit/estimators.py).
Code that averages its KL term over tokens is offered `.loss.sum() / mask.sum()`, code that sums per
sequence `.loss.mean()`; the values below are compared with the code being replaced, exactly.
"""

from __future__ import annotations

import libcst as cst
import pytest

from klaudit.catalog import FIX_AGGREGATION, FIX_K3_LOSS, FIX_SIGN, Aggregation, scaled_fix
from klaudit.lint.checks import check_module
from klaudit.lint.project import Project

K3_LOSS = """\
import torch


def step(logp, ref_logp, mask, pg_loss, beta):
    log_ratio = ref_logp - logp
    kl = torch.exp(log_ratio) - log_ratio - 1
    kl_loss = REDUCTION
    return pg_loss + beta * kl_loss
"""


def fixes(reduction: str, tmp_path) -> list:
    path = tmp_path / "snippet.py"
    text = K3_LOSS.replace("REDUCTION", reduction)
    path.write_text(text)
    return [(f.code, f.fix) for f in check_module(str(path), cst.parse_module(text), Project([tmp_path]), text)]


@pytest.mark.parametrize("reduction, expected", [
    ("(kl * mask).sum() / mask.sum()", ".loss.sum() / mask.sum()"),  # batch token-mean
    ("((kl * mask).sum(-1) / mask.sum(-1)).mean()", ".loss.sum() / mask.sum()"),  # per-sequence token-mean
    ("(kl * mask).sum(-1).mean()", ".loss.mean()"),  # token-sum per sequence
])
def test_each_finding_s_fix_follows_the_reduction_it_replaces(reduction, expected, tmp_path):
    found = fixes(reduction, tmp_path)
    assert found and all(fix is not None and expected in fix for _, fix in found), found
    other = {".loss.mean()", ".loss.sum() / mask.sum()"} - {expected}
    assert not any(o in fix for o in other for _, fix in found)


def test_fixes_without_a_reduction_are_left_as_they_are():
    assert scaled_fix(None, Aggregation.SEQ_MEAN) is None
    assert scaled_fix(FIX_K3_LOSS, Aggregation.SUM) == FIX_K3_LOSS
    assert scaled_fix(FIX_SIGN, Aggregation.CONSTANT).startswith("subtract the KL penalty")
    assert ".loss.sum() / constant" in scaled_fix(FIX_AGGREGATION, Aggregation.CONSTANT)


def test_the_token_mean_fix_has_the_value_of_the_token_mean_it_replaces():
    torch = pytest.importorskip("torch")
    from klaudit.estimators import kl_penalty

    generator = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 9, generator=generator, dtype=torch.float64) * 3
    ref = -torch.rand(4, 9, generator=generator, dtype=torch.float64) * 3
    mask = torch.ones(4, 9, dtype=torch.float64)
    for row, length in enumerate((9, 5, 2, 7)):
        mask[row, length:] = 0
    log_ratio = ref - logp
    k3 = torch.exp(log_ratio) - log_ratio - 1
    replaced = {"k3": (k3 * mask).sum() / mask.sum(), "k1": ((logp - ref) * mask).sum() / mask.sum()}
    for estimator, before in replaced.items():
        after = kl_penalty(logp, ref, mask, estimator=estimator).loss.sum() / mask.sum()
        assert after.item() == pytest.approx(before.item(), rel=1e-12)
        per_sequence = kl_penalty(logp, ref, mask, estimator=estimator).loss.mean()
        assert per_sequence.item() == pytest.approx((replaced[estimator] * mask.sum() / 4).item(), rel=1e-12)
