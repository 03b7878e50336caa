"""The autofix on code shaped like real trainers (written here, not copied): log-probs read from
containers where the estimate is formed, aliases at the KL term's use, verl-style `agg_loss` and
per-sequence `masked_mean` reductions, coefficients and weights around the KL term.

Each fix is applied, the result re-parses, re-lints without the fixed codes at that line, and where
check-grad can run the fixed function its rows are unbiased (REV); the value of the fixed term is
compared with the value of the term it replaced on a seeded batch, to show the KL scale is kept.
"""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from klaudit.config import Settings
from klaudit.lint.edits import apply_edits
from klaudit.lint.engine import lint_paths


def _fixed(tmp_path: Path, source: str, settings: Settings | None = None) -> tuple[list, str, Path]:
    """(findings before, the fixed source, its path): every finding of the snippet carries the same
    fix, which is applied once; the fixed file re-parses and re-lints without any finding."""
    path = tmp_path / "trainer.py"
    source = textwrap.dedent(source)
    path.write_text(source)
    findings = lint_paths([str(path)], settings=settings).findings
    assert findings and all(f.autofix is not None for f in findings), [f.no_autofix for f in findings]
    assert len({f.autofix for f in findings}) == 1  # one site, one fix for all its verdicts
    fixed = apply_edits(source, findings[0].autofix.edits)
    ast.parse(fixed)
    cst.parse_module(fixed)
    path.write_text(fixed)
    assert lint_paths([str(path)], settings=settings).findings == []
    return findings, fixed, path


def _refusal(tmp_path: Path, source: str, settings: Settings | None = None) -> set[str]:
    path = tmp_path / "trainer.py"
    path.write_text(textwrap.dedent(source))
    findings = lint_paths([str(path)], settings=settings).findings
    assert findings and all(f.autofix is None for f in findings)
    return {f.no_autofix for f in findings}


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"fixed_{path.stem}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _batch(equal_lengths: bool = False):
    """A seeded batch: policy and reference log-probs [4, 6] and a mask with holes at the ends."""
    import torch

    generator = torch.Generator().manual_seed(0)
    logprobs = torch.randn(4, 6, generator=generator).mul(0.3).sub(1.0).requires_grad_()
    ref_logprobs = torch.randn(4, 6, generator=generator).mul(0.3).sub(1.0)
    lengths = [6, 6, 6, 6] if equal_lengths else [6, 3, 5, 1]
    mask = torch.tensor([[1.0] * n + [0.0] * (6 - n) for n in lengths])
    return logprobs, ref_logprobs, mask


# ---- the log-probs where the estimate is formed -----------------------------------------------------

ALIASED = """
    import torch


    def masked_mean(values, mask, dim=None):
        return (values * mask).sum(dim=dim) / mask.sum(dim=dim)


    def kl_loss(logprobs, ref_logprobs, mask):
        ref = ref_logprobs.detach()  # two names hold the reference's log-probs at the return
        kl = torch.exp(ref - logprobs) - (ref - logprobs) - 1
        return masked_mean(kl, mask, dim=-1).mean()
"""


def test_log_probs_are_read_where_the_estimate_is_formed_and_a_per_sequence_mean_is_kept(tmp_path):
    findings, fixed, path = _fixed(tmp_path, ALIASED)
    assert {f.code for f in findings} >= {"KL002", "KL007"}
    # the names of the estimator's statement; the per-sequence token-mean becomes the batch token-mean
    assert "    return klaudit.estimators.kl_penalty(logprobs, ref, mask).loss.sum() / mask.sum()\n" in fixed
    pytest.importorskip("torch")
    import klaudit.audit

    report = klaudit.audit.check(_load(path, "aliased").kl_loss)
    assert report.results and report.unbiased, report.to_text()
    # scale: with equal lengths the per-sequence token-mean is the batch token-mean, and the
    # estimator's value is the k3 it replaces, so the two losses agree to rounding
    original = tmp_path / "original.py"
    original.write_text(textwrap.dedent(ALIASED))
    batch = _batch(equal_lengths=True)
    before = _load(original, "original").kl_loss(*batch)
    after = _load(path, "aliased").kl_loss(*batch)
    k1_value = ((batch[0] - batch[1]) * batch[2]).sum() / batch[2].sum()
    assert float(after.detach()) == pytest.approx(float(k1_value.detach()), rel=1e-6)  # k1: the catalog's fix for KL007
    assert float(before.detach()) > 0  # (k3's value differs from k1's; the reduction's scale is what is kept)


CONTAINER = """
    import torch


    def agg_loss(loss_mat, loss_mask, loss_agg_mode):
        return (loss_mat * loss_mask).sum() / loss_mask.sum()


    class Actor:
        kl_coef = 0.05

        def kl_loss(self, data, log_prob, pg_loss):
            response_mask = data["response_mask"]
            kld = torch.exp(data["ref_log_prob"] - log_prob) - (data["ref_log_prob"] - log_prob) - 1
            kl_loss = agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode="token-mean")
            return pg_loss + kl_loss * self.kl_coef
"""


def test_a_container_read_and_verl_agg_loss_token_mean(tmp_path):
    findings, fixed, path = _fixed(tmp_path, CONTAINER)
    assert "KL002" in {f.code for f in findings}
    assert ('kl_loss = klaudit.estimators.kl_penalty(log_prob, data["ref_log_prob"], response_mask, '
            'estimator="k3").loss.sum() / response_mask.sum()\n') in fixed
    torch = pytest.importorskip("torch")
    logprobs, ref_logprobs, mask = _batch()
    data = {"ref_log_prob": ref_logprobs, "response_mask": mask}
    zero = torch.zeros(())
    original = tmp_path / "original.py"
    original.write_text(textwrap.dedent(CONTAINER))
    before = _load(original, "container").Actor().kl_loss(data, logprobs, zero)
    after = _load(path, "container").Actor().kl_loss(data, logprobs, zero)
    # k3 stays k3 (R-C): the value of the token-mean is the same, only the gradient changes
    assert float(after.detach()) == pytest.approx(float(before.detach()), rel=1e-6)
    (grad_after,) = torch.autograd.grad(after, logprobs)
    (grad_before,) = torch.autograd.grad(before, logprobs)
    assert not torch.allclose(grad_after, grad_before)


def test_a_container_changed_before_the_kl_term_is_used_is_refused(tmp_path):
    source = CONTAINER.replace(
        '            kl_loss = agg_loss(',
        '            data["ref_log_prob"] = data["ref_log_prob"].float()\n            kl_loss = agg_loss(')
    reasons = _refusal(tmp_path, source)
    assert any("`data` may change at line" in why for why in reasons), reasons


# ---- aggregators whose mode is a switch -----------------------------------------------------------

SWITCHED = """
    import torch
    from verl.trainer.ppo.core_algos import agg_loss


    def update_policy(config, data, log_prob, pg_loss):
        loss_agg_mode = config.loss_agg_mode
        ref_log_prob = data["ref_log_prob"]
        response_mask = data["response_mask"]
        kld = torch.exp(ref_log_prob - log_prob) - (ref_log_prob - log_prob) - 1
        kl_loss = agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)
        return pg_loss + kl_loss * config.kl_loss_coef
"""


def test_agg_loss_with_a_mode_read_from_the_configuration_is_refused(tmp_path):
    reasons = _refusal(tmp_path, SWITCHED)
    assert any("depends on its loss_agg_mode" in why and '"token-mean"' in why for why in reasons), reasons
    # pinning the switch judges fewer paths but does not make one reduction right for every mode
    pinned = Settings(switches={"loss_agg_mode": ("token-mean",)})
    assert all("depends on its loss_agg_mode" in why for why in _refusal(tmp_path, SWITCHED, pinned))


def test_agg_loss_with_a_mode_the_analysis_reads_keeps_its_scale(tmp_path):
    source = SWITCHED.replace("loss_agg_mode = config.loss_agg_mode", 'loss_agg_mode = "seq-mean-token-sum-norm"')
    _, fixed, _ = _fixed(tmp_path, source)
    # a token-sum divided by the padded length: the same constant divides the estimator's sum
    assert ('kl_penalty(log_prob, ref_log_prob, response_mask, estimator="k3").loss.sum() / '
            'response_mask.shape[-1]') in fixed


def test_agg_loss_given_global_normalisers_is_refused(tmp_path):
    source = SWITCHED.replace("loss_agg_mode=loss_agg_mode)", 'loss_agg_mode="token-mean", **config.global_batch_info)')
    reasons = _refusal(tmp_path, source)
    assert any("**config.global_batch_info" in why and "scale" in why for why in reasons), reasons


# ---- factors around the KL term -------------------------------------------------------------------

RATIO_WEIGHTED = """
    import torch


    def grpo_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, mask, beta):
        ratio = torch.exp(per_token_logps - old_per_token_logps)
        per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
        per_token_loss = -ratio * advantages.unsqueeze(1) + beta * per_token_kl * ratio
        return (per_token_loss * mask).sum() / mask.sum()
"""


def test_a_kl_term_times_a_differentiable_ratio_is_refused_and_says_so(tmp_path):
    reasons = _refusal(tmp_path, RATIO_WEIGHTED)
    assert reasons == {"the KL term is multiplied by `ratio`, which depends on the policy (a differentiable "
                       "ratio or log-probs): the product is a different estimator, rewrite it by hand"}
