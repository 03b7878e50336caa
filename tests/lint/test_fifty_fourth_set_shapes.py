"""Shapes of code met in the fifty-fourth blind set that the lint misread.

- Tian-Yizhou/Arithmetic_LLM collects each chunk's per-sequence exact KL with `kl_list.extend(kl_value)` and
  reads it back with `torch.mean(torch.stack(kl_list))` for the loss: `extend` was not read as adding the tensor's
  rows, and the exact per-step KL as a loss (the local gradient only, row 11: KL003) with its per-sequence 1/L
  (row 21: KL007) went unreported.
"""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

EXACT = """\
import torch


class Trainer:
    def step(self, chunks, advantages, coef):
        kl_list = []
        log_probs_list = []
        for input_ids, mask in chunks:
            policy_logits = self.policy_model(input_ids)
            with torch.no_grad():
                reference_logits = self.reference_model(input_ids)
            log_probs = torch.log_softmax(policy_logits, dim=-1)
            token_log_probs = log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            log_probs_list.extend((token_log_probs * mask[:, 1:]).sum(dim=1))
            kl = torch.softmax(policy_logits, -1) * (log_probs - torch.log_softmax(reference_logits, -1))
            kl_value = (kl.sum(-1) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
            kl_list.{method}({added})
        policy_loss = -(torch.stack(log_probs_list) * advantages).mean()
        loss = policy_loss + coef * torch.mean(torch.stack(kl_list))
        loss.backward()
        self.optimizer.step()
"""


def _codes(tmp_path, source):
    (tmp_path / "grpo.py").write_text(source)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return sorted({finding.code for finding in result.findings})


@pytest.mark.parametrize(("method", "added"), [("extend", "kl_value"), ("append", "kl_value.mean()"),
                                                ("extend", "[kl_value.mean()]")])
def test_a_per_sequence_exact_kl_collected_into_a_list_reaches_the_loss(tmp_path, method, added):
    codes = _codes(tmp_path, EXACT.format(method=method, added=added))
    assert "KL003" in codes  # the exact per-step KL as a loss: the local gradient only (row 11)
