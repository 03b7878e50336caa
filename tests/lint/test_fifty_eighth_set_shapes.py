"""Shapes of code met in the fifty-eighth blind set that the lint misread.

- v0yager33/MonetVLM keeps its first GRPO step, `_grpo_step` (one prompt at a time), beside the batched
  `_grpo_step_batch` its `train()` now calls; only a comment still names the old one. A private method no code of
  the project names never runs: its reversed k3 loss was a false KL009.
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
