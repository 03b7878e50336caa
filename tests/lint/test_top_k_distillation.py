"""Distillation over each position's top-k tokens (NeMo-RL's DistillationLossFn, slime forks' OPD modes).

The student's and the teacher's log-probs of the k most likely tokens are a slice of the vocabulary axis:
sum_k p_s (log p_s - log p_t) is the exact per-step reverse KL_t, truncated to the k. As a loss on the
student's own samples it gives the local gradient only (kl-math.md section 8, row 2: KL003). Detached
into the advantage of its own token it is fixed before the token is drawn, so it adds nothing in
expectation (row 10b: KL004).
"""

from __future__ import annotations

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths

LOSS = '''\
import torch


def distillation_loss(student_topk_logprobs, teacher_topk_logprobs, mask):
    student_probs = student_topk_logprobs.exp()
    per_token_kl = (student_probs * (student_topk_logprobs - teacher_topk_logprobs)).sum(dim=-1)
    loss = (per_token_kl * mask).sum() / mask.sum()
    return loss
'''

ADVANTAGE = '''\
import torch


def apply_opd(advantages, student_topk_lp, teacher_topk_lp, opd_kl_coef):
    for i, adv in enumerate(advantages):
        p_s = student_topk_lp[i].exp()
        reverse_kl = (p_s * (student_topk_lp[i] - teacher_topk_lp[i])).sum(dim=-1).detach()
        advantages[i] = adv - opd_kl_coef * reverse_kl
'''


def _lint(tmp_path, source):
    module = tmp_path / "distill.py"
    module.write_text(source)
    return lint_paths([str(module)], settings=Settings(root=tmp_path), jobs=1).findings


def test_the_top_k_reverse_kl_as_a_loss_has_the_local_gradient_only(tmp_path):
    [finding] = _lint(tmp_path, LOSS)
    assert (finding.code, finding.line) == ("KL003", 7)
    assert "full differentiated as a loss" in finding.message


def test_the_top_k_reverse_kl_in_its_own_tokens_advantage_adds_nothing(tmp_path):
    [finding] = _lint(tmp_path, ADVANTAGE)
    assert (finding.code, finding.line) == ("KL004", 8)
    assert "full in the reward (same-token)" in finding.message and "no gradient in expectation" in finding.message
