"""Shapes of code met in the fifty-second blind set that the lint misread: `torch.square(v - returns)`, a critic's
squared error against returns that hold a detached KL reward, was read as a detached k2 added to the loss, while
`(v - returns) ** 2` was not. Every spelling of a square now takes one path, which leaves the cross terms of a
value the analysis does not follow (the critic's prediction) out of the product."""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

# DylanJoo/retrisound's PPO, reduced: a ranking policy's log-prob per step (a sum over the items it ranks), the
# first step's log-prob as the reference, a k1 penalty in the rewards, and a critic's prediction the analysis does
# not follow, regressed on the returns.
CRITIC = """\
import torch


def train(policy, value_model, batch, args, steps):
    logprobs, ref_logprobs = [], []
    with torch.no_grad():
        for n in range(steps):
            logprob = sequence_log_prob(policy, batch, n)
            if n == 0:
                ref_logprob = logprob.clone()
            logprobs.append(logprob)
            ref_logprobs.append(ref_logprob)
        logprobs = torch.stack(logprobs, 1)
        ref_logprobs = torch.stack(ref_logprobs, 1)
        kl = logprobs - ref_logprobs
        rewards = -args.kl_coef * kl + batch.scores
        returns = rewards + batch.values
    for epoch in range(4):
        for idx in batch.minibatches:
            mb_return = returns[idx]
            vpred = predict(value_model, batch.states[idx])
            vf_losses1 = {square}


def sequence_log_prob(policy, batch, n):
    return policy(batch, n).logits.log_softmax(-1).gather(-1, batch.actions[n]).sum(-1)
"""

# the square of a detached log-ratio itself, added to a trained loss: k2 without its gradient (row 1c)
DETACHED = """\
import torch


def step(policy, ref, batch, beta, optimizer):
    logp = policy(batch.input_ids).logits.log_softmax(-1).gather(-1, batch.actions).squeeze(-1)
    with torch.no_grad():
        ref_logp = ref(batch.input_ids).logits.log_softmax(-1).gather(-1, batch.actions).squeeze(-1)
        kl = logp - ref_logp
    pg_loss = -(logp * batch.advantages).mean()
    loss = pg_loss + beta * 0.5 * ({square}).mean()
    loss.backward()
    optimizer.step()
"""


def _codes(tmp_path, source):
    (tmp_path / "ppo.py").write_text(source)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return sorted({finding.code for finding in result.findings})


@pytest.mark.parametrize("square", ["torch.square({})", "({}).square()", "({}) ** 2", "torch.pow({}, 2)",
                                    "({0}) * ({0})"])
def test_a_critics_squared_error_against_kl_shaped_returns_is_no_detached_k2(tmp_path, square):
    assert "KL001" not in _codes(tmp_path, CRITIC.format(square=square.format("vpred - mb_return")))


@pytest.mark.parametrize("square", ["torch.square({})", "({}).square()", "({}) ** 2", "torch.pow({}, 2)",
                                    "({0}) * ({0})"])
def test_the_square_of_a_detached_log_ratio_added_to_a_loss_is_still_a_detached_k2(tmp_path, square):
    assert "KL001" in _codes(tmp_path, DETACHED.format(square=square.format("kl")))
