"""Shapes of code met in the sixtieth blind set that the lint misread.

- tianbingsz/LLM adds its k3 penalty to the loss inside the `with torch.no_grad():` block that computes it,
  `loss += self.config.kl_penalty * kl_penalty`. The in-place update is not recorded by autograd: the loss keeps the
  policy-gradient term's gradient, and the KL term adds none (kl-math.md section 8, row 1c, KL001). The whole loss
  was read as detached, and the KL term was lost.
- rqzhangberkeley/efficient-reasoning's copy of TRL's GRPO trainer takes the ratio to stored log-probs only
  `if self.num_iterations > 1` (tests/frameworks/test_trl_runs.py): the k3 loss is on older samples only on that
  path, and a KL008 holds only there.
"""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

STEP = """\
import torch


def train_step(policy, ref_policy, optimizer, ids, old_log_probs, advantages, beta):
    log_probs = policy(ids).logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    loss = -(torch.exp(log_probs - old_log_probs) * advantages.unsqueeze(-1)).mean()
    with torch.no_grad():
        ref_log_probs = ref_policy(ids).logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        kl = (torch.exp(ref_log_probs - log_probs) - (ref_log_probs - log_probs) - 1).sum(-1).mean()
{added}
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("added, expected", [
    ("        loss += beta * kl", [(10, "KL001")]),  # in place under no_grad: the loss keeps its gradient, k3 none
    ("    loss = loss + beta * kl", [(10, "KL001")]),  # after the block: the same constant
])
def test_a_kl_term_added_under_no_grad_has_no_gradient(tmp_path, added, expected):
    (tmp_path / "train.py").write_text(STEP.format(added=added))
    found = [(finding.line, finding.code) for finding in lint_paths([str(tmp_path)], jobs=1).findings]
    assert found == expected


REUSED = """\
import torch


def grpo_loss(logps, inputs, beta, num_iterations):
    ref = inputs["ref_per_token_logps"]
    per_token_kl = torch.exp(ref - logps) - (ref - logps) - 1
    old = inputs["old_per_token_logps"] if num_iterations > 1 else logps.detach()
    ratio = torch.exp(logps - old)
    per_token_loss = -ratio * inputs["advantages"].unsqueeze(1) + beta * per_token_kl
    mask = inputs["completion_mask"]
    return (per_token_loss * mask).sum() / mask.sum()
"""


def test_older_samples_hold_only_on_the_path_that_reads_stored_log_probs(tmp_path):
    (tmp_path / "loss.py").write_text(REUSED)
    found = {finding.code: finding for finding in lint_paths([str(tmp_path)], jobs=1).findings}
    assert sorted(found) == ["KL002", "KL008"]
    assert "num_iterations > 1" in found["KL008"].message  # older samples on that path only
    assert "num_iterations" not in found["KL002"].message and "on-policy" in found["KL002"].message



# the shape of yuxuandexter/tunix's grpo_loss_fn (twenty-first set): the ratio of the "gspo-token" path is one the
# analysis does not follow; the KL term still reaches that path's per-sequence token mean (row 21, KL007)
TWO_PATHS = """\
import torch


def grpo_loss(logps, old_logps, ref_logps, advantages, mask, beta, loss_algo):
    log_ratio = logps - old_logps
    if loss_algo == "gspo-token":
        log_ratio = sequence_level(log_ratio, mask)
    ratio = torch.exp(log_ratio)
    per_token_loss = -ratio * advantages.unsqueeze(1)
    kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
    per_token_loss = per_token_loss + beta * kl
    if loss_algo == "gspo-token":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1)).mean()
    return (per_token_loss * mask).sum() / mask.sum()
"""


def test_a_ratio_the_analysis_follows_on_one_path_only_keeps_the_kl_term_on_the_others(tmp_path):
    (tmp_path / "loss.py").write_text(TWO_PATHS)
    found = sorted({finding.code for finding in lint_paths([str(tmp_path)], jobs=1).findings})
    assert found == ["KL002", "KL007", "KL008"]  # k3 as a loss (row 3), 1/L on the gspo path (21), older samples (22)


# zjworacle/LLM: a hook between the step and the loss helper hands on the log-probs it is given; the step that calls
# the hook hands it `old_logp = policy_logp.detach()`, a ratio of 1: one step on fresh samples (row 3, not 22)
HOOKED = """\
import torch


def grpo_loss(policy_logp, old_logp, ref_logp, advantages, mask, beta=0.04):
    ratio = torch.exp(policy_logp - old_logp)
    kl = torch.exp(ref_logp - policy_logp) - (ref_logp - policy_logp) - 1.0
    per_token = -ratio * advantages.unsqueeze(1) + beta * kl
    return (per_token * mask).sum() / mask.sum()


class Trainer:
    def _group_loss(self, sequences, mask, advantages):
        policy_logp = self._logprobs(self.model, sequences)
        ref_logp = self._logprobs(self.ref, sequences).detach()
        old_logp = {old}
        return self._compute_loss(policy_logp, old_logp, ref_logp, advantages, mask)

    def _compute_loss(self, policy_logp, old_logp, ref_logp, advantages, mask):
        return grpo_loss(policy_logp, old_logp, ref_logp, advantages, mask)

    def train_step(self, sequences, mask, advantages):
        loss = self._group_loss(sequences, mask, advantages)
        loss.backward()
        self.optimizer.step()
"""


@pytest.mark.parametrize("old, expected", [
    ("policy_logp.detach()", ["KL002"]),
    ("self._logprobs(self.old_model, sequences).detach()", ["KL002", "KL008"]),  # an older copy's: older samples
])
def test_the_outermost_caller_says_which_samples_a_hooked_helper_gets(tmp_path, old, expected):
    (tmp_path / "grpo.py").write_text(HOOKED.format(old=old))
    assert sorted({finding.code for finding in lint_paths([str(tmp_path)], jobs=1).findings}) == expected


# Prem01-cyber/finetune_qwen (fifty-fifth set): a switch between a clipped ratio to the rollout's log-probs and plain
# REINFORCE is no switch of the samples' age: the loop that calls the helper draws before each single step, so the
# k1 loss is on-policy on both paths (row 1, KL001 alone)
CLIPPED_OR_NOT = """\
import torch


def group_loss(model, ref_model, sequences, advantages, old_lps, clip_eps, kl_coef):
    total = 0.0
    for ids, adv, old_lp in zip(sequences, advantages, old_lps):
        new_lp = sequence_log_prob(model, ids)
        if clip_eps > 0:
            ratio = torch.exp(new_lp - old_lp.detach())
            loss_i = -torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
        else:
            loss_i = -(adv * new_lp)
        with torch.no_grad():
            ref_lp = sequence_log_prob(ref_model, ids)
        loss_i = loss_i + kl_coef * (new_lp - ref_lp)
        total = total + loss_i
    return total


def train(model, ref_model, optimizer, prompts, steps, args):
    for step in range(steps):
        sequences, old_lps = generate_rollouts(model, prompts)
        loss = group_loss(model, ref_model, sequences, score(sequences), old_lps, args.clip_eps, args.kl_coef)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_a_clip_switch_is_no_switch_of_the_samples_age(tmp_path):
    (tmp_path / "train.py").write_text(CLIPPED_OR_NOT)
    assert sorted({finding.code for finding in lint_paths([str(tmp_path)], jobs=1).findings}) == ["KL001"]
