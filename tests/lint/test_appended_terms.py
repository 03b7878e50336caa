"""KL terms appended to a local list and read back with `torch.stack` / `torch.cat`.

VAST-UVA/dLLM_Reason (twenty-fourth set) computes one sequence's log-ratio per sample, appends it to `all_kl`,
and adds `kl_coeff * torch.stack(all_kl).mean()` to the loss: the k1 log-ratio differentiated as a loss, whose
expected gradient is zero (kl-math.md section 8, row 1: KL001). The list holds the terms it was given.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

LOOP = """\
import torch
import torch.nn.functional as F


def train(model, ref_model, groups, optimizer, kl_coeff, adv):
    all_policy_loss = []
    all_kl = []
    for i, (ids, mask) in enumerate(groups):
        with torch.no_grad():
            ref_logp = F.log_softmax(ref_model(ids).logits, dim=-1)
        pol_logp = F.log_softmax(model(ids).logits, dim=-1)
        seq_pol_lp = pol_logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1).sum()
        seq_ref_lp = ref_logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1).sum()
        all_policy_loss.append(-adv[i] * seq_pol_lp)
        all_kl.append(TERM)
    loss = torch.stack(all_policy_loss).mean() + kl_coeff * torch.stack(all_kl).mean()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("term, codes", [
    ("seq_pol_lp - seq_ref_lp", [(16, "KL001")]),  # the log-ratio as a loss
    ("(seq_pol_lp - seq_ref_lp).item()", [(16, "KL001")]),  # a number: no gradient at all (row 1c)
])
def test_terms_appended_to_a_list_reach_the_loss_it_is_stacked_into(tmp_path, term, codes):
    assert module_codes(LOOP.replace("TERM", term), tmp_path) == codes


PER_TOKEN_FLOATS = """\
import torch


def ppo_step(policy, opt, ids, old_logp, ref_logp, score, beta):
    rewards = [-beta * float(old_logp[t] - ref_logp[t]) for t in range(len(old_logp) - 1)]
    rewards.append(score - beta * float(old_logp[-1] - ref_logp[-1]))
    rewards_t = torch.tensor(rewards)
    advantages = rewards_t.flip(0).cumsum(0).flip(0)
    for _epoch in range(2):
        logp = policy(ids)
        loss = -(logp * advantages).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_tensor_made_of_a_list_of_per_token_floats_holds_their_terms(tmp_path):
    """manuhalapeth's PPO stage: a k1 reward per token as Python floats, the last with the score appended, made a
    tensor and trained twice on the same rollout (samples of an older policy, without even a ratio: KL008)."""
    # the comprehension's terms and the appended last one, each where it is formed
    assert module_codes(PER_TOKEN_FLOATS, tmp_path) == [(5, "KL008"), (6, "KL008")]



CHUNKED = """\
import torch
from torch.nn.functional import kl_div, log_softmax


class Distiller:
    def _logps(self, model, input_ids):
        all_logps = []
        for start in range(0, input_ids.size(0), 2):
            logits = model(input_ids[start:start + 2]).logits
            all_logps.append(log_softmax(logits, dim=-1))
        return torch.cat(all_logps, dim=0)

    def compute_loss(self, model, inputs):
        all_logps = self._logps(model, inputs["input_ids"])
        with torch.no_grad():
            teacher_all_logps = self._logps(self.ref_model, inputs["teacher_input_ids"])
        per_token_loss = kl_div(teacher_all_logps, all_logps, reduction="none", log_target=True).sum(-1)
        mask = inputs["completion_mask"]
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1)).mean()
"""


def test_log_probs_over_the_vocabulary_are_held_by_the_list_they_are_appended_to(tmp_path):
    """ayushnangia/Self-Distillation (thirty-eighth set) computes the student's and the teacher's log_softmax in
    chunks, appends each to `all_logps` and returns `torch.cat(all_logps)`: the list holds log-probs over the
    vocabulary, which its name does not tell from one log-prob per token. Read so, kl_div(teacher, student,
    log_target=True) is the exact per-token reverse KL differentiated as a loss (row 2, KL003) with a per-sequence
    token mean (row 21, KL007); read by the name, it was no KL at all."""
    assert module_codes(CHUNKED, tmp_path) == [(17, "KL003"), (17, "KL007")]


STEPPED_ROLLOUT = """\
import torch


def rollout(model, prompt, steps):
    logits = model(prompt)[:, -1, :]
    tokens_steps, logprobs_steps = [], []
    for _ in range(steps):
        lp = torch.log_softmax(logits, dim=-1)
        next_tok = torch.multinomial(lp.exp(), 1).squeeze(-1)
        tokens_steps.append(next_tok)
        logprobs_steps.append(lp[torch.arange(lp.shape[0]), next_tok])
        logits = model(next_tok[:, None])[:, -1, :]
    return torch.stack(tokens_steps, dim=-1), torch.stack(logprobs_steps, dim=-1)


def train(policy, ref_logprobs, optimizer, prompt, advantage, mask, epochs):
    tokens, old_logprobs = rollout(policy, prompt, 16)
    for _ in range(epochs):
        new_logprobs = policy.token_logprobs(prompt, tokens)
        ratio = torch.exp(new_logprobs - old_logprobs)
        kl = torch.exp(ref_logprobs - new_logprobs) - (ref_logprobs - new_logprobs) - 1
        loss = (-(ratio * advantage - 0.02 * kl) * mask).sum() / mask.sum()
        loss.backward()
        optimizer.step()
"""


def test_a_token_picked_by_its_id_in_each_row_is_no_distribution_in_the_list(tmp_path):
    """uygarkurt/post-training-lab (twenty-eighth set) samples token by token and appends `lp[arange(G), next_tok]`,
    each row's sampled token picked from its log-probs over the vocabulary: one log-prob per row, which the list
    holds as the rollout's log-probs, so the update loop's ratio to them shows older samples (row 22, KL008 beside
    the k3 loss's KL002). Read as a distribution, the list's value hid the ratio."""
    assert module_codes(STEPPED_ROLLOUT, tmp_path) == [(22, "KL002"), (22, "KL008")]
