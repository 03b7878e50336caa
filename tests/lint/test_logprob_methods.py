"""A model's method named for log-probs gives that model's per-token log-probs, whatever the result is called.

Shape of Timesi/RL_LLM_PPO (seventy-fourth fresh set), a minGPT RLHF pipeline: under no_grad the rollout stores
`original_log_prob = model.log_probs(inputs, targets)` and the reference's `ref_model.log_probs(...)`, puts
`-kl_beta * (original_log_prob - ref_log_prob)` into each token's reward, and trains the same rollout for two
passes with a per-token clipped ratio: a k1 reward (row 6) with each response's token mean (row 21, KL007) on an
older policy's samples after the first pass (row 23, KL008). `original_log_prob` names no log-prob role (here the
reference's and their difference are stored under neutral names too), so the lint read nothing there before. A distribution's `dist.log_prob(action)` is no model's.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

ROLLOUT = """\
import torch


def ppo(model, ref_model, reward_model, optimizer, batch, n_updates=2):
    with torch.no_grad():
        completion = model.generate(batch.prompts, do_sample=True)
        reward = reward_model(completion)
        original_log_prob = model.log_probs(completion[:, :-1], completion[:, 1:])
        anchor = {reference}.log_probs(completion[:, :-1], completion[:, 1:])
        gap = original_log_prob - anchor
        score = -0.02 * gap + reward
        returns = score.flip(-1).cumsum(-1).flip(-1)
    for _ in range(n_updates):
        log_prob = model.log_probs(completion[:, :-1], completion[:, 1:])
        ratio = torch.exp(log_prob - original_log_prob)
        loss = (-(returns * ratio * batch.mask).sum(1) / batch.mask.sum(1)).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_the_log_probs_method_of_the_policy_and_the_reference_give_a_k1_reward(tmp_path):
    assert {code for _, code in module_codes(ROLLOUT.format(reference="ref_model"), tmp_path)} == {"KL007", "KL008"}


@pytest.mark.parametrize("reference", ["dist", "self.sampler"])
def test_a_method_of_something_not_named_as_a_model_gives_nothing(tmp_path, reference):
    assert module_codes(ROLLOUT.format(reference=reference), tmp_path) == []


def test_a_method_of_a_sequences_total_is_not_per_token(tmp_path):
    text = ROLLOUT.format(reference="ref_model").replace(".log_probs(", ".sequence_log_probs(")
    assert module_codes(text, tmp_path) == []


@pytest.mark.parametrize("statement, kind", [
    ("lp = model.log_probs(ids, targets)", "P"),
    ("lp = self.ref_model.get_logprobs(batch)", "Q"),
    ("lp = model_old.log_probs(ids, targets)", "O"),
    # the name says whose they are (a helper that swaps the weights, an adapter switched off elsewhere): it decides
    ("ref_logps = model.log_probs(ids, targets)", None),
    ("old_log_probs = model.log_probs(ids, targets)", None),
    ("lp = dist.log_prob(action)", None),
])
def test_the_role_of_a_log_probs_method_unless_the_name_gives_one(statement, kind):
    import libcst as cst

    from klaudit.lint.calls import _logprobs_of_a_model

    stmt = cst.parse_statement(statement).body[0]
    found = _logprobs_of_a_model(stmt.value.func, False, stmt)
    assert ([atom.kind for fact in found for atom in fact.poly.atoms()] or [None]) == [kind]
