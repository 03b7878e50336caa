"""KL code kept honest in a project's own test suite.

    from klaudit.testing import assert_kl_unbiased

    def test_our_kl_penalty():
        assert_kl_unbiased(compute_kl_loss, placement="loss")

`assert_kl_unbiased` audits the callable in this process with `klaudit.audit.check` (exact
enumeration on small policies, as `klaudit check-grad` does) and fails with the table check-grad
prints when any audited row is biased or the audit could not run. It needs torch, imported only
when it is called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


class KLGradientError(AssertionError):
    """The audited KL code's expected gradient is not grad KL(pi || ref) (or it could not be audited)."""


def assert_kl_unbiased(fn: Callable, placement: str = "auto", *, bind: Mapping[str, str] | None = None,
                       used_only: bool = False):
    """Audit `fn` and return the report when its gradient is unbiased; raise KLGradientError, whose
    message is check-grad's table, when it is not.

    placement: "auto", "loss", "reward", "both", "loss+reward", "loss+future" or "advantage"
        (klaudit.audit.PLACEMENTS).
    bind: {"parameter": "role"} for parameters the naming table cannot place (check-grad's --bind).
    used_only: only the rows of placements the surrounding code uses count (check-grad's --fail-on used).
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this one
    from klaudit.audit import check

    report = check(fn, placement, bind=bind)
    if report.exit_code_for(used_only=used_only) != 0:
        raise KLGradientError("the KL gradient is not that of KL(pi || ref):\n" + report.to_text())
    return report
