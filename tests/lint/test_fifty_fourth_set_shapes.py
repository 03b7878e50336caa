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


# Zeppelinpp/rl: the PPO inner loop's count is a parameter that defaults to 1, and the script's one call leaves it
EPOCHS = """\
import torch


def grpo_loss(model, batch, kl_coef):
    logp = torch.log_softmax(model(batch.ids).logits, -1).gather(-1, batch.ids[..., None]).squeeze(-1)
    ratio = torch.exp(logp - batch.old_logp)
    kl = torch.exp(batch.ref_logp - logp) - (batch.ref_logp - logp) - 1
    return (-(ratio * batch.adv[:, None]) + kl_coef * kl).sum() / batch.mask.sum()


def train(model, batches, optimizer, lr, ppo_epochs: int = 1):
    for batch in batches:
        batch = rollout(model, batch)
        for step in range(ppo_epochs):
            loss = grpo_loss(model, batch, 0.01)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    train({arguments})
"""


@pytest.mark.parametrize(("arguments", "reused"), [
    ("model, batches, optimizer, 1e-5", False),
    ("model, batches, optimizer, 1e-5, ppo_epochs=4", True),
    ("model, batches, optimizer, 1e-5, 4", True),  # by position
    ("*arguments", True),
])
def test_an_inner_loop_counted_by_a_parameter_its_callers_leave_at_one_takes_one_step_per_rollout(
        tmp_path, arguments, reused):
    assert ("KL008" in _codes(tmp_path, EPOCHS.format(arguments=arguments))) is reused


# iamseungpil/metacognition-math's supervised distillation: at each labelled position, the student's logits over a
# teacher's top-k candidate ids, normalised over those candidates, fitted to the teacher's probabilities on them (a
# forward KL over the candidates, on dataset sequences): no k1 of the policy's samples
TOP_K = """\
import torch


def distill_loss(model, batch, coef):
    outputs = model(batch.input_ids)
    logits = outputs.logits[:, :-1, :]
    total = outputs.loss
    for row in range(logits.shape[0]):
        for pos in range(logits.shape[1]):
            ids = batch.teacher_topk_ids[row, pos]
            teacher_probs = torch.softmax(batch.teacher_topk_logprobs[row, pos], dim=-1)
            student_log_probs = torch.log_softmax(logits[row, pos, ids], dim=-1)
            teacher_log_probs = torch.log(teacher_probs.clamp_min(1e-12))
            kl = torch.sum(teacher_probs * (teacher_log_probs - student_log_probs))
            total = total + coef * kl
    total.backward()
"""


def test_log_probs_normalised_over_a_positions_candidate_ids_are_a_distribution_not_a_pick(tmp_path):
    assert "KL001" not in _codes(tmp_path, TOP_K)
