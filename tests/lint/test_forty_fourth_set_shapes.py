"""Shapes of code met after the forty-third blind set that the lint misread."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

# A trainer class whose step forms a PPO ratio to the rollout's log-probs and takes one optimizer step per call
# (nikq/mathFormer's GRPOTrainer.train_step); nothing in its own module calls it.
TRAINER = """\
import torch


class GRPOTrainer:
    def train_step(self, logp_fn, ids, mask, rewards, old_logprobs, ref_logprobs):
        logprobs = logp_fn(ids)
        ratio = torch.exp(logprobs - old_logprobs)
        policy_loss = -(ratio * rewards[:, None] * mask).sum() / mask.sum()
        kl = torch.exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1
        loss = policy_loss + 0.1 * (kl * mask).sum() / mask.sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
"""

# The training script beside it: `{body}` is the loop's body, indented by eight spaces.
SCRIPT = """\
from grpo import GRPOTrainer


def generate_responses(model, prompts):
    return [model.generate(p) for p in prompts]


def main(model, trainer, prompts, steps):
    for step in range(steps):
{body}


if __name__ == "__main__":
    main(None, GRPOTrainer(), [], 10)
"""

FRESH = """\
        batch = generate_responses(model, prompts)
        trainer.train_step(model, batch, None, None, None, None)"""
# the same rollout trained by four calls: every call after the first is on an older policy's samples
REUSED = """\
        batch = generate_responses(model, prompts)
        for epoch in range(4):
            trainer.train_step(model, batch, None, None, None, None)"""
# no draw before the call: the batches come from elsewhere (a buffer of earlier rollouts, say)
NO_DRAW = """\
        batch = prompts[step]
        trainer.train_step(model, batch, None, None, None, None)"""


def _found(root):
    result = lint_paths([str(root)], jobs=1)
    return sorted((finding.path.rsplit("/", 1)[-1], finding.code) for finding in result.findings)


@pytest.mark.parametrize("body, stale", [(FRESH, False), (REUSED, True), (NO_DRAW, True)])
def test_a_step_called_by_another_module_right_after_it_draws_is_on_policy(tmp_path, body, stale):
    """A trainer's step that nothing in its module calls, called once by a script right after it generates new
    responses, takes its one optimizer step on the policy that drew them: its PPO ratio is 1 there and the KL is
    on-policy (no KL008). The same call in a loop of four epochs over one rollout, or after no draw, is not."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "grpo.py").write_text(TRAINER)
    (src / "train.py").write_text(SCRIPT.format(body=body))
    codes = {code for _, code in _found(tmp_path)}
    assert "KL002" in codes
    assert ("KL008" in codes) is stale


def test_a_step_called_at_two_places_elsewhere_is_not_read_as_on_policy(tmp_path):
    """Two calls of the step in the modules around it (a second script that trains each rollout twice): which one
    runs is the user's choice, so the lint keeps reading the ratio as a sign of older samples."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "grpo.py").write_text(TRAINER)
    (src / "train.py").write_text(SCRIPT.format(body=FRESH))
    (src / "train_twice.py").write_text(SCRIPT.format(body=REUSED))
    assert ("grpo.py", "KL008") in _found(tmp_path)
