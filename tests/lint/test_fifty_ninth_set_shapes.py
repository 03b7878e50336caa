"""Shapes of code met in the fifty-ninth blind set that the lint misread.

- HaiderDawoodKhan/LLM-Alignment steps once per call of `ppo_update_epoch`, and its training script calls it over
  epochs of mini-batches, each `slice_rollout_batch(rollout, indices)`: the slice was read as drawing new samples,
  so the k1 loss was called on-policy (row 1, KL001) where from the second step on it is on an older policy's
  samples too (row 22, KL008).
- KJ14GOD/llm-post-training-rl runs its PPO loss one rollout at a time, `for idx in minibatch_indices: rollout =
  rollout_records[idx]`, and averages the KL of that one sequence with `.mean()`: each sequence divided by its own
  length (row 21, KL007), read as a division by a constant.
"""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths

# HaiderDawoodKhan/LLM-Alignment: one optimizer step a call, and the training script's loop of
# epochs and mini-batches around the call, each mini-batch a slice of one rollout
UPDATE = """\
import torch


def ppo_update(policy, optimizer, batch, kl_coef):
    logp = policy(batch.input_ids).logits.log_softmax(-1).gather(-1, batch.ids).squeeze(-1)
    ratio = torch.exp(logp - batch.old_logprobs)
    kl = (logp - batch.ref_logprobs).mean()
    loss = -(ratio * batch.advantages).mean() + kl_coef * kl
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
SCRIPT = """\
from ppo import ppo_update


def main(policy, optimizer, prompts, epochs, size):
    for step in range(100):
        rollout = collect_rollouts(policy, prompts)
{inner}
"""


@pytest.mark.parametrize("inner, expected", [
    # four passes over slices of one rollout: from the second step on, the samples are an older policy's (row 22)
    ("        for _ in range(4):\n            for start in range(0, size, 8):\n"
     "                minibatch = slice_rollout_batch(rollout, start)\n"
     "                ppo_update(policy, optimizer, minibatch, 0.1)",
     ["KL001", "KL008"]),
    ("        ppo_update(policy, optimizer, rollout, 0.1)", ["KL001"]),  # one step a rollout: on-policy (row 1)
])
def test_a_step_another_module_repeats_on_one_rollout_is_on_older_samples(tmp_path, inner, expected):
    (tmp_path / "ppo.py").write_text(UPDATE)
    (tmp_path / "train.py").write_text(SCRIPT.format(inner=inner))
    found = sorted({finding.code for finding in lint_paths([str(tmp_path)], jobs=1).findings
                    if finding.path.endswith("ppo.py")})
    assert found == expected


ONE_AT_A_TIME = """\
import random

import torch


def recompute(policy, rollout):
    ids = rollout.output_ids.unsqueeze(0)
    logits = policy(input_ids=ids).logits[:, :-1, :]
    logps = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return logps[:, rollout.input_len - 1:][0]


def ppo_update(policy, optimizer, {records}, targets):
    indices = list(range(len({records})))
    random.shuffle(indices)
    for idx in indices:
        rollout = {records}[idx]
        logps = recompute(policy, rollout)
        kl = (logps - targets[idx].ref_logprobs).exp() - 1 - (logps - targets[idx].ref_logprobs)
        loss = 0.1 * kl.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("records", ["rollout_records", "rollouts"])
def test_one_rollout_at_a_time_picked_by_index_is_averaged_over_its_own_tokens(tmp_path, records):
    (tmp_path / "ppo.py").write_text(ONE_AT_A_TIME.format(records=records))
    found = {finding.code: finding.message for finding in lint_paths([str(tmp_path)], jobs=1).findings}
    assert "KL007" in found and "seq-token-mean" in found["KL007"]  # 1/L of each rollout (row 21)
    assert "KL009" in found  # the reversed k3, exp(log pi - log ref) - 1 - log ratio, as a loss (row 5b)
