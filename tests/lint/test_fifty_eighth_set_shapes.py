"""Shapes of code met in the fifty-eighth blind set that the lint misread.

- v0yager33/MonetVLM keeps its first GRPO step, `_grpo_step` (one prompt at a time), beside the batched
  `_grpo_step_batch` its `train()` now calls; only a comment still names the old one. A private method no code of
  the project names never runs: its reversed k3 loss was a false KL009.
- starry0626/self_eval writes k3 with the sampled tokens' probabilities, `p_teacher / p_student - 1 - (log_t -
  log_s)`: the quotient of two probabilities was lost, and the k1 left over was reported (a false KL001; the
  k3 loss, KL002, and its 1/L, KL007, missed).
"""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

TRAINER = """\
import torch


class GRPOTrainer:
    def {old}(self, batch):
        logp = self.policy(batch)
        ref = self.ref_policy(batch).detach()
        kl = torch.exp(logp - ref) - 1 - (logp - ref)
        loss = (self.beta * kl).mean()
        loss.backward()
        self.optimizer.step()

    def _step_batch(self, batch):
        logp = self.policy(batch)
        loss = -(logp * batch["advantages"]).mean()
        loss.backward()
        self.optimizer.step()

    def train(self, batches):
        for batch in batches:
            # the per-prompt loop of {old} is gone: one batched step now
            self.{called}(batch)
"""


@pytest.mark.parametrize("old, called, elsewhere, expected", [
    ("_grpo_step", "_step_batch", {}, []),  # named only in a comment: it never runs
    ("_grpo_step", "_grpo_step", {}, [(9, "KL009")]),  # called: the reversed k3 loss (row 5b)
    ("grpo_step", "_step_batch", {}, [(9, "KL009")]),  # public: a user of the class may call it
    # named by a script, a notebook or a configuration of the project: it may run
    ("_grpo_step", "_step_batch", {"run.py": "from trainer import GRPOTrainer\nGRPOTrainer()._grpo_step({})\n"},
     [(9, "KL009")]),
    ("_grpo_step", "_step_batch", {"demo.ipynb": '{"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], '
                                   '"source": ["t._grpo_step(b)"], "execution_count": null}], "metadata": {}, '
                                   '"nbformat": 4, "nbformat_minor": 5}'}, [(9, "KL009")]),
    ("_grpo_step", "_step_batch", {"conf.yaml": "step_fn: _grpo_step\n"}, [(9, "KL009")]),
])
def test_a_private_method_no_code_names_never_runs(tmp_path, old, called, elsewhere, expected):
    (tmp_path / "trainer.py").write_text(TRAINER.format(old=old, called=called))
    for name, text in elsewhere.items():
        (tmp_path / name).write_text(text)
    found = [(finding.line, finding.code) for finding in lint_paths([str(tmp_path)], jobs=1).findings
             if finding.path.endswith("trainer.py")]
    assert found == expected


PROBABILITY_RATIO = """\
import torch
import torch.nn.functional as F


def k3_from_logits(student_logits, teacher_logits, tokens, mask, eps=1e-8):
    log_s = F.log_softmax(student_logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    log_t = F.log_softmax(teacher_logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    p_s = torch.exp(log_s).clamp(min=eps)
    p_t = torch.exp(log_t).clamp(min=eps)
    ratio = {ratio}
    return (ratio - 1 - (log_t - log_s)) * mask


def train_step(model, ref_model, ids, mask, optimizer):
    student_logits = model(ids).logits
    with torch.no_grad():
        teacher_logits = ref_model(ids).logits
    loss = k3_from_logits(student_logits, teacher_logits, ids, mask).sum() / mask.sum()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("ratio", ["p_t / p_s", "torch.exp(log_t - log_s)"])
def test_a_ratio_of_the_sampled_tokens_probabilities_is_the_exp_of_their_log_ratio(tmp_path, ratio):
    """starry0626/self_eval's k3 option divides the teacher's probability of each sampled token by the student's,
    both floored at 1e-8: ref/pi - 1 - log(ref/pi) is k3 as a loss (row 3, KL002), not the k1 that remained when
    the quotient was lost; the floor keeps the division finite and clamps no KL (no KL010)."""
    (tmp_path / "sdpo.py").write_text(PROBABILITY_RATIO.format(ratio=ratio))
    found = [(finding.line, finding.code) for finding in lint_paths([str(tmp_path)], jobs=1).findings]
    assert found == [(18, "KL002")]
