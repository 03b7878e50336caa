"""k3 of a response's mean log-ratio, e^(-D/L) - 1 + D/L, as a loss (kl-math.md section 8, row 18b: KL009).

TeenLucifer/grpo_reproduce's GSPO loss (twenty-second set) applies k3 to the log-ratio averaged over the
response, as GSPO does with its importance ratio. Its gradient is E[(1 - e^(-D/L)) score(y) / L]: row 18's
forward KL only at L = 1, otherwise no KL at all. Before row 18b the lint read it as a per-token k3 loss (row 3,
KL002). The summed D keeps row 18, and a GSPO sequence ratio that weighs a per-token k3 keeps row 13b.
"""

from __future__ import annotations

from snippets import module_codes

MEAN_LOG_RATIO = """\
    import torch


    def gspo_kl_loss(logp, ref_logp, mask, beta=0.04):
        lengths = mask.sum(dim=1)
        log_ratio = ((ref_logp - logp) * mask).sum(dim=1) / lengths
        kl = torch.exp(log_ratio) - log_ratio - 1
        loss = beta * kl.mean()
        return loss
"""


def test_k3_of_the_mean_log_ratio_is_row_18b(tmp_path):
    assert module_codes(MEAN_LOG_RATIO, tmp_path) == [(8, "KL007"), (8, "KL009")]


def test_k3_of_the_summed_log_ratio_stays_row_18(tmp_path):
    summed = MEAN_LOG_RATIO.replace(".sum(dim=1) / lengths", ".sum(dim=1)")
    assert module_codes(summed, tmp_path) == [(8, "KL002")]


def test_the_finding_names_the_mean_log_ratio(tmp_path):
    import textwrap

    from klaudit.lint.engine import lint_paths

    (tmp_path / "gspo.py").write_text(textwrap.dedent(MEAN_LOG_RATIO))
    messages = {finding.code: finding.message for finding in lint_paths([str(tmp_path)]).findings}
    assert "sequence-mean-log-ratio" in messages["KL009"] and "k3 of the mean log-ratio D/L" in messages["KL009"]
