"""Shapes of code met in the sixty-first blind set that the lint misread.

- jeurtr/nanolm's PPO trainer gathers token log-probs with a helper of its own utilities module named like
  torch's, `log_softmax(logits, ids)`. That module has no KL words, so the call was read as torch's log-softmax
  over a `dim`, the log-ratio of the rollout was no KL estimate, and its k3 reward (`kl_estimator: k3`, kl-math.md
  section 8, row 7, KL004) went unreported.
"""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

UTILS = """\
import torch.nn.functional as F


def {name}(logits, index):
    values = F.log_softmax(logits, dim=-1)
    return values.gather(dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
"""
TRAINER = """\
import torch

from .utils import {name}


class PPOTrainer:
    def rollout(self, prompts):
        with torch.no_grad():
            ids = self.policy.generate(prompts)
            old_log_probs = {name}(self.policy(ids).logits, ids)
            ref_log_probs = {name}(self.ref_model(ids).logits, ids)
            logr = ref_log_probs - old_log_probs
            rewards = -self.kl_beta * ((logr.exp() - 1) - logr)
            rewards[:, -1] += self.reward_func(ids)
        return ids, rewards

    def train(self):
        for prompts in self.loader:
            ids, rewards = self.rollout(prompts)
            returns = rewards.flip(-1).cumsum(-1).flip(-1)
            log_probs = {name}(self.policy(ids).logits, ids)
            loss = -(log_probs * returns).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
"""


@pytest.mark.parametrize("name", ["log_softmax", "selective_log_softmax", "token_logps"])
def test_a_log_softmax_helper_of_a_module_without_kl_words_is_followed(tmp_path, name):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text(UTILS.format(name=name))
    (package / "trainer.py").write_text(TRAINER.format(name=name))
    found = [(f.line, f.code) for f in lint_paths([str(tmp_path)], jobs=1).findings]
    assert found == [(13, "KL004")]
