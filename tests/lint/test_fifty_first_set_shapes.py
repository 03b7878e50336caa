"""Shapes of code met in the fiftieth blind set and after it that the lint misread: a critic regressed on a target
that holds a detached log-ratio (DRO-V's value loss), which is no KL penalty left without its gradient."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

# LLNL/protein_tune_rl's DRO loss, reduced: the policy's part holds the squared log-ratio with gradient; the value's
# part is sg(V - r + tau * log-ratio) * V, whose gradient (V - (r - tau * log-ratio)) grad V regresses the critic.
DRO = """\
import torch


class DRO:
    def calculate_loss(self, batch):
        pi_logits = self.policy(batch["input_ids"]).logits
        with torch.no_grad():
            ref_logits = self.ref_model(batch["input_ids"]).logits
        labels = batch["labels"]
        pi_log_probs = torch.gather(pi_logits.log_softmax(-1), 2, labels.unsqueeze(2)).squeeze(2)
        ref_log_probs = torch.gather(ref_logits.log_softmax(-1), 2, labels.unsqueeze(2)).squeeze(2)
        log_ratio = pi_log_probs - ref_log_probs
        value = {value}.float().flatten()
        value_no_grad = value.clone().detach()
        log_ratio_no_grad = log_ratio.clone().detach()
        policy_loss = -(pi_log_probs.sum(-1) * (batch["rewards"] - value_no_grad)
                        - self.tau / 2 * torch.pow(log_ratio.sum(-1), 2)).mean()
        value_loss = ((value_no_grad - batch["rewards"] + self.tau * log_ratio_no_grad.sum(-1)) * {factor}).mean()
        return policy_loss, value_loss

    def step(self, batch):
        policy_loss, value_loss = self.calculate_loss(batch)
        (policy_loss + value_loss).backward()
"""


def _found(tmp_path, source):
    (tmp_path / "dro.py").write_text(source)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return sorted({(finding.code, finding.line) for finding in result.findings})


@pytest.mark.parametrize("value", ["self.value(batch['prompts'])", "self.critic_model(batch['prompts'])"])
def test_a_detached_log_ratio_in_a_critics_target_is_no_penalty_without_gradient(tmp_path, value):
    assert ("KL001", 18) not in _found(tmp_path, DRO.format(value=value, factor="value"))


@pytest.mark.parametrize("value, factor", [
    ("self.value(batch['prompts'])", "value_no_grad"),  # the critic's output detached: a number like any other
    ("self.config.get_value('scale')", "value"),  # a lookup named like a value, not a value network
])
def test_the_same_detached_log_ratio_times_anything_else_is_still_reported(tmp_path, value, factor):
    assert ("KL001", 18) in _found(tmp_path, DRO.format(value=value, factor=factor))
